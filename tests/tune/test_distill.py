from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from gapprune.data import tokenize_text
from gapprune.tune import DistillConfig, distill
from gapprune.tune.distillation import validation_kl
from gapprune.tune.teacher_text import pack_windows
from tests.tune.helpers import HELD_OUT, teacher_and_student, text_file


def held_out_kl(student, teacher, tokenizer) -> float:
    windows = pack_windows(tokenize_text(HELD_OUT, tokenizer), 32, None)
    return validation_kl(student, teacher, windows)


@pytest.mark.parametrize("settings", [
    {"params": "all", "lr": 3e-3},
    {"params": "decoder", "lr": 3e-3},
    {"params": "lora", "lr": 1e-2, "rank": 4, "top_k": 16},
])
def test_distillation_lowers_held_out_kl_and_keeps_the_shape(tmp_path, settings):
    teacher, student, tokenizer = teacher_and_student()
    params = sum(p.numel() for p in student.parameters())
    before = held_out_kl(student, teacher, tokenizer)
    config = DistillConfig(data=text_file(tmp_path), seq_len=32, batch_size=4, micro_batch=2, max_steps=20,
                           val_windows=4, eval_every=10, warmup=2, **settings)
    tuned, result = distill(student, tokenizer, config, teacher=teacher, teacher_tokenizer=tokenizer)
    after = held_out_kl(tuned, teacher, tokenizer)
    assert before > 0.1 and after < 0.8 * before
    assert result.steps == 20 and result.tokens == 20 * 4 * 32
    assert result.val_kl[-1][1] < result.val_kl[0][1]
    assert sum(p.numel() for p in tuned.parameters()) == params
    assert not any("lora" in name for name, _ in tuned.named_parameters())


@pytest.mark.parametrize("loaded", [torch.float16, torch.bfloat16])
def test_a_student_loaded_in_half_precision_trains_in_float32(tmp_path, loaded):
    """On a GPU `auto` loads the checkpoint's own dtype; AdamW on float16 weights gave NaN after one step."""
    teacher, student, tokenizer = teacher_and_student()
    student.to(loaded)
    before = held_out_kl(copy.deepcopy(student).float(), teacher, tokenizer)
    config = DistillConfig(data=text_file(tmp_path), seq_len=32, batch_size=4, micro_batch=2, max_steps=10,
                           val_windows=2, warmup=2, params="decoder", lr=3e-3)
    tuned, _ = distill(student, tokenizer, config, teacher=teacher, teacher_tokenizer=tokenizer)
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in tuned.parameters())
    assert held_out_kl(tuned, teacher, tokenizer) < before


def test_decoder_distillation_leaves_embeddings_final_norm_and_head_as_the_teacher_has_them(tmp_path):
    teacher, student, tokenizer = teacher_and_student()
    before = {name: p.detach().clone() for name, p in student.named_parameters()}
    config = DistillConfig(data=text_file(tmp_path), seq_len=32, batch_size=4, micro_batch=2, max_steps=3,
                           val_windows=2, warmup=1, params="decoder", lr=3e-3)
    tuned, _ = distill(student, tokenizer, config, teacher=teacher, teacher_tokenizer=tokenizer)
    changed = {name for name, p in tuned.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all(".layers." in name for name in changed)
    assert any(".mlp." in name for name in changed) and any(".self_attn." in name for name in changed)


def test_teacher_text_is_generated_once_and_cached(tmp_path):
    teacher, student, tokenizer = teacher_and_student()
    config = DistillConfig(data="self", self_windows=12, self_len=64, cache_dir=str(tmp_path / "cache"), seq_len=32,
                           batch_size=4, max_steps=1, val_windows=2, teacher="tiny")
    _, first = distill(copy.deepcopy(student), tokenizer, config, teacher=teacher, teacher_tokenizer=tokenizer)
    parts = sorted((tmp_path / "cache").rglob("part_*.pt"))
    assert first.data == {"self": 12} and parts
    stamps = [p.stat().st_mtime_ns for p in parts]
    distill(copy.deepcopy(student), tokenizer, config, teacher=teacher, teacher_tokenizer=tokenizer)
    assert [p.stat().st_mtime_ns for p in sorted((tmp_path / "cache").rglob("part_*.pt"))] == stamps


class Killed(Exception):
    pass


@pytest.mark.parametrize(("params", "cached"), [("all", False), ("decoder", False), ("lora", False), ("all", True)])
def test_resume_after_a_kill_gives_the_same_weights(tmp_path, params, cached):
    """`cached`: the uninterrupted run takes the teacher's top-k on the fly, the killed and resumed one
    from a teacher cache that holds only the windows the killed part used."""
    teacher, student, tokenizer = teacher_and_student()
    whole_config = DistillConfig(data=text_file(tmp_path), seq_len=32, batch_size=2, micro_batch=1, max_steps=7,
                                 save_every=2, eval_every=3, val_windows=2, params=params, lr=3e-3, rank=4,
                                 top_k=8 if cached else 0)
    config = replace(whole_config, teacher_cache=str(tmp_path / "topk") if cached else None)
    kwargs = {"teacher": teacher, "teacher_tokenizer": tokenizer}
    whole, whole_result = distill(copy.deepcopy(student), tokenizer, whole_config, **kwargs)

    def kill(step: int, loss: float) -> None:
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        distill(copy.deepcopy(student), tokenizer, config, checkpoint_dir=tmp_path / "ckpt", on_step=kill, **kwargs)
    resumed, resumed_result = distill(copy.deepcopy(student), tokenizer, config, checkpoint_dir=tmp_path / "ckpt",
                                      **kwargs)
    assert resumed_result.steps == 7 and resumed_result.train_loss == whole_result.train_loss
    assert resumed_result.val_kl == whole_result.val_kl
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_resume_refuses_other_settings(tmp_path):
    teacher, student, tokenizer = teacher_and_student()
    config = DistillConfig(data=text_file(tmp_path), seq_len=32, batch_size=2, max_steps=2, val_windows=2)
    distill(copy.deepcopy(student), tokenizer, config, teacher=teacher, teacher_tokenizer=tokenizer,
            checkpoint_dir=tmp_path / "ckpt")
    other = DistillConfig(data=text_file(tmp_path), seq_len=32, batch_size=2, max_steps=4, val_windows=2, lr=1e-3)
    with pytest.raises(ValueError, match="other settings.*lr"):
        distill(copy.deepcopy(student), tokenizer, other, teacher=teacher, teacher_tokenizer=tokenizer,
                checkpoint_dir=tmp_path / "ckpt")


def test_the_cosine_schedule_anneals_over_the_time_budget_or_the_steps():
    from gapprune.tune.distillation import learning_rate_at

    timed = DistillConfig(lr=1e-3, warmup=4, schedule="cosine", max_seconds=100.0)
    assert learning_rate_at(timed, 0, 10**6, 0.0) == pytest.approx(2.5e-4)  # warm-up: (step + 1) / 4
    assert learning_rate_at(timed, 4, 10**6, 0.0) == pytest.approx(1e-3)
    assert learning_rate_at(timed, 9, 10**6, 50.0) == pytest.approx(5e-4)  # half the time: half the rate
    assert learning_rate_at(timed, 9, 10**6, 100.0) == pytest.approx(0.0, abs=1e-12)
    stepped = DistillConfig(lr=1e-3, warmup=1, schedule="cosine", max_steps=20)
    assert learning_rate_at(stepped, 10, 20, 999.0) == pytest.approx(5e-4)  # no time budget: steps decide
    assert learning_rate_at(DistillConfig(lr=1e-3, warmup=1), 10, 20, 50.0) == pytest.approx(1e-3)  # constant
    with pytest.raises(ValueError, match="schedule must be"):
        DistillConfig(schedule="linear")


def test_wsd_holds_the_rate_then_falls_linearly_to_zero_over_the_last_fraction():
    from gapprune.tune.distillation import learning_rate_at

    timed = DistillConfig(lr=1e-3, warmup=2, schedule="wsd", decay_fraction=0.25, max_seconds=100.0)
    assert learning_rate_at(timed, 0, 10**6, 0.0) == pytest.approx(5e-4)  # warm-up
    assert learning_rate_at(timed, 50, 10**6, 75.0) == pytest.approx(1e-3)  # stable up to 75% of the time
    assert learning_rate_at(timed, 60, 10**6, 87.5) == pytest.approx(5e-4)  # half-way down the decay
    assert learning_rate_at(timed, 70, 10**6, 100.0) == pytest.approx(0.0, abs=1e-12)
    stepped = DistillConfig(lr=1e-3, warmup=1, schedule="wsd", decay_fraction=0.5, max_steps=20)
    assert learning_rate_at(stepped, 5, 20, 999.0) == pytest.approx(1e-3)
    assert learning_rate_at(stepped, 15, 20, 999.0) == pytest.approx(5e-4)  # no time budget: steps decide
    with pytest.raises(ValueError, match="decay_fraction"):
        DistillConfig(schedule="wsd", decay_fraction=0.0)


def test_validation_text_is_watched_while_every_training_window_trains(tmp_path):
    """`val_data`: the validation KL is taken on that text, and no training window is held out for it."""
    teacher, student, tokenizer = teacher_and_student()
    val_file = tmp_path / "keep.txt"
    val_file.write_text(HELD_OUT)
    config = DistillConfig(data=text_file(tmp_path), val_data=str(val_file), seq_len=32, batch_size=4, micro_batch=2,
                           val_windows=1000, eval_every=1000, warmup=1, params="decoder", lr=3e-3)
    tuned, result = distill(student, tokenizer, config, teacher=teacher, teacher_tokenizer=tokenizer)
    n_train = pack_windows(tokenize_text((tmp_path / "train.txt").read_text(), tokenizer), 32, None).shape[0]
    assert result.steps == n_train // 4  # one epoch over all the training windows
    assert result.val_kl[-1][0] == result.steps
    assert result.val_kl[-1][1] == pytest.approx(held_out_kl(tuned, teacher, tokenizer), rel=1e-5)
    with pytest.raises(ValueError, match="val_data is the training text"):
        DistillConfig(data="alpaca", val_data="alpaca")


def test_tune_distill_defaults_to_the_best_measured_setting_decoder_parameters_on_c4():
    # docs/recovery.md: distillation of the decoder beat LoRA, all parameters and teacher-written text, and on C4
    # it beat Alpaca at 25% (WikiText-2 73.9 vs 76.1, PTB 118.5 vs 123.2, an hour each)
    import argparse

    from gapprune.cli.tune import TuneCommand, _config

    parser = argparse.ArgumentParser()
    TuneCommand.add(parser.add_subparsers())
    args = parser.parse_args(["tune", "DIR", "--out", "OUT", "--distill"])
    config = _config(args, DistillConfig)
    assert (config.params, config.data, config.lr) == ("decoder", "c4", 0.0)
