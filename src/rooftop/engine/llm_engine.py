"""LLMEngine: requests in, one step at a time out. The server's and `LLM`'s shared core (continuous batching).

One step: the scheduler picks the sequences and decides each one's phase; the runner computes them in one forward
pass; the sampler draws every sampling sequence's next token at once; the output processor turns the tokens into
text deltas and finish reasons; the scheduler takes in what the step computed and frees what finished.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import replace

import torch

from rooftop.config import DEFAULT_KV_CACHE_BYTES, EngineConfig
from rooftop.engine.block_manager import BlockManager
from rooftop.engine.cuda_graph import capture_decode_graphs, cuda_engine_config
from rooftop.engine.metrics import RequestMetrics, SpecDecodeCounts
from rooftop.engine.output_processor import OutputProcessor
from rooftop.engine.outputs import EngineStats, RequestDelta, RequestOutput, StepOutput, StepRecord
from rooftop.engine.runner import run_step
from rooftop.engine.sampler import (
    SamplingRow,
    bad_word_token_ids,
    finite_rows,
    sample,
    token_logprob,
    token_logprobs,
)
from rooftop.engine.sampling_params import SamplingParams
from rooftop.engine.scheduler import ScheduledSeq, Scheduler
from rooftop.engine.sequence import Sequence
from rooftop.engine.speculative import accepted_run, make_proposer, sampling_runs
from rooftop.engine.structured import GrammarCompiler
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError, PromptTooLongError
from rooftop.kernels import pages
from rooftop.loading.tokenizer import Tokenizer
from rooftop.models.kv_cache import KV_DTYPES, KVPool, kv_dtype_name, kv_storage_dtype
from rooftop.models.transformer import Transformer
from rooftop.roofline.ops import SeqShape, StepShape

log = logging.getLogger("rooftop.engine")
NO_TOKEN = (
    "its constraints leave no token to sample at this step (min_tokens, allowed_token_ids, bad_words, stop_token_ids "
    "and its structured output together ban every one)"
)


def pool_from_spec(model: Transformer, spec: tuple[int, int, str, int]) -> KVPool:
    """The KV pool (num_blocks, block_size, storage dtype, state slots) of the rank's shapes: under tensor
    parallelism every rank makes the same one, holding its own KV heads, so one block table serves them all."""
    num_blocks, block_size, kv_dtype, slots = spec
    return KVPool(model.rank_config, num_blocks, block_size, KV_DTYPES[kv_dtype], model.device, slots, model.dtype)


class LLMEngine:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, config: EngineConfig | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.config = config or EngineConfig()
        mc = model.config
        hybrid = bool(mc.num_linear_attention_layers)
        if hybrid and self.config.enable_prefix_caching:
            # a cached prefix's K/V do not carry the linear-attention layers' state at the prefix's end
            log.info("prefix caching is off for hybrid models: shared KV blocks do not hold the recurrent state")
            self.config = replace(self.config, enable_prefix_caching=False)
        cuda = model.device.type == "cuda"
        if cuda:
            self.config = cuda_engine_config(self.config, model.dtype)
        else:
            pages.keep_freed_memory()  # the steps' activations reuse pages, not fault in new ones (kernels/pages.py)
        if (self.config.max_model_len or 0) > mc.max_position_embeddings:  # vLLM refuses it too: RoPE has no row past
            raise InvalidRequestError(
                f"max_model_len {self.config.max_model_len} is more than the model's {mc.max_position_embeddings} "
                "positions (max_position_embeddings)",
                "max_model_len",
            )
        self.max_model_len = self.config.max_model_len or mc.max_position_embeddings
        if model.tp is not None and self.config.speculative_config is not None:
            self.config.speculative_config.check_ranks(model.tp.size)
        kv_dtype = kv_storage_dtype(self.config.kv_cache_dtype, model.dtype)
        # per rank: under tensor parallelism each holds its KV heads, so the same bytes hold more tokens
        block_bytes = KVPool.bytes_per_block(model.rank_config, self.config.block_size, kv_dtype)
        kv_bytes = self.config.kv_cache_bytes or DEFAULT_KV_CACHE_BYTES
        num_blocks = self.config.num_kv_blocks or max(1, kv_bytes // block_bytes)
        slots = self.config.max_num_seqs if hybrid else 0
        spare = 1 if cuda else 0  # the state slot of a captured decode's padded rows (engine/cuda_graph.py)
        pool_spec = (num_blocks, self.config.block_size, kv_dtype_name(kv_dtype), max(slots, 1) + spare)
        self._pool = pool_from_spec(model, pool_spec)
        self._pool_key = 0 if model.tp is None else model.tp.lead.open_pool(self, pool_spec)
        self._state_slots = slots
        self._new_queues()
        eos_token_ids = sorted(set(mc.eos_token_ids) | set(tokenizer.eos_token_ids))
        self._outputs = OutputProcessor(tokenizer, eos_token_ids, self.max_model_len)
        self._grammars = GrammarCompiler(tokenizer.backend, mc.vocab_size, eos_token_ids)
        self._requests: dict[str, Sequence] = {}
        self._proposer = make_proposer(self.config.speculative_config, mc, model, self.max_model_len, tokenizer)
        # on CUDA decode steps replay graphs captured now (None: they run eagerly, or not on CUDA)
        self.decode_graphs = capture_decode_graphs(model, self._pool, self.config, self.max_model_len) if cuda else None
        self.warm_up()

    def _new_queues(self) -> None:
        """An empty block manager and scheduler over the pool, with their counters at zero."""
        self._blocks = BlockManager(self._pool.num_blocks, self.config.block_size, self.config.enable_prefix_caching)
        self._scheduler = Scheduler(self.config, self._blocks, self._state_slots)
        self._arrivals = 0
        self._spec_decode = SpecDecodeCounts()

    def warm_up(self) -> None:
        """Two short requests through every part of a step (a prefill chunk, as wide as one that widens its
        weights where the host widens, a short one beside it, decodes, greedy and seeded random sampling), then
        forgotten: queues, prefix cache and counters start empty. A process's first steps pay once for the kernels',
        the thread pool's and the allocator's first use, which the first request's TTFT and its step records would
        otherwise carry (as vLLM's start-up run spares its users). Construction runs it; a server whose engine
        steps on a thread of its own runs it again there (each thread has its own OpenMP team and allocator arena),
        unless the engine has run requests by then."""
        if self._arrivals:  # it has run requests: its queues, prefix cache and counters are theirs to keep
            return
        self.warm_up_seconds = 0.0  # what the last warm-up took (LLM's load time includes construction's)
        wide = self.model.precision.widen_rows or 16  # widening's first matmuls are the costliest
        tokens = min(wide, self.max_model_len - 4, self.kv_cache_tokens // 2 - 4)
        if tokens < 2:
            return
        start = time.perf_counter()
        vocab = self.model.config.vocab_size
        ids = [(7 + 31 * i) % vocab for i in range(tokens)]
        greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        drawn = SamplingParams(max_tokens=3, temperature=1.0, top_p=0.9, top_k=50, seed=0, ignore_eos=True)
        names = ("warm-up-chunk", "warm-up-short")
        try:
            self.add_request(names[0], ids, greedy)
            self.add_request(names[1], ids[:2], drawn)
            while self.has_unfinished():
                self._step()  # not `step`: what wraps or replaces it (a subclass, a test) sees real requests only
        finally:  # an error midway leaves nothing behind either
            for name in names:
                self.abort(name)
            self._new_queues()
        self.warm_up_seconds = time.perf_counter() - start
        log.info("warmed up in %.0f ms", self.warm_up_seconds * 1e3)

    @property
    def kv_cache_dtype(self) -> str:
        """What the pool stores, in --kv-cache-dtype's names: the model's float dtype, another float dtype, int8 or
        fp8_e4m3 (--kv-cache-dtype resolved)."""
        return kv_dtype_name(self._pool.dtype)

    @property
    def kv_cache_tokens(self) -> int:
        return self._pool.num_blocks * self._pool.block_size

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        shares_prompt_with: str | None = None,
    ) -> None:
        """Queue a request; raises InvalidRequestError (for this request only) if it can never run.
        `shares_prompt_with`: a queued request with the same prompt (another of n choices) whose prompt this one
        takes from the prefix cache: it is admitted once that one's prompt is computed, not beside it."""
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        params = params or SamplingParams()
        if params.n != 1:  # one sequence per request: n outputs are n requests (SamplingParams.choices)
            raise InvalidRequestError(
                f"n={params.n} asks for {params.n} outputs of one prompt: LLM.generate and the server run them as "
                f"{params.n} requests (SamplingParams.choices); the engine and LLM.stream take one output per request",
                "n",
            )
        ids, text = self._tokenize(prompt)
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError.of(len(ids), self.max_model_len)
        if params.max_tokens is None:  # vLLM's: until EOS or the context's end
            params = replace(params, max_tokens=self.max_model_len - len(ids))
        longest = min(len(ids) + params.max_tokens, self.max_model_len)
        if self._blocks.blocks_needed(longest) > self._blocks.num_blocks:
            raise InvalidRequestError(
                f"the request needs up to {longest} tokens of KV cache; the pool holds {self.kv_cache_tokens} "
                "(raise kv_cache_bytes or num_kv_blocks: --kv-cache-bytes, --num-kv-blocks; or ask for fewer tokens: "
                "max_tokens, -n)",
                "max_tokens",
            )
        vocab = self.model.config.vocab_size
        outside = [t for t in params.logit_bias or {} if t >= vocab]
        if outside:
            raise InvalidRequestError(f"logit_bias token ids out of range [0, {vocab}): {outside[:5]}", "logit_bias")
        for name in ("allowed_token_ids", "stop_token_ids"):
            outside = [t for t in getattr(params, name) or [] if t >= vocab]
            if outside:
                raise InvalidRequestError(f"{name} out of range [0, {vocab}): {outside[:5]}", name)
        bad_words = bad_word_token_ids(
            params.bad_words, lambda word: self.tokenizer.encode(word, add_special_tokens=False)
        )
        spec = params.structured_outputs
        grammar = None if spec is None else self._grammars.start(spec)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.model.device).manual_seed(params.seed)
        arrival = time.perf_counter() if arrival_time is None else arrival_time
        seq = Sequence(
            request_id=request_id,
            prompt=text,
            prompt_token_ids=ids,
            params=params,
            metrics=RequestMetrics(arrival_time=arrival, prompt_tokens=len(ids)),
            arrival_index=self._arrivals,
            generator=generator,
            grammar=grammar,
            prompt_source=None if shares_prompt_with is None else self._requests.get(shares_prompt_with),
            bad_words=bad_words,
        )
        self._arrivals += 1
        self._requests[request_id] = seq
        self._outputs.add(seq)
        self._scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its blocks; returns its output as it stood (finish reason `abort`), or None for
        an unknown or finished id."""
        seq = self._requests.pop(request_id, None)
        if seq is None:
            return None
        self._scheduler.finish(seq)
        if self._proposer is not None:
            self._proposer.release(seq)  # a draft model's cache of it goes too
        return self._outputs.abort(seq)

    def has_request(self, request_id: str) -> bool:
        """Whether the request is queued or running (not finished, not aborted)."""
        return request_id in self._requests

    def has_unfinished(self) -> bool:
        return self._scheduler.has_unfinished()

    def stats(self) -> EngineStats:
        blocks = self._blocks
        return EngineStats(
            running=len(self._scheduler.running),
            waiting=len(self._scheduler.waiting),
            kv_blocks_used=blocks.num_blocks - blocks.num_free,
            kv_blocks_total=blocks.num_blocks,
            block_size=blocks.block_size,
            kv_cache_bytes=self._pool.nbytes,
            kv_cache_dtype=self.kv_cache_dtype,
            prefix_queries=blocks.prefix_queries,
            prefix_hits=blocks.prefix_hits,
            preemptions=self._scheduler.num_preemptions,
            spec_decode=copy.deepcopy(self._spec_decode),
        )

    def step(self) -> StepOutput:
        """Schedule, run one forward pass, sample; return what each request that got a token produced, and the
        step's record."""
        return self._step()

    def _step(self) -> StepOutput:
        began = time.perf_counter()
        drafts = self._propose()
        # a draft model's forward passes (or the n-gram lookups): decode work of the verify step's, not host time
        drafted = time.perf_counter() - began if drafts else 0.0
        batch = self._scheduler.schedule(drafts)
        if not batch:
            return StepOutput()
        started = time.perf_counter()
        for s in batch:
            if s.seq.metrics.first_scheduled_time is None:
                s.seq.metrics.first_scheduled_time = started
                s.seq.metrics.prefix_cache_hit_tokens = s.cached  # admitted with its cached prefix computed
        seqs = tuple(
            SeqShape(s.new, s.cached, s.needs_logits, phase=s.phase, prompt_logits=len(s.prompt_positions))
            for s in batch
        )
        step = run_step(self.model, self._pool, batch, self.config.batch_invariant, self._pool_key, self.decode_graphs)
        shape = StepShape(seqs, experts_touched=self.model.experts_touched(), tp=self.model.tp_size)
        for s in batch:
            m = s.seq.metrics
            if s.phase is Phase.DECODE:
                m.decode_time += step.seconds + drafted
                m.decode_steps += 1
            else:
                m.prefill_time += step.seconds
                m.prefill_tokens += s.new
        for i, logits in step.prompt_logits.items():
            s = batch[i]
            positions = s.prompt_positions
            ids = s.seq.prompt_token_ids[positions.start + 1 : positions.stop + 1]
            self._outputs.on_prompt_logprobs(s.seq, token_logprobs(logits, ids, s.seq.params.prompt_logprobs))
        deltas = self._sample(batch, step.logits, step.sampled)
        finished = [self._requests.pop(d.request_id) for d in deltas if d.finished]
        self._scheduler.update(batch, finished)
        if self._proposer is not None:
            for seq in finished:
                self._proposer.release(seq)
        now = time.perf_counter()
        around = now - began - drafted - step.seconds
        return StepOutput(deltas, StepRecord(shape, step.seconds, now, around, drafted))

    def _propose(self) -> dict[Sequence, list[int]]:
        """Draft tokens for the decoding sequences, as many as could still be kept: a verify step adds up to one
        token more than its drafts, within max_tokens and the context. A structured output does not draft: it decodes
        one token per step, each drawn under its grammar's mask (drafts are not checked against the grammar)."""
        if self._proposer is None:
            return {}
        most = {
            seq: min(seq.params.max_tokens - len(seq.output_token_ids) - 1, self.max_model_len - seq.num_tokens)
            for seq in self._scheduler.decoding()
            if seq.grammar is None
        }
        return self._proposer.propose(most)

    def _sample(self, batch: list[ScheduledSeq], logits: torch.Tensor | None, sampled: list[int]) -> list[RequestDelta]:
        """Next tokens for the sampling sequences, as deltas: one, or a verify step's accepted drafts and the token
        after them. A row whose logits are not finite ends its own request with `error`; the others go on."""
        if logits is None:
            return []
        runs = sampling_runs(sampled)
        finite = finite_rows(logits)  # a NaN or inf anywhere in a row
        good, rows = [], []
        for i, first, count in runs:
            s = batch[i]
            seq = s.seq
            usable = next((j for j in range(count) if not finite[first + j]), count)  # rows up to the first bad one
            for j in range(usable):
                output = seq.output_token_ids if j == 0 else seq.output_token_ids + s.draft[:j]  # as if accepted
                draft = s.draft[j] if j < usable - 1 else None
                rows.append(
                    SamplingRow(
                        seq.params,
                        seq.generator,
                        seq.prompt_token_ids,
                        output,
                        draft,
                        seq.grammar,
                        self._outputs.eos_token_ids,
                        seq.bad_words,
                    )
                )
                good.append(first + j)
        tokens: dict[int, int] = {}
        closed: set[int] = set()  # rows whose constraints leave no token
        error = "the model produced non-finite logits"
        if good:
            try:
                kept = logits if len(good) == logits.shape[0] else logits[good]  # indexing copies the rows
                drawn = sample(kept, rows)
                tokens = {i: t for i, t in zip(good, drawn, strict=True) if t is not None}
                closed = {i for i, t in zip(good, drawn, strict=True) if t is None}
            except (RuntimeError, ValueError):  # a sampling failure fails this step's samples, not the engine
                log.exception("sampling failed")
                tokens, error = {}, "sampling failed on this step (the log has the details)"
        now = time.perf_counter()
        deltas = []
        for i, first, count in runs:
            s = batch[i]
            run = accepted_run(s.draft, [tokens.get(first + j) for j in range(count)])
            if run is None:  # a row it needed has no token (with drafts: the step's accepted run is dropped too)
                why = NO_TOKEN if any(first + j in closed for j in range(count)) else error
                deltas.append(self._outputs.on_error(s.seq, why))
                continue
            k_logprobs = s.seq.params.logprobs
            logprobs = None
            if k_logprobs is not None:
                logprobs = [token_logprob(logits[first + j], t, k_logprobs) for j, t in enumerate(run)]
            grammar = s.seq.grammar  # a structured output does not draft: its run is one token
            if grammar is not None and not grammar.advance(run):
                deltas.append(self._outputs.on_error(s.seq, f"the grammar rejected a sampled token: {grammar.error}"))
                continue
            delta = self._outputs.on_tokens(s.seq, run, logprobs, now)
            s.accepted = len(delta.new_token_ids) - 1
            if s.phase is Phase.DECODE:
                s.seq.metrics.decode_tokens += len(delta.new_token_ids)
            if s.draft:
                for counts in (s.seq.metrics.spec_decode, self._spec_decode):
                    counts.add(len(s.draft), len(run) - 1)
                self._proposer.observe(s.seq, len(run) - 1)
            deltas.append(delta)
        return deltas

    def _tokenize(self, prompt: str | list[int]) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("the prompt is empty")
            ids, vocab = self.tokenizer.encode(prompt), self.model.config.vocab_size
            if max(ids, default=0) >= vocab:  # a tokenizer beside a config of a smaller vocabulary (a dummy run)
                outside = sorted({i for i in ids if i >= vocab})
                raise InvalidRequestError(
                    f"the tokenizer makes token ids the model's vocabulary ({vocab}) does not hold: {outside[:5]}; "
                    "send token ids below it"
                )
            return ids, prompt
        ids = list(prompt)
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        vocab = self.model.config.vocab_size
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < vocab]
        if bad:
            raise InvalidRequestError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
        return ids, None
