#!/usr/bin/env bash
# The GPU check: one prepared run on one CUDA device from a clean checkout, within 9 minutes, each step under
# its own time limit, the summary rewritten as each step ends (a killed run still brings back what finished).
#
#   bash benchmarks/gpu_bundle.sh                  # here, once: the calibration text into .gpu/ (ignored by git)
#   bash benchmarks/gpu_check.sh run               # there, with .gpu carried: summary in $OUT/gpu-check.json
#   bash benchmarks/gpu_check.sh record DIR        # here: that summary -> docs/results/gpu.json
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_SHAPE=tiny bash benchmarks/gpu_check.sh run    # the dry run on a CPU
#
# Steps (limits in seconds, 540 in all):
#   tests    120  the tests marked gpu (tests/gpu: removal = masking, batched = reference table, CUDA plan =
#                 CPU plan on a seeded tiny model, save/reload logits, streamed = in-memory, NCCL under torchrun,
#                 Grams/OBS/lsq solved on the GPU);
#   make      90  a random model of Qwen2.5-7B's shape (28 layers, hidden 3,584, MLP 18,944, 28/4 heads,
#                 vocabulary 152,064), bf16, drawn on the device and written one layer per shard;
#   prune    210  25% of its decoder with the CLI's defaults on the device: phases and peak GPU memory (run.json);
#   torchrun 120  the same prune under torchrun --nproc-per-node 1 (NCCL on a GPU, gloo on a CPU); if it runs out
#                 of time, the tests' NCCL barrier on a tiny model is the NCCL evidence.
# The image's packages suffice (torch, transformers, safetensors, numpy, tqdm, pytest); only the WikiText-2
# validation text travels (.gpu/data, 1 MB). The 98 MB SmolLM2 GGUF does not fit one transfer and is not used.
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:?usage: gpu_check.sh run|record DIR}
if [ -x .venv/bin/python ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
DEVICE=${GPU_CHECK_DEVICE:-cuda}
SHAPE=${GPU_CHECK_SHAPE:-7b}
RUNS=${RUNS:-$PWD/runs/gpu-check}
RESULTS=${OUT:-$RUNS/out}  # the device tool brings back what is written under $OUT
mkdir -p "$RUNS" "$RESULTS"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1 GAPPRUNE_CACHE=${GAPPRUNE_CACHE:-$RUNS/cache}
if [ -d .gpu/data ]; then export GAPPRUNE_DATA=$PWD/.gpu/data; fi
MODEL=$RUNS/qwen2.5-$SHAPE-shaped
case "$SHAPE" in
  7b)   DIMS=(--layers 28 --hidden 3584 --heads 28 --kv-heads 4 --intermediate 18944 --vocab 152064) ;;
  tiny) DIMS=(--layers 4 --hidden 256 --heads 4 --kv-heads 2 --intermediate 512 --vocab 4096) ;;
  *) echo "unknown GPU_CHECK_SHAPE $SHAPE: 7b or tiny" >&2; exit 2 ;;
esac
PRUNE=(prune "$MODEL" --ratio 0.25 --ratio-of decoder --device "$DEVICE" --dtype bfloat16 --overwrite --no-plots)

step() {  # step NAME LIMIT_S CMD...: run with a time limit; rc, seconds and the log's tail on failure; then the summary
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" > "$RUNS/$name.log" 2>&1
  local rc=$?
  "$PY" benchmarks/gpu_summary.py step "$RUNS" "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit"
  "$PY" benchmarks/gpu_summary.py collect "$RUNS" "$RESULTS/gpu-check.json" "$DEVICE" "$SHAPE"
  cp "$RUNS/$name.log" "$RESULTS/$name.log" 2>/dev/null
}

case "$PHASE" in
  run)
    step tests 120 "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider --junitxml "$RUNS/tests.xml"
    step make 90 "$PY" benchmarks/scale.py make --out "$MODEL" "${DIMS[@]}" --dtype bfloat16 --device "$DEVICE" \
      --text "${GAPPRUNE_DATA:-.}/wikitext-2-raw/wiki.valid.raw"
    step prune 210 "$PY" -m gapprune -v "${PRUNE[@]}" --out "$RUNS/prune"
    step torchrun 120 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m gapprune -v "${PRUNE[@]}" \
      --out "$RUNS/torchrun" ;;
  record)
    shift
    "$PY" benchmarks/gpu_summary.py record docs/results/gpu.json "$@" ;;
  *) echo "unknown phase $PHASE: run or record" >&2; exit 2 ;;
esac
