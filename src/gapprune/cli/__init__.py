"""Command line: `gapprune prune | profile | export | ppl | eval | bench | tune | info`.

Parsing only; the work lives in the library. One module per command group; add a command by
writing a class with `name`, `add(subparsers)` and `run(args)` and listing it in `COMMANDS`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gapprune.cli.evaluate import BenchCommand, EvalCommand, InfoCommand, PplCommand
from gapprune.cli.export import ExportCommand
from gapprune.cli.prune import ProfileCommand, PruneCommand
from gapprune.cli.tune import TuneCommand

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
