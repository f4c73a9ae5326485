"""What the demo runs: the user's configuration tuned for a one-minute story, and the pods it creates.

The demo configuration is the user's (cdk.json) with consolidation and node age thresholds of seconds, and a
scaling window whose pre-warm starts during the demo (its cron starts a few minutes ahead; the pool's lead time
is set so the rate tick sees it early, as it would in production). The workload is a Monday-morning burst of
inference replicas, time-sliced notebooks and a training gang, as plain manifests a team would apply.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.models import labels as L
from gpu_autoscaler.models.resources import GPU
from gpu_autoscaler.services.prewarm import NEXT_TICK_WITHIN

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.config import Config

__all__ = ["DEMO_SPEED", "DEMO_VISIBILITY_TIMEOUT", "DEPLOYMENTS", "NAMESPACE", "SPOT_NOTICE", "demo_config",
           "notebook_pod", "workload"]

DEMO_SPEED = 30.0
"""Rate schedules 30× faster (consolidate every 2 s, prewarm every 10 s); nodes join 1.5 s after launch."""
DEMO_VISIBILITY_TIMEOUT = 30
"""Seconds a failed message stays invisible before its retry (the stack: 6 × the function's timeout, minutes):
a transient failure in the demo is retried within it, and still shows in the timeline."""
NAMESPACE = "team-a"
WINDOW = "demo-inference-peak"
WINDOW_POOL = "gpu-burst"
SPOT_NOTICE = timedelta(seconds=12)
"""How long before its action time the demo's Spot warning comes: AWS gives two minutes, and the drain does not
terminate the instance before that time, so the story shortens it."""
WARM_FROM_SECONDS = 15.0
"""When, after the configuration is made, the window's pre-warm begins (its start minus lead time and the longest
until the next tick): while the burst is being placed, so the warm capacity is up by the time the story gets to it."""


def demo_config(base: Config, now: datetime, *, warm_from: float = WARM_FROM_SECONDS) -> Config:
    """The user's configuration, tuned for a one-minute story (see the module docstring)."""
    data: dict[str, Any] = json.loads(base.to_json())
    start = (now + timedelta(minutes=7)).replace(second=0, microsecond=0)
    lead = start - NEXT_TICK_WITHIN - (now + timedelta(seconds=warm_from))
    lead_text = f"{max(1, int(lead.total_seconds()))}s"
    for pool in data["nodePools"]:
        pool["leadTime"] = lead_text
        disruption = pool.setdefault("disruption", {})
        disruption.update(consolidateAfter="2s", minNodeAge="0s", emptyKeepLeadTimes=0, budgets=[{"nodes": "100%"}])
    pools = {p["name"] for p in data["nodePools"]}
    if WINDOW_POOL not in pools:
        raise ValueError(f"the demo warms pool '{WINDOW_POOL}', which the configuration does not have")
    data["scalingWindows"] = [{
        "name": WINDOW, "schedule": f"cron({start.minute} {start.hour} * * ? *)", "timezone": "UTC",
        "duration": "1h", "nodePool": WINDOW_POOL, "warm": {"gpus": 4},
    }]
    data["predictive"] = {**data.get("predictive", {}), "enabled": False, "leadTime": lead_text}
    # Consolidation decisions are validated on the next tick, DEMO_SPEED times sooner than Karpenter's 15 s.
    data["timeouts"] = {**data.get("timeouts", {}), "consolidationValidation": "500ms"}
    return parse_config(data)


# ---- the workload --------------------------------------------------------------------------------------------


def _pod(name: str, *, gpus: int, cpu: str, memory: str, tolerations: list[dict[str, str]],
         labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": memory, GPU: str(gpus)}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "containers": [{"name": "main", "image": "public.ecr.aws/docker/library/busybox:stable",
                            "resources": {"requests": requests, "limits": {GPU: str(gpus)}}}],
            "tolerations": tolerations,
            "nodeSelector": node_selector or {},
            "restartPolicy": "Never",
        },
    }


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SHARED_TOLERATION = {"key": "gpu-autoscaler/shared", "operator": "Exists", "effect": "NoSchedule"}


def inference_pod(index: int) -> dict[str, Any]:
    """An inference replica on the burst pool (Spot first). It selects its pool, as teams do: otherwise
    kube-scheduler may bind it into the room the packer bought for the training gang."""
    return _pod(f"llm-serve-{index}", gpus=1, cpu="4", memory="24Gi", tolerations=[GPU_TOLERATION],
                labels={"app": "llm-serve"}, node_selector={L.NODE_POOL: WINDOW_POOL})


def notebook_pod(index: int) -> dict[str, Any]:
    """A time-sliced notebook: one GPU slot of the shared pool (four slots per physical GPU)."""
    return _pod(f"notebook-{index}", gpus=1, cpu="2", memory="8Gi", tolerations=[SHARED_TOLERATION],
                labels={"app": "notebook"}, node_selector={L.NODE_POOL: "gpu-shared"})


def training_pod(index: int) -> dict[str, Any]:
    return _pod(f"train-42-worker-{index}", gpus=1, cpu="16", memory="200Gi", tolerations=[GPU_TOLERATION],
                labels={"app": "train-42", "kueue.x-k8s.io/pod-group-name": "train-42"},
                annotations={"kueue.x-k8s.io/pod-group-total-count": "8", L.DO_NOT_DISRUPT: "true"},
                node_selector={L.INSTANCE_GPU_NAME: "h100"})


DEPLOYMENTS: dict[str, tuple[int, Callable[[int], dict[str, Any]]]] = {
    "llm-serve": (4, inference_pod),
    "notebook": (6, notebook_pod),
}
"""app → (replicas, pod factory): what the emulator's stand-in Deployment controller keeps running."""


def workload() -> list[dict[str, Any]]:
    """A Monday-morning burst: 4 inference replicas, 6 time-sliced notebooks, an 8-pod training gang."""
    pods = [make(i) for replicas, make in DEPLOYMENTS.values() for i in range(replicas)]
    return pods + [training_pod(i) for i in range(8)]
