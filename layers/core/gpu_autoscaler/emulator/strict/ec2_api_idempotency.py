"""EC2 idempotency: a CreateFleet repeated under the same ClientToken is answered once.

Source: Amazon EC2 Developer Guide, "Ensuring idempotency in Amazon EC2 API requests"
(https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-idempotency.html): CreateFleet supports idempotency
with a client token; a request repeated with the same token and the same parameters completes no more than
once (it returns the original result, with no further action); the same token with different parameters is
refused with `IdempotentParameterMismatch`.

moto launches new instances on every call, so a function that dies after CreateFleet and is retried would
launch twice on the emulator where EC2 would hand back the first fleet's instances. This stand-in remembers,
per account and region, each token's parameters and the answer. It is asked before the other CreateFleet
stand-ins (`first=True`) and, for a request with a token, answers in their place: the first time
it asks the stand-ins after it (capacity reservations, the Spot role...), else moto, and keeps what they said.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from gpu_autoscaler.emulator.strict.core import Answer, AwsRequest, Refusal, answer, ask_after, on_reset

__all__ = ["create_fleet_once_per_token"]

_answered: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = {}
_lock = threading.Lock()


@on_reset
def _forget() -> None:
    with _lock:
        _answered.clear()


@answer("ec2", "CreateFleet", first=True)
def create_fleet_once_per_token(request: AwsRequest) -> Answer | None:
    token = request.params.get("ClientToken")
    if not token:
        return None
    key = (request.account, request.region, str(token))
    asked = json.dumps(request.params, sort_keys=True, default=str)
    with _lock:  # one answer per token, even when two retries race
        if key in _answered:
            params, result = _answered[key]
            if params != asked:
                raise Refusal("IdempotentParameterMismatch",
                              "Arguments on this idempotent request are inconsistent with arguments used in "
                              "previous request(s).")
            return Answer(result=result)
        result = ask_after(create_fleet_once_per_token, request).result or {}
        _answered[key] = (asked, result)
    return Answer(result=result)
