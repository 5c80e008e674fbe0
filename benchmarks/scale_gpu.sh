#!/usr/bin/env bash
# The 7B-shaped exact profile of docs/performance.md §5, now with the decoder layers streamed from
# disk and the replays shared by N torchrun ranks (one GPU each, NCCL), against one rank.
#
#   N=2 DATA=/path/to/shared/data benchmarks/scale_gpu.sh        # on a machine with >= N GPUs
#
# Writes a random Llama-2-7B-shaped model (32 layers, hidden 4096, 32 heads, MLP 11008, vocabulary
# 32000; 27 GB in float32) shard by shard under $DIR, then times `gapprune prune` with 1 and N ranks
# (2,048 profiling tokens: 4 x 512) and appends records to $DIR/scale.json; the model is deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2}
DIR=${DIR:-runs/scale-gpu}
DATA=${DATA:-$(cd .. && pwd)/shared/data}
PY=${PY:-.venv/bin/python}
MODEL=$DIR/llama-7b-shaped
trap 'rm -rf "$MODEL"' EXIT
[ -f "$MODEL/model.safetensors.index.json" ] || $PY benchmarks/scale.py make --out "$MODEL" --layers 32 --hidden 4096 \
    --heads 32 --kv-heads 32 --intermediate 11008 --vocab 32000 --text "$DATA/wikitext-2-raw/wiki.valid.raw"
COMMON=(--ratio 0.25 --offload on --device cuda --calib wikitext2 --data-dir "$DATA" --calib-samples 4 --batch-size 4
        --profile-samples 4 --seq-len 512 --mlp-stride 4 --compensate none --no-plots --overwrite)
nvidia-smi --query-gpu=name,memory.total --format=csv
uptime
$PY benchmarks/scale.py run --model "$MODEL" --name llama-2-7b-shaped-random --label streamed --nproc 1 \
    --record "$DIR/scale.json" -- "${COMMON[@]}" --out "$DIR/ws1"
uptime
$PY benchmarks/scale.py run --model "$MODEL" --name llama-2-7b-shaped-random --label streamed --nproc "$N" \
    --record "$DIR/scale.json" --reference-table "$DIR/ws1/loss_table.json" -- "${COMMON[@]}" --out "$DIR/ws$N"
uptime
