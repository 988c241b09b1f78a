"""benchmarks/prediction.py, the sweep behind issue 16's table, refuses a model the engine cannot run before it
sweeps anything: the runs take tens of minutes, and one once lost 25 of them to its last model's weight format."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "prediction.py"


def test_a_model_the_engine_refuses_stops_the_run_before_any_sweep():
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "llama-3.2-1b:q4_k"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 1
    assert run.stdout == ""  # neither the command line nor the table's header: nothing ran
    # on rooftop's CPU kernels q4_k runs from a file's own tensors only; elsewhere not at all
    said = ("makes no q4_k weights out of others on cpu", "cannot run q4_k weights on ")
    assert "--model llama-3.2-1b:q4_k: rooftop's engine " in run.stderr and any(s in run.stderr for s in said)
    assert "Traceback" not in run.stderr
