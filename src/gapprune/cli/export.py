"""`gapprune export`: a pruned folder to a llama.cpp GGUF file."""

from __future__ import annotations

import argparse
from typing import Any

from gapprune.cli.flags import add_dtype_flag


def record_gguf_source(model: Any, spec: str) -> None:
    from gapprune.export.gguf import record_gguf_source

    record_gguf_source(model, spec)


def print_gguf(result: Any) -> None:
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
        add_dtype_flag(p)
        p.set_defaults(run=ExportCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import check_prunable, load
        from gapprune.export.gguf import check_export_args, export_gguf

        check_export_args(args.gguf, args.type, args.overwrite)
        check_prunable(args.model)  # the exporter writes the families gapprune prunes
        model, tokenizer = load(args.model, dtype=args.dtype)
        record_gguf_source(model, args.model)
        print_gguf(export_gguf(model, tokenizer, args.gguf, file_type=args.type, overwrite=args.overwrite,
                                tokenizer_gguf=args.tokenizer_gguf))
        return 0
