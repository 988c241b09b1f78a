"""The client side of the reliability run (issue 14), shared by the bounded runs in tests/test_reliability.py and the
full run in benchmarks/reliability.py (which puts this directory on sys.path): clients that say how each request
ended (ok, 429, other 4xx, 5xx, an error event, a reset, a hang...), the batch-against-alone comparer with the
near-tie rule of near_ties.py, the seeded generator of fuzzed request bodies and the check of their answers, raw
HTTP probes over a socket, the API-key probe and /metrics. It talks to a base URL and imports nothing of rooftop, so
the same code judges an in-thread test server and a `rooftop serve` process.

It lives here rather than in benchmarks/ because the suite must import it as it imports its other helpers (conftest
puts tests/ on the path) and because its comparer applies near_ties.py's rule; the benchmark is the one script that
reaches over."""

from __future__ import annotations

import asyncio
import json
import math
import random
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import httpx
from near_ties import FLOAT_TIE, QUANTIZED_TIE, first_difference
from prometheus_client.parser import text_string_to_metric_families

COMPLETIONS, CHAT, TOKENIZE, DETOKENIZE = "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"
LOGPROB_TOL = 1e-4  # issue 14: a request's logprobs equal within 1e-4 whatever shares its step
DEADLINE_S = 120.0  # a request's deadline: past it, it hangs (not a slow host: every count here is small)
FAILURES = ("5xx", "error_event", "reset", "refused", "hang", "incomplete", "malformed")  # never acceptable


def tie_for(weights: str) -> float:
    """near_ties.py's margin for a `--weights` choice (FORMAT or FORMAT@DTYPE): FLOAT_TIE for float32 paths,
    QUANTIZED_TIE for int8, int4 and 16-bit floats."""
    return FLOAT_TIE if weights in ("float", "fp32", "float@float32") else QUANTIZED_TIE


# --- how one request ended ---------------------------------------------------------------------------------------


@dataclass
class Result:
    """One request as its client saw it. `kind`: ok (a full answer: a finish_reason, and [DONE] when streamed), 429,
    4xx, 5xx, error_event (a 200 stream that carried an error), reset (the connection broke), refused (no
    connection), hang (past the deadline), incomplete (a stream that stopped without [DONE]), malformed (a body
    that does not parse as the API's)."""

    kind: str = "incomplete"
    status: int | None = None
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[dict[str, float]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: dict | None = None  # the "error" object of an error body or an error event
    timings: dict | None = None
    retry_after: str | None = None
    events: int = 0
    seconds: float = 0.0
    detail: str = ""

    def brief(self) -> dict:
        """For a report: everything but the per-token lists."""
        d = asdict(self)
        for k in ("tokens", "logprobs", "top"):
            d.pop(k)
        d["n_tokens"] = len(self.tokens)
        return d


def _absorb(result: Result, body: dict) -> None:
    """One response body or stream chunk (text completion or chat) into `result`."""
    if "error" in body:
        result.error = body["error"]
        return
    if body.get("timings"):
        result.timings = body["timings"]
    for choice in body.get("choices") or []:
        delta = choice.get("delta")
        message = choice.get("message")
        text = choice.get("text") if "text" in choice else (delta or message or {}).get("content")
        result.text += text or ""
        result.finish_reason = choice.get("finish_reason") or result.finish_reason
        lp = choice.get("logprobs")
        if not lp:
            continue
        if "content" in lp:  # chat
            for e in lp["content"] or []:
                result.tokens.append(e["token"])
                result.logprobs.append(e["logprob"])
                result.top.append({t["token"]: t["logprob"] for t in e.get("top_logprobs") or []})
        else:
            result.tokens += lp["tokens"]
            result.logprobs += lp["token_logprobs"]
            result.top += [t or {} for t in lp["top_logprobs"]]


def _status_kind(status: int) -> str:
    return "429" if status == 429 else "5xx" if status >= 500 else "4xx" if status >= 400 else "malformed"


def error_object(raw: bytes) -> dict | None:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return body.get("error") if isinstance(body, dict) else None


async def send(
    client: httpx.AsyncClient, path: str, body: dict, deadline_s: float = DEADLINE_S, headers: dict | None = None
) -> Result:
    """POST `body` and read the whole answer (an SSE stream when body["stream"]), within `deadline_s`."""
    result, start = Result(), time.perf_counter()
    try:
        await asyncio.wait_for(_send(client, path, body, headers, result), deadline_s)
    except (asyncio.TimeoutError, httpx.TimeoutException) as e:
        result.kind, result.detail = "hang", type(e).__name__
    except httpx.ConnectError as e:
        result.kind, result.detail = "refused", f"{type(e).__name__}: {e}"
    except (httpx.TransportError, ConnectionError) as e:  # RemoteProtocolError, ReadError, WriteError ...
        result.kind, result.detail = "reset", f"{type(e).__name__}: {e}"
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        result.kind, result.detail = "malformed", f"{type(e).__name__}: {e}"
    result.seconds = time.perf_counter() - start
    return result


async def _send(client: httpx.AsyncClient, path: str, body: dict, headers: dict | None, result: Result) -> None:
    async with client.stream("POST", path, json=body, headers=headers) as response:
        result.status = response.status_code
        result.retry_after = response.headers.get("retry-after")
        if response.status_code != 200:
            result.error = error_object(await response.aread())
            result.kind = _status_kind(response.status_code)
            return
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            _absorb(result, json.loads(await response.aread()))
            result.kind = "ok" if result.finish_reason else "malformed"
            return
        done = False
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                break
            result.events += 1
            _absorb(result, json.loads(data))
        if not done:
            result.kind = "incomplete"
        else:
            result.kind = "error_event" if result.error else "ok" if result.finish_reason else "malformed"


async def send_openai(ac, body: dict, deadline_s: float = DEADLINE_S) -> Result:
    """The same completion request through the openai client (an `openai.AsyncOpenAI`), streamed, as a Result."""
    import openai

    result, start = Result(), time.perf_counter()
    standard = {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "logprobs", "stop", "stream"}
    args = {k: v for k, v in body.items() if k in standard}
    extra = {k: v for k, v in body.items() if k not in standard}

    async def run() -> None:
        stream = await ac.completions.create(**args, extra_body=extra or None)
        result.status = 200
        if not args.get("stream"):
            _absorb(result, stream.model_dump())
            result.kind = "ok" if result.finish_reason else "malformed"
            return
        async for chunk in stream:
            result.events += 1
            _absorb(result, chunk.model_dump())
        result.kind = "ok" if result.finish_reason else "incomplete"  # the client ends the loop at [DONE]

    try:
        await asyncio.wait_for(run(), deadline_s)
    except asyncio.TimeoutError:
        result.kind = "hang"
    except openai.APITimeoutError as e:
        result.kind, result.detail = "hang", str(e)
    except openai.APIConnectionError as e:
        result.kind, result.detail = "reset", f"{type(e.__cause__ or e).__name__}: {e}"
    except openai.APIStatusError as e:
        result.status, result.kind = e.status_code, _status_kind(e.status_code)
        result.error = e.body.get("error", e.body) if isinstance(e.body, dict) else {"message": str(e.body)}
    except openai.APIError as e:  # an error event inside a 200 stream
        result.kind, result.error = "error_event", {"message": e.message}
    result.seconds = time.perf_counter() - start
    return result


def async_client(url: str, deadline_s: float, headers: dict | None = None) -> httpx.AsyncClient:
    """An httpx client with no pool limit, so that no request waits on the client's side."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(base_url=url, timeout=deadline_s, limits=limits, headers=headers)


# --- batched against alone -------------------------------------------------------------------------------------


def prompts(seed: int, count: int, sentences: int = 1) -> list[str]:
    """`count` distinct prompts of `sentences` short sentences each, the same for a seed on every host."""
    rng = random.Random(seed)
    subjects = ["The river", "A small robot", "My grandmother", "The old lighthouse", "Every morning the baker"]
    subjects += ["In the year 3000, cities", "The recipe for bread", "A letter to the mayor", "The chess match"]
    verbs = ["begins with", "explains why", "remembers how", "describes", "argues that", "wonders whether"]
    objects = ["the rain", "a broken clock", "seven ships", "the market", "quiet snow", "the last train", "numbers"]

    def sentence() -> str:
        return f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{'.' * rng.randint(0, 2)}"

    return [f"{i}. " + " ".join(sentence() for _ in range(sentences)) for i in range(count)]


def completion_body(prompt: str, max_tokens: int, seed: int | None = None, logprobs: int = 1, **extra) -> dict:
    """A streamed completion with logprobs: greedy without `seed`, sampled at temperature 0.8 with it."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "logprobs": logprobs}
    body |= {"temperature": 0} if seed is None else {"temperature": 0.8, "seed": seed}
    return body | extra


def difference(own: Result, ref: Result, tol: float = LOGPROB_TOL) -> str | None:
    """None where `own` has `ref`'s tokens, each logprob within `tol`; else what differs first."""
    if own.kind != "ok" or ref.kind != "ok":
        return f"not both answered: {own.kind} / {ref.kind} {own.detail or own.error or ''}".strip()
    i = first_difference(own.tokens, ref.tokens)
    if i is not None:
        return f"token {i}: {own.tokens[i]!r} where alone gave {ref.tokens[i]!r}"
    if len(own.tokens) != len(ref.tokens):
        return f"{len(own.tokens)} tokens where alone gave {len(ref.tokens)}"
    gaps = [abs(a - b) for a, b in zip(own.logprobs, ref.logprobs, strict=True)]
    worst = max(gaps, default=0.0)
    if not worst <= tol:  # NaN too
        return f"token {gaps.index(worst)}: logprob differs by {worst:.3g} (tolerance {tol:g})"
    return None


def parting(own: Result, ref: Result) -> tuple[int, float | None] | None:
    """Where `own` first parts from `ref`, with `ref`'s margin there (its token's logprob over own's, read from
    ref's top logprobs; None where own's token is not among them, so no near tie can be shown). None where they
    agree."""
    i = first_difference(own.tokens, ref.tokens)
    if i is None:
        return None
    top = ref.top[i] if i < len(ref.top) else {}
    if own.tokens[i] not in top:  # past ref's top-k: the margin is at least ref's lead over its k-th
        return i, None
    return i, ref.logprobs[i] - top[own.tokens[i]]


@dataclass
class Comparison:
    """Requests batched against the same requests alone. `within_tie` (only under the near-tie rule): parted where
    alone's own margin is under the tie, or the same tokens with logprobs further apart than the tolerance;
    `differ`: every other request that is not exactly equal."""

    requests: int = 0
    exact: int = 0
    within_tie: int = 0
    of_which_same_tokens: int = 0  # within_tie with every token equal, the logprobs further apart than `tol`
    differ: int = 0
    failed: int = 0  # either run did not answer
    worst_logprob_gap: float = 0.0  # over the requests whose tokens agree
    examples: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.differ == 0 and self.failed == 0 and self.requests > 0


def compare(
    batched: list[Result], alone: list[Result], tie: float | None = None, tol: float = LOGPROB_TOL
) -> Comparison:
    """The exact rule (tokens equal, logprobs within `tol`), or with `tie` the near-tie rule: a run may part from
    alone's where alone's margin is under `tie` (and only there)."""
    c = Comparison(requests=len(alone))
    for i, (own, ref) in enumerate(zip(batched, alone, strict=True)):
        why = difference(own, ref, tol)
        if own.kind == ref.kind == "ok" and first_difference(own.tokens, ref.tokens) is None:
            gaps = [abs(a - b) for a, b in zip(own.logprobs, ref.logprobs, strict=False)]
            c.worst_logprob_gap = max(c.worst_logprob_gap, max(gaps, default=0.0))
        if why is None:
            c.exact += 1
            continue
        if own.kind != "ok" or ref.kind != "ok":
            c.failed += 1
        else:
            part = parting(own, ref)
            margin = None if part is None else part[1]
            if tie is not None and (part is None or (margin is not None and margin < tie)):  # a rule about tokens
                c.within_tie += 1
                c.of_which_same_tokens += part is None
                continue
            c.differ += 1
            if part is not None:
                why += " (not in alone's top logprobs)" if margin is None else f" (alone led by {margin:.3f})"
        if len(c.examples) < 5:
            c.examples.append(f"request {i}: {why}")
    return c


# --- load -----------------------------------------------------------------------------------------------------


def poisson_offsets(seed: int, count: int, rate: float) -> list[float]:
    """Arrival times (seconds from the start) of a Poisson process of `rate` per second."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out


async def send_at(
    offsets: list[float], bodies: list[dict], client: httpx.AsyncClient, deadline_s: float
) -> list[Result]:
    """Each body POSTed to /v1/completions at its offset from now, without waiting for the ones before."""
    start = time.perf_counter()

    async def one(offset: float, body: dict) -> Result:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        return await send(client, COMPLETIONS, body, deadline_s)

    return await asyncio.gather(*(one(t, b) for t, b in zip(offsets, bodies, strict=True)))


def tally(results: list[Result]) -> dict[str, int]:
    counts = Counter(r.kind for r in results)
    return {k: counts[k] for k in ("ok", "429", "4xx", *FAILURES) if counts[k]} | {"requests": len(results)}


# --- /metrics ----------------------------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample: {'name{label="v"}': value}."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


IDLE_GAUGES = ("rooftop_num_requests_running", "rooftop_num_requests_waiting", "rooftop_kv_cache_usage_perc")


async def idle_state(client: httpx.AsyncClient) -> dict:
    """The gauges that must fall back to 0 once nothing runs, from /metrics and the dashboard's state."""
    m = parse_metrics((await client.get("/metrics")).text)
    state = (await client.get("/dashboard/state")).json()
    return {g: m.get(g) for g in IDLE_GAUGES} | {
        "dashboard_running": state.get("running"),
        "dashboard_waiting": state.get("waiting"),
        "kv_blocks_used": state.get("kv_blocks_used"),
    }


def is_idle(state: dict) -> bool:
    return all(v == 0 for v in state.values())


async def wait_idle(client: httpx.AsyncClient, timeout_s: float) -> tuple[bool, dict, float]:
    """Poll until the server is idle (running, waiting and KV blocks at 0): (idle, last state, seconds waited)."""
    start = time.perf_counter()
    while True:
        state = await idle_state(client)
        if is_idle(state) or time.perf_counter() - start > timeout_s:
            return is_idle(state), state, time.perf_counter() - start
        await asyncio.sleep(0.05)


# --- disconnects ----------------------------------------------------------------------------------------------


async def leave_mid_stream(
    client: httpx.AsyncClient, body: dict, events: int, deadline_s: float, linger: asyncio.Event | None = None
) -> str:
    """Stream `body`, read `events` events (0: only the headers; then wait for `linger` if given), then close the
    connection: how it went ("left", "finished first", "status N", "hang", "reset: ...")."""

    async def run() -> str:
        async with client.stream("POST", COMPLETIONS, json=body | {"stream": True}) as response:
            if response.status_code != 200:
                return f"status {response.status_code}"
            if events == 0:
                if linger is not None:
                    await linger.wait()
                return "left"
            seen = 0
            async for line in response.aiter_lines():
                if seen >= events:
                    return "left"
                if line.startswith("data: "):
                    if line == "data: [DONE]":
                        return "finished first"
                    seen += 1
            return "left" if seen >= events else "finished first"

    try:
        return await asyncio.wait_for(run(), deadline_s)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        return "hang"
    except httpx.TransportError as e:
        return f"reset: {type(e).__name__}"


async def leave_unstreamed(url: str, body: dict, after: float | asyncio.Event) -> None:
    """Send a non-streamed request over a raw connection and close it `after` seconds (or once the event is set)
    without reading the answer."""
    host, port = host_port(url)
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body | {"stream": False}).encode()
    head = f"POST {COMPLETIONS} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    if isinstance(after, asyncio.Event):
        await after.wait()
    else:
        await asyncio.sleep(after)
    writer.close()
    try:
        await writer.wait_closed()
    except ConnectionError:
        pass


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    return host, int(port)


# --- fuzzed bodies ----------------------------------------------------------------------------------------------

FIELDS = {
    COMPLETIONS: ["prompt", "logprobs", "echo", "suffix", "best_of"],
    CHAT: ["messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice", "response_format"],
    TOKENIZE: ["prompt", "messages", "add_generation_prompt", "add_special_tokens", "model"],
    DETOKENIZE: ["tokens", "model"],
}
SAMPLING = ["model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "n"]
SAMPLING += ["presence_penalty", "frequency_penalty", "stop", "stop_token_ids", "ignore_eos", "stream"]
SAMPLING += ["stream_options", "logit_bias", "user", "min_tokens", "skip_special_tokens"]
CONTENT_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
    "application/xml",
    "application/json; charset=utf-16",
    "application/octet-stream",
    "image/png",
    "",
]
EDGE_INTS = [0, 1, -1, 2, 20, 21, 255, 256, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64]
EDGE_INTS += [-(2**63), -(2**63) - 1, 10**30, -(10**30), 10**400]
EDGE_FLOATS = [0.0, -0.0, 0.5, 1.0, 1.0000001, 2.0, 2.0000001, -2.0000001, 1e-46, 1e-320, 5e-324, 1e-7, 1e38, 3.5e38]
EDGE_FLOATS += [1e308, -1e308, 1.7976931348623157e308, math.nan, math.inf, -math.inf]


@dataclass(frozen=True)
class FuzzCase:
    path: str
    content: bytes
    content_type: str | None  # None: no Content-Type header
    kind: str  # how it was made, for the report


def _junk_string(rng: random.Random, max_len: int) -> str:
    pick = rng.random()
    if pick < 0.3:
        return rng.choice(["", " ", "16", "true", "null", "NaN", "gpt-4", "\x00", "\n\n", "data: [DONE]", "é" * 3])
    if pick < 0.85:  # unicode junk: controls, RTL, emoji, lone surrogates, private use, noncharacters
        pool = [0x0, 0x7, 0x1B, 0x7F, 0x85, 0xA0, 0x202E, 0x200D, 0xFEFF, 0xFFFD, 0xFFFF, 0xD800, 0xDFFF, 0x1F600]
        pool += [0x10FFFF, 0xE000, 0x0301, 0x4E2D]
        n = rng.randint(1, 64)
        return "".join(chr(rng.choice(pool) if rng.random() < 0.5 else rng.randint(32, 0x2FFF)) for _ in range(n))
    if pick < 0.95 or max_len <= 1000:
        return "".join(rng.choice('ab x\n{}"\\') for _ in range(rng.randint(1, 1000)))
    return rng.choice("ab x\n") * int(10 ** rng.uniform(3, math.log10(max_len)))  # long, up to max_len


def _junk(rng: random.Random, max_len: int, depth: int = 0) -> object:
    """A value of any JSON type, edge values weighted up."""
    pick = rng.random()
    if pick < 0.2:
        return rng.choice(EDGE_INTS) if rng.random() < 0.7 else rng.randint(-1000, 1000)
    if pick < 0.4:
        return rng.choice(EDGE_FLOATS) if rng.random() < 0.7 else rng.uniform(-10, 10)
    if pick < 0.6:
        return _junk_string(rng, max_len)
    if pick < 0.7:
        return rng.choice([True, False, None])
    if pick < 0.85 and depth < 3:
        return [_junk(rng, max_len, depth + 1) for _ in range(rng.randint(0, 4))]
    if depth < 3:
        return {_junk_string(rng, 20): _junk(rng, max_len, depth + 1) for _ in range(rng.randint(0, 3))}
    return None


def _plausible(rng: random.Random, name: str, max_len: int) -> object:
    """A value of the right type for `name`, often at or past its edges."""
    ints = {"max_tokens", "top_k", "seed", "n", "logprobs", "top_logprobs", "max_completion_tokens", "min_tokens"}
    floats = {"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}
    if name in ints:
        return rng.choice(EDGE_INTS + [rng.randint(-5, 40)])
    if name in floats:
        return rng.choice(EDGE_FLOATS + [rng.uniform(-3, 3)])
    if name in ("stream", "ignore_eos", "echo", "logprobs", "add_generation_prompt", "add_special_tokens"):
        return rng.choice([True, False])
    if name == "stop":
        return rng.choice(
            [_junk_string(rng, 200), [_junk_string(rng, 50) for _ in range(rng.randint(0, 6))], ["a"] * 1000]
        )
    if name in ("stop_token_ids", "tokens"):
        return [rng.choice(EDGE_INTS + [rng.randint(0, 300)]) for _ in range(rng.randint(0, 8))]
    if name == "prompt":
        return rng.choice(
            [
                _junk_string(rng, max_len),
                [rng.choice(EDGE_INTS + [rng.randint(0, 255)]) for _ in range(rng.randint(0, 10))],
                [_junk_string(rng, 30) for _ in range(rng.randint(0, 3))],
                [[rng.randint(0, 255)]],
                [],
            ]
        )
    if name == "messages":
        roles = ["user", "system", "assistant", "developer", "tool", "wizard", "", None]
        content = lambda: rng.choice(  # noqa: E731
            [_junk_string(rng, max_len), None, [{"type": "text", "text": "hi"}], [{"type": "image_url"}], 5, []]
        )
        return [{"role": rng.choice(roles), "content": content()} for _ in range(rng.choice([0, 1, 2, 3, 200]))]
    if name == "stream_options":
        return rng.choice([{"include_usage": True}, {"include_usage": "yes"}, {}, None, []])
    if name == "model":
        return rng.choice([None, "", "gpt-4", "../../etc/passwd", _junk_string(rng, 40)])
    return _junk(rng, max_len)


def _base(rng: random.Random, path: str) -> dict:
    """A valid, cheap request for `path` (a few tokens at most)."""
    text = rng.choice(["hi", "Once upon a time", "2 + 2 =", "Bonjour", "こんにちは", "🙂 ok"])
    cap = {"max_tokens": rng.randint(1, 4)}
    if path == COMPLETIONS:
        return {"prompt": text, **cap} | ({"temperature": 0} if rng.random() < 0.5 else {})
    if path == CHAT:
        return {"messages": [{"role": "user", "content": text}], **cap}
    if path == TOKENIZE:
        return {"prompt": text} if rng.random() < 0.5 else {"messages": [{"role": "user", "content": text}]}
    return {"tokens": [rng.randint(3, 255) for _ in range(rng.randint(1, 8))]}


def _mutated(rng: random.Random, path: str, max_len: int) -> tuple[object, str]:
    body: dict = _base(rng, path)
    names = FIELDS[path] + (SAMPLING if path in (COMPLETIONS, CHAT) else [])
    ops = []
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        if op < 0.35:
            name = rng.choice(names)
            body[name], kind = _plausible(rng, name, max_len), "edge"
        elif op < 0.6:
            name = rng.choice(names)
            body[name], kind = _junk(rng, max_len), "wrong type"
        elif op < 0.75:
            body[_junk_string(rng, 30)], kind = _junk(rng, max_len), "unknown field"
        elif op < 0.9 and body:
            body.pop(rng.choice(list(body)))
            kind = "missing field"
        else:
            return _junk(rng, max_len), "not an object"
        ops.append(kind)
    return body, "+".join(ops)


def _raw(rng: random.Random, body: object) -> tuple[bytes, str]:
    """The body as bytes: mostly JSON, sometimes broken on purpose."""
    text = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    pick = rng.random()
    if pick < 0.8:
        return text, ""
    if pick < 0.85:
        return text[: rng.randint(0, max(0, len(text) - 1))], "+truncated"
    if pick < 0.88:
        return b"\xef\xbb\xbf" + text, "+BOM"
    if pick < 0.91:
        return text + rng.choice([b"}", b" garbage", b"\x00", b"\n{}"]), "+trailing"
    if pick < 0.93:
        depth = rng.choice([64, 1000, 100_000])
        return b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}", "+deep nesting"
    if pick < 0.95:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))), "+random bytes"
    if pick < 0.97:
        i = rng.randint(0, len(text))
        return text[:i] + b"\xff\xfe\xc3" + text[i:], "+invalid UTF-8"
    if pick < 0.99 and text.startswith(b"{") and len(text) > 2:  # a key given twice, the second junk
        return b'{"max_tokens": 2, "max_tokens": "x", ' + text[1:], "+duplicate key"
    return b"", "+empty"


def fuzz_cases(seed: int, count: int, max_string: int = 100_000) -> Iterator[FuzzCase]:
    """`count` seeded request bodies over the four POST routes: wrong types, edge and huge numbers, NaN and
    infinities, unknown and missing fields, malformed JSON, other content types, unicode junk, nesting, strings up
    to `max_string` characters."""
    rng = random.Random(seed)
    for _ in range(count):
        path = rng.choice([COMPLETIONS, COMPLETIONS, CHAT, CHAT, TOKENIZE, DETOKENIZE])
        body, kind = _mutated(rng, path, max_string)
        content, how = _raw(rng, body)
        content_type = "application/json"
        if rng.random() < 0.12:
            content_type = rng.choice(CONTENT_TYPES) or None
            how += f"+content-type {content_type}"
        yield FuzzCase(path, content, content_type, kind + how)


def check_answer(path: str, status: int, content_type: str, body: bytes) -> str | None:
    """None where the answer is one the API allows; else what is wrong with it. A 4xx must carry an OpenAI-style
    error; a 2xx must be the route's body (an SSE stream ending in [DONE] with no error event, when streamed)."""
    if status >= 500:
        return f"{status}: {body[:200]!r}"
    if 400 <= status < 500:
        error = error_object(body)
        if not isinstance(error, dict) or not isinstance(error.get("message"), str) or not error["message"]:
            return f"{status} without an OpenAI error body: {body[:200]!r}"
        if not {"type", "param", "code"} <= set(error):
            return f"{status}: the error lacks type/param/code: {error}"
        return None
    if status != 200:
        return f"unexpected status {status}"
    if content_type.startswith("text/event-stream"):
        text = body.decode("utf-8", "replace")
        if not text.endswith("data: [DONE]\n\n"):
            return f"a stream that does not end in [DONE]: ...{text[-200:]!r}"
        for event in text.split("\n\n"):
            if event.startswith("data: {") and "error" in json.loads(event.removeprefix("data: ")):
                return f"a stream with an error event: {event[:300]!r}"
        return None
    try:
        answer = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"200 that is not JSON: {body[:200]!r}"
    need = {COMPLETIONS: "choices", CHAT: "choices", TOKENIZE: "tokens", DETOKENIZE: "prompt"}[path]
    return None if isinstance(answer, dict) and need in answer else f"200 without {need}: {body[:200]!r}"


@dataclass
class FuzzTally:
    sent: int = 0
    statuses: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)  # 5xx, 4xx without an error body, bad 2xx
    transport: Counter = field(default_factory=Counter)  # reset, hang
    # 400s about a value that name no field (issue 14's Must 3 wants `param` set); refusals of the body as a whole
    # (not JSON, not an object: this server's messages start "the body") need none and are not counted
    param_null_400: int = 0
    param_null_examples: list[str] = field(default_factory=list)
    first_500: FuzzCase | None = None
    slowest: list[tuple[float, int, str]] = field(default_factory=list)  # (seconds, status, what), the 5 slowest

    def as_dict(self) -> dict:
        return {
            "sent": self.sent,
            "statuses": dict(sorted(self.statuses.items())),
            "problems": len(self.problems),
            "problem_examples": self.problems[:10],
            "resets": self.transport["reset"],
            "hangs": self.transport["hang"],
            "param_null_400": self.param_null_400,
            "param_null_examples": self.param_null_examples,
            "slowest": [{"seconds": round(t, 2), "status": st, "case": what} for t, st, what in self.slowest],
        }


async def fuzz(
    client: httpx.AsyncClient, cases: list[FuzzCase], concurrency: int, deadline_s: float, on_done=None
) -> FuzzTally:
    """Send every case (`concurrency` at a time, on pooled keep-alive connections) and check every answer."""
    tally, gate = FuzzTally(), asyncio.Semaphore(concurrency)

    async def one(case: FuzzCase) -> None:
        headers = {} if case.content_type is None else {"Content-Type": case.content_type}
        async with gate:
            start = time.perf_counter()
            try:
                response = await asyncio.wait_for(
                    client.post(case.path, content=case.content, headers=headers), deadline_s
                )
            except (asyncio.TimeoutError, httpx.TimeoutException):
                tally.transport["hang"] += 1
                tally.problems.append(f"hang: {case.path} [{case.kind}] {case.content[:200]!r}")
                return
            except httpx.TransportError as e:
                tally.transport["reset"] += 1
                tally.problems.append(f"{type(e).__name__}: {case.path} [{case.kind}] {case.content[:200]!r}")
                return
            finally:
                tally.sent += 1
                if on_done is not None:
                    on_done()
        tally.statuses[response.status_code] += 1
        what = f"{case.path} [{case.kind}] {len(case.content)} bytes"
        tally.slowest = sorted([*tally.slowest, (time.perf_counter() - start, response.status_code, what)])[-5:]
        why = check_answer(case.path, response.status_code, response.headers.get("content-type", ""), response.content)
        if why is not None:
            tally.problems.append(f"{case.path} [{case.kind}] {why}")
            if response.status_code >= 500 and tally.first_500 is None:
                tally.first_500 = case
        error = error_object(response.content) or {}
        whole_body = str(error.get("message", "")).startswith("the body ")
        if response.status_code == 400 and error.get("param") is None and not whole_body:
            tally.param_null_400 += 1
            message = str(error.get("message"))[:100]
            if len(tally.param_null_examples) < 8 and message not in tally.param_null_examples:
                tally.param_null_examples.append(message)

    await asyncio.gather(*(one(c) for c in cases))
    return tally


# --- raw HTTP over a socket -------------------------------------------------------------------------------------


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


class RawConnection:
    """One TCP connection, spoken to byte by byte: for what an HTTP client library will not send."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.sock = socket.create_connection(host_port(url), timeout=timeout)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            if not self._fill():
                raise ConnectionError("closed")
        head, self.buffer = self.buffer.split(marker, 1)
        return head

    def _exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._fill():
                raise ConnectionError("closed")
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def response(self, head_only: bool = False) -> RawResponse:
        """The next response (1xx skipped); raises ConnectionError if the server closed first, TimeoutError."""
        while True:
            lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if line)}
            if status >= 200:
                break
        if head_only:
            return RawResponse(status, headers, b"")
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self._until(b"\r\n").split(b";")[0], 16)
                body += self._exactly(size)
                self._exactly(2)
                if size == 0:
                    break
        elif "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        else:
            while self._fill():
                pass
            body, self.buffer = self.buffer, b""
        return RawResponse(status, headers, body)

    def closed_by_server(self, wait_s: float) -> float | None:
        """Seconds until the server closes this connection (reading and dropping whatever comes), or None if it is
        still open after `wait_s`."""
        start = time.perf_counter()
        self.sock.settimeout(0.2)
        while time.perf_counter() - start < wait_s:
            try:
                if not self.sock.recv(65536):
                    return time.perf_counter() - start
            except TimeoutError:
                continue
            except ConnectionError:
                return time.perf_counter() - start
        return None

    def close(self) -> None:
        self.sock.close()


def http_request(method: str, path: str, host: str, body: bytes | None = None, extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + (body or b"")


BAD_REQUESTS = {  # complete but odd or broken requests: each gets an answer under 500 or a clean close, never silence
    "garbage request line": b"GARBAGE\r\n\r\n",
    "no target": b"GET\r\n\r\n",
    "HTTP/9.9": b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
    "HTTP/1.1 without Host": b"GET /health HTTP/1.1\r\n\r\n",
    "header without colon": b"GET /health HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n",
    "space in header name": b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n",
    "NUL in target": b"GET /he\x00alth HTTP/1.1\r\nHost: x\r\n\r\n",
    "negative Content-Length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    "non-numeric Content-Length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "two Content-Lengths": b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "Content-Length and chunked": (
        b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "bad chunk size": b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "unknown Transfer-Encoding": b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n{}",
    "70 KB target": b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "1000 headers": b"GET /health HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-%d: y\r\n" % i for i in range(1000))
    + b"\r\n",
    "TLS hello on plain HTTP": bytes.fromhex("16030100a5010000a10303") + bytes(32) + b"\r\n\r\n",
}


def bad_request_probe(url: str, name: str, data: bytes, timeout: float = 10.0) -> dict:
    """Send one broken request; an answer under 500 or a close is fine, a 5xx or no answer within `timeout` is not."""
    conn = RawConnection(url, timeout)
    try:
        conn.send(data)
        r = conn.response()
        verdict = "5xx" if r.status >= 500 else "ok"  # h11 takes HTTP/9.9 and 1000 headers: harmless
        return {"probe": name, "status": r.status, "verdict": verdict}
    except TimeoutError:
        return {"probe": name, "status": None, "verdict": "hang"}
    except ConnectionError as e:  # closed or reset without an answer
        return {"probe": name, "status": None, "verdict": "closed", "detail": str(e)}
    finally:
        conn.close()


def pipelined_probe(url: str) -> dict:
    """Three requests in one write: three answers, in order."""
    host = url.removeprefix("http://").rstrip("/")
    conn = RawConnection(url)
    try:
        conn.send(
            http_request("GET", "/health", host)
            + http_request("POST", TOKENIZE, host, b'{"prompt": "hi"}')
            + http_request("GET", "/v1/models", host)
        )
        got = [conn.response() for _ in range(3)]
        ok = [r.status for r in got] == [200, 200, 200] and b"tokens" in got[1].body and b'"list"' in got[2].body
        return {"probe": "pipelined requests", "statuses": [r.status for r in got], "verdict": "ok" if ok else "wrong"}
    except (TimeoutError, ConnectionError) as e:
        return {"probe": "pipelined requests", "verdict": type(e).__name__}
    finally:
        conn.close()


def keep_alive_probe(url: str, name: str, first: bytes, expect_status: int | None = None) -> dict:
    """`first` on a fresh connection, then a normal request on the same one: it must be served (or the server must
    have said Connection: close and closed, which is honest)."""
    host = url.removeprefix("http://").rstrip("/")
    conn = RawConnection(url)
    try:
        conn.send(first)
        r = conn.response()
        if expect_status is not None and r.status != expect_status:
            return {"probe": name, "first": r.status, "verdict": f"first answer {r.status}, not {expect_status}"}
        if r.headers.get("connection", "").lower() == "close":
            return {"probe": name, "first": r.status, "verdict": "ok (closed, said so)"}
        conn.send(http_request("POST", TOKENIZE, host, b'{"prompt": "still here"}'))
        again = conn.response()
        return {
            "probe": name,
            "first": r.status,
            "then": again.status,
            "verdict": "ok" if again.status == 200 else "wrong",
        }
    except (TimeoutError, ConnectionError) as e:
        return {"probe": name, "verdict": f"connection lost: {type(e).__name__}"}
    finally:
        conn.close()


def half_sent_probe(url: str, name: str, data: bytes, wait_s: float) -> dict:
    """Send a request's first bytes and stop: other clients must still be served meanwhile; reports whether and
    when the server times the connection out (issue 14's Must 5 wants header/body read timeouts)."""
    conn = RawConnection(url)
    try:
        conn.send(data)
        others = httpx.post(f"{url}{TOKENIZE}", json={"prompt": "meanwhile"}, timeout=30).status_code
        closed = conn.closed_by_server(wait_s)
        return {
            "probe": name,
            "others_served": others == 200,
            "server_closed_after_s": None if closed is None else round(closed, 2),
            "verdict": "ok" if others == 200 else "others not served",
        }
    finally:
        conn.close()


# --- the API key -----------------------------------------------------------------------------------------------

GUARDED_ROUTES = [
    ("GET", "/"),
    ("HEAD", "/"),
    ("GET", "/dashboard/state"),
    ("GET", "/dashboard/dashboard.js"),
    ("GET", "/dashboard/dashboard.css"),
    ("GET", "/v1/models"),
    ("HEAD", "/v1/models"),
    ("POST", COMPLETIONS),
    ("POST", CHAT),
    ("POST", TOKENIZE),
    ("POST", DETOKENIZE),
]
OPEN_ROUTES = [("GET", "/health"), ("HEAD", "/health"), ("GET", "/metrics"), ("HEAD", "/metrics")]
ROUTE_BODIES = {
    COMPLETIONS: {"prompt": "hi", "max_tokens": 1},
    CHAT: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    TOKENIZE: {"prompt": "hi"},
    DETOKENIZE: {"tokens": [72, 105]},
}


def api_key_probe(url: str, key: str) -> list[dict]:
    """Every route with no key, wrong keys and the key: guarded routes must refuse (401) all but the key, open ones
    (/health, /metrics) must answer without it."""
    wrong = {
        "none": {},
        "wrong key": {"Authorization": "Bearer wrong"},
        "no Bearer": {"Authorization": key},
        "Basic": {"Authorization": f"Basic {key}"},
        "key with a suffix": {"Authorization": f"Bearer {key}x"},
        "X-Api-Key only": {"X-Api-Key": key},
    }
    rows = []
    with httpx.Client(base_url=url, timeout=60) as c:
        for method, path in GUARDED_ROUTES + OPEN_ROUTES:
            body = ROUTE_BODIES.get(path) if method == "POST" else None
            guarded = (method, path) in GUARDED_ROUTES
            statuses = {name: c.request(method, path, json=body, headers=h).status_code for name, h in wrong.items()}
            right = c.request(method, path, json=body, headers={"Authorization": f"Bearer {key}"}).status_code
            if guarded:
                ok = all(s == 401 for s in statuses.values()) and right < 400
            else:
                ok = statuses["none"] < 400
            rows.append({"route": f"{method} {path}", "guarded": guarded, "without": statuses, "with": right, "ok": ok})
    return rows
