"""Command line: `gapprune prune | ppl | eval | bench | tune | info`. Parsing only; the work lives in the library."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from gapprune.config import PruneConfig, config_fields


def _add_config_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    for name, default, required, help_text, kind in config_fields(cls):
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=default, required=required, help=help_text)


def _config_from(args: argparse.Namespace, cls: type) -> Any:
    return cls(**{name: getattr(args, name) for name, *_ in config_fields(cls)})


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
        p.add_argument("--eval-windows", type=int, default=None, help="evaluate only the first N windows")
        p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
        p.add_argument("--gguf", default=None, help="also write the pruned model as a llama.cpp GGUF file")
        p.add_argument("--gguf-type", default="f16", help="GGUF tensor type: f32, f16, bf16, q8_0, q4_0, q4_k_m, ...")
        p.add_argument("--profile", default=None,
                       help="reuse the profile in this folder (a `gapprune profile` or earlier prune output) instead of profiling")
        p.add_argument("--plan", default=None, help="apply this plan.json as it is (no profiling, no allocation)")
        p.add_argument("--offload", choices=("auto", "on", "off"), default="auto",
                       help="keep the decoder layers of a local safetensors folder on disk, one in memory at a time "
                       "(auto: when the weights would take over half the free memory)")
        _add_config_flags(p, PruneConfig)
        p.set_defaults(run=PruneCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import evaluate_ppl, load, prune, write_pruned_folder
        from gapprune.distributed import is_main, setup
        from gapprune.models.streaming import check_streamable
        from gapprune.pipeline import Profile
        from gapprune.prune.plan import Plan

        config = _config_from(args, PruneConfig)
        if Path(args.out).exists() and not args.overwrite:
            raise FileExistsError(f"{args.out} already exists; choose another --out or pass --overwrite")
        if args.plan and args.profile:
            raise ValueError("pass --plan or --profile, not both (a plan needs no profile)")
        plan_in = Plan.load(args.plan) if args.plan else None
        profile_in = Profile.load(args.profile) if args.profile else None
        if args.gguf:
            from gapprune.export.gguf import check_export_args

            check_export_args(args.gguf, args.gguf_type, args.overwrite)
        model, tokenizer = load(args.model, device=setup(config.device), offload=args.offload)  # setup: torchrun
        check_streamable(model, config, plan_in)
        _record_gguf_source(model, args.model)
        datasets = [d for d in args.eval.split(",") if d] if is_main() else []
        kwargs = dict(seq_len=args.eval_seq_len, max_windows=args.eval_windows, data_dir=config.data_dir)
        evaluation = [
            {"model": "dense", **evaluate_ppl(model, tokenizer, d, **kwargs).to_record()} for d in datasets
        ]
        plan, profile = prune(model, tokenizer, config, profile=profile_in, plan=plan_in)
        if not is_main():  # torchrun: the other ranks only helped profile
            return 0
        evaluation += [
            {"model": "pruned", **evaluate_ppl(model, tokenizer, d, **kwargs).to_record()} for d in datasets
        ]
        out = write_pruned_folder(
            args.out, model, tokenizer, plan, profile, evaluation, plots=not args.no_plots, overwrite=args.overwrite
        )
        s = plan.summary
        print(
            f"removed {s['params_removed']:,} of {s['params_before']:,} parameters "
            f"({100 * s['achieved_ratio']:.2f}% of the model, {100 * s['decoder_ratio']:.2f}% of the decoder layers)"
        )
        for row in evaluation:
            print(f"{row['model']:>6} {row['dataset']} T={row['seq_len']} windows={row['windows']}: ppl {row['ppl']:.3f}")
        print(f"saved to {out} (report: {out / 'report.md'})")
        if args.gguf:
            from gapprune.export.gguf import export_gguf

            _print_gguf(export_gguf(model, tokenizer, args.gguf, file_type=args.gguf_type, overwrite=args.overwrite))
        return 0


class ProfileCommand:
    """gapprune profile MODEL --out DIR: measure scores, signals and the loss table once, for many prunes."""

    name = "profile"
    not_profile_settings = ("ratio", "allocator", "compensate", "ridge", "refine")

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(ProfileCommand.name, help="profile a dense model; prune it later with --profile DIR")
        p.add_argument("model", help="hub id, local folder, .gguf file or alias (smollm2-135m)")
        p.add_argument("--out", required=True, help="profile folder (written atomically)")
        p.add_argument("--overwrite", action="store_true", help="replace an existing folder")
        _add_config_flags(p, PruneConfig, skip=ProfileCommand.not_profile_settings)
        p.set_defaults(run=ProfileCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import load, profile, write_profile_folder
        from gapprune.distributed import is_main, setup

        settings = {name: getattr(args, name) for name, *_ in config_fields(PruneConfig)
                    if name not in ProfileCommand.not_profile_settings}
        config = PruneConfig(ratio=0.5, allocator="gap", compensate="none", **settings)  # ratio: any, not used
        if Path(args.out).exists() and not args.overwrite:
            raise FileExistsError(f"{args.out} already exists; choose another --out or pass --overwrite")
        model, tokenizer = load(args.model, device=setup(config.device))  # torchrun: join the group
        result = profile(model, tokenizer, config)
        if not is_main():  # torchrun: the other ranks only helped profile
            return 0
        out = write_profile_folder(args.out, result, overwrite=args.overwrite)
        print(f"profiled {result.table.n_layers} layers ({result.table.n_exact()} exact ΔL entries) in "
              f"{sum(result.timings.values()):.0f} s; prune with: gapprune prune {args.model} --profile {out} --ratio R")
        return 0


def _record_gguf_source(model: Any, spec: str) -> None:
    from gapprune.export.gguf import record_gguf_source

    record_gguf_source(model, spec)


def _print_gguf(result: Any) -> None:
    print(f"wrote {result.path} ({result.type}, {result.file_bytes / 2**20:.1f} MiB, {result.params:,} values, "
          f"{result.padding_params:,} of them padding; tokenizer from {result.tokenizer})")


class ExportCommand:
    """gapprune export MODEL --gguf FILE [--type f16]: a llama.cpp GGUF (deci architecture, per-layer shapes)."""

    name = "export"

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(ExportCommand.name, help="write a model (pruned or dense) as a llama.cpp GGUF file")
        p.add_argument("model", help="a gapprune folder, hub id, .gguf file or alias")
        p.add_argument("--gguf", required=True, help="output .gguf file (written atomically)")
        p.add_argument("--type", default="f16", help="f32, f16, bf16, q8_0, q5_0, q5_1, q4_0, q4_1, or a llama.cpp "
                       "k-quant (q4_k_m, q4_k_s, q5_k_m, q6_k)")
        p.add_argument("--tokenizer-gguf", default=None,
                       help="copy the tokenizer from this GGUF (default: the GGUF the model came from, if known)")
        p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
        p.set_defaults(run=ExportCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import load
        from gapprune.export.gguf import check_export_args, export_gguf

        check_export_args(args.gguf, args.type, args.overwrite)
        model, tokenizer = load(args.model)
        _record_gguf_source(model, args.model)
        _print_gguf(export_gguf(model, tokenizer, args.gguf, file_type=args.type, overwrite=args.overwrite,
                                tokenizer_gguf=args.tokenizer_gguf))
        return 0


class PplCommand:
    """gapprune ppl MODEL --dataset wikitext2 --seq-len 2048: perplexity, printed and written as JSON."""

    name = "ppl"

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(PplCommand.name, help="perplexity of a model on a data set or text file")
        p.add_argument("model")
        p.add_argument("--dataset", default="wikitext2", help="wikitext2, ptb, or a .txt/.jsonl file")
        p.add_argument("--split", default="test")
        p.add_argument("--seq-len", type=int, default=2048)
        p.add_argument("--max-windows", type=int, default=None)
        p.add_argument("--batch-size", type=int, default=None)
        p.add_argument("--data-dir", default=None, help="data folder (else $GAPPRUNE_DATA, else the hub)")
        p.add_argument("--device", default="cpu")
        p.add_argument("--json", default=None, help="write the result to this JSON file")
        p.set_defaults(run=PplCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import evaluate_ppl, load

        model, tokenizer = load(args.model, device=args.device)
        result = evaluate_ppl(
            model, tokenizer, args.dataset, split=args.split, seq_len=args.seq_len,
            max_windows=args.max_windows, batch_size=args.batch_size, data_dir=args.data_dir,
        )
        record = {"model": args.model, **result.to_record()}
        print(json.dumps(record))
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        return 0


class InfoCommand:
    """gapprune info MODEL: architecture, per-layer shapes and parameter counts."""

    name = "info"

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(InfoCommand.name, help="show a model's architecture, per-layer shapes and parameters")
        p.add_argument("model")
        p.set_defaults(run=InfoCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import load
        from gapprune.models import get_adapter

        model, _ = load(args.model)
        adapter = get_adapter(model)
        total = sum(p.numel() for p in model.parameters())
        print(f"{model.config.architectures[0]}: {adapter.n_layers} layers, hidden {adapter.hidden}, {total:,} parameters")
        for i, shape in enumerate(adapter.shapes()):
            print(f"  layer {i:3d}: heads {shape.n_heads:3d}  kv {shape.n_kv_heads:3d}  mlp {shape.intermediate:6d}")
        return 0


class EvalCommand:
    """gapprune eval MODEL --ppl wikitext2,ptb --tasks boolq,piqa,... [--limit N]."""

    name = "eval"

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(EvalCommand.name, help="perplexity and zero-shot accuracy (lm-evaluation-harness)")
        p.add_argument("model")
        p.add_argument("--ppl", default="wikitext2,ptb", help="comma-separated perplexity data sets ('' for none)")
        p.add_argument("--seq-len", type=int, default=128)
        p.add_argument("--max-windows", type=int, default=None)
        p.add_argument("--tasks", default="", help="comma-separated: boolq,piqa,hellaswag,winogrande,arc_easy,arc_challenge,openbookqa")
        p.add_argument("--limit", type=int, default=None, help="first N examples per task")
        p.add_argument("--batch-size", type=int, default=None,
                       help="zero-shot examples per batch (default: 16, fewer for large vocabularies)")
        p.add_argument("--data-dir", default=None)
        p.add_argument("--device", default="cpu")
        p.add_argument("--out", default=None, help="write JSON records and a markdown table next to it")
        p.set_defaults(run=EvalCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import load
        from gapprune.evaluate.records import eval_records, eval_table

        model, tokenizer = load(args.model, device=args.device)
        records = eval_records(
            model, tokenizer, args.model, datasets=[d for d in args.ppl.split(",") if d],
            tasks=[t for t in args.tasks.split(",") if t], seq_len=args.seq_len, max_windows=args.max_windows,
            limit=args.limit, batch_size=args.batch_size, data_dir=args.data_dir,
        )
        table = eval_table(records)
        print(table)
        if args.out:
            Path(args.out).write_text(json.dumps(records, indent=1) + "\n")
            Path(args.out).with_suffix(".md").write_text(table + "\n")
        return 0


class BenchCommand:
    """gapprune bench MODEL [--vs DENSE]: prefill latency, decode tokens/s, memory; speedup vs ideal."""

    name = "bench"

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(BenchCommand.name, help="measure speed and memory (optionally against the dense source)")
        p.add_argument("model")
        p.add_argument("--vs", default=None, help="the dense model to compare with")
        p.add_argument("--batches", default="1,16")
        p.add_argument("--prompt-tokens", type=int, default=512)
        p.add_argument("--new-tokens", type=int, default=32)
        p.add_argument("--repeats", type=int, default=3)
        p.add_argument("--device", default="cpu")
        p.add_argument("--out", default=None, help="write JSON records")
        p.set_defaults(run=BenchCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import load
        from gapprune.evaluate.records import speed_line, speed_records

        records = speed_records(
            [args.model] + ([args.vs] if args.vs else []), lambda spec: load(spec, device=args.device)[0],
            batches=[int(b) for b in args.batches.split(",")], prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens, repeats=args.repeats, dense=args.vs,
        )
        for r in records:
            print(speed_line(r))
        if args.out:
            Path(args.out).write_text(json.dumps(records, indent=1) + "\n")
        return 0


class TuneCommand:
    """gapprune tune FOLDER --data alpaca --out DIR: LoRA recovery, merged, saved in the same format."""

    name = "tune"

    @staticmethod
    def add(sub: Any) -> None:
        from gapprune.tune.lora import TuneConfig

        p = sub.add_parser(TuneCommand.name, help="LoRA recovery tuning (peft), merged back into the weights")
        p.add_argument("model", help="a pruned folder (or any model gapprune loads)")
        p.add_argument("--out", required=True, help="output folder (written atomically)")
        p.add_argument("--checkpoint-dir", default=None, help="resumable checkpoint folder (default: OUT.ckpt)")
        p.add_argument("--overwrite", action="store_true")
        _add_config_flags(p, TuneConfig)
        p.set_defaults(run=TuneCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        import shutil

        from gapprune.api import load
        from gapprune.export.save import save
        from gapprune.tune.lora import TuneConfig, lora_tune, result_record

        config = _config_from(args, TuneConfig)
        if Path(args.out).exists() and not args.overwrite:
            raise FileExistsError(f"{args.out} already exists; choose another --out or pass --overwrite")
        model, tokenizer = load(args.model)
        if tokenizer is None:
            raise ValueError(f"{args.model} has no tokenizer; tuning needs one")
        checkpoint = Path(args.checkpoint_dir or f"{args.out}.ckpt")
        merged, result = lora_tune(model, tokenizer, config, checkpoint)

        def extras(folder: Path) -> None:
            for name in ("plan.json", "report.md", "loss_table.json", "kept_fraction.png", "loss_table.png"):
                if (Path(args.model) / name).is_file():
                    shutil.copyfile(Path(args.model) / name, folder / name)
            (folder / "tune.json").write_text(json.dumps({"config": config.__dict__, **result_record(result)}, indent=1))

        out = save(merged, tokenizer, args.out, extras=extras, overwrite=args.overwrite)
        shutil.rmtree(checkpoint, ignore_errors=True)
        print(f"tuned {result.steps} steps ({result.examples_seen} examples) in {result.wall_s:.0f} s; "
              f"validation loss {result.val_loss[0][1] if result.val_loss else float('nan'):.4f} -> "
              f"{result.val_loss[-1][1] if result.val_loss else float('nan'):.4f}; saved to {out}")
        return 0


COMMANDS = (PruneCommand, ExportCommand, ProfileCommand, PplCommand, EvalCommand, BenchCommand, TuneCommand, InfoCommand)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gapprune", description="Structured LLM pruning with global adaptive rates")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(args.run(args))
    except (ValueError, FileNotFoundError, FileExistsError, KeyError, ImportError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"gapprune {args.command}: error: {message}", file=sys.stderr)
        return 2
    except Exception as err:
        from gapprune.distributed import describe

        if not describe():
            raise
        print(f"gapprune {args.command}: {describe()} failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
