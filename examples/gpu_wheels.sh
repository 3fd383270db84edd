#!/usr/bin/env bash
# The wheels a lent GPU machine lacks to run this project's swarm, downloaded HERE (where pip reaches
# PyPI) into .whl/ (git-ignored), for that machine's Python 3.12 on x86-64. A device call carries the
# folder (`carry: [".whl"]`) and examples/gpu_swarm.sh installs it there with pip, offline, into
# /tmp/site; the project itself runs from the working tree that travels (PYTHONPATH=.:/tmp/site).
#
#     bash examples/gpu_wheels.sh                              # .whl/ for the GPU machine: 32 wheels, 28 MB
#     PYVER=3.11 DEST=/tmp/whl311 bash examples/gpu_wheels.sh  # the same set for this machine's Python,
#                                                              # to rehearse the install here
#
# What that machine has (/work/.library/device/KINDS.md, "Python packages already there"): torch,
# transformers 5.17, tokenizers, safetensors, huggingface-hub, numpy, scipy, msgpack, typer, rich,
# grpcio, uvloop, sortedcontainers, pyyaml, aiohttp, xxhash, matplotlib, tensorboard, pyarrow,
# pandas, fsspec and more. So the wheels are pyproject.toml's dependencies that it lacks, hivemind's
# runtime ones, and their own; at the versions CI tests (.ci/constraints.txt), one of each (two
# versions of a package stop pip's whole install there). Two more, though that machine has them:
# protobuf (hivemind's generated modules need a runtime >= 5.27.2, and that machine's version is not
# known here) and typing_extensions (pydantic needs >= 4.16). Not carried: grpcio-tools, which
# hivemind lists but only its build uses (2.5 MB), and vLLM (hundreds of MB: gpu_swarm.sh uses it
# where that machine has it, else HF samplers).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${DEST:-.whl}
pyver=${PYVER:-3.12}
WHEELS=(
  # the swarm: hivemind (its wheel carries the p2pd binary, manylinux x86_64) and what it imports
  hivemind ConfigArgParse netaddr py-cid py-multibase py-multicodec
  py-multihash base58 blake3 mmh3 morphys protobuf
  # swarm/ and node/ themselves: wire structs, weight patches, identities, configs
  msgspec constriction zstandard cryptography cffi pycparser
  pydantic pydantic_core annotated-types typing-inspection typing_extensions
  # tasks: a dataset task's files (datasets) and the math reward (math-verify)
  datasets dill multiprocess math-verify latex2sympy2_extended antlr4-python3-runtime
)
BUILT=(prefetch_generator python-baseconv varint)  # hivemind's too: pure Python, published as sources only
pin() {
  # the version CI tests; the lock spells names as PyPI does, so compare them normalized
  python3 - "$1" <<'EOF'
import re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
want = norm(sys.argv[1])
for line in open(".ci/constraints.txt"):
    if "==" in line and not line.startswith("#") and norm(line.split("==")[0]) == want:
        print(line.strip())
        break
EOF
}
pins=() built=()
for name in "${WHEELS[@]}" "${BUILT[@]}"; do
  p=$(pin "$name")
  [ -n "$p" ] || { echo "$name is not pinned in .ci/constraints.txt: pin it there (bash .ci/lock)" >&2; exit 1; }
  if [[ " ${BUILT[*]} " == *" $name "* ]]; then built+=("$p"); else pins+=("$p"); fi
done
mkdir -p "$dest"
rm -f "$dest"/*.whl  # one version of each: a wheel left from an older lock would stop the install
# --platform: pip matches each manylinux tag exactly, so name the ones these packages are built for;
# pure-Python wheels (py3-none-any) match any of them
plat=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 \
           manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64 \
           manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
  plat+=(--platform "$tag")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  "${plat[@]}" -d "$dest" "${pins[@]}"
# built here from their sources: a pure-Python wheel (py3-none-any) installs on any Python 3
python3 -m pip wheel -q --no-deps -w "$dest" "${built[@]}"
for w in "${BUILT[@]}"; do
  ls "$dest"/"${w//-/_}"-*-none-any.whl >/dev/null 2>&1 \
    || { echo "$w did not build as a pure-Python wheel in $dest" >&2; exit 1; }
done
n=$(ls "$dest"/*.whl | wc -l)
want=$((${#WHEELS[@]} + ${#BUILT[@]}))
[ "$n" = "$want" ] || { echo "expected $want wheels in $dest, found $n" >&2; exit 1; }
# hivemind's DHT runs the p2pd binary its wheel ships: a wheel without it would fail only there
python3 -c "import sys, zipfile; sys.exit('hivemind/hivemind_cli/p2pd' not in zipfile.ZipFile(sys.argv[1]).namelist())" \
  "$dest"/hivemind-*.whl || { echo "the hivemind wheel in $dest has no p2pd binary" >&2; exit 1; }
du -ch "$dest"/*.whl | tail -1 | sed "s|total|total: $n wheels in $dest for Python $pyver|"
