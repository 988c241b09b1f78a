"""The CUDA path's pieces that need no GPU, run on the CPU: tinygemm's int4 layout against PyTorch's packing loop
transcribed, the Q8_0 and int4 linears' dequantization, which class each policy builds on CUDA, the decode graphs'
batch sizes and padded inputs, the engine's settings on CUDA, and the Triton kernels under Triton's interpreter
(where Triton is installed)."""

import importlib.util
import warnings

import numpy as np
import pytest
import torch

from rooftop.config import EngineConfig
from rooftop.engine.cuda_graph import capture_sizes, cuda_engine_config, fill_inputs, padded_size
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError
from rooftop.models.kv_cache import AttentionSeq
from rooftop.quant.cuda_linear import (
    CudaInt4Linear,
    CudaInt8Linear,
    inner_k_tiles,
    pack_int4,
    runs_tinygemm,
    unpack_int4,
)
from rooftop.quant.linear import linear_format, linear_kind, weight_policy
from rooftop.quant.weights import quantize_int4, quantize_int8_groups

CUDA = torch.device("cuda")


def reference_pack(q: torch.Tensor, tiles: int) -> torch.Tensor:
    """PyTorch's matrix_to_m16n8k16_Bint4_layout (aten/src/ATen/native/cuda/int4mm.cu), lane by lane, on the
    (N, K / 2) bytes PyTorch packs from (even column in the high nibble)."""
    n, k = q.shape
    data = (q[:, ::2] << 4 | q[:, 1::2]).tolist()
    out = torch.zeros(n // 8, k // (tiles * 16), 32, tiles // 2, dtype=torch.int64)
    for n_tile in range(n // 8):
        for k_outer in range(k // (tiles * 16)):
            for t in range(32):
                for inner in range(0, tiles, 2):
                    n0 = n_tile * 8 + t // 4
                    base0 = (k_outer * tiles + inner) * 8
                    base1 = base0 + 8
                    v = [data[n0][j] for j in (base0 + t % 4, base0 + t % 4 + 4, base1 + t % 4, base1 + t % 4 + 4)]
                    low = [b & 0xF for b in v]
                    high = [b >> 4 for b in v]
                    word = sum(h << (4 * i) for i, h in enumerate(high)) + sum(
                        lo << (16 + 4 * i) for i, lo in enumerate(low)
                    )
                    out[n_tile, k_outer, t, inner // 2] = word
    return (out - (out >= 2**31) * 2**32).to(torch.int32)


@pytest.mark.parametrize("tiles", [2, 4, 8])
def test_tinygemm_layout_is_pytorchs_packing_and_unpacks(tiles):
    gen = torch.Generator().manual_seed(tiles)
    q = torch.randint(0, 16, (16, 2 * tiles * 16), generator=gen, dtype=torch.uint8)
    packed = pack_int4(q, tiles)
    assert torch.equal(packed, reference_pack(q, tiles))
    assert torch.equal(unpack_int4(packed, *q.shape), q)


def test_tinygemm_shapes():
    assert [inner_k_tiles(k) for k in (4096, 14336, 4608, 96, 64, 32, 48)] == [8, 8, 8, 2, 4, 2, None]
    assert runs_tinygemm(4096, 4096) and not runs_tinygemm(4100, 4096) and not runs_tinygemm(4096, 48)


def test_the_int4_linear_dequantizes_its_packed_groups():
    gen = torch.Generator().manual_seed(1)
    w = quantize_int4(torch.randn(24, 96, generator=gen))
    scales_zeros = torch.stack([w.scale.t(), w.zero.t()], dim=-1).to(torch.bfloat16)
    linear = CudaInt4Linear(pack_int4(w.q, inner_k_tiles(96)), scales_zeros, 24, 96)
    expected = (w.q.float() - 8).view(24, 3, 32) * scales_zeros[..., 0].t().float()[..., None]
    expected = expected + scales_zeros[..., 1].t().float()[..., None]
    assert torch.equal(linear.dequantize(), expected.view(24, 96))
    assert linear.nbytes == 24 * 96 // 2 + 3 * 24 * 2 * 2


def test_the_int8_linear_is_q8_0():
    gen = torch.Generator().manual_seed(2)
    groups = quantize_int8_groups(torch.randn(8, 64, generator=gen))
    linear = CudaInt8Linear(groups.q, groups.scale.half())
    assert torch.equal(linear.dequantize(), groups.dequantize())  # float16 scales hold Q8_0's exactly
    assert linear.format == "q8_0" and linear.nbytes == 8 * 64 + 8 * 2 * 2


def test_each_policy_on_cuda():
    """Classes and formats are decided without a GPU: tinygemm for int4, the Q8_0 kernel for int8 and every
    quantized lm_head; auto runs a file's own format on CUDA as on the CPU."""
    assert linear_kind("int4", CUDA) is CudaInt4Linear and linear_kind("int8", CUDA) is CudaInt8Linear
    assert linear_kind("int4", CUDA, lm_head=True) is CudaInt8Linear
    assert [linear_format(p, CUDA, torch.bfloat16) for p in ("float", "int8", "int4")] == ["bf16", "q8_0", "int4-g32"]
    assert weight_policy("auto", "int4", CUDA, torch.bfloat16) == "int4"
    assert weight_policy("q8_0", "float", CUDA, torch.bfloat16) == "int8"
    with pytest.raises(Exception, match="cannot run q4_1 weights on cuda"):
        weight_policy("q4_1", "float", CUDA, torch.bfloat16)


@pytest.mark.parametrize(
    "sizes, max_seqs, budget, expected",
    [
        (None, 64, 1024, [1, 2, 4, *range(8, 129, 8)]),  # vLLM's default: up to 2 x max_num_seqs
        (None, 512, 8192, [1, 2, 4, *range(8, 513, 8)]),  # at most 512
        ([16], 64, 1024, [1, 2, 4, 8, 16]),  # one value: the rule up to it
        ([3, 1, 64, 3], 64, 1024, [1, 3, 64]),  # several: themselves
        (None, 64, 20, [1, 2, 4, 8, 16]),  # never more rows than a step has
    ],
)
def test_capture_sizes_follow_vllms_rule(sizes, max_seqs, budget, expected):
    config = EngineConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, cuda_graph_sizes=sizes)
    assert capture_sizes(config) == expected


def test_a_step_is_padded_to_the_next_captured_size():
    sizes = [1, 2, 4, 8, 16]
    assert [padded_size(n, sizes) for n in (1, 3, 4, 5, 16, 17)] == [1, 4, 4, 8, 16, None]


def test_graph_inputs_and_padding():
    """Two decodes and a verify step of 1 + 2 rows, padded to 8: each row's slot, length (its own token and, for a
    verify row, the rows before it) and table; padded rows write no K/V, read no key and use the spare state."""
    vectors = np.full((5, 8), 99, dtype=np.int64)
    tables = np.zeros((8, 4), dtype=np.int32)
    seqs = [
        AttentionSeq([3], 5, 1, Phase.DECODE, state_slot=0),
        AttentionSeq([7, 2], 16, 1, Phase.DECODE, state_slot=1),
        AttentionSeq([4, 9], 14, 3, Phase.DECODE, state_slot=2),  # positions 14, 15, 16: across a block
    ]
    fill_inputs(vectors, tables, [11, 12, 13, 14, 15], [5, 16, 14, 15, 16], seqs, 16, 8, spare_state_slot=9)
    ids, positions, slots, lengths, states = vectors
    assert ids.tolist() == [11, 12, 13, 14, 15, 0, 0, 0] and positions.tolist() == [5, 16, 14, 15, 16, 0, 0, 0]
    assert slots.tolist() == [3 * 16 + 5, 2 * 16 + 0, 4 * 16 + 14, 4 * 16 + 15, 9 * 16 + 0, -1, -1, -1]
    assert lengths.tolist() == [6, 17, 15, 16, 17, 0, 0, 0] and states.tolist() == [0, 1, 2, 2, 2, 9, 9, 9]
    assert tables[:5].tolist() == [[3, 0, 0, 0], [7, 2, 0, 0], [4, 9, 0, 0], [4, 9, 0, 0], [4, 9, 0, 0]]
    with pytest.raises(ValueError, match="5 tokens but its sequences 1 rows"):
        fill_inputs(vectors, tables, [1] * 5, [0] * 5, seqs[:1], 16, 8, 9)


def test_the_engine_on_cuda_turns_batch_invariance_off_and_checks_its_cache():
    config = cuda_engine_config(EngineConfig(), torch.bfloat16)
    assert not config.batch_invariant and config.chunk_size == config.max_num_batched_tokens
    with pytest.raises(InvalidRequestError, match="block_size 8: on CUDA"):
        cuda_engine_config(EngineConfig(block_size=8), torch.bfloat16)
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype int8 is not supported on CUDA yet"):
        cuda_engine_config(EngineConfig(kv_cache_dtype="int8"), torch.float32)
    with pytest.raises(InvalidRequestError, match="cuda_graph_sizes must be a list of integers"):
        EngineConfig(cuda_graph_sizes=[0])


def triton_interpreter() -> str | None:
    """Why the Triton kernels cannot run under the interpreter here, or None."""
    if torch.cuda.is_available():
        return "a GPU is here: tests/test_cuda.py runs the kernels compiled"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            int(np.array([1]))
        except TypeError:  # triton 3.6's interpreter converts one-element arrays with int(), which NumPy 2.4 refuses
            return f"Triton's interpreter does not run on NumPy {np.__version__}"
    return None


def interpreted(test):
    """Run under Triton's interpreter where it can run, its DeprecationWarnings (int() of arrays) quiet."""
    skip = pytest.mark.skipif(triton_interpreter() is not None, reason=str(triton_interpreter()))
    return skip(pytest.mark.filterwarnings("ignore::DeprecationWarning")(test))


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # numpy has no bfloat16: the GPU tests check it
def test_paged_decode_attention_kernel(interpreter, dtype):
    from rooftop.kernels import paged_attention as kernels

    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, hd, page = 6, 2, 16, 16
    k_pool = torch.randn(10 * page, kv_heads, hd, generator=gen).to(dtype)
    v_pool = torch.randn(10 * page, kv_heads, hd, generator=gen).to(dtype)
    tables = torch.tensor([[3, 7, 1, 0], [5, 0, 0, 0], [2, 4, 6, 8]])
    lengths = torch.tensor([40, 5, 0])  # the last: a padded row
    q = torch.randn(3, heads, hd, generator=gen).to(dtype)
    for processors in (1, 64):  # one split per sequence, and a page per split
        out = kernels.decode_attention(q, k_pool, v_pool, tables, lengths, page, hd**-0.5, processors)
        for b in range(2):
            slots = (tables[b][:, None] * page + torch.arange(page)).flatten()[: lengths[b]]
            keys, values = (p[slots].double().repeat_interleave(heads // kv_heads, 1) for p in (k_pool, v_pool))
            scores = torch.einsum("hd,thd->ht", q[b].double(), keys) * hd**-0.5
            expected = torch.einsum("ht,thd->hd", scores.softmax(-1), values)
            torch.testing.assert_close(out[b].double(), expected, atol=2e-3 if dtype == torch.float16 else 1e-5, rtol=0)
        assert torch.equal(out[2], torch.zeros_like(out[2]))


@interpreted
def test_store_kv_kernel_skips_padded_rows(interpreter):
    from rooftop.kernels.paged_attention import store_kv

    gen = torch.Generator().manual_seed(4)
    k_pool, v_pool = torch.zeros(32, 2, 16), torch.zeros(32, 2, 16)
    qkv = torch.randn(3, 8, 16, generator=gen)  # rows of q (4 heads), k (2), v (2): k and v are strided views
    store_kv(qkv[:, 4:6], qkv[:, 6:], k_pool, v_pool, torch.tensor([5, -1, 31]))
    assert torch.equal(k_pool[5], qkv[0, 4:6]) and torch.equal(v_pool[31], qkv[2, 6:])
    assert int((k_pool.abs().sum((1, 2)) > 0).sum()) == 2


@interpreted
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_q8_matmul_kernel(interpreter, rows):
    from rooftop.kernels.weight_only import q8_matmul

    gen = torch.Generator().manual_seed(rows)
    groups = quantize_int8_groups(torch.randn(72, 512, generator=gen))
    x = torch.randn(rows, 512, generator=gen)
    for processors in (1, 132):  # one split, and K split four ways
        y = q8_matmul(x, groups.q, groups.scale.half(), processors)
        expected = x.double() @ groups.dequantize().double().T
        torch.testing.assert_close(y.double(), expected, atol=1e-4, rtol=1e-5)
