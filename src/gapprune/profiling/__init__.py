"""Capability-loss profiling: the loss table ΔL, measured by the profilers registered in
`profilers.py`, each a client of the replay engine (`gapprune.engine`)."""

from gapprune.profiling.loss_table import LossTable, build_loss_table

__all__ = ["LossTable", "build_loss_table"]
