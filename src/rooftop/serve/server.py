"""Running the app with uvicorn: `run` for `rooftop serve` (SIGINT/SIGTERM stop it gracefully, with exit status 0;
a second one exits at once) and `serve_in_thread` for tests and embedding (a real server on a loopback port)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import NoReturn

import uvicorn
from fastapi import FastAPI

from rooftop.engine.llm import LLM
from rooftop.errors import RooftopError
from rooftop.serve.app import create_app
from rooftop.serve.config import ServeConfig
from rooftop.serve.connection import TimedH11Protocol
from rooftop.serve.state import ServerState

BACKSTOP_S = 5.0  # after the grace period and the engine's abort, uvicorn cancels whatever is somehow still running
log = logging.getLogger("rooftop.serve")


class Server(uvicorn.Server):
    """uvicorn's server, with two changes to stopping. It does not re-raise SIGINT/SIGTERM after shutting down: a
    server asked to stop that stopped cleanly has succeeded (exit status 0). And `grace_s` after the stop begins,
    the engine aborts what is still running, so those requests end with an error event or a 503 rather than by
    uvicorn cancelling their tasks. A second SIGINT or SIGTERM exits at once (see exit_now)."""

    def __init__(self, config: uvicorn.Config, state: ServerState, grace_s: float):
        super().__init__(config)
        self.state, self.grace_s = state, grace_s
        self.signals = 0

    def handle_exit(self, sig: int, frame) -> None:
        self.signals += 1
        if self.signals > 1:
            exit_now(sig)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.grace_s, lambda: loop.run_in_executor(None, self.state.stop))
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def run(config: ServeConfig, llm: LLM | None = None) -> str | None:
    """Serve until SIGINT/SIGTERM: stop accepting, let in-flight requests finish for up to
    `config.shutdown_timeout_s`, abort the rest. Returns why the model could not be loaded, or why the engine
    stopped while serving (a tensor-parallel rank died or hung), if either happened."""
    server: Server | None = None

    def stop(_: str) -> None:
        server.should_exit = True

    app = create_app(config, llm, on_error=stop)
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)  # rooftop's own lines, formatted as uvicorn's
    log_config["loggers"]["rooftop"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    server = Server(
        uvicorn_config(
            app,
            config,
            host=config.host,
            port=config.port,
            timeout_graceful_shutdown=config.shutdown_timeout_s + BACKSTOP_S,
            log_config=log_config,
            log_level="info",
            access_log=False,
        ),
        app.state.server,
        config.shutdown_timeout_s,
    )
    server.run()
    return app.state.server.load_error or app.state.server.failure


def uvicorn_config(app: FastAPI, config: ServeConfig, **options) -> uvicorn.Config:
    """uvicorn's settings for `app`: h11 with the read deadline (TimedH11Protocol) and the keep-alive timeout."""
    protocol = functools.partial(TimedH11Protocol, timeout_read_s=config.timeout_read_s)
    return uvicorn.Config(app, http=protocol, timeout_keep_alive=config.timeout_keep_alive_s, **options)


def exit_now(sig: int) -> NoReturn:
    """The second SIGINT/SIGTERM: exit at once with 128 + the signal's number (130, 143, as a shell reports a
    process killed by it), after flushing the logs. os._exit, because a normal exit runs the C++ destructors of
    threads still at work (the engine's, OpenMP's), which abort the process: "terminate called without an active
    exception", then SIGABRT."""
    log.warning("a second %s: exiting now, without waiting for the requests in flight", signal.Signals(sig).name)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + sig)


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", timeout_s: float = 120.0) -> Iterator[str]:
    """Run `app` (from `create_app`) on a free port of `host` in a background thread while the block runs; yields
    its base URL once the model is loaded (GET /health is 200). Raises RooftopError if the model cannot load."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    state = app.state.server
    config = uvicorn_config(
        app, state.config, log_config=None, log_level="warning", timeout_graceful_shutdown=BACKSTOP_S + 1
    )
    server = Server(config, state, grace_s=1.0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="rooftop-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not server.started or state.ready is None:
            if state.load_error is not None:
                raise RooftopError(state.load_error)
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RooftopError(f"the server did not start within {timeout_s:.0f} s")
            time.sleep(0.01)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()
