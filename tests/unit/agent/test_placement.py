"""Volumes kube-scheduler would place nowhere (Karpenter's `ValidatePersistentVolumeClaims`,
pkg/controllers/provisioning/scheduling/volumetopology.go) make the pod unplannable, with the reason; a read the
agent is not allowed is an error, never taken for "no restriction"."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler_agent.health import Metrics
from gpu_autoscaler_agent.placement import KubernetesPlacement
from gpu_autoscaler_agent.selection import PodSelector
from gpu_autoscaler_agent.sender import Backoff
from gpu_autoscaler_agent.watcher import PodWatcher
from tests.unit.agent.builders import make_pod
from tests.unit.agent.fake_kubernetes import FakeCoreApi, ListResponse
from tests.unit.agent.test_watcher import NoGroups, RecordingSink

CLOCK = FixedClock(datetime(2026, 11, 22, tzinfo=UTC))


class Raw:
    def __init__(self, obj: Any) -> None:
        self.data = json.dumps(obj).encode()


def not_found(kind: str, name: str) -> ApiException:
    error = ApiException(status=404, reason="Not Found")
    error.body = json.dumps({"kind": "Status", "code": 404, "reason": "NotFound",
                             "message": f'{kind} "{name}" not found'})
    return error


def forbidden() -> ApiException:
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "code": 403, "reason": "Forbidden", "message": (
        'persistentvolumeclaims "data" is forbidden: User "system:serviceaccount:gpu-autoscaler:agent" cannot get '
        'resource "persistentvolumeclaims" in API group "" in the namespace "team-a"')})
    return error


class Objects(FakeCoreApi):
    """Claims, volumes and classes by name (an exception in their place is raised when read)."""

    def __init__(self, claims: dict[str, Any], volumes: dict[str, Any] | None = None,
                 classes: dict[str, Any] | None = None, pods: list[dict[str, Any]] | None = None) -> None:
        super().__init__([ListResponse(pods or [], "10")], [], threading.Event())
        self.claims, self.volumes, self.classes = claims, volumes or {}, classes or {}

    @staticmethod
    def _get(objects: dict[str, Any], kind: str, name: str) -> Any:
        found = objects.get(name)
        if found is None:
            raise not_found(kind, name)
        if isinstance(found, BaseException):
            raise found
        return Raw(found)

    def read_namespaced_persistent_volume_claim(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self._get(self.claims, "persistentvolumeclaims", name)

    def read_persistent_volume(self, name: str, **kwargs: Any) -> Any:
        return self._get(self.volumes, "persistentvolumes", name)

    def read_storage_class(self, name: str, **kwargs: Any) -> Any:
        return self._get(self.classes, "storageclasses", name)


def claim(name: str = "data", *, volume: str | None = None, storage_class: str | None = "gp3",
          phase: str = "Pending", deleting: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"]}
    if storage_class:
        spec["storageClassName"] = storage_class
    if volume:
        spec["volumeName"] = volume
    metadata: dict[str, Any] = {"name": name, "namespace": "team-a"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-22T09:00:00Z"
        metadata["finalizers"] = ["kubernetes.io/pvc-protection"]
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}


def storage_class(name: str, mode: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "provisioner": "ebs.csi.aws.com", "volumeBindingMode": mode}


def with_claim(**kwargs: Any) -> dict[str, Any]:
    pod = make_pod(**kwargs)
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    return pod


def watcher(core: Objects) -> tuple[PodWatcher, RecordingSink, Metrics]:
    sink, metrics = RecordingSink(), Metrics()
    placement = KubernetesPlacement(None, CLOCK, core_api=core, storage_api=core)  # type: ignore[arg-type]
    found = PodWatcher(None, sink, PodSelector(["nvidia.com/gpu"]), NoGroups(), metrics,  # type: ignore[arg-type]
                       backoff=Backoff(initial=0.001, maximum=0.001), core_api=core,  # type: ignore[arg-type]
                       placement=placement)
    return found, sink, metrics


@pytest.mark.parametrize(("core", "why"), [
    (Objects({}), "PersistentVolumeClaim data does not exist"),
    (Objects({"data": claim(deleting=True)}), "PersistentVolumeClaim data is being deleted"),
    (Objects({"data": claim(volume="pv-1", phase="Lost")}), "PersistentVolumeClaim data is Lost"),
    (Objects({"data": claim()}, classes={"gp3": storage_class("gp3", "Immediate")}),
     "with immediate volume binding mode, must be bound"),
    (Objects({"data": claim(storage_class=None)}), "is not bound and names no StorageClass"),
    (Objects({"data": claim()}), "StorageClass gp3 of its PersistentVolumeClaim data does not exist"),
    (Objects({"data": claim(volume="pv-1", phase="Bound")}),
     "PersistentVolume pv-1 of its PersistentVolumeClaim data does not exist"),
])
def test_a_pod_whose_claim_kube_scheduler_would_refuse_is_reported_unplannable(core: Objects, why: str) -> None:
    report = watcher(core)[0].report(with_claim())
    assert report is not None
    assert why in report.entry["unplannable"]


def test_an_ephemeral_volume_whose_claim_is_not_made_yet_is_unplannable_for_now() -> None:
    pod = make_pod(name="train-0")
    pod["spec"]["volumes"] = [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]
    report = watcher(Objects({}))[0].report(pod)
    assert report is not None and "PersistentVolumeClaim train-0-scratch does not exist" in report.entry["unplannable"]


def test_a_late_binding_claim_is_planned() -> None:
    core = Objects({"data": claim()}, classes={"gp3": storage_class("gp3", "WaitForFirstConsumer")})
    report = watcher(core)[0].report(with_claim())
    assert report is not None and "unplannable" not in report.entry


def test_a_claim_the_agent_may_not_read_skips_the_pod_with_the_missing_permission_said(
        caplog: pytest.LogCaptureFixture) -> None:
    pods = [with_claim(uid="guarded"), make_pod(uid="plain", name="infer-0")]
    found, sink, metrics = watcher(Objects({"data": forbidden()}, pods=pods))
    found.sync()
    assert sink.calls == [("replace_all", ["plain"])]
    assert metrics.value("pods_failed_total", reason="http_403") == 1
    assert 'cannot get resource "persistentvolumeclaims"' in caplog.text


class ForbiddenCustom:
    """A custom-objects API that refuses every read, as the API server does when the ClusterRole lacks the rule."""

    def get_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        raise forbidden()

    def get_cluster_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        raise forbidden()


def test_a_pod_group_the_agent_may_not_read_is_an_error_not_an_absent_group() -> None:
    from gpu_autoscaler_agent.podgroups import KubernetesPodGroups
    from gpu_autoscaler_agent.selection import GroupRef

    groups = KubernetesPodGroups(None, CLOCK, custom_api=ForbiddenCustom(),  # type: ignore[arg-type]
                                 core_api=object(), batch_api=object())  # type: ignore[arg-type]
    with pytest.raises(ApiException):
        groups.min_member(GroupRef("coscheduling", "team-a", "g"))
    with pytest.raises(ApiException):
        groups.workload_size(GroupRef("jobset", "team-a", "js"))


def test_a_dra_claim_the_agent_may_not_read_is_an_error_not_a_missing_claim() -> None:
    from gpu_autoscaler_agent.claims import KubernetesClaims

    pod = make_pod()
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu-claim"}]
    with pytest.raises(ApiException):
        KubernetesClaims(None, CLOCK, custom_api=ForbiddenCustom()).device_requests(pod)  # type: ignore[arg-type]


class Spread:
    """Pods matching `app=x` on nodes of two zones: one running, one terminating, one finished."""

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        def pod(name: str, node: str, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
            metadata: dict[str, Any] = {"name": name, "labels": {"app": "x"}}
            if deleting:
                metadata["deletionTimestamp"] = "2026-11-22T09:00:00Z"
            return {"metadata": metadata, "spec": {"nodeName": node}, "status": {"phase": phase}}

        return Raw({"items": [pod("a", "n1"), pod("old", "n2", deleting=True), pod("done", "n2", "Succeeded")]})

    def list_node(self, **kwargs: Any) -> Any:
        return Raw({"items": [{"metadata": {"name": n, "labels": {"topology.kubernetes.io/zone": z}}}
                              for n, z in (("n1", "us-east-1a"), ("n2", "us-east-1b"))]})


def test_terminating_and_finished_pods_do_not_count_for_zone_spread() -> None:
    """kube-scheduler's PodTopologySpread and Karpenter (`IgnoredForTopology`: not scheduled, terminal or
    terminating) count neither."""
    placement = KubernetesPlacement(None, CLOCK, core_api=Spread(), storage_api=object())  # type: ignore[arg-type]
    assert placement.zone_counts("team-a", {"matchLabels": {"app": "x"}}) == {"us-east-1a": 1}


class CountingSpread(Spread):
    def __init__(self) -> None:
        self.selectors: list[str] = []

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        self.selectors.append(kwargs["label_selector"])
        return super().list_namespaced_pod(namespace, **kwargs)


def test_a_spread_counts_the_pods_its_match_label_keys_select_too() -> None:
    """"The keys are used to lookup values from the incoming pod labels, those key-value labels are ANDed with
    labelSelector to select the group of existing pods over which spreading will be calculated" (kubernetes.io,
    Pod Topology Spread Constraints); a key the pod lacks is ignored."""
    pod = make_pod(labels={"app": "x", "pod-template-hash": "abc"})
    pod["spec"]["topologySpreadConstraints"] = [{
        "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "x"}}, "matchLabelKeys": ["pod-template-hash", "absent"]}]
    core = CountingSpread()
    placement = KubernetesPlacement(None, CLOCK, core_api=core, storage_api=object())  # type: ignore[arg-type]
    found = PodWatcher(None, RecordingSink(), PodSelector(["nvidia.com/gpu"]), NoGroups(),  # type: ignore[arg-type]
                       Metrics(), core_api=core, placement=placement)  # type: ignore[arg-type]
    found.report(pod)
    assert core.selectors == ["app=x,pod-template-hash in (abc)"]


class NicClaims:
    """A ResourceClaim asking for a network device, no GPU."""

    def get_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        return {"metadata": {"name": "nic"}, "spec": {"devices": {"requests": [
            {"name": "nic", "exactly": {"deviceClassName": "nic.example.com", "count": 1}}]}}}


def test_a_pod_asking_for_no_gpu_is_not_reported_whatever_its_volumes() -> None:
    from gpu_autoscaler_agent.claims import KubernetesClaims

    pod = with_claim(gpus=None)
    pod["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimName": "nic"}]
    core = Objects({})
    found = PodWatcher(None, RecordingSink(), PodSelector(["nvidia.com/gpu"]), NoGroups(),  # type: ignore[arg-type]
                       Metrics(), core_api=core,  # type: ignore[arg-type]
                       placement=KubernetesPlacement(None, CLOCK, core_api=core, storage_api=core),  # type: ignore[arg-type]
                       claims=KubernetesClaims(None, CLOCK, custom_api=NicClaims()))  # type: ignore[arg-type]
    assert found.report(pod) is None


def test_a_spread_on_the_node_is_sent_with_its_group_when_the_pod_is_in_it() -> None:
    """kube-scheduler caps a new node (0 matching pods: the global minimum) at `maxSkew` of the pods a hostname
    spread counts, when the pod is one of them ("skew = number of matching pods in the domain + 1 if the incoming
    pod matches − global minimum"; kubernetes.io, Pod Topology Spread Constraints)."""
    pod = make_pod(labels={"app": "x", "pod-template-hash": "abc"})
    node = {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "x"}}, "matchLabelKeys": ["pod-template-hash"]}
    pod["spec"]["topologySpreadConstraints"] = [
        node, {**node, "labelSelector": {"matchLabels": {"app": "other"}}},  # counts others only: no cap
        {**node, "whenUnsatisfiable": "ScheduleAnyway"}]  # scored, not enforced
    core = CountingSpread()
    placement = KubernetesPlacement(None, CLOCK, core_api=core, storage_api=object())  # type: ignore[arg-type]
    sink = RecordingSink()
    report = PodWatcher(None, sink, PodSelector(["nvidia.com/gpu"]), NoGroups(),  # type: ignore[arg-type]
                        Metrics(), core_api=core, placement=placement).report(pod)  # type: ignore[arg-type]
    assert report is not None
    assert report.entry["topologySpreadConstraints"] == [{
        "maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "x"}, "matchExpressions": [
            {"key": "pod-template-hash", "operator": "In", "values": ["abc"]}]}}]


def test_host_ports_are_sent_as_kube_scheduler_counts_them() -> None:
    """NodePorts counts the `hostPort` of app containers and of sidecars (restartable init containers), not of init
    containers that finish (`GetHostPorts`, kubernetes pkg/scheduler/util); a `hostNetwork` pod's container ports
    are host ports ("If HostNetwork is specified, this must match ContainerPort", core/v1 ContainerPort)."""
    pod = make_pod()
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 8000, "hostPort": 8000},
                                             {"containerPort": 9090, "protocol": "UDP", "hostIP": "10.0.0.1",
                                              "hostPort": 9090},
                                             {"containerPort": 8080}]
    pod["spec"]["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always", "ports": [{"containerPort": 15001, "hostPort": 15001}]},
        {"name": "setup", "ports": [{"containerPort": 7000, "hostPort": 7000}]}]
    watcher = PodWatcher(None, RecordingSink(), PodSelector(["nvidia.com/gpu"]), NoGroups(),  # type: ignore[arg-type]
                         Metrics(), core_api=CountingSpread())  # type: ignore[arg-type]
    report = watcher.report(pod)
    assert report is not None
    assert report.entry["hostPorts"] == [
        {"hostPort": 15001, "protocol": "TCP", "hostIP": ""}, {"hostPort": 8000, "protocol": "TCP", "hostIP": ""},
        {"hostPort": 9090, "protocol": "UDP", "hostIP": "10.0.0.1"}]
    pod["spec"]["hostNetwork"] = True
    del pod["spec"]["initContainers"]
    report = watcher.report(pod)
    assert report is not None
    assert [p["hostPort"] for p in report.entry["hostPorts"]] == [8000, 9090, 8080]


class AllNamespaces(Spread):
    """`app=x` pods: one in team-a on n1 (us-east-1a), one in team-b on n2 (us-east-1b)."""

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        return Raw({"items": [p for p in self._all() if p["metadata"]["namespace"] == namespace]})

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        return Raw({"items": self._all()})

    @staticmethod
    def _all() -> list[dict[str, Any]]:
        return [{"metadata": {"name": n, "namespace": ns, "labels": {"app": "x"}}, "spec": {"nodeName": node},
                 "status": {"phase": "Running"}} for n, ns, node in (("a", "team-a", "n1"), ("b", "team-b", "n2"))]


def test_anti_affinity_on_the_zone_is_sent_with_where_its_group_runs() -> None:
    """InterPodAffinity refuses a node whose domain, for any `topologyKey`, holds a pod the term matches, in the
    term's namespaces: the pod's own, those it names, or every one for `namespaceSelector: {}` ("An empty selector
    ({}) matches all namespaces", core/v1 PodAffinityTerm)."""
    selector = {"matchLabels": {"app": "x"}}
    pod = make_pod(labels={"app": "x"})
    pod["metadata"]["namespace"] = "team-a"
    pod["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": selector},
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": selector, "namespaceSelector": {}},
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector, "namespaces": ["team-a", "team-b"]},
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector, "namespaces": ["team-b"]},  # not itself
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector,
         "namespaceSelector": {"matchLabels": {"team": "a"}}},  # which namespaces: unknown to the agent
        {"topologyKey": "example.com/rack", "labelSelector": selector}]}}  # no key of ours
    core = AllNamespaces()
    placement = KubernetesPlacement(None, CLOCK, core_api=core, storage_api=object())  # type: ignore[arg-type]
    report = PodWatcher(None, RecordingSink(), PodSelector(["nvidia.com/gpu"]), NoGroups(),  # type: ignore[arg-type]
                        Metrics(), core_api=core, placement=placement).report(pod)  # type: ignore[arg-type]
    assert report is not None
    assert report.entry["podAntiAffinity"] == [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": selector, "zoneCounts": {"us-east-1a": 1}},
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": selector, "namespaceSelector": {},
         "zoneCounts": {"us-east-1a": 1, "us-east-1b": 1}},
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector, "namespaces": ["team-a", "team-b"]}]


class Eligible(Spread):
    """`app=x` pods on n1 (us-east-1a, pool gpu) and n2 (us-east-1b, no pool label); n3 (us-east-1c, pool gpu,
    tainted) runs none."""

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        return Raw({"items": [{"metadata": {"name": n, "labels": {"app": "x"}}, "spec": {"nodeName": node},
                               "status": {"phase": "Running"}} for n, node in (("a", "n1"), ("b", "n2"))]})

    def list_node(self, **kwargs: Any) -> Any:
        def node(name: str, zone: str, labels: dict[str, str], taints: list[dict[str, str]]) -> dict[str, Any]:
            return {"metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone, **labels}},
                    "spec": {"taints": taints}}

        tainted = [{"key": "dedicated", "effect": "NoSchedule"}]
        return Raw({"items": [node("n1", "us-east-1a", {"pool": "gpu"}, []), node("n2", "us-east-1b", {}, []),
                              node("n3", "us-east-1c", {"pool": "gpu"}, tainted)]})


@pytest.mark.parametrize(("spread", "node_selector", "counts"), [
    ({}, None, {"us-east-1a": 1, "us-east-1b": 1, "us-east-1c": 0}),  # every node: tainted ones too
    ({}, {"pool": "gpu"}, {"us-east-1a": 1, "us-east-1c": 0}),  # nodeAffinityPolicy Honor: the pod's selector
    ({"nodeAffinityPolicy": "Ignore"}, {"pool": "gpu"}, {"us-east-1a": 1, "us-east-1b": 1, "us-east-1c": 0}),
    ({"nodeTaintsPolicy": "Honor", "minDomains": 3}, None, {"us-east-1a": 1, "us-east-1b": 1}),
])
def test_a_zone_spread_is_sent_with_every_eligible_zone_and_its_min_domains(
        spread: dict[str, Any], node_selector: dict[str, str] | None, counts: dict[str, int]) -> None:
    """kube-scheduler counts a domain for every node with the key that passes the inclusion policies
    (nodeAffinityPolicy Honor and nodeTaintsPolicy Ignore by default, core/v1 TopologySpreadConstraint), 0 pods
    included, and only the pods on such nodes."""
    pod = make_pod(labels={"app": "x"})
    if node_selector:
        pod["spec"]["nodeSelector"] = node_selector
    pod["spec"]["topologySpreadConstraints"] = [{
        "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "x"}}, **spread}]
    core = Eligible()
    placement = KubernetesPlacement(None, CLOCK, core_api=core, storage_api=object())  # type: ignore[arg-type]
    report = PodWatcher(None, RecordingSink(), PodSelector(["nvidia.com/gpu"]), NoGroups(),  # type: ignore[arg-type]
                        Metrics(), core_api=core, placement=placement).report(pod)  # type: ignore[arg-type]
    assert report is not None
    [sent] = report.entry["topologySpreadConstraints"]
    assert sent["zoneCounts"] == counts and sent.get("minDomains") == spread.get("minDomains")


def test_pod_affinity_is_sent_with_where_the_pods_it_selects_run() -> None:
    """InterPodAffinity passes a node only if its domain holds a pod each required term selects, or, when none runs
    anywhere, if the pod selects itself (kubernetes pkg/scheduler/framework/plugins/interpodaffinity/filtering.go)."""
    selector = {"matchLabels": {"app": "x"}}
    pod = make_pod(labels={"app": "x"})
    pod["metadata"]["namespace"] = "team-a"
    pod["spec"]["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": selector, "namespaceSelector": {}},
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector, "namespaces": ["team-b"]}]}}
    core = AllNamespaces()
    placement = KubernetesPlacement(None, CLOCK, core_api=core, storage_api=object())  # type: ignore[arg-type]
    report = PodWatcher(None, RecordingSink(), PodSelector(["nvidia.com/gpu"]), NoGroups(),  # type: ignore[arg-type]
                        Metrics(), core_api=core, placement=placement).report(pod)  # type: ignore[arg-type]
    assert report is not None
    assert report.entry["podAffinity"] == [
        {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": selector, "namespaceSelector": {},
         "selfMatch": True, "zoneCounts": {"us-east-1a": 1, "us-east-1b": 1}},
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector, "namespaces": ["team-b"],
         "selfMatch": False, "nodes": ["n2"]}]  # not in team-b: not itself
