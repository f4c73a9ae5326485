#!/usr/bin/env python3
"""Export a deployment's measured node boots as a file `gpu-autoscaler simulate --boot-times FILE` reads.

The reconcile step keeps one sample per node (launch → Node Ready → GPUs allocatable) in the stack's table for
`measuredLeadTime.history`; this writes them, every pool's, as a JSON list in the same shape (`BootSample`).
Default credentials and the configuration's region; `--endpoint-url` for the emulator.

    .venv/bin/python scripts/export_boot_times.py [--config FILE] [--days N] [--out FILE] [--endpoint-url URL]
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.adapters.aws.state_store import DynamoStateStore
from gpu_autoscaler.config import ConfigError, load_config
from gpu_autoscaler.naming import ResourceNames


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="JSON file holding the configuration object (default: cdk.json)")
    parser.add_argument("--days", type=float, help="boots launched within this many days (default: the history)")
    parser.add_argument("--out", type=Path, help="file to write (default: standard output)")
    parser.add_argument("--endpoint-url", help="an emulator's AWS endpoint")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    clients = AwsClients(config.region, args.endpoint_url)
    store = DynamoStateStore(clients.client("dynamodb"), ResourceNames(config.cluster_name).table,
                             config.cluster_name)
    since = datetime.now(UTC) - (timedelta(days=args.days) if args.days else config.measured_lead_time.history)
    samples = [s.to_json() for pool in config.node_pools for s in store.boot_times(pool.name, since)]
    text = json.dumps(samples, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
        print(f"wrote {len(samples)} boot samples to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
