from __future__ import annotations

import pytest
import torch

from gapprune.config import PruneConfig
from gapprune.data import consecutive_windows, load_text, mixed_windows, read_text_file, sample_windows


def test_missing_named_set_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"wikitext-2-raw/test.jsonl; .*hub"):
        load_text("wikitext2", "test", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"the data folder .*nowhere does not exist"):
        load_text("wikitext2", "test", tmp_path / "nowhere")


def test_missing_file_and_empty_text_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_text_file(tmp_path / "nope.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match="holds no text"):
        read_text_file(empty)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="wikitext2, ptb"):
        load_text("c4-en")


def test_jsonl_rows_join_with_blank_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n')
    assert read_text_file(path) == "a\n\nb"


def test_windows_are_consecutive_and_samples_seeded():
    ids = torch.arange(1000)
    windows = consecutive_windows(ids, 128)
    assert windows.shape == (7, 128) and torch.equal(windows.flatten(), ids[:896])
    assert torch.equal(sample_windows(ids, 4, 64, seed=3), sample_windows(ids, 4, 64, seed=3))
    assert not torch.equal(sample_windows(ids, 4, 64, seed=3), sample_windows(ids, 4, 64, seed=4))
    with pytest.raises(ValueError, match="fewer than one window"):
        consecutive_windows(ids[:10], 128)


def test_local_wikitext_and_ptb_are_found(data_dir):
    assert len(load_text("wikitext2", "test", data_dir)) > 1_000_000
    assert len(load_text("ptb", "validation", data_dir)) > 300_000


def test_bos_windows_keep_their_length_and_predict_every_text_token_once():
    ids = torch.arange(10, 1010)
    windows = consecutive_windows(ids, 128, bos_id=2)
    assert windows.shape == (7, 128) and (windows[:, 0] == 2).all()
    assert torch.equal(windows[:, 1:].flatten(), ids[: 7 * 127])  # consecutive text after each BOS
    samples = sample_windows(ids, 4, 64, seed=3, bos_id=2)
    assert samples.shape == (4, 64) and (samples[:, 0] == 2).all()
    assert torch.equal(samples[:, 1:], sample_windows(ids, 4, 63, seed=3))


def test_bos_is_detected_from_what_the_tokenizer_adds(tiny_model_folder):
    from tokenizers import processors
    from transformers import AutoTokenizer

    from gapprune.data import bos_token_id

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_folder[0])
    assert bos_token_id(tokenizer) is None  # no BOS token at all
    tokenizer.bos_token = "<eos>"
    assert bos_token_id(tokenizer) is None  # a BOS token the tokenizer never adds (SmolLM2, Qwen2)
    bos = tokenizer.bos_token_id
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single="<eos> $A", special_tokens=[("<eos>", bos)]
    )
    assert bos_token_id(tokenizer) == bos  # added before every text (Gemma)


def test_one_source_mix_is_the_plain_sample():
    ids = torch.arange(1000)
    assert torch.equal(mixed_windows([ids], 6, 64, seed=3), sample_windows(ids, 6, 64, seed=3))


def test_mixed_sources_alternate_so_every_prefix_is_balanced():
    first, second = torch.arange(0, 1000), torch.arange(5000, 6000)
    windows = mixed_windows([first, second], 7, 32, seed=0)
    from_second = (windows[:, 0] >= 5000).tolist()
    assert from_second == [False, True, False, True, False, True, False]
    assert torch.equal(windows[0::2], sample_windows(first, 4, 32, seed=0))
    assert torch.equal(windows[1::2], sample_windows(second, 3, 32, seed=1))


def test_mixed_calibration_names_are_checked():
    assert PruneConfig(ratio=0.25, calib="wikitext2+ptb").calib_sources == ["wikitext2", "ptb"]
    with pytest.raises(ValueError, match="'self' stands alone"):
        PruneConfig(ratio=0.25, calib="self+ptb")
    with pytest.raises(ValueError, match="joined by"):
        PruneConfig(ratio=0.25, calib="wikitext2+")
    with pytest.raises(ValueError, match="raise --calib-samples"):
        PruneConfig(ratio=0.25, calib="wikitext2+ptb+a.txt", calib_samples=2, profile_samples=2, screen_samples=1)


def test_calibration_ids_mix_two_files_in_equal_parts(tiny_model_folder, tmp_path):
    from transformers import AutoTokenizer

    from gapprune.pipeline import calibration_ids

    folder, text_file = tiny_model_folder
    tokenizer = AutoTokenizer.from_pretrained(folder)
    other = tmp_path / "other.txt"
    other.write_text("lazy dog " * 400)
    config = PruneConfig(ratio=0.25, calib=f"{text_file}+{other}", calib_samples=6, profile_samples=2,
                         screen_samples=1, seq_len=16)
    ids = calibration_ids(None, tokenizer, config)  # no model: text calibration never runs it
    other_ids = set(tokenizer("lazy dog " * 4, add_special_tokens=False)["input_ids"])
    only_other = [set(row.tolist()) <= other_ids for row in ids]
    assert ids.shape == (6, 16) and only_other == [False, True] * 3


def test_alpaca_is_a_named_set_split_by_row_so_tuning_never_reads_its_evaluation_rows(data_dir):
    from gapprune.data.instructions import SPLIT_ROWS, format_example, load_alpaca_records

    train, held_out = (load_alpaca_records("alpaca", data_dir, split) for split in ("train", "validation"))
    assert (len(train), len(held_out)) == (4500, 500)
    assert not {r["instruction"] + r["output"] for r in train} & {r["instruction"] + r["output"] for r in held_out}
    text = load_text("alpaca", data_directory=data_dir)  # the evaluation split, as `gapprune ppl --dataset alpaca`
    assert text.startswith("".join(format_example(held_out[0]))) and text.endswith(held_out[-1]["output"])
    assert load_text("alpaca", "train", data_dir).startswith("".join(format_example(train[0])))
    with pytest.raises(ValueError, match="splits train, validation"):
        load_alpaca_records("alpaca", data_dir, "test")
    assert SPLIT_ROWS["train"].stop == SPLIT_ROWS["validation"].start
