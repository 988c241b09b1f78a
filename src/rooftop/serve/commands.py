"""`rooftop serve`: the OpenAI-compatible server with Prometheus metrics and a live dashboard."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer

from rooftop.config import EngineConfig
from rooftop.console import err, user_errors
from rooftop.errors import RooftopError

ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="GGUF file or HF directory (default: bundled SmolLM2)")
]
HostOpt = Annotated[str | None, typer.Option(help="address to bind (default: 127.0.0.1; 0.0.0.0 with --api-key)")]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(envvar="ROOFTOP_API_KEY", help="require 'Authorization: Bearer KEY' on /v1 and /tokenize"),
]
NameOpt = Annotated[
    str | None,
    typer.Option(help="the model name clients send (default: --model as given, or the bundled file's name)"),
]
WaitingOpt = Annotated[int, typer.Option(help="requests that may wait for a slot; more get 429")]
ShutdownOpt = Annotated[float, typer.Option(help="seconds in-flight requests get to finish on SIGINT/SIGTERM")]


def _engine(text: str):
    return typer.Option(help=f"engine: {text}")


def serve(
    model: ModelOpt = None,
    host: HostOpt = None,
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    api_key: ApiKeyOpt = None,
    served_model_name: NameOpt = None,
    max_waiting_requests: WaitingOpt = 256,
    shutdown_timeout: ShutdownOpt = 30.0,
    dtype: Annotated[str, typer.Option(help="auto, float32 or bfloat16 (auto: float32 on CPU)")] = "auto",
    device: Annotated[str, typer.Option(help="torch device: cpu, cuda, cuda:1 ...")] = "cpu",
    weights: Annotated[
        str, typer.Option(help="auto (closest to the file), float, int8 or int4 (weight-only)")
    ] = "auto",
    max_num_seqs: Annotated[int, _engine("most sequences in one step")] = 64,
    max_num_batched_tokens: Annotated[int, _engine("most tokens in one step (longer prompts are chunked)")] = 1024,
    kv_cache_bytes: Annotated[int | None, _engine("KV cache pool size in bytes (default 1 GiB)")] = None,
    num_kv_blocks: Annotated[int | None, _engine("KV cache pool size in blocks (overrides --kv-cache-bytes)")] = None,
    block_size: Annotated[int, _engine("tokens per KV block")] = 16,
    enable_prefix_caching: Annotated[bool, _engine("reuse the KV blocks of prompt prefixes seen before")] = True,
    max_model_len: Annotated[int | None, _engine("context length (default: the model's)")] = None,
) -> None:
    """Serve the model over HTTP: OpenAI's /v1/chat/completions and /v1/completions, /metrics, and a dashboard at /."""
    from rooftop.serve.config import ServeConfig
    from rooftop.serve.server import run

    with user_errors():
        engine_options = dict(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_bytes=kv_cache_bytes,
            num_kv_blocks=num_kv_blocks,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            max_model_len=max_model_len,
        )
        EngineConfig(**engine_options)  # bad engine options fail here, before anything loads
        config = ServeConfig(
            model=model,
            host=host,
            port=port,
            api_key=api_key,
            served_model_name=served_model_name,
            max_waiting_requests=max_waiting_requests,
            shutdown_timeout_s=shutdown_timeout,
            dtype=dtype,
            device=device,
            weights=weights,
            engine_options=engine_options,
        )
        if not api_key and not _is_loopback(config.host):
            err.print(
                f"[yellow]warning:[/] no --api-key: anyone who can reach {config.host}:{port} can use this server"
            )
        load_error = run(config)
        if load_error is not None:
            raise RooftopError(load_error)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
