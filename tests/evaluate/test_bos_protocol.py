"""Perplexity of a model that needs BOS: every window starts with it, and the record says so."""

from __future__ import annotations

import torch
from tokenizers import processors
from transformers import AutoModelForCausalLM, AutoTokenizer

from gapprune.data import consecutive_windows, load_text, tokenize_text
from gapprune.evaluate.perplexity import evaluate_ppl, perplexity


def test_bos_protocol_is_applied_and_recorded(tiny_model_folder):
    folder, text_file = tiny_model_folder
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    plain = evaluate_ppl(model, tokenizer, str(text_file), seq_len=32, max_windows=4, progress=False)
    assert plain.to_record()["bos"] is False

    tokenizer.bos_token = "<eos>"
    bos = tokenizer.bos_token_id
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(single="<eos> $A", special_tokens=[("<eos>", bos)])
    with_bos = evaluate_ppl(model, tokenizer, str(text_file), seq_len=32, max_windows=4, progress=False)
    assert with_bos.to_record()["bos"] is True and with_bos.predicted_tokens == plain.predicted_tokens

    ids = tokenize_text(load_text(str(text_file), "test"), tokenizer)
    windows = torch.cat([torch.full((4, 1), bos), ids[: 4 * 31].view(4, 31)], dim=1)
    assert with_bos.nll == perplexity(model, windows, progress=False).nll
    assert torch.equal(consecutive_windows(ids, 32, 4, bos_id=bos), windows)
