"""The output processor: sampled tokens in, the requests' text deltas and finish reasons out.

Every decision about what a request shows and when it ends is here: detokenization (never splitting a UTF-8
character), stop strings (cut, and never streamed: a tail that could still start one is held back), stop tokens and
EOS, none of them before min_tokens, max_tokens and the context's end.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooftop.engine.detokenizer import IncrementalDetokenizer
from rooftop.engine.outputs import RequestDelta, RequestOutput
from rooftop.engine.sampler import TokenLogprob
from rooftop.engine.sampling_params import SamplingParams
from rooftop.engine.sequence import Sequence
from rooftop.enums import FinishReason
from rooftop.loading.tokenizer import Tokenizer


@dataclass
class _Text:
    """One request's text so far: already cut at a stop string; `streamed` of it has been handed out."""

    detokenizer: IncrementalDetokenizer
    text: str = ""
    streamed: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended it (None: EOS)
    error: str | None = None


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: list[int], max_model_len: int):
        self.tokenizer, self.eos_token_ids, self.max_model_len = tokenizer, eos_token_ids, max_model_len
        self._texts: dict[str, _Text] = {}
        # a plain function (not a bound method) so that copying a logprob never copies the tokenizer
        self._decode_token = lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False)

    def add(self, seq: Sequence) -> None:
        self._texts[seq.request_id] = _Text(IncrementalDetokenizer(self.tokenizer, seq.params.skip_special_tokens))

    def on_tokens(
        self, seq: Sequence, token_ids: list[int], logprobs: list[TokenLogprob] | None, now: float
    ) -> RequestDelta:
        """Record a step's sampled tokens (one, or a verify step's accepted run) one at a time, stopping at the
        first that ends the request (the rest are discarded); return what they add to it, and whether it is done."""
        taken = []
        for k, token_id in enumerate(token_ids):
            taken.append(token_id)
            if self._append(seq, token_id, None if logprobs is None else logprobs[k], now):
                break
        state = self._texts[seq.request_id]
        return self._delta(seq, state, taken, [] if logprobs is None else logprobs[: len(taken)])

    def _append(self, seq: Sequence, token_id: int, logprob: TokenLogprob | None, now: float) -> bool:
        """Append one token to the request; whether it ends it."""
        seq.output_token_ids.append(token_id)
        seq.metrics.token_times.append(now)
        if logprob is not None:
            logprob.decode = self._decode_token  # its vLLM form's decoded_token, as the server writes a token
            seq.logprobs.append(logprob)
        state, p = self._texts[seq.request_id], seq.params
        # within min_tokens nothing stops it (the sampler masks EOS and the stop tokens), and a stop string counts
        # only if it ends in text after the min_tokens-th token, as vLLM's
        early = len(seq.output_token_ids) <= p.min_tokens
        cut = False
        if not early and not p.ignore_eos and token_id in self.eos_token_ids:  # EOS first, as vLLM: no stop_reason
            state.finish_reason = FinishReason.STOP
        elif not early and token_id in p.stop_token_ids:
            state.finish_reason, state.stop_reason = FinishReason.STOP, token_id
        if p.detokenize and (state.finish_reason is None or p.include_stop_str_in_output):  # a stop token's text stays
            before = len(state.text)
            state.text += state.detokenizer.add(token_id)
            cut = state.finish_reason is None and not early and self._cut_at_stop_string(state, p, before)
        if state.finish_reason is None and (
            len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len
        ):
            state.finish_reason = FinishReason.LENGTH
        if state.finish_reason is not None:
            seq.metrics.finished_time = now
            if not cut and p.detokenize:  # bytes held back for an incomplete character are text all the same at the end
                before = len(state.text)
                state.text += state.detokenizer.flush()
                if not early:
                    self._cut_at_stop_string(state, p, before)
        return state.finish_reason is not None

    def on_prompt_logprobs(self, seq: Sequence, entries: list[TokenLogprob]) -> None:
        """Record the logprobs of the prompt tokens a step's chunk reached (SamplingParams.prompt_logprobs)."""
        for entry in entries:
            entry.decode = self._decode_token
        seq.prompt_logprobs += entries

    def on_error(self, seq: Sequence, message: str) -> RequestDelta:
        """The request's step failed (e.g. non-finite logits): it ends with `error`; the others go on."""
        state = self._texts[seq.request_id]
        state.finish_reason, state.error = FinishReason.ERROR, message
        return self._delta(seq, state, [], [])

    def abort(self, seq: Sequence) -> RequestOutput:
        """The request's final output as it stands, ended with `abort` unless it had already finished."""
        state = self._texts[seq.request_id]
        state.finish_reason = state.finish_reason or FinishReason.ABORT
        return self._finish(seq, state)

    @staticmethod
    def _cut_at_stop_string(state: _Text, p: SamplingParams, before: int) -> bool:
        """Cut the text at the first stop string that text from `before` on completes; the stop string is dropped
        (kept with include_stop_str_in_output) and kept as the stop_reason (the earliest in the text; of those
        starting there, the first listed)."""
        found = ((state.text.find(s, max(0, before - len(s) + 1)), s) for s in p.stop)
        hits = [(i, s) for i, s in found if i >= 0]
        if hits:
            at, state.stop_reason = min(hits, key=lambda hit: hit[0])
            state.text = state.text[: at + len(state.stop_reason) if p.include_stop_str_in_output else at]
            state.finish_reason = FinishReason.STOP
        return bool(hits)

    def _delta(self, seq: Sequence, state: _Text, tokens: list[int], logprobs: list[TokenLogprob]) -> RequestDelta:
        # a tail that could start a stop string is held back, unless a stop string found stays in the text
        p = seq.params
        hold = 0 if state.finish_reason or p.include_stop_str_in_output else max(map(len, p.stop), default=1) - 1
        end = max(state.streamed, len(state.text) - hold)
        text, state.streamed = state.text[state.streamed : end], end
        output = None if state.finish_reason is None else self._finish(seq, state)
        first = len(seq.output_token_ids) == len(tokens)
        return RequestDelta(
            seq.request_id,
            tokens,
            text,
            seq.metrics,
            state.finish_reason,
            logprobs,
            output,
            prompt_logprobs(seq) if first else None,
        )

    def _finish(self, seq: Sequence, state: _Text) -> RequestOutput:
        del self._texts[seq.request_id]
        return RequestOutput(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            text=state.text,
            token_ids=seq.output_token_ids,
            finish_reason=state.finish_reason,
            stop_reason=state.stop_reason,
            metrics=seq.metrics,
            error=state.error,
            logprobs=None if seq.params.logprobs is None else seq.logprobs,
            prompt_logprobs=prompt_logprobs(seq),
        )


def prompt_logprobs(seq: Sequence) -> list[TokenLogprob | None] | None:
    """vLLM's prompt_logprobs of a request that asked for them: None for the first prompt token (nothing precedes
    it), then each later one's."""
    return None if seq.params.prompt_logprobs is None else [None, *seq.prompt_logprobs]
