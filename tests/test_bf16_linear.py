"""bfloat16 weights with float32 activations (kernels/bf16.cpp, quant.linear.Bf16Linear): the kernel's fixed order on
every path and at any row count (float32 weights too, an MoE router's), its product against float64, the linear's narrow and widened paths, and a bf16
checkpoint run as bf16-fp32 under `auto` against transformers on the same file."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as T
from gguf_factory import write_tiny_gguf
from test_hf_models import SHAPE, write_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from rooftop import LLM, SamplingParams
from rooftop.engine.calibrate import OpTimer
from rooftop.errors import UnsupportedModelError
from rooftop.kernels import cpu
from rooftop.models.kv_cache import KVCache
from rooftop.quant.linear import WIDEN_ROWS, Bf16Linear, FloatLinear, RowPlan, holds_bf16, runs_bf16

kernels = cpu.ops()
pytestmark = pytest.mark.skipif(kernels is None, reason="rooftop's CPU kernels did not build on this machine")


def bf16_case(n: int, k: int, rows: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen).bfloat16()
    return w, torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen), torch.randn(rows, n, generator=gen)


@pytest.mark.parametrize("n, k", [(48, 96), (33, 64), (7, 32), (40, 2080)])
def test_the_kernel_is_its_plain_loops_bit_for_bit_and_a_row_never_depends_on_the_others(n, k):
    """The vector path takes two weight rows at a time (one from each half of a thread's range) and up to 4
    activation rows per pass: each output must be the plain loops' sum in their order, alone or among any rows."""
    w, x, bias, res = bf16_case(n, k, 9, n * k)
    full = kernels.bf16_linear(x, w, bias, res)
    assert torch.equal(full, kernels.bf16_linear(x, w, bias, res, loops=True))
    alone = torch.cat([kernels.bf16_linear(x[i : i + 1], w, bias, res[i : i + 1]) for i in range(9)])
    assert torch.equal(full, alone)
    for rows in (2, 3, 4, 5, 8):
        assert torch.equal(kernels.bf16_linear(x[:rows], w, bias, res[:rows]), alone[:rows])
    assert kernels.bf16_linear(x[:0], w).shape == (0, n)


def test_the_kernel_is_the_float32_product_of_the_bf16_values():
    """Each weight widens exactly (a bf16 is a float32's top half): the result is the float64 product of the same
    values up to float32 rounding of a 2048-term sum."""
    w, x, bias, res = bf16_case(300, 2048, 3, 1)
    exact = x.double() @ w.double().T + bias.double() + res.double()
    got = kernels.bf16_linear(x, w, bias, res).double()
    assert (got - exact).abs().max() < 1e-5 * (x.double().abs() @ w.double().abs().T).max()
    assert torch.equal(kernels.bf16_linear(x, w), kernels.bf16_linear(x, w, None, None, loops=True))


def test_bad_inputs_are_refused_with_the_reason():
    w, x, _, _ = bf16_case(16, 64, 2, 2)
    with pytest.raises(RuntimeError, match="w must be contiguous bfloat16"):
        kernels.bf16_linear(x, w.float())
    with pytest.raises(RuntimeError, match="x has 32 features, w 64"):
        kernels.bf16_linear(x[:, :32].contiguous(), w)
    with pytest.raises(RuntimeError, match="K must be a multiple of 32"):
        kernels.bf16_linear(torch.ones(2, 48), torch.ones(16, 48).bfloat16())


def test_float32_weights_take_the_same_order():
    """f32_linear (an MoE router's kernel) loads float32 weights where bf16_linear widens bfloat16 ones, and sums
    in the same order: its plain loops' bits, a row alone as among others, and bf16_linear's bits on weights that
    are bfloat16 values."""
    w, x, bias, res = bf16_case(40, 2080, 9, 7)
    full = w.float() + torch.randn(w.shape, generator=torch.Generator().manual_seed(8)) * 1e-3  # not bf16 values
    got = kernels.f32_linear(x, full, bias, res)
    assert torch.equal(got, kernels.f32_linear(x, full, bias, res, loops=True))
    assert torch.equal(got, torch.cat([kernels.f32_linear(x[i : i + 1], full, bias, res[i : i + 1]) for i in range(9)]))
    exact = x.double() @ full.double().T + bias.double() + res.double()
    assert (got.double() - exact).abs().max() < 1e-5 * (x.double().abs() @ full.double().abs().T).max()
    assert torch.equal(kernels.f32_linear(x, w.float(), bias, res), kernels.bf16_linear(x, w, bias, res))
    with pytest.raises(RuntimeError, match="w must be contiguous float32"):
        kernels.f32_linear(x, w)


def test_the_linear_runs_narrow_rows_on_the_kernel_and_widens_planned_chunks():
    """Narrow rows (decodes, short chunks) run the kernel, in any leading shape and dtype; a planned chunk runs one
    float32 matmul on the weights widened into a reused buffer, the rows after it the kernel as if alone."""
    w, _, bias, _ = bf16_case(64, 128, 1, 3)
    lin = Bf16Linear.from_weight(w.float(), bias)
    assert lin.format == "bf16-fp32" and lin.nbytes == 64 * 128 * 2 and lin.widen_rows == WIDEN_ROWS
    x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(4))
    assert torch.equal(lin(x), lin(x.reshape(6, 128)).reshape(2, 3, 64))
    assert lin(x.bfloat16()).dtype == torch.bfloat16
    res = torch.randn(6, 64, generator=torch.Generator().manual_seed(8))
    assert torch.equal(lin(x.reshape(6, 128), res), kernels.bf16_linear(x.reshape(6, 128), w, bias.float(), res))
    many = torch.randn(WIDEN_ROWS + 8, 128, generator=torch.Generator().manual_seed(5))
    planned = lin(many, plan=RowPlan((WIDEN_ROWS,)))
    torch.testing.assert_close(planned[:WIDEN_ROWS], F.linear(many[:WIDEN_ROWS], w.float(), bias))
    assert torch.equal(planned[WIDEN_ROWS:], lin(many[WIDEN_ROWS:]))
    smaller = Bf16Linear.from_weight(w[:16].float(), None)  # the buffer kept for the first is reused, not re-sized
    torch.testing.assert_close(smaller(many, plan=RowPlan((WIDEN_ROWS + 8,))), F.linear(many, w[:16].float()))


def test_auto_holds_a_float32_matrix_in_bf16_only_where_every_value_is_one():
    gen = torch.Generator().manual_seed(6)
    values = torch.randn(1000, 64, generator=gen)
    assert not holds_bf16(values) and holds_bf16(values.bfloat16().float())
    rounded = values.bfloat16().float()
    rounded[999, 63] += 2**-20  # one value off the bf16 grid, in the last slice of rows checked
    assert not holds_bf16(rounded)
    assert runs_bf16(values.bfloat16().float())
    assert not runs_bf16(torch.ones(8, 48))  # inputs not a multiple of 32: the float path


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory) -> tuple[Path, LlamaForCausalLM]:
    """A tiny random Llama saved by transformers in bfloat16, as most Hugging Face checkpoints are."""
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    path = tmp_path_factory.mktemp("bf16")
    model.to(torch.bfloat16).save_pretrained(path)
    write_tokenizer(path)
    return path, LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_a_bf16_checkpoint_runs_as_bf16_fp32_under_auto_and_agrees_with_transformers(bf16_checkpoint):
    """`auto` keeps a bf16 checkpoint's linears (the tied lm_head too, whose tensor is also the embedding table) at
    their 16 bits with float32 math; the logits are transformers' float32 logits on the same values, the greedy
    tokens those of `--weights float`."""
    path, reference = bf16_checkpoint
    auto, float32 = LLM(model=str(path)), LLM(model=str(path), weights="float")
    model = auto.engine.model
    assert auto.precision.weights.name == "bf16-fp32" and auto.precision.lm_head is None
    assert isinstance(model.lm_head, Bf16Linear) and all(isinstance(p, Bf16Linear) for p in model.layers[0].linears())
    assert float32.precision.weights.name == "fp32" and isinstance(float32.engine.model.lm_head, FloatLinear)
    assert model.embed is model.lm_head.weight  # the tied table is the head's bf16 tensor, held once
    ids = [1, 5, 9, 33, 70, 2, 8, 120, 44, 3]
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    cache = KVCache(model.config, capacity=64, dtype=torch.float32, device="cpu")
    logits = model.logits(model.forward(torch.tensor(ids), cache, 0))
    torch.testing.assert_close(logits, expected, atol=1e-3, rtol=1e-4)
    greedy = SamplingParams(max_tokens=8, temperature=0)
    assert auto.generate([ids], greedy)[0].token_ids == float32.generate([ids], greedy)[0].token_ids


def test_an_untied_bf16_checkpoint_keeps_its_table_and_linears_in_bf16_as_read(tmp_path):
    """A bf16 checkpoint's matrices stay bfloat16 from the file to the model under `auto` (widened to float32, checked
    value by value and narrowed again, they were most of a bf16 file's load), an untied embedding table too: half a
    float32 table, its rows the file's values widened as they are looked up."""
    torch.manual_seed(1)
    hf = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=False))
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.4)
    hf.to(torch.bfloat16).save_pretrained(tmp_path)
    write_tokenizer(tmp_path)
    reference = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    model = LLM(model=str(tmp_path)).engine.model
    assert model.embed.dtype == torch.bfloat16
    assert torch.equal(model.embed, reference.model.embed_tokens.weight.bfloat16())
    assert isinstance(model.lm_head, Bf16Linear) and torch.equal(
        model.lm_head.weight, reference.lm_head.weight.bfloat16()
    )
    ids = [1, 5, 9, 33, 70, 2, 8, 120]
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    cache = KVCache(model.config, capacity=64, dtype=torch.float32, device="cpu")
    torch.testing.assert_close(model.logits(model.forward(torch.tensor(ids), cache, 0)), expected, atol=1e-3, rtol=1e-4)


def test_a_bf16_gguf_runs_its_matrices_as_the_file_holds_them(tmp_path):
    """A GGUF's BF16 matrices are read as bfloat16 (not through float32) and run as bf16-fp32 under `auto`, each
    linear's weight the file's values (llama's Q and K rows unpermuted), the greedy tokens those of float32."""
    path = tmp_path / "bf16.gguf"
    weights = write_tiny_gguf(path, qtype=lambda name: T.BF16)
    auto, float32 = LLM(model=str(path)), LLM(model=str(path), weights="float")
    model = auto.engine.model
    assert auto.precision.weights.name == "bf16-fp32" and model.embed is model.lm_head.weight
    assert torch.equal(model.embed, torch.from_numpy(weights["model.embed_tokens.weight"]).bfloat16())
    fused = torch.cat([torch.from_numpy(weights[f"model.layers.1.mlp.{n}_proj.weight"]) for n in ("gate", "up")])
    assert torch.equal(model.layers[1].mlp.gate_up.weight, fused.bfloat16())
    greedy = SamplingParams(max_tokens=6, temperature=0)
    assert auto.generate([[1, 7, 30]], greedy)[0].token_ids == float32.generate([[1, 7, 30]], greedy)[0].token_ids


def test_bf16_fp32_names_a_bf16_checkpoints_own_weights_and_elsewhere_says_how_to_get_it(bf16_checkpoint, tiny_gguf):
    """As `auto` runs a bf16 checkpoint on the CPU, the format it runs as is also an exact choice there; on a float32
    file it is refused, and bf16 (the model's dtype) says which --dtype it takes."""
    exact = LLM(model=str(bf16_checkpoint[0]), weights="bf16-fp32")
    assert exact.precision.weights.name == "bf16-fp32"
    with pytest.raises(UnsupportedModelError, match="run as bf16-fp32 on the CPU with --weights auto or bf16-fp32"):
        LLM(model=tiny_gguf, weights="bf16-fp32")
    with pytest.raises(UnsupportedModelError, match="bf16 weights run with --dtype bfloat16"):
        LLM(model=str(bf16_checkpoint[0]), weights="bf16")


def test_the_calibration_times_bf16_fp32_linears_as_linears(bf16_checkpoint):
    """The calibration splits a step into op classes by timing each linear class's calls: a bf16-fp32 model's
    linears must be timed as linears, not left in the host time beside them."""
    llm = LLM(model=str(bf16_checkpoint[0]))
    timer = OpTimer(llm.device)
    with timer.installed(llm):
        llm.generate([[1, 5, 9]], SamplingParams(max_tokens=2, temperature=0))
    assert timer.seconds["linears"] > 0 and timer.calls > 0
