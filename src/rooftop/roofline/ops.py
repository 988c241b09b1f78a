"""The one op model: (model config, precision, StepShape) -> ops, each with FLOPs and bytes moved.

The analyzer's predictions and the engine's attribution both call `step_ops`; there is no second formula.
Counts are per device under tensor parallelism (the step's `tp`: weights and heads split `tp` ways, the collectives
that join them) and summed over layers.
Notation: T new tokens in the step, d hidden, hd head_dim (from the config), wb/ab/kvb bytes per
weight/activation/KV value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rooftop.config import ModelConfig
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.precision import Precision


@dataclass(frozen=True)
class SeqShape:
    """`count` sequences in a step, each bringing `new` tokens that attend to `cached` earlier ones, in `phase`
    (decided by the engine's scheduler; the op model's counts depend only on `new` and `cached`)."""

    new: int
    cached: int = 0
    needs_logits: bool = True  # a prefill chunk that does not finish its prompt samples nothing
    count: int = 1
    phase: Phase = Phase.PREFILL
    prompt_logits: int = 0  # rows whose logits give prompt tokens their logprobs (SamplingParams.prompt_logprobs)


@dataclass(frozen=True)
class StepShape:
    """A step's sequences; for a mixture-of-experts model the engine also records how many distinct experts each
    layer touched (measured, averaged over the layers), which sets the experts' weight bytes in place of the
    analyzer's expectation; and the ranks of the tensor-parallel group the step runs on (1: one device)."""

    seqs: tuple[SeqShape, ...]
    experts_touched: float | None = None
    tp: int = 1

    @classmethod
    def prefill(cls, batch: int, prompt_len: int, tp: int = 1) -> StepShape:
        return cls((SeqShape(prompt_len, count=batch),), tp=tp)

    @classmethod
    def decode(cls, batch: int, context: int, tp: int = 1) -> StepShape:
        """One new token per sequence, each attending to `context` cached tokens."""
        return cls((SeqShape(1, context, count=batch, phase=Phase.DECODE),), tp=tp)

    @property
    def num_seqs(self) -> int:
        return sum(s.count for s in self.seqs)

    @property
    def tokens(self) -> int:
        return sum(s.new * s.count for s in self.seqs)

    @property
    def logits_rows(self) -> int:
        """The lm_head's rows: one per sampling sequence, every row of a decode (a verify step of speculative
        decoding, new = 1 + its draft tokens, samples each), and the prompt rows asked for."""
        sampled = sum(s.count * (s.new if s.phase is Phase.DECODE else 1) for s in self.seqs if s.needs_logits)
        return sampled + sum(s.count * s.prompt_logits for s in self.seqs)

    @property
    def phase(self) -> Phase:
        """The step's phase: its sequences' one phase, or MIXED when prefills and decodes share it."""
        phases = {s.phase for s in self.seqs}
        return phases.pop() if len(phases) == 1 else Phase.MIXED


@dataclass(frozen=True)
class Op:
    """One kind of work in a step, summed over the layers that do it."""

    name: str
    flops: float
    bytes_read: float
    bytes_written: float
    compute: str  # which peak computes it ("fp32", "bf16", "fp8")
    # a mixed file's linears: each peak with its share of the FLOPs (WeightFormat.compute_shares); (): all at compute
    compute_shares: tuple[tuple[str, float], ...] = ()
    comm_bytes: float = 0.0  # bytes over the interconnect (all-reduces), as one device sends or receives them
    collectives: int = 0  # calls to a collective: each pays the interconnect's latency before its bytes
    # Of bytes_read + bytes_written, the activations passed between ops: an engine that fused every op would keep
    # them in cache or registers, so the step's bound counts only the rest (weights, KV cache, state).
    activation_bytes: float = 0.0

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def essential_bytes(self) -> float:
        """What even a fully fused step must move: the bytes that are not activations."""
        return self.bytes - self.activation_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    def compute_time(self, hw: Hardware) -> float:
        shares = self.compute_shares or ((self.compute, 1.0),)
        return sum(self.flops * share / hw.peak(compute) for compute, share in shares)

    def memory_time(self, hw: Hardware) -> float:
        return self.bytes / hw.memory_bandwidth

    def comm_time(self, hw: Hardware) -> float:
        """The collectives' latency (where measured: `Hardware.collective_latency_s`) plus their bytes at the
        interconnect's bandwidth."""
        if not self.comm_bytes and not self.collectives:
            return 0.0
        if not hw.interconnect_bandwidth:
            raise InvalidRequestError(
                f"{hw.name} has no interconnect bandwidth: tensor parallelism cannot be timed (on this machine, "
                "`rooftop probe --tensor-parallel-size N` measures the group's all-reduce)"
            )
        return self.collectives * (hw.collective_latency_s or 0.0) + self.comm_bytes / hw.interconnect_bandwidth

    def time(self, hw: Hardware) -> float:
        """Roofline time: the slowest of compute, memory traffic and interconnect traffic."""
        return max(self.compute_time(hw), self.memory_time(hw), self.comm_time(hw))

    def bound(self, hw: Hardware) -> str:
        times = {"compute": self.compute_time(hw), "memory": self.memory_time(hw), "interconnect": self.comm_time(hw)}
        return max(times, key=times.get)


def splits(config: ModelConfig, tp: int) -> bool:
    """Whether `tp` ranks split the model: query heads evenly, KV heads evenly or, when there are fewer KV heads than
    ranks, each replicated on tp / kv_heads ranks; a hybrid's linear-attention heads evenly; and the MLP's
    intermediate features (each expert's, a shared expert's) evenly, as the engine and vLLM cut them."""
    c, la = config, config.linear_attention
    if c.num_heads % tp or (c.num_kv_heads % tp and tp % c.num_kv_heads):
        return False
    if la and c.num_linear_attention_layers and (la.num_value_heads % tp or la.num_key_heads % tp):
        return False
    return all(features % tp == 0 for _, features in _split_features(c))


def _split_features(c: ModelConfig) -> list[tuple[str, int]]:
    """The MLP's feature counts tensor parallelism cuts, by the config's name for them."""
    if not c.is_moe:
        return [("intermediate", c.intermediate_size)]
    shared = [("shared expert intermediate", c.shared_expert_intermediate_size)]
    return [("expert intermediate", c.moe_intermediate_size), *(shared if c.shared_expert_intermediate_size else [])]


def tp_sizes(config: ModelConfig, fits: Callable[[int], bool] = lambda tp: True) -> list[int]:
    """The tensor-parallel degrees that split the model (and pass `fits`), up to its query heads."""
    return [tp for tp in range(1, config.num_heads + 1) if splits(config, tp) and fits(tp)]


def check_tp(config: ModelConfig, tp: int) -> None:
    """Heads and MLP features must split evenly; KV heads may also be replicated when there are fewer than `tp`."""
    if tp < 1:
        raise InvalidRequestError(f"tensor parallel degree must be >= 1, got {tp}")
    c = config
    if not splits(c, tp):
        heads = f"{c.num_heads} query heads, {c.num_kv_heads} KV heads"
        if c.linear_attention and c.num_linear_attention_layers:
            heads += f" ({c.linear_attention.num_key_heads} key and {c.linear_attention.num_value_heads} value heads in its linear-attention layers)"
        heads += "".join(f", {n} {name} features" for name, n in _split_features(c))
        sizes = tp_sizes(c)
        replicated = [n for n in sizes if n > c.num_kv_heads]
        replicas = (
            f" ({', '.join(map(str, replicated))}: more ranks than its {c.num_kv_heads} KV heads, each KV head "
            f"replicated on tp / {c.num_kv_heads} ranks)"
            if replicated
            else ""
        )
        raise InvalidRequestError(
            f"tensor parallel degree {tp} does not divide the model's {heads}; "
            f"valid sizes: {', '.join(map(str, sizes))}{replicas}",
            "tensor_parallel_size",
        )


# The ops' costing, for what was measured against it: a calibration's curves map each class's roofline seconds to
# measured ones, so one cached under another costing would read its points at the wrong x. Raised whenever an
# op's FLOPs, bytes or peak change (2: attention and linear attention at the activations' peak; 3: a mixed file's
# linears at each format's peak).
COSTING = 3


def _linear(name: str, tokens: int, k: float, n: float, p: Precision, layers: int = 1) -> Op:
    """Linear K -> N over T tokens: FLOPs 2TKN; bytes K·N·wb (with format overhead) + T·K·ab + T·N·ab."""
    return Op(
        name,
        flops=layers * 2 * tokens * k * n,
        bytes_read=layers * (p.weights.linear_bytes(k, n) + tokens * k * p.activation_bytes),
        bytes_written=layers * tokens * n * p.activation_bytes,
        compute=p.compute,
        compute_shares=p.weights.compute_shares,
        activation_bytes=layers * tokens * (k + n) * p.activation_bytes,
    )


def _elementwise(
    name: str,
    elements: float,
    reads: float,
    writes: float,
    flops_each: float,
    p: Precision,
    layers: int = 1,
    extra_read: float = 0,
) -> Op:
    """A memory-bound op over `elements` values, reading `reads` and writing `writes` activation tensors of that size."""
    ab = p.activation_bytes
    return Op(
        name,
        flops=layers * flops_each * elements,
        bytes_read=layers * (reads * elements * ab + extra_read),
        bytes_written=layers * writes * elements * ab,
        compute=p.compute,
        activation_bytes=layers * (reads + writes) * elements * ab,
    )


def step_ops(config: ModelConfig, p: Precision, shape: StepShape) -> list[Op]:
    """Every op of one forward step over `shape`, per device (of `shape.tp`), summed over layers."""
    tp = shape.tp
    check_tp(config, tp)
    c, T, ab = config, shape.tokens, p.activation_bytes
    d, hd = c.hidden_size, c.head_dim
    heads = c.num_heads // tp
    kv_heads = max(1, c.num_kv_heads // tp)
    n_full, n_linear, n_layers = c.num_full_attention_layers, c.num_linear_attention_layers, c.num_layers

    ops = [
        Op(
            "embedding",
            0.0,
            T * d * p.embedding_bytes_per_value / tp,
            T * d * ab,
            p.compute,
            activation_bytes=T * d * ab,
        ),
        _elementwise("norms", T * d, 1, 1, 4, p, layers=2 * n_layers + 1, extra_read=d * ab),
    ]
    if n_full:
        gate = heads * hd if c.attn_output_gate else 0
        ops.append(_linear("qkv_proj", T, d, (heads + 2 * kv_heads) * hd + gate, p, n_full))
        if c.qk_norm:
            ops.append(_elementwise("qk_norm", T * (heads + kv_heads) * hd, 1, 1, 4, p, n_full))
        ops.append(_elementwise("rope", T * (heads + kv_heads) * hd, 1, 1, 3, p, n_full, extra_read=2 * T * hd * ab))
        ops.append(_attention(shape, heads, kv_heads, hd, p, n_full))
        if c.attn_output_gate:
            ops.append(_elementwise("attn_gate", T * heads * hd, 2, 1, 5, p, n_full))
        ops.append(_linear("o_proj", T, heads * hd, d, p, n_full))
    if n_linear:
        ops.extend(_linear_attention_ops(c, shape, p, tp, n_linear))
    ops.extend(_mlp_ops(c, T, p, tp, shape.experts_touched))
    ops.append(_elementwise("residual_add", T * d, 2, 1, 1, p, 2 * n_layers))
    if shape.logits_rows:  # a step of prompt chunks that sample nothing skips the lm_head
        ops.append(_linear("lm_head", shape.logits_rows, d, c.vocab_size / tp, p.head()))
    if tp > 1:
        ops.extend(_communication(c, shape, p))
    return ops


def _communication(c: ModelConfig, shape: StepShape, p: Precision) -> list[Op]:
    """What joins the ranks in a step: the plan of the step sent to every rank (its token ids and positions), a ring
    all-reduce of the hidden states after each layer's attention and MLP (row-parallel o and down projections) and
    after the vocab-parallel embedding, each device sending and receiving 2(tp-1)/tp of them, and the sampled rows'
    float32 logits gathered to the first rank, (tp-1)/tp of the vocabulary from the others."""
    tp, T, ab = shape.tp, shape.tokens, p.activation_bytes
    reduces = 2 * c.num_layers + 1
    ops = [
        Op("plan_broadcast", 0.0, 0.0, 0.0, p.compute, comm_bytes=16 * T, collectives=1),
        Op(
            "all_reduce",
            0.0,
            0.0,
            0.0,
            p.compute,
            comm_bytes=reduces * 2 * (tp - 1) / tp * T * c.hidden_size * ab,
            collectives=reduces,
        ),
    ]
    if shape.logits_rows:
        gathered = (tp - 1) / tp * shape.logits_rows * c.vocab_size * 4
        ops.append(Op("logits_gather", 0.0, 0.0, 0.0, p.compute, comm_bytes=gathered, collectives=1))
    return ops


def _attention(shape: StepShape, heads: int, kv_heads: int, hd: int, p: Precision, layers: int) -> Op:
    """Causal attention per sequence (n new over c cached): FLOPs 4·nq·hd·n·(c + (n+1)/2);
    K/V of all c + n tokens read, of the n new ones written; q read and the output written."""
    flops = kv_read = kv_written = act = 0.0
    for s in shape.seqs:
        flops += s.count * 4 * heads * hd * s.new * (s.cached + (s.new + 1) / 2)
        kv_read += s.count * (s.cached + s.new) * 2 * kv_heads * p.kv_head_bytes(hd)
        kv_written += s.count * s.new * 2 * kv_heads * p.kv_head_bytes(hd)
        act += s.count * s.new * heads * hd * p.activation_bytes
    return Op(
        "attention",
        layers * flops,
        layers * (kv_read + act),
        layers * (kv_written + act),
        p.activation_compute,
        activation_bytes=layers * 2 * act,
    )


def _linear_attention_ops(c: ModelConfig, shape: StepShape, p: Precision, tp: int, layers: int) -> list[Op]:
    """Gated DeltaNet: projections, a short causal conv, and a recurrent state per sequence that every step
    reads and writes once (its size does not grow with the context)."""
    la, T, ab, sb = c.linear_attention, shape.tokens, p.activation_bytes, p.state_bytes
    nk, nv = la.num_key_heads // tp, la.num_value_heads // tp
    channels = 2 * nk * la.key_head_dim + nv * la.value_head_dim
    state = nv * la.key_head_dim * la.value_head_dim
    conv_state = (la.conv_kernel_dim - 1) * channels
    B = shape.num_seqs
    return [
        _linear("linear_in_proj", T, c.hidden_size, channels + nv * la.value_head_dim + 2 * nv, p, layers),
        Op(
            "linear_conv",
            flops=layers * 2 * la.conv_kernel_dim * channels * T,
            bytes_read=layers * (T * channels * ab + B * conv_state * ab + la.conv_kernel_dim * channels * ab),
            bytes_written=layers * (T * channels * ab + B * conv_state * ab),
            compute=p.activation_compute,
            activation_bytes=layers * 2 * T * channels * ab,
        ),
        Op(
            "linear_recurrence",  # per token and value head: decay, k·S, rank-1 update, q·S ≈ 8·dk·dv
            flops=layers * 8 * state * T,
            bytes_read=layers * (B * state * sb + T * channels * ab),
            bytes_written=layers * (B * state * sb + T * nv * la.value_head_dim * ab),
            compute=p.activation_compute,
            activation_bytes=layers * T * (channels + nv * la.value_head_dim) * ab,
        ),
        _elementwise("linear_gated_norm", T * nv * la.value_head_dim, 2, 1, 6, p, layers),
        _linear("linear_out_proj", T, nv * la.value_head_dim, c.hidden_size, p, layers),
    ]


def expected_experts_touched(num_experts: int, top_k: int, tokens: int) -> float:
    """Experts hit at least once when each of `tokens` picks top_k of num_experts uniformly: E·(1 − (1 − k/E)^T)."""
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def _mlp_ops(c: ModelConfig, T: int, p: Precision, tp: int, touched: float | None = None) -> list[Op]:
    d, L = c.hidden_size, c.num_layers
    if not c.is_moe:
        ff = c.intermediate_size / tp
        return [
            _linear("gate_up_proj", T, d, 2 * ff, p, L),
            _elementwise("silu_mul", T * ff, 2, 1, 5, p, L),
            _linear("down_proj", T, ff, d, p, L),
        ]
    E, k, ff = c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size / tp
    if touched is None:
        touched = expected_experts_touched(E, k, T)
    routed = T * k  # token-expert pairs: the FLOPs follow them, the weight bytes follow the experts touched
    ab = p.activation_bytes
    ops = [
        _linear("router", T, d, E, p, L),
        Op(
            "experts_gate_up",
            flops=L * 2 * routed * d * 2 * ff,
            bytes_read=L * (touched * p.weights.linear_bytes(d, 2 * ff) + routed * d * ab),
            bytes_written=L * routed * 2 * ff * ab,
            compute=p.compute,
            compute_shares=p.weights.compute_shares,
            activation_bytes=L * routed * (d + 2 * ff) * ab,
        ),
        _elementwise("experts_silu_mul", routed * ff, 2, 1, 5, p, L),
        Op(
            "experts_down",
            flops=L * 2 * routed * ff * d,
            bytes_read=L * (touched * p.weights.linear_bytes(ff, d) + routed * ff * ab),
            bytes_written=L * routed * d * ab,
            compute=p.compute,
            compute_shares=p.weights.compute_shares,
            activation_bytes=L * routed * (ff + d) * ab,
        ),
    ]
    if c.shared_expert_intermediate_size:
        sff = c.shared_expert_intermediate_size / tp
        ops += [_linear("shared_gate_up", T, d, 2 * sff, p, L), _linear("shared_down", T, sff, d, p, L)]
    return ops


@dataclass(frozen=True)
class ParameterCount:
    total: int
    embedding: int  # input embeddings plus an untied lm_head
    active: int  # per token: MoE counts only the routed top-k experts

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def _matrices(c: ModelConfig) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """Every weight matrix as (K, N, how many): all of them, and those one token uses (MoE: top-k experts)."""
    d, hd = c.hidden_size, c.head_dim
    shared: list[tuple[int, int, int]] = []
    n_full, n_linear, L = c.num_full_attention_layers, c.num_linear_attention_layers, c.num_layers
    if n_full:
        gate = c.q_size if c.attn_output_gate else 0
        shared += [(d, c.q_size + gate + 2 * c.num_kv_heads * hd, n_full), (c.q_size, d, n_full)]
    if n_linear:
        la = c.linear_attention
        channels = la.conv_channels
        shared += [(d, channels + la.num_value_heads * la.value_head_dim + 2 * la.num_value_heads, n_linear)]
        shared += [(la.num_value_heads * la.value_head_dim, d, n_linear)]
    if not c.is_moe:
        mlp = [(d, 2 * c.intermediate_size, L), (c.intermediate_size, d, L)]
        return shared + mlp, shared + mlp
    shared.append((d, c.num_experts, L))
    if c.shared_expert_intermediate_size:
        sff = c.shared_expert_intermediate_size
        shared += [(d, 2 * sff, L), (sff, d, L)]
    return shared + _experts(c, c.num_experts), shared + _experts(c, c.num_experts_per_tok)


def _experts(c: ModelConfig, n: int) -> list[tuple[int, int, int]]:
    """`n` routed experts' matrices in every layer, as (K, N, how many)."""
    d, ff = c.hidden_size, c.moe_intermediate_size
    return [(d, 2 * ff, c.num_layers * n), (ff, d, c.num_layers * n)]


def matrix_weights(c: ModelConfig) -> int:
    """Weights of every block matrix (no embeddings, no norms): what a mixed file's mean bits are taken over."""
    every, _ = _matrices(c)
    return sum(k * n * m for k, n, m in every)


def _small_params(c: ModelConfig) -> int:
    """Norm weights, q/k norms, conv kernels, DeltaNet decay/bias vectors: tiny, counted for honest totals."""
    n = (2 * c.num_layers + 1) * c.hidden_size
    if c.qk_norm:
        n += 2 * c.head_dim * c.num_full_attention_layers
    if c.num_linear_attention_layers:
        la = c.linear_attention
        per_layer = la.conv_channels * la.conv_kernel_dim + 2 * la.num_value_heads + la.value_head_dim
        n += per_layer * c.num_linear_attention_layers
    if c.attention_bias:
        n += (c.q_size + 2 * c.kv_size) * c.num_full_attention_layers
    return n


def parameter_count(c: ModelConfig) -> ParameterCount:
    embedding = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    _, active = _matrices(c)
    small = _small_params(c)
    total = embedding + small + matrix_weights(c)
    return ParameterCount(
        total=total, embedding=embedding, active=embedding + small + sum(k * n * m for k, n, m in active)
    )


def weight_bytes(c: ModelConfig, p: Precision, per_token: bool = False) -> float:
    """Bytes of all weights at precision `p`: the embedding table and the lm_head in their own formats (a
    quantized checkpoint keeps them in floats), norms at activation width. A tied lm_head is the table only where it
    is held in the table's format (`shares_table`): in another (a Q6_K table beside a Q8_0 lm_head under int4) the
    engine holds both. `per_token`: what one token's decode step reads of them: of a mixture of experts' routed
    experts only the top k a token uses, and of a table that is not the lm_head only the token's own row."""
    every, active = _matrices(c)
    matrices = sum(m * p.weights.linear_bytes(k, n) for k, n, m in (active if per_token else every))
    shared = shares_table(c, p)
    head = 0 if shared else p.head().weights.linear_bytes(c.hidden_size, c.vocab_size)
    table = c.hidden_size * p.embedding_bytes_per_value if per_token and not shared else table_bytes(c, p)
    return matrices + table + head + _small_params(c) * p.activation_bytes


def shares_table(c: ModelConfig, p: Precision) -> bool:
    """Whether the lm_head is the embedding table: tied and held in the table's format (quant.linear.
    embedding_table); then the head's read is the whole table's."""
    return c.tie_word_embeddings and p.head().weights == p.embedding_format


def table_bytes(c: ModelConfig, p: Precision) -> float:
    """Bytes of the input embedding table in its format."""
    return p.embedding_format.linear_bytes(c.hidden_size, c.vocab_size)


def expert_bytes(c: ModelConfig, p: Precision) -> float:
    """Bytes of every routed expert's matrices (0 for a dense model): what the expert ops read when a step's tokens
    are routed to all of them."""
    if not c.is_moe:
        return 0.0
    return sum(m * p.weights.linear_bytes(k, n) for k, n, m in _experts(c, c.num_experts))


def kv_bytes_per_token(c: ModelConfig, p: Precision) -> float:
    """2 (K and V) · full-attention layers · KV heads · (head_dim · bytes per value + a quantized cache's scale)."""
    return 2 * c.num_full_attention_layers * c.num_kv_heads * p.kv_head_bytes(c.head_dim)


def state_bytes_per_sequence(c: ModelConfig, p: Precision) -> float:
    """Linear-attention recurrent state plus conv state of one sequence: fixed, whatever the context length."""
    if not c.num_linear_attention_layers:
        return 0.0
    la = c.linear_attention
    per_layer = la.state_elements * p.state_bytes + (la.conv_kernel_dim - 1) * la.conv_channels * p.activation_bytes
    return c.num_linear_attention_layers * per_layer


def activation_bytes(c: ModelConfig, p: Precision, tokens: int, logits_rows: int, tp: int = 1) -> float:
    """The working set of one forward step over `tokens` tokens on one device, beside the weights and the KV cache:
    the residual stream and its normed copy (2·T·d, whole on every device), the widest intermediate of a layer
    (split tp ways): the MLP's gate_up output and its silu·mul (3·T·ff; MoE: of the T·k routed pairs), full
    attention's q, k, v (and gate) or the linear attention's in_proj output, at the activations' width, and the
    sampled rows' logits in fp32. Layers run one after another, so one layer's intermediates are live at a time;
    attention scores are never held whole (flash attention)."""
    widths = [3 * (c.num_experts_per_tok * c.moe_intermediate_size if c.is_moe else c.intermediate_size)]
    if c.num_full_attention_layers:
        widths.append(c.q_size * (2 if c.attn_output_gate else 1) + 2 * c.kv_size)
    if c.num_linear_attention_layers:
        la = c.linear_attention
        widths.append(la.conv_channels + la.num_value_heads * (la.value_head_dim + 2))
    per_token = (2 * c.hidden_size + max(widths) / tp) * p.activation_bytes
    return tokens * per_token + logits_rows * c.vocab_size / tp * 4
