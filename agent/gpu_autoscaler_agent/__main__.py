"""`gpu-autoscaler-agent` / `python -m gpu_autoscaler_agent`: run the agent until SIGTERM.

Every setting is an environment variable (as the Deployment sets them) and a flag of the same name.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING

from pydantic import ValidationError

from gpu_autoscaler_agent.agent import Agent
from gpu_autoscaler_agent.settings import ENVIRONMENT, AgentSettings, load_settings

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType

__all__ = ["main", "parser"]

_TYPES = {"resync_seconds": float, "max_delay_seconds": float, "max_message_bytes": int,
          "watch_timeout_seconds": int, "health_port": int}
_DEFAULTS = {"region": "the queue URL's"}
"""Defaults that are no constant: the field is required, and a validator fills it in."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-autoscaler-agent",
        description="Report unschedulable GPU pods to the gpu-autoscaler pending-pods queue.",
    )
    for field, variable in ENVIRONMENT.items():
        info = AgentSettings.model_fields[field]
        default = _DEFAULTS.get(field) or ("required" if info.is_required() else info.default)
        if isinstance(default, tuple):
            default = ",".join(default)
        p.add_argument(
            "--" + field.replace("_", "-"),
            type=_TYPES.get(field, str),
            default=None,
            help=f"(env {variable}; default {default}) {info.description or ''}".strip(),
        )
    p.add_argument("--once", action="store_true", help="list, report, deliver once, and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    once = args.pop("once")
    try:
        settings = load_settings(**args)
    except ValidationError as error:
        print(f"gpu-autoscaler-agent: invalid settings:\n{error}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format='{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","message":"%(message)s"}',
    )
    agent = Agent(settings)
    if once:
        pending = agent.run_once()
        logging.getLogger(__name__).info("%d pending GPU pods reported", pending)
        return 0 if agent.dispatcher.undelivered == 0 else 1
    stopped = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    agent.start()
    while not stopped.wait(1.0):
        if not agent.healthy():
            logging.getLogger(__name__).error("a loop of the agent died; exiting so it is restarted")
            agent.stop()
            return 1
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
