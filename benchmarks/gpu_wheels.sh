#!/usr/bin/env bash
# What benchmarks/gpu_check.sh needs on the device machine that the working tree does not hold, written into the
# ignored folder .whl/ (carried with `carry: [".whl"]`): the wheels of benchmarks/gpu_wheels.txt for the device's
# Python 3.12 on x86-64, and the bundled model's tokenizer as tokenizer.json (the 94 MB GGUF does not travel).
# Run here, where pip reaches PyPI and the bundled model is installed:  PYTHON=.venv/bin/python benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
mapfile -t pins < <(grep -v -e '^#' -e '^$' benchmarks/gpu_wheels.txt)
rm -rf .whl
mkdir -p .whl
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_31_x86_64 \
    -d .whl "${pins[@]}"  # llguidance: manylinux_2_31 (the device runs Ubuntu 24.04, glibc 2.39)
PYTHONPATH=src "$python" benchmarks/gpu_check.py tokenizer .whl/tokenizer
count=$(find .whl -maxdepth 1 -type f -name '*.whl' | wc -l)
if [ "$count" -ne "${#pins[@]}" ]; then
    echo "gpu_wheels: ${#pins[@]} pins but $count wheels in .whl" >&2
    exit 1
fi
echo "gpu_wheels: $count wheels and the tokenizer in .whl, $(du -sh .whl | cut -f1)"
