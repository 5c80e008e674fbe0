"""Calibration: one dense pass that caches layer inputs and streams channel statistics."""

from gapprune.calibrate.capture import LayerInputs, capture_layer_inputs, run_layer
from gapprune.calibrate.stats import CalibrationStats, ChannelStats, stats_hooks

__all__ = ["CalibrationStats", "ChannelStats", "LayerInputs", "capture_layer_inputs", "run_layer", "stats_hooks"]
