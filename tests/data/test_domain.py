"""A code model calibrates on code unless told otherwise; every other model on the general default."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from gapprune.cli import main
from gapprune.data.domain import code_model_evidence, default_calibration

PYTHON_SOURCE = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()
''' * 20


@pytest.mark.parametrize(("spec", "name_or_path", "model_type", "evidence"), [
    ("qwen2.5-coder-1.5b", "", "qwen2", "'coder'"),
    ("/models/x", "bigcode/starcoder2-3b", "starcoder2", "'starcoder2'"),
    ("deepseek-ai/deepseek-coder-1.3b-base", "", "llama", "'coder'"),
    ("runs/my_code_model", "", "llama", "'code'"),
    ("/home/me/code/llama-3", "/home/me/code/starcoder2-7b", "llama", "'starcoder2'"),
    ("local", "", "gpt_bigcode", "gpt_bigcode"),
])
def test_code_models_are_recognised_by_name_or_type(spec, name_or_path, model_type, evidence):
    config = SimpleNamespace(_name_or_path=name_or_path, model_type=model_type)
    assert evidence in code_model_evidence(spec, config)


@pytest.mark.parametrize("spec", ["smollm2-135m", "Qwen/Qwen2.5-1.5B-Instruct", "meta-llama/Llama-3.2-1B",
                                  "google/gemma-3-270m", "unicode-llama", "decoder-only", "/home/me/code/llama-3"])
def test_other_models_are_not(spec):
    assert code_model_evidence(spec, SimpleNamespace(_name_or_path="", model_type="llama")) is None
    assert default_calibration(spec, SimpleNamespace(), code_available=True).calib == "wikitext2"


@pytest.mark.parametrize(("spec", "name_or_path", "evidence"), [
    ("smollm2-135m", "/cache/SmolLM2-135M-Instruct.Q4_1-c937e79a193b", "'instruct'"),
    ("google/gemma-3-1b-it", "", "'it'"), ("my_chat_model", "", "'chat'"),
])
def test_an_instruction_model_keeps_prose_and_is_told_the_instruction_flag(spec, name_or_path, evidence):
    choice = default_calibration(spec, SimpleNamespace(_name_or_path=name_or_path), code_available=True)
    assert choice.calib == "wikitext2" and f"instruction model (its name says {evidence})" in choice.message
    assert "--calib alpaca" in choice.message
    assert default_calibration("meta-llama/Llama-3.2-1B", SimpleNamespace(), code_available=True).message is None
    assert "code model" in default_calibration("qwen2.5-coder-1.5b-instruct", SimpleNamespace(), True).message


def test_a_code_model_without_code_text_calibrates_on_its_own_text_and_says_how_to_choose_otherwise():
    choice = default_calibration("qwen2.5-coder-1.5b", SimpleNamespace(), code_available=False)
    assert choice.calib == "self" and "no Python source" in choice.message
    assert "code/" in choice.message and "--calib wikitext2" in choice.message


TINY_PRUNE = ["--ratio", "0.3", "--calib-samples", "4", "--profile-samples", "4", "--seq-len", "32",
              "--channel-step", "32", "--no-plots"]


def test_pruning_a_tiny_code_model_calibrates_on_code_and_says_so(tiny_model_folder, tmp_path, capsys):
    folder, _ = tiny_model_folder
    coder = tmp_path / "tiny-coder-instruct"
    shutil.copytree(folder, coder)
    data = tmp_path / "data"
    (data / "code").mkdir(parents=True)
    (data / "code" / "python_stdlib_train.txt").write_text(PYTHON_SOURCE)
    small = [*TINY_PRUNE, "--data-dir", str(data)]
    assert main(["prune", str(coder), "--out", str(tmp_path / "out"), *small]) == 0
    err = capsys.readouterr().err
    assert "looks like a code model (its name says 'coder')" in err and "--calib wikitext2" in err
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["config"]["calib"] == "code"
    # a named text wins, and nothing is said
    assert main(["prune", str(coder), "--out", str(tmp_path / "out2"), *small,
                 "--calib", str(data / "code" / "python_stdlib_train.txt")]) == 0
    assert "looks like a code model" not in capsys.readouterr().err


def test_pruning_a_tiny_code_model_with_no_code_text_calibrates_on_its_own_text(tiny_model_folder, tmp_path, capsys):
    folder, _ = tiny_model_folder
    coder = tmp_path / "tiny-coder"
    shutil.copytree(folder, coder)
    (tmp_path / "data").mkdir()  # a data folder without code/
    small = [*TINY_PRUNE, "--data-dir", str(tmp_path / "data")]
    assert main(["prune", str(coder), "--out", str(tmp_path / "out"), *small]) == 0
    assert "has no Python source, so it calibrates on text it writes itself" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["config"]["calib"] == "self"
