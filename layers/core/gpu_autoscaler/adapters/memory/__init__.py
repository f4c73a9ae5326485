"""In-memory adapters: the ports without AWS or Kubernetes, for unit tests and the simulator."""
