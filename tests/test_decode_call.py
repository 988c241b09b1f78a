"""A step of decodes in one call to the CPU kernels (models/decode_call.py) gives every row the bits the
layer-by-layer path gives: the bundled model's tiles and a K-quant file's, a float32, bfloat16 and int8 KV cache,
bfloat16 linears, greedy and seeded sampling, a fused projection of two formats (a Q4_K_M file's), and a prompt that
joins while another decodes (its prefill steps go layer by layer).
Qwen3's q/k norms and Qwen2's biases are in test_hf_models.py. Float weights go layer by layer; the calibration's op
timer reads the call's own clocks."""

from __future__ import annotations

import gguf
import pytest
from gguf_factory import write_tiny_gguf

from rooftop import LLM, SamplingParams
from rooftop.engine.calibrate import OpTimer
from rooftop.models.decode_call import DecodeCall

PROMPTS = ["Hello there", "What is the weather in Lagos?", [5, 6, 7, 8, 9, 10, 11, 12, 13]]


def outputs(llm: LLM, params: list[SamplingParams]) -> list[tuple]:
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def both_ways(llm: LLM, run, monkeypatch) -> tuple:
    """run(llm) with the one call, then layer by layer; and the steps the one call took."""
    calls = []
    original = DecodeCall.__call__

    def counted(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(DecodeCall, "__call__", counted)
    model = llm.engine.model
    one = model.decode_call
    assert one is not None
    one_call = run(llm)
    model.decode_call = None
    try:
        layered = run(llm)
    finally:
        model.decode_call = one
    return one_call, layered, len(calls)


def sampling() -> list[SamplingParams]:
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
    seeded = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True, logprobs=1)
    return [greedy, seeded, greedy]


@pytest.fixture(scope="module")
def k_quant_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("q4k") / "tiny-q4_k.gguf"
    write_tiny_gguf(path, qtype=gguf.GGMLQuantizationType.Q4_K, context_length=256)
    return path


def test_the_bundled_model_decodes_the_same_bits_in_one_call(monkeypatch):
    llm = LLM()  # Q4_1 tiles, the Q8_0 table's
    one_call, layered, calls = both_ways(llm, lambda m: outputs(m, sampling()), monkeypatch)
    assert one_call == layered
    assert calls == 11  # 12 tokens each: the first from the prefill step, the other 11 from decode steps of all three


@pytest.mark.parametrize("kv", ["float32", "bfloat16", "int8"])
def test_a_k_quant_file_decodes_the_same_bits_in_one_call_for_each_kv_cache(k_quant_file, kv, monkeypatch):
    llm = LLM(model=k_quant_file, kv_cache_dtype=kv)
    one_call, layered, calls = both_ways(llm, lambda m: outputs(m, sampling()), monkeypatch)
    assert one_call == layered and calls == 11


def test_a_q4_k_m_mix_runs_its_fused_projection_of_two_formats_in_one_call(tmp_path, monkeypatch):
    """A Q4_K_M file's V in Q6_K beside Q and K in Q4_K: the fused QKV is two tiled parts (ConcatLinear)."""
    path = tmp_path / "tiny-mix.gguf"
    kinds = gguf.GGMLQuantizationType
    write_tiny_gguf(path, qtype=lambda name: kinds.Q6_K if "attn_v" in name or "ffn_down" in name else kinds.Q4_K)
    llm = LLM(model=path)
    assert type(llm.engine.model.layers[0].qkv).__name__ == "ConcatLinear"
    one_call, layered, calls = both_ways(llm, lambda m: outputs(m, sampling()), monkeypatch)
    assert one_call == layered and calls == 11


def test_a_bf16_file_runs_its_bf16_linears_in_one_call(tmp_path, monkeypatch):
    path = tmp_path / "tiny-bf16.gguf"
    write_tiny_gguf(path, qtype=lambda name: gguf.GGMLQuantizationType.BF16)
    llm = LLM(model=path)  # auto: bf16-fp32 on rooftop's kernel
    assert type(llm.engine.model.layers[0].o).__name__ == "Bf16Linear"
    one_call, layered, calls = both_ways(llm, lambda m: outputs(m, sampling()), monkeypatch)
    assert one_call == layered and calls == 11


def test_a_prompt_that_joins_mid_decode_takes_its_prefill_layer_by_layer(k_quant_file, monkeypatch):
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=1)

    def staggered(llm: LLM) -> list:
        engine = llm.engine
        engine.add_request("first", [5, 6, 7], params)
        for _ in range(4):
            engine.step()
        engine.add_request("second", list(range(20, 60)), params)  # a 40-token prefill beside "first"'s decode
        done = {}
        while engine.has_unfinished():
            for delta in engine.step().deltas:
                if delta.finished:
                    done[delta.request_id] = (delta.output.token_ids, delta.output.logprobs)
        return [done["first"], done["second"]]

    llm = LLM(model=k_quant_file)
    one_call, layered, calls = both_ways(llm, staggered, monkeypatch)
    assert one_call == layered
    # one call: "first"'s 3 decodes alone, then (after the step of "second"'s prefill beside a decode, layer by layer)
    # 5 steps of both and 4 of "second" alone
    assert calls == 3 + 5 + 4


def test_float_weights_go_layer_by_layer(tiny_llm):
    assert tiny_llm.engine.model.decode_call is None


def test_the_op_timer_reads_the_one_calls_own_clocks(k_quant_file, monkeypatch):
    """Timed by the calibration's op timer, a decode step still runs in one call, which clocks each op class inside
    it: every class has time, and the only call the timer wrapped in Python is the lm_head's."""
    llm = LLM(model=k_quant_file)
    engine, calls = llm.engine, []
    original = DecodeCall.__call__
    monkeypatch.setattr(DecodeCall, "__call__", lambda self, *args: calls.append(1) or original(self, *args))
    engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    engine.step()  # the prefill
    timer = OpTimer(llm.device)
    with timer.installed(llm):
        timer.reset()
        engine.step()
        seconds, timed_calls = timer.reset()
    assert calls == [1] and timed_calls == 1
    assert all(seconds[name] > 0 for name in ("linears", "attention", "elementwise"))
    assert llm.engine.model.decode_call.seconds is None  # the clocks go with the timer
