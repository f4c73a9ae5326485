"""Use cases, one module per function: they take ports and configuration, call the domain and act.

Handlers call exactly one of these; the emulator, the demo and the tests call the same ones.
"""
