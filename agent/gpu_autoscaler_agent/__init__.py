"""The in-cluster agent of gpu-autoscaler: reports unschedulable GPU pods to the pending-pods FIFO queue."""

from __future__ import annotations

from gpu_autoscaler_agent.agent import Agent
from gpu_autoscaler_agent.settings import AgentSettings, load_settings

__all__ = ["Agent", "AgentSettings", "load_settings"]
