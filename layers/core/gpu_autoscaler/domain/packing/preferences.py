"""Preferred node affinity, planned as Karpenter plans it: as required first, relaxed one term at a time.

Karpenter adds a pod's heaviest preferred node affinity term to its requirements (kubernetes-sigs/karpenter
pkg/scheduling/requirements.go `NewPodRequirements`: "Select heaviest preference and treat as a requirement") and,
when the pod cannot be scheduled, drops that term and tries the next heaviest (pkg/controllers/provisioning/
scheduling/preferences.go `removePreferredNodeAffinityTerm`, called from scheduler.go `trySchedule`) until one
fits or none is left. So a pod that prefers On-Demand, or a zone, or a GPU, gets it whenever a node can give it.
Only the term's `matchExpressions` count, as there; a term with none adds nothing and is skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_autoscaler.models.requirements import NodeSelectorTerm, normalized_terms

if TYPE_CHECKING:
    from gpu_autoscaler.models.requirements import PreferredSchedulingTerm

__all__ = ["preference_order", "with_preference"]


def preference_order(terms: tuple[PreferredSchedulingTerm, ...]) -> list[NodeSelectorTerm]:
    """The terms to try in turn, heaviest first, equal weights in the order written (Karpenter's
    `sort.SliceStable`), deprecated label keys read as their stable ones (`normalized_terms`)."""
    ordered = sorted((t for t in terms if t.preference.match_expressions), key=lambda t: -t.weight)
    return list(normalized_terms(tuple(NodeSelectorTerm(match_expressions=t.preference.match_expressions)
                                       for t in ordered)))


def with_preference(required: tuple[NodeSelectorTerm, ...], preferred: NodeSelectorTerm
                    ) -> tuple[NodeSelectorTerm, ...]:
    """The required terms (ORed) each ANDed with the preferred term's expressions; the preferred term alone when
    none is required."""
    if not required:
        return (preferred,)
    return tuple(t.model_copy(update={"match_expressions": t.match_expressions + preferred.match_expressions})
                 for t in required)
