"""OpenAI response bodies and stream chunks, plus rooftop's `timings` (as llama.cpp's server adds them)."""

from __future__ import annotations

import json
import time

from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.outputs import RequestOutput
from rooftop.engine.sampler import TokenLogprob
from rooftop.loading.tokenizer import Tokenizer

MIN_LOGPROB = -9999.0  # JSON has no -inf


def sse(data: dict | str) -> str:
    """One server-sent event, exactly as OpenAI frames them."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def usage(output: RequestOutput) -> dict:
    prompt, completion = len(output.prompt_token_ids), len(output.token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": output.metrics.prefix_cache_hit_tokens},
    }


def timings(m: RequestMetrics) -> dict:
    """This request's timings (the README's Metrics definitions) in ms, with llama.cpp's key names alongside."""

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1e3, 3)

    generation = None if m.e2e is None else m.e2e - m.ttft
    return {
        "queue_ms": ms(m.queue_time),
        "ttft_ms": ms(m.ttft),
        "tpot_ms": ms(m.tpot),
        "e2e_ms": ms(m.e2e),
        "prefill_ms": ms(m.prefill_time),
        "decode_ms": ms(m.decode_time),
        "prompt_tokens": m.prompt_tokens,
        "output_tokens": m.output_tokens,
        "cached_tokens": m.prefix_cache_hit_tokens,
        "prompt_n": m.prefill_tokens,
        "prompt_ms": ms(m.prefill_time),
        "predicted_n": m.output_tokens,
        "predicted_ms": ms(generation),
        "cache_n": m.prefix_cache_hit_tokens,
    }


class Responses:
    """Builds the bodies of one request: its id, creation time and served model name stay the same in every chunk."""

    def __init__(self, kind: str, request_id: str, model: str, tokenizer: Tokenizer, include_usage: bool = False):
        self.kind, self.id, self.model, self.tokenizer = kind, request_id, model, tokenizer  # kind: "chat" or "text"
        self.include_usage = include_usage  # streams then carry "usage": null until the usage chunk, as OpenAI's
        self.created = int(time.time())
        self.text_offset = 0

    def full(self, output: RequestOutput, logprobs: list[TokenLogprob] | None) -> dict:
        """The non-streamed response."""
        choice = {"index": 0, "logprobs": self.logprobs(logprobs), "finish_reason": output.finish_reason}
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": output.text}
        else:
            choice["text"] = output.text
        return {
            **self._head(chunk=False),
            "choices": [choice],
            "usage": usage(output),
            "timings": timings(output.metrics),
        }

    def chunk(
        self,
        text: str | None,
        logprobs: list[TokenLogprob] | None,
        finish_reason: str | None = None,
        role: bool = False,
    ) -> dict:
        """A stream chunk with one choice; `role` marks the chat stream's first chunk."""
        choice: dict = {"index": 0}
        if self.kind == "chat":
            choice["delta"] = ({"role": "assistant"} if role else {}) | ({} if text is None else {"content": text})
        else:
            choice["text"] = text or ""
        choice["logprobs"] = self.logprobs(logprobs)
        choice["finish_reason"] = finish_reason
        return {**self._head(chunk=True), "choices": [choice]} | ({"usage": None} if self.include_usage else {})

    def usage_chunk(self, output: RequestOutput) -> dict:
        """stream_options.include_usage: the last chunk, with no choices."""
        return {**self._head(chunk=True), "choices": [], "usage": usage(output)}

    def _head(self, chunk: bool) -> dict:
        """OpenAI streams completions as text_completion objects too; chat chunks are chat.completion.chunk."""
        obj = "text_completion" if self.kind == "text" else "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def logprobs(self, entries: list[TokenLogprob] | None) -> dict | None:
        if entries is None:
            return None
        if self.kind == "chat":
            return {"content": [self._chat_entry(e) for e in entries]}
        tokens = [self._token(e.token_id) for e in entries]
        offsets = []
        for t in tokens:
            offsets.append(self.text_offset)
            self.text_offset += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [_finite(e.logprob) for e in entries],
            "top_logprobs": [{self._token(i): _finite(lp) for i, lp in e.top} for e in entries],
            "text_offset": offsets,
        }

    def _chat_entry(self, e: TokenLogprob) -> dict:
        def one(token_id: int, logprob: float) -> dict:
            token = self._token(token_id)
            return {"token": token, "logprob": _finite(logprob), "bytes": list(token.encode())}

        return {**one(e.token_id, e.logprob), "top_logprobs": [one(i, lp) for i, lp in e.top]}

    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def _finite(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)
