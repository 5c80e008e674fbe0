"""Render the README's measured parts (and docs/results.md's rendered tables) from docs/results/*.json.

    python benchmarks/readme.py            # rewrite the rendered parts of README.md and docs/results.md
    python benchmarks/readme.py --check    # exit 1 when they differ from what the records render

Every number in the README sits between `<!-- rendered:NAME -->` and `<!-- /rendered -->` and is
written here from a record; the prose around them cites records and restates no number. Each block
takes the latest record (files are in the order measured) that matches its settings, so a new
measurement moves the README with it, and one that does not match the settings never does.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
MAIN_JOB = "prune smollm2-135m --ratio 0.25 --out runs/smollm2-gap-25 --overwrite --eval wikitext2 --eval-windows 64"
BASELINES = ("uniform", "global", "depth", "owl")
BLOCK = re.compile(r"(<!-- rendered:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /rendered -->)", re.DOTALL)
Records = dict[str, list[dict]]


def load_records(folder: Path = RESULTS) -> Records:
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def latest(records: list[dict], what: str, **match: object) -> dict:
    """The last record whose fields equal `match`; a clear error names what is missing."""
    found = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    if not found:
        raise LookupError(f"no record of {what} with {match}")
    return found[-1]


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def readme_job(records: Records, having: str | None = None) -> dict:
    """The last timed run of the README's main job (whose record has the field `having`, if given)."""
    runs = [r for r in records["main_job"] if r.get("job", r.get("command", "")).endswith(MAIN_JOB)
            and (having is None or having in r)]
    return latest(runs, f"the main job's {having}" if having else "the main job", kind="main_job")


def main_job(records: Records) -> str:
    job = readme_job(records)
    phases, where = job["phases"], job.get("run_machine") or job["machine"]  # run.json's machine, or an older record's
    # what scripts/setup.sh alone adds: a CI run that timed it, else one that did not also set up vLLM's environment
    timed = [r for r in records["main_job"] if r.get("kind") == "ci" and "setup_sh_s" in r]
    if timed:
        setup_s = timed[-1]["setup_sh_s"]
    else:
        untimed = latest([r for r in records["main_job"] if "scripts/setup_vllm.sh" not in r.get("setup", [])],
                         "a CI run", kind="ci")
        setup_s = untimed["wall_s"] - untimed["tests_s"]
    return (
        f"    scripts/setup.sh && GAPPRUNE_DATA=${{GAPPRUNE_DATA:-../shared/data}} .venv/bin/gapprune {MAIN_JOB}\n\n"
        f"{duration(job['wall_s'])} on {where['cores']} cores ({where['processor']}, "
        f"{job['date']}): profiling {phases['profiling']:.0f} s, unit scoring {phases['importance']:.0f} s, surgery and "
        f"lsq {phases['surgery_and_compensation']:.0f} s, plan check {phases.get('plan_check', 0):.0f} s, the rest loading "
        f"and two 64-window evaluations; "
        f"`scripts/setup.sh` adds about {duration(setup_s)}.\n"
    )


def tests(records: Records) -> str:
    ci = latest(records["main_job"], "a CI run", kind="ci")
    vllm = ", vLLM's environment included" if "scripts/setup_vllm.sh" in ci.get("setup", []) else ""
    shared = f"; {ci['shared']}" if ci.get("shared") else ""
    return (f"{duration(ci['wall_s'])} for `.ci/run` on a fresh clone ({ci['date']}, code {ci['code']}{vllm}{shared}), "
            f"{duration(ci['tests_s'])} of it the {ci['passed']} tests (`slow` real-model ones and mypy on `src/` "
            f"included; {ci['deselected']} `gpu` and `network` ones deselected){other_machine(ci, records)}.\n")


def other_machine(ci: dict, records: Records) -> str:
    """Where the CI run's machine is not the main job's, which one it was and its prefill time, so that the
    hardware line's scaling still applies to it."""
    job = readme_job(records)
    processor = (job.get("run_machine") or job["machine"])["processor"]
    if "processor" not in ci or ci["processor"] == processor:
        return ""
    prefill = f", where the prefill below reads {ci['prefill_ms']:.0f} ms" if "prefill_ms" in ci else ""
    return f", on another machine ({ci['processor']}, {ci['cores']} cores{prefill})"


def hardware(records: Records) -> str:
    job = readme_job(records)
    if "prefill_ms" in job:
        prefill, where = job["prefill_ms"], "measured beside the main job"
    else:
        prefill, where = latest(records["bench"], "a dense bench", model="smollm2-135m", batch=1)["prefill_ms"], "bench.json"
    text = (f"`gapprune bench smollm2-135m --batches 1` prints the prefill time of 512 tokens: {prefill:.0f} ms on the "
            f"machine above ({where}). Multiply the times above by yours ÷ {prefill:.0f} ms.")
    amx = [r for r in records["performance"] if r.get("kind") == "screen_precision" and "amx_bf16" in r.get("cpu_flags", [])]
    pair = {r["precision"]: r["seconds"] for r in amx if r["date"] == amx[-1]["date"]} if amx else {}
    measured = (f" ({pair['bfloat16']:.0f} s against {pair['float32']:.0f} s in float32 on an AMX CPU, "
                f"`screen_precision` records)") if {"bfloat16", "float32"} <= set(pair) else ""
    screen = job.get("screen", {})
    if screen.get("precision") == "bfloat16" and "amx_bf16" in job.get("cpu_flags", []):
        text += f" That machine has AMX, so the auto profiler's screen ran in bf16{measured}; without AMX or a GPU it runs in float32."
    elif screen.get("precision") == "float32" and "cpu_flags" in job and screen.get("wall_s"):
        text += (f" That machine has no AMX, so the auto profiler's screen ran in float32 ({screen['wall_s']:.0f} s of "
                 f"the profiling); a CPU with AMX or a GPU runs it in bf16{measured}.")
    return text + "\n"


def main_job_output(records: Records) -> str:
    job = readme_job(records, having="printed")
    return "".join(f"    {line}\n" for line in job["printed"])


def calibration(record: dict) -> str:
    """The calibration text a record was measured with (records before `calibration` was written: `calib`,
    else the default of their day, WikiText-2)."""
    return str(record.get("calibration") or record.get("calib") or "wikitext2")


DATASETS = ("wikitext2", "ptb", "c4")


def ppl_row(records: list[dict], model: str, ratio: float, allocator: str, compensate: str, windows: int,
            calib: str, **extra: object) -> tuple[float | None, ...] | None:
    """Perplexity per evaluation set (None where not measured) of one setting and calibration text;
    None when WikiText-2 was not measured."""
    records = [r for r in records if calibration(r) == calib or r.get("allocator") == "dense"]
    found: list[float | None] = []
    for dataset in DATASETS:
        try:
            found.append(latest(records, f"{model} {allocator}", model=model, kind="ppl", target_ratio=ratio,
                                allocator=allocator, compensate=compensate, windows=windows, criterion="obs",
                                profiler="auto", dataset=dataset, **extra)["ppl"])
        except LookupError:
            found.append(None)
    return tuple(found) if found[0] is not None else None


def cells(values: tuple[float | None, ...], calib: str | None = None) -> str:
    """'93.1 / 174.7 / —', the calibration text's own set marked with *."""
    return " / ".join("—" if v is None else f"{v:.1f}" + ("*" if d == calib else "") for v, d in zip(values, DATASETS))


# (model, what the ratio is of, windows of 128 tokens, ratios, calibration text)
STUDIES = [("smollm2-135m", "model", 256, (0.25, 0.5), "wikitext2"), ("smollm2-135m", "model", 256, (0.25, 0.5), "c4"),
           ("qwen2.5-coder-1.5b", "decoder", 64, (0.25, 0.5), "wikitext2"), ("qwen2.5-coder-1.5b", "decoder", 64, (0.25,), "c4")]


def subsets(records: Records) -> str:
    """The first-windows table of the allocator studies (docs/results.md), labelled as such."""
    rows = ["| model | removed | calibrated on | GAP + lsq | best baseline + lsq | GAP's margin |",
            "|---|---|---|---|---|---|"]
    dense_of = {}
    for model, of, windows, ratios, calib in STUDIES:
        dense_of[model] = ppl_row(records["allocators"], model, 0.0, "dense", "none", windows, calib)
        for ratio in ratios:
            gap = ppl_row(records["allocators"], model, ratio, "gap", "lsq", windows, calib, ratio_of=of)
            bases = {b: p for b in BASELINES if (p := ppl_row(records["allocators"], model, ratio, b, "lsq", windows,
                                                             calib, ratio_of=of))}
            if gap is None or not bases:
                continue
            name, best = min(bases.items(), key=lambda item: item[1][0])  # best by WikiText-2
            margin = " / ".join("—" if g is None or b is None else f"{100 * (1 - g / b):.0f}%" for g, b in zip(gap, best))
            rows.append(f"| {model} | {100 * ratio:.0f}% of the {of} | {calib} | **{cells(gap, calib)}** | "
                        f"{cells(best, calib)} ({name}) | {margin} |")
    dense = "; ".join(f"{m} {cells(d)}" for m, d in dense_of.items() if d)
    return ("WikiText-2 / PTB / C4 perplexity, first windows of 128 tokens of each evaluation split (256 for "
            f"SmolLM2-135M, 64 for Qwen2.5-Coder-1.5B; — not measured, * the calibration text's own set); dense: {dense}.\n\n"
            + "\n".join(rows) + "\n")


# The last change to the CLI defaults that a pruned model's records measure: the auto profiler's bf16 screen on a
# CPU with AMX (e4de3ba, 2026-12-06) for every model, and a code model's code calibration (e45a6a5, same day). A
# pruned record older than this measured another plan and is not shown; dense records do not depend on it.
DEFAULTS_CHANGED = "2026-12-06"
# (model, what the ratio is of, ratios) of the protocol table
PROTOCOL_ROWS = [("smollm2-135m", "model", (0.25, 0.5)), ("qwen2.5-coder-1.5b", "decoder", (0.25,))]
PROTOCOL_PPL = (("wikitext2", 128), ("ptb", 128), ("wikitext2", 2048))
ZERO_SHOT = ("boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")


def default_calibration(model: str) -> str:
    """The calibration text gapprune chooses for `model` when none is named (code for a code model)."""
    from gapprune.data.domain import default_calibration as choose

    return choose(model, None, code_available=True).calib


def current(records: list[dict], model: str, allocator: str, ratio: float, of: str) -> tuple[list[dict], str]:
    """The whole-set records of one model and method on a plan of today's defaults, and the method's label;
    where none exist yet, those of the latest earlier plan, labelled with its date."""
    if allocator == "dense":
        return [r for r in records if r.get("model") == model and r.get("allocator", r.get("method")) == "dense"], ""
    found = [r for r in records if r.get("model") == model and r.get("allocator", r.get("method")) == allocator
             and r.get("target_ratio", r.get("ratio")) == ratio and r.get("ratio_of") == of
             and r.get("calibration") == default_calibration(model)]
    fresh = [r for r in found if r["date"] >= DEFAULTS_CHANGED]
    if fresh or not found:
        return fresh, ""
    return found, f" (plans of {min(r['date'] for r in found)}, earlier defaults)"


def protocol_cells(found: list[dict]) -> list[float | None]:
    """Whole-set perplexities (`PROTOCOL_PPL`), then the zero-shot mean of all 7 tasks and of the 6 without BoolQ."""
    values: list[float | None] = []
    for dataset, seq_len in PROTOCOL_PPL:
        whole = [r["ppl"] for r in found if r["kind"] == "protocol" and r["dataset"] == dataset
                 and r["seq_len"] == seq_len]
        values.append(whole[-1] if whole else None)
    accuracy = {r["task"]: r["value"] for r in found if r["kind"] == "protocol_zeroshot" and r.get("limit") is None}
    for tasks in (ZERO_SHOT, ZERO_SHOT[1:]):
        values.append(100 * sum(accuracy[t] for t in tasks) / len(tasks) if set(tasks) <= set(accuracy) else None)
    return values


def results(records: Records) -> str:
    """The papers' protocols on whole test sets, for plans of today's defaults (`docs/results/protocols.json`)."""
    rows = ["| model | removed | method | WikiText-2 @128 | PTB @128 | WikiText-2 @2048 | 7 tasks | 6 (no BoolQ) |",
            "|---|---|---|---|---|---|---|---|"]
    protocols = records["protocols"]
    for model, of, ratios in PROTOCOL_ROWS:
        dense = protocol_cells(current(protocols, model, "dense", 0.0, of)[0])
        if dense[0] is not None:
            rows.append(protocol_row(model, of, "dense", 0.0, dense))
        for ratio in ratios:
            found, gap_when = current(protocols, model, "gap", ratio, of)
            gap = protocol_cells(found)
            bases = {}
            for b in BASELINES:
                found, when = current(protocols, model, b, ratio, of)
                if (values := protocol_cells(found))[0] is not None:
                    bases[b + when] = values
            name, best = (min(bases.items(), key=lambda item: item[1][0] or float("inf"))  # best by WikiText-2
                          if bases else ("", [None] * len(gap)))
            gap_wins, base_wins = better_cells(gap, best)
            if gap[0] is not None:
                rows.append(protocol_row(model, of, "gap" + gap_when, ratio, gap, gap_wins))
            if bases:
                rows.append(protocol_row(model, of, f"{name}, best baseline", ratio, best, base_wins))
    calib = ", ".join(f"{m} on {default_calibration(m)}" for m, _, _ in PROTOCOL_ROWS)
    return ("Perplexity on the whole test sets (windows of 128 or 2,048 tokens, no BOS: LLM-Pruner's and SliceGPT's "
            "protocols) and mean zero-shot accuracy (%) of BoolQ, PIQA, HellaSwag, WinoGrande, ARC-e, ARC-c and "
            f"OpenBookQA through lm-evaluation-harness, every item; plans of today's defaults (calibrated {calib}; "
            f"records from {DEFAULTS_CHANGED} on) unless a row names an earlier plan; bold: the better of GAP and the "
            "best baseline; — not measured."
            + "".join(prose_calibrated(protocols, m, of, ratios) for m, of, ratios in PROTOCOL_ROWS)
            + "\n\n" + "\n".join(rows) + "\n")


def prose_calibrated(records: list[dict], model: str, of: str, ratios: tuple[float, ...]) -> str:
    """For a model calibrated on its own domain by default, what the same prune calibrated on WikiText-2 reads
    on the same sets, so that its row reads as the price of keeping that domain, not as GAP's loss."""
    if default_calibration(model) == "wikitext2":
        return ""
    sentences = []
    for ratio in ratios:
        found = [r for r in records if r.get("kind") == "protocol" and r.get("model") == model
                 and r.get("allocator", r.get("method")) == "gap" and r.get("target_ratio", r.get("ratio")) == ratio
                 and r.get("ratio_of") == of and r.get("calibration") == "wikitext2"]
        values = {(r["dataset"], r["seq_len"]): r for r in found}
        shown = [f"{values[key]['ppl']:.1f}" for key in PROTOCOL_PPL if key in values]
        if shown:
            dates = sorted({r["date"] for r in values.values()})
            sentences.append(f" The same {model} prune at {100 * ratio:.0f}% of the {of} calibrated on WikiText-2 "
                             f"instead (plan of {dates[-1]}) reads {' / '.join(shown)}: keeping "
                             f"{default_calibration(model)} costs prose (Prune for your domain).")
    return "".join(sentences)


def better_cells(gap: list[float | None], baseline: list[float | None]) -> tuple[list[bool], list[bool]]:
    """Which of two rows' cells is better, column by column (lower perplexity, higher accuracy); a cell
    with nothing beside it to beat is not marked."""
    lower_is_better = [True] * len(PROTOCOL_PPL) + [False] * (len(gap) - len(PROTOCOL_PPL))
    gap_wins, base_wins = [], []
    for a, b, lower in zip(gap, baseline, lower_is_better, strict=True):
        compared = a is not None and b is not None and a != b
        gap_wins.append(compared and (a < b) == lower)
        base_wins.append(compared and (b < a) == lower)
    return gap_wins, base_wins


def protocol_row(model: str, of: str, method: str, ratio: float, values: list[float | None],
                 bold: list[bool] | None = None) -> str:
    removed = "—" if ratio == 0 else f"{100 * ratio:.0f}% of the {of}"
    marks = bold or [False] * len(values)
    text = ["—" if v is None else f"**{v:.1f}**" if b else f"{v:.1f}" for v, b in zip(values, marks, strict=True)]
    return f"| {model} | {removed} | {method} | " + " | ".join(text) + " |"


TUNING_TEXT = {"distill-decoder:alpaca": "Alpaca", "distill-decoder:c4": "C4"}  # the runs the README compares
RECOVERY_MINUTES = 60  # the training budget the README compares them at


def recovery(records: Records) -> str:
    tuned = [r for r in records["recovery"] if r.get("kind") == "methods" and r.get("model") == "smollm2-135m"
             and r.get("method") in TUNING_TEXT and r.get("minutes") == RECOVERY_MINUTES and r.get("windows") == 256]
    starts = [r for r in records["recovery"] if r.get("kind") == "methods" and r.get("windows") == 256
              and str(r.get("method")).startswith("none (starting point") and r.get("dataset") == "wikitext2"]
    parts = []
    for ratio in (0.25, 0.5):
        wt2 = [r for r in tuned if r["ratio"] == ratio and r["dataset"] == "wikitext2"]
        if not wt2:
            continue
        best = min(wt2, key=lambda r: r["ppl"])
        ptb = latest(tuned, "its PTB perplexity", dataset="ptb", ratio=ratio, method=best["method"], lr=best["lr"],
                     train_s=best["train_s"])
        start = latest(starts, "its starting point", ratio=ratio, pruned=best["pruned"])
        threads = int(re.search(r"(\d+) threads?", best["machine"])[1])  # "x86_64 CPU, 2 threads, torch ..."
        parts.append(f"at {100 * ratio:.0f}%, WikiText-2 {start['ppl']:.1f} → **{best['ppl']:.1f}** (PTB after: "
                     f"{ptb['ppl']:.1f}; trained on {TUNING_TEXT[best['method']]}, {threads} thread"
                     f"{'s' if threads > 1 else ''}, learning rate {best['lr']:g}, from a folder pruned on {start['date']})")
    minutes = round({r["minutes"] for r in tuned}.pop())
    return (f"On SmolLM2-135M, {minutes} minutes of `--distill --params decoder` on a CPU (the best of the training "
            "texts measured) took it " + "; ".join(parts) + " (`docs/results/recovery.json`).\n")


def skills(records: Records) -> str:
    """The skill a code model keeps with the calibration gapprune chooses for it (`docs/results/skills.json`)."""
    dense = latest(records["skills"], "the dense model's HumanEval", method="dense", task="humaneval")
    measured = [r for r in records["skills"] if r.get("model") == dense["model"] and r.get("method") == "gap"
                and r.get("task") == "humaneval"]
    by_calibration = {calibration_name(r): r for r in measured}  # the last record of each
    calibration = default_calibration(dense["model"])
    if calibration not in by_calibration:
        raise KeyError(f"no HumanEval record of {dense['model']} pruned with its default calibration ({calibration})")
    pruned = by_calibration.pop(calibration)
    others = "".join(f"; calibrated on {name}: {r['passed']}/{r['n']}" for name, r in sorted(by_calibration.items()))
    return ("**Prune for your domain.** The plan keeps what the calibration text needs: a code model (its name says "
            "coder, starcoder, ...) calibrates on Python source (`--calib code`; its own text, `self`, where none is "
            "at hand) unless you name a text, and "
            f"`gapprune eval DIR --tasks humaneval` measures the skill. {dense['model']} at "
            f"{100 * pruned['ratio']:.0f}% of its {pruned['ratio_of']}, calibrated on {calibration}: HumanEval pass@1 "
            f"{pruned['passed']}/{pruned['n']} ({100 * pruned['value']:.1f}%) against the dense model's "
            f"{dense['passed']}/{dense['n']} ({100 * dense['value']:.1f}%; greedy, generated in vLLM, "
            "`docs/results/skills.json`)" + recovered(records, pruned) + others + "." + instructions(records) + "\n")


def calibration_name(record: dict) -> str:
    """A record's calibration without its explanation ("code (the default ...)" -> "code"), and the prune options
    it was measured with beyond the defaults, so such a record is never read as the default's."""
    name = str(record["calibration"]).split(" ")[0]
    options = record.get("prune_options") or []
    return f"{name} with `{' '.join(options)}`" if options else name


def recovered(records: Records, pruned: dict) -> str:
    """What distillation on the skill's own text gave back, when it was measured."""
    tuned = [r for r in records["skills"] if r.get("method") == "gap+distill" and r.get("model") == pruned["model"]
             and r.get("task") == pruned["task"]]
    if not tuned:
        return ""
    r = tuned[-1]
    minutes = round(r["tuning"]["train_s"] / 60)
    return (f"; {minutes} minutes of `tune --distill --data {r['calibration']} --params lora` then: "
            f"{r['passed']}/{r['n']} ({100 * r['value']:.1f}%)")


INSTRUCTION_MODEL = "smollm2-135m"  # the embedded model, whose job is short instructions


def instructions(records: Records) -> str:
    """What an instruction model keeps, by calibration text: held-out Alpaca beside WikiText-2 (`skill_ppl`)."""
    found = [r for r in records["skills"] if r.get("kind") == "skill_ppl" and r.get("model") == INSTRUCTION_MODEL]
    latest_of = {(r["method"], r["calibration"], r["dataset"]): r for r in found}  # the last record of each
    calibrations = sorted({c for m, c, _ in latest_of if m == "gap"})
    if ("dense", None, "alpaca") not in latest_of or not calibrations:
        return ""
    ratio = next(r["ratio"] for r in found if r["method"] == "gap")

    def line(dataset: str, name: str) -> str:
        pruned = " / ".join(f"{latest_of[('gap', c, dataset)]['ppl']:.1f}" for c in calibrations)
        return f"{name} {pruned} against dense {latest_of[('dense', None, dataset)]['ppl']:.1f}"

    return (f" An instruction model keeps its job the same way: {found[0]['model']} at {100 * ratio:.0f}%, calibrated "
            f"on {' / '.join(calibrations)}, reads perplexity {line('alpaca', 'on held-out Alpaca instructions')}, "
            f"and {line('wikitext2', 'on WikiText-2 (first 256 windows)')} (`benchmarks/instruction_skill.py`).")


BLOCKS: dict[str, Callable[[Records], str]] = {"main-job": main_job, "tests": tests, "hardware": hardware,
                                               "main-job-output": main_job_output, "results": results, "subsets": subsets,
                                               "recovery": recovery, "skills": skills}


def render(text: str, records: Records) -> str:
    """`text` with every rendered block written from `records`; an unknown block name is an error."""
    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise KeyError(f"README block {name!r} has no renderer: one of {sorted(BLOCKS)}")
        return match[1] + BLOCKS[name](records) + match[4]

    return BLOCK.sub(block, text)


RENDERED_FILES = (ROOT / "README.md", ROOT / "docs" / "results.md")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when a rendered file is stale")
    args = p.parse_args()
    records = load_records()
    stale = []
    for path in RENDERED_FILES:
        text = path.read_text()
        rendered = render(text, records)
        if rendered != text:
            stale.append(path)
            if not args.check:
                path.write_text(rendered)
    sys.exit(1 if args.check and stale else 0)


if __name__ == "__main__":
    main()
