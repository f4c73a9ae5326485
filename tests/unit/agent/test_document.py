from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from gpu_autoscaler.models.pods import PendingPodsDocument, PodGroup
from gpu_autoscaler.models.resources import Resources
from gpu_autoscaler_agent.document import effective_requests, envelope, format_timestamp, pending_pod
from tests.conftest import ROOT
from tests.unit.agent.builders import container, make_pod


def test_fields_are_copied_in_their_kubernetes_shapes() -> None:
    terms = [{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]}]
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pod = make_pod(uid="6f1c", node_selector={"karpenter.k8s.aws/instance-gpu-name": "h100"},
                   affinity_terms=terms, tolerations=tolerations, priority=1000,
                   annotations={"karpenter.sh/do-not-disrupt": "true"})
    entry = pending_pod(pod, PodGroup(name="train-42", min_member=8))
    assert entry == {
        "uid": "6f1c",
        "namespace": "team-a",
        "name": "train-0",
        "createdAt": "2026-11-22T09:59:30Z",
        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
        "nodeSelector": {"karpenter.k8s.aws/instance-gpu-name": "h100"},
        "requiredNodeAffinity": terms,
        "tolerations": tolerations,
        "priority": 1000,
        "podGroup": {"name": "train-42", "minMember": 8},
        "annotations": {"karpenter.sh/do-not-disrupt": "true"},
    }


def test_only_annotations_the_autoscaler_reads_travel() -> None:
    pod = make_pod(annotations={"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 50_000 + "}",
                                "karpenter.sh/do-not-disrupt": "true", "team": "a"})
    assert pending_pod(pod)["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}


def test_empty_optional_fields_are_left_out() -> None:
    entry = pending_pod(make_pod())
    assert set(entry) == {"uid", "namespace", "name", "createdAt", "requests", "priority"}
    assert entry["priority"] == 0


def test_gpus_given_as_limits_become_requests() -> None:
    assert pending_pod(make_pod(gpus=2, gpu_in="limits"))["requests"]["nvidia.com/gpu"] == "2"


def test_containers_add_up() -> None:
    spec = make_pod(containers=[container("a", cpu="500m", memory="1Gi", gpu="1"),
                                container("b", cpu="1", memory="512Mi")])["spec"]
    requests = effective_requests(spec)
    assert Resources.from_quantities(requests) == Resources.from_quantities(
        {"cpu": "1500m", "memory": "1536Mi", "nvidia.com/gpu": "1"})
    assert requests["nvidia.com/gpu"] == "1"  # a single contributor is copied as written


def test_an_init_container_larger_than_the_app_sets_the_peak() -> None:
    spec = make_pod(containers=[container("app", cpu="1", memory="1Gi")],
                    init_containers=[container("download", cpu="4", memory="512Mi")])["spec"]
    assert effective_requests(spec) == {"cpu": "4", "memory": "1Gi"}


def test_sidecars_run_alongside_the_app_and_later_init_containers() -> None:
    spec = make_pod(
        containers=[container("app", cpu="1", gpu="1")],
        init_containers=[container("proxy", restart_policy="Always", cpu="250m"), container("setup", cpu="2")],
    )["spec"]
    requests = Resources.from_quantities(effective_requests(spec))
    assert requests["cpu"] == 2250  # setup (2) + the proxy started before it (0.25) > app + proxy (1.25)
    assert requests.gpus == 1


def test_overhead_is_added_and_pod_level_requests_win() -> None:
    spec = make_pod(cpu="1", memory="1Gi", overhead={"cpu": "250m", "memory": "120Mi"},
                    pod_resources={"requests": {"memory": "4Gi"}})["spec"]
    requests = Resources.from_quantities(effective_requests(spec))
    assert requests["cpu"] == 1250
    assert requests["memory"] == 4 * 2**30 + 120 * 2**20


def test_a_bad_quantity_is_refused() -> None:
    with pytest.raises(ValueError, match="quantity"):
        pending_pod(make_pod(cpu="lots"))


def test_an_entry_the_packer_would_reject_is_refused() -> None:
    bad = [{"matchExpressions": [{"key": "k", "operator": "In", "values": []}]}]
    with pytest.raises(ValidationError):
        pending_pod(make_pod(affinity_terms=bad))


def test_the_document_validates_and_matches_the_sample_event() -> None:
    document = envelope("ml-prod", datetime(2026, 11, 22, 10, 0, tzinfo=UTC), [pending_pod(make_pod())])
    parsed = PendingPodsDocument.model_validate(json.loads(json.dumps(document)))
    assert parsed.cluster == "ml-prod" and len(parsed.pods) == 1
    sample = json.loads((ROOT / "events" / "pending-pods-document.json").read_text())
    assert set(document) == set(sample)


def test_timestamps_have_one_width() -> None:
    assert format_timestamp(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05.000Z"
    assert format_timestamp(datetime(2026, 1, 2, 3, 4, 5, 987654, tzinfo=UTC)) == "2026-01-02T03:04:05.987Z"


PREFER_ON_DEMAND = {"weight": 100, "preference": {"matchExpressions": [
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}}


def test_preferred_node_affinity_travels_as_written() -> None:
    """Karpenter plans a pod's preferred node affinity as required first and relaxes it only when nothing fits
    (preferences.go): the packer can do so only if the agent sends it."""
    prefer_zone = {"weight": 10, "preference": {"matchExpressions": [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1b"]}]}}
    pod = make_pod()
    pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        prefer_zone, PREFER_ON_DEMAND]}}
    entry = pending_pod(pod)
    assert entry["preferredNodeAffinity"] == [prefer_zone, PREFER_ON_DEMAND]
    parsed = PendingPodsDocument.model_validate(
        envelope("ml-prod", datetime(2026, 11, 22, tzinfo=UTC), [entry])).pods[0]
    assert [(t.weight, t.preference.match_expressions[0].key) for t in parsed.preferred_node_affinity] == [
        (10, "topology.kubernetes.io/zone"), (100, "karpenter.sh/capacity-type")]


def test_a_preferred_term_the_api_server_would_refuse_is_refused() -> None:
    """The API server takes weights 1 to 100 (validation.go `validatePreferredSchedulingTerms`)."""
    pod = make_pod()
    pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {**PREFER_ON_DEMAND, "weight": 0}]}}
    with pytest.raises(ValidationError):
        pending_pod(pod)
