"""Starting a tensor-parallel group on torch.distributed: where this process stands (rooftop's own workers on this
host, or one of torchrun's processes on one or many hosts), its device and threads, the process groups (the
device's backend for the forward pass's collectives, gloo for the plans rank 0 sends), and the check that every
rank built its part of the model before the first step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from rooftop.config import EngineConfig, RunConfig
from rooftop.errors import InvalidRequestError, TensorParallelError
from rooftop.loading.loaded import LoadedModel
from rooftop.models.parallel import TPGroup, check_tensor_parallel
from rooftop.roofline.probe import checked_device

RUN_ENV = "ROOFTOP_TP_RUN"  # a spawned worker's RunConfig, as JSON
MODEL_ENV = "ROOFTOP_TP_MODEL"  # "0": the group runs no model (the probe's)
WORKER_MODULE = "rooftop.engine.tp_worker"
LOAD_TIMEOUT_S = 900.0  # the ranks wait this long (at least) for each other to build their parts of the model


@dataclass(frozen=True)
class Launch:
    """This process's place in the group: its rank and the group's size, its rank and the group's size on this
    host, the rendezvous (rank 0's address and port), and whether rooftop starts the other ranks itself (else
    torchrun, or another launcher setting RANK and WORLD_SIZE, started them)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    master_addr: str
    master_port: int
    spawns: bool


def launch_of(run: RunConfig) -> Launch:
    """Under torchrun (RANK and WORLD_SIZE set) this process is one rank of its group, which must have
    `tensor_parallel_size` processes; otherwise this process is rank 0 and starts the others on this host."""
    env, size = os.environ, run.tensor_parallel_size
    if "RANK" in env and "WORLD_SIZE" in env:
        world = check_torchrun(run)
        return Launch(
            int(env["RANK"]),
            world,
            int(env.get("LOCAL_RANK", 0)),
            int(env.get("LOCAL_WORLD_SIZE", world)),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", 29500)),
            spawns=False,
        )
    return Launch(0, size, 0, size, "127.0.0.1", free_port(), spawns=True)


# A worker's exit status when a collective timed out or failed waiting on the others: it did not fail of its own,
# so rank 0 names a rank still running (the one that hung) before it (Lead._dead).
WAITED = 3


def check_torchrun(run: RunConfig) -> int:
    """Under torchrun, its processes (WORLD_SIZE) are the group's ranks: a count other than tensor_parallel_size is
    refused, 1 included (each process would load and run the whole model on its own). The world size; 1 outside
    torchrun."""
    env, size = os.environ, run.tensor_parallel_size
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return 1
    world = int(env["WORLD_SIZE"])
    if world != size:
        raise InvalidRequestError(
            f"torchrun started {world} processes (WORLD_SIZE) but tensor_parallel_size is {size}: give "
            f"--tensor-parallel-size {world}, or run torchrun with --nnodes x --nproc-per-node = {size}",
            "tensor_parallel_size",
        )
    return world


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(device: str, launch: Launch | None) -> torch.device:
    """The device a rank runs on: the CPU, or under tensor parallelism the GPU of its rank on this host."""
    parsed = checked_device(device)
    if launch is None or parsed.type != "cuda":
        return parsed
    if parsed.index is not None:
        raise InvalidRequestError(
            f"with tensor parallelism each rank takes the GPU of its rank on this host: give --device cuda, not "
            f"{device} (CUDA_VISIBLE_DEVICES picks which GPUs)",
            "device",
        )
    if torch.cuda.device_count() < launch.local_size:
        raise InvalidRequestError(
            f"{launch.local_size} ranks on this host need {launch.local_size} GPUs; torch sees "
            f"{torch.cuda.device_count()} (one GPU cannot hold two NCCL ranks)",
            "tensor_parallel_size",
        )
    return torch.device("cuda", launch.local_rank)


def rank_threads(run: RunConfig, launch: Launch | None, cores: int) -> int:
    """--threads, else this host's cores shared among the ranks it runs."""
    return run.threads or max(1, cores // (launch.local_size if launch else 1))


def spawn_workers(run: RunConfig, launch: Launch, with_model: bool = True) -> list[subprocess.Popen]:
    """Ranks 1 .. size-1 as processes of this Python (`python -m rooftop.engine.tp_worker`), told the rendezvous
    and the run (and whether to build its model) in their environment; their output goes where this process's
    does."""
    env = dict(os.environ)
    env.update(
        {
            RUN_ENV: json.dumps(dataclasses.asdict(run)),
            MODEL_ENV: "1" if with_model else "0",
            "WORLD_SIZE": str(launch.size),
            "LOCAL_WORLD_SIZE": str(launch.size),
            "MASTER_ADDR": launch.master_addr,
            "MASTER_PORT": str(launch.master_port),
        }
    )
    workers = []
    for rank in range(1, launch.size):
        env.update({"RANK": str(rank), "LOCAL_RANK": str(rank)})
        workers.append(subprocess.Popen([sys.executable, "-m", WORKER_MODULE], env=dict(env)))
    return workers


def run_config_from_env() -> RunConfig:
    data = json.loads(os.environ[RUN_ENV])
    engine = data.pop("engine")
    return RunConfig(**data, engine=EngineConfig(**engine))


@dataclass
class Joined:
    """The groups a rank is in: `tp` (the device backend's, for the forward pass), `plans` (gloo: rank 0's messages)
    and `startup` (gloo, with time for the slowest rank to load: the handshake)."""

    tp: TPGroup
    plans: object
    startup: object


def check_no_group() -> None:
    """One process is in one group at a time (torch.distributed's default group is the process's)."""
    if dist.is_initialized():
        raise TensorParallelError(
            "this process already runs a tensor-parallel group: close the other tensor-parallel LLM (llm.close()) "
            "first; one process leads one group at a time"
        )


def join_group(launch: Launch, device: torch.device, timeout_s: float, batch_invariant: bool) -> Joined:
    """Join the group: the default process group on the device's backend (NCCL on CUDA, gloo on the CPU) for the
    forward pass and a gloo group for the plans, both giving up on a rank after `timeout_s`, and a gloo group for
    the handshake after loading, which waits LOAD_TIMEOUT_S (or the timeout if longer)."""
    timeout = timedelta(seconds=timeout_s)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{launch.master_addr}:{launch.master_port}",
            rank=launch.rank,
            world_size=launch.size,
            timeout=timeout,
        )
    except (RuntimeError, ValueError) as e:  # DistStoreError and friends: a rank never came
        raise TensorParallelError(
            f"rank {launch.rank} could not join the group of {launch.size} at {launch.master_addr}:"
            f"{launch.master_port} within {timeout_s:g} s: {first_line(e)}"
        ) from None
    plans = dist.new_group(backend="gloo", timeout=timeout)
    startup = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(timeout_s, LOAD_TIMEOUT_S)))
    return Joined(TPGroup(launch.rank, launch.size, batch_invariant), plans, startup)


def handshake(startup: object, rank: int, error: str | None) -> None:
    """Every rank says whether it built its part of the model; rank 0 raises naming the ranks that could not, the
    others raise to end quietly (rank 0 reports)."""
    statuses: list[str | None] = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(statuses, error, group=startup)
    except RuntimeError as e:  # a rank died while loading (its connection closed) or never finished
        raise TensorParallelError(f"a rank did not finish loading its part of the model: {first_line(e)}") from None
    failed = {r: e for r, e in enumerate(statuses) if e is not None}
    if not failed:
        return
    if rank != 0:
        raise TensorParallelError(f"rank {rank}: the group did not start")
    if 0 in failed:
        raise TensorParallelError(failed[0])
    raise TensorParallelError(
        "; ".join(f"rank {r} could not build its part of the model: {e}" for r, e in failed.items())
    )


def time_all_reduce(sizes: tuple[int, ...], reps: int, device: torch.device) -> dict[int, float]:
    """Median seconds of one all-reduce of each size in bytes (float32). Every rank runs exactly these calls (their
    number is fixed by the size, not by a clock, which would differ between ranks); rank 0's times are the result."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    times = {}
    for size in sizes:
        x = torch.zeros(max(1, size // 4), device=device)
        count = max(1, min(64, (16 << 20) // size))
        for _ in range(2):
            dist.all_reduce(x)
        measured = []
        for _ in range(reps):
            sync()
            start = time.perf_counter()
            for _ in range(count):
                dist.all_reduce(x)
            sync()
            measured.append((time.perf_counter() - start) / count)
        times[size] = statistics.median(measured)
    return times


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def check_parallel_run(run: RunConfig, loaded: LoadedModel) -> None:
    """What tensor parallelism refuses before any rank starts: a model it cannot split this many ways (a draft
    model, which runs on rank 0 alone, is RunConfig's to refuse)."""
    check_tensor_parallel(loaded.config, run.tensor_parallel_size)
