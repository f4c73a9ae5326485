"""`python -m benchmarks synth`: `cdk synth`'s app with the real layer, on a clean checkout, cold and cached.

Each run is `python app.py` (what `cdk synth` runs, `cdk.json`'s app) in a fresh process writing to a fresh
output directory, so nothing of a previous synth is reused but the layer cache. "cold" starts with an empty
layer cache (pip resolves and downloads every wheel); "cached" reuses what the cold run built.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infra.layer import LAYER_CACHE_ENV, ROOT, layer_cache_dir

TARGET_SECONDS = 120.0


def synth_once(outdir: Path, cache: Path) -> float:
    env = {**os.environ, "CDK_OUTDIR": str(outdir), LAYER_CACHE_ENV: str(cache)}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"synth failed:\n{result.stderr[-3000:]}")
    return elapsed


def _layer_asset_mb(outdir: Path) -> float:
    sizes = [sum(f.stat().st_size for f in asset.rglob("*") if f.is_file()) for asset in outdir.glob("asset.*")
             if (asset / "python").is_dir()]
    return max(sizes) / 2**20


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks synth")
    parser.add_argument("--cached-only", action="store_true",
                        help="skip the cold run: use the user's layer cache as it is")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="synth-bench-") as scratch:
        base = Path(scratch)
        cache = layer_cache_dir() if args.cached_only else base / "layer-cache"
        rows = []
        if not args.cached_only:
            rows.append(("cold (empty layer cache)", synth_once(base / "cold", cache)))
        rows.append(("cached (layer cache warm)", synth_once(base / "cached", cache)))
        for what, seconds in rows:
            verdict = "ok" if seconds <= TARGET_SECONDS else "OVER"
            print(f"synth {what:<28} {seconds:6.1f} s  (target {TARGET_SECONDS:.0f} s: {verdict})")
        print(f"layer asset                        {_layer_asset_mb(base / 'cached'):6.1f} MB unzipped")
    return 0
