"""ServeConfig: what `rooftop serve` runs (a RunConfig), where it listens, and the limits it enforces."""

from __future__ import annotations

from dataclasses import dataclass, field

from rooftop.config import RunConfig
from rooftop.errors import InvalidRequestError

LOOPBACK = "127.0.0.1"


@dataclass
class ServeConfig:
    """`host` None binds to 127.0.0.1 without an API key and to every interface with one."""

    run: RunConfig = field(default_factory=RunConfig)  # the model, dtype, device, weights and engine options
    host: str | None = None
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None  # default: the model file's name (without .gguf) or directory's name
    max_waiting_requests: int = 256  # requests waiting for a free slot; beyond it, new ones get 429
    max_body_bytes: int = 2 << 20  # a larger body gets 413 before it is read in full
    shutdown_timeout_s: float = 5.0  # on SIGINT/SIGTERM, in-flight requests get this long to finish
    timeout_keep_alive_s: float = 5.0  # an idle connection (before its first request or between two) is closed
    timeout_read_s: float = 30.0  # a request must arrive in full this long after its first byte, else 408
    allowed_origins: list[str] = field(default_factory=list)  # browser origins that may call; "*" any
    allowed_hosts: list[str] = field(default_factory=list)  # Host names besides the bound address; "*" any

    def __post_init__(self) -> None:
        if self.host is None:
            self.host = "0.0.0.0" if self.api_key else LOOPBACK
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise InvalidRequestError(f"port must be in [0, 65535], got {self.port!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise InvalidRequestError("the API key is empty")
        if not isinstance(self.max_waiting_requests, int) or self.max_waiting_requests < 1:
            raise InvalidRequestError(
                f"max_waiting_requests must be an integer >= 1, got {self.max_waiting_requests!r}"
            )
        if self.max_body_bytes < 1 or self.shutdown_timeout_s < 0:
            raise InvalidRequestError("max_body_bytes must be >= 1 and shutdown_timeout_s >= 0")
        if not self.timeout_keep_alive_s > 0 or not self.timeout_read_s > 0:
            raise InvalidRequestError("timeout_keep_alive_s and timeout_read_s must be > 0")
        # As browsers send an Origin: 'HTTP://App.example:3000/' is 'http://app.example:3000'.
        self.allowed_origins = [o.strip().rstrip("/").lower() for o in _items(self.allowed_origins)]
        self.allowed_hosts = [h.strip().lower() for h in _items(self.allowed_hosts)]


def _items(values: list[str]) -> list[str]:
    """Repeated and comma-separated alike: ['a,b', 'c'] -> ['a', 'b', 'c']."""
    return [v for value in values for v in value.split(",") if v.strip()]
