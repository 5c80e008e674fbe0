from __future__ import annotations

import json

import torch

import gapprune
from gapprune.cli import main
from gapprune.export.save import save
from gapprune.models import get_adapter
from tests.tune.helpers import text_file


def test_tune_distill_finds_the_teacher_in_the_config_and_saves_a_loadable_folder(tmp_path, tiny_model_folder):
    teacher_folder, _ = tiny_model_folder
    student, tokenizer = gapprune.load(str(teacher_folder))
    get_adapter(student).prune_mlp_(0, list(range(0, 128, 2)))
    get_adapter(student).record_shapes_()
    student.config.pruned_from = str(teacher_folder)
    pruned = save(student, tokenizer, tmp_path / "pruned")
    out = tmp_path / "tuned"
    code = main(["tune", str(pruned), "--distill", "--params", "all", "--data", text_file(tmp_path), "--seq-len", "32",
                 "--batch-size", "2", "--max-steps", "3", "--val-windows", "2", "--lr", "1e-3", "--out", str(out)])
    assert code == 0
    record = json.loads((out / "tune.json").read_text())
    assert record["method"] == "distill" and record["teacher"] == str(teacher_folder) and record["steps"] == 3
    assert record["config"]["lr"] == 1e-3 and record["config"]["rank"] == 8  # given flag, and distill default
    assert not (tmp_path / "tuned.ckpt").exists()
    tuned, _ = gapprune.load(str(out))
    assert next(s.intermediate for s in get_adapter(tuned).shapes()) == 64
    changed = [not torch.equal(a, b) for a, b in zip(tuned.state_dict().values(), student.state_dict().values())]
    assert any(changed)
