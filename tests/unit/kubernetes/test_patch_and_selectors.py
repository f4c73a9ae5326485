"""The local Kubernetes API's patch formats and selectors, as pure functions (the HTTP path is integration-tested)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_autoscaler.emulator.kube_objects import NODES, PODS, ApiError
from gpu_autoscaler.emulator.kube_patch import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, apply_patch
from gpu_autoscaler.emulator.kube_selectors import (
    Selector,
    parse_field_selector,
    parse_label_selector,
    selector_from_object,
)

POD: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"app": "web"}, "finalizers": ["a"]},
    "spec": {"containers": [{"name": "main", "image": "v1"}, {"name": "side", "image": "s1"}],
             "tolerations": [{"key": "x", "operator": "Exists"}]},
    "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]},
}


def test_strategic_merge_merges_named_lists_by_key_and_replaces_the_rest() -> None:
    patched = apply_patch(POD, {
        "metadata": {"labels": {"app": None, "tier": "a"}, "finalizers": ["b"]},
        "spec": {"containers": [{"name": "side", "image": "s2"}, {"name": "new", "image": "n"}],
                 "tolerations": [{"key": "y", "operator": "Exists"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }, STRATEGIC_MERGE_PATCH)
    assert patched["metadata"]["labels"] == {"tier": "a"}
    assert patched["metadata"]["finalizers"] == ["a", "b"]
    assert [(c["name"], c["image"]) for c in patched["spec"]["containers"]] == [
        ("main", "v1"), ("side", "s2"), ("new", "n")]
    assert patched["spec"]["tolerations"] == [{"key": "y", "operator": "Exists"}]
    assert patched["status"]["conditions"] == [{"type": "Ready", "status": "True"},
                                               {"type": "PodScheduled", "status": "True"}]
    assert POD["metadata"]["labels"] == {"app": "web"}  # the original is untouched


def test_strategic_merge_directives() -> None:
    deleted = apply_patch(POD, {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}},
                          STRATEGIC_MERGE_PATCH)
    assert [c["name"] for c in deleted["spec"]["containers"]] == ["main"]
    replaced = apply_patch(POD, {"spec": {"$patch": "replace", "containers": [{"name": "only", "image": "o"}]}},
                           STRATEGIC_MERGE_PATCH)
    assert replaced["spec"] == {"containers": [{"name": "only", "image": "o"}]}
    ordered = apply_patch(POD, {"spec": {"$setElementOrder/containers": [{"name": "main"}]}}, STRATEGIC_MERGE_PATCH)
    assert ordered["spec"] == POD["spec"]


def test_merge_patch_replaces_lists_and_deletes_with_null() -> None:
    patched = apply_patch(POD, {"spec": {"containers": [{"name": "x", "image": "y"}]}, "status": None}, MERGE_PATCH)
    assert patched["spec"]["containers"] == [{"name": "x", "image": "y"}] and "status" not in patched


def test_json_patch_operations() -> None:
    patched = apply_patch(POD, [
        {"op": "add", "path": "/metadata/labels/a~1b", "value": "1"},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "v2"},
        {"op": "remove", "path": "/spec/tolerations/0"},
        {"op": "copy", "from": "/metadata/name", "path": "/metadata/annotations"},
        {"op": "move", "from": "/metadata/annotations", "path": "/metadata/generateName"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "z"},
        {"op": "test", "path": "/metadata/generateName", "value": "p"},
    ], JSON_PATCH)
    assert patched["metadata"]["labels"] == {"app": "web", "a/b": "1"}
    assert patched["spec"]["containers"][0]["image"] == "v2" and patched["spec"]["tolerations"] == []
    assert patched["metadata"]["generateName"] == "p" and "annotations" not in patched["metadata"]
    assert patched["metadata"]["finalizers"] == ["a", "z"]


@pytest.mark.parametrize(("patch", "content_type", "code"), [
    ({"op": "add"}, JSON_PATCH, 400),
    ([{"op": "remove", "path": "/nope"}], JSON_PATCH, 422),
    ([{"op": "test", "path": "/metadata/name", "value": "q"}], JSON_PATCH, 422),
    ([{"op": "frobnicate", "path": "/metadata"}], JSON_PATCH, 400),
    ({"spec": {"containers": [{"image": "no-name"}]}}, STRATEGIC_MERGE_PATCH, 400),
    ({"a": 1}, "application/apply-patch+yaml", 415),
])
def test_bad_patches_are_refused_with_the_api_servers_codes(patch: object, content_type: str, code: int) -> None:
    with pytest.raises(ApiError) as refused:
        apply_patch(POD, patch, content_type)
    assert refused.value.code == code


@pytest.mark.parametrize(("selector", "matching"), [
    ("", {"web", "db", "bare"}),
    ("app=web", {"web"}),
    ("app==web", {"web"}),
    ("app!=web", {"db", "bare"}),
    ("app in (web, db)", {"web", "db"}),
    ("app notin (web)", {"db", "bare"}),
    ("app", {"web", "db"}),
    ("!app", {"bare"}),
    ("app in (web,db),tier=a", {"web"}),
    ("gen>3", {"db"}),
])
def test_label_selectors(selector: str, matching: set[str]) -> None:
    labels = {"web": {"app": "web", "tier": "a"}, "db": {"app": "db", "gen": "5"}, "bare": {}}
    requirements = parse_label_selector(selector)
    assert {name for name, ls in labels.items() if all(r.matches(ls) for r in requirements)} == matching


def test_label_selector_objects_and_malformed_selectors() -> None:
    requirements = selector_from_object({"matchLabels": {"app": "web"},
                                         "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]})
    assert requirements is not None and len(requirements) == 2
    assert selector_from_object(None) is None and selector_from_object({}) == ()
    for bad in ("app in web", "a b c", "app in ()"):
        with pytest.raises(ApiError) as refused:
            parse_label_selector(bad)
        assert refused.value.code == 400


def test_field_selectors_compare_paths_with_empty_for_absent() -> None:
    unbound = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}, "status": {"phase": "Pending"}}
    bound = {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    fields = parse_field_selector("spec.nodeName=,status.phase!=Succeeded", PODS)
    assert [Selector(fields=fields).matches(p) for p in (unbound, bound)] == [True, False]
    assert Selector(fields=parse_field_selector("spec.nodeName==n1", PODS)).matches(bound)
    node = {"metadata": {"name": "n1"}, "spec": {}}
    assert Selector(fields=parse_field_selector("spec.unschedulable=false", NODES)).matches(node)
    with pytest.raises(ApiError) as unsupported:
        parse_field_selector("spec.nodeName=x", NODES)
    assert unsupported.value.code == 400
