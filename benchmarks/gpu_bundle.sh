#!/usr/bin/env bash
# Pack what benchmarks/gpu_check.sh needs on a GPU machine without network access (no PyPI, no hub)
# that receives at most 64 MiB per upload (the working tree plus the packed folder).
#
#   GAPPRUNE_DATA=../shared/data bash benchmarks/gpu_bundle.sh
#
# .gpu-a/  the first half of the embedded SmolLM2 GGUF (98 MB: too large for one upload)
# .gpu/    its second half and sha256, the WikiText-2 files, and the `gguf` wheel (the GPU image lacks it)
# Both folders are ignored by git: the weights and the data files must not be committed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${GAPPRUNE_DATA:?set GAPPRUNE_DATA to the data folder (e.g. ../shared/data)}
LIMIT=$((64 * 1024 * 1024))

rm -rf .gpu-a .gpu
mkdir -p .gpu-a .gpu/data/wikitext-2-raw .gpu/wheels
GGUF=$("$PY" -c "from gapprune.models.loading import resolve_alias; print(resolve_alias('smollm2-135m'))")
SIZE=$(stat -c %s "$GGUF")
HALF=$((SIZE / 2))
head -c "$HALF" "$GGUF" > .gpu-a/smollm2.part1
tail -c +"$((HALF + 1))" "$GGUF" > .gpu/smollm2.part2
sha256sum < "$GGUF" | cut -d' ' -f1 > .gpu/smollm2.sha256
cp "$DATA"/wikitext-2-raw/*.jsonl "$DATA"/wikitext-2-raw/*.raw .gpu/data/wikitext-2-raw/
"$PY" -m pip download -q --no-deps --only-binary=:all: -d .gpu/wheels "gguf==$("$PY" -c 'import importlib.metadata as m; print(m.version("gguf"))')"

tree=$(git ls-files -z | xargs -0 cat | wc -c)
for folder in .gpu-a .gpu; do
  total=$((tree + $(du -sb "$folder" | cut -f1)))
  echo "$folder: $((total / 1024 / 1024)) MiB with the working tree (limit 64)"
  [ "$total" -lt "$LIMIT" ] || { echo "$folder is too large for one upload" >&2; exit 1; }
done
