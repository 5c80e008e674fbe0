"""Capability-loss profiling. To add a metric, register `fn(logits, batch, reference) -> sum`
with `@METRICS.register("name")` in `metrics.py`."""

from gapprune.profiling.loss_table import LossTable, build_loss_table, masked_units
from gapprune.profiling.metrics import METRICS

__all__ = ["METRICS", "LossTable", "build_loss_table", "masked_units"]
