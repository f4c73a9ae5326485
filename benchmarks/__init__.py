"""Benchmarks: figures printed, not asserted.

`python -m benchmarks` lists them; `python -m benchmarks NAME [ARGS]` runs one.
"""
