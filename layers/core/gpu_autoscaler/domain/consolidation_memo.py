"""The consolidation search's solver questions remembered across passes: the same question, the same plan, solved once.

The consolidate function runs every minute, and on each run its underutilized search asks the packer one `solve`
per candidate node and a binary search over prefixes of candidates; on a cluster where little changed since the
last minute many of those questions are the very ones asked before (replaying the Alibaba trace with the search
every 10 minutes: 12,069 of 42,463 solves were repeats). `Solver.solve` is a pure function of what
it is given — the pods, the claims (the nodes that stay, shown as claims in flight, and the claims that only
count against limits and quotas), the unavailable offerings, the source that salts new claim ids, the vCPU
quotas and what the account's other instances use of them — and of its own solver (configuration, catalog,
packer: fixed for its life), save one thing: a new claim's `created_at` is the solver clock's now. So the plan of
a question asked before is the plan kept then, each new claim stamped with this pass's now.

The key is every one of those inputs, in full: each claim and pod as its canonical JSON (`model_dump_json`: every
field), each node shown as a claim in flight as the inputs its view is made of (`GroupNode.as_in_flight`: its claim,
price, used and capacity), the unavailable offerings, quotas and others' use sorted. A question differing in anything
the solver reads (whether it may open nodes among them) is another question. One memo per solver (as
`packing.memo.PackMemo`: a warm Lambda container keeps its solver, so a minute's run finds the last one's plans),
bounded: least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from gpu_autoscaler.domain.per_object import PerObject

if TYPE_CHECKING:
    from collections.abc import Collection, Hashable, Mapping, Sequence
    from datetime import datetime

    from gpu_autoscaler.domain.catalog import OfferingKey
    from gpu_autoscaler.domain.packing.results import Plan
    from gpu_autoscaler.domain.packing.solver import Solver
    from gpu_autoscaler.models.claims import NodeClaim
    from gpu_autoscaler.models.pods import PendingPod

__all__ = ["SOLVE_MEMO_LIMIT", "SolveMemo", "claim_print", "pod_print", "solve_memo"]

SOLVE_MEMO_LIMIT = 2048
"""Plans kept at most per solver; the least recently used goes. A key holds a reference per claim shown (the prints
themselves are shared by the keys of one pass), a plan a few claims: a few MB at the limit on a cluster of a
hundred nodes. The search asks ~4 new questions a pass, so the limit spans hundreds of passes."""

_MEMOS: WeakKeyDictionary[Solver, SolveMemo] = WeakKeyDictionary()


_print: PerObject[NodeClaim | PendingPod, str] = PerObject(lambda model: model.model_dump_json())
"""Every field of a frozen model, as canonical JSON."""


def claim_print(claim: NodeClaim) -> str:
    """A claim's every field: equal only for claims the solver cannot tell apart."""
    return _print(claim)


def pod_print(pod: PendingPod) -> str:
    """A pod's every field: equal only for pods the solver cannot tell apart."""
    return _print(pod)


def question(pods: Sequence[PendingPod], claims: Sequence[Hashable], unavailable: Collection[OfferingKey],
             source: str, quotas: Mapping[str, int] | None, solver: Solver, *, new_nodes: bool,
             outside: Mapping[str, int] | None = None) -> tuple[object, ...]:
    """The key of one `solve(pods, claims=..., unavailable=..., source=..., quotas=..., outside=..., new_nodes=...)`:
    `claims` are the claims' prints in the order given (the solver's order among equals follows it)."""
    shown = solver.quotas if quotas is None else quotas
    return (tuple(pod_print(p) for p in pods), tuple(claims), tuple(sorted(unavailable)), source,
            quotas is None, tuple(sorted(shown.items())), tuple(sorted((outside or {}).items())), new_nodes)


class SolveMemo:
    """One solver's plans by question, least recently used first out."""

    def __init__(self, limit: int = SOLVE_MEMO_LIMIT) -> None:
        self.limit = limit
        self._plans: OrderedDict[tuple[object, ...], Plan] = OrderedDict()

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, key: tuple[object, ...], now: datetime) -> Plan | None:
        """The plan kept for `key`, its new claims made `now` (the only thing a solve takes from its clock)."""
        found = self._plans.get(key)
        if found is None:
            return None
        self._plans.move_to_end(key)
        claims = tuple(c if c.created_at == now else c.model_copy(update={"created_at": now}) for c in found.claims)
        return replace(found, claims=claims, existing=dict(found.existing), covered=dict(found.covered))

    def put(self, key: tuple[object, ...], plan: Plan) -> None:
        self._plans[key] = replace(plan, existing=dict(plan.existing), covered=dict(plan.covered))
        self._plans.move_to_end(key)
        while len(self._plans) > self.limit:
            self._plans.popitem(last=False)


def solve_memo(solver: Solver) -> SolveMemo:
    """The solver's memo (one per solver: its configuration, catalog and packer are part of every answer)."""
    found = _MEMOS.get(solver)
    if found is None:
        found = _MEMOS[solver] = SolveMemo()
    return found
