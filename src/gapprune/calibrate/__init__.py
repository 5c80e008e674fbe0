"""Calibration statistics: per-channel moments and Gram matrices streamed from the dense pass
(`engine.capture`) or from per-layer replays."""

from gapprune.calibrate.stats import CalibrationStats, ChannelStats, stats_observers

__all__ = ["CalibrationStats", "ChannelStats", "stats_observers"]
