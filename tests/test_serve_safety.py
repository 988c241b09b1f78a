"""rooftop serve as a local server that web pages cannot drive: only JSON bodies are read (415), the Host header
must name this server (against DNS rebinding), a browser's Origin must be this server's own or an allowed one
(CORS headers for those), the API key guards everything but /health and /metrics (the dashboard by HTTP Basic), and
no response names a path on the server."""

from __future__ import annotations

import base64
import socket
import time

import httpx
import pytest
from serve_support import api_error, running_server, spied_server

TEXT, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.fixture(scope="module")
def spied(long_gguf):
    """The model given by its absolute path, as `rooftop serve --model /abs/path` would; its tokenizer records the
    length of each text it encodes."""
    from rooftop.config import RunConfig

    with spied_server(long_gguf, run=RunConfig(model=str(long_gguf.resolve()))) as (url, seen):
        yield url, seen


@pytest.fixture(scope="module")
def keyed(long_gguf):
    """A server with an API key that lets the pages of one origin call it."""
    with running_server(
        long_gguf, {"max_model_len": 128}, api_key="sekret", host="127.0.0.1", allowed_origins=["http://App.example/"]
    ) as url:
        yield url


@pytest.mark.parametrize(
    "content_type, status",
    [
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),  # what `curl -d` declares without -H
        ("multipart/form-data; boundary=x", 415),
        ("application/json; charset=utf-8", 200),
        (None, 200),  # raw bytes, undeclared
    ],
)
def test_only_json_bodies_are_parsed(spied, content_type, status):
    url, _ = spied
    headers = {} if content_type is None else {"Content-Type": content_type}
    content = b'{"prompt": "hi", "max_tokens": 2}'
    response = httpx.post(f"{url}{TEXT}", content=content, headers=headers, timeout=30)
    if status == 415:
        assert "send Content-Type: application/json" in api_error(response, 415)["message"]
    else:
        assert response.status_code == 200, response.text


def test_the_host_header_must_name_this_server(spied):
    url, _ = spied
    port = url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert httpx.get(f"{url}/health", headers={"Host": host}).status_code == 200, host
    refused = api_error(httpx.get(f"{url}/v1/models", headers={"Host": f"rebound.example:{port}"}), 400)
    assert "does not name this server" in refused["message"]
    assert "--allowed-hosts rebound.example " in refused["message"] and "DNS rebinding" in refused["message"]


def test_hosts_for_each_kind_of_bound_address():
    from rooftop.serve.guard import Hosts

    loopback = Hosts.of("127.0.0.1", ["Api.Example"])
    assert all(loopback.allow(h, "127.0.0.1") for h in ("localhost:8000", "[::1]", "api.example.:443"))
    assert not loopback.allow("rebound.example", "127.0.0.1") and not loopback.allow("10.1.2.3", "127.0.0.1")
    everywhere = Hosts.of("0.0.0.0", [])
    assert everywhere.allow(socket.gethostname(), "10.1.2.3") and everywhere.allow("localhost:8000", "10.1.2.3")
    assert everywhere.allow("10.1.2.3:8000", "10.1.2.3")  # the address this connection arrived at
    assert Hosts.of("::", []).allow("10.1.2.3", "::ffff:10.1.2.3")
    assert not everywhere.allow("10.9.9.9", "10.1.2.3") and not everywhere.allow("rebound.example", "10.1.2.3")
    specific = Hosts.of("10.1.2.3", [])
    assert specific.allow("10.1.2.3:8000", "10.1.2.3") and not specific.allow("localhost", "10.1.2.3")
    assert Hosts.of("127.0.0.1", ["*"]).allow("anything.example", None)


def test_a_web_page_from_another_origin_is_refused(spied):
    url, seen = spied
    seen.clear()
    page = {"Origin": "http://evil.example"}
    refused = api_error(httpx.post(f"{url}{TEXT}", json={"prompt": "hi", "max_tokens": 2}, headers=page), 403)
    assert refused["type"] == "permission_error" and "--allowed-origins http://evil.example" in refused["message"]
    assert seen == []  # it reached nothing
    api_error(httpx.get(f"{url}/dashboard/state", headers=page), 403)
    own = {"Origin": url}  # the dashboard's own pages
    assert httpx.post(f"{url}{TEXT}", json={"prompt": "hi", "max_tokens": 2}, headers=own).status_code == 200


def test_an_allowed_origin_gets_cors_headers(keyed):
    page = {"Origin": "http://app.example", "Authorization": "Bearer sekret"}
    models = httpx.get(f"{keyed}/v1/models", headers=page)
    assert models.status_code == 200 and models.headers["access-control-allow-origin"] == "http://app.example"
    preflight = httpx.options(
        f"{keyed}{CHAT}",
        headers={
            "Origin": "http://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )  # a browser sends no key with it
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "http://app.example"
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    api_error(httpx.get(f"{keyed}/v1/models", headers={**page, "Origin": "http://evil.example"}), 403)


def test_the_api_key_guards_everything_but_health_and_metrics(keyed):
    for path in ("/health", "/metrics"):
        assert httpx.get(f"{keyed}{path}").status_code == 200
    gets = ["/", "/dashboard/state", "/dashboard/dashboard.js", "/v1/models"]
    posts = {"/tokenize": {"prompt": "hi"}, "/detokenize": {"tokens": [75]}, TEXT: {"prompt": "hi", "max_tokens": 2}}
    bearer = {"Authorization": "Bearer sekret"}
    for path in gets:
        refused = httpx.get(f"{keyed}{path}")
        api_error(refused, 401)
        challenge = refused.headers["www-authenticate"]
        assert challenge.startswith("Basic" if path != "/v1/models" else "Bearer"), path
        assert httpx.get(f"{keyed}{path}", headers=bearer).status_code == 200, path
    for path, body in posts.items():
        api_error(httpx.post(f"{keyed}{path}", json=body), 401)
        assert httpx.post(f"{keyed}{path}", json=body, headers=bearer).status_code == 200, path
    for path in ("/", "/dashboard/state"):  # a browser, asked by the Basic challenge: any user, the key as password
        assert httpx.get(f"{keyed}{path}", auth=("me", "sekret")).status_code == 200
        api_error(httpx.get(f"{keyed}{path}", auth=("me", "wrong")), 401)
    api_error(httpx.get(f"{keyed}/", headers={"Authorization": "Basic " + base64.b64encode(b"\xff").decode()}), 401)


def test_no_response_names_a_server_path(spied, long_gguf):
    url, _ = spied
    models = httpx.get(f"{url}/v1/models").json()["data"][0]
    assert models["id"] == "tiny-long" and models["root"] == "tiny-long.gguf"
    responses = [
        httpx.get(f"{url}/v1/models"),
        httpx.get(f"{url}/dashboard/state"),
        httpx.post(f"{url}{TEXT}", json={"prompt": "hi", "max_tokens": 2, "model": "nope"}),
        httpx.post(f"{url}{TEXT}", json={"prompt": "hi", "max_tokens": 2}),
    ]
    for response in responses:
        assert str(long_gguf.resolve().parent) not in response.text, response.text


def test_the_model_may_be_named_as_given_to_model(spied, long_gguf):
    url, _ = spied
    body = {"prompt": "hi", "max_tokens": 2, "model": str(long_gguf.resolve())}
    response = httpx.post(f"{url}{TEXT}", json=body, timeout=30)
    assert response.status_code == 200 and response.json()["model"] == "tiny-long"


def test_a_failed_load_names_no_path(tmp_path):
    from starlette.testclient import TestClient

    from rooftop.config import RunConfig
    from rooftop.serve.app import create_app
    from rooftop.serve.config import ServeConfig

    missing = tmp_path / "missing.gguf"
    app = create_app(ServeConfig(run=RunConfig(model=str(missing)), allowed_hosts=["testserver"]))
    with TestClient(app) as client:
        deadline = time.monotonic() + 30
        while app.state.server.load_error is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert str(tmp_path) in app.state.server.load_error  # the log and the CLI's exit line have it
        state = client.get("/dashboard/state").json()
        refused = client.post(TEXT, json={"prompt": "hi"})
        assert refused.status_code == 503 and "the model failed to load" in refused.json()["error"]["message"]
        for text in (str(state), refused.text):
            assert str(tmp_path) not in text and "missing.gguf" not in text
