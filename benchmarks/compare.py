"""Plans compared: one script, one settings block per study, every plan from `gapprune.pipeline.plan_for`.

Each study is "load -> calibrate -> profile -> plan per setting -> pruned copy -> perplexity ->
records"; a block below only says which runs it wants (`Run`). Resumable: what is in --out is skipped.

  allocators  GAP and the 4 baselines at 4 ratios from one exact table          allocators.json
  families    allocators, lsq, reload and zero-shot on another --model         allocators.json, families.json
  plans       recompute the allocator and recovery plans, compare them with the records

The finished studies (dense, recovery, ridge, methods, calib, best, refine) left with their records standing:
`git show 71bf743:benchmarks/compare.py` (docs/results_notes.md, "Scripts of finished studies").

    python benchmarks/compare.py allocators --data-dir ../shared/data
    python benchmarks/compare.py families --model gemma3-270m --data-dir ../shared/data
    python benchmarks/compare.py families --model qwen2.5-coder-1.5b --defaults --zeroshot-limit 0 --data-dir ../shared/data
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from common import (
    ALLOCATOR_WINDOWS,
    ALLOCATORS,
    CALIBRATION,
    DATASETS,
    PROFILE,
    RATIOS,
    TASKS,
    ResultLog,
    Window,
    bench_config,
    parser,
    perplexity,
    reload_check,
)

from gapprune.api import load, pruned_copy, write_profile_folder
from gapprune.config import LATER_SETTINGS, PROFILE_SETTINGS, TABLE_SETTINGS, PruneConfig
from gapprune.evaluate.records import eval_records
from gapprune.export.save import save
from gapprune.models import get_adapter
from gapprune.pipeline import Calibration, Profile, allocate, calibrate, plan_for
from gapprune.profiling.calibration import profile_settings
from gapprune.profiling.tables import needs_loss_table


@dataclass
class Run:
    """One model to measure: the dense one (no `config`), a plan's pruned copy, or a saved folder (`source`)."""

    labels: dict[str, Any]  # the records' identity: what --out is searched for to skip a run
    config: dict[str, Any] | None = None  # bench_config overrides of the plan (ratio, allocator, compensate, ...)
    windows: list[Window] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)  # more fields for every record
    save: str | None = None  # save the model here (and load it from there when it exists)
    reload: dict[str, Any] | None = None  # after saving, a reload-check record with these fields
    zeroshot: int = 0  # lm-eval on the 7 tasks, first N examples each (0: none)
    zeroshot_labels: dict[str, Any] = field(default_factory=dict)


class Bench:
    """The dense model and what was measured on it: calibrations and profiles, by their settings."""

    def __init__(self, args: Any, base: PruneConfig, profile_dir: str | None) -> None:
        self.args, self.base, self.profile_dir = args, base, profile_dir
        self.model, self.tokenizer = load(args.model)
        self.log = ResultLog(args.out)
        self.extra = ResultLog(args.extra_out) if args.extra_out else self.log
        self.calibrations: dict[tuple, Calibration] = {}
        self.profiles: dict[tuple, Profile] = {}

    def calibration(self, config: PruneConfig) -> Calibration:
        key = tuple(getattr(config, n) for n in PROFILE_SETTINGS if n != "table_compensation")
        if key not in self.calibrations:  # Grams always: some run of the study compensates
            folder = Path(self.profile_dir) if self.profile_dir else None
            saved = Profile.load(folder) if folder is not None and folder.exists() else None
            now = profile_settings(config)
            same = saved is not None and all(saved.settings.get(n, LATER_SETTINGS.get(n)) == now[n]
                                             for n in PROFILE_SETTINGS)  # then its scores are reused (checked in plan_for)
            self.calibrations[key] = calibrate(self.model, self.tokenizer, config, gram=True,
                                               scores=saved.scores if same and saved is not None else None)
        return self.calibrations[key]

    def plan(self, config: PruneConfig):  # type: ignore[no-untyped-def]
        """The plan and its profile; an exact profile is read from (or saved to) `profile_dir`."""
        calibration, key = self.calibration(config), tuple(getattr(config, n) for n in TABLE_SETTINGS)
        profile = self.profiles.get(key)
        folder = Path(self.profile_dir) if self.profile_dir else None
        if profile is None and folder is not None and folder.exists():
            profile = Profile.load(folder)
        if profile is not None and not profile.table.measured and needs_loss_table(config):
            profile = None  # a baseline's profile holds parameter costs only: measure GAP's table
        fresh = profile is None
        plan, self.profiles[key] = plan_for(config, calibration, profile)
        if folder is not None and (fresh or config.profiler == "auto"):  # a grown auto table, for a later run
            write_profile_folder(folder, self.profiles[key], overwrite=True)
        if fresh and getattr(self.args, "phases", False):
            for phase, seconds in self.profiles[key].timings.items():
                self.log.emit({"kind": "phase", "phase": phase, "wall_s": seconds,
                               "tokens_profiled": self.profiles[key].table.meta.get("tokens")})
        return plan, self.profiles[key]

    def measure(self, run: Run) -> None:
        todo = [w for w in run.windows if not self.log.done(**run.labels, dataset=w.dataset, seq_len=w.seq_len,
                                                            **{"windows" if w.windows else "max_windows": w.windows})]
        shots = run.zeroshot and not all(self.extra.done(**run.zeroshot_labels, task=t) for t in TASKS)
        if not (todo or shots or (run.save and not Path(run.save).exists())):
            return
        model, fields = self.model, dict(run.fields)
        if run.save and Path(run.save).exists():
            model = load(run.save)[0]
        elif run.config is not None:
            model, fields, plan = self.build(run, fields)
            if run.save:
                save(model, self.tokenizer, run.save, extras=(lambda f: plan.save(f / "plan.json")) if plan else None)
                if run.reload is not None:
                    self.extra.emit({**run.reload, **reload_check(model, Path(run.save), self.tokenizer)})
        for window in todo:
            ppl = perplexity(model, self.tokenizer, window, self.args.data_dir)
            eval_s = ppl.pop("wall_s")  # wall_s: the run's own seconds (compensation, LoRA), else the evaluation's
            self.log.emit({**run.labels, **fields, **ppl, "eval_s": eval_s, "max_windows": window.windows,
                           "wall_s": fields.get("wall_s", eval_s)})
        if shots:
            for r in eval_records(model, self.tokenizer, self.args.model, tasks=TASKS, limit=run.zeroshot,
                                  data_dir=self.args.data_dir):
                self.extra.emit({**r, **run.zeroshot_labels})

    def build(self, run: Run, fields: dict[str, Any]):  # type: ignore[no-untyped-def]
        """The run's model: pruned by its plan and compensated."""
        config = replace(self.base, **(run.config or {}))
        start = time.perf_counter()
        plan, profile = self.plan(config)
        fit = self.calibration(config)
        sequential = fit.inputs if config.sequential and config.compensate != "none" else None
        model, summary = pruned_copy(self.model, plan, config.compensate, fit.gram, config.ridge, sequential)
        info = plan.summary["allocation_info"]
        fields.update(achieved_ratio=plan.summary["achieved_ratio"], decoder_ratio=plan.summary["decoder_ratio"],
                      exact_entries=profile.table.n_exact(), compensation_s=summary["wall_s"],
                      applied=summary.get("applied"), kept_original=summary.get("kept_original"),
                      wall_s=summary["wall_s"], plan_s=round(time.perf_counter() - start - summary["wall_s"], 1),
                      **{k: info[k] for k in ("refine_history", "refine_helped") if k in info})
        if getattr(self.args, "phases", False):
            self.extra.emit({**run.labels, "kind": "phase", "phase": "surgery", "wall_s": summary["wall_s"],
                             "predicted_loss": plan.summary["predicted_loss"],
                             "kept_heads": [len(lp.attn.kept) for lp in plan.layers],
                             "kept_channels": [len(lp.mlp.kept) for lp in plan.layers]})
        return model, fields, plan


# ---- the studies: which runs, with which settings ----

def allocators(a: Any, b: Bench) -> Iterator[Run]:
    crit = {"kind": "ppl", "criterion": b.base.criterion}
    yield Run({**crit, "allocator": "dense", "target_ratio": 0.0}, None, ALLOCATOR_WINDOWS, {"achieved_ratio": 0.0})
    for ratio in RATIOS:
        for name in ALLOCATORS:
            yield Run({**crit, "allocator": name, "target_ratio": ratio}, {"ratio": ratio, "allocator": name},
                      ALLOCATOR_WINDOWS)
    if a.skip_full:
        return
    cells = [r for r in b.log.records if r.get("kind") == "ppl" and r["target_ratio"] == 0.25 and r.get("windows") == 256
             and r["dataset"] == "wikitext2" and r["seq_len"] == 128 and r["allocator"] not in ("gap", "dense")]
    for name in ["gap", min(cells, key=lambda r: r["ppl"])["allocator"]]:
        yield Run({**crit, "allocator": name, "target_ratio": 0.25}, {"ratio": 0.25, "allocator": name},
                  [Window("wikitext2", 128, None)])


def families(a: Any, b: Bench) -> Iterator[Run]:
    ratios, of = a.ratio_list or [0.25, 0.5], a.ratio_of
    stage, windows = f"gap{int(ratios[0] * 100)}-of-{of}-lsq", [] if a.zeroshot_only else \
        [Window(d, windows=a.windows) for d in a.datasets.split(",")]
    base = {"model": a.model, "kind": "ppl", "profiler": "auto", "ratio_of": of}
    # the dense model has no calibration; `calibration` labels every record of a run that names it
    mixed = {"calibration": b.base.calib} if a.calib else \
        {"calib": b.base.calib} if b.base.calib != PruneConfig.calib else {}
    fields = {"criterion": b.base.criterion, "calib_samples": b.base.calib_samples,
              "profile_samples": b.base.profile_samples}
    shots = {"model": a.model, "kind": "zeroshot", "ratio_of": of}
    yield Run({**base, "allocator": "dense", "compensate": "none", "target_ratio": 0.0}, None, windows, fields,
              zeroshot=a.zeroshot_limit, zeroshot_labels={**shots, "stage": "dense"})
    for ratio in ratios:
        for name in ALLOCATORS:
            if not a.lsq_only:
                yield Run({**base, **mixed, "allocator": name, "compensate": "none", "target_ratio": ratio},
                          {"ratio": ratio, "allocator": name, "compensate": "none"}, windows, fields)
            if name != "gap" and name in a.baselines_lsq.split(","):  # the same compensation after the allocation
                yield Run({**base, **mixed, "allocator": name, "compensate": "lsq", "target_ratio": ratio},
                          {"ratio": ratio, "allocator": name}, windows, fields)
        first = ratio == ratios[0]
        yield Run({**base, **mixed, "allocator": "gap", "compensate": "lsq", "target_ratio": ratio}, {"ratio": ratio}, windows,
                  fields, save=f"{a.folders}/{Path(a.model).name}-{stage}" if first else None,
                  reload={"model": a.model, "kind": "reload", "target_ratio": ratio, "ratio_of": of} if first else None,
                  zeroshot=a.zeroshot_limit if first else 0, zeroshot_labels={**shots, "stage": stage})
    if a.exact_check and not b.extra.done(model=a.model, kind="auto_vs_exact"):
        exact_check(a, b, ratios)


def exact_check(a: Any, b: Bench, ratios: list[float]) -> None:
    """Auto's GAP plans against the exact table's: summed exact ΔL of each."""
    from gapprune.profiling.profilers import measure_table

    config = replace(b.base, ratio=ratios[-1])
    auto = b.plan(config)[1]
    start = time.perf_counter()
    exact = measure_table(b.calibration(config), replace(config, profiler="exact"))
    exact_s = round(time.perf_counter() - start, 1)
    for ratio in ratios:
        mine, best_ = allocate(auto, ratio, "gap", a.ratio_of), allocate(replace(auto, table=exact), ratio, "gap", a.ratio_of)
        b.extra.emit({"model": a.model, "kind": "auto_vs_exact", "target_ratio": ratio, "ratio_of": a.ratio_of,
                      "exact_table_s": exact_s, "auto_exact_entries": auto.table.n_exact(), "exact_entries": exact.n_exact(),
                      "same_plan": mine.choice == best_.choice, "auto_plan_exact_loss": mine.predicted_loss(exact),
                      "exact_plan_exact_loss": best_.predicted_loss(exact)})


def plans(a: Any, b: Bench) -> Iterator[Run]:
    """Kept heads and channels per layer of every allocator plan against allocators.json; the recovery and
    ridge plans are the gap ones at 25% and 50% (same profile), whose achieved ratios recovery.json holds."""
    recorded = {(r["allocator"], r["target_ratio"]): (r["kept_heads"], r["kept_channels"])
                for r in json.loads(Path("docs/results/allocators.json").read_text())
                if r.get("phase") == "surgery" and r.get("model", "smollm2-135m") == "smollm2-135m"}
    achieved = {r["ratio"]: r["achieved_ratio"] for r in json.loads(Path("docs/results/recovery.json").read_text())
                if r.get("stage") in ("none", "lsq", "bias")}
    folder = Path(b.profile_dir or PROFILE)  # plans read the profile's numbers alone: no calibration when it exists
    profile = Profile.load(folder) if folder.exists() else b.plan(b.base)[1]
    same, adapter = 0, get_adapter(b.model)
    for ratio in RATIOS:
        for name in ALLOCATORS:
            plan = plan_for(b.base, None, profile, adapter=adapter, ratio=ratio, allocator=name)[0]
            kept = ([len(lp.attn.kept) for lp in plan.layers], [len(lp.mlp.kept) for lp in plan.layers])
            ok = recorded.get((name, ratio)) == tuple(kept)
            same += ok
            if name == "gap" and ratio in achieved:
                ok_r = achieved[ratio] == plan.summary["achieved_ratio"]
                print(f"recovery gap {ratio}: achieved ratio {'same' if ok_r else 'DIFFERENT'}", flush=True)
            print(name, ratio, "same" if ok else f"DIFFERENT {kept} vs {recorded.get((name, ratio))}", flush=True)
    print(f"{same} of {len(RATIOS) * len(ALLOCATORS)} allocator plans identical to the recorded ones")
    return iter(())


STUDIES = {f.__name__: f for f in (allocators, families, plans)}


def main() -> None:
    p = parser(__doc__, "")
    p.add_argument("study", choices=list(STUDIES))
    p.add_argument("--extra-out", default=None, help="reload, zero-shot and phase records (default: --out)")
    p.add_argument("--profile", default=None, help="profile folder: reused when it exists, else written")
    p.add_argument("--ratio", type=float, default=0.25)
    p.add_argument("--ratios", default=None, help="comma-separated ratios (methods, families)")
    p.add_argument("--ratio-of", default="decoder", help="families: model or decoder, what the ratios are of")
    p.add_argument("--windows", type=int, default=None, help="first N windows of 128 tokens per split")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--calib-samples", type=int, default=CALIBRATION["calib_samples"])
    p.add_argument("--profile-samples", type=int, default=CALIBRATION["profile_samples"])
    p.add_argument("--mlp-stride", type=int, default=CALIBRATION["mlp_stride"])
    p.add_argument("--calib", default=None, help="families --defaults: calibration text, e.g. wikitext2+ptb")
    p.add_argument("--zeroshot-limit", type=int, default=100, help="families: examples per task (0: no zero-shot)")
    p.add_argument("--zeroshot-only", action="store_true", help="families: skip the perplexities")
    p.add_argument("--lsq-only", action="store_true", help="families: every allocator with the default lsq only")
    p.add_argument("--exact-check", action="store_true", help="families: also compare auto's plans with exact's")
    p.add_argument("--baselines-lsq", nargs="?", default="", const=",".join(ALLOCATORS[1:]),
                   help="families: these baselines' plans (comma-separated; all without a value) with the default lsq "
                        "too; under `obs` `global` is `uniform` by construction and may be left out")
    p.add_argument("--skip-full", action="store_true", help="allocators: skip the full WikiText-2 test runs")
    p.add_argument("--folders", default=None, help="where saved pruned and tuned folders go")
    p.add_argument("--defaults", action="store_true",
                   help="families: the CLI's default settings (criterion obs, 8 profiling windows, ...) instead of "
                        "the benchmarks' calibration block; a `gapprune prune` folder then serves as --profile")
    a = p.parse_args()
    study = a.study
    a.out = a.out or "docs/results/allocators.json"
    a.windows = a.windows or (64 if study == "families" else 256)
    a.ratio_list = [float(r) for r in a.ratios.split(",")] if a.ratios else None
    a.phases = study == "allocators"
    if study == "families":
        a.extra_out = a.extra_out or "docs/results/families.json"
    a.folders = a.folders or ("runs/families" if study == "families" else "runs")
    shared = study in ("allocators", "plans")  # the shared exact profile
    base = bench_config(a.data_dir, profiler="exact" if shared else "auto", calib_samples=a.calib_samples,
                        profile_samples=a.profile_samples, mlp_stride=a.mlp_stride, sequential=not shared,
                        ratio_of=a.ratio_of if study == "families" else "model",
                        **({"compensate": "lsq"} if study == "families" else {}))
    profile = a.profile or (PROFILE if shared else f"{a.folders}/{Path(a.model).name}-profile" if study == "families"
                            else None)
    if a.defaults and study == "families":
        base = PruneConfig(ratio=0.25, compensate="lsq", ratio_of=a.ratio_of, data_dir=a.data_dir,
                           **({"calib": a.calib} if a.calib else {}))
    bench = Bench(a, base, profile)
    for run in STUDIES[study](a, bench):
        bench.measure(run)


if __name__ == "__main__":
    main()
