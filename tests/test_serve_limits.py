"""rooftop serve bounds what one request can cost before it is admitted: a prompt too long in bytes for the
context is refused untokenized, tokenizing leaves the GIL to the other threads, a body is refused by its declared
size before it is sent; and a connection cannot be held by a client that stalls: idle and half-sent requests are
closed after their timeouts (raw sockets; lower bounds the timeouts themselves, upper bounds generous)."""

from __future__ import annotations

import http.client
import socket
import sys
import threading
import time

import httpx
import pytest
from serve_support import api_error, held_server, spied_server, sse_events

TEXT, CHAT = "/v1/completions", "/v1/chat/completions"
CONTEXT, LONGEST_TOKEN = 256, len("<|endoftext|>")  # the tiny vocabulary: bytes, and three special tokens
BYTE_LIMIT = CONTEXT * LONGEST_TOKEN
KEEP_ALIVE_S, READ_S = 0.5, 1.0


@pytest.fixture(scope="module")
def spied(long_gguf):
    """A server whose tokenizer records the length of each text it encodes, with short connection timeouts."""
    with spied_server(long_gguf, timeout_keep_alive_s=KEEP_ALIVE_S, timeout_read_s=READ_S) as (url, seen):
        yield url, seen


# Bounded work before admission


@pytest.mark.parametrize(
    "path, body, param",
    [
        (TEXT, {"prompt": "x" * (BYTE_LIMIT + 1)}, "prompt"),
        (CHAT, {"messages": [{"role": "user", "content": "x" * BYTE_LIMIT}]}, "messages"),  # the template adds bytes
        ("/tokenize", {"prompt": "é" * (BYTE_LIMIT // 2 + 1)}, "prompt"),  # bytes, not characters
    ],
    ids=["completion", "chat, as its template renders it", "tokenize"],
)
def test_a_prompt_too_long_in_bytes_is_refused_before_tokenizing(spied, path, body, param):
    url, seen = spied
    seen.clear()
    refused = api_error(httpx.post(f"{url}{path}", json=body, timeout=30), 400)
    assert refused["param"] == param
    assert f"the context holds {CONTEXT} tokens, at most {BYTE_LIMIT} bytes" in refused["message"]
    assert seen == []  # never tokenized


def test_a_prompt_within_the_byte_bound_is_tokenized_and_counted(spied):
    url, seen = spied
    seen.clear()
    refused = api_error(httpx.post(f"{url}{TEXT}", json={"prompt": "x" * BYTE_LIMIT}, timeout=30), 400)
    assert refused["param"] == "prompt" and f"the prompt has {BYTE_LIMIT} tokens" in refused["message"]
    assert seen == [BYTE_LIMIT]


def test_tokenizing_leaves_the_gil_to_other_threads(tiny_llm):
    """The loop below counts while the worker thread tokenizes. With a switch interval longer than the tokenizing,
    a worker that kept the GIL would keep it until it has read the counter again (progress 0): the loop counts in
    between only if the tokenizer lets the GIL go. Its short sleeps hand the GIL back to the worker when it is done."""
    text = " ".join(f"word{i}" for i in range(50_000))
    counter, progress, started = [0], [], threading.Event()

    def work():
        started.set()
        before = counter[0]
        tiny_llm.tokenizer.encode(text)
        progress.append(counter[0] - before)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        worker = threading.Thread(target=work)
        worker.start()
        started.wait()
        while worker.is_alive():
            counter[0] += 1
            if counter[0] % 1000 == 0:
                time.sleep(1e-4)
    finally:
        sys.setswitchinterval(interval)
    assert progress[0] > 0


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(spied):
    url, _ = spied
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=15)
    connection.putrequest("POST", TEXT)
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(10**9))
    connection.endheaders()  # and not a byte of the body
    response = connection.getresponse()
    assert response.status == 413 and b"the limit is 65536" in response.read()
    connection.close()


# Connections


def raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=15)


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took (at most 15 s)."""
    start, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - start


@pytest.mark.parametrize(
    "sent, timeout_s, answer",
    [
        (b"", KEEP_ALIVE_S, b""),  # a connection that never sends a byte
        (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n", READ_S, b"HTTP/1.1 408 "),  # half its headers
        (
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n" + b'{"prompt": ',
            READ_S,
            b"HTTP/1.1 408 ",
        ),  # a tenth of its body
    ],
    ids=["idle", "half the headers", "part of the body"],
)
def test_a_stalled_client_is_closed_after_its_timeout(spied, sent, timeout_s, answer):
    url, _ = spied
    with raw(url) as sock:
        sock.sendall(sent)
        data, waited = read_until_closed(sock)
    assert data.startswith(answer)
    if answer:
        assert b"not received in full within 1 s" in data
    assert timeout_s * 0.9 <= waited < 15


def test_a_keep_alive_connection_is_closed_when_idle(spied):
    url, _ = spied
    with raw(url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data, waited = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b'{"status":"ok"}')
    assert KEEP_ALIVE_S * 0.9 <= waited < 15


def test_a_long_generation_is_not_a_slow_request(long_gguf):
    """The engine holds the stream after its first token for longer than the read timeout: only the client's
    sending is timed, not the response."""
    body = {"prompt": "go", "max_tokens": 8, "stream": True, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    with held_server(long_gguf, timeout_read_s=0.3, timeout_keep_alive_s=0.3) as (url, _, hold):
        with httpx.stream("POST", f"{url}{TEXT}", json=body, timeout=30) as response:
            events = sse_events(response.iter_lines())
            next(events)
            time.sleep(1.0)  # over three read timeouts, the stream held in flight
            hold.release()
            assert list(events)[-1] == "[DONE]"
