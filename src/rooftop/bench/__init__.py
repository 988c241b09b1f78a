"""Benchmarks of the engine on this machine: sweeps and a llama-bench-style quick mode, measured vs predicted."""
