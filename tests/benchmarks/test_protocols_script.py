"""benchmarks/protocols.py: a protocol's data sets are recorded one by one, so a stopped run keeps the finished ones."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.benchmarks.scripts import benchmark_script

protocols = benchmark_script("protocols")


def printing(*lines: str, exit_code: int = 0) -> list[str]:
    """A stand-in for `gapprune ppl`: prints these lines, then exits with this code."""
    body = "".join(f"print({line!r}, flush=True)\n" for line in lines)
    return [sys.executable, "-c", body + f"raise SystemExit({exit_code})"]


def test_each_printed_record_is_yielded_and_other_lines_pass_through(capsys: pytest.CaptureFixture[str]) -> None:
    first, second = {"dataset": "wikitext2", "ppl": 39.05}, {"dataset": "ptb", "ppl": 60.0}
    scored = list(protocols.scored_sets(printing(json.dumps(first), "a warning", json.dumps(second))))
    assert [record for record, _ in scored] == [first, second]
    assert scored[0][1] <= scored[1][1]
    assert "a warning" in capsys.readouterr().out


def test_a_run_that_fails_after_one_set_has_yielded_that_set_then_raises() -> None:
    first = {"dataset": "wikitext2", "ppl": 39.05}
    scored = protocols.scored_sets(printing(json.dumps(first), exit_code=3))
    assert next(scored)[0] == first
    with pytest.raises(subprocess.CalledProcessError):
        next(scored)


def test_the_shards_of_a_task_split_its_items_without_loss_or_overlap(tmp_path) -> None:
    from gapprune.evaluate.zeroshot import TASKS

    source = tmp_path / "data" / "commonsense" / "lm-eval" / TASKS["hellaswag"].file
    source.parent.mkdir(parents=True)
    rows = [json.dumps({"query": f"q{i}", "choices": ["a", "b"], "label": i % 2}) for i in range(7)]
    source.write_text("\n".join(rows) + "\n")
    shards = [protocols.shard_data(str(tmp_path / "data"), "hellaswag", k, 3, tmp_path / f"s{k}") for k in range(3)]
    held = [(folder / "commonsense" / "lm-eval" / source.name).read_text().splitlines() for folder, _ in shards]
    assert [n for _, n in shards] == [3, 2, 2] == [len(h) for h in held]
    assert sorted(row for h in held for row in h) == sorted(rows)


def shard_record(shard: int, scores: list[int], **extra: object) -> dict:
    return {"kind": "protocol_zeroshot", "folder": "runs/m", "task": "hellaswag", "metric": "acc_norm",
            "value": sum(scores) / len(scores), "stderr": 0.0, "limit": None, "date": "2026-12-07",
            "machine": "cpu", "command": f"shard {shard}", "task_command": f"gapprune eval ({shard})",
            "process_wall_s": 10.0 + shard, "shard": [shard, 2], "items": len(scores), **extra}


def test_merged_shards_read_what_the_whole_set_would(tmp_path) -> None:
    import statistics

    first, second = [1, 0, 0, 1, 1], [0, 0, 1, 0]
    merged = protocols.merge_shards([shard_record(0, first), shard_record(1, second)], "runs/m")
    every = first + second
    assert len(merged) == 1 and merged[0]["items"] == 9 and merged[0]["limit"] is None
    assert merged[0]["value"] == pytest.approx(statistics.mean(every))
    assert merged[0]["stderr"] == pytest.approx(statistics.stdev(every) / len(every) ** 0.5)
    assert [s["command"] for s in merged[0]["shards"]] == ["shard 0", "shard 1"]
    assert "shard" not in merged[0] and merged[0]["process_wall_s"] == 11.0


def test_an_incomplete_or_already_merged_shard_set_adds_nothing() -> None:
    assert protocols.merge_shards([shard_record(1, [1, 0])], "runs/m") == []
    whole = {k: v for k, v in shard_record(0, [1]).items() if k not in ("shard", "items")}
    assert protocols.merge_shards([shard_record(0, [1]), shard_record(1, [0]), whole], "runs/m") == []
