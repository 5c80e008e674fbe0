"""Frozen configuration dataclasses; the CLI builds its flags from their fields and help text."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, get_args, get_type_hints

# Settings that decide a profile's numbers; a saved profile is reused only when they match.
PROFILE_SETTINGS = ("criterion", "metric", "calib", "calib_split", "calib_samples", "profile_samples",
                    "seq_len", "seed", "channel_step", "table_compensation")
# How the table is measured: part of a checkpoint's key, not of a profile's identity (any table of the same
# model, data and settings can be reused; `auto` completes an estimated one where a plan needs it).
TABLE_SETTINGS = (*PROFILE_SETTINGS, "profiler", "mlp_stride")
# Settings added after profiles were first saved: left out of the fingerprint at these values, so
# those profiles stay valid.
LATER_SETTINGS = {"table_compensation": "none"}
# A Gram matrix XᵀX is held as its rows X when a half's tokens · this ≤ its width (calibrate/gram.py):
# the rows are then at most 1/16 of its size, and token-space OBS, O(t²·n) per greedy step over 64
# steps, costs no more than the n × n one's O(n³) (t = both halves' tokens ≤ n/8). Here because the
# memory policy estimates with it too.
TOKEN_ROWS_FACTOR = 16
# Compensation alone (sequential lsq/bias) reads a Gram once, in one Woodbury solve of t × t, so its
# rows pay as soon as t ≤ n: a Qwen2.5-1.5B MLP half is 2,048 × 8,960 rows (73 MB) instead of
# 8,960² (321 MB), and the t·n² accumulation and the |K|³ solve go.
LSQ_ROWS_FACTOR = 1


@dataclass(frozen=True)
class PruneConfig:
    """Everything that decides a pruning run; stored resolved in plan.json for reproduction."""

    ratio: float = field(metadata={"help": "fraction of the parameters to remove, in (0, 1): of ALL of them (embeddings included) unless --ratio-of decoder"})
    ratio_of: str = field(default="model", metadata={"help": "what --ratio is a fraction of: model (all parameters) or decoder (the decoder layers' parameters; for models whose embedding is most of the weights)"})
    allocator: str = field(default="gap", metadata={"help": "how many units each component loses: gap|uniform|global|depth|owl"})
    criterion: str = field(default="obs", metadata={"help": "which units go: obs (greedy structured OBS on the output projection, the default)|activation|fluctuation|magnitude|taylor"})
    metric: str = field(default="kl", metadata={"help": "capability metric of the loss table: kl|nll"})
    calib: str = field(default="wikitext2", metadata={"help": "calibration text: a data set name (wikitext2, ptb, c4, code, alpaca), a .txt/.jsonl file, 'self', or several joined by '+' (wikitext2+ptb: equal parts, interleaved); on the command line, when not given: code for a model whose name or type marks it as a code model (self, the model's own text, when the data folder has no code/), else wikitext2"})
    calib_split: str = field(default="auto", metadata={"help": "split of a named calibration set; auto: the set's own calibration split (validation for wikitext2 and ptb, train for c4 and code)"})
    calib_samples: int = field(default=32, metadata={"help": "calibration windows for statistics and importance"})
    profile_samples: int = field(default=8, metadata={"help": "windows (a prefix of the calibration set) used for the loss table"})
    seq_len: int = field(default=128, metadata={"help": "tokens per calibration window"})
    batch_size: int = field(default=8, metadata={"help": "windows per forward pass"})
    channel_step: int = field(default=0, metadata={"help": "MLP channels per option step; 0 = intermediate/32 rounded to 8"})
    profiler: str = field(default="auto", metadata={"help": "how the loss table is measured: auto (a screen on the first window(s), then exact replays only where they can change the plan), exact (replay every option) or fisher (second-order estimate only)"})
    auto_margin: float = field(default=0.2, metadata={"help": "auto profiler: relative uncertainty of a screened ΔL after rescaling; an option climbs to the next rung (more windows, a narrower margin) and at last is measured exactly while, lowered by it, it could beat the pick (larger: more replays, closer to the exact plan)"})
    screen_samples: int = field(default=1, metadata={"help": "auto profiler: profiling windows (a prefix) the screen is measured on"})
    screen_stride: int = field(default=0, metadata={"help": "auto profiler: the screen replays every N-th option of the exact grid (and the last), interpolating the rest; the exact rounds may still measure any (1 = screen all; 0 = 2 for a decoder of a billion parameters or more, else 1)"})
    screen_precision: str = field(default="auto", metadata={"help": "auto profiler: the screen's matrix precision: auto|float32|bfloat16 (auto: bfloat16 where the processor multiplies it fast, a GPU or a CPU with AMX, else float32; not AVX-512-BF16 alone, where it is slower, docs/performance.md §13 and §15). The exact rounds stay float32, so it changes which entries are measured, not a measured value"})
    mlp_stride: int = field(default=4, metadata={"help": "replay every N-th MLP option when profiling, interpolate the rest (1 = all)"})
    compensate: str = field(default="lsq", metadata={"help": "training-free recovery after removal: lsq|bias|none"})
    ridge: float = field(default=1.0, metadata={"help": "lsq ridge, relative to the mean input energy, pulling kept weights towards their original values"})
    sequential: bool = field(default=True, metadata={"help": "lsq/bias: fit layer by layer on the inputs the already-pruned layers produce (one more calibration pass; --no-sequential fits on the dense inputs)"})
    compensation_aware: bool = field(default=False, metadata={"help": "measure each option's ΔL with its component compensated as it will be saved (lsq or bias), so the allocation sees the shipped model"})
    refine: int = field(default=0, metadata={"help": "re-profile around the plan and re-solve this many times (gap only)"})
    check_samples: int = field(default=8, metadata={"help": "held-out calibration windows on which the plan's predicted summed ΔL is checked against the pruned model's measured one (0: no check)"})
    seed: int = field(default=0, metadata={"help": "seed for calibration sampling"})
    tp: int = field(default=1, metadata={"help": "tensor-parallel ranks the pruned model will be served on (vLLM --tensor-parallel-size): every layer keeps query heads, KV heads and MLP channels that split evenly over them"})
    data_dir: str | None = field(default=None, metadata={"help": "data folder (else $GAPPRUNE_DATA, else the hub)"})
    device: str = field(default="cpu", metadata={"help": "torch device, e.g. cpu or cuda"})
    dtype: str = field(default="auto", metadata={"help": "the weights' dtype from load to the saved folder: auto (the checkpoint's own on a GPU, float32 on a CPU)|float32|bfloat16|float16; losses, statistics and solves accumulate in float32"})

    @property
    def calib_sources(self) -> list[str]:
        """The calibration texts `calib` names: one, or several joined by '+'."""
        return self.calib.split("+")

    @property
    def table_compensation(self) -> str:
        """How the loss table's options are compensated: part of a profile's identity."""
        return f"{self.compensate}, ridge {self.ridge}" if self.compensation_aware else "none"

    def __post_init__(self) -> None:
        if not 0 < self.ratio < 1:
            raise ValueError(f"ratio must lie strictly between 0 and 1 (a fraction of parameters), got {self.ratio}")
        for name in ("calib_samples", "profile_samples", "seq_len", "batch_size", "tp"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.screen_samples <= self.profile_samples:
            raise ValueError(f"screen_samples must be between 1 and profile_samples ({self.profile_samples}), "
                             f"got {self.screen_samples}")
        if self.check_samples < 0:
            raise ValueError(f"check_samples must be >= 0 (0: no plan check), got {self.check_samples}")
        if self.screen_stride < 0:
            raise ValueError(f"screen_stride must be >= 0 (1 screens every option, 0 chooses by size), got {self.screen_stride}")
        if self.profile_samples > self.calib_samples:
            raise ValueError("profile_samples cannot exceed calib_samples (profiling uses a prefix of them)")
        if "self" in self.calib_sources and len(self.calib_sources) > 1 or "" in self.calib_sources:
            raise ValueError(f"calib {self.calib!r}: name data sets or files joined by '+' ('self' stands alone)")
        if len(self.calib_sources) > self.calib_samples:
            raise ValueError(f"calib names {len(self.calib_sources)} sources, more than calib_samples "
                             f"({self.calib_samples}): raise --calib-samples")
        if self.ratio_of not in ("model", "decoder"):
            raise ValueError(f"ratio_of must be model or decoder, got {self.ratio_of!r}")
        if self.compensate not in ("lsq", "bias", "none"):
            raise ValueError(f"compensate must be lsq, bias or none, got {self.compensate!r}")
        if self.compensation_aware and self.compensate == "none":
            raise ValueError("compensation_aware measures options as compensated: set compensate to lsq or bias")
        if self.profiler not in ("exact", "fisher", "auto"):
            raise ValueError(f"profiler must be auto, exact or fisher, got {self.profiler!r}")
        if self.screen_precision not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"screen_precision must be auto, float32 or bfloat16, got {self.screen_precision!r}")
        if self.auto_margin < 0:
            raise ValueError(f"auto_margin must be >= 0, got {self.auto_margin}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.ridge < 0:
            raise ValueError("ridge must be >= 0")
        if self.refine < 0:
            raise ValueError("refine must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def config_fields(cls: type) -> list[tuple[str, Any, bool, str, type]]:
    """(name, default, required, help, type) for every field of a config dataclass; Optional[X] gives X."""
    hints = get_type_hints(cls)
    out = []
    for f in fields(cls):
        required = f.default is MISSING and f.default_factory is MISSING
        default = f.default if f.default is not MISSING else None
        if f.default_factory is not MISSING:
            default = f.default_factory()
        kind = hints[f.name]
        args = [a for a in get_args(kind) if a is not type(None)]
        out.append((f.name, default, required, f.metadata.get("help", ""), args[0] if args else kind))
    return out
