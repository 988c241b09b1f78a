"""`rooftop serve`: the OpenAI-compatible server with Prometheus metrics and a live dashboard."""

from __future__ import annotations

import ipaddress
import socket
from typing import Annotated

import typer

from rooftop.cli_options import with_run_config
from rooftop.config import RunConfig
from rooftop.console import err, user_errors
from rooftop.errors import RooftopError

HostOpt = Annotated[str | None, typer.Option(help="address to bind (default: 127.0.0.1; 0.0.0.0 with --api-key)")]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        envvar="ROOFTOP_API_KEY",
        help="require 'Authorization: Bearer KEY' everywhere but /health, /metrics and /version (the dashboard: KEY as password)",
    ),
]
NameOpt = Annotated[
    str | None,
    typer.Option(help="the model name clients send (default: the model file's name without .gguf, or its directory's)"),
]
WaitingOpt = Annotated[int, typer.Option(help="requests that may wait for a slot; more get 429")]
ShutdownOpt = Annotated[
    float, typer.Option(help="seconds in-flight requests get to finish on SIGINT/SIGTERM (a second signal: at once)")
]
BodyOpt = Annotated[int, typer.Option(help="largest request body in bytes; a larger one gets 413 before it is read")]
KeepAliveOpt = Annotated[
    float, typer.Option(help="seconds an idle connection stays open, before its first request or between two")
]
ReadOpt = Annotated[
    float, typer.Option(help="seconds a client has to send a whole request (headers and body) once it begins; then 408")
]
OriginsOpt = Annotated[
    list[str] | None,
    typer.Option(
        help="browser origins (scheme://host:port) whose pages may call this server, with CORS headers; repeat or "
        "comma-separate, '*' for any (default: none; requests without an Origin, curl's and the SDKs', are unaffected)"
    ),
]
HostsOpt = Annotated[
    list[str] | None,
    typer.Option(
        help="names the Host header may carry besides the bound address (and localhost; with --host 0.0.0.0 this "
        "machine's name and addresses); repeat or comma-separate, '*' for any; against DNS rebinding"
    ),
]


@with_run_config
def serve(
    host: HostOpt = None,
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    api_key: ApiKeyOpt = None,
    served_model_name: NameOpt = None,
    max_waiting_requests: WaitingOpt = 256,
    shutdown_timeout: ShutdownOpt = 5.0,
    max_body_bytes: BodyOpt = 2 << 20,
    timeout_keep_alive: KeepAliveOpt = 5.0,
    timeout_read: ReadOpt = 30.0,
    allowed_origins: OriginsOpt = None,
    allowed_hosts: HostsOpt = None,
    *,
    run: RunConfig,
) -> None:
    """Serve the model over HTTP: OpenAI's /v1/chat/completions and /v1/completions, /metrics, and a dashboard at /."""
    from rooftop.loading.model_files import check_source
    from rooftop.serve.config import ServeConfig
    from rooftop.serve.server import run as run_server

    with user_errors():
        check_source(run)  # a missing model refused now: not after the server has said it is up
        config = ServeConfig(
            run=run,
            host=host,
            port=port,
            api_key=api_key,
            served_model_name=served_model_name,
            max_waiting_requests=max_waiting_requests,
            shutdown_timeout_s=shutdown_timeout,
            max_body_bytes=max_body_bytes,
            timeout_keep_alive_s=timeout_keep_alive,
            timeout_read_s=timeout_read,
            allowed_origins=allowed_origins or [],
            allowed_hosts=allowed_hosts or [],
        )
        check_port(config.host, config.port)  # a port in use, before the model's load (uvicorn binds after it)
        if not api_key and not _is_loopback(config.host):
            err.print(
                f"[yellow]warning:[/] no --api-key: anyone who can reach {config.host}:{port} can use this server"
            )
        load_error = run_server(config)
        if load_error is not None:
            raise RooftopError(load_error)


def check_port(host: str, port: int) -> None:
    """Refuse a port another process holds on `host`, by binding it for a moment as uvicorn will (SO_REUSEADDR: a
    port with only closed connections left on it is free)."""
    if port == 0:
        return
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        raise RooftopError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
