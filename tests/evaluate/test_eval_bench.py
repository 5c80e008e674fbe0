from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from gapprune.evaluate.fingerprint import weights_fingerprint
from gapprune.evaluate.speed import measure_speed
from gapprune.evaluate.zeroshot import (
    LOGITS_BUDGET_BYTES,
    TASKS,
    TYPICAL_TOKENS,
    default_batch_size,
    zero_shot,
)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A real byte-level BPE tokenizer built offline (256 byte tokens + eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=257, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"])
    tok.train_from_iterator(["hello world"], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


@pytest.fixture
def tiny_with_tokenizer():
    tokenizer = byte_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=2048)
    config.architectures = ["LlamaForCausalLM"]
    return LlamaForCausalLM(config).eval(), tokenizer


def test_lm_eval_runs_offline_on_local_files(tiny_with_tokenizer, data_dir):
    model, tokenizer = tiny_with_tokenizer
    records = zero_shot(model, tokenizer, ["piqa", "arc_challenge", "winogrande"], data_directory=data_dir, limit=4,
                        batch_size=4)
    assert [r["task"] for r in records] == ["piqa", "arc_challenge", "winogrande"]
    assert [r["metric"] for r in records] == ["acc", "acc_norm", "acc"]
    assert all(0 <= r["value"] <= 1 and r["limit"] == 4 for r in records)


def test_a_resumed_evaluation_answers_only_the_requests_it_has_not_answered(tiny_with_tokenizer, data_dir, tmp_path):
    model, tokenizer = tiny_with_tokenizer
    rows_seen: list[int] = []

    def count_rows(_module, args, kwargs):
        rows_seen.append(len(args[0] if args else kwargs["input_ids"]))

    model.register_forward_pre_hook(count_rows, with_kwargs=True)
    first = zero_shot(model, tokenizer, ["piqa"], data_directory=data_dir, limit=2, batch_size=1, resume=tmp_path)
    assert sum(rows_seen) == 4  # two questions, two answers each
    rows_seen.clear()
    resumed = zero_shot(model, tokenizer, ["piqa"], data_directory=data_dir, limit=4, batch_size=1, resume=tmp_path)
    assert sum(rows_seen) == 4  # the two new questions only
    rows_seen.clear()
    again = zero_shot(model, tokenizer, ["piqa"], data_directory=data_dir, limit=2, batch_size=1, resume=tmp_path)
    assert rows_seen == [] and again[0]["value"] == first[0]["value"]
    fresh = zero_shot(model, tokenizer, ["piqa"], data_directory=data_dir, limit=4, batch_size=1)
    assert fresh[0]["value"] == resumed[0]["value"]


def test_answers_cached_for_one_model_are_not_served_to_another(tiny_with_tokenizer):
    model, _ = tiny_with_tokenizer
    before = weights_fingerprint(model)
    assert weights_fingerprint(copy.deepcopy(model)) == before
    assert weights_fingerprint(copy.deepcopy(model).to(torch.bfloat16)) != before
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] += 1e-3
    assert weights_fingerprint(model) != before


def test_large_vocabularies_get_smaller_zero_shot_batches():
    sizes = {vocab: default_batch_size(vocab) for vocab in (257, 49_152, 151_936, 262_144, 10**9)}
    assert sizes[257] == sizes[49_152] == 16 and sizes[10**9] == 1
    assert 16 > sizes[151_936] > sizes[262_144] > 1
    assert all(b * v * TYPICAL_TOKENS * 4 <= LOGITS_BUDGET_BYTES for v, b in sizes.items() if b < 16 and v < 10**9)


def test_unknown_task_and_missing_data_are_clear_errors(tiny_with_tokenizer, tmp_path):
    model, tokenizer = tiny_with_tokenizer
    with pytest.raises(ValueError, match="unknown task 'mmlu'"):
        zero_shot(model, tokenizer, ["mmlu"], data_directory=tmp_path)
    with pytest.raises(FileNotFoundError, match="boolq_validation.jsonl"):
        zero_shot(model, tokenizer, ["boolq"], data_directory=tmp_path)
    assert set(TASKS) == {"boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa"}


def test_speed_measurement_reports_positive_numbers(tiny_with_tokenizer):
    result = measure_speed(tiny_with_tokenizer[0], batch=2, prompt_tokens=16, new_tokens=3, repeats=2)
    assert result.prefill_ms > 0 and result.decode_tokens_per_s > 0 and math.isfinite(result.decode_tokens_per_s)
    assert result.params == sum(p.numel() for p in tiny_with_tokenizer[0].parameters())
    assert result.decode_tokens_per_s_min <= result.decode_tokens_per_s <= result.decode_tokens_per_s_max
