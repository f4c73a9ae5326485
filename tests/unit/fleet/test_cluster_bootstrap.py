"""The cluster's coordinates for the nodes' user data: what the configuration leaves out comes from EKS
DescribeCluster (a botocore Stubber plays EKS); when EKS cannot say, launches fail instead of starting nodes that
could never join."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.stub import Stubber

from gpu_autoscaler.adapters.aws.cluster_bootstrap import cluster_bootstrap
from gpu_autoscaler.adapters.memory.state_store import MemoryStateStore
from gpu_autoscaler.clock import FixedClock
from gpu_autoscaler.domain.user_data import ClusterBootstrap
from gpu_autoscaler.errors import ClusterBootstrapUnavailable
from gpu_autoscaler.models.claims import ClaimState
from gpu_autoscaler.models.messages import LaunchRequest
from gpu_autoscaler.services.fleet import FleetService
from tests.unit.fleet.builders import CA, NOW, TEMPLATE, make_claim, make_config
from tests.unit.fleet.fakes import FakeCompute

if TYPE_CHECKING:
    from collections.abc import Iterator

    from gpu_autoscaler.config import Config

DESCRIBED_CA = "TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2c9PQ=="
ARN = "arn:aws:eks:us-east-1:123456789012:cluster/ml-prod"


def bare_config(**kubernetes: str) -> Config:
    """The example configuration with only the endpoint (and `kubernetes`) under `kubernetes`."""
    return make_config(kubernetes={"endpoint": "https://EXAMPLE.gr7.us-east-1.eks.amazonaws.com", **kubernetes})


def described(network: dict[str, str] | None = None, ca: str | None = DESCRIBED_CA) -> dict[str, Any]:
    cluster: dict[str, Any] = {"name": "ml-prod", "arn": ARN, "status": "ACTIVE",
                               "endpoint": "https://EXAMPLE.gr7.us-east-1.eks.amazonaws.com",
                               "kubernetesNetworkConfig": network if network is not None else {
                                   "serviceIpv4Cidr": "172.20.0.0/16", "ipFamily": "ipv4"}}
    if ca is not None:
        cluster["certificateAuthority"] = {"data": ca}
    return {"cluster": cluster}


@pytest.fixture
def eks() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("eks", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def test_what_the_configuration_lacks_comes_from_describe_cluster(eks: tuple[Any, Stubber]) -> None:
    client, stubber = eks
    stubber.add_response("describe_cluster", described(), {"name": "ml-prod"})
    bootstrap = cluster_bootstrap(bare_config(), client)
    assert bootstrap.certificate_authority == DESCRIBED_CA and bootstrap.service_cidr == "172.20.0.0/16"
    assert bootstrap.missing() == []


def test_configured_values_win_and_only_the_missing_one_is_filled(eks: tuple[Any, Stubber]) -> None:
    client, stubber = eks
    stubber.add_response("describe_cluster", described(), {"name": "ml-prod"})
    bootstrap = cluster_bootstrap(bare_config(certificateAuthority=CA), client)
    assert bootstrap.certificate_authority == CA and bootstrap.service_cidr == "172.20.0.0/16"


def test_a_complete_configuration_or_a_local_endpoint_asks_nothing(eks: tuple[Any, Stubber]) -> None:
    client, _ = eks  # no response queued: any call would fail the test
    complete = cluster_bootstrap(make_config(), client)
    assert complete == ClusterBootstrap.from_config(make_config()) and complete.missing() == []
    local = make_config(kubernetes={"endpoint": "http://127.0.0.1:6443"})
    assert cluster_bootstrap(local, client).missing() == ["kubernetes.certificateAuthority", "kubernetes.serviceCidr"]


def test_an_ipv6_cluster_gives_its_ipv6_service_cidr(eks: tuple[Any, Stubber]) -> None:
    client, stubber = eks
    stubber.add_response("describe_cluster", described({"serviceIpv6Cidr": "fd30:1c2b:3d4e::/108", "ipFamily": "ipv6"}),
                         {"name": "ml-prod"})
    assert cluster_bootstrap(bare_config(), client).service_cidr == "fd30:1c2b:3d4e::/108"


@pytest.mark.parametrize(("code", "status"), [("ResourceNotFoundException", 404), ("AccessDeniedException", 403)])
def test_a_failing_describe_cluster_is_a_clear_error(eks: tuple[Any, Stubber], code: str, status: int) -> None:
    client, stubber = eks
    stubber.add_client_error("describe_cluster", code, "no", status, expected_params={"name": "ml-prod"})
    with pytest.raises(ClusterBootstrapUnavailable) as failed:
        cluster_bootstrap(bare_config(), client)
    message = str(failed.value)
    assert "kubernetes.certificateAuthority and kubernetes.serviceCidr" in message
    assert code in message and "eks:DescribeCluster" in message


def test_a_cluster_that_does_not_say_its_ca_yet_is_an_error_too(eks: tuple[Any, Stubber]) -> None:
    client, stubber = eks
    stubber.add_response("describe_cluster", described(ca=None), {"name": "ml-prod"})
    with pytest.raises(ClusterBootstrapUnavailable, match="does not give kubernetes.certificateAuthority"):
        cluster_bootstrap(bare_config(), client)


class Resolver:
    """`cluster_bootstrap` as the fleet Lambda wires it, failing the first `failures` times."""

    def __init__(self, config: Config, failures: int) -> None:
        self.config = config
        self.failures = failures
        self.calls = 0

    def __call__(self) -> ClusterBootstrap:
        self.calls += 1
        if self.calls <= self.failures:
            raise ClusterBootstrapUnavailable("EKS DescribeCluster failed (throttled)")
        return ClusterBootstrap.from_config(self.config, certificate_authority=DESCRIBED_CA,
                                            service_cidr="172.20.0.0/16")


def test_the_fleet_launches_nothing_until_it_knows_the_cluster_then_asks_eks_once() -> None:
    clock = FixedClock(NOW)
    config = bare_config()
    store = MemoryStateStore("ml-prod", clock)
    compute = FakeCompute()
    resolver = Resolver(config, failures=1)
    service = FleetService(config, store, compute, clock=clock, launch_template_id=TEMPLATE, bootstrap=resolver,
                           sleep=lambda _: None, rng=random.Random(1))
    for claim_id in ("gpu-burst-one", "gpu-burst-two"):
        store.create_claim(make_claim(id=claim_id, pods=(f"pod-{claim_id}",)))
        store.assign_pods(claim_id, [f"pod-{claim_id}"], timedelta(minutes=30))

    with pytest.raises(ClusterBootstrapUnavailable):
        service.launch(LaunchRequest(cluster="ml-prod", claim_ids=["gpu-burst-one"]))
    assert compute.requests == []
    one = store.get_claim("gpu-burst-one")
    assert one is not None and one.state is ClaimState.PENDING  # the redelivered message launches it
    assert store.assignments(["pod-gpu-burst-one"]) == {"pod-gpu-burst-one": "gpu-burst-one"}

    retried = service.launch(LaunchRequest(cluster="ml-prod", claim_ids=["gpu-burst-one"]))
    assert [c.claim_id for c in retried.launched] == ["gpu-burst-one"]
    service.launch(LaunchRequest(cluster="ml-prod", claim_ids=["gpu-burst-two"]))
    assert resolver.calls == 2  # one failure, then kept for the execution environment's life
    for request in compute.requests:
        user_data = request.launch_configs[0].user_data
        assert f'certificateAuthority: "{DESCRIBED_CA}"' in user_data and 'cidr: "172.20.0.0/16"' in user_data


def test_a_request_naming_no_pending_claim_costs_no_describe_cluster() -> None:
    clock = FixedClock(NOW)
    config = bare_config()
    resolver = Resolver(config, failures=5)
    service = FleetService(config, MemoryStateStore("ml-prod", clock), FakeCompute(), clock=clock,
                           launch_template_id=TEMPLATE, bootstrap=resolver)
    outcome = service.launch(LaunchRequest(cluster="ml-prod", claim_ids=["gpu-burst-gone"]))
    assert outcome.skipped == [("gpu-burst-gone", "not stored")] and resolver.calls == 0
