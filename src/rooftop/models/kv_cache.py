"""The paged KV cache: one preallocated pool of fixed-size blocks, and the attention metadata of a step. Its layout
belongs to the model; the engine only hands out blocks (engine/block_manager.py).

Token position p of a sequence lives at slot `table[p // block_size] * block_size + p % block_size` of the
pool; attention gathers a sequence's slots back into order, so it sees exactly what a contiguous cache holds.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from rooftop.config import ModelConfig
from rooftop.enums import Phase
from rooftop.kernels import pages


class KVPool:
    """K and V of every full-attention layer: (layers, num_blocks * block_size, kv_heads, head_dim) each; and for a
    hybrid model the linear-attention layers' per-sequence states (`states`, one slot per running sequence).

    With a quantized `dtype` (torch.int8, torch.float8_e4m3fn: QUANTIZED_KV) the pool holds each head's K and V
    rotated (rotate_heads) in those values and, beside them at the same slot, a float32 scale per (slot, kv head)
    (`k_scale`, `v_scale`: (layers, slots, kv_heads)); `k_layers`/`v_layers` are then ScaledPool views that quantize
    what is written and dequantize only the rows gathered."""

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        state_slots: int = 1,
        act_dtype: torch.dtype = torch.float32,  # what a quantized pool's gathered rows are dequantized to
    ):
        shape = (config.num_full_attention_layers, num_blocks * block_size, config.num_kv_heads, config.head_dim)
        self.dtype = dtype
        self.k = pages.zeros(shape, dtype, device)  # memory taken as tokens are written, not all at the start
        self.v = pages.zeros(shape, dtype, device)
        self.num_blocks, self.block_size = num_blocks, block_size
        if dtype in QUANTIZED_KV:
            self.k_scale = pages.zeros(shape[:-1], torch.float32, device)
            self.v_scale = pages.zeros(shape[:-1], torch.float32, device)
            layers = range(shape[0])
            self.k_layers = tuple(ScaledPool(self.k[i], self.k_scale[i], act_dtype) for i in layers)
            self.v_layers = tuple(ScaledPool(self.v[i], self.v_scale[i], act_dtype) for i in layers)
        elif dtype != act_dtype:  # a float cache narrower (or wider) than the activations: cast on write and read
            self.k_scale = self.v_scale = None
            self.k_layers = tuple(CastPool(k, act_dtype) for k in self.k.unbind(0))
            self.v_layers = tuple(CastPool(v, act_dtype) for v in self.v.unbind(0))
        else:
            self.k_scale = self.v_scale = None
            self.k_layers, self.v_layers = (
                self.k.unbind(0),
                self.v.unbind(0),
            )  # views, made once: decode reads them per layer
        self.states = StatePool(config, state_slots, device) if config.num_linear_attention_layers else None

    @functools.cached_property
    def kernel_layers(self) -> tuple[list, list, list, list]:
        """Every layer's K and V values as the decode kernels take them, and their scales (None but for a quantized
        pool): unpacked once per pool, for a decode step run in one call (models/decode_call.py)."""
        ks, vs = [kernel_view(k) for k in self.k_layers], [kernel_view(v) for v in self.v_layers]
        return [k for k, _ in ks], [v for v, _ in vs], [s for _, s in ks], [s for _, s in vs]

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        layers = config.num_full_attention_layers
        return 2 * layers * block_size * config.num_kv_heads * KVPool.bytes_per_head(config.head_dim, dtype)

    @staticmethod
    def bytes_per_head(head_dim: int, dtype: torch.dtype) -> int:
        """Stored bytes of one token's K (or V) in one KV head: its values, and a quantized pool's float32 scale."""
        return head_dim * dtype.itemsize + (4 if dtype in QUANTIZED_KV else 0)

    @property
    def nbytes(self) -> int:
        scales = self.k_scale.nbytes + self.v_scale.nbytes if self.k_scale is not None else 0
        return self.k.nbytes + self.v.nbytes + scales + (self.states.nbytes if self.states else 0)


# --kv-cache-dtype's names (vLLM's) for what the pool stores; auto is the model's dtype
KV_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.int8,
    "fp8_e4m3": torch.float8_e4m3fn,
}
# the quantized ones and their largest stored value: x is stored as x / scale with scale = max|x| / largest per
# (slot, KV head); e4m3's largest finite value is 448
QUANTIZED_KV = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}


def kv_storage_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's storage dtype for EngineConfig.kv_cache_dtype `name` (validated there): auto is the model's dtype;
    a float dtype other than the model's is stored as named and cast on write and on each gathered read."""
    return model_dtype if name == "auto" else KV_DTYPES[name]


def kv_dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, d in KV_DTYPES.items() if d == dtype)


def rotate_heads(x: torch.Tensor) -> torch.Tensor:
    """x (..., hd) float32 times the normalized Walsh-Hadamard matrix, blockwise over hd's largest power-of-two
    divisor (all of a 64- or 128-wide head; blocks of 16 for 48). Orthonormal and symmetric, so its own inverse and
    q . k = rotated q . rotated k. A quantized pool stores each head's K and V rotated: the rotation spreads the few
    channels that dwarf the rest (RoPE's slow pairs in the keys) over the whole head, so that one scale per head no
    longer spends its steps on them (what that did to int8's and e4m3's accuracy: docs/BENCHMARKS.md). The
    butterflies run in the decode kernel's order (attention.cpp, rotate_heads): the same bits."""
    dim = x.shape[-1]
    n, lead = dim & -dim, x.shape[:-1]
    h = 1
    while h < n:
        pairs = x.reshape(*lead, dim // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return x.reshape(*lead, dim) * (1 / math.sqrt(n))


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """As the pool stores it: x (..., hd) rotated (rotate_heads), then symmetric over the last dim -> (values
    (..., hd) of `dtype` (int8 or float8_e4m3fn), scale (...) float32), scale = max|rotated x| / largest (0 for an
    all-zero row), values rotated x / scale clamped to +-largest, then rounded to nearest (even) in the format. The
    C++ decode kernel quantizes the same way (kernels/attention.cpp, write_new)."""
    largest = QUANTIZED_KV[dtype]
    x = rotate_heads(x.float())
    scale = x.abs().amax(-1) / largest
    q = (x / scale.masked_fill(scale == 0, 1)[..., None]).clamp_(-largest, largest)
    return (q.round_() if dtype == torch.int8 else q).to(dtype), scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values quantize_kv stored, times their scales, rotated back."""
    return rotate_heads(q.float() * scale[..., None]).to(dtype)


class StoredPool:
    """What attention asks of a layer's pool tensor beside `index_copy_` and `index_select`: the stored values'
    shape and device (the pools that store another dtype than the activations')."""

    values: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def device(self) -> torch.device:
        return self.values.device


class CastPool(StoredPool):
    """One layer's float K (or V) stored in another float dtype than the activations': cast on the way in, and the
    gathered rows only cast back (`index_select`), like ScaledPool."""

    def __init__(self, values: torch.Tensor, dtype: torch.dtype):
        self.values, self.dtype = values, dtype

    def index_copy_(self, dim: int, slots: torch.Tensor, x: torch.Tensor) -> CastPool:
        self.values.index_copy_(dim, slots, x.to(self.values.dtype))
        return self

    def index_select(self, dim: int, slots: torch.Tensor) -> torch.Tensor:
        return self.values.index_select(dim, slots).to(self.dtype)


class ScaledPool(StoredPool):
    """One layer's quantized K (or V), int8 or fp8 e4m3 values with their scales, (slots, kv_heads, hd) + (slots,
    kv_heads): written and gathered like a float pool tensor (`index_copy_`, `index_select`), so attention's PyTorch
    path takes it unchanged. The values move as bytes: PyTorch's CPU index_copy_ has no float8 kernel."""

    def __init__(self, values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32):
        self.values, self.scale = values, scale
        self.dtype = dtype  # what index_select gives
        self._bytes = values.view(torch.uint8)

    def index_copy_(self, dim: int, slots: torch.Tensor, x: torch.Tensor) -> ScaledPool:
        q, scale = quantize_kv(x, self.values.dtype)
        self._bytes.index_copy_(dim, slots, q.view(torch.uint8))
        self.scale.index_copy_(dim, slots, scale)
        return self

    def index_select(self, dim: int, slots: torch.Tensor) -> torch.Tensor:
        values = self._bytes.index_select(dim, slots).view(self.values.dtype)
        return dequantize_kv(values, self.scale.index_select(dim, slots), self.dtype)


def kernel_view(layer: torch.Tensor | StoredPool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A layer's K or V pool as decode attention's kernel takes it: the values as stored (bfloat16 / float16 rounded,
    int8 / fp8 quantized on the way in) and the quantized pools' scales."""
    values = layer.values if isinstance(layer, StoredPool) else layer
    return values, layer.scale if isinstance(layer, ScaledPool) else None


class StatePool:
    """Gated DeltaNet layers' per-sequence state, float32, one slot per running sequence (the scheduler hands them
    out): the convolution's last K - 1 inputs (layers, slots, channels, K - 1) and the recurrent state (layers,
    slots, value heads, key dim, value dim). Constant in the context length, unlike the KV cache. On the CPU its
    memory is given as slots are first written, as the KV pool's: a Qwen3.6-27B's 64 slots are 9.7 GB, which
    torch.zeros wrote over at the start beside the 17 GB of its weights."""

    def __init__(self, config: ModelConfig, slots: int, device: torch.device):
        la, layers = config.linear_attention, config.num_linear_attention_layers
        self.conv = pages.zeros((layers, slots, la.conv_channels, la.conv_kernel_dim - 1), torch.float32, device)
        self.recurrent = pages.zeros(
            (layers, slots, la.num_value_heads, la.key_head_dim, la.value_head_dim), torch.float32, device
        )
        self.slots = slots

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.recurrent.nbytes


@dataclass
class PrefillChunk:
    """Rows start:end of the step's tokens belong to one sequence that already has `cached` tokens."""

    start: int
    end: int
    cached: int
    slots: torch.Tensor  # (cached + new,) pool slots of positions 0 .. cached + new - 1
    state_slot: int = 0  # its linear-attention state (hybrid models), zeroed before a chunk with cached == 0


@dataclass
class AttentionMetadata:
    """A step's rows are its prefill chunks' tokens, then one row per decode: every decode runs the same decode
    attention whatever shares its step."""

    slot_mapping: torch.Tensor  # (T,) where each new token's K/V is written
    prefills: list[PrefillChunk]
    block_size: int = 16
    num_prefill_rows: int = 0  # rows 0 .. num_prefill_rows - 1 are prefill tokens; the rest are decodes
    decode_tables: torch.Tensor | None = None  # (B, blocks) block tables of the decode sequences, padded with 0
    decode_lengths: torch.Tensor | None = None  # (B,) tokens in each decode sequence's cache, the new one included
    # PyTorch's attention attends each decode over its own keys, not padded to the step's longest: its flash kernel
    # rounds a row differently once the padding spans another block of keys (bfloat16, measured)
    decodes_alone: bool = True
    decode_state_slots: torch.Tensor | None = None  # (B,) each decode's linear-attention state slot (hybrid models)

    @property
    def has_decodes(self) -> bool:
        return self.decode_lengths is not None

    @functools.cached_property
    def decode_slots(self) -> torch.Tensor:
        """(B, S) pool slots of each decode sequence's tokens, S the longest; padding reads slot 0 (masked out)."""
        width = int(self.decode_lengths.max())
        slots = table_slots(self.decode_tables, self.block_size)[:, :width]
        return (slots if self.decode_mask is None else slots.masked_fill(~self.decode_mask[:, 0, 0, :], 0)).contiguous()

    @functools.cached_property
    def decode_own_slots(self) -> list[torch.Tensor]:
        """Each decode sequence's pool slots, exactly its own length (for `decodes_alone`); made once per step."""
        slots = table_slots(self.decode_tables, self.block_size)
        return [slots[b, :length] for b, length in enumerate(self.decode_lengths.tolist())]

    @functools.cached_property
    def decode_mask(self) -> torch.Tensor | None:
        """(B, 1, 1, S) True where a slot is a real token; None when no sequence is padded."""
        width = int(self.decode_lengths.max())
        if bool((self.decode_lengths == width).all()):
            return None
        valid = torch.arange(width, device=self.decode_lengths.device) < self.decode_lengths[:, None]
        return valid[:, None, None, :]


def table_slots(table: torch.Tensor, block_size: int) -> torch.Tensor:
    """Every pool slot of block tables (..., blocks), position order: (..., blocks * block_size)."""
    slots = table[..., None] * block_size + torch.arange(block_size)
    return slots.flatten(-2)


@dataclass(frozen=True)
class AttentionSeq:
    """One sequence of a step as attention sees it: its blocks, its cached and new tokens, and the phase the
    scheduler gave it (a decode brings one token, a verify step's decode one per draft token more)."""

    block_table: list[int]
    cached: int
    new: int
    phase: Phase
    state_slot: int = 0  # where a hybrid model keeps its linear-attention state (the scheduler's slot)


def build_metadata(
    seqs: list[AttentionSeq], block_size: int, device: torch.device, batch_invariant: bool = True
) -> AttentionMetadata:
    """Metadata for a step over `seqs`, in row order: every prefill before every decode; with `batch_invariant`,
    PyTorch's attention attends each decode alone.

    Decodes take the batched decode path; prefill chunks are attended one sequence at a time. Four small tensors
    for a decode step whatever the batch and context (it runs on every step, whose whole budget is ~12 ms); the
    padded slot lists and mask that PyTorch's attention needs are derived from them only if that path asks.
    """
    slot_mapping, prefills, decodes = [], [], []
    row = 0
    for s in seqs:
        table, cached, new = s.block_table, s.cached, s.new
        slot_mapping += [table[p // block_size] * block_size + p % block_size for p in range(cached, cached + new)]
        if s.phase is Phase.DECODE:
            if cached < 1:
                raise ValueError(f"a decode comes after a non-empty cache, not after {cached} tokens")
            # a verify step's rows are decodes of their own, row i attending the cache and rows 0..i: exactly
            # what decoding them one step each computes (decode attention writes every row's K/V first)
            decodes += [(row + i, table, cached + i + 1, s.state_slot) for i in range(new)]
        else:
            if decodes:
                raise ValueError("a step lays out its prefill chunks before its decodes")
            slots = table_slots(torch.tensor(table[: -(-(cached + new) // block_size)]), block_size)
            prefills.append(PrefillChunk(row, row + new, cached, slots[: cached + new].to(device), s.state_slot))
        row += new
    num_prefill_rows = prefills[-1].end if prefills else 0
    meta = AttentionMetadata(
        torch.tensor(slot_mapping, device=device), prefills, block_size, num_prefill_rows, decodes_alone=batch_invariant
    )
    if decodes:
        blocks = -(-max(length for _, _, length, _ in decodes) // block_size)
        meta.decode_tables = torch.tensor(
            [t[:blocks] + [0] * (blocks - len(t[:blocks])) for _, t, _, _ in decodes], device=device
        )
        meta.decode_lengths = torch.tensor([length for _, _, length, _ in decodes], device=device)
        meta.decode_state_slots = torch.tensor([slot for _, _, _, slot in decodes], device=device)
    return meta


class KVCache:
    """One sequence's own small pool, for running the model on a single sequence outside the engine."""

    def __init__(
        self,
        config: ModelConfig,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
        block_size: int = 16,
        kv_dtype: torch.dtype | None = None,  # the pool's storage (QUANTIZED_KV: quantized); default: dtype
    ):
        num_blocks = -(-capacity // block_size)
        self.pool = KVPool(config, num_blocks, block_size, kv_dtype or dtype, torch.device(device), act_dtype=dtype)
        self.table = list(range(num_blocks))
        self.capacity = capacity

    def metadata(self, start: int, new: int, phase: Phase = Phase.PREFILL) -> AttentionMetadata:
        if start + new > self.capacity:
            raise ValueError(f"KV cache of {self.capacity} tokens cannot hold position {start + new - 1}")
        return build_metadata([AttentionSeq(self.table, start, new, phase)], self.pool.block_size, self.pool.k.device)
