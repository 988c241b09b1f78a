"""One streamed request to an OpenAI-compatible server: every network read is timestamped on arrival and its
SSE events turned into TTFT, ITL and E2E; any failure is kept on the record with its error."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from rooftop.bench.serve.datasets import SampleRequest
from rooftop.bench.serve.metrics import RequestRecord
from rooftop.errors import InvalidRequestError


@dataclass
class Target:
    """Where and how requests go: the endpoint URL, the model name and the request's fixed fields."""

    url: str
    model: str
    chat: bool
    ignore_eos: bool = True
    timeout_s: float = 3600.0
    api_key: str | None = None

    @property
    def headers(self) -> dict:
        return auth_headers(self.api_key)

    def body(self, req: SampleRequest) -> dict:
        """The request vLLM's bench sends: greedy, max_tokens from the dataset, usage in the stream."""
        body = {
            "model": self.model,
            "max_tokens": req.output_len,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.chat:
            body["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            body["prompt"] = req.prompt
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


class StreamError(Exception):
    """A failed request as the response showed it (an HTTP error, an error event, a stream without tokens or
    end); the message becomes the record's error."""


@dataclass
class StreamReader:
    """Feeds on raw SSE bytes with their arrival time; a chunk carrying text is a token-carrying chunk."""

    record: RequestRecord
    sent: float  # perf_counter() at the send
    buffer: bytes = b""
    last: float | None = None
    parts: list[str] = field(default_factory=list)
    done: bool = False  # [DONE] or a finish_reason seen

    def feed(self, data: bytes, arrived: float) -> None:
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                self._event(line[5:].strip(), arrived)

    def _event(self, data: bytes, arrived: float) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(data)
        except ValueError:
            raise StreamError(f"not a JSON chunk: {data[:200]!r}") from None
        if not isinstance(event, dict):
            raise StreamError(f"not a JSON object chunk: {data[:200]!r}")
        if event.get("error"):
            error = event["error"]
            raise StreamError(str(error.get("message", error) if isinstance(error, dict) else error))
        if isinstance(usage := event.get("usage"), dict):
            self.record.output_tokens = usage.get("completion_tokens")
            self.record.server_prompt_tokens = usage.get("prompt_tokens")
        choices = event.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        delta = choice.get("delta") or {}
        text = choice.get("text") or delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
        if text:
            if self.last is None:
                self.record.ttft_s = arrived - self.sent
            else:
                self.record.itl_s.append(arrived - self.last)
            self.last = arrived
            self.parts.append(text)
        if choice.get("finish_reason"):
            self.done = True

    def finish(self) -> None:
        """Complete the record, or name what was missing."""
        self.record.text = "".join(self.parts)
        if self.last is None:
            raise StreamError("the stream carried no output tokens")
        if not self.done:
            raise StreamError("the stream ended before a finish_reason or [DONE]")
        self.record.e2el_s = self.last - self.sent
        if self.record.output_tokens is not None:
            self.record.output_tokens_from = "usage"


async def send_request(
    client: httpx.AsyncClient, target: Target, req: SampleRequest, index: int, run_start: float, overheads: list[float]
) -> RequestRecord:
    """Send one request and stream its answer. Never raises for a failed request: the error goes on the record
    (with the TTFT and ITL seen before it, which the summary leaves out).
    `overheads` gets the client's own processing time of each network read (parse and bookkeeping)."""
    record = RequestRecord(index=index, prompt_len=req.prompt_len, max_tokens=req.output_len)
    body = target.body(req)
    sent = time.perf_counter()
    record.send_time_s = sent - run_start
    reader = StreamReader(record, sent)
    try:
        await asyncio.wait_for(_stream(client, target.url, body, reader, overheads), target.timeout_s)
        reader.finish()
    except (asyncio.TimeoutError, httpx.TimeoutException):
        record.error = f"timed out after {target.timeout_s:g} s"
    except StreamError as e:
        record.error = str(e)
    except Exception as e:  # a broken stream (httpx.RemoteProtocolError, ReadError...) or a malformed chunk
        record.error = f"{type(e).__name__}: {e}"
    return record


async def _stream(
    client: httpx.AsyncClient, url: str, body: dict, reader: StreamReader, overheads: list[float]
) -> None:
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace").strip()
            raise StreamError(f"HTTP {response.status_code}: {text[:300]}")
        async for data in response.aiter_bytes():
            arrived = time.perf_counter()
            reader.feed(data, arrived)
            overheads.append(time.perf_counter() - arrived)


def auth_headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def api_base(base_url: str) -> str:
    """`http://host:8000/v1` as given; a bare `http://host:8000` (vLLM's --base-url) gets `/v1`."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidRequestError(f"--base-url must look like http://127.0.0.1:8000/v1, got {base_url!r}")
    base = base_url.rstrip("/")
    return base + "/v1" if parts.path in ("", "/") else base


async def server_model(base: str, model: str | None, api_key: str | None = None) -> str:
    """Check the server answers; the model is --model, else the first id of GET /models (as vLLM's bench)."""
    try:
        async with httpx.AsyncClient(timeout=30, headers=auth_headers(api_key)) as client:
            response = await client.get(f"{base}/models")
    except httpx.HTTPError as e:
        raise InvalidRequestError(f"cannot reach {base}/models: {type(e).__name__}: {e}") from None
    if model:
        return model
    if response.status_code != 200:
        raise InvalidRequestError(
            f"GET {base}/models: HTTP {response.status_code}: {response.text.strip()[:200]}; pass --model"
        )
    try:
        return response.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise InvalidRequestError(f"GET {base}/models gave no model id; pass --model") from None
