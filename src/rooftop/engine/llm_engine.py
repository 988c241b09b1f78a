"""LLMEngine: requests in, one step at a time out. The server's and `LLM`'s shared core (continuous batching)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from rooftop.config import DEFAULT_KV_CACHE_BYTES, EngineConfig
from rooftop.engine.block_manager import BlockManager
from rooftop.engine.detokenizer import IncrementalDetokenizer
from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.runner import is_decode, run_step
from rooftop.engine.sampler import TokenLogprob, sample, token_logprob
from rooftop.engine.sampling_params import SamplingParams
from rooftop.engine.scheduler import Scheduler
from rooftop.engine.sequence import RequestOutput, Sequence
from rooftop.errors import InvalidRequestError, PromptTooLongError
from rooftop.loading.tokenizer import Tokenizer
from rooftop.models.kv_cache import KVPool
from rooftop.models.transformer import Transformer
from rooftop.roofline.ops import SeqShape, StepShape

STEP_HISTORY = 10_000


@dataclass
class StepRecord:
    """What one step did, for the roofline attribution: its shape, phase mix and measured time."""

    shape: StepShape
    phase: str  # "prefill", "decode" or "mixed"
    seconds: float
    finished_at: float  # time.perf_counter() when the step's tokens were ready


@dataclass
class RequestDelta:
    """What one request got from one step."""

    request_id: str
    new_token_ids: list[int]
    text: str  # the new text, safe to show (never part of a stop string)
    finished: bool
    finish_reason: str | None
    output: RequestOutput  # the whole request so far
    new_logprobs: list[TokenLogprob] = field(default_factory=list)  # of new_token_ids, when params.logprobs is set


class LLMEngine:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, config: EngineConfig | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.config = config or EngineConfig()
        mc = model.config
        self.max_model_len = min(self.config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        block_bytes = KVPool.bytes_per_block(mc, self.config.block_size, model.dtype)
        num_blocks = self.config.num_kv_blocks or max(
            1, (self.config.kv_cache_bytes or DEFAULT_KV_CACHE_BYTES) // block_bytes
        )
        self.pool = KVPool(mc, num_blocks, self.config.block_size, model.dtype, model.device)
        self.blocks = BlockManager(num_blocks, self.config.block_size, self.config.enable_prefix_caching)
        self.scheduler = Scheduler(self.config, self.blocks)
        self.eos_token_ids = sorted(set(mc.eos_token_ids) | set(tokenizer.eos_token_ids))
        self.requests: dict[str, Sequence] = {}
        self.step_records: deque[StepRecord] = deque(maxlen=STEP_HISTORY)
        self._arrivals = 0

    @property
    def pool_tokens(self) -> int:
        return self.pool.num_blocks * self.pool.block_size

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; raises InvalidRequestError (for this request only) if it can never run."""
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        params = params or SamplingParams()
        ids, text = self._tokenize(prompt)
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens; the context holds {self.max_model_len}, "
                "with room needed for at least one output token"
            )
        longest = min(len(ids) + params.max_tokens, self.max_model_len)
        if self.blocks.blocks_needed(longest) > self.blocks.num_blocks:
            raise InvalidRequestError(
                f"the request needs up to {longest} tokens of KV cache; the pool holds {self.pool_tokens} "
                "(raise kv_cache_bytes / num_kv_blocks or lower max_tokens)"
            )
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.model.device).manual_seed(params.seed)
        seq = Sequence(
            request_id=request_id,
            prompt=text,
            prompt_token_ids=ids,
            params=params,
            detokenizer=IncrementalDetokenizer(self.tokenizer),
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
            metrics=RequestMetrics(
                arrival_time=time.perf_counter() if arrival_time is None else arrival_time, prompt_tokens=len(ids)
            ),
            arrival_index=self._arrivals,
            generator=generator,
        )
        self._arrivals += 1
        self.requests[request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks; an unknown or finished id is a no-op."""
        seq = self.requests.pop(request_id, None)
        if seq is not None:
            seq.finish_reason = seq.finish_reason or "abort"
            self.scheduler.finish(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestDelta]:
        """Schedule, run one forward pass, sample; return what each request that got a token produced."""
        batch = self.scheduler.schedule()
        if not batch:
            return []
        started = time.perf_counter()
        for s in batch:
            if s.seq.metrics.first_scheduled_time is None:
                s.seq.metrics.first_scheduled_time = started
                s.seq.metrics.prefix_cache_hit_tokens = s.cached  # admitted with its cached prefix computed
        shape = StepShape(tuple(SeqShape(s.num_new, s.cached, s.samples) for s in batch))
        logits, seconds = run_step(self.model, self.pool, batch)
        deltas = []
        for i, s in enumerate(batch):
            seq, m = s.seq, s.seq.metrics
            seq.num_computed_tokens += s.num_new
            if is_decode(s):
                m.decode_time += seconds
                m.decode_steps += 1
            else:
                m.prefill_time += seconds
                m.prefill_tokens += s.num_new
            self.blocks.cache_full_blocks(seq.block_table, seq.all_token_ids, seq.num_computed_tokens)
            if i not in logits:
                continue
            before = len(seq.output_token_ids)
            try:
                token = sample(logits[i], seq.params, seq.all_token_ids, seq.generator, seq.output_token_ids)
                if seq.params.logprobs is not None:
                    seq.logprobs.append(token_logprob(logits[i], token, seq.params.logprobs))
                text = seq.append_token(token, time.perf_counter())
            except (RuntimeError, ValueError) as e:  # e.g. non-finite logits: this request ends, the others go on
                seq.finish_reason, text = "error", ""
                seq.error = str(e)
            deltas.append(
                RequestDelta(
                    seq.request_id,
                    seq.output_token_ids[before:],
                    text,
                    seq.finish_reason is not None,
                    seq.finish_reason,
                    seq.output(),
                    seq.logprobs[before:],
                )
            )
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)
                self.requests.pop(seq.request_id, None)
        self.step_records.append(StepRecord(shape, shape.phase, seconds, time.perf_counter()))
        return deltas

    def _tokenize(self, prompt: str | list[int]) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("the prompt is empty")
            return self.tokenizer.encode(prompt), prompt
        ids = list(prompt)
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        vocab = self.model.config.vocab_size
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < vocab]
        if bad:
            raise InvalidRequestError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
        return ids, None
