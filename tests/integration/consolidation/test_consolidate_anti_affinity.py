"""The consolidate Lambda on the embedded AWS and the local Kubernetes API: a replica whose required pod
anti-affinity on `kubernetes.io/hostname` repels its siblings, alone on its node, is not planned onto the free room
of the node that runs a sibling. kube-scheduler would refuse it there (InterPodAffinity), and the evicted replica
would wait Pending for a node the packer buys again, which the next pass merges away again.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from kubernetes import client as k8s

from gpu_autoscaler.models.claims import ClaimState, NodeClaim
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER
from tests.conftest import ROOT
from tests.integration.consolidation.test_consolidate_lambda import (  # noqa: F401 (module fixtures)
    GPU_TOLERATION,
    POOL,
    aws,
    config,
    invoke,
    join,
    kube,
    store,
)

if TYPE_CHECKING:
    from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
    from gpu_autoscaler.config import Config
    from gpu_autoscaler.emulator.aws import EmbeddedAws
    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes

PRICES = {"g5.12xlarge": 5.672, "g5.48xlarge": 16.288}
APART = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "llm"}}}]}}


def _node_of_ours(aws: EmbeddedAws, kube: LocalKubernetes, config: Config, store: DynamoStateStore,  # noqa: F811
                  claim_id: str, instance_type: str) -> str:
    """An On-Demand instance of ours, its Node joined, its claim Registered two hours ago."""
    instance = aws.clients.client("ec2").run_instances(
        ImageId=config.ami.x86_64, InstanceType=instance_type, MinCount=1, MaxCount=1,
        SubnetId=aws.zone_subnets["us-east-1a"],
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": config.cluster_name},
                                                                  {"Key": TAG_CLAIM, "Value": claim_id}]}],
    )["Instances"][0]["InstanceId"]
    node = join(kube, aws, config, instance, instance_type, "us-east-1a", "on-demand")
    store.create_claim(NodeClaim(
        cluster=config.cluster_name, id=claim_id, pool=POOL, capacity_type="on-demand", zones=("us-east-1a",),
        instance_types=(instance_type,), price_per_hour=PRICES[instance_type], state=ClaimState.REGISTERED,
        created_at=datetime.now(UTC) - timedelta(hours=2), instance_id=instance, instance_type=instance_type,
        zone="us-east-1a", launched_price_per_hour=PRICES[instance_type], node_name=node,
    ))
    return node


def _run(core: k8s.CoreV1Api, node: str, name: str, app: str, gpus: int, *, apart: bool = False,
         bound: bool = True) -> None:
    """A pod bound to `node`; not `bound`: pending, for the scheduler to place on that node only."""
    selector = {"karpenter.sh/nodepool": POOL} if bound else {"karpenter.sh/nodepool": POOL,
                                                               "kubernetes.io/hostname": node}
    spec: dict[str, Any] = {"tolerations": [GPU_TOLERATION], "nodeSelector": selector,
            "containers": [{"name": "main", "image": "server", "resources": {
                "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": str(gpus)},
                "limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if bound:
        spec["nodeName"] = node
    if apart:
        spec["affinity"] = APART
    core.create_namespaced_pod("default", k8s.V1Pod.model_validate(
        {"metadata": {"name": name, "labels": {"app": app}}, "spec": spec}))


def test_a_replica_is_not_planned_beside_the_sibling_it_repels(
        aws: EmbeddedAws, kube: LocalKubernetes, config: Config, store: DynamoStateStore) -> None:  # noqa: F811
    # A g5.12xlarge left with one 1-GPU replica (underused), and a g5.48xlarge holding its sibling and a 3-GPU
    # trainer (half its GPUs: busy, so it stays) with four GPUs free.
    lonely = _node_of_ours(aws, kube, config, store, "nc-lonely", "g5.12xlarge")
    roomy = _node_of_ours(aws, kube, config, store, "nc-roomy", "g5.48xlarge")
    core = k8s.CoreV1Api(kube.client())
    _run(core, lonely, "llm-0", "llm", 1, apart=True)
    _run(core, roomy, "llm-1", "llm", 1, apart=True)
    _run(core, roomy, "train-0", "train", 3)
    kube.reconcile()

    summary = invoke(aws, json.loads((ROOT / "events" / "consolidate-rate.json").read_text()))
    proposed = [(d["action"], d["nodes"]) for d in summary["proposed"]]
    # Its pods fit in the roomy node's free room by resources alone: a deletion onto it is what the anti-affinity
    # forbids. A cheaper replacement of its own is what kube-scheduler can follow.
    assert ("delete", [lonely]) not in proposed, summary["proposed"]
    assert proposed == [("replace", [lonely])], summary["proposed"]

    # The emulator's kube-scheduler (InterPodAffinity, implemented on its own) agrees: a third replica, pending for
    # the roomy node alone, stays Pending there for the anti-affinity.
    _run(core, roomy, "llm-2", "llm", 1, apart=True, bound=False)
    kube.reconcile()
    pod = core.read_namespaced_pod("llm-2", "default")
    assert pod.spec is not None and pod.status is not None
    assert pod.spec.node_name is None
    [scheduled] = [c for c in pod.status.conditions or () if c.type == "PodScheduled"]
    assert scheduled.status == "False" and "anti-affinity" in (scheduled.message or ""), scheduled
