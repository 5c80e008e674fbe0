"""The benchmarks' shared settings: model, calibration, ratios, evaluation windows (no torch needed here).

Change a number here and every benchmark and `render_results.py` follow; the records in
docs/results/ were measured with these values.
"""

from __future__ import annotations

from typing import Any, NamedTuple

MODEL = "smollm2-135m"
PROFILE = "runs/bench_profile"  # the dense profile every plan-comparing benchmark reuses (written by the first)
# Calibration: 32 windows x 128 tokens of WikiText-2 validation for statistics, the first 4 (512 tokens) for ΔL.
CALIBRATION: dict[str, Any] = {"criterion": "activation", "metric": "kl", "calib": "wikitext2", "calib_split": "validation",
                               "calib_samples": 32, "profile_samples": 4, "seq_len": 128, "batch_size": 4, "mlp_stride": 4}
ALLOCATORS = ["gap", "uniform", "global", "depth", "owl"]
RATIOS = [0.125, 0.25, 0.375, 0.5]
DATASETS = ["wikitext2", "ptb"]
SEQ_LEN = 128
WINDOWS = 256  # first windows of each test split: the numbers quoted in the README


class Window(NamedTuple):
    """Which perplexity: the first `windows` windows of `seq_len` tokens (None: all) of a split."""

    dataset: str
    seq_len: int = SEQ_LEN
    windows: int | None = WINDOWS
    split: str = "test"


# The allocator comparison: WikiText-2 and PTB at 128 tokens, WikiText-2 at 2048.
ALLOCATOR_WINDOWS = [Window("wikitext2"), Window("ptb"), Window("wikitext2", 2048, 16)]
