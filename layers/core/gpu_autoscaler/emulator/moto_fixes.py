"""Where moto's behaviour differs from AWS in a way our handlers would notice, corrected in-process.

The embedded server runs in this process, so a correction is a small change to moto's module state,
applied once before the server starts. Each one names the difference it removes.
"""

from __future__ import annotations

import json
import logging
from typing import Any

__all__ = ["apply"]

log = logging.getLogger(__name__)

_applied = False


def apply() -> None:
    """Idempotent; call before the first request reaches the embedded server."""
    global _applied
    if _applied:
        return
    _event_account()
    _quiet_unknown_services()
    _applied = True


def _event_account() -> None:
    """EventBridge delivers every event to a target with its `account`; moto's default target input drops it.

    Without it, a rule's SQS target receives an event Powertools' `EventBridgeModel` rejects (`account` is
    required), so the interruption function would fail every event put on the bus.
    """
    from moto.events.utils import EventTemplateParser

    template = json.loads(
        EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE.replace("<time>", "0")
        .replace("<resources>", "[]")
        .replace("<detail>", "{}")
    )
    if "account" in template:
        return  # a moto that already delivers it
    EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE = EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE.replace(
        '"source": "<source>",', '"source": "<source>", "account": "<account>",', 1
    )


def _quiet_unknown_services() -> None:
    """A request for a service moto does not have (the Pricing API) gets an error, as it should; moto also
    `print`s a line about it to the process's stdout, in the middle of the emulator's console. Log it instead."""
    from moto import backends
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    original = DomainDispatcherApplication.get_backend_for_host

    def get_backend_for_host(self: Any, host: str | None) -> Any:
        if host and "amazonaws.com" in host and host not in backends.list_of_moto_modules() and not any(
            pattern.match(f"http://{host}") for _, pattern in self.backend_url_patterns
        ):
            log.debug("no moto backend for %s", host)
            return None
        return original(self, host)

    DomainDispatcherApplication.get_backend_for_host = get_backend_for_host  # type: ignore[method-assign]
