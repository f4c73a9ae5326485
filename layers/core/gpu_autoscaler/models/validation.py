"""Validation errors as people read them: one line per problem, the path in the document's own shape.

Shared by the command line (configuration and pod documents) and the packer, which dead-letters a document it
cannot read with these lines as the reason.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = ["describe_validation"]

_QUOTED = re.compile(r"'([^']*)'")


def describe_validation(error: ValidationError) -> list[str]:
    """Each problem on one line, `pods[3].requests.cpu: 'lots' is not a Kubernetes quantity`.

    The same shape as the configuration's errors; where a mapping's validator names an offending value, the
    key holding it joins the path.
    """
    lines = []
    for item in error.errors():
        path = ""
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        message = item["msg"].removeprefix("Value error, ")
        given = item.get("input")
        quoted = _QUOTED.search(message)
        if isinstance(given, dict) and quoted:
            key = next((k for k, v in given.items() if str(v) == quoted.group(1)), None)
            if key is not None:
                path += f".{key}" if re.fullmatch(r"[A-Za-z_][\w-]*", key) else f'["{key}"]'
        lines.append(f"{path}: {message}" if path else message)
    return lines
