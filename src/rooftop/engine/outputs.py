"""What the engine hands out: a request's deltas and final output, each step's record, and the engine's counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from rooftop.engine.metrics import RequestMetrics, SpecDecodeCounts
from rooftop.engine.sampler import TokenLogprob
from rooftop.engine.tool_calls import ToolCall
from rooftop.enums import FinishReason, Phase
from rooftop.roofline.ops import StepShape


@dataclass
class CompletionOutput:
    """One of a prompt's n outputs, as vLLM's `RequestOutput.outputs` holds them. `cumulative_logprob` is the sum of
    its tokens' log-probabilities where they were asked for (`SamplingParams.logprobs`), else None. Each of
    `logprobs` is also vLLM's {token_id: Logprob} of its position (engine/sampler.py, TokenLogprob).
    `stop_reason` (vLLM's): the stop string or stop token id that ended it; None when EOS, the length or an abort
    did."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCall] | None = None  # LLM.chat with tools: the calls read from `text` (which keeps them)
    stop_reason: str | int | None = None

    @property
    def cumulative_logprob(self) -> float | None:
        return None if self.logprobs is None else sum(t.logprob for t in self.logprobs)

    def finished(self) -> bool:
        """vLLM's (a method here, where RequestOutput's is a field): whether a finish reason ended this output."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """What `LLM.generate` returns for one prompt: vLLM's fields (`outputs`: one CompletionOutput per each of
    `SamplingParams.n`), and the first output's text, tokens, finish reason and logprobs flattened beside them."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    metrics: RequestMetrics
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per output token when params.logprobs is set, else None
    tool_calls: list[ToolCall] | None = None  # output 0's (CompletionOutput.tool_calls)
    outputs: list[CompletionOutput] = field(default_factory=list)  # all n; just this one's where left empty
    stop_reason: str | int | None = None  # output 0's (CompletionOutput.stop_reason)
    # vLLM's, when params.prompt_logprobs is set: None for the first prompt token, then each later one's TokenLogprob
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def __post_init__(self) -> None:
        if not self.outputs:
            self.outputs = [self.completion(0)]

    def completion(self, index: int) -> CompletionOutput:
        """This request's output as output `index` of a prompt's n."""
        return CompletionOutput(
            index, self.text, self.token_ids, self.finish_reason, self.logprobs, self.tool_calls, self.stop_reason
        )

    @property
    def finished(self) -> bool:
        """vLLM's: the request is done (an output handed out while it runs would say False)."""
        return self.finish_reason is not None

    @property
    def num_cached_tokens(self) -> int:
        """vLLM's: the prompt tokens served from the prefix cache, not computed (of the prompt's first request,
        where n > 1 shared it)."""
        return self.metrics.prefix_cache_hit_tokens


@dataclass
class RequestDelta:
    """What one request got from one step: only the increment (tokens, text, logprobs), so streaming a long answer
    costs the same per token; the whole output comes once, with the final delta."""

    request_id: str
    new_token_ids: list[int]
    text: str  # the new text, safe to show (never part of a stop string)
    metrics: RequestMetrics  # the request's own timings so far (the engine's object, not a copy)
    finish_reason: FinishReason | None = None
    new_logprobs: list[TokenLogprob] = field(default_factory=list)  # of new_token_ids, when params.logprobs is set
    output: RequestOutput | None = None  # the whole request, on its final delta only
    prompt_logprobs: list[TokenLogprob | None] | None = None  # RequestOutput's, on the request's first delta only

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class StepRecord:
    """What one step did, for the roofline attribution: its shape (each sequence's new and cached tokens and
    phase), its phase and its measured time."""

    shape: StepShape
    seconds: float  # the forward pass and the lm_head, device-synchronized
    finished_at: float  # time.perf_counter() when the step's tokens were ready
    around_seconds: float = 0.0  # the rest of the step: scheduling, sampling, detokenizing, bookkeeping
    draft_seconds: float = 0.0  # speculative decoding's proposals before it: a draft model's forward passes

    @property
    def wall_seconds(self) -> float:
        return self.seconds + self.draft_seconds + self.around_seconds

    @property
    def phase(self) -> Phase:
        return self.shape.phase


@dataclass
class StepOutput:
    """One `LLMEngine.step()`: the deltas of the requests that got a token, and the step's record (None when there
    was nothing to run)."""

    deltas: list[RequestDelta] = field(default_factory=list)
    record: StepRecord | None = None


@dataclass(frozen=True)
class EngineStats:
    """What the server and the CLI show of the engine's state."""

    running: int  # sequences holding KV blocks
    waiting: int  # queued, not yet admitted (or preempted)
    kv_blocks_used: int
    kv_blocks_total: int
    block_size: int
    kv_cache_bytes: int
    prefix_queries: int  # prompt tokens looked up in the prefix cache, since the engine started
    prefix_hits: int  # of which found
    preemptions: int
    spec_decode: SpecDecodeCounts = field(default_factory=SpecDecodeCounts)  # since the engine started
    kv_cache_dtype: str = "float32"  # what the pool stores (int8, fp8_e4m3: with a float32 scale per token and KV head)

    @property
    def kv_cache_tokens(self) -> int:
        return self.kv_blocks_total * self.block_size

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total
