"""Which moto backend serves a request depends only on its host; moto worked it out again for every request (its
package directory listed, hundreds of URL patterns tried) under a lock every request takes. The emulator works
each host out once."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

    from gpu_autoscaler.emulator.aws import EmbeddedAws


def test_requests_after_the_first_do_not_look_for_their_backend_again(
        aws: EmbeddedAws, monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import backends

    sqs, db = aws.clients.client("sqs"), aws.clients.client("dynamodb")
    sqs.list_queues()
    db.list_tables()
    listed = []
    original = backends.list_of_moto_modules

    def counted() -> object:
        listed.append(1)
        return original()

    monkeypatch.setattr(backends, "list_of_moto_modules", counted)
    for _ in range(5):
        sqs.list_queues()
        db.list_tables()
    assert listed == []
