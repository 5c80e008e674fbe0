#!/bin/bash
# SmolLM2 GAP with and without one auto refine round, 25% and 50%, compensation none and the default lsq
# (records `kind: auto_refine` in docs/results/refine.json). Needs the main job's folder runs/smollm2-gap-25 (README).
set -euo pipefail
cd "$(dirname "$0")/.."
G=".venv/bin/gapprune"
E="--eval wikitext2,ptb --eval-windows 64 --no-plots --overwrite --data-dir ${GAPPRUNE_DATA:-../shared/data}"
rm -rf runs/s-profile && cp -r runs/smollm2-gap-25 runs/s-profile  # the 25% profile to start from
for r in 25 50; do
  $G -v prune smollm2-135m --ratio 0.$r --compensate none --profile runs/s-profile --out runs/s$r-plain $E
  $G -v prune smollm2-135m --ratio 0.$r --compensate none --refine 1 --profile runs/s$r-plain --out runs/s$r-refine $E
  for v in plain refine; do
    $G prune smollm2-135m --plan runs/s$r-$v/plan.json --out runs/s$r-$v-lsq $E
  done
done
