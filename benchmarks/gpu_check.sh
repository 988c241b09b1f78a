#!/usr/bin/env bash
# rooftop's device check, for a fresh CUDA machine without network (the H200 of issue 20): the CUDA tests, then the
# GPU's roofs and the measurements of benchmarks/gpu_check.py beside the analyzer, in about five minutes.
#
#   benchmarks/gpu_check.sh OUT [--dry-run] [SECTION ...]
#
# Sections (default: all, in this order): tests probe llama-3.1-8b-bf16 llama-3.1-8b-int4 dense-27b-bf16
# qwen3.6-27b-bf16 summary. Each runs under its own time limit; one that fails or times out is reported and the
# next runs. Every section writes its JSON (and PNG, log) into a work folder as it goes; after each, OUT holds
# gpu_check.tar.gz, all of it so far, so a run cut off keeps what finished. OUT/steps.txt says how each section
# ended; OUT/summary.md and OUT/summary.json are the targets and the table: four files in all (the device tool
# brings back at most eight). The wheels rooftop
# needs there and the tokenizer come from .whl/ (benchmarks/gpu_wheels.sh writes it here). --dry-run runs the
# sections on the CPU with tiny models: the plumbing, not the numbers.
set -euo pipefail

all=(tests probe llama-3.1-8b-bf16 llama-3.1-8b-int4 dense-27b-bf16 qwen3.6-27b-bf16 summary)
declare -A limit=(
    [tests]=150 [probe]=60 [llama-3.1-8b-bf16]=60 [llama-3.1-8b-int4]=60 [dense-27b-bf16]=75
    [qwen3.6-27b-bf16]=90 [summary]=20
)
usage() {
    echo "usage: benchmarks/gpu_check.sh OUT [--dry-run] [SECTION ...]; sections: ${all[*]}" >&2
    exit 2
}

[ $# -ge 1 ] || usage
out=$1
shift
[ "${out:0:1}" != "-" ] || usage
dry=()
sections=()
for arg in "$@"; do
    case $arg in
        --dry-run) dry=(--dry-run) ;;
        -*) usage ;;
        *) [ -n "${limit[$arg]:-}" ] || usage; sections+=("$arg") ;;
    esac
done
[ ${#sections[@]} -gt 0 ] || sections=("${all[@]}")

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/rooftop-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT  # OUT holds what comes back; the work folder is packed into it
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ${#dry[@]} -eq 0 ] && compgen -G ".whl/*.whl" > /dev/null; then  # a dry run uses this machine's packages
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rooftop-site \
        .whl/*.whl
    export PYTHONPATH=/tmp/rooftop-site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export ROOFTOP_CPU_KERNELS=0  # the tests' CPU references on PyTorch's ops: no C++ build on the device
export ROOFTOP_CACHE_DIR=$work/cache
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 || true; \
    "$python" -c "import torch, triton; print(torch.__version__, triton.__version__)" 2>&1 || true; } > "$work/machine.txt"

: > "$out/steps.txt"
for section in "${sections[@]}"; do
    if [ "$section" = tests ]; then
        command=("$python" -m pytest -q -m cuda tests/test_cuda.py -p no:cacheprovider)
    else
        command=("$python" benchmarks/gpu_check.py "$section" --out "$work" --tokenizer .whl/tokenizer "${dry[@]}")
    fi
    start=$SECONDS
    status=0
    timeout "${limit[$section]}" "${command[@]}" > "$work/$section.log" 2>&1 || status=$?
    case $status in
        0) result=ok ;;
        124) result="timed out after ${limit[$section]} s" ;;
        *) result="failed (exit $status; $section.log)" ;;
    esac
    echo "$section: $result in $((SECONDS - start)) s" | tee -a "$out/steps.txt"
    tar -czf "$out/gpu_check.tar.gz" -C "$work" .
done
for name in summary.md summary.json; do
    [ ! -f "$work/$name" ] || cp "$work/$name" "$out/"
done
[ ! -f "$work/summary.log" ] || cat "$work/summary.log"
