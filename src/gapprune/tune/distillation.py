"""Recovery by distillation from the unpruned model (Minitron-style logit distillation).

The student (the pruned model) learns the teacher's whole next-token distribution at every
position: KL(teacher ‖ student), optionally plus the LM loss, on text with no evaluation data in
it (`teacher_text.py`). Teacher logits are computed on the fly: one teacher forward costs about a
third of a student step, less than storing them for a window used once. Text seen again (epochs,
or other students on the same text) can read the teacher's top-k from disk (`teacher_cache.py`).
LoRA adapters (merged at the end) or all parameters are trained; checkpoints hold the trained
tensors, the optimiser and the RNG, so a killed run resumes to the same weights.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gapprune.tune import checkpoint as ckpt
from gapprune.tune.configs import DistillConfig
from gapprune.tune.kd_loss import kl_full, kl_topk, lm_loss, teacher_topk
from gapprune.tune.progress import advance, training_bar
from gapprune.tune.teacher import check_same_vocabulary, load_teacher, resolve_teacher
from gapprune.tune.teacher_cache import TeacherTopK
from gapprune.tune.teacher_text import training_windows

if TYPE_CHECKING:
    from peft import PeftModel

log = logging.getLogger(__name__)

# Fields a resumed run may change: how long it runs and how often it reports, not what it learns.
# The teacher cache returns what the teacher computes, so it may be switched on or moved too.
RESUMABLE_CHANGES = frozenset({"max_steps", "max_seconds", "epochs", "eval_every", "save_every", "teacher_cache"})


@dataclass
class DistillResult:
    teacher: str
    steps: int
    tokens: int
    train_loss: list[float]
    val_kl: list[tuple[int, float]]
    wall_s: float
    data: dict[str, int]
    train_s: float = 0.0  # training-loop time over all resumed parts (what max_seconds limits)
    cache_hits: int = 0  # micro-batches whose teacher outputs came from the teacher cache


def learning_rate_at(config: DistillConfig, step: int, total_steps: int, train_s: float) -> float:
    """Linear warm-up, then constant, a cosine decay to 0, or warm-up-stable-decay (wsd).

    Decays follow the time budget when there is one (a run limited to an hour anneals over that
    hour, however many steps it gets), else the step count. wsd holds the rate and falls linearly
    to 0 over the last `decay_fraction` of the budget, which lowers the noise a constant rate
    leaves in the last iterate; on SmolLM2 at 25% neither decay beat a constant rate on WikiText-2
    after an hour (docs/recovery.md).
    """
    rate = config.learning_rate * min(1.0, (step + 1) / max(config.warmup, 1))
    if config.schedule == "constant" or step < config.warmup:
        return rate
    progress = min(1.0, train_s / config.max_seconds if config.max_seconds else step / max(total_steps, 1))
    if config.schedule == "wsd":
        return rate * min(1.0, (1.0 - progress) / config.decay_fraction)
    return rate * 0.5 * (1.0 + math.cos(math.pi * progress))


def _teacher_outputs(teacher: PreTrainedModel, ids: torch.Tensor, index: torch.Tensor, config: DistillConfig,
                     cache: TeacherTopK | None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The teacher's logits (b, T, V) of windows `ids` (b, T), or its top-k (log-probabilities, ids)."""
    if cache is not None:
        return cache.outputs(teacher, index, ids)
    with torch.no_grad():
        logits = teacher(input_ids=ids).logits
    return teacher_topk(logits, config.top_k, config.temperature) if config.top_k else logits


def _loss(student: nn.Module, teacher_out: torch.Tensor | tuple[torch.Tensor, torch.Tensor], ids: torch.Tensor,
          config: DistillConfig) -> torch.Tensor:
    """Distillation loss of one micro-batch of windows (b, T) against the teacher's outputs on them."""
    s_logits = student(input_ids=ids).logits  # (b, T, V)
    if isinstance(teacher_out, tuple):  # a cache's top-k may come from the CPU
        teacher_out = (teacher_out[0].to(s_logits.device), teacher_out[1].to(s_logits.device))
    else:
        teacher_out = teacher_out.to(s_logits.device)
    if isinstance(teacher_out, tuple):
        loss = kl_topk(s_logits, *teacher_out, config.temperature)
    else:
        loss = kl_full(s_logits, teacher_out, config.temperature)
    if config.lm_weight:
        loss = loss + config.lm_weight * lm_loss(s_logits, ids)
    return loss


@torch.no_grad()
def validation_kl(student: nn.Module, teacher: PreTrainedModel, windows: torch.Tensor, batch: int = 4) -> float:
    """Mean full-vocabulary KL(teacher ‖ student) at T = 1 over held-out windows (n, T)."""
    was_training = student.training
    student.eval()
    total = 0.0
    for i in range(0, windows.shape[0], batch):
        ids = windows[i : i + batch].to(next(student.parameters()).device)
        total += float(kl_full(student(input_ids=ids).logits, teacher(input_ids=ids).logits)) * ids.shape[0]
    student.train(was_training)
    return total / max(windows.shape[0], 1)


def _trainable(student: PreTrainedModel, config: DistillConfig) -> nn.Module:
    """The module to train: LoRA-wrapped (peft), or the student itself with every parameter or with
    its decoder layers only.

    Pruning removes units inside the decoder layers only: the embeddings, final norm and head are
    still the teacher's, so `decoder` trains just what pruning changed and keeps the shared (tied)
    token matrix from drifting toward the training text's vocabulary.
    """
    if config.params == "all":
        student.requires_grad_(True)
        return student
    if config.params == "decoder":
        from gapprune.models import get_adapter

        student.requires_grad_(False)
        for layer in get_adapter(student).layers:
            layer.requires_grad_(True)
        return student
    from gapprune.tune.lora import wrap_lora

    return wrap_lora(student, config.rank, config.alpha, dropout=0.0)


def distill(
    student: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: DistillConfig,
    *,
    teacher: PreTrainedModel | None = None,
    teacher_tokenizer: PreTrainedTokenizerBase | None = None,
    checkpoint_dir: Path | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[PreTrainedModel, DistillResult]:
    """Distil `teacher` (default: the model `student` was pruned from) into `student`.

    Returns the trained plain model (LoRA merged; same parameter count) and the training record.
    `on_step(step, loss)` is called after every optimiser step (progress hooks, tests).
    """
    start = time.perf_counter()
    if teacher is None:
        teacher_id = config.teacher or resolve_teacher(student.config)
        teacher, teacher_tokenizer = load_teacher(teacher_id, next(student.parameters()).device)
    else:
        teacher_id = config.teacher or getattr(teacher.config, "_name_or_path", "") or "teacher"
    check_same_vocabulary(teacher, teacher_tokenizer, student, tokenizer, teacher_id)
    teacher.eval().requires_grad_(False)
    device = next(student.parameters()).device
    from gapprune.models.loading import default_cache_dir

    text_cache = Path(config.cache_dir) if config.cache_dir else default_cache_dir() / "teacher_text"
    topk_cache = default_cache_dir() / "teacher_topk" if config.teacher_cache == "auto" else config.teacher_cache or None
    text = partial(training_windows, tokenizer=tokenizer, seq_len=config.seq_len, teacher=teacher, teacher_id=teacher_id,
                   self_windows=config.self_windows, self_len=config.self_len, cache_dir=text_cache,
                   data_dir=config.data_dir, seed=config.seed)
    windows, counts = text(config.data)
    order = torch.randperm(windows.shape[0], generator=torch.Generator().manual_seed(config.seed))
    if config.val_data:  # every training window trains; the validation KL watches other text
        val_pool, _ = text(config.val_data)
        pick = torch.randperm(val_pool.shape[0], generator=torch.Generator().manual_seed(config.seed))
        train_index, val = order, val_pool[pick[: config.val_windows]]
    else:
        train_index, val = order[config.val_windows :], windows[order[: config.val_windows]]
    train = windows[train_index]  # rows of `windows` (train_index) key the teacher cache
    if train.shape[0] < config.batch_size:
        raise ValueError(f"{train.shape[0]} training windows are fewer than one batch of {config.batch_size}")
    torch.manual_seed(config.seed)
    # AdamW on half-precision weights loses what it should learn: in float16 its eps rounds to 0 and
    # the first step can turn weights into NaN; in bf16 updates under half a step of the weight's
    # 8-bit mantissa vanish. A student loaded in its checkpoint's dtype (a GPU's `auto`) trains in
    # `config.dtype`, float32 unless bf16 is asked for; the teacher stays in its own.
    student.to(torch.bfloat16 if config.dtype == "bfloat16" else torch.float32)  # type: ignore[arg-type]
    model = _trainable(student, config)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
    steps_per_epoch = train.shape[0] // config.batch_size
    total_steps = config.max_steps or math.ceil(config.epochs * steps_per_epoch)
    cache = None if topk_cache is None else TeacherTopK(
        Path(topk_cache), windows, teacher_id=teacher_id, teacher_dtype=next(teacher.parameters()).dtype,
        k=config.top_k, temperature=config.temperature)
    result = DistillResult(teacher_id, 0, 0, [], [], 0.0, counts)
    step = saved = ckpt.resume(checkpoint_dir, model, optimizer, asdict(config), RESUMABLE_CHANGES, result,
                              defaults=asdict(DistillConfig()))
    model.train()
    bar = training_bar(f"distil ({config.params})", total_steps=total_steps, step=step,
                       max_seconds=config.max_seconds, seconds_done=result.train_s)
    run_start, before, hits_before = time.perf_counter(), result.train_s, result.cache_hits
    while step < total_steps and not (config.max_seconds and result.train_s >= config.max_seconds):
        epoch, offset = divmod(step, steps_per_epoch)
        perm = list(range(train.shape[0]))
        random.Random(config.seed + epoch).shuffle(perm)
        rows = perm[offset * config.batch_size : (offset + 1) * config.batch_size]
        batch, index = train[rows], train_index[rows]  # (B, T), (B,)
        lr = learning_rate_at(config, step, total_steps, result.train_s)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = 0.0
        for micro, micro_index in zip(batch.split(config.micro_batch), index.split(config.micro_batch), strict=True):
            micro = micro.to(device)  # token ids live on the CPU; the models may not
            teacher_out = _teacher_outputs(teacher, micro, micro_index, config, cache)
            loss = _loss(model, teacher_out, micro, config) * micro.shape[0] / batch.shape[0]
            loss.backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        result.steps, result.tokens = step, result.tokens + batch.numel()
        result.train_s = round(before + time.perf_counter() - run_start, 2)
        result.train_loss.append(round(loss_sum, 5))
        if cache is not None:
            result.cache_hits = hits_before + cache.hits
        bar.set_postfix(step=step, loss=f"{loss_sum:.4f}", lr=f"{lr:.1e}")
        advance(bar, max_seconds=config.max_seconds, seconds_done=result.train_s)
        if on_step is not None:
            on_step(step, loss_sum)
        last = step == total_steps or bool(config.max_seconds and result.train_s >= config.max_seconds)
        if val.shape[0] and (step % config.eval_every == 0 or last):
            result.val_kl.append((step, round(validation_kl(model, teacher, val, config.micro_batch), 5)))
            log.info("step %d: validation KL %.4f", step, result.val_kl[-1][1])
        if checkpoint_dir is not None and (step % config.save_every == 0 or last):
            ckpt.save(checkpoint_dir, model, optimizer, step, asdict(config), result)
            saved = step
    bar.close()
    if checkpoint_dir is not None and step != saved:  # stopped by the time limit between saves
        ckpt.save(checkpoint_dir, model, optimizer, step, asdict(config), result)
    merged = cast("PeftModel", model).merge_and_unload() if config.params == "lora" else student
    merged.requires_grad_(False)
    merged.eval()
    result.wall_s = round(time.perf_counter() - start, 2)
    return merged, result


def result_record(result: DistillResult) -> dict[str, Any]:
    return asdict(result)
