"""Small builders shared by tests: a calibrated, profiled tiny model without any data files."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from gapprune.config import PruneConfig
from gapprune.pipeline import Calibration, Profile, calibrate_on, plan_for
from gapprune.pruning import Plan


@dataclass
class TinyRun:
    """A tiny model's calibration (live) and profile (numbers)."""

    calibration: Calibration
    profile: Profile
    config: PruneConfig

    @property
    def adapter(self):
        return self.calibration.adapter

    @property
    def table(self):
        return self.profile.table

    def plan(self, ratio: float, allocator: str, ratio_of: str = "model", profile: Profile | None = None) -> Plan:
        """The orchestrator's plan from this run's (or the given) profile: numbers only, no re-profiling."""
        return plan_for(self.config, profile=profile or self.profile, adapter=self.adapter, ratio=ratio,
                        allocator=allocator, ratio_of=ratio_of)[0]


def tiny_config(ids: torch.Tensor, **overrides: object) -> PruneConfig:
    settings = {"ratio": 0.3, "calib_samples": ids.shape[0], "profile_samples": ids.shape[0], "seq_len": ids.shape[1],
                "batch_size": 2, "channel_step": 32, "mlp_stride": 1, "compensate": "none", "profiler": "exact",
                **overrides}
    return PruneConfig(**settings)  # type: ignore[arg-type]


def tiny_run(model: torch.nn.Module, ids: torch.Tensor, checkpoint_dir: Path | None = None, **overrides: object) -> TinyRun:
    config = tiny_config(ids, **overrides)
    calibration = calibrate_on(model, ids, config)
    checkpoint_dir = checkpoint_dir or Path(tempfile.mkdtemp(prefix="gapprune-test-tables-"))
    # plan_for measures the profile and, with the auto profiler, completes it for the config's ratio
    return TinyRun(calibration, plan_for(config, calibration, checkpoint_dir=checkpoint_dir)[1], config)
