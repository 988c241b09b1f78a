"""ServerState: what the handlers share. The model loads on a background thread so /health can say 503 meanwhile."""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rooftop.engine.calibrate import cached_calibration
from rooftop.engine.llm import LLM
from rooftop.engine.probe import load_or_run_probe, probe_device
from rooftop.errors import RooftopError
from rooftop.roofline.calibration import Calibration
from rooftop.roofline.hardware import Hardware
from rooftop.serve.config import ServeConfig
from rooftop.serve.engine_loop import EngineLoop
from rooftop.serve.errors import ApiError
from rooftop.serve.metrics import ServerMetrics
from rooftop.serve.monitor import Monitor
from rooftop.serve.prompts import Prompts

log = logging.getLogger("rooftop.serve")
LOAD_FAILED = "the model failed to load (the server's log says why)"  # the error itself may name server paths
BASIC_CHALLENGE = {"WWW-Authenticate": 'Basic realm="rooftop", charset="UTF-8"'}


@dataclass
class Ready:
    """The loaded model, the thread that runs it and the tokenizing in front of it."""

    llm: LLM
    monitor: Monitor
    engine_loop: EngineLoop
    model_name: str
    prompts: Prompts


def calibrated(llm: LLM, hardware: Hardware) -> Calibration | None:
    """The model's cached calibration (`rooftop calibrate`, or `generate`'s quick one), or None: the server does not
    run one itself, and without it its steps' expected times are left out."""
    calibration = cached_calibration(llm, hardware)
    if calibration is None:
        log.info(
            "no calibration cached for this model and settings: `rooftop calibrate` with the same options gives "
            "the steps' expected times in /metrics and the dashboard"
        )
    return calibration


@dataclass
class ServerState:
    config: ServeConfig
    metrics: ServerMetrics
    ready: Ready | None = None
    load_error: str | None = None
    failure: str | None = None  # why the engine stopped for good while serving (a tensor-parallel rank failed)

    def load(self, llm: LLM | None = None, on_error: Callable[[str], None] | None = None) -> None:
        """Load the model (unless given), read this machine's roofs (probing once, cached) and the model's cached
        calibration, if any, and start the engine thread."""
        c = self.config
        try:
            if llm is None:
                log.info("loading %s", c.run.model or "the bundled model")
                llm = LLM.from_config(c.run)
            log.info("reading this machine's roofs (measured once, ~15 s, then cached)")
            probe = load_or_run_probe(probe_device(llm.device), collectives=llm.lead)
            hardware = probe.to_hardware(working_set=llm.weight_bytes)
            calibration = calibrated(llm, hardware)
        except Exception as e:  # a bad model path and a broken file alike end the server with one line
            self.load_error = str(e) if isinstance(e, RooftopError) else f"{type(e).__name__}: {e}"
            log.error("cannot serve: %s", self.load_error)
            if on_error is not None:
                on_error(self.load_error)
            return
        monitor = Monitor(self.metrics, llm.config, llm.precision, hardware, calibration)

        def stopped(reason: str) -> None:  # the server answers 503 from now on and exits with an error
            self.failure = reason
            log.error("the engine stopped, so the server stops: %s", reason)
            if on_error is not None:
                on_error(reason)

        monitor.on_state(llm.engine.stats())  # the KV pool's size and dtype, before the first request
        engine_loop = EngineLoop(llm.engine, monitor, c.max_waiting_requests, stopped)
        if llm.lead is not None:  # a rank that dies while the server is idle stops it too
            llm.lead.on_failure.append(engine_loop.fail)
        engine_loop.start()
        name = c.served_model_name or served_name(c.run.model or llm.model_path)
        prompts = Prompts(llm.tokenizer, llm.max_model_len, llm.config.vocab_size)
        self.ready = Ready(llm, monitor, engine_loop, name, prompts)
        weights = llm.precision.weights.name + (", dummy weights" if c.run.load_format == "dummy" else "")
        log.info(
            "serving %s (%s) on http://%s:%d (dashboard at /; KV cache %s)",
            name,
            weights,
            c.host,
            c.port,
            llm.engine.kv_cache_dtype,
        )

    def require_ready(self) -> Ready:
        if self.ready is None:
            if self.load_error is not None:
                raise ApiError(503, LOAD_FAILED)
            raise ApiError(503, "the model is still loading; retry when GET /health returns 200")
        if self.failure is not None:
            raise ApiError(503, f"the engine stopped: {self.failure}")
        if self.ready.engine_loop.stopped:
            raise ApiError(503, "the server is shutting down")
        return self.ready

    def check_model(self, name: str | None) -> None:
        """Requests name the served model (or omit it, or send --model as given); any other name is a 404, as in
        OpenAI and vLLM."""
        served = self.require_ready().model_name
        if name is not None and name not in (served, self.config.run.model):
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {served!r}", "model")

    def check_api_key(self, authorization: str | None, browser: bool = False) -> None:
        """The key as a Bearer token, or as the password of HTTP Basic auth (any user name): a browser asks for
        that itself when `browser` routes (the dashboard) answer 401 with a Basic challenge, then sends it along
        with the dashboard's own requests."""
        key = self.config.api_key
        if key is None:
            return
        sent = authorization or ""
        if hmac.compare_digest(sent.encode(), f"Bearer {key}".encode()):
            return
        if hmac.compare_digest(_basic_password(sent).encode(), key.encode()):
            return
        if browser:
            message = "the dashboard needs this server's API key: give it as the password (any user name)"
            raise ApiError(401, message, headers=BASIC_CHALLENGE)
        raise ApiError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'")

    def stop(self) -> None:
        if self.ready is not None:
            self.ready.engine_loop.stop()


def served_name(model: str) -> str:
    """The served name by default: the model file's name without .gguf, a config.json's directory's name (a model's
    config is named config.json, whatever the model), the directory's name, or a preset's; never a path."""
    path = Path(model)
    if path.name == "config.json" and path.parent.name:
        return path.parent.name
    return path.stem if path.suffix in (".gguf", ".json") else path.name


def _basic_password(authorization: str) -> str:
    """The password of 'Basic base64(user:password)', or "" if that is not what was sent."""
    scheme, _, encoded = authorization.partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        return base64.b64decode(encoded, validate=True).decode().partition(":")[2]
    except (binascii.Error, UnicodeDecodeError):
        return ""
