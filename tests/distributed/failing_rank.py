"""`gapprune prune` under torchrun with rank 1's profiling raising, the auto screen's or the exact table's
(used by test_torchrun.py)."""

import sys

import gapprune.profiling.auto_measure
import gapprune.profiling.exact
from gapprune import distributed
from gapprune.cli import main


def broken(*args: object, **kwargs: object) -> object:
    raise RuntimeError("injected profiling failure")


if distributed.rank() == 1:
    gapprune.profiling.auto_measure.build_loss_table_batched = broken
    gapprune.profiling.exact.build_loss_table_batched = broken
sys.exit(main(sys.argv[1:]))
