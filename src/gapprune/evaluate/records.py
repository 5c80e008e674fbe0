"""Flat result records for `gapprune eval` and `gapprune bench`, and their text forms.

Every record is one measurement of one model: `{"model", "task", "metric", "value", "limit", ...}` for
evaluation (perplexity windows go in `limit`), `{"model", "batch", <SpeedResult fields>}` for speed,
so several runs concatenate into one JSON list, as `docs/results/eval.json` and `bench.json` do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gapprune.evaluate.perplexity import PerplexityResult
from gapprune.evaluate.speed import measure_speed

Record = dict[str, Any]


def ppl_record(model_name: str, result: PerplexityResult) -> Record:
    """A perplexity result in the shape of a zero-shot record: the metric names the window length."""
    return {"model": model_name, "task": result.dataset, "metric": f"ppl@{result.seq_len}", "value": result.ppl,
            "limit": result.windows}


def eval_records(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    model_name: str,
    *,
    datasets: Sequence[str] = (),
    tasks: Sequence[str] = (),
    seq_len: int = 128,
    max_windows: int | None = None,
    limit: int | None = None,
    batch_size: int | None = None,
    data_dir: str | None = None,
    resume: str | None = None,
) -> list[Record]:
    """Perplexity on `datasets`, then zero-shot accuracy on `tasks` (lm-eval), one record each;
    `resume`: the folder of scored windows and answered requests (`perplexity`, `zero_shot`)."""
    from gapprune.evaluate.perplexity import evaluate_ppl

    records = [ppl_record(model_name, evaluate_ppl(model, tokenizer, dataset, seq_len=seq_len, max_windows=max_windows,
                                                   data_dir=data_dir, resume=resume)) for dataset in datasets]
    if tasks:
        from gapprune.evaluate.zeroshot import zero_shot

        rows = zero_shot(model, tokenizer, list(tasks), data_directory=data_dir, limit=limit, batch_size=batch_size,
                         resume=resume)
        records += [{"model": model_name, **row} for row in rows]
    return records


def eval_table(records: Sequence[Record]) -> str:
    """A markdown table of evaluation records, one row each."""
    lines = ["| task | metric | value | limit |", "|---|---|---|---|"]
    lines += [f"| {r['task']} | {r['metric']} | {r['value']:.4f} | {r['limit']} |" for r in records]
    return "\n".join(lines)


def speed_records(
    models: Sequence[str],
    load: Callable[[str], PreTrainedModel],
    *,
    batches: Sequence[int] = (1, 16),
    prompt_tokens: int = 512,
    new_tokens: int = 32,
    repeats: int = 3,
    dense: str | None = None,
) -> list[Record]:
    """Speed of each model at each batch size, loaded one at a time; speedups against `dense` when given.

    `load(spec)` returns the model (the caller picks the device); `dense` must be one of `models`.
    """
    records: list[Record] = []
    for spec in models:
        model = load(spec)
        for batch in batches:
            result = measure_speed(model, batch=batch, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                                   repeats=repeats)
            records.append({"model": spec, **result.to_record()})
        del model
    return with_speedups(records, dense) if dense is not None else records


def with_speedups(records: Sequence[Record], dense: str) -> list[Record]:
    """Each record with decode, prefill and ideal (parameter-ratio) speedups over `dense` at the same batch."""
    by = {(r["model"], r["batch"]): r for r in records}
    out = []
    for r in records:
        base = by.get((dense, r["batch"]))
        if base is None:
            raise ValueError(f"no speed record of the dense model {dense!r} at batch {r['batch']}")
        out.append({**r, "speedup": round(r["decode_tokens_per_s"] / base["decode_tokens_per_s"], 3),
                    "prefill_speedup": round(base["prefill_ms"] / r["prefill_ms"], 3),
                    "ideal_speedup": round(base["params"] / r["params"], 3)})
    return out


def speed_line(record: Record) -> str:
    """One line per speed record, for the terminal."""
    extra = f"  speedup {record['speedup']:.2f}x (ideal {record['ideal_speedup']:.2f}x)" if "speedup" in record else ""
    return (f"{record['model']} batch {record['batch']}: prefill {record['prefill_ms']:.0f} ms, decode "
            f"{record['decode_tokens_per_s']:.1f} tok/s, {record['params']:,} params, "
            f"weights {record['weights_mb']:.0f} MB{extra}")
