"""Triton kernel for int8 weight-only linears on CUDA: y = x · Wᵀ with W = q · d, one scale d per 32 weights of a
row (GGUF's Q8_0, 8.5 bits per weight). PyTorch's CUDA `_weight_int8pack_mm` runs one thread per output element
reading its weight row with a stride of the row's length, far from the memory bandwidth a decode step is bound by,
and takes one scale per row.

Each program computes a (BLOCK_M, BLOCK_N) tile of the output over its share of K: per group of 32 inputs one
tl.dot of the activations with the group's integers (exact in bfloat16 or float16: |q| ≤ 127) and one multiply by
the group's scales in float32. Decode has few rows and streams the weights once, so the grid splits K (`split_k`)
until every multiprocessor has programs to stream; the splits' float32 partial sums are added by one more op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GROUP = 32
BLOCK_N = 64
BLOCK_K = 128  # four groups per iteration: each row's 128 contiguous bytes
PROGRAMS_PER_SM = 4


@triton.jit
def _q8_matmul(
    x,  # (M, K) bfloat16 / float16 / float32
    q,  # (N, K) int8
    d,  # (N, K / 32) float16
    out,  # (splits, M, N) float32 partial sums, or (M, N) in x's dtype when there is one split
    M,
    N,
    K,
    stride_xm,
    stride_qn,
    stride_dn,
    stride_os,
    stride_om,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    PRECISION: tl.constexpr,  # tl.dot's input precision: "ieee" for float32 activations
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_rows = cols.to(tl.int64)  # the weights' row offsets: a vocabulary-sized lm_head nears 2**31 bytes
    inner = tl.arange(0, GROUP)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    start = split * k_per_split
    end = tl.minimum(start + k_per_split, K)
    for k0 in range(start, end, BLOCK_K):
        for g in tl.static_range(BLOCK_K // GROUP):
            ks = k0 + g * GROUP + inner
            k_ok = ks < end
            xs = tl.load(x + rows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            qs = tl.load(q + col_rows[None, :] * stride_qn + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0)
            group_ok = col_ok & (k0 + g * GROUP < end)  # past K: zeros, not undefined values times a zero dot
            scale = tl.load(d + cols * stride_dn + (k0 + g * GROUP) // GROUP, mask=group_ok, other=0.0)
            dot = tl.dot(xs, qs.to(xs.dtype), input_precision=PRECISION)
            acc += dot * scale.to(tl.float32)[None, :]
    target = out + split * stride_os + rows[:, None] * stride_om + cols[None, :]
    tl.store(target, acc.to(out.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def block_m(rows: int) -> int:
    """Rows per program: tl.dot's smallest side (16) for decode batches, wider tiles as the rows grow."""
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


def split_k(rows: int, n: int, k: int, multiprocessors: int) -> int:
    """How many parts K is cut into: enough programs for PROGRAMS_PER_SM per multiprocessor, each part at least two
    BLOCK_K iterations long. Host-known sizes only (a captured graph keeps it)."""
    tiles = -(-n // BLOCK_N) * -(-rows // block_m(rows))
    wanted = -(-PROGRAMS_PER_SM * multiprocessors // tiles)
    return max(1, min(wanted, k // (2 * BLOCK_K)))


def q8_matmul(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, multiprocessors: int) -> torch.Tensor:
    """x (M, K) @ (q · d)ᵀ -> (M, N) in x's dtype. q: (N, K) int8 contiguous; d: (N, K / 32) float16; K % 32 == 0."""
    m, k = x.shape
    n = q.shape[0]
    if x.stride(1) != 1 or not q.is_contiguous() or d.stride(1) != 1 or k % GROUP:
        raise ValueError("q8_matmul takes row-major x and q, and K a multiple of 32")
    bm = block_m(m)
    splits = split_k(m, n, k, multiprocessors)
    k_per_split = -(-k // (splits * BLOCK_K)) * BLOCK_K
    splits = -(-k // k_per_split)
    if splits == 1:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        stride_split = 0
    else:
        out = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
        stride_split = out.stride(0)
    if m:
        precision = "ieee" if x.dtype == torch.float32 else "tf32"
        grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(m, bm), splits)
        _q8_matmul[grid](
            x, q, d, out, m, n, k, x.stride(0), q.stride(0), d.stride(0), stride_split, n, k_per_split,
            bm, BLOCK_N, BLOCK_K, GROUP, precision,
        )  # fmt: skip
    return out if splits == 1 else out.sum(0).to(x.dtype)
