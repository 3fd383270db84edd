#!/usr/bin/env bash
# Every GPU figure of the audit across precisions (issue 40) and the learner's MFU, in one run
# where CUDA is present (never needed by CI):
#
#     bash examples/gpu_figures.sh [OUT_DIR]          # under 10 minutes: one lent device call
#     FULL=1 bash examples/gpu_figures.sh [OUT_DIR]   # also bench_bf16_audit's whole table and the learner
#
# Sized for a lent device session: 15 minutes of device time in all, starts included, and at most
# 10 minutes a command. So the parts' limits add up to 580 s by default, and the time goes
# first to what no GPU has measured enough yet: honest groups at the tolerance on the 32k and 151k
# shapes. Each needs 3,838 groups with none failed (Wilson): on an H100, ~8 minutes of HF sampling
# for the 32k shape and ~30 for the 151k one (docs/BENCHMARKS.md), so
# each session adds its groups to OUT_DIR/honest_groups.jsonl: copy that file into
# docs/results/honest_groups/, and `python examples/bench_honest_groups.py summary
# docs/results/honest_groups/*.jsonl` pools every session's groups. The whole table (every model,
# batch and length, the attacks; an H100 ran it on
# 2026-11-26, docs/BENCHMARKS.md) runs only with FULL=1.
#
# Each part runs in its own process under its own time limit, so one that fails or runs long
# leaves the others' figures; every log and table lands in OUT_DIR (default gpu_figures/).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_figures}
device=${DEVICE:-cuda}  # DEVICE=cpu with small limits: a rehearsal of the script itself
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
honest() {  # honest SHAPE DTYPE SECONDS: sample and audit groups for SECONDS (its limit: BUILD_S more, to build)
  part "honest-$1-$2" "$(($3 + ${BUILD_S:-60}))" python3 examples/bench_honest_groups.py run --device "$device" --shape "$1" \
    --dtype "$2" --batch 128 --tokens 128 --seconds "$3" --out "$out/honest_groups.jsonl"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/device.txt"
has_vllm=0
python3 -c "import vllm" 2>/dev/null && has_vllm=1
honest mid bfloat16 "${MID_S:-$((has_vllm ? 60 : 180))}"  # vLLM's part takes the difference
honest big bfloat16 "${BIG_S:-150}"
# the race's cost at the 151k shape (the goal: <= 5% over multinomial sampling), on as few groups as
# the script allows before it
part cost "${COST_S:-90}" python3 examples/bench_bf16_audit.py --device "$device" --preset gpu --models big \
  --dtypes bfloat16 --batches 128 --big-lengths 128 --big-groups 2 --cost --out "$out/cost.md"
part picker "${PICKER_S:-20}" python3 examples/bench_picker.py --device "$device" --batch 32 128 --vocab 151936 32768
part filters "${FILTERS_S:-20}" python3 examples/bench_filters.py --device "$device"
if [ "$has_vllm" = 1 ]; then
  part vllm "${VLLM_S:-120}" python3 examples/bench_vllm.py --dtype bfloat16
else
  echo "vLLM is not installed here: its throughput is not measured" | tee "$out/vllm.log"
fi
if [ "${FULL:-0}" = 1 ]; then  # measured on an H100 on 2026-11-26 (docs/BENCHMARKS.md)
  part learner "${LEARNER_S:-60}" python3 examples/bench_learner.py --shape qwen3-0.6b --device "$device" --dtype bfloat16 \
    --steps 2 --groups 8 --completion-len 512 --budget 8192 --sampler-prompts 16 --sampler-tokens 128
  part audit "${AUDIT_S:-420}" python3 examples/bench_bf16_audit.py --device "$device" --preset gpu --cost --out "$out/audit.md"
fi
python3 examples/bench_honest_groups.py summary "$out/honest_groups.jsonl" | tee "$out/honest_groups.md"
