#!/usr/bin/env bash
# The first swarm on a GPU, then the GPU figures: one lent device call (issue 59).
#
#     bash examples/gpu_wheels.sh         # here, where pip reaches PyPI: .whl/ (git-ignored; 32 wheels, 28 MB)
#     bash examples/gpu_swarm.sh [OUT]    # there, as the device call's whole command, carrying .whl
#
# The device call: run(command="bash examples/gpu_swarm.sh", carry=[".whl"], timeout_s=600). It plans
# TOTAL_S (560 s) of the call's 600; with the machine's start, ~12 of a session's 15 device minutes.
#
# 1. Installs the carried wheels (.whl/: hivemind with its p2pd, msgspec, ...) offline into /tmp/site;
#    the project runs from the working tree that travels (PYTHONPATH=.:/tmp/site).
# 2. examples/rehearsal.py --device cuda at the whole Qwen3-0.6B shape (28 layers, 151,936 tokens,
#    random weights): a bootstrap, a bfloat16 learner and 2 samplers (vLLM where it imports, else
#    HF) as processes on the one GPU, 256-token completions, until 8 versions or 3 minutes after the
#    model folder is written, all under REHEARSAL_S (270 s). All 28 layers, because on a GPU a step
#    of 4 groups takes under a second and a sampler's batch (8 x 256 tokens) some seconds, so versions
#    should come every ~10 s after a start of a minute or two (the learner's load and eval, the
#    keyframe, the samplers' loads): fewer layers would save little and measure a smaller model.
#    Its table: per version the step's parts, publish s, version MB, the seconds until each sampler
#    held it, staleness, the bounds that fired; then the samplers' tokens/s and each process's peak
#    host memory. The GPU's own memory and use are sampled every 10 s beside it (device.txt).
# 3. examples/gpu_figures.sh with its parts' limits lowered to what is left of TOTAL_S (560 s).
#
# Every part runs under `timeout`, so one that hangs leaves the others' figures. What comes back in
# OUT (default $OUT, the device call's folder, else /tmp/gpu_swarm_out; at most 8 files): device.txt,
# rehearsal.md, rehearsal.json, rehearsal.log, node_logs.txt, figures.log, figures.md and
# honest_groups.jsonl (copy it into docs/results/honest_groups/). The tables are printed again at the end, in the call's tail.
#
# A rehearsal of the script itself on a CPU, in a few minutes (the sizes are environment variables):
#     DEVICE=cpu SHAPE=wide-vocab-tiny COMPLETION_LEN=48 VERSIONS=2 MINUTES=12 REHEARSAL_S=900 \
#       TOTAL_S=1500 MID_S=5 BIG_S=5 BUILD_S=60 COST_S=60 bash examples/gpu_swarm.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/gpu_swarm_out}}
work=${WORK:-/tmp/gpu_swarm}
device=${DEVICE:-cuda}
site=${SITE:-/tmp/site}
wheels=${WHEELS:-.whl}
total=${TOTAL_S:-560}  # the device call's limit is 600 s: 40 to spare
mkdir -p "$out"
rm -f "$out"/{device.txt,rehearsal.md,rehearsal.json,rehearsal.log,node_logs.txt,figures.log,figures.md,honest_groups.jsonl}
rm -rf "$work" && mkdir -p "$work"
export PYTHONUNBUFFERED=1
info="$out/device.txt"

# 1. the carried wheels, and what this machine has
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$wheels"/*.whl 2>&1 | tail -3 || exit 1
  export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
{
  date -u
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', \
    torch.version.cuda, 'available', torch.cuda.is_available())"
  python3 -m pip list 2>/dev/null \
    | grep -iE '^(transformers|huggingface.hub|tokenizers|safetensors|numpy|pyarrow|fsspec|pandas|typer|msgpack|protobuf|vllm) '
} 2>&1 | tee "$info"
# every import the rehearsal's processes need, and the CLI, before minutes are spent on them
python3 -c "import hivemind, msgspec, datasets, constriction, zstandard, pydantic, cli.main; print('imports ok')" 2>&1 \
  | tee -a "$info"
[ "${PIPESTATUS[0]}" = 0 ] && python3 -m cli.main --help >/dev/null \
  || { echo "!! the swarm cannot start here: see above" | tee -a "$info"; exit 1; }
if [ -z "${ENGINE:-}" ]; then
  ENGINE=hf
  [ "$device" != cpu ] && python3 -c "import vllm" 2>/dev/null && ENGINE=vllm
fi

# 2. the rehearsal, with the GPU's memory sampled beside it
gpu_watch=
if command -v nvidia-smi >/dev/null; then
  (while :; do
     nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader
     nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
     sleep 10
   done) >"$work/gpu_use.csv" 2>&1 &
  gpu_watch=$!
fi
cmd=(python3 examples/rehearsal.py --device "$device" --shape "${SHAPE:-qwen3-0.6b}" --layers "${LAYERS:-0}"
     --versions "${VERSIONS:-8}" --minutes "${MINUTES:-3}" --samplers "${SAMPLERS:-2}" --engine "$ENGINE"
     --completion-len "${COMPLETION_LEN:-256}" --learner-threads "${LEARNER_THREADS:-4}"
     --sampler-threads "${SAMPLER_THREADS:-2}"
     --run-dir "$work/rehearsal" --out "$out/rehearsal.md")
echo "== rehearsal (limit ${REHEARSAL_S:-270} s): ${cmd[*]}" | tee "$out/rehearsal.log"
t0=$SECONDS
# SIGTERM at the limit: the rehearsal stops its swarm (the learner's checkpoint at size: ~7 GB) and
# writes the table so far; SIGKILL 40 s on (its rows are in rehearsal.log as they came)
timeout -k 40 "${REHEARSAL_S:-270}" "${cmd[@]}" 2>&1 | tee -a "$out/rehearsal.log"
echo "== rehearsal: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$out/rehearsal.log"
[ -n "$gpu_watch" ] && kill "$gpu_watch" 2>/dev/null
cp "$work/rehearsal/rehearsal.json" "$out/" 2>/dev/null
for log in "$work"/rehearsal/logs/*.log; do  # each node's last lines: what a failed version needs
  [ -e "$log" ] && { echo "==== $(basename "$log")"; tail -n 300 "$log"; }
done >"$out/node_logs.txt"
[ -s "$work/gpu_use.csv" ] && { echo "== the GPU's memory and use every 10 s during the rehearsal"; cat "$work/gpu_use.csv"; } \
  >>"$info"

# 3. the GPU figures, in what is left (their parts' limits lowered: the sum stays under it)
left=$((total - SECONDS - 15))
if [ "$left" -gt 60 ]; then
  echo "== gpu_figures (limit $left s)" | tee "$out/figures.log"
  MID_S=${MID_S:-25} BIG_S=${BIG_S:-25} BUILD_S=${BUILD_S:-40} COST_S=${COST_S:-75} PICKER_S=${PICKER_S:-15} \
    FILTERS_S=${FILTERS_S:-15} VLLM_S=${VLLM_S:-60} DEVICE=$device \
    timeout -k 10 "$left" bash examples/gpu_figures.sh "$work/figures" 2>&1 | tee -a "$out/figures.log"
else
  echo "== gpu_figures: not run, $left s left of TOTAL_S" | tee "$out/figures.log"
fi
cp "$work/figures/honest_groups.jsonl" "$out/" 2>/dev/null
{
  [ -s "$work/figures/honest_groups.jsonl" ] \
    && python3 examples/bench_honest_groups.py summary "$work/figures/honest_groups.jsonl"
  [ -s "$work/figures/cost.md" ] && cat "$work/figures/cost.md"
} >"$out/figures.md" 2>&1

echo; echo "==== figures.md"; cat "$out/figures.md"
echo; echo "==== rehearsal.md"; cat "$out/rehearsal.md" 2>/dev/null || echo "(no table: see rehearsal.log)"
echo; echo "== gpu_swarm.sh: ${SECONDS} s in all; files in $out: $(ls "$out" | tr '\n' ' ')"
