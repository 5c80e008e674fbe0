"""The note before a prune whose calibration has fewer tokens than the widest projection OBS and lsq solve for."""

from __future__ import annotations

import json

from transformers import LlamaConfig, Qwen2Config

from gapprune.calibrate.coverage import coverage_note, widest_solved_input, windows_to_cover
from gapprune.cli import main


def test_the_widest_solved_input_is_the_mlp_or_the_attention_whichever_is_wider():
    qwen = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2)
    assert widest_solved_input(qwen) == 8960
    wide_heads = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=8, head_dim=16)
    assert widest_solved_input(wide_heads) == 128  # 8 heads of 16 outgrow the 96-wide MLP


def test_windows_double_until_their_tokens_reach_the_width():
    assert windows_to_cover(8960, 32, 128) == 128  # Qwen2.5-Coder-1.5B: 4,096 and 8,192 tokens fall short
    assert windows_to_cover(1536, 32, 128) == 32  # SmolLM2-135M: the default already covers it
    assert windows_to_cover(8960, 32, 256) == 64


def test_the_note_names_the_windows_that_cover_the_width_and_only_when_a_solve_needs_them():
    qwen = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2)
    note = coverage_note(qwen, 32, 128, solves=True)
    assert note is not None and "4,096 tokens" in note and "8,960 channels" in note
    assert "--calib-samples 128 (16,384 tokens)" in note
    assert coverage_note(qwen, 128, 128, solves=True) is None
    assert coverage_note(qwen, 32, 128, solves=False) is None  # no lsq, no OBS: nothing solved with the Gram
    smol = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3)
    assert coverage_note(smol, 32, 128, solves=True) is None


def test_prune_says_it_before_the_work_when_the_calibration_is_short(tiny_model_folder, tmp_path, capsys):
    folder, text = tiny_model_folder  # MLPs 128 wide
    small = ["--ratio", "0.3", "--calib", str(text), "--profile-samples", "2", "--seq-len", "32",
             "--channel-step", "32", "--no-plots"]
    assert main(["prune", str(folder), "--out", str(tmp_path / "short"), "--calib-samples", "2", *small]) == 0
    err = capsys.readouterr().err
    assert "calibration is 64 tokens (2 windows of 32)" in err and "--calib-samples 4 (128 tokens)" in err
    assert json.loads((tmp_path / "short" / "plan.json").read_text())["config"]["calib_samples"] == 2  # only said
    assert main(["prune", str(folder), "--out", str(tmp_path / "covered"), "--calib-samples", "4", *small]) == 0
    assert "--calib-samples" not in capsys.readouterr().err
