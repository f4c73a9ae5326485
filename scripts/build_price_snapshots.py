#!/usr/bin/env python3
"""Build the bundled price snapshots from the shared price data.

The catalog prefers live prices (the Pricing API for on-demand, DescribeSpotPriceHistory for spot);
these snapshots stand in where no live source answers: the emulator (moto has no Pricing API),
a Lambda whose Pricing call failed, and the simulator. Run it again when the source CSVs change;
its output is deterministic, so an unchanged source gives unchanged files.

    .venv/bin/python scripts/build_price_snapshots.py [--source DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = ROOT.parent / "shared" / "data" / "prices"
DEFAULT_OUT = ROOT / "layers" / "core" / "gpu_autoscaler" / "data"

ON_DEMAND_CSV = "ec2-ondemand-us-east-1-gpu.csv"
ON_DEMAND_DATE = "2026-07-20"
"""The date Karpenter generated the price table the CSV was taken from (see the shared data README)."""
SPOT_ADVISOR_CSV = "spot-advisor-gpu-linux.csv"

ON_DEMAND_JSON = "ondemand-prices.json"
SPOT_ADVISOR_JSON = "spot-advisor.json"

_GPU_FAMILY = re.compile(r"^(?:g|gr|p)\d")
"""EC2's GPU instance families are the g, gr and p families (g5, gr6, p5, p6-b200 ...)."""

INTERRUPTION_BANDS = ["<5%", "5-10%", "10-15%", "15-20%", ">20%"]


def is_gpu_type(instance_type: str) -> bool:
    return bool(_GPU_FAMILY.match(instance_type))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        lines = [line for line in handle if not line.startswith("#")]
    return list(csv.DictReader(lines))


def build_on_demand(source: Path) -> dict[str, Any]:
    regions: dict[str, dict[str, float]] = {}
    for row in _rows(source / ON_DEMAND_CSV):
        if is_gpu_type(row["instance_type"]):
            price = float(row["ondemand_usd_per_hour"])
            regions.setdefault(row["region"], {})[row["instance_type"]] = round(price, 6)
    return {
        "description": "On-demand USD per hour, Linux, shared tenancy, GPU instance types.",
        "source": "Karpenter AWS provider pkg/providers/pricing/zz_generated.pricing_aws.go, "
        f"via ../shared/data/prices/{ON_DEMAND_CSV}",
        "date": ON_DEMAND_DATE,
        "currency": "USD",
        "regions": {region: dict(sorted(prices.items())) for region, prices in sorted(regions.items())},
    }


def build_spot_advisor(source: Path) -> dict[str, Any]:
    path = source / SPOT_ADVISOR_CSV
    regions: dict[str, dict[str, dict[str, int]]] = {}
    for row in _rows(path):
        if not is_gpu_type(row["instance_type"]):
            continue
        band = int(row["interruption_range_index"])
        if not 0 <= band < len(INTERRUPTION_BANDS):
            raise ValueError(f"{path}: interruption band {band} out of range for {row['instance_type']}")
        regions.setdefault(row["region"], {})[row["instance_type"]] = {
            "savingsPct": int(row["savings_pct_vs_ondemand"]),
            "interruptionBand": band,
        }
    retrieved = datetime.fromtimestamp(path.stat().st_mtime, UTC).date().isoformat()
    return {
        "description": "AWS Spot Instance Advisor, Linux, GPU instance types, every region: savings versus "
        "on-demand (%) and the interruption frequency band.",
        "source": f"AWS Spot Instance Advisor data, via ../shared/data/prices/{SPOT_ADVISOR_CSV}",
        "date": retrieved,
        "dateNote": "the advisor data carries no date of its own; this is the date the CSV was retrieved",
        "interruptionBands": INTERRUPTION_BANDS,
        "regions": {
            region: dict(sorted(types.items())) for region, types in sorted(regions.items())
        },
    }


def write(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="directory holding the price CSVs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the package's data directory")
    args = parser.parse_args(argv)
    on_demand = build_on_demand(args.source)
    advisor = build_spot_advisor(args.source)
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out / ON_DEMAND_JSON, on_demand)
    write(args.out / SPOT_ADVISOR_JSON, advisor)
    counted = sum(len(p) for p in on_demand["regions"].values())
    advised = sum(len(t) for t in advisor["regions"].values())
    print(f"{ON_DEMAND_JSON}: {counted} prices ({', '.join(on_demand['regions'])}), dated {on_demand['date']}")
    print(f"{SPOT_ADVISOR_JSON}: {advised} entries in {len(advisor['regions'])} regions, dated {advisor['date']}")


if __name__ == "__main__":
    main()
