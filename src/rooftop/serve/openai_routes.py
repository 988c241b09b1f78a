"""POST /v1/chat/completions and /v1/completions (streamed or not), GET /v1/models and /v1/models/{id}. Handlers
only parse, tokenize, enqueue and relay deltas; a client that goes away has its request aborted and its KV blocks
freed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from rooftop.engine.sampling_params import SamplingParams
from rooftop.enums import FinishReason
from rooftop.errors import InvalidRequestError, PromptTooLongError
from rooftop.serve.engine_loop import (
    ClientGoneError,
    EngineFailedError,
    EngineStoppedError,
    QueueFullError,
    RequestStream,
)
from rooftop.serve.errors import ApiError, Body, check_json, error_body, parse_body, read_body
from rooftop.serve.protocol import ChatCompletionRequest, CompletionRequest
from rooftop.serve.responses import Responses, sse
from rooftop.serve.state import Ready, ServerState

CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it


def server(request: Request) -> ServerState:
    return request.app.state.server


async def accept(request: Request, model: type[Body]) -> tuple[Ready, Body]:
    """What every POST handler starts with: the model loaded, the body declared JSON, read within its limit and
    parsed, its model name known."""
    state = server(request)
    ready = state.require_ready()
    check_json(request)
    body = parse_body(await read_body(request, state.config.max_body_bytes), model)
    state.check_model(body.model)
    return ready, body


def authorized(request: Request) -> None:
    server(request).check_api_key(request.headers.get("authorization"))


def authorized_browser(request: Request) -> None:
    """For the dashboard's routes: a browser without the key is asked for it (HTTP Basic)."""
    server(request).check_api_key(request.headers.get("authorization"), browser=True)


router = APIRouter(dependencies=[Depends(authorized)])


def model_card(ready: Ready) -> dict:
    """The served model as OpenAI's model object, with vLLM's root and max_model_len."""
    return {
        "id": ready.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "rooftop",
        "root": Path(ready.llm.model_path).name,  # never a path on the server
        "parent": None,
        "max_model_len": ready.llm.max_model_len,
    }


@router.api_route("/v1/models", methods=["GET", "HEAD"])
async def models(request: Request) -> dict:
    return {"object": "list", "data": [model_card(server(request).require_ready())]}


@router.api_route("/v1/models/{model_id:path}", methods=["GET", "HEAD"])
async def model(request: Request, model_id: str) -> dict:
    """OpenAI's retrieve: the served model's object; any other id is a 404 (an id may hold slashes, as
    "Qwen/Qwen3-0.6B" does)."""
    ready = server(request).require_ready()
    if model_id != ready.model_name:
        raise ApiError(404, f"the model {model_id!r} does not exist; this server serves {ready.model_name!r}", "model")
    return model_card(ready)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    arrival = time.perf_counter()
    ready, body = await accept(request, ChatCompletionRequest)
    functions, choice = body.tool_choice_given()
    try:
        offered = functions if choice.mode != "none" else []
        messages = body.chat_messages()
        text = ready.llm.apply_chat_template(messages, offered, **body.template_options())
    except InvalidRequestError as e:
        raise ApiError(400, str(e), e.param or "messages") from None
    ids = await ready.prompts.encode(text, "messages")  # the rendered template is what must fit
    params = body.to_sampling_params(room(ready, len(ids)), functions, choice)
    out = Responses(
        "chat",
        f"chatcmpl-{uuid.uuid4().hex}",
        ready.model_name,
        ready.llm.tokenizer,
        body.include_usage,
        body.choices,
        tool_choice=choice,
        echo=None if (echo := body.echoed(messages)) is None else [echo],
    )
    return await respond(request, ready, out, [ids], params, arrival, body)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    arrival = time.perf_counter()
    ready, body = await accept(request, CompletionRequest)
    prompts, given = [], body.prompts()
    for prompt in given:
        if isinstance(prompt, str):
            prompts.append(await ready.prompts.encode(prompt, "prompt"))
        else:
            prompts.append(ready.prompts.check_ids(prompt, "prompt"))
    shortest_room = min(room(ready, len(ids)) for ids in prompts)
    params = body.to_sampling_params(default_max_tokens=min(16, shortest_room))  # OpenAI's default: 16
    request_id = f"cmpl-{uuid.uuid4().hex}"
    tokenizer = ready.llm.tokenizer
    echo = [p if isinstance(p, str) else tokenizer.decode(p, skip_special_tokens=False) for p in given]
    out = Responses(
        "text",
        request_id,
        ready.model_name,
        tokenizer,
        body.include_usage,
        body.choices,
        len(prompts),
        echo=echo if body.echo else None,
        prompt_ids=prompts,
        echo_only=body.echo_only,
    )
    return await respond(request, ready, out, prompts, params, arrival, body)


def room(ready: Ready, prompt_tokens: int) -> int:
    """The default max_tokens: whatever the context and the KV pool leave after the prompt (at least 1)."""
    return max(1, min(ready.llm.max_model_len, ready.llm.engine.kv_cache_tokens) - prompt_tokens)


async def respond(
    request: Request,
    ready: Ready,
    out: Responses,
    prompts: list[list[int]],
    params: SamplingParams,
    arrival: float,
    body: ChatCompletionRequest | CompletionRequest,
) -> Response:
    """Queue each prompt's n choices (all or none) and answer as the body asked: streamed or whole."""
    context = ready.llm.max_model_len
    for i, ids in enumerate(prompts):
        name = "the prompt" if len(prompts) == 1 else f"prompt {i}"
        if len(ids) >= context:  # the engine's check, here to name the prompt of a batch
            raise ApiError(400, str(PromptTooLongError.of(len(ids), context, name)), body.prompt_field)
        if context < len(ids) + params.max_tokens:  # vLLM's and OpenAI's 400, not a silent cut at the context
            field = body.max_tokens_field
            raise ApiError(
                400,
                f"this model's context holds {context} tokens; {name} has {len(ids)} and {field} asks for "
                f"{params.max_tokens} more: lower {field} to at most {context - len(ids)}",
                field,
            )
    count = len(prompts) * body.choices
    request_ids = [out.id] if count == 1 else [f"{out.id}-{i}" for i in range(count)]
    per_request = [ids for ids in prompts for _ in range(body.choices)]
    try:
        rs = await ready.engine_loop.add(request_ids, per_request, params.choices() * len(prompts), arrival)
    except InvalidRequestError as e:  # the prompts are checked by now: what is left is the KV pool's "lower max_tokens"
        raise ApiError(400, str(e), e.param or body.max_tokens_field) from None
    except QueueFullError as e:
        raise ApiError(429, str(e)) from None
    except EngineStoppedError as e:
        raise ApiError(503, str(e)) from None
    with_logprobs = params.logprobs is not None
    if body.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(
            events(request, rs, out, with_logprobs), media_type="text/event-stream", headers=headers
        )
    return await complete(request, rs, out, with_logprobs)


async def complete(request: Request, rs: RequestStream, out: Responses, with_logprobs: bool) -> Response:
    """The non-streamed response, once every choice has finished."""
    watcher = asyncio.create_task(close_on_disconnect(request, rs))
    logprobs = {request_id: [] for request_id in rs.request_ids}
    outputs = {}
    try:
        async for delta in rs.deltas():
            logprobs[delta.request_id] += delta.new_logprobs
            if delta.finished:
                outputs[delta.request_id] = delta.output
    except ClientGoneError:
        return Response(status_code=CLIENT_CLOSED)
    except EngineFailedError as e:
        raise ApiError(500, str(e)) from None
    except EngineStoppedError as e:
        raise ApiError(503, str(e)) from None
    finally:
        watcher.cancel()
        rs.close()
    failed = [o for o in outputs.values() if o.finish_reason is FinishReason.ERROR]
    if failed:
        raise ApiError(500, f"generation failed: {failed[0].error}")
    ordered = [outputs[request_id] for request_id in rs.request_ids]
    return JSONResponse(out.full(ordered, [logprobs[i] for i in rs.request_ids] if with_logprobs else None))


async def events(request: Request, rs: RequestStream, out: Responses, with_logprobs: bool) -> AsyncIterator[str]:
    """The SSE stream: a role chunk per choice (chat), chunks of each step that adds text or tool-call pieces, each
    choice's final chunk with its finish_reason and timings (the choices interleaved, each by its index), the usage
    chunk if asked for, then [DONE]. An error mid-stream becomes an error event."""
    watcher = asyncio.create_task(close_on_disconnect(request, rs))
    index = {request_id: i for i, request_id in enumerate(rs.request_ids)}
    outputs = {}
    try:
        if out.kind == "chat":
            for chunk in out.role_chunks():
                yield sse(chunk)
        async for d in rs.deltas():
            if d.finish_reason is FinishReason.ERROR:
                yield sse(error_body(500, f"generation failed: {d.output.error}"))
                break
            for chunk in out.delta_chunks(index[d.request_id], d, with_logprobs):
                yield sse(chunk)
            if d.finished:
                outputs[index[d.request_id]] = d.output
        else:
            if out.include_usage:
                yield sse(out.usage_chunk([outputs[i] for i in sorted(outputs)]))
        yield sse("[DONE]")
    except ClientGoneError:
        return
    except EngineStoppedError as e:  # also EngineFailedError
        yield sse(error_body(500 if isinstance(e, EngineFailedError) else 503, str(e)))
        yield sse("[DONE]")
    finally:
        watcher.cancel()
        rs.close()


async def close_on_disconnect(request: Request, rs: RequestStream) -> None:
    """Abort the request as soon as its client disconnects, even while it is still waiting for its first token."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    rs.close()
