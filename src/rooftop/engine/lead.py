"""Rank 0's side of a tensor-parallel group: it sends every piece of work (a step's plan, a KV pool to make, the
probe's all-reduces) to the other ranks over the gloo group, does its own part meanwhile, and stops the group with
an error naming the rank when one dies or hangs.

Failures are bounded in time: a collective waits at most `timeout_s` for the others (torch.distributed's timeout),
a rank that died closes its connections, which fails the next collective at once, and a worker rooftop started is
watched (its exit status names it). While rank 0 is idle it sends a heartbeat every quarter of the timeout, so a
worker waiting for the next plan can tell an idle rank 0 from a dead or hung one.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from rooftop.config import RunConfig
from rooftop.engine.distributed import (
    WAITED,
    Launch,
    check_no_group,
    first_line,
    handshake,
    join_group,
    spawn_workers,
    time_all_reduce,
)
from rooftop.errors import RooftopError, TensorParallelError
from rooftop.models.parallel import TPGroup
from rooftop.roofline.probe import Plan

log = logging.getLogger("rooftop.engine")


def exit_text(code: int) -> str:
    """How a process ended, from its exit status (negative: the signal that killed it)."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


class Lead:
    """Rank 0's side of the group; also the probe's `CollectiveTimer` (the group's all-reduce, every rank timing)."""

    def __init__(
        self, tp: TPGroup, plans: Any, timeout_s: float, workers: list[subprocess.Popen], device: torch.device
    ):
        self.tp, self.plans, self.timeout_s, self.workers, self.device = tp, plans, timeout_s, workers, device
        self.ranks = tp.size
        self.failure: str | None = None
        self.on_failure: list[Callable[[str], None]] = []  # told once, from whichever thread saw the failure
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._pools: dict[int, weakref.ref] = {}
        self._keys = itertools.count(1)
        self._closed = False
        self._stop = threading.Event()
        tp.lead = self
        threading.Thread(target=self._watch, name="rooftop-tp-watch", daemon=True).start()

    @property
    def heartbeat_s(self) -> float:
        return max(0.2, self.timeout_s / 4)

    def run(self, message: tuple, work: Callable[[], Any] | None = None) -> Any:
        """Send `message` to the other ranks and do `work` here meanwhile. Whatever goes wrong in between leaves the
        ranks out of step, so it fails the group: TensorParallelError now and on every later call."""
        with self._lock:
            self._raise_if_failed()
            try:
                self._drop_released_pools()
                self.broadcast(message)
                return None if work is None else work()
            except BaseException as e:
                self._fail(self._describe(e))
                if isinstance(e, Exception):
                    raise TensorParallelError(self.failure) from e
                raise

    def broadcast(self, message: tuple) -> None:
        """The message to every rank (the calibration times it as communication)."""
        dist.broadcast_object_list([message], src=0, group=self.plans)
        self._last = time.monotonic()

    def open_pool(self, owner: object, spec: tuple) -> int:
        """Every other rank makes a KV pool of `spec` for the engine `owner`; the key its steps name it by. The
        ranks drop it once `owner` is gone."""
        key = next(self._keys)
        self.run(("pool", key, spec))
        self._pools[key] = weakref.ref(owner)
        return key

    def group(self) -> str:
        return f"{dist.get_backend()} x{self.ranks}"

    def all_reduce_seconds(self, sizes: tuple[int, ...], device: str, plan: Plan) -> dict[int, float]:
        return self.run(("probe", sizes, plan.reps), lambda: time_all_reduce(sizes, plan.reps, self.device))

    def close(self) -> None:
        """Stop the other ranks (a worker rooftop started that does not exit is killed) and leave the group."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self.failure is None and self._lock.acquire(timeout=self.timeout_s):
            try:
                with contextlib.suppress(Exception):
                    self.broadcast(("stop",))
            finally:
                self._lock.release()
        for worker in self.workers:
            if self.failure is not None and worker.poll() is None:
                worker.terminate()
            try:
                worker.wait(timeout=5)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()

    def _drop_released_pools(self) -> None:
        for key in [k for k, owner in self._pools.items() if owner() is None]:
            del self._pools[key]
            self.broadcast(("drop", key))

    def _raise_if_failed(self) -> None:
        if self._closed:
            raise TensorParallelError("the tensor-parallel group was closed")
        if self.failure is None and (dead := self._dead()):
            self._fail(f"the tensor-parallel group lost {dead}")
        if self.failure is not None:
            raise TensorParallelError(f"{self.failure}; the group cannot run another step")

    def _dead(self, wait_s: float = 0.0) -> str | None:
        """A worker rooftop started that has exited, as "rank 2 (pid 123), which was killed by SIGKILL"; waits up
        to `wait_s` for one to (a rank's connections close just before its exit status is there). Where every rank
        that exited timed out waiting on the group (WAITED), a rank still running is the one that hung: it is named."""
        deadline = time.monotonic() + wait_s
        while True:
            exited = {rank: code for rank, w in enumerate(self.workers, start=1) if (code := w.poll()) is not None}
            if exited:
                return self._blamed(exited)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def _blamed(self, exited: dict[int, int]) -> str:
        """The rank to name: one killed by a signal, else one that failed of its own; where every rank that exited
        gave up waiting on the others (WAITED), the ones still running (one of them hung)."""
        own = sorted((rank for rank, code in exited.items() if code != WAITED), key=lambda rank: exited[rank] >= 0)
        running = [rank for rank in range(1, len(self.workers) + 1) if rank not in exited]
        if not own and running:
            waited = ", ".join(map(str, exited))
            hung = ", ".join(f"{rank} (pid {self.workers[rank - 1].pid})" for rank in running)
            return (
                f"{'rank' if len(running) == 1 else 'one of ranks'} {hung}, which did not answer within "
                f"{self.timeout_s:g} s (rank{'s' if len(exited) > 1 else ''} {waited} timed out waiting)"
            )
        rank = own[0] if own else next(iter(exited))
        return f"rank {rank} (pid {self.workers[rank - 1].pid}), which {exit_text(exited[rank])}"

    def _describe(self, error: BaseException) -> str:
        if isinstance(error, KeyboardInterrupt):
            return "rank 0 was interrupted in the middle of a step"
        dead = self._dead(wait_s=1.0 if self.workers else 0.0)
        if dead:
            return f"the tensor-parallel group lost {dead}"
        text = first_line(error)
        if "timed out" in text.lower() or "timeout" in text.lower():
            return f"a rank of the tensor-parallel group did not answer within {self.timeout_s:g} s: {text}"
        return f"the tensor-parallel step failed: {text}"

    def _fail(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = reason
        log.error("%s", reason)
        for notify in self.on_failure:
            notify(reason)

    def _watch(self) -> None:
        """Every second (or heartbeat): a worker that exited fails the group at once; an idle rank 0 sends a
        heartbeat."""
        while not self._stop.wait(min(1.0, self.heartbeat_s)):
            if self.failure is None and (dead := self._dead()):
                self._fail(f"the tensor-parallel group lost {dead}")
            idle = time.monotonic() - self._last > self.heartbeat_s
            if self.failure is None and idle and self._lock.acquire(blocking=False):
                try:
                    self.broadcast(("heartbeat",))
                except Exception as e:
                    self._fail(self._describe(e))
                finally:
                    self._lock.release()


def lead_group(
    run: RunConfig, launch: Launch, device: torch.device, build: Callable[[TPGroup], Any] | None
) -> tuple[Lead, Any]:
    """Rank 0 starting a group: the other ranks started (unless torchrun did), joined, this rank's part built by
    `build` while they build theirs (None: a group without a model, the probe's), every rank checked; then the
    Lead (closed at exit at the latest) and what `build` made."""
    check_no_group()
    workers = spawn_workers(run, launch, build is not None) if launch.spawns else []
    joined = None
    try:
        joined = join_group(launch, device, run.distributed_timeout_s, run.engine.batch_invariant)
        try:
            built = None if build is None else build(joined.tp)
        except Exception as e:  # the others hear of it and stop; this rank raises its own error
            with contextlib.suppress(TensorParallelError):
                handshake(joined.startup, 0, str(e) if isinstance(e, RooftopError) else f"{type(e).__name__}: {e}")
            raise
        handshake(joined.startup, 0, None)
    except BaseException:
        for worker in workers:
            worker.kill()
            worker.wait()
        if joined is not None:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        raise
    lead = Lead(joined.tp, joined.plans, run.distributed_timeout_s, workers, device)
    atexit.register(lead.close)
    return lead, built
