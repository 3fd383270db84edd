#!/usr/bin/env bash
# Every GPU figure of the audit across precisions (issue 40: the table, the picker's cost, the
# auditor's filter slack) and the learner's MFU in one run, where
# CUDA is present (never needed by CI):
#
#     bash examples/gpu_figures.sh [OUT_DIR]
#
# Each part runs in its own process under its own time limit, so one that fails or runs long
# leaves the others' figures; every log and table lands in OUT_DIR (default gpu_figures/).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_figures}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
part() {  # part NAME SECONDS COMMAND...: run one part, its output to OUT/NAME.log
  local name=$1 secs=$2
  shift 2
  echo "== $name (limit ${secs} s)"
  local t0=$SECONDS
  timeout "$secs" "$@" 2>&1 | tee "$out/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/device.txt"
part audit "${AUDIT_S:-420}" python3 examples/bench_bf16_audit.py --device cuda --preset gpu --cost --out "$out/audit.md"
part picker "${PICKER_S:-60}" python3 examples/bench_picker.py --device cuda --batch 32 128 --vocab 151936 32768
part filters "${FILTERS_S:-60}" python3 examples/bench_filters.py --device cuda
part learner "${LEARNER_S:-90}" python3 examples/bench_learner.py --shape qwen3-0.6b --device cuda --dtype bfloat16 \
  --steps 3 --groups 8 --completion-len 512 --budget 8192 --sampler-prompts 16 --sampler-tokens 128
if python3 -c "import vllm" 2>/dev/null; then
  part vllm "${VLLM_S:-120}" python3 examples/bench_vllm.py --dtype bfloat16
else
  echo "vLLM is not installed here: its throughput is not measured" | tee "$out/vllm.log"
fi
