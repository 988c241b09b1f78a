"""GGUF's block formats: the ones rooftop's kernels run as stored (Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, their levels
and scales repacked in tiles of 16 rows) against gguf's own dequantizer and the exact matmul on the kernels' int8
activations; the rarer types gguf decodes, converted at load to rooftop's int4; bad blocks refused with the reason."""

import copy

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from rooftop.errors import ModelLoadError
from rooftop.kernels import cpu
from rooftop.loading.gguf import read_matrix
from rooftop.loading.gguf_file import TensorInfo
from rooftop.models.tensors import Tensors
from rooftop.quant.gguf_blocks import STORED_TYPES, dequantize, stored_blocks, supported_types
from rooftop.quant.linear import BlockLinear, RowPlan, make_linear, widen_dtype
from rooftop.quant.tiles import SUPER_BLOCK_FORMATS
from rooftop.quant.weights import Int4Weight, Int8GroupWeight, quantize_int4, quantize_int8_groups

kernels = cpu.ops()
needs_kernels = pytest.mark.skipif(kernels is None, reason="rooftop's CPU kernels did not build on this machine")
SCALE_OFFSETS = {
    QType.Q4_0: [0],
    QType.Q5_0: [0],
    QType.Q5_1: [0, 2],
    QType.Q4_K: [0, 2],
    QType.Q5_K: [0, 2],
    QType.Q6_K: [208],
}
# bits per weight in tiles.cpp's layout: the file's, but for the K-quants' 6-bit scales and minima held in a byte each
TILED_BITS = {QType.Q4_0: 4.5, QType.Q5_0: 5.5, QType.Q5_1: 6, QType.Q4_K: 4.625, QType.Q5_K: 5.625, QType.Q6_K: 6.5625}


def random_blocks(qtype: QType, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random bytes in every field, with finite float16 scales where the format keeps them (rows, bytes per row)."""
    rng = np.random.default_rng(seed)
    block, nbytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, nbytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS.get(qtype, []):
        scales = rng.uniform(1e-3, 1e-2, size=(rows, cols // block)).astype(np.float16)
        raw[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def int8_activations(x: torch.Tensor, group: int = 32) -> torch.Tensor:
    """What the kernels dot the weights with: x rounded to int8 per `group` inputs (scale max|x| / 127): 32, and for
    a prefill chunk's rows of a K-quant 256 (llama.cpp's Q8_K)."""
    groups = x.reshape(x.shape[0], -1, group)
    scale = groups.abs().amax(-1, keepdim=True) / 127
    return (torch.round(groups / torch.where(scale > 0, scale, 1)) * scale).reshape(x.shape)


def widths(qtype: QType) -> list[int]:
    return [256, 768] if GGML_QUANT_SIZES[qtype][0] == 256 else [64, 96, 576]  # 96, 576: a tail of 1-3 blocks


@needs_kernels
@pytest.mark.parametrize("qtype", list(STORED_TYPES), ids=lambda t: t.name)
def test_stored_blocks_run_exactly_as_gguf_decodes_them(qtype):
    for k in widths(qtype):
        raw = random_blocks(qtype, 24, k, seed=k)
        reference = torch.from_numpy(gguf.quants.dequantize(raw, qtype).astype(np.float32))
        w = stored_blocks(raw, qtype, (24, k))
        assert w.format == STORED_TYPES[qtype] and w.shape == (24, k)
        assert torch.equal(w.dequantize(), reference)
        lin = make_linear(w, torch.randn(24, generator=torch.Generator().manual_seed(1)), "int4", stored=True)
        assert type(lin) is BlockLinear and lin.format == w.format
        assert torch.equal(lin.dequantize(), reference)  # the kernel's own decoding, which prefill widens with
        ids = torch.tensor([[23, 0, 16], [7, 23, 15]])  # an embedding's lookup: rows of the last, partial tile too
        assert torch.equal(lin.lookup(ids), reference[ids])
        assert lin.nbytes == 32 * k * TILED_BITS[qtype] / 8  # tiles of 16 rows: 24 rows take 32
        gen = torch.Generator().manual_seed(k)
        for rows in (1, 3, 4, 5, 9):
            x, residual = torch.randn(rows, k, generator=gen), torch.randn(rows, 24, generator=gen)
            exact = int8_activations(x).double() @ reference.double().t() + lin.bias.double() + residual.double()
            torch.testing.assert_close(lin(x, residual=residual), exact.float(), atol=1e-4, rtol=1e-4)
        bf16 = torch.bfloat16  # what a prefill chunk widens to where the host multiplies it natively
        assert torch.equal(lin.dequantize(bf16), reference.to(bf16))
        wide = lin(x, plan=RowPlan((rows,)))  # a prefill chunk: widened where the host does, else on the kernel
        if widen_dtype() is None and w.format in SUPER_BLOCK_FORMATS:  # the K-quants' activations per 256
            exact = int8_activations(x, 256).double() @ reference.double().t() + lin.bias.double()
            torch.testing.assert_close(wide, exact.float(), atol=1e-4, rtol=1e-4)
            # a row's result is its own chunk's: beside another chunk, or beside decode rows (which keep scales per 32)
            assert torch.equal(
                lin(x, plan=RowPlan((rows - 4, 4))), torch.cat([wide[:-4], lin(x[-4:], plan=RowPlan((4,)))])
            )
            assert torch.equal(lin(x, plan=RowPlan((rows - 4,))), torch.cat([wide[:-4], lin(x[-4:])]))
            assert not torch.equal(lin(x[-4:]), wide[-4:])
        elif widen_dtype() is None:
            assert torch.equal(wide, lin(x))
        else:
            torch.testing.assert_close(wide, F.linear(x.to(bf16), reference.to(bf16)).float() + lin.bias)


@needs_kernels
@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K, QType.Q5_0], ids=lambda t: t.name)
def test_tiles_are_made_from_the_rows_where_they_are_in_the_matrixs_order(qtype):
    """A file's rows are viewed, not copied; a row order and a fusion are noted and the tiles made from the rows
    where they are are those of the matrix copied out in that order. A column shard's strided rows too."""
    from rooftop.quant.tiles import tile_blocks
    from rooftop.quant.weights import BlockWeight

    k = 512
    a, b = random_blocks(qtype, 24, k, seed=1), random_blocks(qtype, 8, k, seed=2)
    wa, wb = stored_blocks(a, qtype, (24, k)), stored_blocks(b, qtype, (8, k))
    assert wa.parts[0].data_ptr() == a.ctypes.data  # a view of the file's bytes
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(3))
    fused = BlockWeight.cat([wa.rows(perm), wb, wa.rows(perm[:5])])
    rows = np.concatenate([a[perm.numpy()], b, a[perm[:5].numpy()]])
    assert fused.shape == (37, k) and torch.equal(fused.q, torch.from_numpy(rows))
    copied = BlockWeight((fused.q.clone(),), fused.format, k)
    for mine, theirs in zip(tile_blocks(fused), tile_blocks(copied), strict=True):
        assert torch.equal(mine, theirs)
    half = GGML_QUANT_SIZES[qtype][1] * (k // 2 // GGML_QUANT_SIZES[qtype][0])
    strided = BlockWeight((wa.parts[0][:, :half],), wa.format, k // 2)
    assert not strided.parts[0].is_contiguous()
    contiguous = BlockWeight((strided.q.contiguous(),), wa.format, k // 2)
    for mine, theirs in zip(tile_blocks(strided), tile_blocks(contiguous), strict=True):
        assert torch.equal(mine, theirs)
    ids = torch.tensor([[3, 0], [23, 7]])  # an embedding's lookup through the row order: those rows alone
    assert torch.equal(wa.rows(perm).lookup(ids), torch.from_numpy(gguf.quants.dequantize(a[perm[ids].numpy()], qtype)))
    with pytest.raises(RuntimeError, match="order holds row 32 of 32"):
        tile_blocks(BlockWeight(fused.parts[:2], fused.format, k, torch.tensor([0, 32])))


@pytest.mark.parametrize(
    "qtype", [QType.Q2_K, QType.Q3_K, QType.IQ4_NL, QType.IQ4_XS, QType.TQ2_0], ids=lambda t: t.name
)
def test_rarer_types_decode_as_gguf_does_and_become_each_policys_groups(qtype):
    """A type the kernels do not run is read as gguf's float values; the model holds them as they are under float,
    and as its policy's groups, rounded once from them, under int4 (Q4_1, what `auto` makes) and int8 (Q8_0)."""
    assert qtype in supported_types()
    shape = (8, 512)
    block, nbytes = GGML_QUANT_SIZES[qtype]  # gguf cannot write these: random blocks
    raw = random_blocks(qtype, *shape, seed=6).reshape(shape[0], -1, nbytes)
    with np.errstate(all="ignore"):
        decoded = gguf.quants.dequantize(raw.reshape(shape[0], -1), qtype).reshape(shape[0], -1, block)
    raw[~(np.abs(decoded) < 100).all(axis=-1)] = 0  # blocks whose random float16 scales are huge or not finite
    raw = raw.reshape(shape[0], -1)
    reference = torch.from_numpy(gguf.quants.dequantize(raw, qtype).astype(np.float32))
    assert torch.equal(dequantize(raw.reshape(-1), qtype, shape), reference)
    w = read_matrix(TensorInfo("blk.0.ffn_up.weight", shape, qtype, raw.reshape(-1)))
    assert torch.equal(w, reference)
    name, cpu_ = "model.layers.0.mlp.up_proj.weight", torch.device("cpu")
    held = {
        policy: Tensors({name: w}, torch.float32, cpu_, policy, True, converted_types={name: qtype.name})
        for policy in ("float", "int8", "int4")
    }
    assert torch.equal(held["float"].take(name, shape), reference) and held["float"].conversions == {}
    int4, int8 = held["int4"].take(name, shape), held["int8"].take(name, shape)
    assert isinstance(int4, Int4Weight) and isinstance(int8, Int8GroupWeight)
    assert held["int4"].conversions == {name: f"{qtype.name} -> Q4_1"}
    assert held["int8"].conversions == {name: f"{qtype.name} -> Q8_0"}
    torch.testing.assert_close(int4.dequantize(), quantize_int4(reference).dequantize(), rtol=0, atol=0)
    torch.testing.assert_close(int8.dequantize(), quantize_int8_groups(reference).dequantize(), rtol=0, atol=0)
    for weight, bound in ((int4, 0.15), (int8, 0.01)):  # one rounding at 4 bits, at 8
        error = (weight.dequantize() - reference).norm() / reference.norm().clamp(min=1e-12)
        assert float(error) < bound


@needs_kernels
def test_fused_parts_in_different_formats_run_each_as_stored():
    q = stored_blocks(random_blocks(QType.Q4_K, 16, 256, 1), QType.Q4_K, (16, 256))
    v = stored_blocks(random_blocks(QType.Q6_K, 8, 256, 2), QType.Q6_K, (8, 256))
    lin = make_linear([q, v], torch.arange(24.0), "int4", stored=True)
    assert [p.format for p in lin.parts] == ["q4_k", "q6_k"]
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3))
    reference = torch.cat([q.dequantize(), v.dequantize()])
    exact = int8_activations(x).double() @ reference.double().t() + torch.arange(24.0).double()
    torch.testing.assert_close(lin(x), exact.float(), atol=1e-4, rtol=1e-4)


@needs_kernels
def test_bad_blocks_are_refused_with_the_reason():
    raw = random_blocks(QType.Q4_K, 4, 256, 7)
    with pytest.raises(ModelLoadError, match="Q4_K tensor holds 572 bytes, expected 576"):
        stored_blocks(raw.reshape(-1)[:-4], QType.Q4_K, (4, 256), "blk.0.attn_q.weight")
    with pytest.raises(ModelLoadError, match="Q6_K rows of 96 weights are not whole 256-weight blocks"):
        stored_blocks(raw, QType.Q6_K, (4, 96))
    lin = make_linear(stored_blocks(raw, QType.Q4_K, (4, 256)), None, "int4", stored=True)
    with pytest.raises(RuntimeError, match="x has 512 inputs, the weights 256"):
        kernels.tiled_linear(torch.randn(1, 512), lin.q, lin.dm, lin.kernel_format, 4, None, None)
    with pytest.raises(RuntimeError, match="row 4 of 4 rows"):
        lin.lookup(torch.tensor([0, 4]))
    q4_0 = make_linear(
        stored_blocks(random_blocks(QType.Q4_0, 4, 256, 7), QType.Q4_0, (4, 256)), None, "int4", stored=True
    )
    with pytest.raises(RuntimeError, match="super_blocks is for the K-quants .formats 5, 6, 7., not format 0"):
        kernels.tiled_linear(torch.randn(1, 256), q4_0.q, q4_0.dm, q4_0.kernel_format, 4, None, None, True)
    with pytest.raises(RuntimeError, match=r"dm must be float16 \(ceil\(N/16\), K/256, 2, 16\)"):
        kernels.tiled_linear(
            torch.randn(1, 256), lin.q, lin.dm[:, :, :1].contiguous(), lin.kernel_format, 4, None, None
        )
    with pytest.raises(RuntimeError, match=r"q must be uint8 \(ceil\(N/16\), K/32, 288\)"):
        kernels.tiled_linear(
            torch.randn(1, 256), lin.q[..., :256].contiguous(), lin.dm, lin.kernel_format, 4, None, None
        )


def test_a_type_the_kernels_do_not_run_keeps_the_files_values_under_every_weight_choice(tmp_path):
    """A Q3_K matrix (read as gguf's float values) in a float file: `float` and `auto` multiply by exactly them,
    `int8` by their Q8_0 groups and `int4` by their Q4_1 groups, each rounded once from the file's values (not Q4_1's
    values again), and the run reports the conversion it made. (In a mostly quantized file `auto` is int4: the
    mixed-file tests in test_dummy_weights.py and test_make_gguf.py.)"""
    from gguf_factory import write_tiny_gguf

    from rooftop import LLM
    from rooftop.loading.gguf_file import read_gguf

    path = tmp_path / "q3.gguf"
    write_tiny_gguf(path, qtype=lambda name: QType.Q3_K if "attn_output" in name else QType.F32)
    t = next(t for t in read_gguf(path).tensors if t.name == "blk.0.attn_output.weight")
    values = torch.from_numpy(gguf.quants.dequantize(np.asarray(t.data), QType.Q3_K).astype(np.float32)).reshape(
        t.shape
    )
    x = torch.randn(3, values.shape[1], generator=torch.Generator().manual_seed(8))
    expected = {
        "float": (values, None),
        "int8": (quantize_int8_groups(values).dequantize(), "Q3_K -> Q8_0"),
        "int4": (quantize_int4(values).dequantize(), "Q3_K -> Q4_1"),
        "auto": (values, None),  # the file is mostly float32: auto is float
    }
    for choice, (weight, conversion) in expected.items():
        llm = LLM(model=str(path), weights=choice)
        o_projs = [f"model.layers.{i}.self_attn.o_proj.weight" for i in range(llm.config.num_layers)]
        assert llm.model.conversions == ({name: conversion for name in o_projs} if conversion else {}), choice
        if conversion and cpu.ops() is None:
            continue  # PyTorch's quantized ops take other activations than the kernels' int8 rows
        activations = int8_activations(x) if conversion else x
        exact = (activations.double() @ weight.double().t()).float()
        torch.testing.assert_close(llm.model.layers[0].o(x), exact, atol=1e-4, rtol=1e-4, msg=choice)


@pytest.fixture(scope="module")
def k_quant_mix(tmp_path_factory):
    """A tiny random Llama (d = ff = 256: whole super-blocks) in a Q4_K_M-like mix of every stored format, and
    transformers' model of the same file (it decodes the blocks with gguf's dequantizer)."""
    from gguf_factory import write_tiny_gguf
    from transformers import AutoModelForCausalLM

    mix = {
        "token_embd.weight": QType.Q4_K,
        "attn_q": QType.Q4_K,
        "attn_k": QType.Q5_0,
        "attn_v": QType.Q6_K,
        "attn_output": QType.Q5_K,
        "ffn_gate": QType.Q4_0,
        "ffn_up": QType.Q5_1,
        "ffn_down": QType.Q8_0,
    }
    path = tmp_path_factory.mktemp("mix") / "k-mix.gguf"
    write_tiny_gguf(path, qtype=lambda name: next((t for part, t in mix.items() if part in name), QType.F32))
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return path, reference


def test_a_k_quant_mix_matches_transformers_on_the_float_path_and_runs_each_format_as_stored(k_quant_mix):
    from near_ties import QUANTIZED_TIE, rooftop_logits

    from rooftop import LLM, SamplingParams

    path, reference = k_quant_mix
    ids = list(range(3, 40))
    with torch.no_grad():
        theirs = reference(torch.tensor([ids])).logits[0]
        exact = copy.deepcopy(reference).double()(torch.tensor([ids])).logits[0]
    float_llm = LLM(model=str(path), weights="float")
    # float32 rounding against float64 on the same weights, judged by transformers' own: on an Intel Xeon host its
    # float32 logits were 6.6e-4 from float64, rooftop's 1.7e-4 (an AMD host: both under 1e-4)
    ours = rooftop_logits(float_llm)(ids).double()
    assert (ours - exact).abs().max() <= max(2 * (theirs.double() - exact).abs().max(), 1e-4)
    if kernels is None:
        return
    llm = LLM(model=str(path))  # auto: every matrix in the format the file holds it in
    layer = llm.model.layers[0]
    assert [p.format for p in layer.qkv.parts] == ["q4_k", "q5_0", "q6_k"]
    assert (layer.o.format, layer.mlp.down.format, [p.format for p in layer.mlp.gate_up.parts]) == (
        "q5_k",
        "q8_0",
        ["q4_0", "q5_1"],
    )
    assert llm.model.lm_head.format == "q4_k"  # the tied embedding, as stored
    assert llm.model.embed is llm.model.lm_head  # the lookup table and the head: one copy of the matrix
    assert set(llm.precision.weights.name.split("+")) == {"q4_k", "q5_0", "q6_k", "q5_k", "q8_0", "q4_0", "q5_1"}
    ours = rooftop_logits(llm)(ids)
    # int8 activations on the same weights: ~0.1 of this tiny random model's logits in every format the kernels run
    # (measured: Q8_0 0.098, Q4_1 0.115, Q4_K 0.081, this mix 0.088), none of it from the weights' decoding
    assert float((ours - theirs).norm() / theirs.norm()) < 0.15
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    own = llm.generate({"prompt_token_ids": ids}, greedy)[0].token_ids
    with torch.no_grad():
        ref = reference.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids) :].tolist()
    i = next((j for j, (a, b) in enumerate(zip(own, ref, strict=True)) if a != b), None)
    if i is not None:  # a parting only where transformers' own top two nearly tie
        with torch.no_grad():
            logits = reference(torch.tensor([ids + ref[:i]])).logits[0, -1]
        assert float(logits[ref[i]] - logits[own[i]]) < QUANTIZED_TIE


@needs_kernels
def test_a_tied_q8_0_embedding_is_held_once_and_looks_rows_up_as_the_file_holds_them(tmp_path):
    from gguf import GGUFReader
    from gguf_factory import write_tiny_gguf

    from rooftop import LLM
    from rooftop.quant.linear import Q8Linear

    path = tmp_path / "q8-embed.gguf"
    write_tiny_gguf(path, qtype={"token_embd.weight": QType.Q8_0})
    llm = LLM(model=str(path), weights="int8")  # the bundled model's case: its Q8_0 embedding, tied
    assert isinstance(llm.model.lm_head, Q8Linear) and llm.model.embed is llm.model.lm_head
    stored = next(t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
    table = torch.from_numpy(gguf.quants.dequantize(stored.data, QType.Q8_0).astype(np.float32))
    ids = torch.tensor([0, 1, 17, table.shape[0] - 1])
    assert torch.equal(llm.model.embed.lookup(ids), table[ids])


def test_generate_says_which_format_ran_for_how_many_bytes_and_what_was_converted(k_quant_mix, tmp_path):
    from gguf_factory import write_tiny_gguf
    from test_cli import rooftop_in_process

    path, _ = k_quant_mix
    out = rooftop_in_process("generate", "hi", "--model", str(path), "-n", "2", "--no-roofline")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("block linears: ")]
    if kernels is None:  # PyTorch's int4 for every block linear: one format, which the model line names
        assert lines == []
    else:
        held = lines[0].removeprefix("block linears: ").split(" of ")[0].split(", ")
        assert {part.split()[0] for part in held} == {"q4_k", "q5_0", "q6_k", "q5_k", "q8_0", "q4_0", "q5_1"}
    rare = tmp_path / "q3_k.gguf"
    write_tiny_gguf(rare, qtype={"blk.0.ffn_up.weight": QType.Q3_K, "blk.1.ffn_up.weight": QType.Q3_K})
    out = rooftop_in_process("generate", "hi", "--model", str(rare), "-n", "2", "--no-roofline", "--weights", "int4")
    assert out.returncode == 0, out.stderr
    assert "converted at load: 2 tensors Q3_K -> Q4_1" in out.stderr
    out = rooftop_in_process("generate", "hi", "--model", str(rare), "-n", "2", "--no-roofline")
    assert out.returncode == 0, out.stderr
    assert "converted at load" not in out.stderr  # a float file: auto is float, and keeps the file's values


def test_an_exact_block_format_choice_points_to_auto(k_quant_mix):
    from rooftop import LLM, UnsupportedModelError

    path, _ = k_quant_mix
    with pytest.raises(UnsupportedModelError, match="a GGUF's own q4_k tensors run as stored with --weights auto"):
        LLM(model=str(path), weights="q4_k")


def test_a_k_quant_mix_runs_on_pytorchs_ops_where_the_kernels_do_not_build(k_quant_mix, monkeypatch):
    """Without rooftop's kernels every block linear becomes PyTorch's group-32 int4: the same Q4_1 groups as the
    kernels' explicit int4, so the two differ only by their activations' rounding (bfloat16 against int8)."""
    from near_ties import rooftop_logits

    from rooftop import LLM
    from rooftop.quant.linear import Int4Linear

    path, _ = k_quant_mix
    ids = list(range(3, 40))
    kernels_int4 = None
    if kernels is not None:
        int4 = LLM(model=str(path), weights="int4")
        # the head in Q8_0, the lookup table the file's Q4_K in tiles: gguf's values, decoded in C++
        assert int4.model.lm_head.format == "q8_0" and isinstance(int4.model.embed, BlockLinear)
        assert int4.model.embed.format == "q4_k"
        kernels_int4 = rooftop_logits(int4)(ids)
    monkeypatch.setattr(cpu, "ops", lambda: None)
    llm = LLM(model=str(path))
    assert all(isinstance(lin, Int4Linear) for lin in (llm.model.layers[0].qkv, llm.model.layers[0].mlp.down))
    ours = rooftop_logits(llm)(ids)
    assert torch.isfinite(ours).all()
    if kernels_int4 is not None:
        assert float((ours - kernels_int4).norm() / kernels_int4.norm()) < 0.2


def test_a_quantized_choice_says_which_of_the_files_formats_it_rounded_again(k_quant_mix):
    """--weights int4 (or int8) on a file of other block formats quantizes those matrices a second time, from their
    values: the run says which, and that auto runs them as stored; the formats the choice holds exactly (Q4_0's
    values in Q4_1) and the float choice (the file's values) are not named."""
    from rooftop import LLM

    path, _ = k_quant_mix
    notes = {choice: LLM(model=str(path), weights=choice).load_notes for choice in ("int4", "int8", "float", "auto")}

    def rounded_again(choice: str) -> set[str]:
        (note,) = [n for n in notes[choice] if n.startswith(f"--weights {choice}: ")]
        assert "--weights auto runs them as the file holds them" in note
        return set(note.split("the file's ")[1].split(" matrices")[0].split(" and "))

    every = {"q4_k", "q5_0", "q6_k", "q5_k", "q8_0", "q4_0", "q5_1"}
    assert rounded_again("int4") == every - {"q4_0"}
    assert rounded_again("int8") == every - ({"q8_0"} if kernels is not None else set())
    assert not any("quantized again" in n for n in notes["float"] + notes["auto"])
