from __future__ import annotations

import pytest

from gpu_autoscaler.adapters.aws.instance_types import instance_type_from_api
from gpu_autoscaler.domain.max_pods import max_pods
from tests.unit.catalog.builders import raw_instance_type


@pytest.mark.parametrize(
    ("enis", "ipv4", "expected"),
    [
        (3, 10, 29),  # g4dn.xlarge in EKS's eni-max-pods.txt
        (4, 15, 58),  # g5.xlarge
        (15, 50, 737),  # g4dn.metal, and p4d.24xlarge's default network card
        (2, 50, 100),  # p5.48xlarge's default network card
    ],
)
def test_secondary_ip_mode(enis: int, ipv4: int, expected: int) -> None:
    assert max_pods(enis, ipv4, vcpus=8) == expected


@pytest.mark.parametrize(
    ("enis", "ipv4", "vcpus", "expected"),
    [
        (3, 10, 4, 110),  # 3 × 9 × 16 + 2 = 434, capped at 110 below 30 vCPUs
        (7, 50, 192, 250),  # capped at 250 from 30 vCPUs
        (2, 2, 2, 34),  # 2 × 1 × 16 + 2 = 34, under the cap
        (1, 5, 30, 66),  # 1 × 4 × 16 + 2
    ],
)
def test_prefix_delegation_mode(enis: int, ipv4: int, vcpus: int, expected: int) -> None:
    assert max_pods(enis, ipv4, vcpus, prefix_delegation=True) == expected


def test_a_type_without_addresses_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one ENI"):
        max_pods(0, 10, 4)


def test_only_the_default_network_card_counts() -> None:
    # p5.48xlarge: 64 interfaces over 32 network cards, 2 on the default card.
    raw = raw_instance_type("p5.48xlarge", vcpus=192, enis=64, ipv4_per_eni=50, cards=[(i, 2) for i in range(32)])
    assert instance_type_from_api(raw, overrides={}).max_pods == 100
    assert instance_type_from_api(raw, overrides={}, prefix_delegation=True).max_pods == 250
