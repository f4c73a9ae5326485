"""Packing quality (against an exact MILP and a Karpenter-like baseline) and packing speed."""
