"""`python -m gapprune ...` (what `torchrun --nproc-per-node N -m gapprune prune ...` runs)."""

import sys

from gapprune.cli import main

sys.exit(main())
