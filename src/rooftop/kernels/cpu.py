"""rooftop's CPU kernels (cpu.cpp, attention.cpp, prefill_attention.cpp, tiles.cpp), compiled for this machine on first use and cached by PyTorch.

In PyTorch's eager ops a decode step of the bundled model was ~1,800 small operations around ~100 MB of 4-bit
weights, at ~5-10 µs each from Python, and PyTorch's int4 kernel computes in emulated bfloat16: the step was bound
by neither the bytes nor the arithmetic but by everything around them (docs/PERFORMANCE.md). These kernels dot
quantized weights with int8-quantized activations (as llama.cpp does) and do each small op in one call.

`ops()` is None where they cannot be built (no C++ compiler) or with ROOFTOP_CPU_KERNELS=0; rooftop then runs
PyTorch's own ops, slower but the same model.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch

SOURCES = [
    Path(__file__).with_name(name) for name in ("cpu.cpp", "attention.cpp", "prefill_attention.cpp", "tiles.cpp")
]
HEADERS = [Path(__file__).with_name(name) for name in ("quantized.h", "exp.h")]


def enabled() -> bool:
    return os.environ.get("ROOFTOP_CPU_KERNELS", "1") != "0"


@functools.cache
def ops() -> ModuleType | None:
    """The compiled module (built once per machine and torch version, ~30 s on 2 cores), or None."""
    if not enabled():
        return None
    # -march=native: the build is for this CPU; the name keeps builds for different vector widths apart.
    name = f"rooftop_cpu_{torch.backends.cpu.get_cpu_capability().lower()}_{sources_version()}"
    try:
        return build(name, "-march=native")
    except (OSError, RuntimeError, ImportError) as error:  # no compiler or ninja, or a failed build
        print(f"rooftop: CPU kernels unavailable ({str(error).splitlines()[0]}); using PyTorch's ops", file=sys.stderr)
        return None


def sources_version() -> str:
    """A hash of every kernel source, headers included: in the module's name, so that checkouts with different
    sources never rebuild into (and load) one another's build (PyTorch looks at the sources it compiles, not at
    what they include), and in the probe's and the calibration's cache keys, which measured one build."""
    return hashlib.sha256(b"".join(path.read_bytes() for path in [*SOURCES, *HEADERS])).hexdigest()[:8]


def build(name: str, arch_flag: str, directory: Path | None = None) -> ModuleType:
    """Compile the sources as module `name` for `arch_flag` (compiler flags: -march=native here; the tests also build the portable
    loops that machines without AVX2 and F16C run, e.g. with -march=x86-64), from `directory` if given (another
    revision's sources, for benchmarks/kernel_ab.py)."""
    from torch.utils import cpp_extension

    if shutil.which("ninja") is None:  # PyTorch builds with ninja; the pip package's binary is not on PATH by itself
        with contextlib.suppress(ImportError):
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    return cpp_extension.load(
        name=name,
        sources=[str(directory / source.name if directory else source) for source in SOURCES],
        extra_cflags=["-O3", *arch_flag.split(), "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )
