"""gpu-autoscaler: a serverless capacity manager for the GPU nodes of Kubernetes clusters on AWS."""

__all__: list[str] = []
