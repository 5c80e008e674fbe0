"""`gapprune tune`: recovery tuning of a pruned folder (LoRA, or `--distill` from the unpruned
model), saved in the same format.

The two methods share flag names (`--data`, `--lr`, `--rank`, ...) with different defaults, so the
flags are built from both configs with no argparse default: a config gets only the values given.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from gapprune.cli.flags import literal_help
from gapprune.config import config_fields


def _add_union_flags(parser: argparse.ArgumentParser, configs: dict[str, type]) -> None:
    """One flag per field of any config; help names each method's default, and each method's own
    help where the methods mean different things by the flag (`--data`: Alpaca for LoRA, C4 or a mix
    for distillation)."""
    seen: dict[str, dict[str, Any]] = {}
    for method, cls in configs.items():
        shown_as = {f.name: f.metadata["shown_default"] for f in fields(cls) if "shown_default" in f.metadata}
        for name, default, _, help_text, kind in config_fields(cls):
            entry = seen.setdefault(name, {"kind": kind, "defaults": {}, "helps": {}})
            entry["defaults"][method] = shown_as.get(name, default)  # a stand-in value shown as what it means
            entry["helps"][method] = help_text
    for name, entry in seen.items():
        defaults, helps = entry["defaults"], entry["helps"]
        if len(defaults) == 1:
            method, default = next(iter(defaults.items()))
            text = f"{helps[method]} ({method} only; default: {default})"
        elif len(set(helps.values())) == 1:
            text = f"{next(iter(helps.values()))} (" + "; ".join(f"{m} default: {d}" for m, d in defaults.items()) + ")"
        else:
            text = "; ".join(f"{m}: {helps[m]} (default: {d})" for m, d in defaults.items())
        flag = "--" + name.replace("_", "-")
        help_text = literal_help(text)
        if entry["kind"] is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, type=entry["kind"], default=None, help=help_text)


def _config(args: argparse.Namespace, cls: type) -> Any:
    """`cls` from the flags that were given; the others keep the config's defaults."""
    return cls(**{name: getattr(args, name) for name, *_ in config_fields(cls) if getattr(args, name) is not None})


class TuneCommand:
    """gapprune tune FOLDER --out DIR [--distill [--teacher MODEL]]: recovery, merged, saved in the same format."""

    name = "tune"

    @staticmethod
    def add(sub: Any) -> None:
        from gapprune.tune.configs import DistillConfig, TuneConfig

        p = sub.add_parser(TuneCommand.name, help="recovery tuning: LoRA on Alpaca, or --distill from the unpruned model")
        p.add_argument("model", help="a pruned folder (or any model gapprune loads)")
        p.add_argument("--out", required=True, help="output folder (written atomically)")
        p.add_argument("--distill", action="store_true",
                       help="distil the teacher's next-token distributions (KL) instead of LoRA on instruction data")
        p.add_argument("--checkpoint-dir", default=None, help="resumable checkpoint folder (default: OUT.ckpt)")
        p.add_argument("--keep-checkpoint", action="store_true", help="keep the checkpoint folder after saving")
        p.add_argument("--overwrite", action="store_true")
        p.add_argument("--device", default="cpu", help="torch device of the student and the teacher, e.g. cuda")
        _add_union_flags(p, {"lora": TuneConfig, "distill": DistillConfig})
        p.set_defaults(run=TuneCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        import shutil

        from gapprune.api import load, require_tokenizer
        from gapprune.export.save import save
        from gapprune.output import check_output
        from gapprune.tune import DistillConfig, DistillResult, TuneConfig, TuneResult, distill, lora_tune
        from gapprune.tune import checkpoint as ckpt

        config = _config(args, DistillConfig if args.distill else TuneConfig)
        check_output(args.out, overwrite=args.overwrite)
        checkpoint = Path(args.checkpoint_dir or f"{args.out}.ckpt")
        check_output(checkpoint, overwrite=True, flag="--checkpoint-dir")
        model_folder = {"MODEL": Path(args.model)} if Path(args.model).exists() else {}
        ckpt.check_folder(checkpoint, apart_from={"--out": Path(args.out), **model_folder})
        check_tuning_text(config, args.distill)  # a missing --data or --val-data file: now, not after the model loads
        model, found = load(args.model, device=args.device, dtype=getattr(config, "dtype", None))  # training dtype = load dtype
        tokenizer = require_tokenizer(found, args.model, "tuning trains on text")
        result: DistillResult | TuneResult
        if args.distill:
            merged, result = distill(model, tokenizer, config, checkpoint_dir=checkpoint)
            summary = (f"distilled {result.steps} steps ({result.tokens} tokens) from {result.teacher} in "
                       f"{result.wall_s:.0f} s; validation KL {_first_last(result.val_kl)}")
        else:
            merged, lora_result = lora_tune(model, tokenizer, config, checkpoint)
            result = lora_result
            summary = (f"tuned {lora_result.steps} steps ({lora_result.examples_seen} examples) in "
                       f"{lora_result.wall_s:.0f} s; validation loss {_first_last(lora_result.val_loss)}")

        def extras(folder: Path) -> None:
            for name in ("plan.json", "report.md", "loss_table.json", "kept_fraction.png", "loss_table.png"):
                if (Path(args.model) / name).is_file():
                    shutil.copyfile(Path(args.model) / name, folder / name)
            record = {"method": "distill" if args.distill else "lora", "config": asdict(config), **asdict(result)}
            (folder / "tune.json").write_text(json.dumps(record, indent=1))

        out = save(merged, tokenizer, args.out, extras=extras, overwrite=args.overwrite)
        if not args.keep_checkpoint:
            ckpt.remove(checkpoint)
        print(f"{summary}; saved to {out}")
        return 0


def check_tuning_text(config: Any, distill: bool) -> None:
    """Refuse training or validation text that cannot be read before anything loads: distillation's sources,
    or LoRA's instruction file."""
    from gapprune.data.instructions import check_instruction_data
    from gapprune.tune.teacher_text import check_training_sources

    if distill:
        for spec in (config.data, config.val_data):
            if spec:
                check_training_sources(spec)
    else:
        check_instruction_data(config.data)


def _first_last(values: list[tuple[int, float]]) -> str:
    if not values:
        return "not measured"
    return f"{values[0][1]:.4f} (step {values[0][0]}) -> {values[-1][1]:.4f} (step {values[-1][0]})"
