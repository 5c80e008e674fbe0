"""`gapprune tune`: recovery tuning of a pruned folder, saved in the same format."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gapprune.cli.flags import add_config_flags, config_from


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
        add_config_flags(p, TuneConfig)
        p.set_defaults(run=TuneCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        import shutil

        from gapprune.api import load
        from gapprune.export.save import save
        from gapprune.tune.lora import TuneConfig, lora_tune, result_record

        config = config_from(args, TuneConfig)
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
