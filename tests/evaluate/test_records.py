"""Records and tables of `gapprune eval` / `gapprune bench`, built in the library (no wall-clock asserts)."""

from __future__ import annotations

import pytest
import torch

from gapprune.api import load, pruned_copy
from gapprune.evaluate.perplexity import PerplexityResult
from gapprune.evaluate.records import (
    eval_records,
    eval_table,
    ppl_record,
    speed_line,
    speed_records,
    with_speedups,
)
from gapprune.evaluate.timing import median_seconds, timed_runs
from tests.helpers import tiny_run


def speed(model: str, batch: int, prefill_ms: float, tokens_per_s: float, params: int) -> dict[str, object]:
    return {"model": model, "batch": batch, "prefill_ms": prefill_ms, "decode_tokens_per_s": tokens_per_s,
            "params": params, "weights_mb": params * 4 / 2**20}


def test_ppl_record_names_the_window_length():
    result = PerplexityResult("wikitext2", "test", 128, 64, 1000, 64 * 127, 3.0, 20.0855, 1.0)
    assert ppl_record("m", result) == {"model": "m", "task": "wikitext2", "metric": "ppl@128", "value": 20.0855,
                                       "limit": 64}


def test_eval_table_has_one_row_per_record():
    records = [{"task": "piqa", "metric": "acc", "value": 0.61234, "limit": 500},
               {"task": "ptb", "metric": "ppl@128", "value": 170.8, "limit": 256}]
    lines = eval_table(records).splitlines()
    assert lines[:2] == ["| task | metric | value | limit |", "|---|---|---|---|"]
    assert lines[2:] == ["| piqa | acc | 0.6123 | 500 |", "| ptb | ppl@128 | 170.8000 | 256 |"]


def test_speedups_compare_the_same_batch_of_the_dense_model():
    records = [speed("pruned", 1, 50.0, 30.0, 75), speed("pruned", 16, 400.0, 200.0, 75),
               speed("dense", 1, 100.0, 20.0, 100), speed("dense", 16, 600.0, 160.0, 100)]
    out = with_speedups(records, "dense")
    assert [(r["speedup"], r["prefill_speedup"], r["ideal_speedup"]) for r in out] == [
        (1.5, 2.0, 1.333), (1.25, 1.5, 1.333), (1.0, 1.0, 1.0), (1.0, 1.0, 1.0)]
    assert "speedup" not in records[0]  # the input records stay as they were
    assert "speedup 1.50x (ideal 1.33x)" in speed_line(out[0])
    assert "speedup" not in speed_line(records[0])
    with pytest.raises(ValueError, match="dense model 'other' at batch 1"):
        with_speedups(records, "other")


def test_eval_and_speed_records_of_a_saved_model(tiny_model_folder):
    folder, text = tiny_model_folder
    model, tokenizer = load(str(folder))
    records = eval_records(model, tokenizer, "tiny", datasets=[str(text)], seq_len=32, max_windows=3)
    assert records == [{"model": "tiny", "task": str(text), "metric": "ppl@32", "value": records[0]["value"],
                        "limit": 3}]
    assert records[0]["value"] > 1
    loaded: list[str] = []

    def load_model(spec: str):
        loaded.append(spec)
        return load(spec)[0]

    out = speed_records([str(folder), str(folder)], load_model, batches=[1, 2], prompt_tokens=8, new_tokens=2,
                        repeats=1, dense=str(folder))
    assert loaded == [str(folder)] * 2
    assert [r["batch"] for r in out] == [1, 2, 1, 2]
    assert all(r["ideal_speedup"] == 1.0 and r["params"] == sum(p.numel() for p in model.parameters()) for r in out)


def test_timed_runs_warm_up_then_repeat():
    calls: list[int] = []
    times = timed_runs(lambda: calls.append(1), warmup=2, repeats=3)
    assert len(calls) == 5 and len(times) == 3 and all(t >= 0 for t in times)
    assert median_seconds(lambda: None, warmup=0, repeats=1) >= 0
    with pytest.raises(ValueError, match="repeats"):
        timed_runs(lambda: None, repeats=0)


def test_pruned_copy_leaves_the_dense_model_alone(llama, token_ids, tmp_path):
    run = tiny_run(llama, token_ids, checkpoint_dir=tmp_path, allocator="uniform")
    plan = run.plan(0.3, "uniform")
    dense = {name: p.clone() for name, p in llama.state_dict().items()}
    pruned, summary = pruned_copy(llama, plan)
    assert all(torch.equal(p, dense[name]) for name, p in llama.state_dict().items())
    assert sum(p.numel() for p in pruned.parameters()) == plan.summary["params_after"]
    assert summary["wall_s"] >= 0


def test_eval_and_bench_commands_write_the_library_records(tiny_model_folder, tmp_path, capsys):
    import json

    from gapprune.cli import main

    folder, text = tiny_model_folder
    out = tmp_path / "eval.json"
    assert main(["eval", str(folder), "--ppl", str(text), "--seq-len", "32", "--max-windows", "2", "--out", str(out)]) == 0
    records = json.loads(out.read_text())
    assert [(r["model"], r["metric"], r["limit"]) for r in records] == [(str(folder), "ppl@32", 2)]
    assert out.with_suffix(".md").read_text() == eval_table(records) + "\n"
    bench = tmp_path / "bench.json"
    assert main(["bench", str(folder), "--vs", str(folder), "--batches", "1", "--prompt-tokens", "8", "--new-tokens", "2",
                 "--repeats", "1", "--out", str(bench)]) == 0
    rows = json.loads(bench.read_text())
    assert len(rows) == 2 and all(r["ideal_speedup"] == 1.0 for r in rows)
    assert capsys.readouterr().out.count("speedup") == 2


def test_eval_resume_keeps_the_answers_in_the_given_folder(tiny_model_folder, data_dir, tmp_path):
    import json

    from gapprune.cli import main

    folder, _ = tiny_model_folder
    answers, out = tmp_path / "answers", tmp_path / "zs.json"
    argv = ["eval", str(folder), "--ppl", "", "--tasks", "piqa", "--limit", "2", "--data-dir", str(data_dir),
            "--resume", str(answers), "--out", str(out)]
    assert main(argv) == 0
    first = json.loads(out.read_text())
    assert [p.name.startswith("requests-") and p.suffix == ".db" for p in answers.iterdir()] == [True]
    assert main(argv) == 0 and json.loads(out.read_text()) == first


def test_ppl_resume_keeps_the_scored_windows_in_the_given_folder(tiny_model_folder, tmp_path):
    import json

    from gapprune.cli import main

    folder, _ = tiny_model_folder
    text, kept, out = tmp_path / "text.txt", tmp_path / "windows", tmp_path / "ppl.json"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    argv = ["ppl", str(folder), "--dataset", str(text), "--seq-len", "32", "--max-windows", "3", "--resume", str(kept),
            "--json", str(out)]
    assert main(argv) == 0
    first = json.loads(out.read_text())
    assert [p.name.startswith("ppl-") and p.suffix == ".json" for p in kept.iterdir()] == [True]
    assert main(argv) == 0
    again = json.loads(out.read_text())
    assert (first["windows_resumed"], again["windows_resumed"]) == (0, 3) and again["ppl"] == first["ppl"]


def test_the_report_counts_the_biases_compensation_added():
    from gapprune.evaluate.report import added_bias_lines

    summary = {"params_after": 100_885_824, "params_after_with_added_biases": 100_903_104}
    assert added_bias_lines(summary) == [
        ("- the saved model holds 100,903,104 parameters: the 17,280 output-projection biases compensation added "
        "are not counted in the removed share above")]
    summary["achieved_ratio_with_added_biases"] = 0.249875
    assert added_bias_lines(summary)[0].endswith("(with them counted, 24.99% of the model is removed)")
    assert added_bias_lines({"params_after": 10, "params_after_with_added_biases": 10}) == []
    assert added_bias_lines({"params_after": 10}) == []
