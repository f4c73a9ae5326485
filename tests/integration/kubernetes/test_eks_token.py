"""EKS bearer tokens: a presigned STS GetCallerIdentity with the cluster header, cached, and used by the client."""

from __future__ import annotations

import base64
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.adapters.aws.eks_token import (
    CLUSTER_ID_HEADER,
    TOKEN_PREFIX,
    EksTokenSource,
    cluster_access,
    eks_api_client,
    token_for_url,
)
from gpu_autoscaler.adapters.kubernetes.cluster import KubernetesCluster
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.config import KubernetesAccess, parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws
from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes
from gpu_autoscaler.errors import KubernetesApiError
from tests.conftest import example_config_data
from tests.integration.kubernetes.conftest import make_instance, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.config import Config


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    with EmbeddedAws(parse_config(example_config_data())) as embedded:
        yield embedded


class CountingSts:
    """The real STS client, counting the URLs it presigns."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.presigned = 0

    def generate_presigned_url(self, *args: Any, **kwargs: Any) -> str:
        self.presigned += 1
        url: str = self._real.generate_presigned_url(*args, **kwargs)
        return url

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _decode(token: str) -> str:
    payload = token.removeprefix(TOKEN_PREFIX)
    return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()


def test_the_token_is_a_presigned_get_caller_identity_signed_with_the_cluster_header(aws: EmbeddedAws) -> None:
    token = EksTokenSource(aws.clients.client("sts"), "ml-prod").token()
    assert token.startswith(TOKEN_PREFIX) and "=" not in token
    url = _decode(token)
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert f"{parts.scheme}://{parts.netloc}" == aws.endpoint_url
    assert (query["Action"], query["Version"], query["X-Amz-Expires"]) == ("GetCallerIdentity", "2011-06-15", "60")
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256" and query["X-Amz-Signature"]
    assert CLUSTER_ID_HEADER in query["X-Amz-SignedHeaders"].split(";")
    # EKS replays the URL with the header to learn the caller. moto's server picks a service from the
    # Authorization header's credential scope, not from query-string signatures, so the same SigV4 signature
    # is moved from the query into the header form (AWS accepts either) and the call goes to moto's STS.
    auth = {k: query[k] for k in ("X-Amz-Credential", "X-Amz-SignedHeaders", "X-Amz-Signature")}
    rest = urlencode({k: v for k, v in query.items() if not k.startswith("X-Amz-")})
    request = urllib.request.Request(f"{aws.endpoint_url}/?{rest}", headers={
        CLUSTER_ID_HEADER: "ml-prod", "X-Amz-Date": query["X-Amz-Date"],
        "Authorization": f"AWS4-HMAC-SHA256 Credential={auth['X-Amz-Credential']}, "
                         f"SignedHeaders={auth['X-Amz-SignedHeaders']}, Signature={auth['X-Amz-Signature']}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read().decode()
    assert "<GetCallerIdentityResult>" in body and "<Arn>" in body


def test_a_token_is_reused_for_14_minutes_then_made_again(aws: EmbeddedAws) -> None:
    clock = FixedClock(datetime(2026, 11, 22, 10, 0, tzinfo=UTC))
    sts = CountingSts(aws.clients.client("sts"))
    source = EksTokenSource(sts, "ml-prod", clock)
    first = source.token()
    clock.advance(timedelta(minutes=13, seconds=59))
    assert source.token() == first and sts.presigned == 1
    clock.advance(timedelta(seconds=1))
    assert _decode(source.token()).startswith(aws.endpoint_url) and sts.presigned == 2


def test_the_client_built_for_eks_authenticates_with_the_token_and_replaces_it_when_old(
        aws: EmbeddedAws, config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in aws.function_environment("drain").items():  # the drain's role, which has an access entry
        monkeypatch.setenv(key, value)
    clock = FixedClock(datetime.now(UTC))
    clients = AwsClients(aws.clients.region, aws.clients.endpoint_url)
    sts = CountingSts(clients.aws_endpoint_client("sts"))
    monkeypatch.setattr(clients, "aws_endpoint_client", lambda service: sts)
    with LocalKubernetes(cluster_name="ml-prod", sts_endpoint=aws.endpoint_url) as kube:
        local = config.model_copy(update={"kubernetes": KubernetesAccess(endpoint=kube.url)})
        with eks_api_client(local, clients, clock) as api:
            kube.add_instance(make_instance())
            nodes = wait_for(lambda: KubernetesCluster(api).list_nodes(), what="node")
            assert nodes[0].provider_id == "aws:///us-east-1a/i-0aaa"
            assert sts.presigned == 1  # one token for every request so far
            clock.advance(timedelta(minutes=14))
            assert KubernetesCluster(api).list_nodes() and sts.presigned == 2


def test_the_functions_token_names_sts_own_endpoint_whatever_endpoint_the_clients_use(
        aws: EmbeddedAws, config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """EKS replays the token's URL against STS and refuses any host but STS's own (aws-iam-authenticator, token.go
    `verifyHost`): a token naming the endpoint the other clients are pointed at (the emulator's, a proxy's) is
    refused on every cluster."""
    made: list[str] = []
    token = EksTokenSource.token

    def recorded(self: EksTokenSource) -> str:
        made.append(token(self))
        return made[-1]

    monkeypatch.setattr(EksTokenSource, "token", recorded)
    clients = AwsClients(aws.clients.region, aws.clients.endpoint_url)
    local = config.model_copy(update={"kubernetes": KubernetesAccess(endpoint="http://127.0.0.1:9")})
    with eks_api_client(local, clients) as api, pytest.raises(KubernetesApiError):
        api.get("/api/v1/nodes")  # nothing listens there: the token was made for the request all the same
    assert _decode(made[0]).startswith("https://sts.us-east-1.amazonaws.com/?Action=GetCallerIdentity&")


def test_the_local_api_refuses_a_token_not_signed_for_a_cluster(aws: EmbeddedAws) -> None:
    unsigned = token_for_url(aws.clients.aws_endpoint_client("sts").generate_presigned_url(
        "get_caller_identity", ExpiresIn=60, HttpMethod="GET"))
    with LocalKubernetes(sts_endpoint=aws.endpoint_url) as kube, kube.client(token=unsigned) as api:
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(api).list_node()
        assert refused.value.status == 401


def test_endpoint_and_ca_come_from_describe_cluster_when_the_configuration_has_no_ca(aws: EmbeddedAws,
                                                                                     config: Config) -> None:
    eks = aws.clients.client("eks")  # the emulator created the customer's cluster
    described = eks.describe_cluster(name=config.cluster_name)["cluster"]
    access = cluster_access(config, eks)
    assert access.endpoint == described["endpoint"]
    assert access.certificate_authority == described["certificateAuthority"]["data"]
    given = config.model_copy(update={"kubernetes": KubernetesAccess(endpoint="https://k8s.example",
                                                                     certificate_authority="Q0E=")})
    assert cluster_access(given, eks).endpoint == "https://k8s.example"
