"""HumanEval scoring without a model: the canonical solutions pass, wrong code fails, and the programs
run apart from the caller (a time limit, their own temporary folder)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GenerationMixin

from gapprune.evaluate.humaneval import (
    Problem,
    check,
    generate_completions,
    load_problems,
    score,
    truncate_at_stop,
)


@pytest.fixture(scope="module")
def problems(data_dir: Path) -> list[Problem]:
    return load_problems(data_dir)


def test_humaneval_canonical_solutions_all_pass(problems: list[Problem]):
    assert len(problems) == 164 and problems[0].task_id == "HumanEval/0" and problems[-1].task_id == "HumanEval/163"
    result = score({p.task_id: p.canonical_solution for p in problems}, problems, progress=False)
    failed = [(r.task_id, r.reason, r.detail) for r in result.results if not r.passed]
    assert result.passed == 164 and not failed, failed
    assert result.pass_at_1 == 1.0
    assert [r.task_id for r in result.results] == [p.task_id for p in problems]  # problem order


def test_humaneval_wrong_solution_fails(problems: list[Problem]):
    first, second = problems[:2]
    result = score({first.task_id: "    return None\n", second.task_id: second.canonical_solution}, problems[:2],
                   progress=False)
    assert [r.passed for r in result.results] == [False, True] and result.pass_at_1 == 0.5
    wrong = result.results[0]
    assert wrong.reason == "error" and "AssertionError" in wrong.detail and wrong.completion == "    return None\n"
    assert result.to_record(2) == {"task": "humaneval", "metric": "pass@1", "value": 0.5, "passed": 1, "n": 2,
                                   "limit": 2}
    broken = check(first, "    return (\n", timeout_s=30)
    assert not broken.passed and broken.reason == "error" and "SyntaxError" in broken.detail


def test_an_endless_loop_is_stopped_by_the_time_limit_and_fails(problems: list[Problem]):
    result = check(problems[0], "    while True:\n        pass\n", timeout_s=1.0)
    assert not result.passed and result.reason == "timeout"


def test_a_program_writes_files_in_its_own_temporary_folder(problems: list[Problem], tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    body = problems[0].canonical_solution
    writes = ("    import os\n    open('written.txt', 'w').write(os.getcwd())\n"
              "    print(os.getcwd(), file=__import__('sys').stderr)\n")
    result = check(problems[0], writes + body, timeout_s=30)
    assert result.passed
    assert list(tmp_path.iterdir()) == []  # nothing in the caller's folder
    folder = Path(result.detail)  # the program's cwd, reported on stderr
    assert folder != tmp_path and folder.name.startswith("gapprune-humaneval-") and not folder.exists()  # removed


def test_a_program_is_refused_a_runaway_allocation(problems: list[Problem]):
    result = check(problems[0], "    x = bytearray(8 << 30)\n" + problems[0].canonical_solution, timeout_s=30)
    assert not result.passed and "MemoryError" in result.detail


def test_a_missing_completion_and_a_missing_data_file_are_named(problems: list[Problem], tmp_path: Path):
    with pytest.raises(KeyError, match="HumanEval/1"):
        score({problems[0].task_id: ""}, problems[:2], progress=False)
    with pytest.raises(FileNotFoundError, match=r"humaneval/HumanEval\.jsonl\.gz .*--data-dir"):
        load_problems(tmp_path)


def test_completions_stop_at_the_next_top_level_statement():
    body = "    return x + 1\n"
    for tail in ("\ndef other():\n", "\nclass A:\n", "\nif __name__ == '__main__':\n", "\nprint(f(1))\n", "\n# test\n"):
        assert truncate_at_stop(body + tail) == body
    assert truncate_at_stop(body + "    # an indented comment stays\n") == body + "    # an indented comment stays\n"


class _Echo(GenerationMixin):
    """Stands in for a model: `generate` appends fixed text after each (left-padded) prompt. No network runs."""

    device = torch.device("cpu")

    def __init__(self, tokenizer, answer: str) -> None:
        self.tokenizer, self.answer, self.calls = tokenizer, answer, []

    def generate(self, input_ids, attention_mask, **kwargs):
        self.calls.append((input_ids, attention_mask, kwargs))
        new = torch.tensor(self.tokenizer(self.answer, add_special_tokens=False)["input_ids"])
        return torch.cat([input_ids, new.expand(input_ids.shape[0], -1)], dim=1)


def test_generation_pads_on_the_left_cuts_at_stops_and_keeps_problem_order(problems: list[Problem]):
    from tests.evaluate.test_eval_bench import byte_tokenizer

    tokenizer = byte_tokenizer()
    model = _Echo(tokenizer, "    return []\n\ndef helper():\n    pass\n")
    chosen = [problems[3], problems[0], problems[2]]
    completions = generate_completions(model, tokenizer, chosen, batch_size=2, progress=False)  # type: ignore[arg-type]
    assert list(completions) == [p.task_id for p in chosen]
    assert set(completions.values()) == {"    return []\n"}
    (ids, mask, kwargs), _ = model.calls
    assert ids.shape[0] == 2 and mask[:, -1].all() and not mask.all()  # padded, on the left only
    assert kwargs["do_sample"] is False and kwargs["max_new_tokens"] == 384 and "\ndef " in kwargs["stop_strings"]
    tokens = {p.task_id: tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in chosen}
    shortest = sorted(chosen, key=lambda p: len(tokens[p.task_id]))[:2]  # batched by length
    assert [ids[i][mask[i].bool()].tolist() for i in range(2)] == [tokens[p.task_id] for p in shortest]


def sentencepiece_style_tokenizer(problems: list[Problem]):  # type: ignore[no-untyped-def]
    """BPE behind a Metaspace pre-tokenizer and decoder, as Llama 2 / Mistral tokenizers are, trained offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator([p.prompt + p.canonical_solution for p in problems],
                            trainer=trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<eos>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def test_a_completion_keeps_its_indentation_under_a_sentencepiece_tokenizer(problems: list[Problem]):
    tokenizer = sentencepiece_style_tokenizer(problems)
    answer = "    return []\n"
    new = tokenizer(problems[0].prompt + answer, add_special_tokens=False)["input_ids"][
        len(tokenizer(problems[0].prompt, add_special_tokens=False)["input_ids"]):]
    assert tokenizer.decode(new) == answer[1:]  # decoded alone, the first space is lost
    model = _Echo(tokenizer, answer)
    completions = generate_completions(model, tokenizer, problems[:2], batch_size=2, progress=False)  # type: ignore[arg-type]
    assert set(completions.values()) == {answer}


def test_eval_routes_humaneval_to_this_scorer_and_writes_its_results(problems, tiny_model_folder, data_dir, tmp_path,
                                                                     monkeypatch, capsys):
    import json

    from gapprune.cli import main
    from gapprune.evaluate import humaneval

    asked = {}

    def fake(model, tokenizer, **kwargs):  # no generation: the first two problems, one solved
        asked.update(kwargs)
        chosen = problems[: kwargs["limit"]]
        return score({chosen[0].task_id: "    return None\n", chosen[1].task_id: chosen[1].canonical_solution},
                     chosen, progress=False)

    monkeypatch.setattr(humaneval, "evaluate_humaneval", fake)
    folder, _ = tiny_model_folder
    out = tmp_path / "eval.json"
    argv = ["eval", str(folder), "--ppl", "", "--tasks", "humaneval", "--limit", "2", "--data-dir", str(data_dir),
            "--out", str(out), "--generation", "transformers"]
    assert main(argv) == 0
    assert asked["limit"] == 2 and asked["data_directory"] == str(data_dir)
    assert "humaneval pass@1 0.5000 (1/2)" in capsys.readouterr().out
    (record,) = json.loads(out.read_text())
    assert record == {"model": str(folder), "task": "humaneval", "metric": "pass@1", "value": 0.5, "passed": 1, "n": 2,
                      "limit": 2, "generation": "transformers"}
    rows = [json.loads(line) for line in out.with_suffix(".humaneval.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["passed"], r["reason"]) for r in rows] == [("HumanEval/0", False, "error"),
                                                                       ("HumanEval/1", True, None)]
    assert "| humaneval | pass@1 | 0.5000 | 2 |" in out.with_suffix(".md").read_text()


def test_eval_names_unknown_tasks_and_missing_humaneval_data_before_the_model_loads(tmp_path, capsys):
    from gapprune.cli import main

    missing = str(tmp_path / "no-model-here")
    assert main(["eval", missing, "--ppl", "", "--tasks", "humaneval,foobar"]) == 2
    assert "unknown task 'foobar'; choose from boolq" in capsys.readouterr().err
    assert main(["eval", missing, "--ppl", "", "--tasks", "humaneval", "--data-dir", str(tmp_path)]) == 2
    assert "humaneval/HumanEval.jsonl.gz" in capsys.readouterr().err
