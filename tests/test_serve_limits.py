"""rooftop serve bounds what one request can cost before it is admitted: a prompt too long in bytes for the
context is refused untokenized, tokenizing leaves the GIL to the other threads, a body is refused by its declared
size before it is sent."""

from __future__ import annotations

import http.client
import sys
import threading
import time

import httpx
import pytest
from serve_support import api_error, spied_server

TEXT, CHAT = "/v1/completions", "/v1/chat/completions"
CONTEXT, LONGEST_TOKEN = 256, len("<|endoftext|>")  # the tiny vocabulary: bytes, and three special tokens
BYTE_LIMIT = CONTEXT * LONGEST_TOKEN


@pytest.fixture(scope="module")
def spied(long_gguf):
    """A server whose tokenizer records the length of each text it encodes."""
    with spied_server(long_gguf) as (url, seen):
        yield url, seen


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
