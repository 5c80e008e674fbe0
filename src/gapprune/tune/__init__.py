"""Recovery after pruning: LoRA on instruction data (`lora.py`), or distillation from the unpruned
model (`distillation.py`: KL to the teacher's next-token distribution on text with no evaluation data);
their settings in `configs.py`.

To add a training-text source, extend `teacher_text.training_windows`; a loss, `kd_loss.py`.
The names below are imported on first use, so reading the settings (the command line's flags) needs
no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gapprune.lazy import lazy_names

if TYPE_CHECKING:
    from gapprune.tune.configs import DistillConfig, TuneConfig
    from gapprune.tune.distillation import DistillResult, distill
    from gapprune.tune.lora import TuneResult, lora_tune

_HOMES = {"DistillConfig": "gapprune.tune.configs", "TuneConfig": "gapprune.tune.configs",
          "DistillResult": "gapprune.tune.distillation", "distill": "gapprune.tune.distillation",
          "TuneResult": "gapprune.tune.lora", "lora_tune": "gapprune.tune.lora"}

__all__ = ["DistillConfig", "DistillResult", "TuneConfig", "TuneResult", "distill", "lora_tune"]
__getattr__ = lazy_names(__name__, _HOMES)
