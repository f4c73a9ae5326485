"""API Priority and Fairness answers a request its priority level has no room for 429 with `Retry-After`
(kubernetes.io/docs/concepts/cluster-administration/flow-control: APF "is designed to work well with standard
controllers, which use informers and react to failures of API requests with exponential back-off"; the value is
1 s, kubernetes/kubernetes#117734). A GET of one page of the consolidate tick's pod list that met it failed the
whole list and the tick with it; an eviction's 429 means a PodDisruptionBudget refused, which the drain handles."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_autoscaler.adapters.kubernetes import rest as module
from gpu_autoscaler.adapters.kubernetes.rest import (
    FUNCTION_TIMEOUT,
    KubernetesHttpError,
    KubernetesRest,
    worst_request_seconds,
)

_REJECTED = {"kind": "Status", "code": 429, "reason": "TooManyRequests",
             "message": "Too many requests, please try again later."}


class _Response:
    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.status, self.data, self.headers, self.reason = status, json.dumps(body).encode(), headers or {}, ""


class _Pool:
    """Answers each request with the next of `answers` (a 429 with its Retry-After, or None: the list's next page
    of one item, three pages in all), recording the requests."""

    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, str]] = []
        self.page = 0

    def request(self, method: str, url: str, **kwargs: Any) -> _Response:
        self.sent.append((method, url))
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            return _Response(429, _REJECTED, {"Retry-After": answer} if answer else {})
        if method != "GET":
            return _Response(201, {})
        self.page += 1
        more = {"continue": f"t{self.page}"} if self.page < 3 else {}
        return _Response(200, {"metadata": more, "items": [{"metadata": {"name": f"p{self.page}"}}]})

    def clear(self) -> None:
        pass


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    pauses: list[float] = []
    monkeypatch.setattr(module.time, "sleep", pauses.append)
    return pauses


def _rest(pool: _Pool) -> KubernetesRest:
    rest = KubernetesRest("http://api", timeout=FUNCTION_TIMEOUT)
    rest._pool = pool  # type: ignore[assignment]
    return rest


def test_a_page_rejected_by_priority_and_fairness_is_asked_again_after_retry_after(slept: list[float]) -> None:
    pool = _Pool(None, "1", "30")  # the second page rejected twice, the second time asking for 30 s
    names = _rest(pool).list_items("/api/v1/pods", lambda item: str(item["metadata"]["name"]), page_size=1)
    assert names == ["p1", "p2", "p3"]
    assert len(pool.sent) == 5 and pool.sent[1] == pool.sent[2] == pool.sent[3]  # the same page, not the list
    assert slept == [1.0, 2.0]  # Retry-After, at most 2 s


def test_a_get_rejected_more_than_twice_or_without_retry_after_is_the_callers_429(slept: list[float]) -> None:
    pool = _Pool("1", "", "1")
    with pytest.raises(KubernetesHttpError) as raised:
        _rest(pool).get("/api/v1/nodes")
    assert raised.value.status == 429 and len(pool.sent) == 3
    assert slept == [1.0, 1.0]  # no Retry-After: 1 s, what APF sends


def test_an_evictions_429_is_never_sent_again(slept: list[float]) -> None:
    pool = _Pool("1")
    with pytest.raises(KubernetesHttpError) as raised:
        _rest(pool).post("/api/v1/namespaces/default/pods/web-0/eviction", {"kind": "Eviction"})
    assert raised.value.status == 429 and len(pool.sent) == 1 and slept == []


def test_a_429_is_asked_again_only_while_a_stalled_attempt_still_fits_the_requests_worst_time(
        slept: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    """A function's record is started only while `worst_request_seconds` is left (`batch_failures`): the pauses
    count in it, and a 429 that took its time to come (APF queues a request before it rejects it) is not asked
    again when one more stalled attempt would go past it."""
    connect, read = FUNCTION_TIMEOUT
    assert worst_request_seconds(FUNCTION_TIMEOUT) == 3 * connect + 2 * read + 2 * 2.0
    clock = iter([0.0, 1.5, 4.0])  # started; the first 429 came after 1.5 s; the second after 4 s
    monkeypatch.setattr(module.time, "monotonic", lambda: next(clock))
    pool = _Pool("1", "1", "1")
    with pytest.raises(KubernetesHttpError):
        _rest(pool).get("/api/v1/nodes")
    assert len(pool.sent) == 2 and slept == [1.0]
