"""The auto profiler's screen runs in bf16 only where that is fast; its exact rounds never do."""

from __future__ import annotations

import pytest
import torch

from gapprune.config import PruneConfig
from gapprune.engine import replay


def test_auto_precision_is_bf16_only_where_the_processor_multiplies_it_fast(monkeypatch):
    cpu = torch.device("cpu")
    assert replay.resolve_precision("float32", cpu) == "float32"
    assert replay.resolve_precision("bfloat16", cpu) == "bfloat16"
    for flags, expected in [({"avx2", "avx512f"}, "float32"), ({"avx512f", "avx512_bf16"}, "float32"),
                            ({"amx_bf16"}, "bfloat16"), (set(), "float32")]:
        monkeypatch.setattr(replay, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert replay.resolve_precision("auto", cpu) == expected


def test_an_unknown_screen_precision_is_refused_by_name():
    with pytest.raises(ValueError, match="screen_precision must be auto, float32 or bfloat16"):
        PruneConfig(ratio=0.25, screen_precision="fp8")


def test_the_default_screen_is_bf16_on_a_cpu_with_amx_and_float32_without(monkeypatch):
    from types import SimpleNamespace

    from gapprune.profiling.auto_measure import screen_precision_of

    adapter = SimpleNamespace(model=torch.nn.Linear(2, 2))  # only its parameters' device is read
    config = PruneConfig(ratio=0.25)
    for flags, expected in [({"avx512f", "avx512_bf16"}, "float32"), ({"amx_bf16", "avx512_bf16"}, "bfloat16")]:
        monkeypatch.setattr(replay, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert screen_precision_of(adapter, config) == expected  # type: ignore[arg-type]
    assert screen_precision_of(adapter, PruneConfig(ratio=0.25, screen_precision="float32")) == "float32"  # type: ignore[arg-type]
