"""The server's Prometheus collectors (vLLM's metric names with a rooftop_ prefix), in a registry of their own so two
servers in one process never share counters."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rooftop.enums import FinishReason, Phase

# seconds; vLLM's buckets, widened at the top for CPU-sized latencies
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


@dataclass
class ServerMetrics:
    registry: CollectorRegistry
    requests: Counter  # label outcome: stop, length, abort, error, rejected (429), invalid (4xx)
    prompt_tokens: Counter
    generation_tokens: Counter
    ttft: Histogram
    itl: Histogram
    tpot: Histogram
    e2e: Histogram
    queue_time: Histogram
    running: Gauge
    waiting: Gauge
    kv_cache_usage: Gauge
    cache_config: Gauge  # labels cache_dtype (what the KV pool stores) and block_size, at 1: vLLM's cache_config_info
    prefix_cache_queries: Counter
    prefix_cache_hits: Counter
    preemptions: Counter
    spec_decode_num_drafts: Counter  # speculative decoding: verify steps that checked drafts
    spec_decode_num_draft_tokens: Counter
    spec_decode_num_accepted_tokens: Counter
    spec_decode_num_accepted_tokens_per_pos: Counter  # label position: 0 is the first draft token
    steps: Counter  # label phase
    achieved_flops: Gauge  # label phase: FLOPs / measured seconds over the phase's recent steps
    achieved_bytes: Gauge
    step_seconds: Gauge  # label phase: mean wall time of the phase's recent steps
    step_bound_seconds: Gauge  # label phase: their mean fused lower bound at this machine's roofs
    step_expected_seconds: Gauge  # label phase: their mean calibrated expectation
    roof_flops: Gauge  # the probe's measured ceilings, for % of roof in a dashboard of one's own
    roof_bytes: Gauge

    def render(self) -> bytes:
        return generate_latest(self.registry)


def create_metrics() -> ServerMetrics:
    r = CollectorRegistry()

    def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, buckets=buckets, registry=r)

    m = ServerMetrics(
        registry=r,
        requests=Counter("rooftop_requests", "Requests by outcome", ["outcome"], registry=r),
        prompt_tokens=Counter(
            "rooftop_prompt_tokens", "Prompt tokens of requests that got their first token", registry=r
        ),
        generation_tokens=Counter("rooftop_generation_tokens", "Generated tokens", registry=r),
        ttft=histogram("rooftop_time_to_first_token_seconds", "First output token - arrival", REQUEST_BUCKETS),
        itl=histogram("rooftop_inter_token_latency_seconds", "Gap between consecutive output tokens", TOKEN_BUCKETS),
        tpot=histogram("rooftop_time_per_output_token_seconds", "(E2E - TTFT) / (output tokens - 1)", TOKEN_BUCKETS),
        e2e=histogram("rooftop_e2e_request_latency_seconds", "Last output token - arrival", REQUEST_BUCKETS),
        queue_time=histogram("rooftop_request_queue_time_seconds", "First scheduled - arrival", REQUEST_BUCKETS),
        running=Gauge("rooftop_num_requests_running", "Requests in the running batch", registry=r),
        waiting=Gauge("rooftop_num_requests_waiting", "Requests waiting to be scheduled", registry=r),
        kv_cache_usage=Gauge("rooftop_kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full)", registry=r),
        cache_config=Gauge(
            "rooftop_cache_config_info",
            "The KV cache's configuration: what it stores (--kv-cache-dtype resolved) and its block size",
            ["cache_dtype", "block_size"],
            registry=r,
        ),
        prefix_cache_queries=Counter(
            "rooftop_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", registry=r
        ),
        prefix_cache_hits=Counter("rooftop_prefix_cache_hits", "Prompt tokens found in the prefix cache", registry=r),
        preemptions=Counter("rooftop_num_preemptions", "Sequences preempted for KV blocks (recomputed)", registry=r),
        spec_decode_num_drafts=Counter(
            "rooftop_spec_decode_num_drafts", "Speculative decoding: verify steps that checked draft tokens", registry=r
        ),
        spec_decode_num_draft_tokens=Counter(
            "rooftop_spec_decode_num_draft_tokens", "Speculative decoding: draft tokens checked", registry=r
        ),
        spec_decode_num_accepted_tokens=Counter(
            "rooftop_spec_decode_num_accepted_tokens", "Speculative decoding: draft tokens accepted", registry=r
        ),
        spec_decode_num_accepted_tokens_per_pos=Counter(
            "rooftop_spec_decode_num_accepted_tokens_per_pos",
            "Speculative decoding: draft tokens accepted, by position in the draft",
            ["position"],
            registry=r,
        ),
        steps=Counter("rooftop_steps", "Engine steps by phase", ["phase"], registry=r),
        achieved_flops=Gauge("rooftop_achieved_flops_per_second", "FLOP/s of recent steps", ["phase"], registry=r),
        achieved_bytes=Gauge("rooftop_achieved_bytes_per_second", "Bytes/s of recent steps", ["phase"], registry=r),
        step_seconds=Gauge("rooftop_step_seconds", "Mean wall time of recent steps", ["phase"], registry=r),
        step_bound_seconds=Gauge(
            "rooftop_step_bound_seconds", "Mean lower bound (fused roofline) of recent steps", ["phase"], registry=r
        ),
        step_expected_seconds=Gauge(
            "rooftop_step_expected_seconds", "Mean calibrated expected time of recent steps", ["phase"], registry=r
        ),
        roof_flops=Gauge(
            "rooftop_roof_flops_per_second", "This machine's measured compute roofs", ["compute"], registry=r
        ),
        roof_bytes=Gauge("rooftop_roof_bytes_per_second", "This machine's measured memory bandwidth", registry=r),
    )
    for outcome in (*FinishReason, "rejected", "invalid"):
        m.requests.labels(outcome=outcome)  # every series exists from the start, at 0
    for phase in Phase:
        m.steps.labels(phase=phase)
    return m
