"""What `gapprune tune` can be told: the LoRA and the distillation settings, apart from the training code, so the
command line builds its flags from them without importing torch, transformers or peft."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TuneConfig:
    data: str = field(default="alpaca", metadata={"help": "alpaca (data folder, then hub) or an Alpaca-format .json/.jsonl"})
    data_dir: str | None = field(default=None, metadata={"help": "data folder (else $GAPPRUNE_DATA)"})
    rank: int = field(default=8, metadata={"help": "LoRA rank"})
    alpha: int = field(default=16, metadata={"help": "LoRA alpha"})
    dropout: float = field(default=0.05, metadata={"help": "LoRA dropout"})
    lr: float = field(default=1e-4, metadata={"help": "AdamW learning rate"})
    cutoff: int = field(default=256, metadata={"help": "tokens per example"})
    epochs: float = field(default=2.0, metadata={"help": "passes over the training examples"})
    max_steps: int = field(default=0, metadata={"help": "stop after this many optimiser steps (0: epochs decide)"})
    max_seconds: float = field(default=0.0, metadata={"help": "stop once training has taken this long in all, resumed parts included (0: no limit)"})
    max_examples: int = field(default=0, metadata={"help": "use only the first N examples (0: all)"})
    batch_size: int = field(default=4, metadata={"help": "examples per step"})
    val_examples: int = field(default=64, metadata={"help": "held-out examples for validation loss"})
    eval_every: int = field(default=50, metadata={"help": "steps between validation losses"})
    save_every: int = field(default=50, metadata={"help": "steps between resumable checkpoints"})
    train_on_inputs: bool = field(default=True, metadata={"help": "also train on the prompt tokens (LLM-Pruner default)"})
    dtype: str = field(default="float32", metadata={"help": "training dtype, float32 or bfloat16, whatever the folder was saved in; the tuned folder is saved in it"})
    seed: int = field(default=0, metadata={"help": "seed for shuffling and LoRA init"})

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError("dtype must be float32 or bfloat16")
        if self.rank <= 0 or self.cutoff < 8 or self.batch_size <= 0:
            raise ValueError("rank, cutoff (>= 8) and batch_size must be positive")


@dataclass(frozen=True)
class DistillConfig:
    teacher: str | None = field(default=None, metadata={"help": "teacher model (default: the model the folder was pruned from, recorded in its config)"})
    data: str = field(default="c4", metadata={"help": "training text joined by +: c4 (web text, its train split; the default: best measured, docs/recovery.md), code (Python source, its train split), alpaca, self (teacher-written, cached), or a .txt/.json/.jsonl file; evaluation sets are refused"})
    data_dir: str | None = field(default=None, metadata={"help": "data folder (else $GAPPRUNE_DATA)"})
    self_windows: int = field(default=1024, metadata={"help": "windows of teacher-written text (self)"})
    self_len: int = field(default=512, metadata={"help": "tokens per teacher-written sequence (cut into windows)"})
    cache_dir: str | None = field(default=None, metadata={"help": "teacher-text cache (default $GAPPRUNE_CACHE/teacher_text)"})
    seq_len: int = field(default=128, metadata={"help": "tokens per training window (128: what every distillation in docs/results/recovery.json trained on)"})
    params: str = field(default="decoder", metadata={"help": "what trains: decoder (the default, best measured: every decoder-layer parameter; embeddings, final norm and head stay the teacher's), all, or lora (adapters, merged at the end)"})
    rank: int = field(default=8, metadata={"help": "LoRA rank"})
    alpha: int = field(default=16, metadata={"help": "LoRA alpha"})
    lr: float = field(default=0.0, metadata={"help": "AdamW learning rate",  # 0 stands for the default of `params`
                                              "shown_default": "1e-4, or 5e-4 with --params lora"})
    warmup: int = field(default=10, metadata={"help": "linear warm-up steps, then the schedule"})
    schedule: str = field(default="constant", metadata={"help": "rate after warm-up: constant; cosine (decays to 0 at the end of max_seconds, else of max_steps or the epochs); or wsd (constant, then linear to 0 over the last decay_fraction of that budget)"})
    decay_fraction: float = field(default=0.2, metadata={"help": "wsd: the final share of the budget over which the rate falls linearly to 0"})
    temperature: float = field(default=1.0, metadata={"help": "softmax temperature of both models (loss scaled by T²)"})
    top_k: int = field(default=0, metadata={"help": "KL over the teacher's top-k plus a tail bucket (0: full vocabulary)"})
    teacher_cache: str | None = field(default=None, metadata={"help": "keep the teacher's top-k outputs on disk and reuse them when a window comes back (epochs, other students on the same text): a folder, or auto for $GAPPRUNE_CACHE/teacher_topk; needs top_k"})
    lm_weight: float = field(default=0.0, metadata={"help": "weight of the LM loss added to the KL"})
    batch_size: int = field(default=8, metadata={"help": "windows per optimiser step"})
    micro_batch: int = field(default=4, metadata={"help": "windows per forward/backward (bounds memory)"})
    epochs: float = field(default=1.0, metadata={"help": "passes over the training windows"})
    max_steps: int = field(default=0, metadata={"help": "stop after this many steps (0: epochs decide)"})
    max_seconds: float = field(default=0.0, metadata={"help": "stop once training has taken this long in all, resumed parts included (0: no limit)"})
    val_windows: int = field(default=16, metadata={"help": "windows for the validation KL: held out of the training text, or drawn from val_data"})
    val_data: str | None = field(default=None, metadata={"help": "text for the validation KL instead of a held-out slice of the training text (a file, or alpaca/self): watch the text you want to keep, not the one you tune on"})
    eval_every: int = field(default=50, metadata={"help": "steps between validation KLs"})
    save_every: int = field(default=50, metadata={"help": "steps between resumable checkpoints"})
    dtype: str = field(default="float32", metadata={"help": "training dtype, float32 or bfloat16, whatever the folder was saved in; the tuned folder is saved in it"})
    seed: int = field(default=0, metadata={"help": "seed for the data order, teacher text and LoRA init"})

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.schedule not in ("constant", "cosine", "wsd"):
            raise ValueError(f"schedule must be constant, cosine or wsd, got {self.schedule!r}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if self.params not in ("lora", "all", "decoder"):
            raise ValueError(f"params must be lora, all or decoder, got {self.params!r}")
        if self.temperature <= 0 or self.top_k < 0 or self.lm_weight < 0:
            raise ValueError("temperature must be positive, top_k and lm_weight non-negative")
        if self.teacher_cache and not self.top_k:
            raise ValueError("teacher_cache stores the teacher's top-k outputs; set top_k too (e.g. 64)")
        if self.val_data is not None and self.val_data == self.data:
            raise ValueError("val_data is the training text; leave it unset to hold val_windows out of that text")
        if self.seq_len < 8 or self.batch_size <= 0 or self.micro_batch <= 0:
            raise ValueError("seq_len (>= 8), batch_size and micro_batch must be positive")

    @property
    def learning_rate(self) -> float:
        return self.lr or (5e-4 if self.params == "lora" else 1e-4)
