"""A boto3-shaped fake: paginators that answer from canned pages, record each call, and can be told to fail."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


def client_error(code: str = "AccessDeniedException", operation: str = "GetProducts") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "denied"}}, operation)


class FakeClient:
    """`answers[operation]` is a list of pages, or a function of the call's kwargs returning one."""

    def __init__(self, **answers: list[dict[str, Any]] | Callable[..., list[dict[str, Any]]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.failures: dict[str, Exception] = {}

    def fail(self, operation: str, error: Exception) -> None:
        self.failures[operation] = error

    def get_paginator(self, operation: str) -> _Paginator:
        return _Paginator(self, operation)


class _Paginator:
    def __init__(self, client: FakeClient, operation: str) -> None:
        self.client = client
        self.operation = operation

    def paginate(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.client.calls.append((self.operation, kwargs))
        if self.operation in self.client.failures:
            raise self.client.failures[self.operation]
        answer = self.client.answers.get(self.operation, [])
        pages = answer(**kwargs) if callable(answer) else answer
        return iter(pages)
