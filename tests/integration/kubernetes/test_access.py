"""The local API server authenticates and authorizes as EKS does, so a missing permission fails here too.

EKS tokens are verified by aws-iam-authenticator's rules (pkg/token/token.go `Verify`) and replayed against the
emulated STS, which checks their signature; the caller's role is mapped through the cluster's access entries; RBAC
then allows what the shipped manifests (`agent/deploy/rbac.yaml`, `functions-rbac.yaml`) grant, and nothing else.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.config import Config as BotoConfig
from kubernetes import client

from gpu_autoscaler.adapters.aws.eks_token import presigned_identity_url, token_for_url
from gpu_autoscaler.adapters.kubernetes.rest import KubernetesHttpError, KubernetesRest
from gpu_autoscaler.clock import FixedClock, SystemClock
from gpu_autoscaler.config import parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from tests.conftest import example_config_data
from tests.integration.kubernetes.conftest import make_instance, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.clock import Clock

CLUSTER = "ml-prod"
MERGE = "application/merge-patch+json"


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    """The emulated account as the stack leaves it: a role per function, the Kubernetes callers' access entries."""
    with EmbeddedAws(parse_config(example_config_data())) as embedded:
        yield embedded


@pytest.fixture
def kube(aws: EmbeddedAws) -> Iterator[LocalKubernetes]:
    with LocalKubernetes(cluster_name=CLUSTER, sts_endpoint=aws.endpoint_url, run_controllers=False) as local:
        local.add_instance(make_instance())
        local.reconcile()
        yield local


def _credentials(aws: EmbeddedAws, function: str) -> dict[str, str]:
    environment = aws.function_environment(function)
    return {k: environment[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}


def _token(credentials: dict[str, str], cluster: str = CLUSTER, endpoint_url: str | None = None) -> str:
    """An EKS token as `aws eks get-token` makes it: STS's own regional endpoint unless `endpoint_url` says."""
    sts = boto3.client("sts", region_name="us-east-1", endpoint_url=endpoint_url,
                       aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
                       aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
                       aws_session_token=credentials.get("AWS_SESSION_TOKEN"),
                       config=BotoConfig(ignore_configured_endpoint_urls=endpoint_url is None))  # type: ignore[call-arg]
    return token_for_url(presigned_identity_url(sts, cluster))


def _rest(kube: LocalKubernetes, token: str) -> KubernetesRest:
    return KubernetesRest(kube.url, authorization=lambda: f"Bearer {token}")


def _refused(call: Any) -> KubernetesHttpError:
    with pytest.raises(KubernetesHttpError) as raised:
        call()
    return raised.value


def _assumed(aws: EmbeddedAws, role_name: str) -> dict[str, str]:
    iam = aws.clients.client("iam")
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
    arn = iam.create_role(RoleName=role_name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    issued = aws.clients.client("sts").assume_role(RoleArn=arn, RoleSessionName="someone")["Credentials"]
    return {"AWS_ACCESS_KEY_ID": issued["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": issued["SecretAccessKey"],
            "AWS_SESSION_TOKEN": issued["SessionToken"]}


# Authentication


def test_a_functions_token_signs_in_as_its_roles_access_entry(aws: EmbeddedAws, kube: LocalKubernetes) -> None:
    node = make_instance().name
    with _rest(kube, _token(_credentials(aws, "drain"))) as drain:
        assert drain.get(f"/api/v1/nodes/{node}")["metadata"]["name"] == node
        refused = _refused(lambda: drain.delete("/api/v1/namespaces/default"))
    role = aws.resources.function_roles["drain"].rsplit("/", 1)[1]
    session = aws.function_environment("drain")["AWS_LAMBDA_FUNCTION_NAME"]
    assert refused.status == 403 and f'User "arn:aws:sts::123456789012:assumed-role/{role}/{session}"' in str(refused)


def test_a_role_without_an_access_entry_is_unauthorized(aws: EmbeddedAws, kube: LocalKubernetes) -> None:
    with _rest(kube, _token(_assumed(aws, "not-in-the-cluster"))) as stranger:
        refused = _refused(lambda: stranger.delete(f"/api/v1/nodes/{make_instance().name}"))
    assert (refused.status, refused.reason) == (401, "Unauthorized")
    assert kube.objects("nodes")


@pytest.mark.parametrize("why", ["another cluster", "http STS URL", "keys STS never issued", "expired"])
def test_a_token_the_authenticator_would_refuse_is_401(aws: EmbeddedAws, why: str) -> None:
    clock: Clock = SystemClock()
    credentials = _credentials(aws, "drain")
    if why == "another cluster":
        token = _token(credentials, cluster="someone-elses-cluster")
    elif why == "http STS URL":
        token = _token(credentials, endpoint_url=aws.endpoint_url)
    elif why == "keys STS never issued":
        token = _token({"AWS_ACCESS_KEY_ID": "AKIAUNMAPPEDPRINCIPAL", "AWS_SECRET_ACCESS_KEY": "whatever"})
    else:
        token = _token(credentials)
        clock = FixedClock(SystemClock().now() + timedelta(minutes=16))
    with LocalKubernetes(cluster_name=CLUSTER, sts_endpoint=aws.endpoint_url, clock=clock,
                         run_controllers=False) as kube, _rest(kube, token) as rest:
        kube.add_instance(make_instance())
        kube.reconcile()
        refused = _refused(lambda: rest.delete(f"/api/v1/nodes/{make_instance().name}"))
        assert (refused.status, refused.reason) == (401, "Unauthorized")
        assert kube.objects("nodes")


def test_a_request_without_a_token_is_anonymous_and_forbidden(kube: LocalKubernetes) -> None:
    with KubernetesRest(kube.url) as anonymous:
        refused = _refused(lambda: anonymous.get("/api/v1/nodes"))
    assert refused.status == 403
    assert 'nodes is forbidden: User "system:anonymous" cannot list resource "nodes" in API group "" at the ' \
           "cluster scope" in str(refused)


def test_a_token_the_server_did_not_issue_is_401(kube: LocalKubernetes) -> None:
    with _rest(kube, "not-the-token") as stranger:
        assert _refused(lambda: stranger.get("/api/v1/nodes")).status == 401


# Authorization: the shipped RBAC


def test_a_function_may_cordon_a_node_and_evict_but_not_delete_a_namespace_or_read_secrets(
        aws: EmbeddedAws, kube: LocalKubernetes) -> None:
    node = make_instance().name
    with _rest(kube, _token(_credentials(aws, "interruption"))) as function:
        function.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}}, MERGE)
        namespace = _refused(lambda: function.delete("/api/v1/namespaces/default"))
        secrets = _refused(lambda: function.get("/api/v1/namespaces/kube-system/secrets/aws-creds"))
    assert kube.objects("nodes")[0]["spec"]["unschedulable"] is True
    assert namespace.status == 403 and 'namespaces "default" is forbidden' in str(namespace) and \
        'cannot delete resource "namespaces" in API group "" in the namespace "default"' in str(namespace)
    assert secrets.status == 403 and 'secrets "aws-creds" is forbidden' in str(secrets) and \
        'cannot get resource "secrets" in API group "" in the namespace "kube-system"' in str(secrets)


def test_prewarm_makes_no_kubernetes_request_and_has_no_access_entry(aws: EmbeddedAws,
                                                                     kube: LocalKubernetes) -> None:
    with _rest(kube, _token(_credentials(aws, "prewarm"))) as prewarm:
        assert _refused(lambda: prewarm.get("/api/v1/nodes")).status == 401


def test_the_agent_may_list_pods_but_not_delete_a_node(kube: LocalKubernetes) -> None:
    token = kube.service_account_token("gpu-autoscaler", "gpu-autoscaler-agent")
    with kube.client(token=token) as api:
        core = client.CoreV1Api(api)
        assert core.list_pod_for_all_namespaces().items == []
        with pytest.raises(client.ApiException) as refused:
            core.delete_node(make_instance().name)
    assert refused.value.status == 403
    assert json.loads(refused.value.body or "{}")["message"] == (
        f'nodes "{make_instance().name}" is forbidden: User "system:serviceaccount:gpu-autoscaler:'
        'gpu-autoscaler-agent" cannot delete resource "nodes" in API group "" at the cluster scope')


def test_the_shipped_rbac_is_stored_and_served_as_kubectl_would_read_it(kube: LocalKubernetes) -> None:
    with kube.client() as api:
        rbac = client.RbacAuthorizationV1Api(api)
        role = rbac.read_cluster_role("gpu-autoscaler-functions")
        binding = rbac.read_cluster_role_binding("gpu-autoscaler-agent")
    assert any("pods/eviction" in (rule.resources or ()) for rule in role.rules or ())
    assert [(s.kind, s.namespace, s.name) for s in binding.subjects or ()] == [
        ("ServiceAccount", "gpu-autoscaler", "gpu-autoscaler-agent")]


def test_a_rolebinding_grants_its_role_in_its_namespace_only(kube: LocalKubernetes) -> None:
    token = kube.service_account_token("gpu-autoscaler", "gpu-autoscaler-agent")
    with kube.client() as admin:
        rbac = client.RbacAuthorizationV1Api(admin)
        rbac.create_namespaced_role("team-a", client.V1Role(metadata=client.V1ObjectMeta(name="configs"), rules=[
            client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["create"])]))
        rbac.create_namespaced_role_binding("team-a", client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="agent-configs"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="configs"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="gpu-autoscaler-agent",
                                           namespace="gpu-autoscaler")]))
    with _rest(kube, token) as agent:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
        assert agent.post("/api/v1/namespaces/team-a/configmaps", body)["metadata"]["name"] == "c"
        assert _refused(lambda: agent.post("/api/v1/namespaces/team-b/configmaps", body)).status == 403
    assert wait_for(lambda: kube.objects("configmaps"), what="configmap")


def test_system_masters_is_allowed_before_rbac_is_asked(kube: LocalKubernetes) -> None:
    """kube-apiserver's authorizer chain starts with a privileged-groups authorizer for `system:masters`, ahead of
    RBAC (pkg/kubeapiserver/authorizer, NewPrivilegedGroups): the admin keeps its access without the cluster-admin
    binding."""
    with kube.client() as api:
        client.RbacAuthorizationV1Api(api).delete_cluster_role_binding("cluster-admin")
        assert client.CoreV1Api(api).list_node().items
