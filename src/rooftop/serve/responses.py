"""OpenAI response bodies and stream chunks, plus rooftop's `timings` (as llama.cpp's server adds them)."""

from __future__ import annotations

import json
import time

from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.outputs import RequestDelta, RequestOutput
from rooftop.engine.sampler import TokenLogprob
from rooftop.engine.tool_calls import CallStart, Content, Event, ToolCallReader, parse_tool_calls
from rooftop.engine.tools import ToolChoice
from rooftop.loading.tokenizer import Tokenizer

MIN_LOGPROB = -9999.0  # JSON has no -inf


def sse(data: dict | str) -> str:
    """One server-sent event, exactly as OpenAI frames them."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def usage(outputs: list[RequestOutput], choices: int, completed: bool = True) -> dict:
    """Each prompt once and every choice's tokens (OpenAI's count; none where only the prompts were given back,
    `completed` False), `outputs` holding each prompt's `choices` in turn; a prompt's cached tokens are its first
    choice's (the others reuse what it computed)."""
    firsts = outputs[::choices]
    prompt = sum(len(o.prompt_token_ids) for o in firsts)
    completion = sum(len(o.token_ids) for o in outputs) if completed else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(o.metrics.prefix_cache_hit_tokens for o in firsts)},
    }


def timings(m: RequestMetrics, completed: bool = True) -> dict:
    """This request's timings (the README's Metrics definitions) in ms, with llama.cpp's key names alongside; no
    output tokens where only the prompt was given back (`completed` False, as `usage` counts them)."""

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1e3, 3)

    generation = None if m.e2e is None else m.e2e - m.ttft
    output_tokens = m.output_tokens if completed else 0
    return {
        "queue_ms": ms(m.queue_time),
        "ttft_ms": ms(m.ttft),
        "tpot_ms": ms(m.tpot),
        "e2e_ms": ms(m.e2e),
        "prefill_ms": ms(m.prefill_time),
        "decode_ms": ms(m.decode_time),
        "prompt_tokens": m.prompt_tokens,
        "output_tokens": output_tokens,
        "cached_tokens": m.prefix_cache_hit_tokens,
        "prompt_n": m.prefill_tokens,
        "prompt_ms": ms(m.prefill_time),
        "predicted_n": output_tokens,
        "predicted_ms": ms(generation),
        "cache_n": m.prefix_cache_hit_tokens,
    }


class Responses:
    """Builds the bodies of one request: its id, creation time and served model name stay the same in every chunk.
    `choices` completions (n) of each of `prompts` prompts (a completion's batch), choice j of prompt i at index
    i * n + j, as OpenAI numbers them; a chat whose tools may be called (`tool_choice` not none) has each choice's
    tool calls read from its text (engine/tool_calls.py), streamed as OpenAI streams them. A completion's `echo`
    (each prompt's text) starts the text of each of that prompt's choices, streamed in its first chunk, and with
    logprobs its prompt's logprobs (`prompt_ids`: each prompt's tokens, the first of which has none) start the
    choice's. A chat's (one text: the assistant's message the reply continues) starts each choice's content,
    streamed in a chunk of its own after the role's, as vLLM's; it has no logprobs. `echo_only` (a completion's echo
    with max_tokens 0): each choice is its echo and its prompt's logprobs alone, finished for its length; the token
    generated to get there is not returned nor counted."""

    def __init__(
        self,
        kind: str,
        request_id: str,
        model: str,
        tokenizer: Tokenizer,
        include_usage: bool = False,
        choices: int = 1,
        prompts: int = 1,
        tool_choice: ToolChoice | None = None,
        echo: list[str] | None = None,
        prompt_ids: list[list[int]] | None = None,
        echo_only: bool = False,
    ):
        self.kind, self.id, self.model, self.tokenizer = kind, request_id, model, tokenizer  # kind: "chat" or "text"
        self.include_usage = include_usage  # streams then carry "usage": null until the usage chunk, as OpenAI's
        self.created = int(time.time())
        self.choices, self.completions = choices, prompts * choices
        self.tool_choice = tool_choice if tool_choice is not None and tool_choice.mode != "none" else None
        self.readers = [ToolCallReader() for _ in range(self.completions)] if self.tool_choice else []
        self.text_offsets = [0] * self.completions
        self.echoes = [""] * self.completions if echo is None else [echo[i // choices] for i in range(self.completions)]
        self.echo_logprobs, self.prompt_ids = echo is not None and kind == "text", prompt_ids
        self.echo_only = echo_only

    def full(self, outputs: list[RequestOutput], logprobs: list[list[TokenLogprob]] | None) -> dict:
        """The non-streamed response; with n > 1 its `timings` are the first choice's."""
        choices = []
        for i, output in enumerate(outputs):
            choice: dict = {"index": i}
            calls = []
            if self.kind == "chat":
                content, calls = parse_tool_calls(output.text) if self.tool_choice else (output.text, [])
                if self.echoes[i]:
                    content = self.echoes[i] + (content or "")
                message = {"role": "assistant", "content": content, "refusal": None}
                choice["message"] = message | ({"tool_calls": [c.as_openai() for c in calls]} if calls else {})
            else:
                choice["text"] = self.echoes[i] + ("" if self.echo_only else output.text)
            prompt = output.prompt_logprobs if self.echo_logprobs else None
            choice["logprobs"] = self.logprobs(i, None if logprobs is None else self.generated(logprobs[i]), prompt)
            choice["finish_reason"] = self.finish_reason(output, bool(calls))
            choice["stop_reason"] = output.stop_reason  # vLLM's: the stop string or token id that ended it
            if output.prompt_logprobs is not None and self.kind != "chat":
                choice["prompt_logprobs"] = self._vllm_entries(output.prompt_logprobs)
            choices.append(choice)
        prompt_logprobs = outputs[0].prompt_logprobs  # a chat's one prompt: vLLM puts its entries beside the choices
        shared = (
            {"prompt_logprobs": self._vllm_entries(prompt_logprobs)} if self.kind == "chat" and prompt_logprobs else {}
        )
        return (
            {**self._head(chunk=False), "choices": choices}
            | shared
            | {
                "usage": usage(outputs, self.choices, not self.echo_only),
                "timings": timings(outputs[0].metrics, not self.echo_only),
            }
        )

    def generated(self, entries: list[TokenLogprob]) -> list[TokenLogprob]:
        """The logprobs of the tokens a choice returns: none of the one an echo alone generated."""
        return [] if self.echo_only else entries

    def finish_reason(self, output: RequestOutput, called: bool) -> str:
        """OpenAI's: `tool_calls` when a complete reply called tools, but `stop` for a named function; `length` for
        an echo alone (max_tokens 0)."""
        if self.echo_only:
            return "length"
        if called and output.finish_reason == "stop" and self.tool_choice.mode != "function":
            return "tool_calls"
        return output.finish_reason

    def role_chunks(self) -> list[dict]:
        """A chat stream's first chunks of each choice: the assistant's role, then any echo."""
        chunks = []
        for i in range(self.completions):
            chunks.append(self.chunk(i, {"role": "assistant"}))
            if self.echoes[i]:
                chunks.append(self.chunk(i, {"content": self.echoes[i]}))
        return chunks

    def delta_chunks(self, index: int, delta: RequestDelta, with_logprobs: bool) -> list[dict]:
        """The chunks of one step of choice `index`: its text (or tool-call pieces), its logprobs, and at its end the
        finish_reason and the choice's timings."""
        prompt = delta.prompt_logprobs if self.echo_logprobs else None  # on the first delta only, as the echo
        logprobs = self.logprobs(index, self.generated(delta.new_logprobs), prompt) if with_logprobs else None
        if self.kind == "chat" and self.tool_choice:
            reader = self.readers[index]
            pieces = [_delta(e) for e in reader.feed(delta.text) + (reader.finish() if delta.finished else [])]
        elif self.kind == "chat":
            pieces = [{"content": delta.text}] if delta.text else []
        else:
            text, self.echoes[index] = self.echoes[index] + ("" if self.echo_only else delta.text), ""
            pieces = [text] if text else []
        if logprobs is not None and not pieces:
            pieces = [{} if self.kind == "chat" else ""]
        chunks = [self.chunk(index, piece, logprobs if k == 0 else None) for k, piece in enumerate(pieces)]
        if delta.finished:
            called = bool(self.readers and self.readers[index].calls)
            finish = self.finish_reason(delta.output, called)
            end = self.chunk(index, {} if self.kind == "chat" else "", None, finish, delta.output.stop_reason)
            chunks.append(end | {"timings": timings(delta.output.metrics, not self.echo_only)})
        return chunks

    def chunk(
        self,
        index: int,
        piece: dict | str,
        logprobs: dict | None = None,
        finish_reason: str | None = None,
        stop_reason: str | int | None = None,
    ) -> dict:
        """A stream chunk with one choice: a chat's delta (a dict) or a completion's text; the last one's
        finish_reason and vLLM's stop_reason."""
        choice: dict = {"index": index}
        if self.kind == "chat":
            choice["delta"] = piece
        else:
            choice["text"] = piece
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = stop_reason
        return {**self._head(chunk=True), "choices": [choice]} | ({"usage": None} if self.include_usage else {})

    def usage_chunk(self, outputs: list[RequestOutput]) -> dict:
        """stream_options.include_usage: the last chunk, with no choices."""
        return {**self._head(chunk=True), "choices": [], "usage": usage(outputs, self.choices, not self.echo_only)}

    def _head(self, chunk: bool) -> dict:
        """OpenAI streams completions as text_completion objects too; chat chunks are chat.completion.chunk."""
        obj = "text_completion" if self.kind == "text" else "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def logprobs(
        self, index: int, entries: list[TokenLogprob] | None, prompt: list[TokenLogprob | None] | None = None
    ) -> dict | None:
        """Choice `index`'s logprobs of `entries`, in the endpoint's shape (a completion's offsets run on); an echo's
        `prompt` logprobs come first, the first prompt token's null (as OpenAI's and vLLM's)."""
        if entries is None:
            return None
        if self.kind == "chat":
            return {"content": [self._chat_entry(e) for e in entries]}
        rows: list[tuple[int, float | None, list[tuple[int, float]] | None]] = []
        if prompt is not None:
            rows.append((self.prompt_ids[index // self.choices][0], None, None))
            rows += [(e.token_id, e.logprob, e.top) for e in prompt[1:]]
        rows += [(e.token_id, e.logprob, e.top) for e in entries]
        tokens = [self._token(token_id) for token_id, _, _ in rows]
        offsets = []
        for t in tokens:
            offsets.append(self.text_offsets[index])
            self.text_offsets[index] += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [None if lp is None else _finite(lp) for _, lp, _ in rows],
            "top_logprobs": [None if top is None else self._top(token_id, lp, top) for token_id, lp, top in rows],
            "text_offset": offsets,
        }

    def _top(self, token_id: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, float]:
        """A completion position's top_logprobs: the k most likely tokens and, as OpenAI's legacy completions always
        give it, the chosen one (up to k + 1 entries)."""
        entries = {self._token(i): _finite(lp) for i, lp in top}
        return entries | ({} if any(i == token_id for i, _ in top) else {self._token(token_id): _finite(logprob)})

    def _vllm_entries(self, entries: list[TokenLogprob | None]) -> list[dict | None]:
        return [None if e is None else self._vllm_entry(e) for e in entries]

    def _vllm_entry(self, e: TokenLogprob) -> dict:
        """vLLM's JSON of one position: {token id: {logprob, rank, decoded_token}}, the token first."""
        return {
            str(token_id): {"logprob": _finite(lp.logprob), "rank": lp.rank, "decoded_token": self._token(token_id)}
            for token_id, lp in ((t, e[t]) for t in e)
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


def _delta(event: Event) -> dict:
    """A chat delta of one tool-call reader event, as OpenAI streams calls: the id, type and name first (with empty
    arguments), then the arguments in pieces, each under the call's index."""
    if isinstance(event, Content):
        return {"content": event.text}
    if isinstance(event, CallStart):
        call = event.call
        function = {"name": call.name, "arguments": ""}
        return {"tool_calls": [{"index": event.index, "id": call.id, "type": "function", "function": function}]}
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
