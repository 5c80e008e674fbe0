"""Recovery after pruning: LoRA on instruction data (`lora.py`), or distillation from the unpruned
model (`distill.py`: KL to the teacher's next-token distribution on text with no evaluation data).

To add a training-text source, extend `teacher_text.training_windows`; a loss, `kd_loss.py`.
"""

from gapprune.tune.distill import DistillConfig, DistillResult, distill
from gapprune.tune.lora import TuneConfig, TuneResult, lora_tune

__all__ = ["DistillConfig", "DistillResult", "TuneConfig", "TuneResult", "distill", "lora_tune"]
