"""Node requirements: Karpenter's operators over node labels, for pools and for pods."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from gpu_autoscaler.models.labels import NORMALIZED

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["NODE_NAME_FIELD", "NodeSelectorTerm", "Operator", "PreferredSchedulingTerm", "Requirement", "holds",
           "normalized_terms", "terms_match", "unplannable_terms"]

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
NODE_NAME_FIELD = "metadata.name"
"""The field a node selector term's `matchFields` may name (the API server refuses any other)."""


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
        return holds(self.operator, labels.get(self.key), self.values)


def holds(operator: str, value: str | None, values: Sequence[str]) -> bool:
    """An operator on a label's value (None: the label is absent), with Kubernetes semantics: NotIn and DoesNotExist
    hold when the label is absent. Node requirements and label selectors alike (these take no Gt or Lt)."""
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if value is None or not _is_int(value):
        return False
    bound = int(values[0])
    return int(value) > bound if operator == "Gt" else int(value) < bound


class NodeSelectorTerm(BaseModel):
    """A required node affinity term: its expressions hold on the node's labels and its fields on the node's
    own fields (`metadata.name`, the one field a term may name), all of them. "A null or empty node selector
    term matches no objects" (Kubernetes API reference, NodeSelectorTerm)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    match_expressions: tuple[Requirement, ...] = Field(default=(), alias="matchExpressions")
    match_fields: tuple[Requirement, ...] = Field(default=(), alias="matchFields")

    def matches(self, labels: Mapping[str, str], name: str | None = None) -> bool:
        """`name`: the node's; None for a node not launched yet, whose name no field can be known to match."""
        if not self.match_expressions and not self.match_fields:
            return False
        if self.match_fields and (name is None or not all(r.matches({NODE_NAME_FIELD: name})
                                                          for r in self.match_fields)):
            return False
        return all(r.matches(labels) for r in self.match_expressions)

    @property
    def plannable(self) -> bool:
        """Whether a node not launched yet may satisfy it: it selects on labels alone, and on some."""
        return bool(self.match_expressions) and not self.match_fields


class PreferredSchedulingTerm(BaseModel):
    """A `preferredDuringSchedulingIgnoredDuringExecution` entry: a term the pod would rather run on, of weight 1 to
    100 (the API server refuses others, validation.go `validatePreferredSchedulingTerms`)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    weight: int = Field(ge=1, le=100)
    preference: NodeSelectorTerm


def terms_match(terms: tuple[NodeSelectorTerm, ...] | list[NodeSelectorTerm], labels: Mapping[str, str],
                name: str | None = None) -> bool:
    """Terms are ORed, as in `requiredDuringSchedulingIgnoredDuringExecution`; none means any node. `name`: the
    node's, None for a node not launched yet."""
    return not terms or any(t.matches(labels, name) for t in terms)


def normalized_terms(terms: tuple[NodeSelectorTerm, ...]) -> tuple[NodeSelectorTerm, ...]:
    """The terms with deprecated label keys read as their stable ones (`labels.NORMALIZED`: every node carries both
    with one value, so an expression means the same on either; Karpenter translates pods' requirements alike). The
    same tuple when no expression names one."""
    if not any(r.key in NORMALIZED for t in terms for r in t.match_expressions):
        return terms
    return tuple(t.model_copy(update={"match_expressions": tuple(
        r.model_copy(update={"key": NORMALIZED[r.key]}) if r.key in NORMALIZED else r for r in t.match_expressions)})
        for t in terms)


def unplannable_terms(terms: tuple[NodeSelectorTerm, ...]) -> str | None:
    """Why no node launched for the pod can satisfy its required node affinity (None when a term may be):
    every term is empty, or selects nodes by field. Karpenter refuses a pod with any such term ("node selector
    term with matchFields is not supported", provisioner.go `validateNodeSelectorTerm`); here the pod's other
    terms are still planned on."""
    if not terms or any(t.plannable for t in terms):
        return None
    if any(t.match_fields for t in terms):
        return ("its required node affinity selects nodes by field (matchFields on metadata.name): a node not "
                "launched yet has no name to match, so no node is planned for it")
    return "its required node affinity has only empty node selector terms, which match no node"


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
