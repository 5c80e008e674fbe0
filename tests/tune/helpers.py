"""A tiny teacher (real byte-level tokenizer) and a student pruned from it, for distillation tests."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gapprune.models import get_adapter
from tests.evaluate.test_eval_bench import byte_tokenizer

TEXT = (
    "Pruning removes whole heads and channels; distillation then teaches the smaller model to predict "
    "what the larger one predicts, token by token, on text that neither was evaluated on. "
) * 30
HELD_OUT = "A different sentence about rivers, mountains and the weather in the spring, said twice. " * 8


def teacher_and_student(vocab_size: int | None = None, seed: int = 0):
    """(teacher, student, tokenizer): the student has half the MLP channels of layer 0 and 1 removed."""
    tokenizer = byte_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=vocab_size or len(tokenizer), max_position_embeddings=256,
                         initializer_range=0.2)
    config.architectures = ["LlamaForCausalLM"]
    teacher = LlamaForCausalLM(config).eval()
    student = copy.deepcopy(teacher)
    adapter = get_adapter(student)
    adapter.prune_mlp_(0, list(range(0, 64, 2)))
    adapter.prune_mlp_(1, list(range(1, 64, 2)))
    adapter.record_shapes_()
    return teacher, student, tokenizer


def text_file(folder: Path, text: str = TEXT) -> str:
    path = folder / "train.txt"
    path.write_text(text)
    return str(path)
