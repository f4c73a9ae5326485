"""The agent's Helm chart renders what the kustomize manifests hold, from its values (issue 18 part 4).

`helm` is not installable here (no Debian or PyPI package ships it), so the chart is rendered by a small
renderer of the template subset it uses (`chart_render`); with `helm` on the PATH, `helm lint` and `helm
template` run as well.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from gpu_autoscaler.naming import FUNCTIONS_KUBERNETES_GROUP
from gpu_autoscaler_agent.settings import ENVIRONMENT, load_settings
from tests.conftest import ROOT
from tests.unit.agent.chart_render import ChartError, Renderer

CHART = ROOT / "agent" / "deploy" / "chart"
KUSTOMIZE_DEPLOYMENT = ROOT / "agent" / "deploy" / "deployment.yaml"
KUSTOMIZE_FUNCTIONS_RBAC = ROOT / "agent" / "deploy" / "functions-rbac.yaml"
AGENT = "agent-gpu-autoscaler-agent"
"""The agent's ClusterRole and binding as the chart names them for the release `agent` (`Renderer`'s default)."""
FUNCTIONS = "agent-gpu-autoscaler-functions"
QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/ml-prod-gpu-autoscaler-pending-pods.fifo"
REQUIRED = {"clusterName": "ml-prod", "queueUrl": QUEUE}


def _values(**overrides: Any) -> dict[str, Any]:
    values = copy.deepcopy(yaml.safe_load((CHART / "values.yaml").read_text()))
    values.update(REQUIRED)
    values.update(overrides)
    return values


def _render(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each rendered object by kind, the cluster-scoped RBAC objects by `<kind>/<name>` (the agent's and the
    functions')."""
    renderer = Renderer(CHART, values)
    out: dict[str, dict[str, Any]] = {}
    for template in sorted((CHART / "templates").glob("*.yaml")):
        for doc in yaml.safe_load_all(renderer.render(template)):
            if doc:
                key = f"{doc['kind']}/{doc['metadata']['name']}" if doc["kind"].startswith("ClusterRole") else \
                    doc["kind"]
                assert key not in out, f"{key} rendered twice"
                out[key] = doc
    return out


def _kustomize(path: Any, kind: str) -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind)


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_the_chart_renders_the_kustomize_resources_with_the_values() -> None:
    rendered = _render(_values(resyncSeconds=30))
    assert set(rendered) == {"ServiceAccount", f"ClusterRole/{AGENT}", f"ClusterRoleBinding/{AGENT}",
                             f"ClusterRole/{FUNCTIONS}", f"ClusterRoleBinding/{FUNCTIONS}", "Deployment"}
    deployment = rendered["Deployment"]
    assert deployment["metadata"]["namespace"] == "ops"
    env = _env(deployment)
    kustomize = _env(yaml.safe_load(KUSTOMIZE_DEPLOYMENT.read_text()))
    assert set(env) == set(kustomize) and set(env) <= set(ENVIRONMENT.values())
    assert (env["CLUSTER_NAME"], env["QUEUE_URL"], env["RESYNC_SECONDS"]) == ("ml-prod", QUEUE, "30")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "gpu-autoscaler-agent:0.1.0"
    [kustomize_container] = yaml.safe_load(KUSTOMIZE_DEPLOYMENT.read_text())["spec"]["template"]["spec"]["containers"]
    # a relist of 20,000 pending pods peaks ~201 MB (two relists back to back, SQS away): room for a burst
    assert container["resources"] == kustomize_container["resources"] == {
        "requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "384Mi"}}
    assert container["ports"][0]["containerPort"] == 8080
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "8080"
    binding = rendered[f"ClusterRoleBinding/{AGENT}"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-autoscaler-agent", "namespace": "ops"}]
    assert binding["roleRef"]["name"] == AGENT
    kustomize_rules = _kustomize(ROOT / "agent/deploy/rbac.yaml", "ClusterRole")["rules"]
    assert rendered[f"ClusterRole/{AGENT}"]["rules"] == kustomize_rules


def test_the_chart_grants_the_functions_what_kustomize_does_to_the_group_of_their_access_entries() -> None:
    """The stack's access entries put the functions' roles in one group, spelled exactly (no release-name prefix:
    EKS does not check that any binding names an entry's group); the rules are agent/deploy/functions-rbac.yaml's."""
    rendered = _render(_values())
    role, binding = rendered[f"ClusterRole/{FUNCTIONS}"], rendered[f"ClusterRoleBinding/{FUNCTIONS}"]
    assert role["rules"] == _kustomize(KUSTOMIZE_FUNCTIONS_RBAC, "ClusterRole")["rules"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": FUNCTIONS}
    assert binding["subjects"] == _kustomize(KUSTOMIZE_FUNCTIONS_RBAC, "ClusterRoleBinding")["subjects"] == [
        {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": FUNCTIONS_KUBERNETES_GROUP}]
    assert role["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-autoscaler-functions"


def test_the_agent_takes_the_queues_region_unless_told_one() -> None:
    """`region` is only for a queue URL that names none; by default the agent reads it from `queueUrl`."""
    queue = "https://sqs.ap-south-1.amazonaws.com/123456789012/ml-prod-gpu-autoscaler-pending-pods.fifo"
    env = _env(_render(_values(queueUrl=queue))["Deployment"])
    assert "AWS_REGION" not in env and load_settings(env).region == "ap-south-1"
    told = _env(_render(_values(queueUrl=queue, region="ap-south-1"))["Deployment"])
    assert told["AWS_REGION"] == "ap-south-1" and load_settings(told).region == "ap-south-1"


def test_irsa_or_pod_identity() -> None:
    role = "arn:aws:iam::123456789012:role/ml-prod-gpu-autoscaler-agent"
    irsa = _render(_values(serviceAccount={"create": True, "name": "agent",
                                           "annotations": {"eks.amazonaws.com/role-arn": role}}))
    assert irsa["ServiceAccount"]["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role}
    assert irsa["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == "agent"
    pod_identity = _render(_values())  # the association names the service account; no annotation
    assert "annotations" not in pod_identity["ServiceAccount"]["metadata"]


def test_the_required_values_are_named_when_missing() -> None:
    with pytest.raises(ChartError, match="clusterName is required"):
        _render(_values(clusterName=""))
    with pytest.raises(ChartError, match="queueUrl is required"):
        _render(_values(queueUrl=""))


def test_every_value_a_template_reads_is_in_values_yaml() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for template in (CHART / "templates").iterdir():
        for path in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()):
            node: Any = values
            for part in path.split("."):
                assert isinstance(node, dict) and part in node, f"{template.name}: .Values.{path}"
                node = node[part]


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed (no Debian or PyPI package)")
def test_helm_lints_and_templates_the_chart() -> None:
    sets = [f"--set={k}={v}" for k, v in REQUIRED.items()]
    subprocess.run(["helm", "lint", str(CHART), "--strict", *sets], check=True, capture_output=True)
    done = subprocess.run(["helm", "template", "agent", str(CHART), "--namespace", "ops", *sets], check=True,
                          capture_output=True, text=True)
    kinds = {d["kind"] for d in yaml.safe_load_all(done.stdout) if d}
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"}
