"""A `Compute` that records every call and answers from a script, like Karpenter's fake cloud provider."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from gpu_autoscaler.domain.fleet import launched_capacity_type
from gpu_autoscaler.models.fleet import FleetError, FleetResult, LaunchedInstance

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.models.fleet import FleetRequest

    Answer = Union[FleetResult, Exception, Callable[[FleetRequest], FleetResult]]  # noqa: UP007

_ids = itertools.count(1)


def launch_first(request: FleetRequest, count: int | None = None) -> FleetResult:
    """What EC2 does when capacity is plentiful: the best override, one instance per claim."""
    first = request.overrides[0]
    return FleetResult(fleet_id="fleet-1", instances=tuple(
        LaunchedInstance(instance_id=f"i-{next(_ids):017x}", instance_type=first.instance_type, zone=first.zone,
                         capacity_type=launched_capacity_type(request.capacity_type, "on-demand"
                                                              if request.capacity_type != "spot" else "spot"),
                         subnet_id=first.subnet_id)
        for _ in range(request.target_capacity if count is None else count)
    ))


def no_capacity(code: str = "InsufficientInstanceCapacity", *, only: int | None = None) -> Callable[
        [FleetRequest], FleetResult]:
    """Every override (or the first `only` of them) answers `code`; nothing launches."""
    def answer(request: FleetRequest) -> FleetResult:
        overrides = request.overrides if only is None else request.overrides[:only]
        return FleetResult(errors=tuple(
            FleetError(code=code, message="no capacity", instance_type=o.instance_type, zone=o.zone,
                       capacity_type=request.capacity_type)
            for o in overrides
        ))
    return answer


@dataclass
class FakeCompute:
    """Answers scripted per call (then plentiful capacity); owns the instances it launched plus `owned`."""

    answers: list[Answer] = field(default_factory=list)
    requests: list[FleetRequest] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    owned: set[str] = field(default_factory=set)

    def create_fleet(self, request: FleetRequest) -> FleetResult:
        self.requests.append(request)
        answer = self.answers.pop(0) if self.answers else launch_first
        if isinstance(answer, Exception):
            raise answer
        result = answer(request) if callable(answer) else answer
        self.owned.update(i.instance_id for i in result.instances)
        return result

    def terminate(self, instance_ids: Sequence[str], *, unknown_is_gone: bool = False) -> list[str]:
        done = [i for i in instance_ids if i in self.owned]
        self.terminated.extend(i for i in done if i not in self.terminated)
        return done

    def instance_states(self, instance_ids: Sequence[str]) -> dict[str, str]:
        return {i: "terminated" if i in self.terminated else "running" for i in instance_ids if i in self.owned}
