"""Distillation losses: pure tensor maths, no modules or state (the training loop is `distill.py`).

Both losses are KL(teacher ‖ student) per position, averaged over the positions that count, and
scaled by T² so that gradients keep their size when the temperature changes (Hinton et al.).

* `kl_full`: over the whole vocabulary.
* `kl_topk`: over the teacher's k most likely tokens plus one tail bucket that holds the rest of
  both distributions' mass. It needs only the teacher's top-k (values, ids) per position, so the
  teacher's outputs can be stored on disk at a fraction of the full-vocabulary size; the student
  still computes its full distribution, since the tail bucket needs its normaliser.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _masked_mean(per_position: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over positions (N,), counting only mask > 0 when a mask is given."""
    if mask is None:
        return per_position.mean()
    weights = mask.reshape(-1).to(per_position.dtype)
    return (per_position * weights).sum() / weights.sum().clamp_min(1.0)


def kl_full(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL(p_teacher ‖ q_student) over the full vocabulary.

    Args:
        student_logits: (..., V) logits of the student.
        teacher_logits: (..., V) logits of the teacher, same shape (no gradient needed).
        temperature: softens both distributions; the loss is multiplied by T².
        mask: (...) positions that count (1) or not (0), e.g. padding; None counts all.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ; the vocabularies must match")
    vocab = student_logits.shape[-1]
    log_q = F.log_softmax(student_logits.float().reshape(-1, vocab) / temperature, dim=-1)  # (N, V)
    log_p = F.log_softmax(teacher_logits.float().reshape(-1, vocab) / temperature, dim=-1)  # (N, V)
    per_position = (log_p.exp() * (log_p - log_q)).sum(-1)  # (N,)
    return _masked_mean(per_position, mask) * temperature**2


def teacher_topk(teacher_logits: torch.Tensor, k: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's k most likely tokens: (log-probabilities (..., k), ids (..., k)) at `temperature`."""
    log_p = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    values, ids = log_p.topk(k, dim=-1)
    return values, ids


def kl_topk(
    student_logits: torch.Tensor, teacher_logp: torch.Tensor, teacher_ids: torch.Tensor, temperature: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL over the teacher's top-k tokens plus a tail bucket (everything else, in both models).

    Args:
        student_logits: (..., V) logits of the student.
        teacher_logp: (..., k) teacher log-probabilities of its top-k tokens (at `temperature`).
        teacher_ids: (..., k) their token ids.
        temperature: as in `kl_full`; `teacher_logp` must have been taken at the same temperature.
        mask: (...) positions that count; None counts all.
    """
    vocab, k = student_logits.shape[-1], teacher_ids.shape[-1]
    if teacher_ids.shape[:-1] != student_logits.shape[:-1] or int(teacher_ids.max()) >= vocab:
        raise ValueError("teacher top-k ids do not fit the student's logits; the vocabularies must match")
    log_q_all = F.log_softmax(student_logits.float().reshape(-1, vocab) / temperature, dim=-1)  # (N, V)
    log_q = log_q_all.gather(1, teacher_ids.reshape(-1, k))  # (N, k)
    log_p = teacher_logp.float().reshape(-1, k)  # (N, k)
    p_tail = (-torch.expm1(log_p.logsumexp(-1))).clamp_min(1e-8)  # (N,) mass outside the top-k
    q_tail = (-torch.expm1(log_q.logsumexp(-1))).clamp_min(1e-8)  # (N,)
    per_position = (log_p.exp() * (log_p - log_q)).sum(-1) + p_tail * (p_tail.log() - q_tail.log())  # (N,)
    return _masked_mean(per_position, mask) * temperature**2


def lm_loss(student_logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross-entropy on the text itself (the usual LM loss), for mixing with the KL.

    Args:
        student_logits: (n, T, V) logits at every position; position t predicts token t + 1.
        input_ids: (n, T) the text.
        mask: (n, T) positions that count; None counts all.
    """
    vocab = student_logits.shape[-1]
    logits = student_logits[:, :-1].float().reshape(-1, vocab)  # (n·(T-1), V)
    targets = input_ids[:, 1:].reshape(-1)  # (n·(T-1),)
    per_position = F.cross_entropy(logits, targets, reduction="none")
    return _masked_mean(per_position, None if mask is None else mask[:, 1:])
