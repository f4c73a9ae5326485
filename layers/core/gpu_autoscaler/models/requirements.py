"""Node requirements: Karpenter's operators over node labels, for pools and for pods."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["NodeSelectorTerm", "Operator", "Requirement", "terms_match"]

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]


class Requirement(BaseModel):
    """One `{key, operator, values}` expression, as in a NodePool or a pod's node affinity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(min_length=1)
    # `values` is declared before `operator` so the operator's validator can see it and the
    # error names the operator, which is what the user got wrong.
    values: tuple[str, ...] = ()
    operator: Operator

    @field_validator("operator")
    @classmethod
    def _values_fit_operator(cls, operator: str, info: ValidationInfo) -> str:
        values = info.data.get("values", ())
        if operator in ("Gt", "Lt"):
            if len(values) != 1 or not _is_int(values[0]):
                raise ValueError(f"'{operator}' needs exactly one integer value")
        elif operator in ("In", "NotIn"):
            if not values:
                raise ValueError(f"'{operator}' needs at least one value")
        elif values:
            raise ValueError(f"'{operator}' takes no values")
        return operator

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes semantics: NotIn and DoesNotExist hold when the label is absent."""
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if value is None or not _is_int(value):
            return False
        bound = int(self.values[0])
        return int(value) > bound if op == "Gt" else int(value) < bound


class NodeSelectorTerm(BaseModel):
    """A pod's required node affinity term: all expressions must hold."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    match_expressions: tuple[Requirement, ...] = Field(default=(), alias="matchExpressions")

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.match_expressions)


def terms_match(terms: tuple[NodeSelectorTerm, ...] | list[NodeSelectorTerm], labels: Mapping[str, str]) -> bool:
    """Terms are ORed, as in `requiredDuringSchedulingIgnoredDuringExecution`; none means any node."""
    return not terms or any(t.matches(labels) for t in terms)


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
