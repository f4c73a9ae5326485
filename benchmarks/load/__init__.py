"""Load figures (issue 19): the packer's throughput through its queue, and 1,000 pods created → all bound."""

from __future__ import annotations

import json

from gpu_autoscaler.config import Config

__all__ = ["unlimited"]


def unlimited(config: Config) -> Config:
    """The configuration with its pools' limits lifted: the load is placed, not cut at the example's 256 GPUs."""
    data = json.loads(config.to_json())
    for pool in data["nodePools"]:
        pool.pop("limits", None)
    return Config.model_validate(data)
