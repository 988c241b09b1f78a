"""A scripted OpenAI-compatible streaming server for the load generator's tests: chunks at known delays, and
failures on demand (a marker in the prompt), on a loopback port in a thread of its own."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

MODEL = "scripted-model"


@dataclass
class Script:
    """First token `first_delay` s after the request, then one chunk every `gap` s, each with `per_chunk`
    tokens (the word " the", one token for SmolLM2's tokenizer); max_tokens tokens in all."""

    first_delay: float = 0.05
    gap: float = 0.02
    per_chunk: int = 1
    usage: bool = True  # answer stream_options.include_usage


@dataclass
class ScriptedServer:
    script: Script = field(default_factory=Script)
    bodies: list[dict] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)

    def __enter__(self) -> ScriptedServer:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._connection, "127.0.0.1", 0), self.loop
        ).result()
        self.port = self.server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        return self

    def __exit__(self, *exc) -> None:
        async def shutdown():
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, _ = head.split(b"\r\n")[0].decode().split(" ")
                headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line)
                length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), 0))
                body = json.loads(await reader.readexactly(length)) if length else {}
                auth = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
                if not await self._respond(method, path, body, auth, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _respond(
        self, method: str, path: str, body: dict, auth: str | None, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False when the connection must close."""
        if method == "GET" and path == "/v1/models":
            return await _send_json(writer, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return await _send_json(writer, 404, {"error": {"message": f"no route {path}"}})
        self.bodies.append(body)
        self.authorizations.append(auth)
        if body.get("model") != MODEL:
            return await _send_json(
                writer, 404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}}
            )
        chat = path.endswith("chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        if "FAIL500" in prompt:
            return await _send_json(writer, 500, {"error": {"message": "scripted failure"}})
        if "HANG" in prompt:
            await asyncio.sleep(30)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        if chat:
            await _event(writer, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        if "EMPTY" in prompt:
            await _event(writer, {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            return await _done(writer)
        s, total = self.script, body["max_tokens"]
        sent = 0
        await asyncio.sleep(s.first_delay)
        while sent < total:
            if sent:
                await asyncio.sleep(s.gap)
            n = min(s.per_chunk, total - sent)
            sent += n
            if "BREAK" in prompt and sent > 2:
                return False  # the connection closes mid-stream
            if "ERRCHUNK" in prompt and sent > 1:
                await _event(writer, {"error": {"message": "scripted mid-stream error", "code": 500}})
                return await _done(writer)
            text = " the" * n
            await _event(
                writer, {"choices": [{"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}]}
            )
        last = {"delta": {}} if chat else {"text": ""}
        await _event(writer, {"choices": [{"index": 0, **last, "finish_reason": "length"}]})
        if s.usage and (body.get("stream_options") or {}).get("include_usage"):
            await _event(
                writer,
                {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": total, "total_tokens": 7 + total}},
            )
        return await _done(writer)


async def _event(writer: asyncio.StreamWriter, data: dict | str) -> None:
    payload = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()
    writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))
    await writer.drain()


async def _done(writer: asyncio.StreamWriter) -> bool:
    await _event(writer, "[DONE]")
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    return True


async def _send_json(writer: asyncio.StreamWriter, status: int, data: dict) -> bool:
    body = json.dumps(data).encode()
    writer.write(
        b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)
    )
    await writer.drain()
    return True
