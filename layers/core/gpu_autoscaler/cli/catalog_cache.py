"""The offline catalog kept on disk between command runs.

Building it means starting moto and reading its bundled EC2 data for the region (about three seconds),
for an answer that only changes when its inputs do. So the commands that use it (`plan`, `simulate`)
keep the built catalog in the user's cache directory (`$GPU_AUTOSCALER_CACHE_DIR`, else
`$XDG_CACHE_HOME/gpu-autoscaler`, else `~/.cache/gpu-autoscaler`) under a key made of everything it is
built from: the region, zones, capacity reservations and prefix delegation of the configuration, the
UTC day (spot prices are dated), and the installed moto, the bundled price and GPU tables, and the code
that reads them (by size and modification time). A cache that cannot be read or written is rebuilt or
skipped, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from datetime import UTC, datetime
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.domain.catalog import Catalog
from gpu_autoscaler.models.catalog import InstanceType, Offering

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpu_autoscaler.config import Config

__all__ = ["cache_dir", "cached_catalog"]

_FORMAT = 1
_PACKAGE = Path(__file__).resolve().parent.parent
_INPUTS = ("data", "adapters/aws/catalog.py", "adapters/aws/instance_types.py", "adapters/aws/pricing.py",
           "models/catalog.py")


def cache_dir() -> Path:
    explicit = os.environ.get("GPU_AUTOSCALER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "gpu-autoscaler"


def _stamp(path: Path) -> list[Any]:
    """Size and modification time of a file, or of every file in a directory."""
    try:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    except OSError:
        return []


def _key(config: Config) -> str:
    moto = find_spec("moto")
    origin = Path(moto.origin) if moto is not None and moto.origin else None
    facts = {
        "format": _FORMAT,
        "region": config.region,
        "zones": sorted(config.zones),
        "reservations": [r.model_dump(mode="json") for p in config.node_pools for r in p.capacity_reservations],
        "prefixDelegation": bool(config.prefix_delegation),
        "day": datetime.now(UTC).date().isoformat(),
        "moto": _stamp(origin) if origin else None,
        "inputs": [_stamp(_PACKAGE / name) for name in _INPUTS],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def cached_catalog(config: Config, build: Callable[[], Catalog]) -> Catalog:
    """The catalog `build` makes for `config`, from the cache when an identical one was built before."""
    path = cache_dir() / f"catalog-{config.region}-{_key(config)}.json"
    try:
        data = json.loads(path.read_text())
        return Catalog([InstanceType.model_validate(t) for t in data["instanceTypes"]],
                       [Offering.model_validate(o) for o in data["offerings"]])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    catalog = build()
    data = {"instanceTypes": [t.model_dump(mode="json") for t in catalog.instance_types()],
            "offerings": [o.model_dump(mode="json") for o in catalog.all_offerings()]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as out:
            json.dump(data, out)
        os.replace(out.name, path)
    except OSError:
        pass
    return catalog
