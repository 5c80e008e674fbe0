"""C4: web text that calibrates and trains without the text pruned models are judged on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from gapprune.config import PruneConfig
from gapprune.data import TEXT_SETS, load_text, split_for
from gapprune.profiling.calibration import calibration_splits, profile_settings

SPAN = 80  # letters: a shared span this long is a copy, not a common phrase


def letters(text: str) -> str:
    """Lower-case letters only: WikiText's `@-@` escapes, PTB's `<unk>` and spacing do not hide a copy."""
    return re.sub(r"[^a-z]", "", text.replace("<unk>", "").lower())


def spans(text: str, width: int = SPAN // 2) -> set[str]:
    """Every `width`-letter window of `text`; two texts sharing an 80-letter span share one of these
    at any stride of at most `width`."""
    return {text[i : i + width] for i in range(max(1, len(text) - width + 1))}


@pytest.mark.parametrize("role, split", [("calibration", "train"), ("training", "train"), ("evaluation", "validation")])
def test_each_role_reads_its_own_c4_split(role, split):
    assert split_for("c4", role) == split
    assert split_for("wikitext2", "training") is None  # an evaluation set never trains
    assert split_for("notes.txt", role) is None


def test_the_c4_loader_cannot_return_wikitext2_or_ptb_test_text(data_dir: Path):
    reference = {name: letters(load_text(name, "test", data_dir)) for name in ("wikitext2", "ptb")}
    windows = {name: spans(text) for name, text in reference.items()}
    for split in TEXT_SETS["c4"].local:
        text = letters(load_text("c4", split, data_dir))
        assert len(text) > 1_000_000, f"c4 {split} is unexpectedly short"
        for name, seen in windows.items():
            hits = sum(text[i : i + SPAN // 2] in seen for i in range(0, len(text) - SPAN // 2, SPAN // 2))
            # a shared 80-letter span puts one of its aligned 40-letter halves in `seen`; 40 letters of
            # common prose ("the united states of america and the") may match alone, a copy would match runs
            assert hits <= 2, f"c4 {split} shares {hits} 40-letter spans with {name} test"
    with pytest.raises(ValueError, match="has splits train, validation, not 'test'"):
        load_text("c4", "test", data_dir)


def test_c4_calibrates_on_train_and_wikitext2_on_validation_as_before():
    c4 = PruneConfig(ratio=0.25, calib="c4")
    assert calibration_splits(c4) == ["train"]
    assert profile_settings(c4)["calib_split"] == "train"
    wiki = PruneConfig(ratio=0.25, calib="wikitext2")
    assert profile_settings(wiki)["calib_split"] == "validation"  # profiles saved before `auto` stay valid
    mixed = PruneConfig(ratio=0.25, calib="c4+wikitext2")
    assert calibration_splits(mixed) == ["train", "validation"]
    explicit = PruneConfig(ratio=0.25, calib="wikitext2", calib_split="test")
    assert calibration_splits(explicit) == ["test"]


def test_c4_distils_on_its_train_split_and_evaluation_sets_are_refused(data_dir: Path):
    from gapprune.tune.teacher_text import training_windows
    from tests.evaluate.test_eval_bench import byte_tokenizer

    tokenizer = byte_tokenizer()
    windows, counts = training_windows("c4", tokenizer, 256, data_dir=str(data_dir))
    train = load_text("c4", "train", data_dir)
    assert counts == {"c4": windows.shape[0]}
    expected = torch.tensor(tokenizer(train[:2000], add_special_tokens=False)["input_ids"][:256])
    assert torch.equal(windows[0], expected)  # the train documents, joined, in order (no BOS here)
    for data in ("wikitext2", "c4+ptb"):
        with pytest.raises(ValueError, match="evaluation set"):
            training_windows(data, tokenizer, 256, data_dir=str(data_dir))


def test_calibration_and_the_plan_check_share_one_tokenisation(data_dir: Path, monkeypatch):
    from gapprune.profiling import calibration
    from tests.evaluate.test_eval_bench import byte_tokenizer

    calls = []
    tokenise = calibration.tokenize_text
    monkeypatch.setattr(calibration, "tokenize_text", lambda text, tok: calls.append(len(text)) or tokenise(text, tok))
    tokenizer = byte_tokenizer()
    config = PruneConfig(ratio=0.25, calib="c4", calib_samples=4, profile_samples=4, screen_samples=1, check_samples=2,
                         seq_len=64, data_dir=str(data_dir))
    windows = calibration.calibration_ids(None, tokenizer, config)
    held_out = calibration.held_out_ids(tokenizer, config)
    assert len(calls) == 1 and windows.shape == (4, 64) and held_out is not None and held_out.shape == (2, 64)
    calibration.held_out_ids(tokenizer, PruneConfig(ratio=0.25, calib="wikitext2", check_samples=2, seq_len=64,
                                                    data_dir=str(data_dir)))
    assert len(calls) == 2  # another text is tokenised anew
