"""Job traces as the simulator replays them: GPU pods that arrive, wait for capacity, run and leave.

Two formats:

- `alibaba-v2023`: the `openb_pod_list_*.csv` files of Alibaba's cluster-trace-gpu-v2023 (columns `name,
  cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase, creation_time, deletion_time,
  scheduled_time`, times in seconds). A pod arrives at `creation_time`. One that was scheduled in the trace
  runs for `deletion_time − scheduled_time` once it is bound, however long it waited here; one that never
  ran there (empty `scheduled_time`) was deleted while pending at `deletion_time`, so here it is deleted
  then if it is still pending, and otherwise runs until then. Pods that ask for no GPU are not this
  autoscaler's and are counted as skipped. `gpu_spec` (`T4`, `V100M16|V100M32`, …) becomes a node
  affinity on the EC2 GPU names of `GPU_MODELS` — the mapping is the report's, stated there.
- `csv`: a small format of our own for hand-made traces, one pod a row, header required:
  `name,arrival,duration,gpus,cpu,memory` and optionally `gpu_name` (EC2 GPU names, `t4|a10g`), `gang`,
  `gang_size` (a pod group: all members placed together), `deleted_at` (seconds; deleted then if still
  pending). `gpus` below 1 is a fraction of one GPU (`0.5`); `cpu` and `memory` are Kubernetes quantities
  (`12`, `500m`, `16Gi`); `duration` empty means "until `deleted_at`".

Times are seconds from the trace's t = 0, which the simulator reads as `TRACE_EPOCH` (a Monday, 00:00 UTC),
so time of day and day of week are the trace's own clock read as UTC — as the pre-warm backtest reads it.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpu_autoscaler.errors import GpuAutoscalerError
from gpu_autoscaler.models.resources import parse_quantity

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpu_autoscaler.domain.catalog import Catalog

__all__ = [
    "FORMATS",
    "GPU_MODELS",
    "TRACE_EPOCH",
    "GpuModel",
    "Trace",
    "TraceError",
    "TracePod",
    "read_trace",
]

TRACE_EPOCH = datetime(2026, 1, 5, tzinfo=UTC)
"""Trace t = 0: Monday 5 January 2026, 00:00 UTC (the pre-warm backtest's choice, so both read the same clock)."""

TraceFormat = Literal["alibaba-v2023", "csv"]
FORMATS: tuple[TraceFormat, ...] = ("alibaba-v2023", "csv")


class TraceError(GpuAutoscalerError, ValueError):
    """The trace file cannot be read: the message names the file, the row and the column."""


@dataclass(frozen=True)
class GpuModel:
    """How one GPU model of a trace maps to EC2: the GPU names (`karpenter.k8s.aws/instance-gpu-name`) a pod
    asking for it may run on; empty means no constraint at all."""

    gpu_names: tuple[str, ...]
    note: str


GPU_MODELS: dict[str, GpuModel] = {
    "T4": GpuModel(("t4",), "NVIDIA T4: g4dn"),
    "A10": GpuModel(("a10g",), "NVIDIA A10: the A10G of g5"),
    "V100M16": GpuModel(("v100",), "V100 16 GB: p3 (where the catalog has no p3, p3dn's V100 32 GB)"),
    "V100M32": GpuModel(("v100",), "V100 32 GB: p3dn"),
    "P100": GpuModel(("t4",), "EC2 never offered P100; T4 (g4dn) is the nearest 16 GB data-centre GPU on offer"),
    "G1": GpuModel((), "undisclosed in-house model: no EC2 equivalent is known, so the constraint is dropped"),
    "G2": GpuModel((), "undisclosed in-house model: no EC2 equivalent is known, so the constraint is dropped"),
    "G3": GpuModel((), "undisclosed in-house model: no EC2 equivalent is known, so the constraint is dropped"),
}
"""Alibaba's GPU models → EC2 GPU names. Models not listed are dropped like G1–G3 and counted in the trace
summary (`unknownGpuModels`)."""


@dataclass(frozen=True)
class TracePod:
    """One GPU pod of the trace, in the trace's own terms (the policy's configuration shapes its requests)."""

    index: int
    name: str
    arrival: float
    """Seconds from the trace's t = 0."""
    duration: float | None
    """Seconds it runs once bound; None: it runs until `deleted_at`."""
    deleted_at: float | None
    """Deleted at this instant if still pending then (and stopped then, when `duration` is None)."""
    cpu_milli: int
    memory_mib: int
    gpus: int
    """GPU devices asked for (`num_gpu`)."""
    gpu_milli: int = 1000
    """Per device, thousandths of a GPU: below 1000 a fraction of one shared GPU."""
    gpu_names: tuple[str, ...] = ()
    """EC2 GPU names it may run on; empty: any."""
    gang: str | None = None
    gang_size: int = 0

    @property
    def share(self) -> float:
        """Physical GPUs the pod uses: what it is billed at in the lower bound and counted as allocated."""
        return self.gpus * self.gpu_milli / 1000

    @property
    def fractional(self) -> bool:
        return self.gpus == 1 and self.gpu_milli < 1000


@dataclass(frozen=True)
class Trace:
    source: str
    format: TraceFormat
    pods: tuple[TracePod, ...]
    """GPU pods, by arrival."""
    rows: int
    skipped: Mapping[str, int] = field(default_factory=dict)
    """Reason → rows not replayed."""
    gpu_models: Mapping[str, int] = field(default_factory=dict)
    """Trace GPU model → pods naming it (alibaba-v2023)."""
    unknown_models: Mapping[str, int] = field(default_factory=dict)

    @property
    def span(self) -> tuple[float, float]:
        """(first arrival, last moment any pod could still be running if bound on arrival)."""
        if not self.pods:
            return (0.0, 0.0)
        ends = [p.arrival + p.duration if p.duration is not None else (p.deleted_at or p.arrival) for p in self.pods]
        return (min(p.arrival for p in self.pods), max(ends))

    def head(self, count: int) -> Trace:
        """The first `count` pods by arrival (a small slice for tests and quick looks)."""
        return self._with(self.pods[:count])

    def between(self, start: float, end: float) -> Trace:
        """The pods arriving in [start, end) seconds: a stretch of the trace, replayed on its own."""
        return self._with(tuple(p for p in self.pods if start <= p.arrival < end))

    def _with(self, pods: tuple[TracePod, ...]) -> Trace:
        return Trace(self.source, self.format, pods, self.rows, self.skipped, self.gpu_models, self.unknown_models)

    def mapping(self, catalog: Catalog | None = None) -> dict[str, Any]:
        """The GPU mapping as the report states it: per trace model, EC2 GPU names and the catalog's types."""
        by_name: dict[str, list[str]] = {}
        if catalog is not None:
            for t in catalog.gpu_types():
                if t.gpu_model:
                    by_name.setdefault(t.gpu_model.lower(), []).append(t.name)
        out: dict[str, Any] = {}
        models = GPU_MODELS if self.format == "alibaba-v2023" else {}
        for model, target in models.items():
            entry: dict[str, Any] = {"gpuNames": list(target.gpu_names) or "any", "note": target.note,
                                     "pods": self.gpu_models.get(model, 0)}
            if catalog is not None and target.gpu_names:
                entry["instanceTypes"] = sorted(n for g in target.gpu_names for n in by_name.get(g, []))
            out[model] = entry
        for model, count in self.unknown_models.items():
            out[model] = {"gpuNames": "any", "note": "not in the mapping: the constraint is dropped", "pods": count}
        return out

    def summary(self) -> dict[str, Any]:
        first, last = self.span
        return {
            "file": self.source,
            "format": self.format,
            "rows": self.rows,
            "gpuPods": len(self.pods),
            "skipped": dict(self.skipped),
            "gpusRequested": round(sum(p.share for p in self.pods), 3),
            "firstArrivalSeconds": first,
            "lastEndSeconds": last,
            "epoch": TRACE_EPOCH.isoformat(),
        }


def read_trace(path: Path | str, format: TraceFormat = "alibaba-v2023") -> Trace:
    """Read a trace file; `TraceError` names what is wrong with it."""
    file = Path(path)
    try:
        with file.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except FileNotFoundError:
        raise TraceError(f"{file}: no such file") from None
    except (UnicodeDecodeError, csv.Error) as error:
        raise TraceError(f"{file}: not a CSV file ({error})") from None
    if format == "alibaba-v2023":
        return _alibaba(str(file), rows)
    if format == "csv":
        return _generic(str(file), rows)
    raise TraceError(f"unknown trace format '{format}'; known: {', '.join(FORMATS)}")


# alibaba-v2023

_ALIBABA_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "creation_time",
                    "deletion_time", "scheduled_time")


def _alibaba(source: str, rows: list[dict[str, str]]) -> Trace:
    _require_columns(source, rows, _ALIBABA_COLUMNS)
    pods: list[TracePod] = []
    skipped: dict[str, int] = {}
    models: dict[str, int] = {}
    unknown: dict[str, int] = {}
    for number, row in enumerate(rows, start=2):
        where = f"{source}:{number}"
        gpus = _int(row, "num_gpu", where)
        milli = _int(row, "gpu_milli", where)
        if gpus <= 0:
            skipped["no GPU requested (not a GPU pod)"] = skipped.get("no GPU requested (not a GPU pod)", 0) + 1
            continue
        milli = 1000 if milli <= 0 else milli
        if gpus > 1 and milli < 1000:
            raise TraceError(f"{where}: {gpus} GPUs of {milli} milli each: only a single GPU can be shared")
        creation = _float(row, "creation_time", where)
        deletion = _optional_float(row, "deletion_time", where)
        scheduled = _optional_float(row, "scheduled_time", where)
        if scheduled is not None and deletion is not None:
            duration: float | None = max(0.0, deletion - scheduled)
        elif scheduled is not None:
            skipped["running at the trace's end (no deletion time)"] = skipped.get(
                "running at the trace's end (no deletion time)", 0) + 1
            continue
        else:
            duration = None
        names = _gpu_names(row.get("gpu_spec") or "", models, unknown)
        pods.append(TracePod(
            index=0, name=row["name"], arrival=creation, duration=duration,
            deleted_at=deletion if scheduled is None else None,
            cpu_milli=_int(row, "cpu_milli", where), memory_mib=_int(row, "memory_mib", where),
            gpus=gpus, gpu_milli=min(milli, 1000), gpu_names=names,
        ))
    return Trace(source, "alibaba-v2023", _indexed(pods), len(rows), skipped, models, unknown)


def _gpu_names(spec: str, models: dict[str, int], unknown: dict[str, int]) -> tuple[str, ...]:
    """The union of the EC2 GPU names of the alternatives; any unconstrained alternative frees the pod."""
    alternatives = [s.strip() for s in spec.split("|") if s.strip()]
    names: list[str] = []
    for model in dict.fromkeys(alternatives):
        target = GPU_MODELS.get(model)
        if target is None:
            unknown[model] = unknown.get(model, 0) + 1
            return ()
        models[model] = models.get(model, 0) + 1
        if not target.gpu_names:
            return ()
        names.extend(n for n in target.gpu_names if n not in names)
    return tuple(names)


# csv

_GENERIC_COLUMNS = ("name", "arrival", "duration", "gpus", "cpu", "memory")


def _generic(source: str, rows: list[dict[str, str]]) -> Trace:
    _require_columns(source, rows, _GENERIC_COLUMNS)
    pods: list[TracePod] = []
    skipped: dict[str, int] = {}
    for number, row in enumerate(rows, start=2):
        where = f"{source}:{number}"
        gpus = _float(row, "gpus", where)
        if gpus <= 0:
            skipped["no GPU requested (not a GPU pod)"] = skipped.get("no GPU requested (not a GPU pod)", 0) + 1
            continue
        if gpus < 1:
            devices, milli = 1, max(1, round(gpus * 1000))
        elif gpus.is_integer():
            devices, milli = int(gpus), 1000
        else:
            raise TraceError(f"{where}: gpus {gpus:g}: a fraction must be below 1 (one shared GPU)")
        duration = _optional_float(row, "duration", where)
        deleted_at = _optional_float(row, "deleted_at", where)
        if duration is None and deleted_at is None:
            raise TraceError(f"{where}: give a duration, or deleted_at for a pod that runs until deleted")
        gang = (row.get("gang") or "").strip() or None
        size = int(_optional_float(row, "gang_size", where) or 0)
        if gang and size < 1:
            raise TraceError(f"{where}: gang '{gang}' needs gang_size ≥ 1")
        names = tuple(n.strip().lower() for n in (row.get("gpu_name") or "").split("|") if n.strip())
        pods.append(TracePod(
            index=0, name=row["name"], arrival=_float(row, "arrival", where), duration=duration, deleted_at=deleted_at,
            cpu_milli=_quantity(row, "cpu", where, 1000), memory_mib=_quantity(row, "memory", where, 1 / 2**20),
            gpus=devices, gpu_milli=milli, gpu_names=names, gang=gang, gang_size=size,
        ))
    return Trace(source, "csv", _indexed(pods), len(rows), skipped)


# helpers


def _indexed(pods: Iterable[TracePod]) -> tuple[TracePod, ...]:
    ordered = sorted(pods, key=lambda p: (p.arrival, p.name))
    return tuple(
        TracePod(i, p.name, p.arrival, p.duration, p.deleted_at, p.cpu_milli, p.memory_mib, p.gpus, p.gpu_milli,
                 p.gpu_names, p.gang, p.gang_size)
        for i, p in enumerate(ordered)
    )


def _require_columns(source: str, rows: list[dict[str, str]], columns: Iterable[str]) -> None:
    if not rows:
        raise TraceError(f"{source}: no rows")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise TraceError(f"{source}: missing column(s) {', '.join(missing)}")


def _float(row: Mapping[str, str], column: str, where: str) -> float:
    value = _optional_float(row, column, where)
    if value is None:
        raise TraceError(f"{where}: {column} is empty")
    return value


def _optional_float(row: Mapping[str, str], column: str, where: str) -> float | None:
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {column} '{text}' is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: {column} '{text}' is not a non-negative number")
    return value


def _int(row: Mapping[str, str], column: str, where: str) -> int:
    value = _float(row, column, where)
    if not value.is_integer():
        raise TraceError(f"{where}: {column} '{row[column]}' is not a whole number")
    return int(value)


def _quantity(row: Mapping[str, str], column: str, where: str, scale: float) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = parse_quantity(text)
    except ValueError as error:
        raise TraceError(f"{where}: {column}: {error}") from None
    return math.ceil(float(value) * scale)
