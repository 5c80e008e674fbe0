"""`gapprune prune` and `gapprune profile`: parse, call the library, print what was written."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from gapprune.cli.budgets import add_budget_flags, budget_from_args, budget_setup, finish
from gapprune.cli.export import print_gguf, record_gguf_source
from gapprune.cli.flags import add_config_flags, config_from, window_count
from gapprune.config import PruneConfig, config_fields
from gapprune.phases import timed


class PruneCommand:
    """gapprune prune MODEL --ratio R --out DIR: profile, allocate, remove units, save the folder."""

    name = "prune"

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(PruneCommand.name, help="prune a model and save it as a Hugging Face folder")
        p.add_argument("model", help="hub id, local folder, .gguf file or alias (smollm2-135m)")
        p.add_argument("--out", required=True, help="output folder (written atomically)")
        p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
        p.add_argument("--eval", default="", help="comma-separated data sets to measure perplexity on, dense vs pruned")
        p.add_argument("--eval-seq-len", type=int, default=128, help="window length for --eval")
        p.add_argument("--eval-windows", type=window_count, default=None, help="evaluate only the first N windows")
        p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
        p.add_argument("--gguf", default=None, help="also write the pruned model as a llama.cpp GGUF file")
        p.add_argument("--gguf-type", default="f16", help="GGUF tensor type: f32, f16, bf16, q8_0, q4_0, q4_k_m, ...")
        p.add_argument("--profile", default=None,
                       help="reuse the profile in this folder (a `gapprune profile` or earlier prune output) instead of profiling")
        p.add_argument("--plan", default=None, help="apply this plan.json as it is (no profiling, no allocation)")
        p.add_argument("--offload", choices=("auto", "on", "off"), default="auto",
                       help="keep the decoder layers of a local safetensors folder on disk, one in memory at a time "
                       "(auto: when the run would take over half the free memory where the weights live: the GPU's, else the host's)")
        add_config_flags(p, PruneConfig, optional=("ratio", "calib"))  # --plan carries its own ratio; calib: below
        add_budget_flags(p)  # --speedup / --max-memory: a runtime budget instead of --ratio
        p.set_defaults(run=PruneCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import check_prunable, load, prune, require_tokenizer, write_pruned_folder
        from gapprune.data import check_source
        from gapprune.distributed import is_main, setup
        from gapprune.evaluate.perplexity import evaluate_ppl
        from gapprune.evaluate.run_record import run_record
        from gapprune.models.streaming import is_streamed
        from gapprune.output import check_output
        from gapprune.pipeline import Profile
        from gapprune.profiling.calibration import check_calibration_sources
        from gapprune.profiling.profilers import check_supported
        from gapprune.pruning.plan import Plan

        start = time.perf_counter()
        if args.plan and args.profile:
            raise ValueError("pass --plan or --profile, not both (a plan needs no profile)")
        plan_in = Plan.load(args.plan) if args.plan else None
        budget = budget_from_args(args)
        if budget is not None and args.ratio is not None:
            raise ValueError(f"pass --ratio or {budget.flag}, not both")
        if budget is not None and plan_in is not None:
            raise ValueError("pass --plan or a budget (--speedup, --max-memory), not both: a plan is applied as it is")
        if budget is not None:
            args.ratio = 0.5  # the config's field, never read: the budget decides how much goes (plan.json says ratio null)
        if args.ratio is None:
            if plan_in is None:
                raise ValueError("--ratio is required (the fraction of parameters to remove), unless --plan gives one")
            ratio = plan_in.config.get("ratio") or plan_in.summary.get("achieved_ratio")
            if not isinstance(ratio, (int, float)):
                raise ValueError(f"{args.plan} names no ratio (config.ratio or summary.achieved_ratio); pass --ratio")
            args.ratio = float(ratio)
        calib_named = args.calib is not None
        args.calib = args.calib or PruneConfig.calib  # the general default; the domain's is chosen below
        config = config_from(args, PruneConfig)
        check_output(args.out, overwrite=args.overwrite)
        model_config = check_prunable(args.model, plan_in)  # a plan is checked against the config before any weight loads
        if not calib_named and plan_in is None:
            config = calibration_for_domain(args.model, model_config, config)
        check_supported(config, streamed=False, plan_given=plan_in is not None)  # refused in memory too
        check_calibration_sources(config)  # a missing --calib or --eval file: now, not after the model loads
        datasets = [d for d in args.eval.split(",") if d]
        for dataset in datasets:
            check_source(dataset)
        profile_in = Profile.load(args.profile) if args.profile else None
        if profile_in is not None:
            profile_in.check_settings(config)  # another run's settings: refused before the model loads
        if args.gguf:
            from gapprune.export.gguf import check_export_args
            from gapprune.export.gguf_layout import check_supported as check_exportable

            check_export_args(args.gguf, args.gguf_type, args.overwrite)
            check_exportable(model_config)  # an unsupported family fails now, not after the pruning
            if Path(args.out).resolve() in Path(args.gguf).resolve().parents:
                raise ValueError(f"--gguf {args.gguf} lies inside --out {args.out}, which is written as a whole at "
                                 "the end; put the GGUF file beside the folder")
        if plan_in is None:  # every check passed: a note now, not above an error
            warn_short_calibration(model_config, config)
        phases: dict[str, float] = {}
        with timed(phases, "load"):
            model, tokenizer = load(args.model, device=setup(config.device), dtype=config.dtype, offload=args.offload)  # setup: torchrun
        tokenizer = require_tokenizer(tokenizer, args.model)
        check_supported(config, streamed=is_streamed(model), plan_given=plan_in is not None)
        record_gguf_source(model, args.model)
        datasets = datasets if is_main() else []
        kwargs = {"seq_len": args.eval_seq_len, "max_windows": args.eval_windows, "data_dir": config.data_dir}
        with timed(phases, "dense_evaluation"):
            evaluation = [
                {"model": "dense", **evaluate_ppl(model, tokenizer, d, **kwargs).to_record()} for d in datasets
            ]
        hook = budget_setup(model, tokenizer, args, budget) if budget is not None else None
        plan, profile = prune(model, tokenizer, config, profile=profile_in, plan=plan_in, timings=phases, budget=budget,
                              costs=hook.costs if hook is not None else None)
        if hook is not None:
            hook.plan_summary = {**plan.summary, "profiler": profile.table.meta.get("profiler") if profile else None}
        if not is_main():  # torchrun: the other ranks only helped profile
            return 0
        with timed(phases, "pruned_evaluation"):
            evaluation += [
                {"model": "pruned", **evaluate_ppl(model, tokenizer, d, **kwargs).to_record()} for d in datasets
            ]
        run = run_record(time.perf_counter() - start, phases, config.calib_samples * config.seq_len,
                         device=config.device, command=args.command_line,
                         dtype=str(next(model.parameters()).dtype).removeprefix("torch."))  # resolved, not "auto"
        if args.gguf:  # before the folder: a budget's check of this file is written into the folder atomically
            from gapprune.export.gguf import export_gguf

            print_gguf(export_gguf(model, tokenizer, args.gguf, file_type=args.gguf_type, overwrite=args.overwrite))
        out = write_pruned_folder(args.out, model, tokenizer, plan, profile, evaluation, plots=not args.no_plots,
                                  overwrite=args.overwrite, run=run,
                                  more=None if hook is None else lambda folder: finish(hook, args, folder))
        s = plan.summary
        print(
            f"removed {s['params_removed']:,} of {s['params_before']:,} parameters "
            f"({100 * s['achieved_ratio']:.2f}% of the model, {100 * s['decoder_ratio']:.2f}% of the decoder layers)"
        )
        added = s.get("params_after_with_added_biases", s["params_after"]) - s["params_after"]
        if added:
            print(f"the saved model holds {s['params_after'] + added:,} parameters: {added:,} output-projection "
                  f"biases added by {plan.config.get('compensate')} are not in the removed share "
                  f"(with them: {100 * s['achieved_ratio_with_added_biases']:.2f}% of the model)")
        if "measured_masked" in s.get("plan_check", {}):
            c = s["plan_check"]
            predicted = (f"predicted {c['predicted']:.4f}" if c["predicted"] is not None
                         else f"not predicted ({s['allocator']} does not read it)")
            print(f"ΔL ({c['metric']}) {predicted}, measured {c['measured_masked']:.4f} unfitted / "
                  f"{c['measured_saved']:.4f} saved, on {c['windows']} held-out calibration windows")
        if s.get("emptied_layers"):
            print(f"{len(s['emptied_layers'])} of {len(plan.layers)} decoder layers emptied (no heads, no MLP "
                  f"channels: they pass their input through): {s['emptied_layers']}")
        for row in evaluation:
            print(f"{row['model']:>6} {row['dataset']} T={row['seq_len']} windows={row['windows']}: ppl {row['ppl']:.3f}")
        print(f"saved to {out} in {run['wall_s']:.0f} s (report: {out / 'report.md'}; times: {out / 'run.json'})")
        return 0


def calibration_for_domain(spec: str, model_config: Any, config: PruneConfig) -> PruneConfig:
    """The config with the calibration text for the model's domain when none was named (a code model: `code`),
    saying so in one line before the work."""
    import dataclasses

    from gapprune.data.domain import CODE_SET, default_calibration
    from gapprune.data.sources import TEXT_SETS, data_dir

    folder = data_dir(config.data_dir)
    code_file = TEXT_SETS[CODE_SET].local[TEXT_SETS[CODE_SET].calibration_split]
    choice = default_calibration(spec, model_config, folder is not None and (folder / code_file).is_file())
    if choice.message:
        print(choice.message, file=sys.stderr)
    return dataclasses.replace(config, calib=choice.calib)


def warn_short_calibration(model_config: Any, config: PruneConfig) -> None:
    """Say, before the work, when the calibration tokens are fewer than the widest solved projection's inputs."""
    from gapprune.calibrate.coverage import coverage_note

    solves = config.compensate == "lsq" or config.criterion == "obs"
    if note := coverage_note(model_config, config.calib_samples, config.seq_len, solves):
        print(note, file=sys.stderr)


class ProfileCommand:
    """gapprune profile MODEL --out DIR: measure scores, signals and the loss table once, for many prunes."""

    name = "profile"
    # a profile is measured uncompensated; a compensation-aware table comes from `prune --compensation-aware`
    not_profile_settings = ("ratio", "allocator", "compensate", "ridge", "refine", "tp", "compensation_aware")

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(ProfileCommand.name, help="profile a dense model; prune it later with --profile DIR")
        p.add_argument("model", help="hub id, local folder, .gguf file or alias (smollm2-135m)")
        p.add_argument("--out", required=True, help="profile folder (written atomically)")
        p.add_argument("--overwrite", action="store_true", help="replace an existing folder")
        add_config_flags(p, PruneConfig, skip=ProfileCommand.not_profile_settings, optional=("calib",))
        p.set_defaults(run=ProfileCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import check_prunable, load, profile, require_tokenizer, write_profile_folder
        from gapprune.distributed import is_main, setup
        from gapprune.output import check_output
        from gapprune.profiling.calibration import check_calibration_sources
        from gapprune.profiling.profilers import check_supported

        calib_named = args.calib is not None
        args.calib = args.calib or PruneConfig.calib  # the general default; the domain's is chosen below
        settings = {name: getattr(args, name) for name, *_ in config_fields(PruneConfig)
                    if name not in ProfileCommand.not_profile_settings}
        config = PruneConfig(ratio=0.5, allocator="gap", compensate="none", **settings)  # ratio: any, not used
        check_output(args.out, overwrite=args.overwrite)
        model_config = check_prunable(args.model)
        if not calib_named:
            config = calibration_for_domain(args.model, model_config, config)
        check_supported(config, streamed=False)
        check_calibration_sources(config)
        warn_short_calibration(model_config, config)
        model, tokenizer = load(args.model, device=setup(config.device), dtype=config.dtype)  # torchrun: join the group
        result = profile(model, require_tokenizer(tokenizer, args.model), config)
        if not is_main():  # torchrun: the other ranks only helped profile
            return 0
        out = write_profile_folder(args.out, result, overwrite=args.overwrite)
        print(f"profiled {result.table.n_layers} layers ({result.table.n_exact()} exact ΔL entries) in "
              f"{sum(result.timings.values()):.0f} s; prune with: gapprune prune {args.model} --profile {out} --ratio R")
        return 0
