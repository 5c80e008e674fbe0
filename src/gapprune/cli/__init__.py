"""Command line: `gapprune prune | profile | export | ppl | eval | bench | tune | info`.

Parsing only; the work lives in the library. One module per command group; add a command by
writing a class with `name`, `add(subparsers)` and `run(args)` and listing it in `COMMANDS`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

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
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.command_line = ["gapprune", *argv]  # what records name as their command, also when called from Python
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        with stop_on_sigterm():
            if getattr(args, "device", None):
                from gapprune.models.loading import check_device

                check_device(args.device)  # before any work, not when the model is first moved
            return int(args.run(args))
    except (ValueError, OSError, KeyError, ImportError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        if isinstance(err, OSError) and err.filename and not isinstance(err, (FileNotFoundError, FileExistsError)):
            message = f"cannot use {err.filename}: {err.strerror}; check the path and its permissions"
        print(f"gapprune {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        print(f"gapprune {args.command}: stopped{f' by {stop}' if str(stop) else ''}; no partial output is left "
              "(profiling checkpoints stay in the cache, so a rerun resumes)", file=sys.stderr)
        return 130
    except Exception as err:
        from gapprune.distributed import describe

        if not describe():
            raise
        print(f"gapprune {args.command}: {describe()} failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM (a scheduler's kill, `timeout`) unwinds like Ctrl-C, so temporary output folders are removed.

    Python's default for SIGTERM is to die on the spot, leaving `.OUT.tmp-*` folders behind. Under
    torchrun `distributed.setup` installs its own handler, which this one then gives way to.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

if __name__ == "__main__":
    sys.exit(main())
