"""`--calib self`: sequences start after the document separator and the window is their end."""

from __future__ import annotations

import torch
from tokenizers import processors
from transformers import AutoModelForCausalLM, AutoTokenizer

from gapprune.data.selfgen import document_start_id, self_generated_windows


def tiny(folder):  # type: ignore[no-untyped-def]
    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def add_bos(tokenizer):  # type: ignore[no-untyped-def]
    """Make the tokenizer put `<eos>` before every text, as Gemma's puts `<bos>`."""
    tokenizer.bos_token = "<eos>"
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single="<eos> $A", special_tokens=[("<eos>", tokenizer.bos_token_id)])
    return tokenizer


def test_the_document_start_is_bos_when_added_else_an_end_of_text_token(tiny_model_folder):
    _, tokenizer = tiny(tiny_model_folder[0])
    eos = tokenizer.eos_token_id
    assert document_start_id(tokenizer) == eos  # no BOS, no <|endoftext|>: EOS
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|endoftext|>"]})
    assert document_start_id(tokenizer) == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert document_start_id(add_bos(tokenizer)) == eos


def test_windows_are_the_seeded_tail_of_sequences_sampled_after_the_separator(tiny_model_folder, monkeypatch):
    model, tokenizer = tiny(tiny_model_folder[0])
    calls = []
    real_generate = model.generate

    def recording_generate(context, **kwargs):  # type: ignore[no-untyped-def]
        out = real_generate(context, **kwargs)
        calls.append((context.clone(), out.clone()))
        return out

    monkeypatch.setattr(model, "generate", recording_generate)
    windows = self_generated_windows(model, tokenizer, n_samples=3, seq_len=12, seed=1, lead=5, batch_size=2)
    assert windows.shape == (3, 12) and len(calls) == 2
    for context, out in calls:
        assert (context == tokenizer.eos_token_id).all() and out.shape[1] == 1 + 12 + 5
    assert torch.equal(windows, torch.cat([out[:, -12:] for _, out in calls]))
    again = self_generated_windows(model, tokenizer, n_samples=3, seq_len=12, seed=1, lead=5, batch_size=2)
    assert torch.equal(windows, again)
    assert not torch.equal(windows, self_generated_windows(model, tokenizer, 3, 12, seed=2, lead=5, batch_size=2))


def test_models_that_need_bos_get_bos_then_the_tail(tiny_model_folder):
    model, tokenizer = tiny(tiny_model_folder[0])
    add_bos(tokenizer)
    windows = self_generated_windows(model, tokenizer, n_samples=2, seq_len=10, seed=0, lead=4)
    assert windows.shape == (2, 10) and (windows[:, 0] == tokenizer.bos_token_id).all()
