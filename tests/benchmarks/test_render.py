"""docs/results.md's tables: each row names the model and plan its records measured."""

from __future__ import annotations

from tests.benchmarks.scripts import benchmark_script

render = benchmark_script("render")


def protocol_record(model: str, allocator: str, dataset: str, ppl: float, ratio: float = 0.0,
                    ratio_of: str | None = None) -> dict:
    return {"kind": "protocol", "model": model, "allocator": allocator, "target_ratio": ratio, "ratio_of": ratio_of,
            "protocol": "llm-pruner", "dataset": dataset, "seq_len": 128, "ppl": ppl, "date": "2026-12-05"}


def test_protocol_rows_name_their_own_model_with_its_dense_row_first():
    records = [protocol_record("small", "gap", "wikitext2", 100.0, 0.25, "model"),
               protocol_record("small", "dense", "wikitext2", 50.0),
               protocol_record("big", "gap", "wikitext2", 40.0, 0.25, "decoder"),
               protocol_record("big", "dense", "ptb", 70.0),
               protocol_record("big", "dense", "wikitext2", 30.0)]
    rows = [line for line in render.protocols_section(records) if line.startswith(("| small", "| big"))]
    assert rows == ["| small | dense | 50.00 | — | — |", "| small | gap 25% of the model | 100.00 | — | — |",
                    "| big | dense | 30.00 | 70.00 | — |", "| big | gap 25% of the decoder | 40.00 | — | — |"]
