"""A named protocol evaluates what the papers evaluate, whole, and says so in every record."""

from __future__ import annotations

import importlib
import json

import pytest

from gapprune.cli import main
from gapprune.evaluate.perplexity import PerplexityResult


@pytest.fixture
def calls(monkeypatch):  # type: ignore[no-untyped-def]
    """evaluate_ppl replaced by a recorder: the protocol's wiring, without minutes of forward passes."""
    perplexity = importlib.import_module("gapprune.evaluate.perplexity")  # the package exports a function of that name

    seen: list[dict] = []

    def fake(model, tokenizer, dataset, split=None, seq_len=2048, max_windows=None, batch_size=None, data_dir=None,
             resume=None):
        seen.append({"dataset": dataset, "seq_len": seq_len, "max_windows": max_windows})
        return PerplexityResult(dataset=dataset, split="test", seq_len=seq_len, windows=1, tokens=seq_len,
                                predicted_tokens=seq_len, nll=1.0, ppl=2.718, wall_s=0.0)

    monkeypatch.setattr(perplexity, "evaluate_ppl", fake)
    return seen


@pytest.mark.parametrize(("protocol", "expected"), [
    ("llm-pruner", [("wikitext2", 128), ("ptb", 128)]),
    ("slicegpt", [("wikitext2", 2048)]),
])
def test_ppl_under_a_protocol_reads_whole_test_sets_at_its_length_and_records_its_name(
        tiny_model_folder, tmp_path, calls, protocol, expected):
    folder, _ = tiny_model_folder
    out = tmp_path / "ppl.json"
    assert main(["ppl", str(folder), "--protocol", protocol, "--json", str(out)]) == 0
    assert [(c["dataset"], c["seq_len"]) for c in calls] == expected
    assert all(c["max_windows"] is None for c in calls)
    written = json.loads(out.read_text())
    assert all(r["protocol"] == protocol for r in (written if isinstance(written, list) else [written]))


@pytest.mark.parametrize("argv", [
    ["ppl", "--protocol", "llm-pruner", "--max-windows", "64"],
    ["ppl", "--protocol", "slicegpt", "--seq-len", "128"],
    ["eval", "--protocol", "llm-pruner", "--limit", "500"],
    ["eval", "--protocol", "llm-pruner", "--tasks", "piqa"],
])
def test_a_protocol_refuses_flags_that_would_change_it_before_loading(tiny_model_folder, capsys, monkeypatch, argv):
    import gapprune.api

    monkeypatch.setattr(gapprune.api, "load", lambda *a, **k: pytest.fail("loaded before the flags were checked"))
    folder, _ = tiny_model_folder
    assert main([argv[0], str(folder), *argv[1:]]) == 2
    assert "fixes the data sets" in capsys.readouterr().err


def test_an_unknown_protocol_names_the_known_ones(tiny_model_folder, capsys):
    folder, _ = tiny_model_folder
    assert main(["ppl", str(folder), "--protocol", "mine"]) == 2
    assert "llm-pruner" in capsys.readouterr().err
