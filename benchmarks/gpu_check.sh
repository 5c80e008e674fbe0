#!/usr/bin/env bash
# The GPU check, on one CUDA device. Not yet run on a GPU machine.
#   tests   the tests marked gpu (tests/gpu: removal = masking, batched = reference table, CUDA plan = CPU plan,
#           save/reload logits, streamed = in-memory, torchrun on one GPU with NCCL);
#   smollm2 SmolLM2-135M (real weights) pruned at 25% on CUDA in float32 and in bf16: summed exact float32 ΔL of
#           both plans on the float32 table, WikiText-2 perplexity (256 windows of 128), peak host and GPU memory;
#   q15     a random-weight model of Qwen2.5-Coder-1.5B's shape (Llama layout, bf16 checkpoint, 151,936-token
#           head) pruned at 25% of the decoder with the defaults: time per phase and peak memory, not quality.
#
# A GPU machine without network access that takes at most 64 MiB per upload gets the inputs in two uploads
# (pack them first with benchmarks/gpu_bundle.sh), the second before the machine is reset:
#   1. upload .gpu-a/:     bash benchmarks/gpu_check.sh stage    (keeps half the GGUF, runs the tests)
#   2. upload .gpu/:       bash benchmarks/gpu_check.sh models   (SmolLM2 and the 1.5B-shaped model)
#   here: bash benchmarks/gpu_check.sh record DIR...             (both runs' JSON files -> docs/results/gpu.json)
# On a GPU machine of your own with the package installed: bash benchmarks/gpu_check.sh all
set -uo pipefail
cd "$(dirname "$0")/.."
PHASE=${1:?usage: gpu_check.sh stage|models|all|record DIR...}
if [ -x .venv/bin/python ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
RUNS=${RUNS:-$PWD/runs/gpu-check}
RESULTS=${OUT:-runs/gpu}  # the device tool brings back what is written under $OUT
mkdir -p "$RUNS" "$RESULTS"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1 GAPPRUNE_CACHE=${GAPPRUNE_CACHE:-$RUNS/cache}
if [ -d .gpu/data ]; then export GAPPRUNE_DATA=$PWD/.gpu/data; fi
if [ -d .gpu/wheels ] && ! "$PY" -c "import gguf" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --target "$RUNS/site" .gpu/wheels/*.whl \
    && export PYTHONPATH="$PYTHONPATH:$RUNS/site"
fi

step() {  # step NAME LIMIT_S CMD...: run with a time limit; rc, seconds and the log's tail on failure
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" > "$RUNS/$name.log" 2>&1
  local rc=$?
  "$PY" - "$RUNS" "$name" "$rc" "$(( $(date +%s) - t0 ))" <<'PY'
import json, sys
from pathlib import Path
runs, name, rc, wall = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
record = {"step": name, "rc": rc, "wall_s": wall}
if rc != 0:
    record["log_tail"] = (runs / f"{name}.log").read_text(errors="replace")[-3000:]
(runs / f"{name}.step.json").write_text(json.dumps(record))
PY
}

tests() {
  step tests 300 "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider --junitxml "$RUNS/tests.xml"
}

smollm2() {  # $1: the model (alias or GGUF file)
  step smollm2 300 "$PY" benchmarks/precision.py --model "$1" --device cuda --dtypes float32,bfloat16 --runs "$RUNS" \
    --windows 256 --out "$RUNS/smollm2.json"
}

q15() {
  local model=$RUNS/qwen2.5-1.5b-shaped
  step q15_make 120 "$PY" benchmarks/scale.py make --out "$model" --layers 28 --hidden 1536 --heads 12 --kv-heads 2 \
    --intermediate 8960 --vocab 151936 --dtype bfloat16 --text "${GAPPRUNE_DATA:-.}/wikitext-2-raw/wiki.valid.raw"
  step q15 300 "$PY" -m gapprune -v prune "$model" --ratio 0.25 --ratio-of decoder --device cuda --out "$RUNS/q15-25" \
    --overwrite --no-plots
}

collect() {  # collect FILE STEP...: the steps' records (with what each run wrote) in one JSON file
  local file=$1; shift
  "$PY" - "$RUNS" "$file" "$@" <<'PY'
import json, subprocess, sys, xml.etree.ElementTree as ET
from pathlib import Path
runs, file, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout.strip()
except FileNotFoundError:
    gpu = "no nvidia-smi"
out = [{"kind": "device", "gpu": gpu}]
for name in names:
    path = runs / f"{name}.step.json"
    record = json.loads(path.read_text()) if path.is_file() else {"step": name, "rc": None, "note": "not run"}
    if name == "tests" and (runs / "tests.xml").is_file():
        root = ET.parse(runs / "tests.xml").getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        record |= {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    if name == "smollm2" and (runs / "smollm2.json").is_file():
        record["records"] = json.loads((runs / "smollm2.json").read_text())
    if name == "q15" and (runs / "q15-25" / "run.json").is_file():
        record["run"] = json.loads((runs / "q15-25" / "run.json").read_text())
    out.append(record)
file.write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps([{k: r.get(k) for k in ("step", "rc", "wall_s", "failures")} for r in out[1:]]))
PY
}

case "$PHASE" in
  stage)
    mkdir -p .gpu-stage && cp .gpu-a/smollm2.part1 .gpu-stage/  # ignored, so it stays for the next run
    tests
    collect "$RESULTS/gpu-stage.json" tests ;;
  models)
    gguf=$RUNS/SmolLM2-135M-Instruct.Q4_1.gguf
    cat .gpu-stage/smollm2.part1 .gpu/smollm2.part2 > "$gguf" 2>/dev/null
    if [ "$(sha256sum < "$gguf" | cut -d' ' -f1)" = "$(cat .gpu/smollm2.sha256)" ]; then smollm2 "$gguf"
    else echo '{"step": "smollm2", "rc": null, "note": "skipped: the first half of the GGUF did not stay from the stage run (the machine was reset between the runs)"}' > "$RUNS/smollm2.step.json"; fi
    q15
    collect "$RESULTS/gpu-models.json" smollm2 q15_make q15 ;;
  all)
    tests; smollm2 smollm2-135m; q15
    collect "$RESULTS/gpu-all.json" tests smollm2 q15_make q15 ;;
  record)
    shift
    "$PY" - "$@" <<'PY'
import datetime, json, sys
from pathlib import Path
records = []
for folder in sys.argv[1:]:
    for path in sorted(Path(folder).glob("gpu-*.json")):
        for record in json.loads(path.read_text()):
            if record.get("kind") != "device" or not any(r.get("kind") == "device" for r in records):
                records.append(record)
for record in records:
    record.setdefault("date", datetime.date.today().isoformat())
Path("docs/results/gpu.json").write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n")
print(f"docs/results/gpu.json: {len(records)} records")
PY
    ;;
  *) echo "unknown phase $PHASE: stage, models, all or record" >&2; exit 2 ;;
esac
