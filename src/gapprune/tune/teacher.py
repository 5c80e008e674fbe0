"""The teacher of a distillation: which model it is, loading it, and refusing one that cannot teach.

A pruned folder records where it came from in its `config.json`: `gguf_source` (an alias or GGUF
file, written by `gapprune prune`) or `pruned_from` (any other model id or folder). KL on logits
compares distributions token by token, so the teacher must have the student's vocabulary: the
same tokenizer (token -> id) and the same number of logits.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

SOURCE_FIELDS = ("pruned_from", "gguf_source")


def resolve_teacher(config: Any) -> str:
    """The model the student was pruned from, as recorded in its config; a clear error when absent."""
    for name in SOURCE_FIELDS:
        value = getattr(config, name, None)
        if value:
            return str(value)
    raise ValueError("the model records no source it was pruned from (config.json has no "
                     f"{' or '.join(SOURCE_FIELDS)}); name the teacher with --teacher MODEL "
                     "(Python: DistillConfig(teacher=...))")


def load_teacher(spec: str, device: str | torch.device = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the teacher (eval mode, no gradients) on the student's device, and its tokenizer."""
    from gapprune.api import load

    model, tokenizer = load(spec, device=str(device))
    if tokenizer is None:
        raise ValueError(f"teacher {spec} has no tokenizer; its vocabulary cannot be checked")
    return model.eval().requires_grad_(False), tokenizer


def check_same_vocabulary(
    teacher: PreTrainedModel, teacher_tokenizer: PreTrainedTokenizerBase | None, student: PreTrainedModel,
    student_tokenizer: PreTrainedTokenizerBase, teacher_name: str = "the teacher",
) -> None:
    """Raise when the teacher's logits or tokenizer do not line up with the student's, id for id."""
    t_vocab = int(teacher.get_output_embeddings().weight.shape[0])
    s_vocab = int(student.get_output_embeddings().weight.shape[0])
    if t_vocab != s_vocab:
        raise ValueError(f"{teacher_name} has {t_vocab} logits per token, the student {s_vocab}: distillation "
                         "needs the same vocabulary; use the model the student was pruned from")
    if teacher_tokenizer is None:
        return
    t_map, s_map = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if t_map != s_map:
        differ = sorted(set(t_map.items()) ^ set(s_map.items()))[:3]
        raise ValueError(f"{teacher_name}'s tokenizer differs from the student's ({len(t_map)} vs {len(s_map)} "
                         f"tokens; e.g. {differ}): token ids would not mean the same text")
