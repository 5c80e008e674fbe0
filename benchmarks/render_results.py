"""Render docs/results.md (tables) and docs/results/allocators_ppl.png from the JSON records.

    python benchmarks/render_results.py
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from render_reach import calib_section, families_section, recovery_best_section
from settings import ALLOCATOR_WINDOWS, ALLOCATORS

RESULTS = Path("docs/results")


def load(name: str) -> list[dict]:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else []


def dense_section(records: list[dict]) -> list[str]:
    if not records:
        return []
    lines = [
        "## Dense SmolLM2-135M perplexity (full test splits)", "",
        f"Machine: {records[0]['machine']}; date {records[0]['date']}. Command: "
        "`python benchmarks/dense_ppl.py --data-dir ../shared/data --datasets D --seq-lens T --out docs/results/dense.json` "
        "(rows joined with blank lines, tokenised once without BOS, non-overlapping windows). "
        "Wall times were taken while other benchmark jobs shared the two cores, so they overstate the cost "
        "on an idle machine.", "",
        "| dataset | split | seq_len | windows | tokens | ppl | wall (s) |", "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['dataset']} | {r['split']} | {r['seq_len']} | {r['windows']} | {r['tokens']:,} | {r['ppl']:.3f} | "
              f"{r['wall_s']:.0f} |" for r in records]
    return lines + [""]


def allocator_section(records: list[dict]) -> list[str]:
    records = [r for r in records if r.get("model", "smollm2-135m") == "smollm2-135m"]  # others: render_reach
    ppl = [r for r in records if r.get("kind") == "ppl"]
    if not ppl:
        return []
    meta = ppl[0]
    lines = [
        "## Allocators on SmolLM2-135M (same loss table, criterion `activation`, no compensation)", "",
        f"Machine: {meta['machine']}; date {meta['date']}. Command: `{meta['command']}`. Calibration: 32 windows x 128 "
        "tokens of WikiText-2 *validation* (statistics), the first 4 of them (512 tokens) for the KL loss table; "
        "MLP options every 48 channels, every 4th replayed and the rest interpolated. One loss table serves all ratios.", "",
    ]
    phases = [r for r in records if r.get("kind") == "phase" and "allocator" not in r]
    if phases:
        lines += ["Phase times of the shared profile: " + ", ".join(f"{r['phase']} {r['wall_s']:.1f} s" for r in phases)
                  + "; per allocator and ratio the DP/allocation and surgery times are in `allocators.json`.", ""]
    cells: dict[tuple, dict] = {}
    for r in ppl:
        cells[(r["allocator"], r["target_ratio"], r["dataset"], r["seq_len"], r["windows"])] = r
    for dataset, seq_len, windows, _ in ALLOCATOR_WINDOWS:
        dense = cells.get(("dense", 0.0, dataset, seq_len, windows))
        lines += [f"### {dataset} test, first {windows} windows of {seq_len} tokens"
                  + (f" (dense: {dense['ppl']:.2f})" if dense else ""), "",
                  "| ratio | " + " | ".join(ALLOCATORS) + " | GAP vs best baseline |",
                  "|---|" + "---|" * (len(ALLOCATORS) + 1)]
        for ratio in sorted({r["target_ratio"] for r in ppl if r["target_ratio"]}):
            row = [cells.get((a, ratio, dataset, seq_len, windows)) for a in ALLOCATORS]
            values = [f"{c['ppl']:.2f} ({100 * c['achieved_ratio']:.1f}%)" if c else "–" for c in row]
            base = [c["ppl"] for a, c in zip(ALLOCATORS, row) if c and a != "gap"]
            delta = f"{100 * (row[0]['ppl'] / min(base) - 1):+.1f}%" if row[0] and base else "–"
            lines.append(f"| {100 * ratio:.1f}% | " + " | ".join(values) + f" | {delta} |")
        lines.append("")
    full = [r for r in ppl if r["windows"] > 1000]
    if full:
        lines += ["### Full WikiText-2 test at 128 tokens, 25%", "", "| allocator | windows | ppl |", "|---|---|---|"]
        lines += [f"| {r['allocator']} | {r['windows']} | {r['ppl']:.3f} |" for r in full] + [""]
    lines += ["Cells give perplexity and, in brackets, the achieved reduction of all parameters (embeddings included).",
              "", "![perplexity vs ratio](results/allocators_ppl.png)", ""]
    plot(ppl)
    return lines


def plot(ppl: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in ppl:
        if r["dataset"] == "wikitext2" and r["seq_len"] == 128 and r["windows"] == 256 and r["allocator"] != "dense":
            series[r["allocator"]].append((r["target_ratio"], r["ppl"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ALLOCATORS:
        if series[name]:
            xs, ys = zip(*sorted(series[name]))
            ax.plot([100 * x for x in xs], ys, marker="o", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("parameters removed (% of the model)")
    ax.set_ylabel("WikiText-2 perplexity (T=128, 256 windows)")
    ax.set_title("SmolLM2-135M: allocators, same criterion and data")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "allocators_ppl.png", dpi=120)
    plt.close(fig)


def recovery_section(records: list[dict]) -> list[str]:
    records = [r for r in records if "stage" in r]
    if not records:
        return []
    meta = records[0]
    cells = {(r["ratio"], r["stage"], r["dataset"]): r for r in records}
    loras = {r["ratio"]: r for r in records if r["stage"] == "lora"}
    lora = next(iter(loras.values()), None)
    lines = [
        "## Recovery: compensation and LoRA (GAP, SmolLM2-135M)", "",
        f"Machine: {meta['machine']}; date {meta['date']}. Command: `{meta['command']}`. One loss table (the "
        "allocator benchmark's), Gram statistics from 32 windows x 128 tokens of WikiText-2 validation (even batches "
        "fit, odd batches check). Perplexity on the first 256 windows of 128 tokens of each test split.", "",
    ]
    if lora:
        lines += [f"LoRA: `gapprune tune` settings through the API on the `lsq` model, {lora['lora_steps']} steps x "
                  f"{lora['lora_batch']} Alpaca examples ({lora['lora_examples']} examples, cutoff {lora['cutoff']}, "
                  f"rank {lora['rank']}, lr {lora['lr']}), float32 on the CPU; validation loss (32 held-out examples) "
                  "by step: " + "; ".join(f"{100 * ratio:.0f}%: " + ", ".join(f"{s}: {v:.3f}" for s, v in r["val_loss"])
                                          for ratio, r in loras.items()) + ". The `none` and `bias` rows were measured "
                  "in the same script's first run; `lsq` and `lora` after `lsq` gained its bias term and ridge 1.0 "
                  "(the rows it replaced are in the commit history).", ""]
    for r in records:
        if r["stage"] == "reload":
            checks = "; ".join(f"`{way}`: logits {'identical' if c['identical_logits'] else 'DIFFERENT'}, greedy tokens "
                               f"{'identical' if c['identical_greedy_tokens'] else 'DIFFERENT'}" for way, c in r["reload"].items())
            lines += [f"Reload check of the saved {100 * r['ratio']:.0f}% `lsq` folder against the in-memory model: {checks}.", ""]
    lines += ["| ratio | stage | WikiText-2 | PTB | stage wall (s) |", "|---|---|---|---|---|"]
    for ratio in sorted({r["ratio"] for r in records if r["stage"] != "reload"}):
        for stage in ("dense", "none", "lsq", "bias", "lora"):
            w, p = cells.get((ratio, stage, "wikitext2")), cells.get((ratio, stage, "ptb"))
            if w or p:
                wall = (w or p).get("wall_s")
                lines.append(f"| {100 * ratio:.0f}% | {stage} | {w['ppl']:.2f} | {p['ppl']:.2f} | "
                             f"{'' if wall is None else f'{wall:.1f}'} |")
    return lines + [""]


def methods_section(records: list[dict]) -> list[str]:
    records = [r for r in records if r.get("kind") == "methods" and "exact_entries" in r]  # recovery_best: render_reach
    if not records:
        return []
    records = [{**r, "method": r["method"] + (f", {r['calib_samples']} calibration windows"
                                              if r.get("calib_samples", 32) != 32 else "")} for r in records]
    meta = records[0]
    cells = {(r["ratio"], r["method"], r["dataset"]): r for r in records}
    methods = list(dict.fromkeys(r["method"] for r in records))
    lines = [
        "## Lower loss at the same size: compensation-aware table, OBS, sequential compensation", "",
        f"Machine: {meta['machine']}; date {meta['date']}. Command: `{meta['command']}`. GAP plans from the auto "
        "profiler on the benchmark calibration (ΔL on 4 windows x 128 tokens, statistics and Grams on 32); `none` "
        "saves without compensation, every other row with `lsq` (ridge 1.0). `aware`: the loss table measured with "
        "each option compensated as saved; `obs`: units chosen by greedy structured OBS; `sequential`: lsq fitted "
        "layer by layer on the pruned model's own inputs. Perplexity on the first 256 windows of 128 tokens. "
        "`aware, in-sample`: the first version, whose table refitted each option on the Gram half that holds "
        "the profiling windows; `aware` refits on the other half.", "",
        "| ratio | method | WikiText-2 | PTB | exact ΔL entries | compensation (s, machine shared with other jobs) |",
        "|---|---|---|---|---|---|",
    ]
    for ratio in sorted({r["ratio"] for r in records}):
        for method in methods:
            w, p = cells.get((ratio, method, "wikitext2")), cells.get((ratio, method, "ptb"))
            if w and p:
                lines.append(f"| {100 * ratio:.0f}% | {method} | {w['ppl']:.2f} | {p['ppl']:.2f} | {w['exact_entries']} | "
                             f"{w['compensation_s']:.1f} |")
    return lines + [""]


def compensation_section(records: list[dict]) -> list[str]:
    if not records:
        return []
    meta = records[0]
    cells = {(r["ratio"], r["method"], r["ridge"], r["dataset"]): r for r in records}
    variants = list(dict.fromkeys((r["method"], r["ridge"]) for r in records))
    lines = [
        "### Choosing the `lsq` ridge (validation splits)", "",
        f"Command: `{meta['command']}` ({meta['date']}). Perplexity on the first {meta['windows']} windows of 128 "
        "tokens of the *validation* splits; `applied` = components whose held-out reconstruction error the "
        "compensation lowered (the others keep their weights).", "",
        "| ratio | compensation | WikiText-2 val | PTB val | applied / kept original |", "|---|---|---|---|---|",
    ]
    for ratio in sorted({r["ratio"] for r in records}):
        for method, ridge in variants:
            w, p = cells.get((ratio, method, ridge, "wikitext2")), cells.get((ratio, method, ridge, "ptb"))
            if w and p:
                name = f"lsq, ridge {ridge:g}" if method == "lsq" else method
                applied = "" if w["applied"] is None else f"{w['applied']} / {w['kept_original']}"
                lines.append(f"| {100 * ratio:.0f}% | {name} | {w['ppl']:.2f} | {p['ppl']:.2f} | {applied} |")
    return lines + [""]


TASKS = ["boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa"]


def eval_section(records: list[dict]) -> list[str]:
    if not records:
        return []
    meta = records[0]
    models = list(dict.fromkeys(r["model"] for r in records))
    cells = {(r["model"], r["task"]): r for r in records}
    metric = {r["task"]: r["metric"] for r in records}
    lines = [
        "## Zero-shot accuracy (lm-evaluation-harness, local task files)", "",
        f"Machine: {meta['machine']}; date {meta['date']}. Command per model: `{meta['command']}` with the 7 tasks "
        "`boolq,piqa,hellaswag,winogrande,arc_easy,arc_challenge,openbookqa`, then "
        "`python benchmarks/collect_eval.py`. Budget: the first "
        f"{meta['limit']} examples of each task's evaluation split (lm-eval `--limit`, deterministic), not the full "
        f"sets, to fit the 2-core CPU; the standard error of each cell is at most ±{50 / meta['limit'] ** 0.5:.1f} points. Pruned models: GAP with "
        "the default `lsq` compensation, saved and reloaded from their folders.", "",
        "| model | ratio | " + " | ".join(f"{t} ({metric.get(t, '')})" for t in TASKS) + " | mean |",
        "|---|---|" + "---|" * (len(TASKS) + 1),
    ]
    for m in models:
        row = [cells.get((m, t)) for t in TASKS]
        values = [100 * c["value"] for c in row if c]
        mean = sum(values) / len(values) if values else float("nan")
        ratio = next(c["ratio"] for c in row if c)
        lines.append(f"| `{m}` | {100 * ratio:.1f}% | " + " | ".join(f"{100 * c['value']:.1f}" if c else "–" for c in row)
                     + f" | {mean:.1f} |")
    return lines + [""]


def bench_section(records: list[dict]) -> list[str]:
    if not records:
        return []
    meta = records[0]
    lines = [
        "## Speed and memory (`gapprune bench --vs`)", "",
        f"Machine: {meta['machine']}; date {meta['date']}. Prompt 512 tokens (prefill), then 32 decoded tokens with "
        "the KV cache; 1 warm-up and 5 timed repetitions, median (min–max). Ideal speedup = dense parameters / "
        "pruned parameters (every weight read once per token). Peak memory is the process's peak RSS on the CPU. "
        "Commands in `bench.json`.", "",
        "| model | ratio | batch | prefill ms | decode tok/s | params | weights MB | peak RSS MB | decode speedup "
        "| prefill speedup | ideal |", "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "speedup" not in r or r["ratio"] == 0:
            continue
        lines.append(
            f"| `{r['model']}` | {100 * r['ratio']:.1f}% | {r['batch']} | {r['prefill_ms']:.0f} "
            f"({r['prefill_ms_min']:.0f}–{r['prefill_ms_max']:.0f}) | {r['decode_tokens_per_s']:.1f} "
            f"({r['decode_tokens_per_s_min']:.1f}–{r['decode_tokens_per_s_max']:.1f}) | {r['params']:,} | "
            f"{r['weights_mb']:.0f} | {r['peak_mem_mb']:.0f} | {r['speedup']:.2f}x | {r['prefill_speedup']:.2f}x | "
            f"{r['ideal_speedup']:.2f}x |")
    dense = [r for r in records if r["ratio"] == 0]
    lines += ["", "Dense reference runs (one per comparison): " + "; ".join(
        f"batch {r['batch']}: prefill {r['prefill_ms']:.0f} ms, decode {r['decode_tokens_per_s']:.1f} tok/s"
        for r in dense) + ". The dense model runs second in each process, so its peak RSS "
        f"({max(r['peak_mem_mb'] for r in dense):.0f} MB) is the process maximum, not its own.", ""]
    return lines


def main() -> None:
    lines = ["# Results", "", "Every number here was measured by the command given with it; JSON records in `docs/results/`.", ""]
    lines += dense_section(load("dense.json"))
    lines += allocator_section(load("allocators.json"))
    lines += recovery_section(load("recovery.json"))
    lines += methods_section(load("recovery.json"))
    lines += recovery_best_section(load("recovery.json"))
    lines += calib_section(load("recovery.json"))
    lines += families_section(load("allocators.json"), load("families.json"))
    lines += compensation_section(load("compensation.json"))
    lines += eval_section(load("eval.json"))
    lines += bench_section(load("bench.json"))
    lines += ["## Profiling cost, Fisher profiler, calibration size", "",
              "See [performance.md](performance.md).", ""]
    extra = Path("docs/results_notes.md")
    if extra.exists():
        lines += [extra.read_text()]
    Path("docs/results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
