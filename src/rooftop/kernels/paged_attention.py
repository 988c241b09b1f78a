"""Triton kernels for the paged KV cache on CUDA: writing a step's K/V into the pool, and decode attention straight
from the pool's blocks (PyTorch has no paged attention: its SDPA needs each sequence's keys gathered and padded,
and padding to a per-step width needs the width on the host, a sync inside the forward pass).

Decode attention is split-K ("flash decoding"): program (b, h, s) of a grid (decodes, KV heads, splits) runs an
online softmax over the pages s, s + splits, s + 2·splits ... of sequence b for the query heads that share KV head
h, and a second kernel merges the splits' partial results. The grid depends only on the batch, the heads and the
block table's width, all known on the host, so a CUDA graph captures it once per batch size; a split with no page
(a short sequence, or a padded row of length 0) writes an empty partial that the merge weighs by zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# enough programs in flight to keep every multiprocessor streaming K/V: splits are added until the grid has this
# many programs per multiprocessor (a long context at batch 1 would otherwise run on KV-heads programs)
PROGRAMS_PER_SM = 2


@triton.jit
def _store_kv(k, v, k_pool, v_pool, slots, stride_k, stride_v, stride_slot, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """Row t's K and V (kv_heads · head_dim contiguous values each) into pool slot slots[t]; a negative slot (a
    padded row of a captured decode) writes nothing."""
    t = tl.program_id(0)
    slot = tl.load(slots + t).to(tl.int64)  # pool offsets pass 2**31 elements in a large pool
    if slot >= 0:
        offs = tl.arange(0, BLOCK)
        mask = offs < WIDTH
        tl.store(k_pool + slot * stride_slot + offs, tl.load(k + t * stride_k + offs, mask=mask), mask=mask)
        tl.store(v_pool + slot * stride_slot + offs, tl.load(v + t * stride_v + offs, mask=mask), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor) -> None:
    """k, v: (T, kv_heads, head_dim), each row's heads contiguous; pools: (slots, kv_heads, head_dim) contiguous."""
    rows, kv_heads, head_dim = k.shape
    for t in (k, v):
        if t.stride(2) != 1 or t.stride(1) != head_dim:
            raise ValueError("store_kv takes rows whose kv_heads x head_dim values are contiguous")
    if not (k_pool.is_contiguous() and v_pool.is_contiguous()):
        raise ValueError("store_kv writes into contiguous pools")
    width = kv_heads * head_dim
    if rows:
        _store_kv[(rows,)](
            k,
            v,
            k_pool,
            v_pool,
            slots,
            k.stride(0),
            v.stride(0),
            k_pool.stride(0),
            width,
            triton.next_power_of_2(width),
        )


@triton.jit
def _decode_split(
    q,  # (B, heads, head_dim)
    k_pool,  # (slots, kv_heads, head_dim)
    v_pool,
    tables,  # (B, table width) block ids
    lengths,  # (B,) tokens in each sequence's cache, its new token included
    part_acc,  # (B, kv_heads, splits, GROUP_PAD, HEAD_DIM) float32: unnormalized outputs
    part_max,  # (B, kv_heads, splits, GROUP_PAD) float32: running max of the scores (log2 units)
    part_sum,  # (B, kv_heads, splits, GROUP_PAD) float32: sum of exp2(score - max)
    scale_log2,  # softmax scale times log2(e): exp(x) = exp2(x · log2 e)
    stride_qb,
    stride_qh,
    stride_slot,
    stride_head,
    stride_tb,
    splits,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two, at least 16 (tl.dot's smallest side)
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,  # the pool's block size, a power of two of at least 16
    PRECISION: tl.constexpr,  # tl.dot's input precision: "ieee" for float32 caches, else unused
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    heads = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    tokens = tl.arange(0, PAGE)
    head_ok = heads < GROUP
    q_rows = q + b * stride_qb + (h * GROUP + heads)[:, None] * stride_qh + dims[None, :]
    qv = tl.load(q_rows, mask=head_ok[:, None], other=0.0)  # (GROUP_PAD, HEAD_DIM)
    length = tl.load(lengths + b)
    m_i = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, HEAD_DIM), tl.float32)
    for page in range(s, tl.cdiv(length, PAGE), splits):
        block = tl.load(tables + b * stride_tb + page).to(tl.int64)  # offsets pass 2**31 in a large pool
        valid = page * PAGE + tokens < length
        rows = (block * PAGE + tokens)[:, None] * stride_slot + h * stride_head + dims[None, :]
        kv = tl.load(k_pool + rows, mask=valid[:, None], other=0.0)  # (PAGE, HEAD_DIM)
        scores = tl.dot(qv, tl.trans(kv), input_precision=PRECISION) * scale_log2  # (GROUP_PAD, PAGE)
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))  # finite: a page's first token is always valid
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        vv = tl.load(v_pool + rows, mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    part = ((b * tl.num_programs(1) + h) * splits + s) * GROUP_PAD + heads
    tl.store(part_acc + part[:, None] * HEAD_DIM + dims[None, :], acc)
    tl.store(part_max + part, m_i)
    tl.store(part_sum + part, l_i)


@triton.jit
def _decode_merge(
    out,  # (B, heads, head_dim)
    part_acc,
    part_max,
    part_sum,
    stride_ob,
    stride_oh,
    splits,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """The splits of (b, h) weighed by exp2(max_s - max): a split that saw no page has max -inf and weighs 0; a
    sequence of length 0 (a padded row) gets zeros."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    heads = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    first = (b * tl.num_programs(1) + h) * splits
    m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)
    for s in range(0, splits):
        m = tl.maximum(m, tl.load(part_max + (first + s) * GROUP_PAD + heads))
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros((GROUP_PAD,), tl.float32)
    acc = tl.zeros((GROUP_PAD, HEAD_DIM), tl.float32)
    for s in range(0, splits):
        part = (first + s) * GROUP_PAD + heads
        w = tl.exp2(tl.load(part_max + part) - m)
        total += tl.load(part_sum + part) * w
        acc += tl.load(part_acc + part[:, None] * HEAD_DIM + dims[None, :]) * w[:, None]
    result = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    rows = out + b * stride_ob + (h * GROUP + heads)[:, None] * stride_oh + dims[None, :]
    tl.store(rows, result.to(out.dtype.element_ty), mask=(heads < GROUP)[:, None])


def check_shapes(head_dim: int, block_size: int) -> str | None:
    """Why these kernels cannot run a model's attention, or None: tl.arange and tl.dot take power-of-two sides of
    at least 16."""
    for name, n in (("head_dim", head_dim), ("block_size", block_size)):
        if n < 16 or n & (n - 1):
            return f"{name} {n} (the CUDA decode kernel takes powers of two from 16)"
    return None


def num_splits(batch: int, kv_heads: int, table_width: int, multiprocessors: int) -> int:
    """Splits per (sequence, KV head): enough programs for PROGRAMS_PER_SM per multiprocessor, never more than the
    block table has pages. A function of host-known sizes only, so a captured graph keeps it."""
    wanted = -(-PROGRAMS_PER_SM * multiprocessors // max(1, batch * kv_heads))
    return max(1, min(wanted, table_width))


def decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    tables: torch.Tensor,
    lengths: torch.Tensor,
    block_size: int,
    scale: float,
    multiprocessors: int,
) -> torch.Tensor:
    """One query row per decode over its sequence's pages. q: (B, heads, head_dim); pools (slots, kv_heads,
    head_dim) with slot = block · block_size + offset; tables (B, width) block ids; lengths (B,), 0 for a padded
    row. head_dim and block_size are powers of two of at least 16 (`check_shapes`). Returns (B, heads, head_dim)
    in q's dtype."""
    batch, heads, head_dim = q.shape
    kv_heads = k_pool.shape[1]
    if q.stride(2) != 1 or not (k_pool.is_contiguous() and v_pool.is_contiguous()):
        raise ValueError("decode_attention takes q with contiguous head_dim and contiguous pools")
    group = heads // kv_heads
    group_pad = max(16, triton.next_power_of_2(group))
    splits = num_splits(batch, kv_heads, tables.shape[1], multiprocessors)
    part_acc = torch.empty(batch, kv_heads, splits, group_pad, head_dim, dtype=torch.float32, device=q.device)
    part_max = torch.empty(batch, kv_heads, splits, group_pad, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    out = torch.empty_like(q)
    if batch == 0:
        return out
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _decode_split[(batch, kv_heads, splits)](
        q,
        k_pool,
        v_pool,
        tables,
        lengths,
        part_acc,
        part_max,
        part_sum,
        scale * 1.4426950408889634,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        tables.stride(0),
        splits,
        group,
        group_pad,
        head_dim,
        block_size,
        precision,
    )
    _decode_merge[(batch, kv_heads)](
        out, part_acc, part_max, part_sum, out.stride(0), out.stride(1), splits, group, group_pad, head_dim
    )
    return out
