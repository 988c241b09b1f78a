"""The benchmark scripts run from benchmarks/, which Python puts first on sys.path: none may share its name with a
module an installed package imports (benchmarks/kernels.py hid Hugging Face's `kernels`, which transformers 5
imports, and peers.py's transformers engine failed on import)."""

from importlib.metadata import packages_distributions
from pathlib import Path

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def test_no_benchmark_script_shadows_an_installed_module():
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")}
    shadowed = sorted(scripts & set(packages_distributions()))
    assert shadowed == [], f"benchmarks/ scripts named as installed modules: {shadowed}"
