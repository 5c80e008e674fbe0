"""`gapprune prune` under torchrun with rank 1's exact profiler raising (used by test_torchrun.py)."""

import sys

import gapprune.profiling.tables
from gapprune import distributed
from gapprune.cli import main


def broken(*args: object, **kwargs: object) -> object:
    raise RuntimeError("injected profiling failure")


if distributed.rank() == 1:
    gapprune.profiling.tables.build_loss_table_batched = broken
sys.exit(main(sys.argv[1:]))
