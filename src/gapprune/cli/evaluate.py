"""`gapprune ppl | info | eval | bench`: measure a model (dense or pruned)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gapprune.cli.flags import add_dtype_flag, window_count

CODE_TASKS = ("humaneval",)  # `--tasks` scored by gapprune.evaluate.humaneval, not lm-eval


class PplCommand:
    """gapprune ppl MODEL --dataset wikitext2 --seq-len 2048: perplexity, printed and written as JSON."""

    name = "ppl"

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(PplCommand.name, help="perplexity of a model on a data set or text file")
        p.add_argument("model")
        p.add_argument("--dataset", default=None, help="wikitext2 (default), ptb, c4, code (Python source), alpaca (instructions), or a "
                       ".txt/.jsonl file")
        p.add_argument("--split", default=None,
                       help="default: the set's evaluation split (test; validation for c4 and code)")
        p.add_argument("--seq-len", type=int, default=None, help="tokens per window (default 2048)")
        p.add_argument("--max-windows", type=window_count, default=None)
        p.add_argument("--protocol", default=None, help="a paper's protocol, which fixes data sets, lengths and "
                       "windows: llm-pruner (whole WikiText-2 and PTB tests at 128) or slicegpt (WikiText-2 at 2048)")
        p.add_argument("--batch-size", type=int, default=None)
        p.add_argument("--data-dir", default=None, help="data folder (else $GAPPRUNE_DATA, else the hub)")
        p.add_argument("--device", default="cpu")
        add_dtype_flag(p)
        p.add_argument("--resume", default=None, metavar="DIR",
                       help="keep every scored window's NLL in DIR (keyed by the weights and the windows), so a "
                       "stopped run goes on where it stopped when run again with the same DIR")
        p.add_argument("--json", default=None, help="write the result to this JSON file")
        p.set_defaults(run=PplCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import load, require_tokenizer
        from gapprune.data import check_source
        from gapprune.evaluate.perplexity import evaluate_ppl
        from gapprune.evaluate.protocols import get_protocol, refuse_overrides
        from gapprune.output import check_output, write_file_atomically

        if args.json:
            check_output(args.json, overwrite=True, kind="file", flag="--json")
        runs, label = [(args.dataset or "wikitext2", args.seq_len or 2048)], {}
        if args.protocol:
            protocol = get_protocol(args.protocol)
            refuse_overrides(protocol, {"--dataset": args.dataset, "--split": args.split, "--seq-len": args.seq_len,
                                        "--max-windows": args.max_windows})
            runs, label = [(d, protocol.seq_len) for d in protocol.datasets], {"protocol": protocol.name}
        for dataset, _ in runs:
            check_source(dataset, args.split)  # a missing file or split: before the model loads
        model, found = load(args.model, device=args.device, dtype=args.dtype)
        tokenizer = require_tokenizer(found, args.model, "perplexity reads text")
        records = []
        for dataset, seq_len in runs:
            result = evaluate_ppl(model, tokenizer, dataset, split=args.split, seq_len=seq_len,
                                  max_windows=args.max_windows, batch_size=args.batch_size, data_dir=args.data_dir,
                                  resume=args.resume)
            records.append({"model": args.model, **label, **result.to_record()})
            print(json.dumps(records[-1]))
        if args.json:
            write_file_atomically(args.json, json.dumps(records[0] if len(records) == 1 else records, indent=1) + "\n")
        return 0


class InfoCommand:
    """gapprune info MODEL: architecture, per-layer shapes and parameter counts."""

    name = "info"

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(InfoCommand.name, help="show a model's architecture, per-layer shapes and parameters")
        p.add_argument("model")
        add_dtype_flag(p)
        p.set_defaults(run=InfoCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import check_prunable, load
        from gapprune.models import get_adapter

        check_prunable(args.model)  # per-layer shapes come from the family's adapter
        model, _ = load(args.model, dtype=args.dtype)
        adapter = get_adapter(model)
        total = sum(p.numel() for p in model.parameters())
        architecture = (model.config.architectures or [type(model).__name__])[0]
        print(f"{architecture}: {adapter.n_layers} layers, hidden {adapter.hidden}, {total:,} parameters")
        for i, shape in enumerate(adapter.shapes()):
            print(f"  layer {i:3d}: heads {shape.n_heads:3d}  kv {shape.n_kv_heads:3d}  mlp {shape.intermediate:6d}")
        return 0


class EvalCommand:
    """gapprune eval MODEL --ppl wikitext2,ptb --tasks boolq,piqa,...,humaneval [--limit N]."""

    name = "eval"

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(EvalCommand.name, help="perplexity, zero-shot accuracy (lm-evaluation-harness) and "
                           "HumanEval pass@1")
        p.add_argument("model")
        p.add_argument("--ppl", default=None, help="comma-separated perplexity data sets: wikitext2, ptb, c4, code, alpaca "
                       "or .txt/.jsonl files (default wikitext2,ptb; '' for none)")
        p.add_argument("--seq-len", type=int, default=None, help="tokens per window (default 128)")
        p.add_argument("--max-windows", type=window_count, default=None)
        p.add_argument("--tasks", default=None, help="comma-separated: boolq,piqa,hellaswag,winogrande,arc_easy,"
                       "arc_challenge,openbookqa (lm-eval), humaneval (greedy pass@1, runs the generated code)")
        p.add_argument("--limit", type=int, default=None, help="first N examples per task")
        p.add_argument("--protocol", default=None, help="a paper's protocol, which fixes everything above: "
                       "llm-pruner (whole WikiText-2 and PTB tests at 128, the 7 tasks in full) or slicegpt")
        p.add_argument("--batch-size", type=int, default=None,
                       help="zero-shot examples per batch (default: 16, fewer for large vocabularies); "
                       "HumanEval prompts per generation batch (default 8)")
        p.add_argument("--data-dir", default=None)
        p.add_argument("--device", default="cpu")
        add_dtype_flag(p)
        p.add_argument("--resume", default=None, metavar="DIR",
                       help="keep every scored window and answered zero-shot request in DIR (keyed by the "
                       "model's weights), so a stopped evaluation resumes where it stopped when run again with the same DIR")
        p.add_argument("--out", default=None, help="write JSON records and a markdown table next to it (and, with "
                       "humaneval, every task's completion and result as .humaneval.jsonl)")
        p.add_argument("--generation", choices=("auto", "vllm", "transformers"), default="auto",
                       help="what generates HumanEval's completions: vLLM (all problems in one batch; auto picks it "
                       "when --vllm-python or $GAPPRUNE_VLLM_PYTHON finds vLLM and the model is a folder) or transformers")
        p.add_argument("--vllm-python", default=None, help="the interpreter of vLLM's environment")
        p.set_defaults(run=EvalCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from gapprune.api import load, require_tokenizer
        from gapprune.data import check_source
        from gapprune.evaluate.humaneval import evaluate_humaneval, load_problems
        from gapprune.evaluate.protocols import get_protocol, refuse_overrides
        from gapprune.evaluate.records import eval_records, eval_table
        from gapprune.evaluate.zeroshot import TASKS
        from gapprune.output import check_output, write_file_atomically

        if args.out:
            check_output(args.out, overwrite=True, kind="file")
            if Path(args.out).suffix == ".md":
                raise ValueError(f"--out {args.out}: the records are JSON and the table goes beside them as .md; "
                                 "name the JSON file, e.g. --out eval.json")
        datasets = [d for d in (args.ppl if args.ppl is not None else "wikitext2,ptb").split(",") if d]
        tasks, seq_len, label = [t for t in (args.tasks or "").split(",") if t], args.seq_len or 128, {}
        if args.protocol:
            protocol = get_protocol(args.protocol)
            refuse_overrides(protocol, {"--ppl": args.ppl, "--seq-len": args.seq_len, "--max-windows": args.max_windows,
                                        "--tasks": args.tasks, "--limit": args.limit})
            datasets, tasks, seq_len, label = list(protocol.datasets), list(protocol.tasks), protocol.seq_len, \
                {"protocol": protocol.name}
        code_tasks = [t for t in tasks if t in CODE_TASKS]  # ours; the rest go to lm-eval
        tasks = [t for t in tasks if t not in CODE_TASKS]
        for task in tasks:
            if task not in TASKS:
                raise ValueError(f"unknown task {task!r}; choose from {', '.join([*TASKS, *CODE_TASKS])}")
        if code_tasks:
            load_problems(args.data_dir)  # a missing data file: before the model loads
        for dataset in datasets:
            check_source(dataset)
        generation = humaneval_generation(args) if code_tasks else "transformers"
        model, tokenizer = None, None
        if datasets or tasks or generation == "transformers":
            model, found = load(args.model, device=args.device, dtype=args.dtype)
            tokenizer = require_tokenizer(found, args.model, "evaluation reads text")
        records = [{**r, **label} for r in eval_records(
            model, tokenizer, args.model, datasets=datasets, tasks=tasks, seq_len=seq_len,
            max_windows=args.max_windows, limit=args.limit, batch_size=args.batch_size, data_dir=args.data_dir,
            resume=args.resume,
        )] if model is not None and tokenizer is not None else []
        humaneval = None
        if "humaneval" in code_tasks:
            if generation == "vllm" or model is None or tokenizer is None:
                humaneval = humaneval_in_vllm(args)
            else:
                humaneval = evaluate_humaneval(model, tokenizer, data_directory=args.data_dir, limit=args.limit,
                                               batch_size=args.batch_size)
            records.append({"model": args.model, **humaneval.to_record(args.limit), "generation": generation,
                            **label})
            print(f"humaneval pass@1 {humaneval.pass_at_1:.4f} ({humaneval.passed}/{len(humaneval.results)})")
        table = eval_table(records)
        print(table)
        if args.out:
            write_file_atomically(args.out, json.dumps(records, indent=1) + "\n")
            write_file_atomically(Path(args.out).with_suffix(".md"), table + "\n")
            if humaneval is not None:
                write_file_atomically(Path(args.out).with_suffix(".humaneval.jsonl"),
                                      "".join(json.dumps(row) + "\n" for row in humaneval.task_rows()))
        return 0


def humaneval_generation(args: argparse.Namespace) -> str:
    """vLLM when asked, or (auto) when it is found and the model is a folder it can serve; else transformers."""
    if args.generation != "auto":
        return str(args.generation)
    from gapprune.serving.vllm_runtime import check_servable, find_vllm

    try:
        check_servable(resolve_model_source(args.model))
        find_vllm(args.vllm_python)
    except (ValueError, OSError):
        return "transformers"
    return "vllm"


def resolve_model_source(spec: str) -> str:
    from gapprune.models.loading import resolve_model_source as resolve

    return str(resolve(spec, None))


def humaneval_in_vllm(args: argparse.Namespace) -> Any:
    from transformers import AutoTokenizer

    from gapprune.evaluate.humaneval import generate_completions_vllm, load_problems, score

    folder = resolve_model_source(args.model)
    problems = load_problems(args.data_dir)[: args.limit]
    completions = generate_completions_vllm(folder, AutoTokenizer.from_pretrained(folder), problems,
                                            vllm_python=args.vllm_python)
    return score(completions, problems)


class BenchCommand:
    """gapprune bench MODEL [--vs DENSE]: prefill latency, decode tokens/s, memory; speedup vs ideal."""

    name = "bench"

    @staticmethod
    def add(sub: Any) -> None:
        p = sub.add_parser(BenchCommand.name, help="measure speed and memory (optionally against the dense source)")
        p.add_argument("model")
        p.add_argument("--vs", default=None, help="the dense model to compare with")
        p.add_argument("--batches", default=None, help="batch sizes (default 1,16; 1,16,64 in vLLM)")
        p.add_argument("--prompt-tokens", type=int, default=512)
        p.add_argument("--new-tokens", type=int, default=None, help="default 32; 64 in vLLM")
        p.add_argument("--repeats", type=int, default=3)
        p.add_argument("--device", default="cpu")
        add_dtype_flag(p)
        p.add_argument("--out", default=None, help="write JSON records")
        p.add_argument("--runtime", choices=("transformers", "vllm"), default="transformers",
                       help="vllm: serve each folder in vLLM (batches 1,16,64 and 64 new tokens unless given)")
        p.add_argument("--vllm-python", default=None,
                       help="the interpreter of vLLM's environment (default $GAPPRUNE_VLLM_PYTHON, else this one)")
        p.add_argument("--parity", action="store_true",
                       help="vllm: also compare greedy text and WikiText-2 perplexity with transformers")
        p.add_argument("--data-dir", default=None, help="data folder for --parity (default $GAPPRUNE_DATA)")
        p.add_argument("--tp", type=int, default=1, help="vllm: tensor-parallel ranks")
        p.set_defaults(run=BenchCommand.run)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        if args.runtime == "vllm":
            from gapprune.cli.serve import bench_in_vllm

            return bench_in_vllm(args)
        from gapprune.api import load
        from gapprune.evaluate.records import speed_line, speed_records
        from gapprune.output import check_output, write_file_atomically

        if args.out:
            check_output(args.out, overwrite=True, kind="file")
        records = speed_records(
            [args.model] + ([args.vs] if args.vs else []), lambda spec: load(spec, device=args.device, dtype=args.dtype)[0],
            batches=[int(b) for b in (args.batches or "1,16").split(",")], prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens or 32, repeats=args.repeats, dense=args.vs,
        )
        for r in records:
            print(speed_line(r))
        if args.out:
            write_file_atomically(args.out, json.dumps(records, indent=1) + "\n")
        return 0
