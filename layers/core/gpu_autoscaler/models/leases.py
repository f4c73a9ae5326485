"""A scheduled function's tick lease: which invocation runs the function's tick now, and until when at most.

Kept in the state table (`ports.TickLeases`), so that the ticks of prewarm and consolidate run one at a time
without reserving Lambda concurrency, which a new account cannot give (`services.tick_lease`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datetime import datetime

__all__ = ["Lease"]


@dataclass(frozen=True)
class Lease:
    name: str
    """The function whose ticks it keeps apart: one lease per function."""
    holder: str
    """The invocation holding it: its Lambda request id, so a release removes its own lease and no other."""
    expires_at: datetime
    """The end of the holder's run at the latest (its start + the function's timeout): a holder that crashed or
    timed out frees the lease by itself then."""
