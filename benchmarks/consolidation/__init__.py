"""Consolidation quality: a seeded fragmented cluster, one consolidation pass, against the optimum repacking
(the packing benchmark's MILP)."""
