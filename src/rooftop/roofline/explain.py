"""`rooftop explain`: the two-phase story in plain words, with one model's numbers on one device."""

from __future__ import annotations

from rooftop.config import ModelConfig
from rooftop.roofline.ops import expert_bytes, shares_table, table_bytes
from rooftop.roofline.precision import Precision
from rooftop.roofline.predict import Prediction, StepTime, device_kv_share
from rooftop.roofline.report import NO_DECODE, decode_lever, seconds, si, weight_formats
from rooftop.roofline.speculative import predict_speculative

TYPICAL_DRAFTS, TYPICAL_ACCEPTANCE = 4, 0.7  # what "speculative decoding would help" is judged at
CACHE_OPS = {"attention", "linear_conv", "linear_recurrence"}  # what reads and writes the KV cache and the state
EXPERT_OPS = ("experts_gate_up", "experts_down")  # what reads the routed experts' matrices


def weights_read(step: StepTime, pred: Prediction, config: ModelConfig, p: Precision) -> str:
    """The weights a step reads, from its costed bytes (those no fusion avoids, less the cache's): every one, or
    how much of them and why not all, each reason where it holds: a mixture of experts whose tokens are routed to
    some of its experts reads only those; an embedding table that is not also the lm_head gives one row per token."""
    read = step.essential_bytes - sum(op.essential_bytes for op in step.ops if op.name in CACHE_OPS)
    held = pred.weight_bytes / pred.tp
    if read >= 0.999 * held:
        return f"every weight ({si(held, 'B')})"
    essential = {op.name: op.essential_bytes for op in step.ops}
    why = []
    if sum(essential.get(name, 0.0) for name in EXPERT_OPS) < 0.999 * expert_bytes(config, p) / pred.tp:
        why.append(
            f"of the experts only those its tokens are routed to, {config.num_experts_per_tok} of "
            f"{config.num_experts} per token in each layer"
        )
    if not shares_table(config, p) and essential["embedding"] < 0.999 * table_bytes(config, p) / pred.tp:
        why.append("of the embedding table one row per token")
    return f"{si(read, 'B')} of the {si(held, 'B')} of weights" + (f" ({'; '.join(why)})" if why else "")


def explain(pred: Prediction, config: ModelConfig, p: Precision) -> str:
    s, prefill, hw = pred.prompt_len, pred.prefill, pred.hw
    d = pred.decode_first
    kv_per_token = pred.kv_bytes_per_token * device_kv_share(config, pred.tp)  # one device's, as every number here
    kv_prompt = kv_per_token * s
    peak = si(prefill.flops / prefill.compute_time_s if prefill.compute_time_s else 0, "FLOP/s")
    bandwidth = si(hw.memory_bandwidth, "B/s")
    if hw.working_set is not None:
        bandwidth += f" (this machine's read of {si(hw.working_set, 'B')}, the model's weights)"
    cache = "the KV cache" + (" and recurrent state" if pred.state_bytes_per_sequence else "")
    cache_bytes = sum(op.essential_bytes for op in d.ops if op.name in CACHE_OPS)
    split = (
        f", split over {pred.tp} of them (tensor parallel: each holds and reads 1/{pred.tp} of the weights and does "
        f"1/{pred.tp} of the math, and all-reduces join their parts twice a layer; every number below is one device's)"
        if pred.tp > 1
        else ""
    )
    lines = [
        f"{pred.model} on {hw.name}{split} (weights {weight_formats(pred)}, {pred.parameters.total / 1e9:.3g}B "
        "parameters):",
        "",
        f"1. Your prompt becomes {s} tokens.",
        f"2. Prefill pushes all {s} tokens through the model in one pass. It reads {weights_read(prefill, pred, config, p)} "
        f"once and does {si(prefill.flops, 'FLOP')} of math: {prefill.intensity:.3g} FLOPs per byte moved, against this "
        f"device's ridge point of {pred.ridge_point_flops_per_byte:.3g}. So prefill is {prefill.bound}-bound: "
        f"{seconds(prefill.compute_time_s)} of math at {peak}, {seconds(prefill.memory_time_s)} of memory traffic at {bandwidth}.",
        f"3. Prefill leaves the KV cache holding {si(kv_prompt, 'B')} ({si(kv_per_token, 'B')} per token)"
        + (
            f", plus {si(pred.state_bytes_per_sequence / pred.tp, 'B')} of recurrent state per sequence that never "
            "grows"
            if pred.state_bytes_per_sequence
            else ""
        )
        + ".",
        _decode_step(pred, weights_read(d, pred, config, p), f"{cache} ({si(cache_bytes, 'B')})"),
        _times(pred),
    ]
    decode_x = pred.decode_compute_bound_from_batch
    lines.append(
        "6. Why batching helps decode: the weights are read once per step whatever the batch, so "
        + (
            f"up to about {decode_x} sequences share each step almost for free before the math catches up."
            if decode_x
            else "more sequences share each read; with this context, each sequence's own KV reads keep decode memory-bound at any batch."
        )
    )
    prefill_x = pred.prefill_compute_bound_from_tokens
    if prefill_x:
        lines.append(
            f"7. Prompts from about {prefill_x} tokens on are compute-bound in prefill; shorter ones are limited by reading the weights."
        )
    decode = (
        "memory-bound by the last token: "
        + decode_lever(
            pred.decode_last.kv_share,
            pred.kv_bytes_per_value,
            pred.batch,
            p.weights.bits_per_weight(),
            speculation_helps(pred, config, p),
        )
        + " (fewer bytes do not cut prefill's math)"
        if pred.decode_last.bound == "memory"
        else f"{d.bound}-bound at this batch, so fewer FLOPs per token (a smaller batch per step) or a faster "
        "matmul format would"
    )
    lines.append(
        "What would move "
        + ("prefill: it is " if pred.tpot_s is None else f"each phase: decode is {decode}; prefill is ")
        + (
            "compute-bound, so a faster matmul format (bf16 or fp8 where the device multiplies it) or a larger chunk."
            if prefill.bound == "compute"
            else "memory-bound at this prompt length, so longer prompts or more of them per step share the weights' read."
        )
    )
    return "\n".join(lines)


def _decode_step(pred: Prediction, weights: str, cache: str) -> str:
    """Step 4: what a decode step reads and so what bounds it; for one output token, which no decode step follows,
    what a second token's step would."""
    d = pred.decode_first
    reads = f"{weights} again plus {cache}: {si(d.bytes, 'B')} for {si(d.flops, 'FLOP')}, only {d.intensity:.3g} FLOPs per byte"
    if pred.tpot_s is None:
        return (
            f"4. One output token needs no decode step; a second would make one token per sequence, reading {reads}. "
            f"So decode would be {d.bound}-bound."
        )
    return f"4. Each decode step makes one token per sequence. It must read {reads}. So decode is {d.bound}-bound."


def _times(pred: Prediction) -> str:
    """Step 5: TTFT and TPOT, their bounds and, where published, what engines reach."""
    expected = pred.expected_ttft_s is not None
    if pred.tpot_s is None:
        return (
            f"5. So TTFT ≈ {seconds(pred.ttft_s)} (the prefill step), and TPOT is {NO_DECODE}. No engine beats "
            f"{seconds(pred.ttft_bound_s)} here (the bound: every op fused)"
            + (f"; engines as published reach about {seconds(pred.expected_ttft_s)}." if expected else ".")
        )
    return (
        f"5. So TTFT ≈ {seconds(pred.ttft_s)} (the prefill step) and TPOT ≈ {seconds(pred.decode_first.time_s)} per "
        f"token at first, {seconds(pred.decode_last.time_s)} by the last of {pred.output_len} tokens as the cache "
        f"grows. No engine beats {seconds(pred.ttft_bound_s)} and {seconds(pred.tpot_bound_s)} here (the bound: "
        "every op fused)"
        + (
            f"; engines as published reach about {seconds(pred.expected_ttft_s)} and {seconds(pred.expected_tpot_s)}."
            if expected and pred.expected_tpot_s is not None
            else "."
        )
    )


def speculation_helps(pred: Prediction, config: ModelConfig, p: Precision) -> bool:
    """Whether speculative decoding is a lever here: the engine runs it on this model, and a verify step of
    TYPICAL_DRAFTS drafts accepted at TYPICAL_ACCEPTANCE beats plain decode steps (a mixture of experts' verify step
    reads the experts of all its tokens, which can cost more than the tokens it yields)."""
    if not config.can_speculate or pred.tpot_s is None:
        return False
    context = pred.prompt_len + pred.output_len // 2
    spec = predict_speculative(config, p, pred.hw, TYPICAL_DRAFTS, TYPICAL_ACCEPTANCE, context, pred.batch, pred.tp)
    return spec.speedup > 1
