"""rooftop's CPU kernels (cpu.cpp, attention.cpp, prefill_attention.cpp, tiles.cpp, repack.cpp, bf16.cpp, decode.cpp, delta_rule.cpp), compiled for this machine on first use and cached by PyTorch.

In PyTorch's eager ops a decode step of the bundled model was ~1,800 small operations around ~100 MB of 4-bit
weights, at ~5-10 µs each from Python, and PyTorch's int4 kernel computes in emulated bfloat16: the step was bound
by neither the bytes nor the arithmetic but by everything around them (docs/PERFORMANCE.md). These kernels dot
quantized weights with int8-quantized activations (as llama.cpp does) and do each small op in one call.

`ops()` is None where they cannot be built (no C++ compiler) or with ROOFTOP_CPU_KERNELS=0; rooftop then runs
PyTorch's own ops, slower but the same model.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

SOURCES = [
    Path(__file__).with_name(name)
    for name in (
        "cpu.cpp",
        "attention.cpp",
        "prefill_attention.cpp",
        "tiles.cpp",
        "repack.cpp",
        "bf16.cpp",
        "decode.cpp",
        "delta_rule.cpp",
    )
]
HEADERS = [Path(__file__).with_name(name) for name in ("quantized.h", "tiles.h", "exp.h", "kernels.h")]


def enabled() -> bool:
    return os.environ.get("ROOFTOP_CPU_KERNELS", "1") != "0"


@functools.cache
def ops() -> ModuleType | None:
    """The compiled module (built once per machine and torch version), or None."""
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


def build(name: str, flags: str, directory: Path | None = None) -> ModuleType:
    """Compile the sources as module `name` with `flags` after -O3 (-march=native here; the tests also build the
    portable loops that machines without AVX2 and F16C run, with -march=x86-64), from `directory` if given (another
    revision's sources, for benchmarks/kernel_ab.py)."""
    from torch.utils import cpp_extension

    directory_of_build = build_directory(name, directory or SOURCES[0].parent)
    with build_lock(directory_of_build), packaged_ninja():
        if not (directory_of_build / f"{name}.so").exists():
            print(
                f"rooftop: compiling its CPU kernels for this machine ({name}; once, under a minute on 2 cores)",
                file=sys.stderr,
            )
        return cpp_extension.load(
            name=name,
            sources=[str(directory / source.name if directory else source) for source in SOURCES],
            extra_cflags=["-O3", *flags.split(), "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory_of_build),
            verbose=False,
        )


@contextlib.contextmanager
def packaged_ninja() -> Iterator[None]:
    """PATH with the `ninja` package's binary first, for a build: PyTorch runs whichever `ninja` PATH finds first, and
    two versions (the package's, in .venv/bin, and a system one) keep build logs the other cannot read, so every
    switch between them (an activated shell, then `make test`'s .venv/bin/python) compiled every kernel again
    (~45 s, reported as the model's load). Without the package, PATH is left as it is."""
    try:
        import ninja
    except ImportError:
        yield
        return
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path
    try:
        yield
    finally:
        os.environ["PATH"] = path


def build_directory(name: str, sources: Path = SOURCES[0].parent) -> Path:
    """Where module `name` is built from the kernel sources in `sources`: under PyTorch's extensions root
    (TORCH_EXTENSIONS_DIR where set, as PyTorch has it), in a folder per Python and torch version (a build is for one
    ABI) and per sources' folder. ninja's build file names each source by its path: two checkouts or environments
    with the same sources, built in one folder, found each other's build out of date, and every start that switched
    between them compiled every kernel again (~45 s, shown as the model's load)."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    version = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}"
    place = hashlib.sha256(str(sources.resolve()).encode()).hexdigest()[:8]
    return Path(root) / f"rooftop-{version}" / f"{name}-{place}"


# How long a start waits on another's lock before it says so: another rank's (or process's) check that the built
# module is up to date holds the lock for about a second, and is no compile to announce.
QUIET_WAIT_S = 3.0


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Held around every build (or up-to-date check) of the module built in `directory`: an OS lock on a file beside
    it, which the OS lets go when its holder dies. PyTorch's own lock is a file (`lock` in that directory) that only
    the process that made it deletes: a build interrupted by Ctrl-C or a kill left it, and every later start of
    rooftop then waited on it, silently and for ever. Whoever holds this lock knows that no other rooftop build runs
    there, so such a file is a leftover, and it is deleted. A start that finds another building says it waits (after QUIET_WAIT_S)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f"{directory.name}.build-lock", "w") as handle:
        quiet_until = time.monotonic() + QUIET_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < quiet_until:
                    time.sleep(0.05)
                    continue
                print("rooftop: waiting for another process that is compiling the CPU kernels", file=sys.stderr)
                fcntl.flock(handle, fcntl.LOCK_EX)
                break
        left = directory / "lock"
        if left.exists():
            print(f"rooftop: removing {left}, left by an interrupted build of the CPU kernels", file=sys.stderr)
            left.unlink(missing_ok=True)
        yield
