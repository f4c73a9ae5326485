from __future__ import annotations

import pickle
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pytest

from gpu_autoscaler.models.requirements import NodeSelectorTerm, Requirement, terms_match
from gpu_autoscaler.models.resources import QUANTITY_CEILING, Resources, mig_profile, mig_resource, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [("8", Decimal(8)), ("500m", Decimal("0.5")), ("64Gi", Decimal(64 * 2**30)), ("1.5", Decimal("1.5")),
     ("1e3", Decimal(1000)), ("100M", Decimal(10**8)), ("2Ki", Decimal(2048))],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "-1", "1Xi", "Gi"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


@pytest.mark.parametrize("values", [{}, {"cpu": 250, "memory": 2**30, "nvidia.com/gpu": 0, "pods": 1},
                                    {"nvidia.com/mig-3g.40gb": 2, "cpu": 8000}])
def test_the_dict_backed_reads_answer_as_the_mapping_mixins_do(values: dict[str, int]) -> None:
    """`get`, `keys`, `items`, `values` read the dict directly; each answers what `Mapping`'s own would, a missing
    key's `get` included (0 whatever the default: the mixin asks `__getitem__`, which never raises)."""
    resources = Resources(values)
    for key in ("cpu", "nvidia.com/gpu", "absent"):
        assert resources.get(key) == Mapping.get(resources, key)
        assert resources.get(key, 7) == Mapping.get(resources, key, 7)
        assert (key in resources) == Mapping.__contains__(resources, key)
    assert list(resources.keys()) == list(Mapping.keys(resources))
    assert list(resources.items()) == list(Mapping.items(resources))
    assert list(resources.values()) == list(Mapping.values(resources))
    assert dict(resources) == {k: v for k, v in values.items() if v}
    assert dict(resources + {"cpu": 1}) == {**{k: v for k, v in values.items() if v}, "cpu": values.get("cpu", 0) + 1}


def test_canonical_units_and_fit() -> None:
    pod = Resources.from_quantities({"cpu": "250m", "memory": "1Gi", "nvidia.com/gpu": "1"})
    assert pod["cpu"] == 250 and pod["memory"] == 2**30 and pod.gpus == 1
    node = Resources({"cpu": 4000, "memory": 16 * 2**30, "nvidia.com/gpu": 1})
    assert pod.fits_in(node)
    assert not (pod * 2).fits_in(node)
    assert (pod * 2).shortfall(node) == ["nvidia.com/gpu"]
    assert (node - pod)["cpu"] == 3750


def test_a_quantity_no_node_could_hold_is_held_at_the_ceiling() -> None:
    """kube-apiserver accepts `memory: 10E` (bounded only from below): held, it fits the packer's int64 arrays."""
    absurd = Resources.from_quantities({"cpu": "10P", "memory": "10E", "nvidia.com/gpu": "1"})
    assert absurd == {"cpu": QUANTITY_CEILING, "memory": QUANTITY_CEILING, "nvidia.com/gpu": 1}
    assert Resources.from_quantities({"memory": "32Ti"})["memory"] == 32 * 2**40  # the largest EC2 memory: as is


@pytest.mark.parametrize(
    ("op", "values", "labels", "expected"),
    [("In", ("a", "b"), {"k": "a"}, True), ("In", ("a",), {}, False), ("NotIn", ("a",), {}, True),
     ("NotIn", ("a",), {"k": "a"}, False), ("Exists", (), {"k": ""}, True), ("DoesNotExist", (), {"k": "x"}, False),
     ("Gt", ("4",), {"k": "5"}, True), ("Gt", ("4",), {"k": "4"}, False), ("Lt", ("4",), {"k": "3"}, True),
     ("Lt", ("4",), {"k": "x"}, False)],
)
def test_requirement_operators(op: str, values: tuple[str, ...], labels: dict[str, str], expected: bool) -> None:
    assert Requirement(key="k", operator=op, values=values).matches(labels) is expected


def test_a_vector_keeps_its_hash_but_pickles_without_it() -> None:
    """The hash is of this process's string hashes: a vector sent to another process (the simulator's workers)
    hashes there afresh."""
    r = Resources({"cpu": 1000, "nvidia.com/gpu": 1})
    assert hash(r) == hash(Resources({"nvidia.com/gpu": 1, "cpu": 1000})) == hash(r)
    back = pickle.loads(pickle.dumps(r))
    assert back == r and back._hash is None and hash(back) == hash(r)
    assert r == Resources({"cpu": 1000, "nvidia.com/gpu": 1}) and r != Resources({"cpu": 1000})
    assert r == {"cpu": 1000, "nvidia.com/gpu": 1, "memory": 0}, "a plain mapping's zeros are missing values"


@pytest.mark.parametrize(("profile", "resource"), [
    ("1g.10gb", "nvidia.com/mig-1g.10gb"),
    ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
    ("1c.2g.20gb", "nvidia.com/mig-1c.2g.20gb"),
    ("1g.12gb+me.all", "nvidia.com/mig-1g.12gb.me.all"),
])
def test_a_mig_profile_is_named_as_the_device_plugin_names_it_and_back(profile: str, resource: str) -> None:
    """k8s-device-plugin's mixed strategy: `mig-<profile>` with `+` turned into `.`."""
    assert mig_resource(profile) == resource
    assert mig_profile(resource) == profile
    assert mig_profile("nvidia.com/gpu") is None


@pytest.mark.parametrize(("term", "name", "expected"), [
    ({}, None, False),  # "A null or empty node selector term matches no objects."
    ({}, "n1", False),
    ({"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}, None, True),
    ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}, None, False),  # a new node
    ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}, "n1", True),
    ({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}, "n2", True),
    ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
      "matchExpressions": [{"key": "k", "operator": "In", "values": ["other"]}]}, "n1", False),
])
def test_a_node_selector_term_reads_its_fields_and_an_empty_one_matches_nothing(
        term: dict[str, Any], name: str | None, expected: bool) -> None:
    assert NodeSelectorTerm.model_validate(term).matches({"k": "v"}, name) is expected
    assert terms_match([NodeSelectorTerm.model_validate(term)], {"k": "v"}, name) is expected
