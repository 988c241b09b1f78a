"""create_app: the FastAPI app of `rooftop serve` (OpenAI routes, /health, /metrics, /tokenize, /detokenize, the
dashboard), its error handlers, which answer every failure with OpenAI-style JSON, and the checks every request
passes first (Host and Origin; CORS headers for the allowed origins)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import FileResponse, JSONResponse, Response

import rooftop
from rooftop.engine.llm import LLM
from rooftop.enums import FinishReason
from rooftop.errors import InvalidRequestError
from rooftop.serve import openai_routes
from rooftop.serve.config import ServeConfig
from rooftop.serve.errors import ApiError, InternalErrors, error_response
from rooftop.serve.guard import Hosts, LocalGuard
from rooftop.serve.metrics import create_metrics
from rooftop.serve.openai_routes import accept, authorized, authorized_browser, server
from rooftop.serve.protocol import DetokenizeRequest, TokenizeRequest
from rooftop.serve.state import LOAD_FAILED, ServerState

DASHBOARD = Path(__file__).parent / "dashboard"
DASHBOARD_FILES = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
COUNTED_PATHS = ("/v1/chat/completions", "/v1/completions")  # bad requests there count in rooftop_requests_total


def create_app(config: ServeConfig, llm: LLM | None = None, on_error: Callable[[str], None] | None = None) -> FastAPI:
    """The app; it loads `config.model` on a background thread at startup unless `llm` is given (tests, embedding).
    `on_error` is told why, if the model cannot load or the engine stops for good while serving."""
    state = ServerState(config, create_metrics())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        threading.Thread(target=state.load, args=(llm, on_error), name="rooftop-load", daemon=True).start()
        yield
        await asyncio.to_thread(state.stop)  # aborts what is still running, frees the engine thread

    app = FastAPI(title="rooftop", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.include_router(openai_routes.router)
    app.include_router(_other_routes())
    _add_error_handlers(app)

    def count_error(path: str) -> None:
        if path in COUNTED_PATHS:
            state.metrics.requests.labels(outcome=FinishReason.ERROR).inc()

    app.add_middleware(InternalErrors, on_error=count_error)
    if config.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.allowed_origins,
            allow_methods=["GET", "HEAD", "POST"],
            allow_headers=["*"],
            expose_headers=["Retry-After"],
        )
    app.add_middleware(
        LocalGuard, hosts=Hosts.of(config.host, config.allowed_hosts), origins=config.allowed_origins
    )  # the outermost: a refused request reaches nothing else
    return app


def _other_routes() -> APIRouter:
    router = APIRouter()

    @router.api_route("/health", methods=["GET", "HEAD"])
    async def health(request: Request) -> Response:
        state = server(request)
        if state.ready is None or state.ready.engine_loop.stopped:
            status = "failed" if state.load_error else "stopping" if state.ready else "loading"
            return JSONResponse({"status": status}, status_code=503)
        return JSONResponse({"status": "ok"})

    @router.api_route("/version", methods=["GET", "HEAD"])
    async def version() -> dict:
        """vLLM's: the server's version, open as /health is (deployment checks ask it)."""
        return {"version": rooftop.__version__}

    @router.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics(request: Request) -> Response:
        return Response(server(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @router.post("/tokenize", dependencies=[Depends(authorized)])
    async def tokenize(request: Request) -> dict:
        ready, body = await accept(request, TokenizeRequest)
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "send either prompt or messages", "prompt")
        param = "prompt" if body.messages is None else "messages"
        try:
            options = body.template_options()  # a prompt with the template's fields is refused
            if body.messages is None:
                text = body.prompt
            else:
                messages = [m.as_dict(i) for i, m in enumerate(body.messages)]
                text = ready.llm.apply_chat_template(messages, **options)
        except InvalidRequestError as e:
            raise ApiError(400, str(e), e.param or param) from None
        ids = await ready.prompts.encode(text, param, body.add_special_tokens)
        strings = [ready.llm.tokenizer.backend.id_to_token(i) for i in ids] if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": ready.llm.max_model_len, "tokens": ids, "token_strs": strings}

    @router.post("/detokenize", dependencies=[Depends(authorized)])
    async def detokenize(request: Request) -> dict:
        ready, body = await accept(request, DetokenizeRequest)
        return {"prompt": await ready.prompts.decode(body.tokens, "tokens")}

    dashboard_auth = [Depends(authorized_browser)]

    @router.api_route("/", methods=["GET", "HEAD"], dependencies=dashboard_auth)
    async def dashboard() -> Response:
        return FileResponse(DASHBOARD / "index.html", media_type="text/html")

    @router.api_route("/dashboard/state", methods=["GET", "HEAD"], dependencies=dashboard_auth)
    async def dashboard_state(request: Request) -> dict:
        state = server(request)
        if state.ready is None:
            return {"ready": False, "load_error": None if state.load_error is None else LOAD_FAILED}
        return {"ready": True, "model": state.ready.model_name, **state.ready.monitor.snapshot()}

    @router.api_route("/dashboard/{name}", methods=["GET", "HEAD"], dependencies=dashboard_auth)
    async def dashboard_file(name: str) -> Response:
        if name not in DASHBOARD_FILES:
            raise ApiError(404, f"no dashboard file {name!r}")
        return FileResponse(DASHBOARD / name, media_type=DASHBOARD_FILES[name])

    return router


def _add_error_handlers(app: FastAPI) -> None:
    def counted(request: Request, status: int) -> None:
        if request.url.path in COUNTED_PATHS and 400 <= status < 500:
            outcome = "rejected" if status == 429 else "invalid"
            state = server(request)
            if state.ready is not None:  # the dashboard's counts too
                state.ready.monitor.on_refused(outcome)
            else:
                state.metrics.requests.labels(outcome=outcome).inc()

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> Response:
        counted(request, e.status)
        return e.response()

    @app.exception_handler(InvalidRequestError)
    async def invalid_request(request: Request, e: InvalidRequestError) -> Response:
        counted(request, 400)
        return error_response(400, str(e), e.param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> Response:
        message = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
        return error_response(e.status_code, message)
