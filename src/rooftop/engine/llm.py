"""LLM: the front door (vLLM's shape). Loads a model, turns prompts into Sequences, runs prefill then decode."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from rooftop.engine import runner
from rooftop.engine.detokenizer import IncrementalDetokenizer
from rooftop.engine.kv_cache import KVCache
from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.sampler import sample
from rooftop.engine.sampling_params import SamplingParams
from rooftop.engine.sequence import RequestOutput, Sequence
from rooftop.errors import InvalidRequestError, PromptTooLongError
from rooftop.loading.model_files import load_model
from rooftop.models.transformer import Transformer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

Prompt = str | list[int]
Messages = list[dict]


@dataclass
class StreamChunk:
    """One step of a streamed request: the text it added and the request's state so far."""

    delta: str
    output: RequestOutput


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """"auto" is float32 on CPU (the reference precision) and bfloat16 on an accelerator."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype not in DTYPES:
        raise InvalidRequestError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
    return DTYPES[dtype]


class LLM:
    """Run a model on prompts or chats: `LLM().generate(["Hello"], SamplingParams(max_tokens=32))`."""

    def __init__(
        self,
        model: str | Path | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "cpu",
        max_model_len: int | None = None,
    ):
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        loaded = load_model(model)
        self.model_path = loaded.source
        self.config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.model = Transformer(loaded.config, loaded.weights, self.dtype, self.device)
        self.max_model_len = min(max_model_len or self.config.max_position_embeddings, self.config.max_position_embeddings)
        self.eos_token_ids = sorted(set(self.config.eos_token_ids) | set(self.tokenizer.eos_token_ids))
        self._request_ids = itertools.count()

    def generate(
        self, prompts: Prompt | list[Prompt], sampling_params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """One output per prompt, in order. A prompt is text (used as is) or a list of token ids."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise InvalidRequestError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        arrival = time.perf_counter()
        seqs = [self._make_sequence(p, sp, arrival) for p, sp in zip(prompts, params_list)]
        for seq in seqs:
            for _ in self._run(seq):
                pass
        return [seq.output() for seq in seqs]

    def chat(
        self, messages: Messages | list[Messages], sampling_params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} dicts) or a list of them -> one output each."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        return self.generate([self.apply_chat_template(c) for c in conversations], sampling_params)

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[StreamChunk]:
        """Generate for one prompt, yielding each piece of text as soon as it is final."""
        seq = self._make_sequence(prompt, sampling_params or SamplingParams(), time.perf_counter())
        for delta in self._run(seq):
            yield StreamChunk(delta, seq.output())

    def apply_chat_template(self, messages: Messages) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def _make_sequence(self, prompt: Prompt, params: SamplingParams, arrival: float) -> Sequence:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("the prompt is empty")
            ids, text = self.tokenizer.encode(prompt), prompt
        else:
            ids, text = list(prompt), None
            if not ids:
                raise InvalidRequestError("the prompt is empty")
            bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
            if bad:
                raise InvalidRequestError(f"prompt token ids out of range [0, {self.config.vocab_size}): {bad[:5]}")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens; the context holds {self.max_model_len}, "
                "with room needed for at least one output token"
            )
        return Sequence(
            request_id=str(next(self._request_ids)),
            prompt=text,
            prompt_token_ids=ids,
            params=params,
            detokenizer=IncrementalDetokenizer(self.tokenizer),
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
            metrics=RequestMetrics(arrival_time=arrival, prompt_tokens=len(ids)),
        )

    def _run(self, seq: Sequence) -> Iterator[str]:
        """Prefill the prompt, then decode token by token until the sequence finishes; yields text deltas."""
        m, params = seq.metrics, seq.params
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        capacity = min(len(seq.prompt_token_ids) + params.max_tokens, self.max_model_len)
        cache = KVCache(self.config, capacity, self.dtype, self.device)
        m.first_scheduled_time = time.perf_counter()

        logits, seconds = runner.prefill(self.model, seq.prompt_token_ids, cache)
        token = sample(logits, params, seq.all_token_ids, generator)
        now = time.perf_counter()
        m.prefill_time += seconds
        m.prefill_tokens += len(seq.prompt_token_ids)
        yield seq.append_token(token, now)

        while seq.finish_reason is None:
            logits, seconds = runner.decode(self.model, token, seq.num_tokens - 1, cache)
            token = sample(logits, params, seq.all_token_ids, generator)
            now = time.perf_counter()
            m.decode_time += seconds
            m.decode_steps += 1
            yield seq.append_token(token, now)
