"""A path or id that cannot be loaded ends in one line saying why, for every command that loads a model."""

from __future__ import annotations

import pytest

from gapprune.cli import main


@pytest.mark.parametrize("command", [
    ["info"], ["ppl"], ["bench"], ["eval", "--ppl", ""], ["prune", "--ratio", "0.3", "--out", "OUT"],
    ["profile", "--out", "OUT"], ["tune", "--out", "OUT"],
])
def test_a_missing_folder_is_named(command, tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "folder"
    argv = [command[0], str(missing), *[str(tmp_path / "out") if a == "OUT" else a for a in command[1:]]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"model folder {missing} does not exist" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_hub_id_offline_says_the_hub_cannot_be_reached(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["info", "someone/no-such-model-xyz"]) == 2
    err = capsys.readouterr().err
    assert "cannot be loaded from the Hugging Face hub (HF_HUB_OFFLINE is set)" in err


def test_a_relative_path_that_does_not_exist_is_not_taken_for_a_hub_id(capsys):
    assert main(["info", "./runs/not-here"]) == 2
    assert "model folder ./runs/not-here does not exist" in capsys.readouterr().err


def test_an_unsupported_architecture_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel

    import gapprune.api

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)).save_pretrained(tmp_path / "gpt2")
    capsys.readouterr()  # the save's progress bar
    monkeypatch.setattr(gapprune.api, "load", lambda *a, **k: pytest.fail("the weights were loaded"))
    for command in (["prune", "--ratio", "0.2"], ["profile"]):
        assert main([command[0], str(tmp_path / "gpt2"), *command[1:], "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert "unsupported architecture 'GPT2LMHeadModel'" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_tokenizer_is_refused_before_calibration(tmp_path, capsys, monkeypatch):
    import gapprune.api
    from tests.conftest import tiny_llama

    tiny_llama().save_pretrained(tmp_path / "model")  # weights and config, no tokenizer files
    capsys.readouterr()
    monkeypatch.setattr(gapprune.api, "calibrate", lambda *a, **k: pytest.fail("calibration ran"))
    for command in (["prune", "--ratio", "0.2"], ["profile"]):
        assert main([command[0], str(tmp_path / "model"), *command[1:], "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]  # after the weights' loading bar
        assert last.startswith(f"gapprune {command[0]}: error:") and "has no tokenizer" in last and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_evaluating_or_tuning_a_folder_without_a_tokenizer_names_the_fix(tmp_path, capsys):
    from tests.conftest import tiny_llama

    tiny_llama().save_pretrained(tmp_path / "model")
    capsys.readouterr()
    for command, purpose in ((["ppl"], "perplexity reads text"), (["eval"], "evaluation reads text"),
                             (["tune", "--out", str(tmp_path / "tuned")], "tuning trains on text")):
        assert main([command[0], str(tmp_path / "model"), *command[1:]]) == 2
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"gapprune {command[0]}: error:") and "has no tokenizer" in last and purpose in last
        assert "Traceback" not in err
    assert not (tmp_path / "tuned").exists()


def test_ratio_is_required_unless_a_plan_gives_it(tmp_path, capsys):
    assert main(["prune", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "--ratio is required" in capsys.readouterr().err
