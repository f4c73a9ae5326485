"""Pods of a burst share their parsed requests and tolerations; each pod still reads as it was sent."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gpu_autoscaler.models.pods import PendingPod, PendingPodsDocument
from gpu_autoscaler.models.taints import Toleration

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _document(*pods: dict[str, object]) -> bytes:
    return json.dumps({"schemaVersion": 1, "cluster": "c", "sentAt": "2026-11-22T00:00:00Z", "pods": list(pods)}
                      ).encode()


def test_equal_tolerations_and_requests_read_the_same_and_others_keep_their_own() -> None:
    pods = PendingPodsDocument.model_validate_json(_document(
        {"uid": "a", "name": "a", "requests": {"cpu": "1", "nvidia.com/gpu": "1"}, "tolerations": [GPU_TOLERATION]},
        {"uid": "b", "name": "b", "requests": {"cpu": "1", "nvidia.com/gpu": "1"}, "tolerations": [GPU_TOLERATION]},
        {"uid": "c", "name": "c", "requests": {"cpu": "2"},
         "tolerations": [{**GPU_TOLERATION, "effect": "NoExecute", "tolerationSeconds": 30}]},
    )).pods
    assert pods[0].tolerations == pods[1].tolerations and pods[0].resources == pods[1].resources
    assert pods[0].tolerations[0].key == "nvidia.com/gpu" and pods[0].tolerations[0].operator == "Exists"
    assert pods[2].tolerations[0].effect == "NoExecute" and pods[2].tolerations[0].toleration_seconds == 30
    assert pods[2].resources["cpu"] == 2000 and pods[2].resources["nvidia.com/gpu"] == 0


def test_a_bad_toleration_is_refused_every_time_it_is_sent() -> None:
    bad = {"key": "x", "operator": "Sometimes"}
    for _ in range(2):
        with pytest.raises(ValidationError, match="operator"):
            PendingPodsDocument.model_validate_json(_document({"uid": "a", "name": "a", "tolerations": [bad]}))


def test_a_toleration_built_in_code_after_a_document_shared_it_keeps_its_fields() -> None:
    PendingPodsDocument.model_validate_json(_document({"uid": "a", "name": "a", "tolerations": [GPU_TOLERATION]}))
    built = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    assert built.key == "nvidia.com/gpu" and built.effect == "NoSchedule"
    pod = PendingPod(uid="b", name="b", tolerations=(built,))
    assert pod.tolerations == (built,)


def test_tolerations_the_sharing_cannot_key_are_validated_as_sent() -> None:
    """Models in a list (code building a pod), a value that cannot be hashed, a number: each is read, or refused,
    as an unshared list would be, and a number is never taken for the same toleration without it."""
    built = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    assert PendingPod(uid="a", name="a", tolerations=[built]).tolerations == (built,)
    with pytest.raises(ValidationError, match="tolerations.0.key"):
        PendingPod.model_validate({"uid": "a", "name": "a", "tolerations": [{"key": ["nvidia.com/gpu"]}]})
    for seconds in (30, 30):
        pod = PendingPod.model_validate({"uid": "a", "name": "a",
                                         "tolerations": [{**GPU_TOLERATION, "tolerationSeconds": seconds}]})
        assert pod.tolerations[0].toleration_seconds == 30
