"""Outputs that must not be lost or destroyed: a replaced folder, result files of long evaluations, a
checkpoint folder that tuning deletes at the end, a GGUF path inside the folder written over it."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

import gapprune.api
from gapprune.cli import main
from gapprune.export.save import write_atomically
from gapprune.output import write_file_atomically
from gapprune.tune import checkpoint as ckpt
from tests.test_cli_errors import prune_args


def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gapprune.api, "load", lambda *a, **k: pytest.fail("loaded before the input was checked"))


def one_line_error(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and all(w in err for w in words), err


def test_a_replaced_folder_is_swapped_whole_and_the_old_one_deleted(tmp_path):
    out = tmp_path / "out"
    write_atomically(out, lambda tmp: (tmp / "a.txt").write_text("old"))
    write_atomically(out, lambda tmp: (tmp / "b.txt").write_text("new"), overwrite=True)
    assert [p.name for p in out.iterdir()] == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary or set-aside folder left


def test_a_failed_fill_keeps_the_old_folder(tmp_path):
    out = tmp_path / "out"
    write_atomically(out, lambda tmp: (tmp / "a.txt").write_text("old"))

    def fail(tmp: Path) -> None:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomically(out, fail, overwrite=True)
    assert (out / "a.txt").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_when_the_old_folder_cannot_be_deleted_the_new_one_is_in_place(tmp_path, monkeypatch, caplog):
    out = tmp_path / "out"
    write_atomically(out, lambda tmp: (tmp / "a.txt").write_text("old"))

    def refuse(path: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(shutil, "rmtree", refuse)
    with caplog.at_level(logging.WARNING):
        write_atomically(out, lambda tmp: (tmp / "b.txt").write_text("new"), overwrite=True)
    assert (out / "b.txt").read_text() == "new"
    assert "could not delete the folder it replaced" in caplog.text
    (aside,) = [p for p in tmp_path.iterdir() if p.name != "out"]
    assert (aside / "out" / "a.txt").read_text() == "old"  # kept where the warning says


def test_a_result_file_gets_its_missing_folders_and_is_never_torn(tmp_path, monkeypatch):
    path = tmp_path / "new" / "deeper" / "eval.json"
    write_file_atomically(path, '{"ppl": 1}\n')
    assert json.loads(path.read_text()) == {"ppl": 1}

    def killed(*args: object) -> None:  # the run is stopped after writing, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr("gapprune.output.os.replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_file_atomically(path, '{"ppl": 2}\n')
    assert json.loads(path.read_text()) == {"ppl": 1}  # the old file, whole
    assert [p.name for p in path.parent.iterdir()] == ["eval.json"]


def test_an_eval_out_named_like_its_table_is_refused_before_loading(tiny_model_folder, tmp_path, capsys, monkeypatch):
    no_load(monkeypatch)
    folder, _ = tiny_model_folder
    assert main(["eval", str(folder), "--out", str(tmp_path / "eval.md")]) == 2
    one_line_error(capsys, "eval.md", "--out eval.json")


@pytest.mark.parametrize("command", [["ppl"], ["eval"], ["prune-eval"]])
def test_zero_windows_is_refused_at_parse_time(tiny_model_folder, tmp_path, capsys, monkeypatch, command):
    no_load(monkeypatch)
    folder, text = tiny_model_folder
    argv = (prune_args(folder, text, tmp_path / "out", "--eval-windows", "0") if command == ["prune-eval"]
            else [command[0], str(folder), "--max-windows", "0"])
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and "at least 1 window" in capsys.readouterr().err


def test_a_checkpoint_folder_must_stand_apart_and_hold_only_a_checkpoint(tmp_path):
    out, model = tmp_path / "out", tmp_path / "model"
    model.mkdir()
    apart = {"--out": out, "MODEL": model}
    for overlapping in (out, out / "ckpt", tmp_path, model, model / "ckpt"):
        with pytest.raises(ValueError, match="overlaps"):
            ckpt.check_folder(overlapping, apart_from=apart)
    mine = tmp_path / "run.ckpt"
    ckpt.check_folder(mine, apart_from=apart)  # new: fine
    mine.mkdir()
    (mine / ckpt.STATE).write_bytes(b"x")
    (mine / ckpt.PEOPLE_STATE).write_text("{}")
    ckpt.check_folder(mine, apart_from=apart)  # a checkpoint of its own: fine (resumed)
    (mine / "thesis.tex").write_text("keep me")
    with pytest.raises(ValueError, match=r"not a gapprune checkpoint \(thesis.tex\)"):
        ckpt.check_folder(mine, apart_from=apart)
    ckpt.remove(mine)  # deletes its own files only, and so keeps the folder
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]
    (mine / "thesis.tex").unlink()
    ckpt.remove(mine)
    assert not mine.exists()


@pytest.mark.parametrize("where", ["cwd", "model", "out"])
def test_tune_refuses_a_checkpoint_folder_it_would_delete_by_mistake(tiny_model_folder, tmp_path, capsys, monkeypatch,
                                                                   where):
    no_load(monkeypatch)
    folder, _ = tiny_model_folder
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("keep me")
    checkpoint = {"cwd": ".", "model": str(folder), "out": str(tmp_path / "tuned")}[where]
    assert main(["tune", str(folder), "--out", str(tmp_path / "tuned"), "--checkpoint-dir", checkpoint]) == 2
    one_line_error(capsys, "--checkpoint-dir")
    assert (tmp_path / "notes.txt").read_text() == "keep me" and (folder / "config.json").is_file()


def test_prune_refuses_a_gguf_inside_its_output_folder_before_loading(tiny_model_folder, tmp_path, capsys,
                                                                     monkeypatch):
    pytest.importorskip("gguf")
    no_load(monkeypatch)
    folder, text = tiny_model_folder
    out = tmp_path / "out"
    assert main(prune_args(folder, text, out, "--gguf", str(out / "m.gguf"))) == 2
    one_line_error(capsys, "inside --out")
    assert not out.exists()


def test_prune_refuses_a_gguf_of_a_family_export_cannot_write_before_loading(tmp_path, capsys, monkeypatch):
    pytest.importorskip("gguf")
    from transformers import Qwen3Config

    no_load(monkeypatch)
    folder = tmp_path / "qwen3"
    Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, vocab_size=300, architectures=["Qwen3ForCausalLM"]).save_pretrained(folder)
    text = tmp_path / "calib.txt"
    text.write_text("word " * 200)
    assert main(prune_args(folder, text, tmp_path / "out", "--gguf", str(tmp_path / "m.gguf"))) == 2
    one_line_error(capsys, "GGUF export supports")
    assert not (tmp_path / "out").exists() and not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda plan: plan["layers"][0]["mlp"].update(option=96), '"option" must be a list of integers'),
    (lambda plan: plan.update(config=None), '"config" must be an object'),
    (lambda plan: (plan["config"].pop("ratio"), plan["summary"].pop("achieved_ratio")), "names no ratio"),
])
def test_a_hand_edited_plan_of_the_wrong_shape_gets_one_line(tiny_model_folder, tmp_path, capsys, monkeypatch, edit,
                                                            message):
    folder, text = tiny_model_folder
    assert main(prune_args(folder, text, tmp_path / "first", "--ratio", "0.25")) == 0
    plan = json.loads((tmp_path / "first" / "plan.json").read_text())
    edit(plan)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(plan))
    capsys.readouterr()
    no_load(monkeypatch)
    argv = [a for a in prune_args(folder, text, tmp_path / "second") if a not in ("--ratio", "0.3")]
    assert main([*argv, "--plan", str(bad)]) == 2
    one_line_error(capsys, message)
    assert not (tmp_path / "second").exists()
