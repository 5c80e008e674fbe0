"""LoRA recovery tuning with peft: wrap -> train -> merge_and_unload, resumable from a checkpoint."""

from __future__ import annotations

import logging
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gapprune.data.instructions import load_alpaca_records
from gapprune.models import get_adapter
from gapprune.tune import checkpoint as ckpt
from gapprune.tune.alpaca import collate, tokenize_examples
from gapprune.tune.configs import TuneConfig
from gapprune.tune.progress import advance, training_bar

if TYPE_CHECKING:
    from peft import PeftModel

log = logging.getLogger(__name__)

# settings a resumed run may change: how long it trains and how often it reports, not what it trains
RESUMABLE_CHANGES = frozenset({"max_steps", "max_seconds", "epochs", "eval_every", "save_every"})


@dataclass
class TuneResult:
    steps: int
    examples_seen: int
    train_loss: list[float]
    val_loss: list[tuple[int, float]]
    wall_s: float
    tokens: int = 0  # non-padding tokens seen
    train_s: float = 0.0  # training-loop time over all resumed parts (what max_seconds limits)


@torch.no_grad()
def _mean_loss(model: PeftModel, examples: list[tuple[torch.Tensor, torch.Tensor]], pad_id: int, batch: int) -> float:
    model.eval()
    losses = []
    for i in range(0, len(examples), batch):
        inputs = collate(examples[i : i + batch], pad_id)
        losses.append(float(model(**{k: v.to(model.device) for k, v in inputs.items()}).loss))
    model.train()
    return sum(losses) / max(len(losses), 1)


def wrap_lora(model: PreTrainedModel, rank: int, alpha: int, dropout: float) -> PeftModel:
    """`model` with trainable LoRA adapters on every linear projection its adapter names (peft)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ImportError("LoRA tuning needs peft: pip install 'gapprune[tune]'") from err
    present = {name.split(".")[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    targets = sorted(present & set(get_adapter(model).projection_names))
    lora = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def lora_tune(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: TuneConfig, checkpoint_dir: Path | None = None
) -> tuple[PreTrainedModel, TuneResult]:
    """Train LoRA adapters on all linear projections, then merge them into the weights.

    Returns the merged plain model (same parameter count as the input) and the training record.
    """
    import time

    start = time.perf_counter()
    torch.manual_seed(config.seed)
    records = load_alpaca_records(config.data, config.data_dir)
    random.Random(config.seed).shuffle(records)
    if config.max_examples:
        records = records[: config.max_examples + config.val_examples]
    examples = tokenize_examples(records, tokenizer, config.cutoff, config.train_on_inputs)
    val, train = examples[: config.val_examples], examples[config.val_examples :]
    if not train:
        raise ValueError("no training examples left after the validation split; lower val_examples")
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    model.to(dtype)  # type: ignore[arg-type]  # transformers' decorated .to hides its signature
    peft_model = wrap_lora(model, config.rank, config.alpha, config.dropout)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr)
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    total_steps = config.max_steps or math.ceil(config.epochs * steps_per_epoch)
    result = TuneResult(0, 0, [], [], 0.0)
    step = ckpt.resume(checkpoint_dir, peft_model, optimizer, asdict(config), RESUMABLE_CHANGES, result,
                       defaults=asdict(TuneConfig()))
    done_s = result.train_s  # max_seconds counts the whole run, resumed parts included
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = list(range(len(train)))
    peft_model.train()
    bar = training_bar("LoRA", total_steps=total_steps, step=step, max_seconds=config.max_seconds, seconds_done=done_s)
    loop_start = time.perf_counter() - done_s
    while step < total_steps and not (config.max_seconds and time.perf_counter() - loop_start >= config.max_seconds):
        epoch, offset = divmod(step * config.batch_size, len(train))
        random.Random(config.seed + epoch).shuffle(order)
        chunk = [train[i] for i in order[offset : offset + config.batch_size]]
        batch = collate(chunk, pad_id)
        loss = peft_model(**{k: v.to(peft_model.device) for k, v in batch.items()}).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        result.train_loss.append(round(float(loss.detach()), 5))
        result.examples_seen += len(chunk)
        result.tokens += int(batch["attention_mask"].sum())
        bar.set_postfix(step=step, loss=f"{result.train_loss[-1]:.3f}")
        advance(bar, max_seconds=config.max_seconds, seconds_done=time.perf_counter() - loop_start)
        out_of_time = bool(config.max_seconds) and time.perf_counter() - loop_start >= config.max_seconds
        if val and (step % config.eval_every == 0 or step == total_steps or out_of_time):
            result.val_loss.append((step, round(_mean_loss(peft_model, val, pad_id, config.batch_size), 5)))
            log.info("step %d: validation loss %.4f", step, result.val_loss[-1][1])
        result.steps, result.train_s = step, round(time.perf_counter() - loop_start, 2)
        if checkpoint_dir is not None and (step % config.save_every == 0 or step == total_steps or out_of_time):
            ckpt.save(checkpoint_dir, peft_model, optimizer, step, asdict(config), result)
    bar.close()
    merged: PreTrainedModel = peft_model.merge_and_unload()
    merged.to(torch.float32).eval()  # type: ignore[arg-type]  # as above
    result.steps = step
    result.wall_s = round(time.perf_counter() - start, 2)
    return merged, result


def result_record(result: TuneResult) -> dict[str, Any]:
    return asdict(result)
