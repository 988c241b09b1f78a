"""The engine thread: the only caller of LLMEngine. HTTP handlers send it commands through a thread-safe queue and
read each request's deltas from an asyncio queue, so the event loop never waits on model compute."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from rooftop.engine.llm_engine import LLMEngine
from rooftop.engine.outputs import RequestDelta
from rooftop.engine.sampling_params import SamplingParams
from rooftop.enums import FinishReason
from rooftop.errors import RooftopError, TensorParallelError
from rooftop.serve.monitor import Monitor

log = logging.getLogger("rooftop.serve")


class QueueFullError(RooftopError):
    """Too many requests are already waiting: the client should retry later (HTTP 429)."""


class EngineStoppedError(RooftopError):
    """The server is shutting down before the request finished (HTTP 503)."""


class EngineFailedError(EngineStoppedError):
    """An engine step raised: the requests in flight fail (HTTP 500); the server goes on with new ones."""


class ClientGoneError(RooftopError):
    """The request was closed (its client disconnected) before it finished."""


@dataclass
class RequestStream:
    """One request's deltas as they arrive, its choices' (n engine requests, sharing the prompt) interleaved, each
    delta naming its engine request; closing it early aborts what has not finished and frees the KV blocks."""

    request_ids: list[str]
    engine_loop: EngineLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    unfinished: set[str] = field(init=False)
    closed: bool = False

    def __post_init__(self) -> None:
        self.unfinished = set(self.request_ids)

    async def deltas(self) -> AsyncIterator[RequestDelta]:
        while self.unfinished:
            item = await self.queue.get()
            if isinstance(item, Exception):
                self.unfinished.clear()
                raise item
            if item.finished:
                self.unfinished.discard(item.request_id)
            yield item

    def close(self) -> None:
        """Abort what has not finished; any reader waiting on it gets ClientGoneError. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.unfinished:
            for request_id in sorted(self.unfinished):
                self.engine_loop.abort(request_id)
            self.queue.put_nowait(ClientGoneError(f"request {self.request_ids[0]} was closed before it finished"))


@dataclass
class _Add:
    # one per choice of each prompt: the first of a prompt computes it, the others reuse its cache
    request_ids: list[str]
    prompts: list[list[int]]  # each request's prompt, one list object per prompt
    params: list[SamplingParams]
    arrival: float
    loop: asyncio.AbstractEventLoop
    stream: RequestStream
    accepted: asyncio.Future


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Fatal:
    reason: str  # the engine cannot go on (a tensor-parallel rank died or hung): stop serving


_STOP = object()


class EngineLoop:
    """Runs `LLMEngine.step` on its own thread while any request is unfinished; sleeps on the command queue otherwise."""

    def __init__(
        self,
        engine: LLMEngine,
        monitor: Monitor,
        max_waiting: int,
        on_fatal: Callable[[str], None] | None = None,
    ):
        self.engine, self.monitor, self.max_waiting = engine, monitor, max_waiting
        self.on_fatal = on_fatal  # told (on the engine thread) when the engine stops for good
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.streams: dict[str, _Add] = {}  # owned by the engine thread
        self.thread = threading.Thread(target=self._run, name="rooftop-engine", daemon=True)
        self.stopped = False
        self._stopping = threading.Lock()  # no request is queued behind the stop command, to wait forever

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort whatever is still running and end the thread."""
        with self._stopping:
            self.stopped = True
            self.commands.put(_STOP)
        self.thread.join(timeout)

    async def add(
        self, request_ids: list[str], prompts: list[list[int]], params: list[SamplingParams], arrival: float
    ) -> RequestStream:
        """Queue a request's completions, each with its prompt and params (all or none); raises
        InvalidRequestError / PromptTooLongError / QueueFullError before any token."""
        loop = asyncio.get_running_loop()
        stream = RequestStream(request_ids, self)
        accepted = loop.create_future()
        with self._stopping:
            if self.stopped:
                raise EngineStoppedError("the server is shutting down")
            self.commands.put(_Add(request_ids, prompts, params, arrival, loop, stream, accepted))
        try:
            await accepted
        except asyncio.CancelledError:  # the handler was cancelled while the engine thread took the request
            for request_id in request_ids:
                self.abort(request_id)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        self.commands.put(_Abort(request_id))

    def fail(self, reason: str) -> None:
        """The engine cannot go on (from any thread, e.g. the tensor-parallel group's watch): the engine thread
        ends every request with a 503 and stops."""
        self.commands.put(_Fatal(reason))

    def _run(self) -> None:
        try:
            self.engine.warm_up()  # this thread's first steps, not the first request's
        except TensorParallelError as e:
            self._stop_for(str(e))
            return
        except Exception:  # only the first requests' speed depends on it
            log.exception("the engine thread's warm-up failed; serving without it")
        while True:
            command = self._next_command() if self.engine.has_unfinished() else self.commands.get()  # idle: sleep
            try:
                while command is not None:
                    if command is _STOP:
                        self._fail_all(
                            EngineStoppedError("the server shut down before this request finished"), FinishReason.ABORT
                        )
                        return
                    if isinstance(command, _Fatal):
                        self._stop_for(command.reason)
                        return
                    self._apply(command)
                    command = self._next_command()
                if self.engine.has_unfinished():
                    self._step()
                self.monitor.on_state(self.engine.stats())
            except TensorParallelError as e:  # a rank died or hung: no step can run any more
                self._stop_for(str(e))
                return
            except Exception:  # a bug, not bad input: fail the requests in flight, keep serving new ones
                error_id = uuid.uuid4().hex[:12]
                log.exception("the engine loop failed (error id %s)", error_id)
                message = f"the engine failed on this step (error id {error_id}; the server log has the details)"
                self._fail_all(EngineFailedError(message), FinishReason.ERROR)

    def _next_command(self):
        try:
            return self.commands.get_nowait()
        except queue.Empty:
            return None

    def _apply(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Abort):
            if self.streams.pop(command.request_id, None) is not None:
                self._abort(command.request_id, FinishReason.ABORT)
            return
        error, added = None, []
        try:
            if self._queued() >= self.max_waiting:
                raise QueueFullError(
                    f"the server is busy: {self._queued()} requests are already waiting for a slot "
                    f"(max_waiting_requests {self.max_waiting}); retry later"
                )
            computes: dict[int, str] = {}  # a prompt's first request computes it (its choices share the list)
            for request_id, prompt, params in zip(command.request_ids, command.prompts, command.params, strict=True):
                first = computes.setdefault(id(prompt), request_id)
                self.engine.add_request(
                    request_id, prompt, params, command.arrival, None if first == request_id else first
                )
                added.append(request_id)
                self.streams[request_id] = command
        except Exception as e:  # bad input (RooftopError) or a bug: either way this handler must hear of it
            for request_id in added:  # all of the request's choices or none
                del self.streams[request_id]
                self.engine.abort(request_id)
            error = e
        command.loop.call_soon_threadsafe(_settle, command.accepted, error)

    def _queued(self) -> int:
        """Waiting requests that the next step cannot admit even if blocks allow."""
        stats = self.engine.stats()
        free_slots = max(0, self.engine.config.max_num_seqs - stats.running)
        return max(0, stats.waiting - free_slots)

    def _abort(self, request_id: str, outcome: FinishReason) -> None:
        output = self.engine.abort(request_id)
        if output is not None:
            self.monitor.on_abort(output, outcome)

    def _step(self) -> None:
        step = self.engine.step()
        self.monitor.on_step(step)
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for delta in step.deltas:
            command = self.streams.get(delta.request_id)
            if command is None:
                continue
            if delta.finished:
                del self.streams[delta.request_id]
            by_loop.setdefault(command.loop, []).append((command.stream.queue, delta))
        for loop, items in by_loop.items():
            _deliver(loop, items)

    def _stop_for(self, reason: str) -> None:
        """Stop for good: no new request is taken, the queued and running ones end with a 503, and the server is
        told (it exits with an error)."""
        with self._stopping:
            self.stopped = True
        error = EngineStoppedError(f"the engine stopped: {reason}")
        self._fail_all(error, FinishReason.ERROR)
        while (command := self._next_command()) is not None:
            if isinstance(command, _Add):
                command.loop.call_soon_threadsafe(_settle, command.accepted, error)
        if self.on_fatal is not None:
            self.on_fatal(reason)

    def _fail_all(self, error: Exception, outcome: FinishReason) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for request_id, command in list(self.streams.items()):
            self._abort(request_id, outcome)
            by_loop.setdefault(command.loop, []).append((command.stream.queue, error))
        self.streams.clear()
        for loop, items in by_loop.items():
            _deliver(loop, items)


def _settle(future: asyncio.Future, error: Exception | None) -> None:
    if future.done():  # the handler stopped waiting
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _deliver(loop: asyncio.AbstractEventLoop, items: list) -> None:
    def put_all() -> None:
        for q, item in items:
            q.put_nowait(item)

    try:
        loop.call_soon_threadsafe(put_all)
    except RuntimeError:  # that event loop is closed: nobody is listening any more
        pass
