"""A rank other than 0 of a tensor-parallel group: it builds its part of the model, then does what rank 0 sends —
make or drop a KV pool, run a step's forward pass, time the all-reduce — until rank 0 stops it. Started by rank 0
(`python -m rooftop.engine.tp_worker`, the run in its environment) or, under torchrun, by the command itself in
every process whose rank is not 0.

A worker has no scheduler and samples nothing: the plan says what to compute, the KV pools mirror rank 0's block
for block, and the logits go to rank 0. It exits with status 0 when told to stop, WAITED (3) when a collective
failed or timed out on the others (rank 0 died or hung: no plan or heartbeat within the timeout; another rank did),
1 when its own step failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

import torch
import torch.distributed as dist

from rooftop.config import RunConfig
from rooftop.engine.distributed import (
    MODEL_ENV,
    WAITED,
    Launch,
    check_parallel_run,
    first_line,
    handshake,
    join_group,
    launch_of,
    rank_device,
    rank_threads,
    run_config_from_env,
    time_all_reduce,
)
from rooftop.engine.llm import resolve_dtype
from rooftop.engine.llm_engine import pool_from_spec
from rooftop.engine.runner import execute
from rooftop.errors import RooftopError, TensorParallelError
from rooftop.kernels import pages
from rooftop.loading.model_files import load_weights
from rooftop.models.kv_cache import KVPool
from rooftop.models.loader import build_model
from rooftop.models.transformer import Transformer
from rooftop.roofline.probe import available_cores


def receive(plans: object) -> tuple:
    box: list = [None]
    dist.broadcast_object_list(box, src=0, group=plans)
    return box[0]


def serve_rank(run: RunConfig, launch: Launch, with_model: bool = True) -> int:
    """Join the group, build this rank's part (unless the group runs no model: the probe's), and serve rank 0's
    messages; the process's exit status. What rank 0 refuses before the group starts (a size that does not split
    the model) this rank refuses too, without waiting for a group that will not come."""
    torch.set_num_threads(rank_threads(run, launch, available_cores()))
    try:
        device = rank_device(run.device, launch)
        dtype = resolve_dtype(run.dtype, device)
        loaded = load_weights(run, device, dtype) if with_model else None
        if with_model:
            check_parallel_run(run, loaded)
        joined = join_group(launch, device, run.distributed_timeout_s, run.engine.batch_invariant)
    except RooftopError as e:
        _say(launch.rank, str(e))
        return 1
    model, error = None, None
    try:
        if with_model:
            model = build_model(loaded, dtype, device, run.weights, joined.tp)
    except Exception as e:  # told to rank 0, which reports it
        error = str(e) if isinstance(e, RooftopError) else f"{type(e).__name__}: {e}"
    try:
        handshake(joined.startup, launch.rank, error)
        return _serve(model, joined.plans, launch.rank, device)
    except TensorParallelError:
        return 1
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _serve(model: Transformer | None, plans: object, rank: int, device: torch.device) -> int:
    pools: dict[int, KVPool] = {}
    if device.type == "cpu":
        pages.keep_freed_memory()  # this rank's steps, as rank 0's engine does (kernels/pages.py)
    while True:
        try:
            message = receive(plans)
        except RuntimeError as e:
            _say(rank, f"rank 0 sent nothing (it died, or hung past the timeout): {first_line(e)}")
            return WAITED
        kind = message[0]
        try:
            if kind == "stop":
                return 0
            if kind == "pool":
                pools[message[1]] = pool_from_spec(model, message[2])
            elif kind == "drop":
                pools.pop(message[1], None)
            elif kind == "step":
                execute(model, pools[message[1]], message[2])
            elif kind == "probe":
                time_all_reduce(message[1], message[2], device)
        except Exception as e:  # a collective failed (another rank died or hung) or this rank's own step did
            _say(rank, f"the {kind} failed: {first_line(e)}")
            text = str(e).lower()  # a collective on the others (gloo says "timed out", "connection reset/closed")
            waited = isinstance(e, dist.DistError) or "timed out" in text or "connection" in text
            return WAITED if waited else 1


def _say(rank: int, text: str) -> None:
    print(f"rooftop tensor-parallel rank {rank}: {text}; stopping", file=sys.stderr, flush=True)


def main() -> None:
    """A worker rooftop started: Ctrl-C in the terminal reaches its whole process group, but stopping is rank 0's
    to decide (it stops the workers, or they see it gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    run = run_config_from_env()
    sys.exit(serve_rank(run, launch_of(run), os.environ.get(MODEL_ENV, "1") == "1"))


if __name__ == "__main__":
    main()
