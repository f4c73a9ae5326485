"""`TickLeases` in one process: the tests' stand-in for the lease items of the DynamoDB table, with their
conditions (taken when absent or expired, released only by its holder), each check and write under one lock as
DynamoDB makes a conditional write one atomic step."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datetime import datetime

    from gpu_autoscaler.models.leases import Lease

__all__ = ["MemoryTickLeases"]


class MemoryTickLeases:
    def __init__(self) -> None:
        self._held: dict[str, Lease] = {}
        self._lock = threading.Lock()

    def take(self, lease: Lease, now: datetime) -> Lease | None:
        with self._lock:
            held = self._held.get(lease.name)
            if held is not None and not held.expires_at < now:
                return held
            self._held[lease.name] = lease
            return None

    def release(self, lease: Lease) -> bool:
        with self._lock:
            held = self._held.get(lease.name)
            if held is None or held.holder != lease.holder:
                return False
            del self._held[lease.name]
            return True
