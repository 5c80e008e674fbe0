"""docs/results.md sections for other model families, data-free calibration and recovery from the
best one-shot setting (records of families.py, calib_self.py and recovery_best.py)."""

from __future__ import annotations

from settings import ALLOCATORS

TASKS = ["boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa"]


def fmt_ppl(value: float) -> str:
    return f"{value:.1f}" if value < 1e4 else f"{value:.2e}"


def zeroshot_rows(rows: dict[str, dict[str, dict]], dense: str) -> list[str]:
    """A markdown table: per stage the 7 accuracies, the mean, the mean without BoolQ, both as % of `dense`."""
    def means(cells: dict[str, dict]) -> tuple[float, float]:
        values = {t: 100 * cells[t]["value"] for t in TASKS if t in cells}
        return sum(values.values()) / len(values), sum(v for t, v in values.items() if t != "boolq") / (len(values) - 1)

    base = means(rows[dense]) if dense in rows else None
    lines = ["| model | " + " | ".join(TASKS) + " | mean | mean w/o BoolQ |", "|---|" + "---|" * (len(TASKS) + 2)]
    for stage, cells in rows.items():
        if set(cells) != set(TASKS):
            continue
        mean, six = means(cells)
        kept = f" ({100 * mean / base[0]:.1f}%)" if base and stage != dense else ""
        kept_six = f" ({100 * six / base[1]:.1f}%)" if base and stage != dense else ""
        lines.append(f"| {stage} | " + " | ".join(f"{100 * cells[t]['value']:.1f}" for t in TASKS)
                     + f" | {mean:.1f}{kept} | {six:.1f}{kept_six} |")
    return lines


def families_section(ppl: list[dict], extra: list[dict]) -> list[str]:
    models = [m for m in dict.fromkeys(r.get("model") for r in ppl) if m and m != "smollm2-135m"]
    lines = ["## Other families: Gemma-3-270M and Qwen2.5-Coder-0.5B", ""]
    for model in models:
        rows = [r for r in ppl if r.get("model") == model and r.get("profiler") == "auto" and r.get("kind") == "ppl"]
        if not rows:
            continue
        notes = [r for r in extra if r.get("model") == model]
        meta = next((r for r in rows if r["allocator"] != "dense" and r.get("ratio_of") == "decoder"), None)
        if meta is None:
            continue
        windows = meta["windows"]
        lines += [f"### `{model}`", "",
                  f"Machine: {meta['machine']}; date {meta['date']}. Command: `{meta['command']}`. Benchmark calibration "
                  "(32 windows x 128 tokens of WikiText-2 validation, ΔL on the first 4), criterion `activation`, auto "
                  f"profiler, one table grown ratio by ratio. Perplexity: first {windows} windows of 128 tokens of the "
                  f"test splits{' (BOS + 127 text tokens per window)' if meta.get('bos') else ''}. Cells: WikiText-2 / "
                  "PTB; GAP and the baselines without compensation, `gap + lsq` with the default sequential lsq. "
                  "The decoder-ratio runs shared the two cores with another benchmark (one thread each; `machine` in "
                  "the records)."
                  + (" The whole-model 25% row ran first, alone on two threads, and stopped at 50%, which this model "
                     "cannot reach (`--ratio-of`)." if any(r.get("ratio_of") == "model" and r["allocator"] != "dense"
                                                         for r in rows) else ""), ""]
        dense = {r["dataset"]: r["ppl"] for r in rows if r["allocator"] == "dense"}
        if dense:
            lines += [f"Dense: {dense.get('wikitext2', float('nan')):.2f} / {dense.get('ptb', float('nan')):.2f}.", ""]
        for ratio_of in ("decoder", "model"):
            cells = {(r["allocator"], r["compensate"], r["target_ratio"], r["dataset"]): r for r in rows
                     if r.get("ratio_of", "model") == ratio_of and r["allocator"] != "dense"}
            ratios = sorted({key[2] for key in cells})
            if not ratios:
                continue
            lines += [f"Ratios as fractions of the {'decoder layers' if ratio_of == 'decoder' else 'whole model'}:", "",
                      "| ratio | of the model | " + " | ".join(ALLOCATORS) + " | GAP vs best baseline (WikiText-2 / PTB) "
                      "| gap + lsq |", "|---|---|" + "---|" * (len(ALLOCATORS) + 2)]
            for ratio in ratios:
                def cell(allocator: str, compensate: str = "none") -> str:
                    w, p = (cells.get((allocator, compensate, ratio, d)) for d in ("wikitext2", "ptb"))
                    return f"{fmt_ppl(w['ppl'])} / {fmt_ppl(p['ppl'])}" if w and p else "–"

                gains = []
                for d in ("wikitext2", "ptb"):
                    gap = cells.get(("gap", "none", ratio, d))
                    base = [cells[(a, "none", ratio, d)]["ppl"] for a in ALLOCATORS[1:] if (a, "none", ratio, d) in cells]
                    gains.append(f"{100 * (gap['ppl'] / min(base) - 1):+.1f}%" if gap and base else "–")
                achieved = cells.get(("gap", "none", ratio, "wikitext2"), {}).get("achieved_ratio", float("nan"))
                lines.append(f"| {100 * ratio:.1f}% | {100 * achieved:.1f}% | " + " | ".join(cell(a) for a in ALLOCATORS)
                             + f" | {' / '.join(gains)} | {cell('gap', 'lsq')} |")
            lines.append("")
        phases = [r for r in notes if r["kind"] == "phase" and r.get("ratio_of", "model") == "decoder"]
        if phases:
            lines += ["Profiling (auto): " + "; ".join(
                f"{r['phase']}" + (f" at {100 * r['target_ratio']:.0f}%" if "target_ratio" in r else "")
                + f" {r['wall_s']:.0f} s" + (f" ({r['exact_entries']} exact entries)" if "exact_entries" in r else "")
                for r in phases) + ".", ""]
        checks = [r for r in notes if r["kind"] == "auto_vs_exact"]
        if checks:
            lines += [f"Auto vs exact (`--exact-check`, {checks[0]['machine']}): the exact table measured all "
                      f"{checks[0]['exact_entries']} entries in {checks[0]['exact_table_s']:.0f} s; auto had measured "
                      f"{checks[0]['auto_exact_entries']} of them exactly after its 128-token screen. Summed exact ΔL of "
                      "auto's GAP plan over the exact optimum: " + ", ".join(
                          f"{100 * (r['auto_plan_exact_loss'] / r['exact_plan_exact_loss'] - 1):+.2f}% at "
                          f"{100 * r['target_ratio']:.0f}%" + (" (same plan)" if r["same_plan"] else "")
                          for r in checks) + ".", ""]
        for r in notes:
            if r["kind"] == "reload":
                checks = "; ".join(f"`{way}`: logits {'identical' if c['identical_logits'] else 'DIFFERENT'}, greedy "
                                   f"tokens {'identical' if c['identical_greedy_tokens'] else 'DIFFERENT'}"
                                   for way, c in r["reload"].items())
                lines += [f"Reload of the saved GAP {100 * r['target_ratio']:.0f}% (of the {r.get('ratio_of', 'model')}) "
                          f"`lsq` folder against the in-memory model: {checks}.", ""]
        shots: dict[str, dict[str, dict]] = {}
        for r in notes:
            if r["kind"] == "zeroshot":
                shots.setdefault(r["stage"], {})[r["task"]] = r
        if shots:
            limit = next(iter(next(iter(shots.values())).values()))["limit"]
            lines += [f"Zero-shot accuracy (lm-evaluation-harness, first {limit} examples per task; the standard error "
                      f"of a cell is up to ±{50 / limit ** 0.5:.0f} points):", ""]
            lines += zeroshot_rows(shots, "dense") + [""]
    return lines


def calib_section(records: list[dict]) -> list[str]:
    records = [r for r in records if r.get("kind") == "calib"]
    if not records:
        return []
    meta = records[0]
    cells = {(r["calib"], r.get("fit", r["calib"]), r["dataset"]): r["ppl"] for r in records}
    lines = ["## Data-free calibration (`--calib self`) vs WikiText-2 calibration", "",
             f"Machine: {meta['machine']}; date {meta['date']}. Command: `{meta['command']}` (the crossed rows with "
             f"`--swap`). SmolLM2-135M, GAP at {100 * meta['ratio']:.0f}%, auto profiler, obs, sequential lsq, 32 "
             "windows x 128 tokens (ΔL on the first 4); only the calibration text differs: the plan's (scores, loss "
             "table) and the one lsq is fitted on. Perplexity on the first 256 windows of 128 tokens.", "",
             "| plan from | lsq fitted on | WikiText-2 | PTB | vs WikiText-2 for both |", "|---|---|---|---|---|"]
    ref = (cells.get(("wikitext2", "wikitext2", "wikitext2")), cells.get(("wikitext2", "wikitext2", "ptb")))
    for calib, fit in dict.fromkeys((r["calib"], r.get("fit", r["calib"])) for r in records):
        w, p = cells.get((calib, fit, "wikitext2")), cells.get((calib, fit, "ptb"))
        if w is None or p is None:
            continue
        same = calib == fit == "wikitext2"
        vs = f"{100 * (w / ref[0] - 1):+.1f}% / {100 * (p / ref[1] - 1):+.1f}%" if all(ref) and not same else ""
        lines.append(f"| {calib} | {fit} | {w:.2f} | {p:.2f} | {vs} |")
    return lines + [""]


def recovery_best_section(records: list[dict]) -> list[str]:
    ppl = [r for r in records if r.get("kind") == "methods" and r["method"].startswith("obs+sequential")
           and "lora" in r["method"]]
    shots: dict[str, dict[str, dict]] = {}
    for r in records:
        if r.get("kind") == "zeroshot":
            shots.setdefault(r["method"], {})[r["task"]] = r
    if not ppl and not shots:
        return []
    meta = (ppl or [next(iter(next(iter(shots.values())).values()))])[0]
    lines = ["## Recovery from the best one-shot setting (obs + sequential lsq, then LoRA)", "",
             f"Machine: {meta['machine']}; date {meta['date']}. Command: `{meta['command']}`. SmolLM2-135M, GAP at 25% "
             "(auto profiler, benchmark calibration, obs, sequential lsq), then LoRA on Alpaca."]
    lora = next((r for r in ppl if r.get("lora_steps")), None)
    if lora:
        lines[-1] += (f" LoRA: {lora['lora_steps']} steps x {lora['lora_batch']} examples ({lora['lora_examples']} "
                      f"examples, cutoff {lora['cutoff']}, rank {lora['rank']}, lr {lora['lr']}), float32 on the CPU, "
                      f"{lora['wall_s']:.0f} s; validation loss by step: "
                      + ", ".join(f"{s}: {v:.3f}" for s, v in lora["val_loss"]) + ".")
    lines += [""]
    if ppl:
        lines += ["| stage | WikiText-2 | PTB |", "|---|---|---|"]
        by = {(r["method"], r["dataset"]): r["ppl"] for r in records
              if r.get("kind") == "methods" and r["ratio"] == ppl[0]["ratio"] and r.get("calib_samples", 32) == 32}
        for method in ("obs+sequential", "obs+sequential+lora"):
            if (method, "wikitext2") in by and (method, "ptb") in by:
                lines.append(f"| {method} | {by[(method, 'wikitext2')]:.2f} | {by[(method, 'ptb')]:.2f} |")
        lines.append("")
    if shots:
        limit = next(iter(shots.get("dense", next(iter(shots.values()))).values()))["limit"]
        lines += [f"Zero-shot accuracy, first {limit} examples per task (the dense row is the 2026-11-29 measurement "
                  "at the same limit, `docs/results/eval.json`); in brackets the share of the dense score:", ""]
        lines += zeroshot_rows(shots, "dense") + [""]
    return lines
