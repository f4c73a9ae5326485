"""The `gpu-autoscaler` command line."""
