"""`code`: Python source that calibrates and trains on one split and is judged on the other."""

from __future__ import annotations

from pathlib import Path

import pytest

from gapprune.config import PruneConfig
from gapprune.data import TEXT_SETS, check_source, load_text, split_for
from gapprune.data import sources as data_sources
from gapprune.profiling.calibration import calibration_splits, profile_settings
from tests.evaluate.test_eval_bench import byte_tokenizer

FILES = {"train": "code/python_stdlib_train.txt", "validation": "code/python_stdlib_validation.txt"}


class _Read(Exception):
    """Raised by the spy once a role has named the file it reads: nothing is tokenised, no model runs."""


@pytest.fixture
def read_path(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files `load_text` opens, in order; each read stops the caller with `_Read`."""
    paths: list[Path] = []

    def spy(path: str | Path, field: str = "text", joiner: str = "\n\n") -> str:
        paths.append(Path(path))
        raise _Read(str(path))

    monkeypatch.setattr(data_sources, "read_text_file", spy)
    return paths


@pytest.mark.parametrize("role, split", [("calibration", "train"), ("training", "train"), ("evaluation", "validation")])
def test_each_role_reads_its_own_code_split(role, split):
    assert split_for("code", role) == split
    assert TEXT_SETS["code"].local[split] == FILES[split]
    check_source("code", split)


def test_calibration_distillation_and_perplexity_open_the_right_file(data_dir: Path, read_path: list[Path]):
    from gapprune.evaluate.perplexity import evaluate_ppl
    from gapprune.profiling.calibration import calibration_sources
    from gapprune.tune.teacher_text import training_windows

    tokenizer = byte_tokenizer()
    with pytest.raises(_Read):  # --calib code
        calibration_sources(tokenizer, PruneConfig(ratio=0.25, calib="code", data_dir=str(data_dir)))
    with pytest.raises(_Read):  # gapprune tune --distill --data code
        training_windows("code", tokenizer, 256, data_dir=str(data_dir))
    with pytest.raises(_Read):  # gapprune ppl --dataset code
        evaluate_ppl(None, tokenizer, "code", data_dir=str(data_dir))  # type: ignore[arg-type]
    assert read_path == [data_dir / FILES["train"], data_dir / FILES["train"], data_dir / FILES["validation"]]


def test_code_calibrates_on_train_alone_and_beside_other_sets():
    config = PruneConfig(ratio=0.25, calib="code")
    assert calibration_splits(config) == ["train"]
    assert profile_settings(config)["calib_split"] == "train"
    assert calibration_splits(PruneConfig(ratio=0.25, calib="wikitext2+code")) == ["validation", "train"]


def test_code_text_loads_from_the_data_folder(data_dir: Path):
    train, validation = load_text("code", "train", data_dir), load_text("code", None, data_dir)
    assert train == (data_dir / FILES["train"]).read_text(encoding="utf-8")  # a .txt file is read whole
    assert train.startswith("# file: Lib/__future__.py\n") and "# file: Lib/mailbox.py\n" in train
    assert validation.startswith("# file: Lib/mailcap.py\n") and "# file: Lib/zipimport.py\n" in validation
    modules = [{line for line in text.splitlines() if line.startswith("# file: Lib/")} for text in (train, validation)]
    assert (len(modules[0]), len(modules[1])) == (80, 88) and not modules[0] & modules[1]  # disjoint splits


def test_code_has_no_hub_copy_so_a_missing_file_names_the_data_folder_option(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(data_sources.DATA_ENV, raising=False)
    monkeypatch.setattr(data_sources, "_load_from_hub", lambda *a: pytest.fail("asked the hub for code"))
    with pytest.raises(FileNotFoundError, match=r"--data-dir .*GAPPRUNE_DATA.*code/python_stdlib_validation\.txt"):
        load_text("code", None, tmp_path)
    with pytest.raises(FileNotFoundError, match=r"data folder only .*; looked at: no data folder"):
        load_text("code", "train")
