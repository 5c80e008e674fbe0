"""Command-line flags built from the config dataclasses' fields (their help text included)."""

from __future__ import annotations

import argparse
from typing import Any

from gapprune.config import config_fields


def literal_help(text: str) -> str:
    """Help text as argparse prints it: a config's help is prose ("9-13% faster"), not a %-format."""
    return text.replace("%", "%%")


def window_count(text: str) -> int:
    """An argparse type for a number of evaluation windows: 0 or less would score nothing."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least 1 window (leave the flag out to score the whole set)")
    return value


def add_config_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
                     optional: tuple[str, ...] = ()) -> None:
    """One flag per config field; fields in `optional` default to None (the command fills them in)."""
    for name, default, required, help_text, kind in config_fields(cls):
        if name in skip:
            continue
        required = required and name not in optional
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=literal_help(help_text))
        else:
            parser.add_argument(flag, type=kind, default=None if name in optional else default, required=required,
                                help=literal_help(help_text))


def config_from(args: argparse.Namespace, cls: type) -> Any:
    return cls(**{name: getattr(args, name) for name, *_ in config_fields(cls)})


DTYPE_HELP = ("the weights' dtype: auto (the checkpoint's own on a GPU, float32 on a CPU)|float32|bfloat16|float16; "
              "losses accumulate in float32")


def add_dtype_flag(parser: argparse.ArgumentParser) -> None:
    """`--dtype` for commands that load a model without a config dataclass."""
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto", help=DTYPE_HELP)
