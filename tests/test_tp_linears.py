"""Tensor parallelism's layers in every weight format, under a real 2-rank gloo group the test spawns: a
column-parallel linear's ranks give exactly the unsharded linear's columns; a row-parallel one's all-reduced partial
sums are the unsharded product up to the order of the float additions, the same bits on every rank; the
vocab-parallel embedding and lm_head give the whole table's rows and logits. And what the ranks read: a GGUF
tensor's rows or columns read alone are exactly those of the whole tensor, and a split inside a quantized block is
refused with the sizes that work."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QType
from tp_support import WIDE, N, gguf_tensor, inputs, linear_of, ordered_reduce, sharded_linears, spawn, weights

from rooftop.config import ModelConfig
from rooftop.loading.gguf import read_tensor
from rooftop.loading.shard import Shard, ShardError, shard_tensor, shard_weight
from rooftop.quant.linear import RowPlan, make_linear, widen_dtype
from rooftop.quant.weights import BlockWeight

FORMATS = ["fp32", "q4_1", "q8_0", "q4_0", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "int8-rows", "int4-g32"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp-linears")
    spawn(sharded_linears, 2, out)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def reference(name: str):
    every = weights()
    source = {"int8-rows": every["fp32"], "int4-g32": every["q4_1"]}.get(name, every.get(name))
    return linear_of(name, source)


def same(a, b) -> bool:
    """Two weights equal in every field (tensors bit for bit); block weights in their rows, however they are held."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, BlockWeight):
        return isinstance(b, BlockWeight) and (a.format, a.k) == (b.format, b.k) and torch.equal(a.q, b.q)
    return type(a) is type(b) and all(
        same(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(vars(a).values(), vars(b).values(), strict=True)
    )


@pytest.fixture
def one_thread():
    """Each rank runs one thread (tp_support): a float matmul's reference too, since the BLAS may split a small
    product differently over two threads and round it otherwise (MKL on a Zen 3 host: by an ulp)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", FORMATS)
def test_column_parallel_ranks_give_exactly_the_unsharded_columns(ranks, name, one_thread):
    x, wide, _, _ = inputs()
    linear = reference(name)
    assert torch.equal(torch.cat([r[f"{name}.column"] for r in ranks], dim=-1), linear(x))
    if f"{name}.column.wide" in ranks[0]:  # a prefill chunk: the weights widened to one float matmul
        got = torch.cat([r[f"{name}.column.wide"] for r in ranks], dim=-1)
        # the BLAS picks its kernel by the matrix's shape, and a rank's has half the columns: its float sums may
        # round differently (by an ulp of the widened dtype, bfloat16 where the CPU multiplies it natively)
        ulp = 2.0**-7 if widen_dtype() == torch.bfloat16 and name != "fp32" else 2.0**-20
        torch.testing.assert_close(got, linear(wide, plan=RowPlan((WIDE,))), atol=4 * ulp, rtol=ulp)


def test_a_fused_projection_of_two_stored_formats_splits_by_rows(ranks):
    every = weights()
    x, _, _, _ = inputs()
    fused = make_linear([every["q4_k"], every["q8_0"]], None, "int4", stored=True)
    ours = torch.cat([r["q4_k+q8_0.column"] for r in ranks], dim=-1)
    whole = fused(x)  # q4_k's 64 outputs then q8_0's; each rank holds its half of each
    halves = [whole[:, :N], whole[:, N:]]
    expected = torch.cat([h[:, r * N // 2 : (r + 1) * N // 2] for r in range(2) for h in halves], dim=-1)
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("name", FORMATS)
def test_row_parallel_all_reduce_adds_the_ranks_partial_sums(ranks, name):
    x, _, residual, _ = inputs()
    zero, one = (r[f"{name}.row"] for r in ranks)
    assert torch.equal(zero, one), "every rank holds the same bits after the all-reduce"
    assert torch.equal(zero, (ranks[0][f"{name}.partial"] + ranks[1][f"{name}.partial"]) + residual)
    # the unsharded product, up to the order of the float additions; PyTorch's weight-only kernels compute in
    # bfloat16 (an ulp of 2^-7 at these magnitudes), and per-row int8 takes its scale over each rank's part of the
    # row, a finer quantization than the whole row's
    tolerance = {"int8-rows": 0.05, "int4-g32": 0.02}.get(name, 1e-4)
    torch.testing.assert_close(zero, reference(name)(x) + residual, atol=tolerance, rtol=0)


def test_vocab_parallel_embedding_and_head_give_the_whole_tables(ranks):
    x, _, _, table = inputs()
    ids = torch.tensor([0, 5, 129, 130, 258, 7])
    for r in ranks:
        assert torch.equal(r["embedding"], table[ids])
    assert "head" not in ranks[1], "only rank 0 gets the logits"
    torch.testing.assert_close(ranks[0]["head"], x @ table.T, atol=1e-4, rtol=0)


def test_three_ranks_add_partial_sums_in_rank_order_whatever_the_message(tmp_path):
    spawn(ordered_reduce, 3, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(3)]
    parts = [r["parts"] for r in ranks]
    in_order = (parts[0] + parts[1]) + parts[2]
    for r in ranks:
        assert torch.equal(r["whole"], in_order) and torch.equal(r["alone"], in_order)
    # why: a ring all-reduce adds each element's parts in an order set by where its chunk falls, and float
    # addition is not associative, so a row's sum would move with the step's other rows
    assert any(not torch.equal(r["ring"], in_order) for r in ranks)


LLAMA = ModelConfig("llama", 300, 512, 512, 1, 8, 2, 64, 128)


@pytest.mark.parametrize("qtype", [QType.F32, QType.Q8_0, QType.Q4_1, QType.Q4_0, QType.Q5_1, QType.Q4_K, QType.Q6_K])
def test_a_rank_reads_exactly_its_rows_or_columns_of_the_file(qtype):
    t, _ = gguf_tensor(qtype, (64, 512))
    whole = read_tensor(t, LLAMA, "model.layers.0.mlp.down_proj.weight")
    for shard in (Shard(0, 32, 64, 64), Shard(1, 256, 512, 512)):
        part = read_tensor(t, LLAMA, "model.layers.0.mlp.down_proj.weight", shard)
        assert same(part, shard_weight(whole, shard, "down"))
    view = shard_tensor(t, Shard(1, 256, 512, 512))
    assert view.data.base is not None, "a view of the memory-mapped bytes, nothing read yet"


def test_llamas_query_rows_are_read_by_whole_heads_in_hugging_faces_order():
    t, _ = gguf_tensor(QType.Q8_0, (512, 512))
    t.name = "blk.0.attn_q.weight"
    name = "model.layers.0.self_attn.q_proj.weight"
    whole = read_tensor(t, LLAMA, name).dequantize()
    heads = read_tensor(t, LLAMA, name, Shard(0, 128, 256, 512)).dequantize()  # heads 2 and 3 of 8
    assert torch.equal(heads, whole[128:256])


def test_a_split_inside_a_quantized_block_is_refused():
    t, _ = gguf_tensor(QType.Q4_K, (64, 256))
    with pytest.raises(ShardError, match="Q4_K blocks of 256 weights; columns 0:128 are not whole blocks"):
        shard_tensor(t, Shard(1, 0, 128, 256))
    blocks = BlockWeight((torch.zeros(4, 144, dtype=torch.uint8),), "q4_k", 256)
    with pytest.raises(ShardError, match="blocks of 256"):
        shard_weight(blocks, Shard(1, 128, 256, 256), "w")
