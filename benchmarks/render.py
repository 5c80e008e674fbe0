"""Render docs/results.md (tables, linking docs/results_notes.md for their readings) and docs/results/allocators_ppl.png from
the JSON records in docs/results/ that running studies still write; the tables of finished studies are
text in docs/results_finished.md.

    python benchmarks/render.py
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from common import ALLOCATOR_WINDOWS, ALLOCATORS, TASKS

RESULTS = Path("docs/results")


def load(name: str) -> list[dict]:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else []


def reload_text(r: dict) -> str:
    """A reload-check record: per way of loading, whether logits and greedy tokens are identical."""
    return "; ".join(f"`{way}`: logits {'identical' if c['identical_logits'] else 'DIFFERENT'}, greedy tokens "
                     f"{'identical' if c['identical_greedy_tokens'] else 'DIFFERENT'}" for way, c in r["reload"].items())


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
    # WikiText-2 calibration and WikiText-2 / PTB evaluation: the C4 study has its own table
    ppl = [r for r in ppl if r.get("calibration") in (None, "wikitext2") and r.get("dataset") != "c4"]
    models = [m for m in dict.fromkeys(r.get("model") for r in ppl) if m]
    lines = ["## Per model: Gemma-3-270M, Qwen2.5-Coder-0.5B and -1.5B, and SmolLM2-135M at the CLI's defaults", ""]
    for model in models:
        rows = [r for r in ppl if r.get("model") == model and r.get("profiler") == "auto" and r.get("kind") == "ppl"]
        if not rows:
            continue
        notes = [r for r in extra if r.get("model") == model]
        pruned = [r for r in rows if r["allocator"] != "dense"]
        meta = next((r for r in pruned if r.get("ratio_of") == "decoder"), pruned[0] if pruned else None)
        if meta is None:
            continue
        both_ratio_ofs = len({r.get("ratio_of", "model") for r in pruned}) > 1
        windows = meta["windows"]
        lines += [f"### `{model}`", "",
                  f"Machine: {meta['machine']}; date {meta['date']}. Command: `{meta['command']}`. "
                  + ("The CLI's default settings" if "--defaults" in meta["command"] else "Benchmark calibration")
                  + f" ({meta.get('calib_samples', 32)} windows x 128 tokens of WikiText-2 validation, ΔL on the first "
                  f"{meta.get('profile_samples', 4)}), criterion `{meta.get('criterion', 'activation')}`, auto "
                  f"profiler, one table grown ratio by ratio. Perplexity: first {windows} windows of 128 tokens of the "
                  f"test splits{' (BOS + 127 text tokens per window)' if meta.get('bos') else ''}. Cells: WikiText-2 / "
                  "PTB; GAP and the baselines without compensation, `gap + lsq` with the default sequential lsq. "
                  + ("Under `obs` the units' scores are their removal ranks, the same in every layer, so `global` "
                     "is `uniform` by construction. " if meta.get("criterion") == "obs" else "")
                  + f"Runs on {' or '.join(sorted({r['machine'] for r in rows if not baseline_plus(r)}))}; other jobs shared the two cores for "
                  "parts of them (times in the records overstate the cost)."
                  + (" The whole-model 25% row ran first, alone on two threads, and stopped at 50%, which this model "
                     "cannot reach (`--ratio-of`)." if both_ratio_ofs else ""), ""]
        dense = {r["dataset"]: r["ppl"] for r in rows if r["allocator"] == "dense"}
        if dense:
            lines += [f"Dense: {dense.get('wikitext2', float('nan')):.2f} / {dense.get('ptb', float('nan')):.2f}.", ""]
        calibs = dict.fromkeys(r.get("calib", DEFAULT_CALIB) for r in rows if r["allocator"] != "dense")
        for calib, ratio_of in [(c, of) for c in calibs for of in ("decoder", "model")]:
            cells = {(r["allocator"], r["compensate"], r["target_ratio"], r["dataset"]): r for r in rows
                     if r.get("ratio_of", "model") == ratio_of and r["allocator"] != "dense"
                     and r.get("calib", DEFAULT_CALIB) == calib}
            ratios = sorted({key[2] for key in cells})
            if not ratios:
                continue
            if calib != DEFAULT_CALIB:
                first = next(iter(cells.values()))
                lines += [(f"Calibrated on `--calib {calib}` instead (validation splits, equal parts interleaved; "
                           f"{first['date']}, {first['machine']}; command: `{first['command']}`), every allocator "
                           "and its OBS unit choice alike:"), ""]
            lines += [f"Ratios as fractions of the {'decoder layers' if ratio_of == 'decoder' else 'whole model'}:", "",
                      "| ratio | of the model | " + " | ".join(ALLOCATORS) + " | GAP vs best baseline (WikiText-2 / PTB) "
                      "| gap + lsq |", "|---|---|" + "---|" * (len(ALLOCATORS) + 2)]
            for ratio in ratios:
                def cell(allocator: str, compensate: str = "none", cells: dict = cells, ratio: float = ratio) -> str:
                    w, p = (cells.get((allocator, compensate, ratio, d)) for d in ("wikitext2", "ptb"))
                    return f"{fmt_ppl(w['ppl'])} / {fmt_ppl(p['ppl'])}" if w and p else "–"

                achieved = cells.get(("gap", "none", ratio, "wikitext2"), {}).get("achieved_ratio", float("nan"))
                lines.append(f"| {100 * ratio:.1f}% | {100 * achieved:.1f}% | " + " | ".join(cell(a) for a in ALLOCATORS)
                             + f" | {gap_change(cells, 'none', ratio, ALLOCATORS[1:])} | {cell('gap', 'lsq')} |")
            lines.append("")
            compensated = sorted({(key[0], key[2]) for key in cells if key[1] == "lsq" and key[0] != "gap"},
                                 key=lambda pair: (pair[1], ALLOCATORS.index(pair[0])))
            if compensated:
                sources = dict.fromkeys((r["date"], r["machine"], r["command"]) for r in cells.values() if baseline_plus(r))
                lines += [("The default compensation (sequential lsq) after a baseline's allocation too, at the CLI's "
                           "defaults otherwise (" + "; ".join(f"{d}, {m}; command: `{c}`" for d, m, c in sources) + "):"), "",
                          "| ratio | allocator + lsq | WikiText-2 / PTB | gap + lsq | GAP + lsq vs it |", "|---|---|---|---|---|"]
                for allocator, ratio in compensated:
                    lines.append(f"| {100 * ratio:.1f}% | {allocator} | {cell(allocator, 'lsq', ratio=ratio)} | "
                                 f"{cell('gap', 'lsq', ratio=ratio)} | {gap_change(cells, 'lsq', ratio, [allocator])} |")
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
            if r["kind"] == "prune_run":
                phases = ", ".join(f"{name} {sec / 60:.1f} min" for name, sec in r["phases"].items() if sec >= 30)
                lines += [(f"Default CLI prune at {100 * r['ratio']:.0f}% of the {r['ratio_of']} ({r['date']}, {r['machine']}): "
                          f"{r['wall_s'] / 60:.1f} min ({phases}), peak RSS {r['peak_rss_mb']:,.0f} MB for "
                          f"{r['weights_mb']:,.0f} MB of {r['dtype']} weights. Code: {r.get('code', 'as committed that day')}. "
                          f"Command: `{r['command']}`."), ""]
        for r in notes:
            if r["kind"] == "reload":
                calibrated = f", calibrated on `{r['calib']}`," if "calib" in r else ""
                lines += [(f"Reload of the saved GAP {100 * r['target_ratio']:.0f}% (of the {r.get('ratio_of', 'model')}) "
                          f"`lsq` folder{calibrated} against the in-memory model: {reload_text(r)}."), ""]
        shots: dict[str, dict[str, dict]] = {}
        for r in notes:
            if r["kind"] == "zeroshot":
                shots.setdefault(r["stage"], {})[r["task"]] = r
        if shots:
            limit = next(iter(next(iter(shots.values())).values()))["limit"]
            lines += [(f"Zero-shot accuracy (lm-evaluation-harness, first {limit} examples per task; the standard error "
                      f"of a cell is up to ±{50 / limit ** 0.5:.0f} points):"), ""]
            lines += zeroshot_rows(shots, "dense") + [""]
    return lines


DEFAULT_CALIB = "wikitext2"  # PruneConfig's calib; records name theirs only when it differs


def baseline_plus(record: dict) -> bool:
    """A baseline allocator's run with compensation (measured apart from the allocator comparison)."""
    return record.get("compensate", "none") != "none" and record.get("allocator") not in ("gap", "dense")


def gap_change(cells: dict, compensate: str, ratio: float, baselines: list[str]) -> str:
    """GAP's perplexity against the best of `baselines` (same compensation), per data set, in percent."""
    out = []
    for d in ("wikitext2", "ptb"):
        gap = cells.get(("gap", compensate, ratio, d))
        base = [cells[(a, compensate, ratio, d)]["ppl"] for a in baselines if (a, compensate, ratio, d) in cells]
        out.append(f"{100 * (gap['ppl'] / min(base) - 1):+.1f}%" if gap and base else "–")
    return " / ".join(out)


def calibration_of(record: dict) -> str:
    """The calibration text of a record (older records: `calib`, else that day's default, WikiText-2)."""
    return str(record.get("calibration") or record.get("calib") or "wikitext2")


def calibration_domain_section(records: list[dict]) -> list[str]:
    """GAP and the baselines (all with lsq) calibrated on C4 and on WikiText-2, on three evaluation texts."""
    models = dict.fromkeys((r["model"], r["windows"], r.get("ratio_of", "model")) for r in records
                           if r.get("kind") == "ppl" and r.get("calibration") == "c4")
    if not models:
        return []
    lines = ["## Calibration text: C4 (web text) against WikiText-2", ""]
    for model, windows, ratio_of in models:
        lines += domain_table(records, model, windows, ratio_of)
    return lines


def domain_table(records: list[dict], model: str, windows: int, ratio_of: str) -> list[str]:
    """One model's table: per ratio and calibration text, each allocator on the three texts, and GAP's margin."""
    def same_run(r: dict) -> bool:
        return (r.get("kind") == "ppl" and r.get("model") == model and r.get("windows") == windows
                and r.get("ratio_of", "model") == ratio_of)

    cells: dict[tuple, dict] = {}
    for r in records:
        if same_run(r) and r.get("compensate") == "lsq" and r.get("criterion") == "obs" and r.get("profiler") == "auto":
            cells[(r["target_ratio"], r["allocator"], calibration_of(r), r["dataset"])] = r
    dense = {r["dataset"]: r["ppl"] for r in records if same_run(r) and r.get("allocator") == "dense"}
    sets = ["wikitext2", "ptb", "c4"]
    c4 = next(r for key, r in cells.items() if key[2] == "c4")
    wt2 = sorted({r["date"] for key, r in cells.items() if key[2] == "wikitext2" and key[3] != "c4"})
    of = "of the model" if ratio_of == "model" else "of the decoder layers"
    name = {"smollm2-135m": "SmolLM2-135M"}.get(model, f"`{model}`")
    labelled = [r for key, r in cells.items() if key[2] == "wikitext2" and r.get("calibration") == "wikitext2"]
    covered = sorted({r["dataset"] for r in labelled}, key=sets.index)
    if labelled and len(covered) == len(sets):  # the WikiText-2 side measured by the same study
        other = f"; the WikiText-2-calibrated rows: `{labelled[0]['command']}` ({labelled[0]['date']}). "
    else:  # older CLI-defaults rows, and the texts they lack measured apart
        apart = (f"; the WikiText-2-calibrated {' and '.join(covered)} cells: `{labelled[0]['command']}` "
                 f"({labelled[0]['date']})" if labelled else "")
        other = f"{apart}. The other WikiText-2-calibrated cells: the CLI-defaults rows of {', '.join(wt2)} in the " \
                "per-model section, same settings. "
    lines = [f"### {name}, ratios {of}", ""]
    lines += [(f"Machine: {c4['machine']}; date {c4['date']}. Command: `{c4['command']}`{other}"
               + (f"{name}, CLI defaults (obs, auto profiler, sequential lsq after every allocation); the calibration "
                  "text decides the unit scores, the loss table and the lsq fit. Perplexity on the first "
                  f"{windows} windows of 128 tokens of each evaluation split (C4: validation documents joined). An "
                  "asterisk marks the text the model was calibrated on. Dense: "
                  + " / ".join(f"{dense.get(d, float('nan')):.2f}" for d in sets) + ".")),
              "", "| removed | allocator | calibrated on | WikiText-2 | PTB | C4 |", "|---|---|---|---|---|---|"]
    for ratio in sorted({k[0] for k in cells if k[2] == "c4"}):  # the ratios the C4 side measured
        for calib in ("c4", "wikitext2"):
            for allocator in ("gap", "uniform", "depth", "owl"):
                row = [cells.get((ratio, allocator, calib, d)) for d in sets]
                if not any(row):
                    continue
                text = [("—" if r is None else f"{r['ppl']:.1f}") + ("*" if d == calib else "") for r, d in zip(row, sets)]
                lines.append(f"| {100 * ratio:.0f}% | {allocator} | {calib} | " + " | ".join(text) + " |")
            gap = [cells.get((ratio, "gap", calib, d)) for d in sets]
            best = [min((cells[(ratio, a, calib, d)]["ppl"] for a in ("uniform", "global", "depth", "owl")
                         if (ratio, a, calib, d) in cells), default=None) for d in sets]
            margin = [("—" if g is None or b is None else f"{100 * (1 - g['ppl'] / b):.0f}%") for g, b in zip(gap, best)]
            lines.append(f"| {100 * ratio:.0f}% | GAP below the best baseline | {calib} | " + " | ".join(margin) + " |")
    return lines + [""]


def protocols_section(records: list[dict]) -> list[str]:
    """Whole test sets under the papers' protocols (`gapprune ppl --protocol`), a row per model and plan."""
    records = [r for r in records if r.get("kind") == "protocol"]
    if not records:
        return []
    columns = [("llm-pruner", "wikitext2", 128), ("llm-pruner", "ptb", 128), ("slicegpt", "wikitext2", 2048)]
    rows: dict[tuple[str, str], dict[tuple, float]] = {}
    for r in sorted(records, key=lambda r: r.get("allocator") != "dense"):  # each model's dense row first
        plan = "dense" if r.get("allocator") == "dense" else \
            f"{r['allocator']} {100 * r['target_ratio']:.0f}% of the {r.get('ratio_of') or 'model'}"
        rows.setdefault((r["model"], plan), {})[(r["protocol"], r["dataset"], r["seq_len"])] = r["ppl"]
    lines = ["## The papers' protocols: whole test sets", "",
             ("`gapprune ppl MODEL --protocol llm-pruner` (LLM-Pruner, FLAP, SlimLLM: WikiText-2 and PTB test sets whole, "
              "windows of 128 tokens) and `--protocol slicegpt` (SliceGPT, ShortGPT, SLEB: WikiText-2 test whole, windows "
              "of 2,048); `python benchmarks/protocols.py` (records in `protocols.json` with their machine, "
              f"{' to '.join(sorted({records[0]['date'], records[-1]['date']}))}). CLI defaults (WikiText-2 calibration, "
              "obs, auto profiler, lsq); — not measured."), "",
             "| model | removed | WikiText-2, 128 | PTB, 128 | WikiText-2, 2048 |", "|---|---|---|---|---|"]
    for (model, plan), cells in sorted(rows.items(), key=lambda item: item[0][0] != records[0]["model"]):
        lines.append(f"| {model} | {plan} | " + " | ".join(f"{cells[c]:.2f}" if c in cells else "—" for c in columns) + " |")
    return lines + [""]


ZEROSHOT_TASKS = ("boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")


def protocol_zeroshot_section(records: list[dict]) -> list[str]:
    """The 7 tasks in full (LLM-Pruner's layout: accuracy per task, then the mean of all seven)."""
    shots = [r for r in records if r.get("kind") == "protocol_zeroshot"]
    if not shots:
        return []
    by_model: dict[tuple, dict[str, float]] = {}
    for r in shots:
        by_model.setdefault((r["method"], r.get("ratio")), {})[r["task"]] = r["value"]
    metric = {r["task"]: r["metric"] for r in shots}  # LLM-Pruner's: acc_norm for HellaSwag, ARC-c, OpenBookQA
    lines = [("The 7 zero-shot tasks in full (no `--limit`; lm-evaluation-harness, each task's metric in its "
             "column; `python benchmarks/protocols.py --zeroshot`, records `protocol_zeroshot` in `protocols.json`, "
             f"{shots[0]['date']}); — not measured:"), "",
             "| model | removed | " + " | ".join(f"{t} ({metric[t]})" if t in metric else t for t in ZEROSHOT_TASKS)
             + " | mean |", "|---|---|" + "---|" * 8]
    for (method, ratio), acc in by_model.items():
        label = f"{method} {100 * ratio:.0f}% of the model" if ratio else method
        mean = f"{100 * sum(acc.values()) / 7:.2f}" if len(acc) == 7 else "—"
        lines.append(f"| {shots[0]['model']} | {label} | " + " | ".join(
            f"{100 * acc[t]:.2f}" if t in acc else "—" for t in ZEROSHOT_TASKS) + f" | {mean} |")
    return lines + [""]


TUNING = {"none": "none (starting point)", "lora": "LoRA, LM loss (`tune`)",
          "distill-lora": "distillation into LoRA (rank 8)", "distill-all": "distillation, all parameters",
          "distill-decoder": "distillation, decoder layers only"}
DEFAULT_LR = {"lora": 1e-4, "distill-lora": 5e-4, "distill-all": 1e-4, "distill-decoder": 1e-4}  # older records lack lr


def tuning_method(record: dict) -> str | None:
    """The method of a `benchmarks/distill.py` record ("lora:alpaca" -> lora; none for its starting point), else None."""
    method = record.get("method", "")
    if method.startswith("none (starting point"):
        return "none"
    name = method.split(":")[0]
    return name if ":" in method and name in TUNING else None


def distill_section(records: list[dict]) -> list[str]:
    """Recovery by tuning time: LoRA vs distillation per ratio and training time, and zero-shot after it."""
    tuned = [r for r in records if r.get("kind") == "methods" and tuning_method(r)]
    ppl = [r for r in tuned if r.get("model", "smollm2-135m") == "smollm2-135m"]
    if not ppl:
        return []
    lines = ["## Recovery by tuning: LoRA vs distillation (SmolLM2-135M; `benchmarks/distill.py`)", "",
             ("Same pruned folder per ratio (`gapprune prune smollm2-135m --ratio R`, defaults); training text Alpaca, "
             "C4 (web text, its train split) or the teacher's own (`self`; no WikiText-2 or PTB text); perplexity on the first 256 windows of 128 tokens. `minutes` is "
             "training time; machine and load per row in `docs/results/recovery.json`."), ""]
    cells: dict[tuple, dict[str, float]] = defaultdict(dict)
    meta: dict[tuple, dict] = {}
    for r in ppl:
        text = r.get("train_data") or "-"
        method = tuning_method(r)
        key = (r["ratio"], r.get("minutes", 0), method, text if r.get("schedule", "constant") == "constant"
               else f"{text}, {r['schedule']} rate", r.get("steps", 0),  # steps: runs of one setting on other CPUs
               r.get("lr") or DEFAULT_LR.get(method))
        cells[key][r["dataset"]] = r["ppl"]
        meta[key] = r
    lines += ["| ratio | method | lr | text | minutes | steps | tokens | CPU | WikiText-2 | PTB |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(cells, key=lambda k: (k[0], k[1], list(TUNING).index(k[2]), k[3], k[5] or 0)):
        r, c = meta[key], cells[key]
        lr = f"{key[5]:g}" if key[5] else "-"
        lines.append(f"| {key[0]:.0%} | {TUNING[key[2]]} | {lr} | {key[3] or '-'} | {key[1]:g} | {r.get('steps', 0)} | "
                     f"{'-' if r.get('tokens') is None else format(r['tokens'], ',')} | {r.get('load', '-')} | "
                     f"{c.get('wikitext2', float('nan')):.2f} | {c.get('ptb', float('nan')):.2f} |")
    shots: dict[str, dict[str, dict]] = {}
    for r in records:
        if r.get("kind") == "zeroshot" and (r["method"] == "dense" or tuning_method(r)):
            minutes = r.get("minutes") or r.get("train_s", 0) / 60
            name = ("dense" if r["method"] == "dense" else f"{r['method']} at {r['ratio']:.0%}, {minutes:.0f} min"
                    + (f", {r['steps']} steps" if r.get("steps") else ""))  # steps: one setting, cores of other speed
            shots.setdefault(name, {})[r["task"]] = r
    if len(shots) > 1:
        limit = next(iter(shots["dense"].values()))["limit"] if "dense" in shots else "?"
        lines += ["", (f"Zero-shot accuracy after tuning, first {limit} examples per task; in brackets the share of "
                  "the dense score:"), ""]
        lines += zeroshot_rows(shots, "dense")
    lines += other_model_tuning(tuned)
    return lines + ["", "Which method to use and why: [recovery.md](recovery.md).", ""]


def other_model_tuning(tuned: list[dict]) -> list[str]:
    """The recovery runs of models other than SmolLM2: one row per model, ratio, method and minutes."""
    cells: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in tuned:
        if r.get("model", "smollm2-135m") != "smollm2-135m":
            cells[(r["model"], r["ratio"], r.get("minutes", 0), tuning_method(r), r.get("train_data"),
                   r.get("lr"))][r["dataset"]] = r
    if not cells:
        return []
    lines = ["", ("Other models (pruned with `gapprune prune MODEL --ratio R --ratio-of decoder`, defaults; records in "
             "`docs/results/recovery.json` with their commands):"), "",
             "| model | decoder ratio | method | lr | text | minutes | steps | windows | CPU | WikiText-2 | PTB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(cells, key=lambda k: (k[0], k[1], k[2])):
        c = cells[key]
        r = next(iter(c.values()))
        lines.append(f"| {key[0]} | {key[1]:.0%} | {TUNING[key[3]].split(' (lr')[0]} | {key[5] or '-'} | "
                     f"{key[4] or '-'} | {key[2]:g} | "
                     f"{r.get('steps', 0)} | {r['windows']} | {r.get('load', r['machine'])} | "
                     f"{c['wikitext2']['ppl'] if 'wikitext2' in c else float('nan'):.2f} | "
                     f"{c['ptb']['ppl'] if 'ptb' in c else float('nan'):.2f} |")
    return lines


def allocator_section(records: list[dict]) -> list[str]:
    # One exact table for all allocators; other models, and SmolLM2 at the CLI's defaults (auto profiler): families_section.
    records = [r for r in records if r.get("model", "smollm2-135m") == "smollm2-135m" and r.get("profiler") != "auto"]
    ppl = [r for r in records if r.get("kind") == "ppl"]
    if not ppl:
        return []
    meta = ppl[0]
    lines = [
        "## Allocators on SmolLM2-135M (same loss table, criterion `activation`, no compensation)", "",
        (f"Machine: {meta['machine']}; date {meta['date']}. Command: `{meta['command']}`. Calibration: 32 windows x 128 "
        "tokens of WikiText-2 *validation* (statistics), the first 4 of them (512 tokens) for the KL loss table; "
        "MLP options every 48 channels, every 4th replayed and the rest interpolated. One loss table serves all ratios."), "",
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


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    lines = ["# Results", "", "Every number here was measured by the command given with it; JSON records in `docs/results/`.", ""]
    lines += allocator_section(load("allocators.json"))
    lines += calibration_domain_section(load("allocators.json"))
    lines += protocols_section(load("protocols.json")) + protocol_zeroshot_section(load("protocols.json"))
    lines += distill_section(load("recovery.json"))
    lines += families_section(load("allocators.json"), load("families.json"))
    lines += ["## Finished studies", "", ("Dense perplexity on the full test splits, recovery by compensation and LoRA, "
              "OBS and the compensation-aware table, data-free calibration, no compensation under `activation`, "
              "zero-shot at `--limit 500`, speed and memory, the KL to the teacher and its cache: [results_finished.md](results_finished.md)."), ""]
    lines += ["## Profiling cost, Fisher profiler, calibration size", "",
              "See [performance.md](performance.md).", ""]
    lines += ["## How to read these tables", "", ("The readings of every table (what each comparison shows, caveats, "
              "the numbers' history) are in"), ("[results_notes.md](results_notes.md); this page holds only the tables "
              "rendered from `docs/results/*.json`."), ""]
    Path("docs/results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
