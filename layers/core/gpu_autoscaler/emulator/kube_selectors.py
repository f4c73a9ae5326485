"""Label and field selectors, parsed as the API server parses them and matched with the domain's `Requirement`.

A label selector string (`app=web,tier in (a,b),!canary`) and a `LabelSelector` object (`matchLabels` +
`matchExpressions`, as PodDisruptionBudgets and DaemonSets carry) both become a tuple of `Requirement`s,
so they share Kubernetes' matching rules with node affinity. Field selectors compare dotted paths of the
object with `=`, `==` or `!=`; an absent field is the empty string (so `spec.nodeName=` finds unbound pods).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpu_autoscaler.emulator.kube_objects import ApiError
from gpu_autoscaler.models.requirements import Requirement

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.kube_objects import ResourceType

__all__ = [
    "FieldRequirement",
    "Selector",
    "field_value",
    "labels_match",
    "parse_field_selector",
    "parse_label_selector",
    "selector_from_object",
]

_SET = re.compile(r"^\s*(?P<key>[^\s!=<>(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)\s*$")
_EQ = re.compile(r"^\s*(?P<key>[^\s!=<>(),]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<value>[^\s,]*)\s*$")
_EXISTS = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=<>(),]+)\s*$")
_OPS = {"=": "In", "==": "In", "!=": "NotIn", ">": "Gt", "<": "Lt", "in": "In", "notin": "NotIn"}


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses (`a in (x,y),b` is two requirements)."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in (part.strip() for part in parts) if p]


def _requirement(key: str, operator: str, values: tuple[str, ...]) -> Requirement:
    try:
        return Requirement.model_validate({"key": key, "operator": operator, "values": values})
    except ValidationError as error:
        raise ApiError.bad_request(f"unable to parse requirement {key!r}: {error.errors()[0]['msg']}") from None


def parse_label_selector(text: str | None) -> tuple[Requirement, ...]:
    """`labelSelector=` as kubectl and client-go write it; an empty selector selects everything."""
    out: list[Requirement] = []
    for part in _split_top_level(text or ""):
        if m := _SET.match(part):
            values = tuple(v.strip() for v in m.group("values").split(",") if v.strip())
            out.append(_requirement(m.group("key"), _OPS[m.group("op")], values))
        elif m := _EQ.match(part):
            out.append(_requirement(m.group("key"), _OPS[m.group("op")], (m.group("value"),)))
        elif m := _EXISTS.match(part):
            out.append(_requirement(m.group("key"), "DoesNotExist" if m.group("neg") else "Exists", ()))
        else:
            raise ApiError.bad_request(f"unable to parse requirement: {part!r}")
    return tuple(out)


def selector_from_object(selector: Mapping[str, Any] | None) -> tuple[Requirement, ...] | None:
    """A `LabelSelector` object; None (a null selector) selects nothing, `{}` selects everything."""
    if selector is None:
        return None
    out = [_requirement(k, "In", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    for expression in selector.get("matchExpressions") or ():
        out.append(_requirement(expression.get("key", ""), expression.get("operator", ""),
                                tuple(expression.get("values") or ())))
    return tuple(out)


def labels_match(requirements: tuple[Requirement, ...] | None, labels: Mapping[str, str]) -> bool:
    return requirements is not None and all(r.matches(labels) for r in requirements)


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    value: str
    negated: bool

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (field_value(obj, self.path) == self.value) != self.negated


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """A dotted path's value as a field selector sees it: absent is "", booleans are "true"/"false"."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            current = None
            break
        current = current.get(part)
    if current is None:
        return "false" if path == "spec.unschedulable" or path == "spec.hostNetwork" else ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def parse_field_selector(text: str | None, resource: ResourceType) -> tuple[FieldRequirement, ...]:
    """Unknown fields are refused with 400, as the API server does (`field label not supported`)."""
    out: list[FieldRequirement] = []
    for part in _split_escaped(text or ""):
        for op in ("!=", "==", "="):
            if op in part:
                path, value = part.split(op, 1)
                path = path.strip()
                if not resource.selectable(path):
                    raise ApiError.bad_request(f'field label not supported: {path}')
                out.append(FieldRequirement(path, value.strip().replace("\\,", ","), op == "!="))
                break
        else:
            raise ApiError.bad_request(f"invalid selector: '{part}'; can't understand '{part}'")
    return tuple(out)


def _split_escaped(text: str) -> list[str]:
    return [p for p in (part.strip() for part in re.split(r"(?<!\\),", text)) if p]


@dataclass(frozen=True)
class Selector:
    """A list or watch request's label and field selectors together."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        metadata = obj.get("metadata") or {}
        return all(r.matches(metadata.get("labels") or {}) for r in self.labels) and all(
            f.matches(obj) for f in self.fields
        )
