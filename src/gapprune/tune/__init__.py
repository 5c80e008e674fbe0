"""Recovery tuning: LoRA on instruction data with peft, merged back into the pruned weights."""

from gapprune.tune.lora import TuneConfig, TuneResult, lora_tune

__all__ = ["TuneConfig", "TuneResult", "lora_tune"]
