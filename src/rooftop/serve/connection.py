"""TimedH11Protocol: uvicorn's h11 protocol with the limits on a connection that uvicorn lacks. uvicorn closes a
keep-alive connection left idle after a response, but not one that never sends a byte, and it gives a client all
the time it likes to send a request: a stalled or slow client holds its connection and its half-read request for
ever. Here a new connection also has `timeout_keep_alive` to begin, and a request `timeout_read_s` from its first
byte to its last; then the connection is closed, with a 408 if no response has begun. A response being generated
is not timed: only the client's sending is."""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from rooftop.serve.errors import error_body


class TimedH11Protocol(H11Protocol):
    def __init__(self, *args, timeout_read_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.timeout_read_s = timeout_read_s
        self.read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_reading()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def _watch_reading(self) -> None:
        """The deadline runs while a request is being received: headers begun, or a body not yet complete."""
        state = self.conn.their_state
        reading = state is h11.SEND_BODY or (state is h11.IDLE and bool(self.conn.trailing_data[0]))
        if not reading:
            self._stop_deadline()
        elif self.read_deadline is None:
            self.read_deadline = self.loop.call_later(self.timeout_read_s, self._read_timed_out)

    def _stop_deadline(self) -> None:
        if self.read_deadline is not None:
            self.read_deadline.cancel()
            self.read_deadline = None

    def _read_timed_out(self) -> None:
        self.read_deadline = None
        if self.transport.is_closing():
            return
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # nothing of a response sent yet
            message = f"the request was not received in full within {self.timeout_read_s:g} s"
            body = json.dumps(error_body(408, message)).encode()
            head = f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            self.transport.write(head.encode() + b"connection: close\r\n\r\n" + body)
        self.transport.close()
