"""`Profile`: everything measured on the dense model, as numbers (scores, signals, the loss table).

It saves to a folder and serves several ratios and allocators; a profile measured for another
model, data or settings is refused (`check_matches`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gapprune.allocate import LayerSignals, LossTable
from gapprune.budget import RatioBudget
from gapprune.config import LATER_SETTINGS, PROFILE_SETTINGS, PruneConfig
from gapprune.importance import UnitScores
from gapprune.phases import timed
from gapprune.profiling.auto import Solve
from gapprune.profiling.calibration import Calibration, profile_settings
from gapprune.profiling.exact import needs_loss_table
from gapprune.profiling.profilers import measure_table
from gapprune.profiling.signals import layer_signals

PROFILE_FILES = ("profile.json", "scores.json", "signals.json", "loss_table.json")


@dataclass
class Profile:
    """Everything measured on the dense model, as numbers: reusable for several ratios and allocators."""

    scores: UnitScores
    signals: LayerSignals
    table: LossTable
    total_params: int
    fingerprint: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    decoder_params: int = 0  # the decoder layers' parameters (0: a profile saved before they were counted)

    def budget(self, ratio: float, ratio_of: str = "model") -> int:
        """Parameters a plan at `ratio` (of the whole model, or of the decoder layers) removes."""
        return RatioBudget(ratio, ratio_of).params(self.total_params, self.decoder_params)

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"total_params": self.total_params, "decoder_params": self.decoder_params,
                "fingerprint": self.fingerprint, "settings": self.settings, "timings": self.timings}
        (folder / "profile.json").write_text(json.dumps(meta, indent=1) + "\n")
        self.scores.save(folder / "scores.json")
        self.signals.save(folder / "signals.json")
        self.table.save(folder / "loss_table.json")

    @classmethod
    def load(cls, folder: str | Path) -> Profile:
        folder = Path(folder)
        missing = [name for name in PROFILE_FILES if not (folder / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} is not a profile folder (missing {', '.join(missing)}); "
                                    "pass the output folder of an earlier prune or profile run")
        try:
            meta = json.loads((folder / "profile.json").read_text())
            return cls(UnitScores.load(folder / "scores.json"), LayerSignals.load(folder / "signals.json"),
                       LossTable.load(folder / "loss_table.json"), int(meta["total_params"]), meta.get("fingerprint", ""),
                       meta.get("settings", {}), meta.get("timings", {}), int(meta.get("decoder_params", 0)))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{folder}/profile.json is not readable ({err}); profile again") from None

    def check_matches(self, calibration: Calibration, config: PruneConfig) -> None:
        """A profile measured on another model, data or settings must not silently steer this one."""
        expected = calibration.fingerprint(config)
        profiled_in = self.settings.get("weights_dtype")  # recorded since 2026-12-05
        if self.fingerprint != expected and profiled_in is not None and profiled_in != calibration.weights_dtype:
            raise ValueError(f"the profile was measured on {profiled_in} weights and this run's are "
                             f"{calibration.weights_dtype}; load the model with dtype {profiled_in} (--dtype) "
                             "or profile it again")
        if self.fingerprint != expected and profiled_in is None and calibration.weights_dtype != "float32":
            raise ValueError(f"the profile was saved before gapprune recorded the weights' dtype, and this run's "
                             f"weights are {calibration.weights_dtype}: load the model with dtype float32 (--dtype) "
                             "if it was profiled in float32, or profile it again")
        if self.fingerprint != expected:
            self.check_settings(config)
            raise ValueError("the profile was measured for another run (the model weights or data differ); profile "
                             "this model again or use the same settings as the profile")
        if calibration.unit_scores is self.scores:  # reused, not measured: check the weights through fresh signals
            fresh = layer_signals(calibration.adapter, calibration.inputs, calibration.stats, self.scores)
            for name in ("block_influence", "outlier_ratio"):
                mine, now = getattr(self.signals, name), getattr(fresh, name)
                if mine is not None and not np.allclose(mine, now, rtol=1e-3, atol=1e-6):
                    raise ValueError(f"the profile's {name} differs from this model's: it was measured on other "
                                     "weights; profile this model again")
        self.check_settings(config)

    def check_settings(self, config: PruneConfig) -> None:
        """What can be refused from the settings alone, before any model loads (`check_matches` does the rest)."""
        now = profile_settings(config)
        changed = [name for name in PROFILE_SETTINGS if self.settings.get(name, LATER_SETTINGS.get(name)) != now[name]]
        if changed:
            raise ValueError(f"the profile was measured for another run (settings differ: {', '.join(changed)}); "
                             "profile this model again or use the same settings as the profile")
        if config.profiler == "exact" and needs_loss_table(config) and self.table.meta.get("profiler") != "exact":
            raise ValueError(f"the profile holds a {self.table.meta.get('profiler')} table, not an exact one; prune "
                             "with profiler auto (it measures what the plan needs) or profile again with profiler exact")


def profile_model(calibration: Calibration, config: PruneConfig, checkpoint_dir: Path | None = None,
                  solve: Solve | None = None) -> Profile:
    """Signals and the loss table of the calibrated dense model.

    `solve` (table -> chosen options): with the `auto` profiler, complete the table for that solve's
    budget (`pipeline.plan_for` passes it); None stops at the estimate, for later budgets to complete.
    """
    timings = dict(calibration.timings)
    with timed(timings, "signals"):
        signals = layer_signals(calibration.adapter, calibration.inputs, calibration.stats, calibration.unit_scores)
    with timed(timings, "profiling"):
        table = measure_table(calibration, config, checkpoint_dir, solve)
    total = sum(p.numel() for p in calibration.adapter.model.parameters())
    settings = {**profile_settings(config), "weights_dtype": calibration.weights_dtype}
    return Profile(calibration.unit_scores, signals, table, total, calibration.fingerprint(config), settings, timings,
                   calibration.adapter.decoder_params())
