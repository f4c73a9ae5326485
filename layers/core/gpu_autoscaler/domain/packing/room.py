"""Spare room on a new node: worth part of its price when pods arrive a few at a time.

The tier packer prices a batch as if it were all the demand there will ever be, so a lone 16-vCPU, one-GPU pod
gets a g4dn.8xlarge: the cheapest node that holds it, with room for no other GPU pod. Pods of a GPU trace arrive
one or two at a time, minutes apart, and run for hours; a g4dn.12xlarge for the same pod costs more now but leaves
three GPUs with CPU and memory beside them, where the next arrivals are scheduled at once instead of each waiting a
boot for a node of its own (and each such node, once its pod leaves, is one more launch and removal).

So when a small batch fits one node, each kind that holds it is also priced net of its spare room: the
share of the node left free (the least over the resources the pool's nodes have, counted up to `ROOM_PER_BATCH`
times the batch's own share, and only when there is room for more GPU work at all) times the node's price, at
`worth` — the part of that room expected to be used. If the best node by that measure beats the plan, the batch
gets it. Replaying the default Alibaba trace (first 1,000 pods, `ours-no-prediction`, 17,956 USD and 574
launches before): a worth of 0.8 gave 16,871 USD and 323 launches, 0.7 16,889; 0.95 chose g4dn.metal nodes for
single pods and cost 18,832; below about 0.65 nothing changes on that trace; with the cap at twice the batch's
share (an 8-GPU node is not bought for a one-GPU pod) 0.8 gave 17,083 USD and 308 launches.

Only batches of at most `ROOM_BATCH_PODS` pods are looked at: a larger one is a burst whose own demand says what
to buy (a 16-pod batch of time-sliced pods would otherwise get one g6.48xlarge for five g6.4xlarges' money, 7 %
over the exact optimum in `packing-quality`). Limiting it instead to plans of one node (so that two pods the
packer put on two nodes are never merged onto a roomier one) was measured on the whole default trace: 23,217 USD
for `ours-no-prediction` against 23,938, but 2,645 launches against 1,643 and 6,793 pods run against 6,920 (of
the pods the trace withdraws while they wait, fewer found room at once), so the pod count is the limit. The
price shows in `packing-quality`, which knows no later arrivals: s12 (three pods the packer put on three
g6.4xlarge, given one g6.12xlarge with room for a fourth) is 1.044 × the MILP there. Kinds with a reservation
limit are left as planned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpu_autoscaler.domain.packing.kinds import Opened

if TYPE_CHECKING:
    from gpu_autoscaler.domain.packing.kinds import Kinds

__all__ = ["ROOM_BATCH_PODS", "ROOM_PER_BATCH", "roomier_node"]

ROOM_BATCH_PODS = 4
"""Batches of more pods than this are bursts: they get the packer's plan as it is."""

ROOM_PER_BATCH = 2.0
"""Spare room counts up to this many times the share of the node the batch itself takes."""
_EPS = 1e-9


def roomier_node(opened: list[Opened], demand: np.ndarray, req: np.ndarray, kinds: Kinds, gpu: int,
                 worth: float) -> Opened | None:
    """One node holding all of `demand` (a small batch) that beats the plan `opened` once spare room counts at
    `worth`, or None.

    `gpu`: the column of `req` and `kinds.cap` that counts GPUs (time-sliced replicas in a sharing pool).
    """
    if worth <= 0 or kinds.limit is not None or not opened or int(demand.sum()) > ROOM_BATCH_PODS:
        return None
    present = demand > 0
    used = demand @ req
    holds = kinds.feasible[present].all(axis=0) & (kinds.cap >= used).all(axis=1)
    if not holds.any():
        return None
    cap = kinds.cap.astype(np.float64)
    counted = (kinds.cap > 0).any(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        free = np.where(cap > 0, (cap - used) / np.where(cap > 0, cap, 1.0), 1.0)
    left = np.clip(free[:, counted], 0.0, 1.0)
    spare = left.min(axis=1, initial=1.0)
    own = (1.0 - left).max(axis=1, initial=0.0)
    # Room counts up to `ROOM_PER_BATCH` times the batch's own share of the node: the next pods come a few at a
    # time, so a node is bought for a few more of them, not for a crowd (an 8-GPU node for a one-GPU pod).
    spare = np.where(holds & (kinds.cap[:, gpu] > used[gpu]), np.minimum(spare, ROOM_PER_BATCH * own), 0.0)
    net = np.where(holds, kinds.price * (1.0 - worth * spare), np.inf)
    best = int(net.argmin())
    planned = float(sum(kinds.price[e.kind] * e.copies for e in opened))
    if net[best] >= planned - _EPS or kinds.price[best] <= planned + _EPS:
        # No better by that measure; or that node is no dearer than the plan, which then already has the room
        # (the packer's own choice stands: only a dearer node bought for its room needs saying so).
        return None
    return Opened(best, demand.astype(np.int64).copy(), 1)
