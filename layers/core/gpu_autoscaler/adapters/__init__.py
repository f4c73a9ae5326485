"""Implementations of the ports for AWS, the embedded emulator, Kubernetes and the simulator."""
