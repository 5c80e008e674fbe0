#!/usr/bin/env bash
# Pack what benchmarks/gpu_check.sh needs on a GPU machine without network access beyond its image's packages:
# the WikiText-2 validation text (calibration, and the random model's small tokenizer), into .gpu/ (ignored by
# git: the data files must not be committed). Name .gpu in the device run's carry.
#
#   GAPPRUNE_DATA=../shared/data bash benchmarks/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${GAPPRUNE_DATA:?set GAPPRUNE_DATA to the data folder (e.g. ../shared/data)}
rm -rf .gpu .gpu-a .gpu-stage
mkdir -p .gpu/data/wikitext-2-raw
cp "$DATA"/wikitext-2-raw/validation.jsonl "$DATA"/wikitext-2-raw/wiki.valid.raw .gpu/data/wikitext-2-raw/
total=$(( $(git ls-files -z | xargs -0 cat | wc -c) + $(du -sb .gpu | cut -f1) ))
echo ".gpu: $((total / 1024 / 1024)) MiB with the working tree (limit 64)"
