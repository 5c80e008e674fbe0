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
