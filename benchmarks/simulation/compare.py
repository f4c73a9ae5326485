"""Compare two simulation report.json files field by field, ignoring run times: the check that a speed change
left every result unchanged to the bit.

    python -m benchmarks.simulation.compare REFERENCE.json CANDIDATE.json

Exit 0 when every field but `runSeconds` is equal — floats compared exactly — for every policy both ran (by
name), else 1, printing the first differing paths.
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["differences", "main"]

IGNORED = frozenset({"runSeconds"})
"""Wall-clock fields: the only ones a speed change may move."""


def differences(reference: Any, candidate: Any, path: str = "") -> list[str]:
    """Paths (`policies[0].cost`) where the two JSON values differ, `IGNORED` keys left out."""
    if isinstance(reference, dict) and isinstance(candidate, dict):
        out = []
        for key in sorted(set(reference) | set(candidate)):
            if key in IGNORED:
                continue
            if key not in reference or key not in candidate:
                out.append(f"{path}.{key}: only in {'candidate' if key in candidate else 'reference'}")
                continue
            out.extend(differences(reference[key], candidate[key], f"{path}.{key}"))
        return out
    if isinstance(reference, list) and isinstance(candidate, list):
        if len(reference) != len(candidate):
            return [f"{path}: {len(reference)} items against {len(candidate)}"]
        return [d for i, (a, b) in enumerate(zip(reference, candidate, strict=True))
                for d in differences(a, b, f"{path}[{i}]")]
    if type(reference) is not type(candidate) or reference != candidate:
        return [f"{path}: {reference!r} against {candidate!r}"]
    return []


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__)
        return 2
    with open(args[0]) as a, open(args[1]) as b:
        reference, candidate = json.load(a), json.load(b)
    # Policies by name: a run of some policies (`--policy ours`) is compared with the same ones of a full run.
    ours = {p["name"]: p for p in candidate.get("policies", [])}
    theirs = {p["name"]: p for p in reference.get("policies", [])}
    names = [n for n in theirs if n in ours]
    if not names:
        print("no policy in common")
        return 1
    found = differences({**reference, "policies": [theirs[n] for n in names]},
                        {**candidate, "policies": [ours[n] for n in names]})
    if found:
        print(f"DIFFERENT ({len(found)} fields) for {names}:")
        for line in found[:20]:
            print(f"  {line}")
        return 1
    print(f"identical (every field but {', '.join(sorted(IGNORED))}) for {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
