"""`python -m benchmarks cold-start`: each function's cold-start import time and peak memory, with the layer.

Each handler is imported in a fresh interpreter (`-I -S -B`: no site-packages, no PYTHONPATH, no byte code
kept, as on Lambda's read-only `/opt`) whose path holds only the function's folder and the layer's `python/`
directory, as Lambda lays them out (`/var/task`, `/opt/python`). The layer is built for this machine's
architecture and Python with the same pins and slimming as the deployed one. Import time is what Lambda bills
as Init beyond the runtime's own start; CPU is the whole process's CPU time, the figure least moved by other
load on the machine; peak memory is the process's maximum resident set after the import.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.deploy import layer_size_mb, local_layer
from gpu_autoscaler.naming import FUNCTIONS
from infra.layer import ROOT

PROBE = """
import json, resource, sys, time
started = time.perf_counter()
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import handler
imported = time.perf_counter() - started
kubernetes = "kubernetes.client" in sys.modules
print(json.dumps({"import_s": imported, "cpu_s": time.process_time(),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "modules": len(sys.modules), "kubernetes": kubernetes}))
"""

ENVIRONMENT = {
    "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    "TABLE_NAME": "ml-prod-gpu-autoscaler", "CONFIG_PARAMETER": "/gpu-autoscaler/ml-prod/config",
    "LAUNCH_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/ml-prod-gpu-autoscaler-launch",
    "DRAIN_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/ml-prod-gpu-autoscaler-drain",
    "LAUNCH_TEMPLATE_ID": "lt-0123456789abcdef0", "POWERTOOLS_METRICS_NAMESPACE": "GpuAutoscaler/ml-prod",
    "OPENBLAS_NUM_THREADS": "1",
}  # fmt: skip
"""What the stack gives every function (`infra.functions.Functions.environment`), with made-up values: the
import touches no AWS."""


def import_once(function: str, layer: Path) -> dict[str, float]:
    env = {**ENVIRONMENT, "POWERTOOLS_SERVICE_NAME": function, "AWS_LAMBDA_FUNCTION_NAME": function}
    started = time.perf_counter()
    # -B: Lambda's /opt is read-only, so byte code compiled at a cold start is never kept for the next one.
    result = subprocess.run([sys.executable, "-I", "-S", "-B", "-c", PROBE, str(ROOT / "functions" / function),
                             str(layer)], env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{function}: the handler does not import with the layer alone:\n{result.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    figures["process_s"] = wall
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks cold-start")
    parser.add_argument("--runs", type=int, default=3, help="fresh interpreters per function (median shown)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpu-autoscaler-layer-") as scratch:
        return _report(local_layer(Path(scratch)), args.runs)


def _report(layer: Path, runs_per_function: int) -> int:
    print(f"layer for {sys.platform}/{sys.version_info.major}.{sys.version_info.minor}: {layer_size_mb(layer):.1f} MB")
    print(f"{'function':<14}{'import (s)':>11}{'process (s)':>13}{'CPU (s)':>9}{'peak RSS (MB)':>15}{'modules':>9}"
          "  kubernetes")
    for function in FUNCTIONS:
        runs = [import_once(function, layer) for _ in range(runs_per_function)]
        print(f"{function:<14}{statistics.median(r['import_s'] for r in runs):>11.2f}"
              f"{statistics.median(r['process_s'] for r in runs):>13.2f}"
              f"{statistics.median(r['cpu_s'] for r in runs):>9.2f}"
              f"{max(r['peak_mb'] for r in runs):>15.0f}{int(runs[0]['modules']):>9}  "
              f"{'imported' if runs[0]['kubernetes'] else '-'}")
    return 0
