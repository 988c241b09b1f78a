"""Bound, expected and the gap between them and the measured step (issue 16): the fused bound on hand-made ops,
the calibration's curves and expected times by hand on synthetic timings, the decomposition summing to the
measured time, the calibration run on a real engine (quick mode), its cache, and the advice per phase."""

import json
import re
from dataclasses import replace

import pytest
import torch

from rooftop import SamplingParams
from rooftop.engine import calibrate as calibration_run
from rooftop.engine.probe import load_or_run_probe
from rooftop.enums import Phase
from rooftop.errors import InvalidRequestError
from rooftop.quant.linear import FloatLinear
from rooftop.roofline.attribution import PhaseAttribution, advice, attribute_phases, attribute_step
from rooftop.roofline.calibration import CLASSES, Calibration, Curve, Gap, class_roofline, op_class
from rooftop.roofline.hardware import Hardware
from rooftop.roofline.ops import COSTING, Op, SeqShape, StepShape
from rooftop.roofline.precision import precision
from rooftop.roofline.predict import step_bound, time_step
from rooftop.roofline.presets import find_preset

# a fake probe: round roofs, so every time below is a hand calculation
HW = Hardware("fake", {"fp32": 1e11, "bf16": 1e11}, memory_bandwidth=1e10, memory_bytes=1e12)


def test_the_bound_fuses_away_activations_and_overlaps_compute_with_memory():
    ops = [
        Op("qkv_proj", flops=2e9, bytes_read=1e8 + 4e6, bytes_written=2e6, compute="fp32", activation_bytes=6e6),
        Op("norms", flops=1e6, bytes_read=4e6, bytes_written=4e6, compute="fp32", activation_bytes=8e6),
    ]
    # compute 2.001e9 / 1e11 = 20.01 ms; the bytes no fusion avoids: 1e8 / 1e10 = 10 ms
    assert step_bound(ops, HW) == pytest.approx(0.02001)
    # one after another at their roofs: max(20 ms, 10.6 ms) + max(0.01 ms, 0.8 ms)
    assert sum(op.time(HW) for op in ops) == pytest.approx(0.0208)


@pytest.mark.parametrize("shape", [StepShape.decode(1, 10), StepShape.decode(32, 4000), StepShape.prefill(2, 777)])
def test_the_bound_is_below_the_ops_at_their_roofs(shape):
    config, p = find_preset("qwen3-8b"), precision("bf16")
    step = time_step(config, p, shape, HW)
    assert 0 < step.bound_s <= step.time_s
    assert sum(class_roofline(step, HW).values()) == pytest.approx(step.time_s)


def test_op_classes():
    assert [op_class(n) for n in ("down_proj", "lm_head", "rope", "linear_recurrence", "norms", "all_reduce")] == [
        "linears",
        "linears",
        "attention",
        "attention",
        "elementwise",
        "communication",
    ]


def test_a_curve_interpolates_floors_below_and_keeps_its_last_efficiency_above():
    curve = Curve.through([(2.0, 3.0), (1.0, 2.0), (4.0, 4.0), (1.0, 4.0)])  # two samples at 1: averaged
    assert curve.points == ((1.0, 3.0), (2.0, 3.0), (4.0, 4.0))
    assert curve.at(0.1) == 3.0  # below the first point: its time (fixed costs)
    assert curve.at(3.0) == pytest.approx(3.5)
    assert curve.at(8.0) == pytest.approx(8.0)  # above: the last point's seconds per unit of input


def test_expected_time_from_synthetic_timings_by_hand():
    """Linears take twice their roofline in prefill and 1 ms + 3/7 ms per row past the first in decode, attention
    three times its roofline, elementwise the same; 1 ms of host per step plus 0.5 ms per sequence; 2 ms around each
    step."""
    config, p = find_preset("llama-3.2-1b"), precision("fp32")

    def scaled(factor):
        return Curve(((1e-9, factor * 1e-9), (1.0, factor * 1.0)))

    curves = {
        f"{phase}.{name}": scaled(f)
        for phase in ("prefill", "decode")
        for name, f in (("linears", 2), ("attention", 3), ("elementwise", 1))
    }
    curves["decode.linears"] = Curve(((1, 0.001), (8, 0.004)))  # against the step's rows (ROWS_KEYED)
    curves |= {f"{phase}.host": Curve(((1, 0.0015), (8, 0.005))) for phase in ("prefill", "decode")}
    curves |= {f"{phase}.around": Curve(((1, 0.002), (8, 0.002))) for phase in ("prefill", "decode")}
    cal = Calibration(curves)
    shape = StepShape.decode(4, 100)
    roof = class_roofline(time_step(config, p, shape, HW), HW)
    expected = cal.expected(config, p, shape, HW)
    assert expected.classes["linears"] == pytest.approx(0.001 + 3 * 0.003 / 7)
    assert expected.classes["attention"] == pytest.approx(3 * roof["attention"])
    assert expected.classes["elementwise"] == pytest.approx(roof["elementwise"])
    assert expected.host_s == pytest.approx(0.0015 + 3 * 0.0035 / 7)
    assert expected.total_s == pytest.approx(
        expected.classes["linears"] + 3 * roof["attention"] + roof["elementwise"] + expected.host_s + 0.002
    )
    # a speculative verify step of 4 rows per sequence: its linears at 16 rows, past the last point on its slope
    verify = StepShape((SeqShape(4, 100, count=4, phase=Phase.DECODE),))
    assert cal.expected(config, p, verify, HW).classes["linears"] == pytest.approx(0.004 + 8 * 0.003 / 7)
    prefill = StepShape.prefill(1, 300)
    prefill_roof = class_roofline(time_step(config, p, prefill, HW), HW)
    assert cal.expected(config, p, prefill, HW).classes["linears"] == pytest.approx(2 * prefill_roof["linears"])
    # a prefill's host time inside the forward pass at its tokens (past the last point on its slope), not its one
    # sequence: what its timed ops leave of the forward pass grows with the chunk
    assert cal.expected(config, p, prefill, HW).host_s == pytest.approx(0.005 + 292 * 0.0035 / 7)
    assert cal.expected(config, p, StepShape.decode(16, 100), HW).host_s == pytest.approx(0.005 + 8 * 0.0035 / 7)
    # a mixed step: its prefill chunk and its decodes each on their own phase's curves
    mixed = StepShape((*StepShape.prefill(1, 300).seqs, *shape.seqs))
    both = cal.expected(config, p, mixed, HW)
    alone = [cal.expected(config, p, s, HW) for s in (StepShape.prefill(1, 300), shape)]
    assert both.classes["linears"] == pytest.approx(sum(e.classes["linears"] for e in alone))
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal


def test_the_gap_parts_add_up_to_the_measured_step(tiny_llm, tmp_path, monkeypatch):
    """On real recorded steps. (Whether the bound stays below the measured time depends on the probe's roofs being
    the machine's: the suite's quick probe on a busy host is not, so the benchmark checks that, docs/BENCHMARKS.md.)"""
    hw = load_or_run_probe(quick=True).to_hardware(working_set=tiny_llm.weight_bytes)  # the session's probe
    monkeypatch.setenv("ROOFTOP_CACHE_DIR", str(tmp_path))  # the calibration's cache
    cal = calibration_run.load_or_calibrate(tiny_llm, hw, quick=True)
    for key in ("decode.linears", "decode.attention", "decode.host", "decode.around", "prefill.linears"):
        assert key in cal.curves and all(y >= 0 for _, y in cal.curves[key].points), key
    # a one-token prompt runs the decode kernels, not the widened matmul: its own prefill point
    assert ("a prompt of 1 token", 1, 1, 1) in calibration_run._runs(tiny_llm, tiny_llm.engine, calibration_run.QUICK)
    before = len(tiny_llm.step_records)
    tiny_llm.generate(["hello there", "a second prompt"], SamplingParams(max_tokens=6, temperature=0))
    records = list(tiny_llm.step_records)[before:]
    p = tiny_llm.precision
    steps = [attribute_step(tiny_llm.config, p, r.shape, r.seconds, hw, r.around_seconds, cal) for r in records]
    for step, record in zip(steps, records, strict=True):
        gap = step.gap(hw)
        assert sum(gap.parts().values()) == pytest.approx(record.wall_seconds, rel=1e-9)
        assert 0 < gap.bound_s <= step.predicted.time_s and gap.unfused_s >= 0
        assert step.expected.total_s > 0
    phases = attribute_phases(steps, hw)
    decode = phases["decode"]
    assert sum(decode.gap.parts().values()) == pytest.approx(decode.measured_s)
    assert decode.expected_s == pytest.approx(sum(s.expected.total_s for s in steps if s.shape.phase == "decode"))


def test_calibration_is_cached_per_model_and_settings(tiny_llm, tmp_path, monkeypatch):
    hw = load_or_run_probe(quick=True).to_hardware()
    monkeypatch.setenv("ROOFTOP_CACHE_DIR", str(tmp_path))
    first = calibration_run.load_or_calibrate(tiny_llm, hw, quick=True)
    path = calibration_run.cache_path(tiny_llm, hw)
    assert path.parent == tmp_path and json.loads(path.read_text())["quick"] is True
    monkeypatch.setattr(calibration_run, "calibrate", lambda *a, **k: pytest.fail("the cache was not used"))
    assert calibration_run.load_or_calibrate(tiny_llm, hw, quick=True) == first
    faster = Hardware(hw.name, hw.peak_flops, 2 * hw.memory_bandwidth, hw.memory_bytes)
    assert calibration_run.cache_path(tiny_llm, faster) != path  # other roofs: other curves


def test_a_full_calibration_decodes_after_its_long_prompt(tiny_llm):
    """The full plan's long prompt (about `long` tokens in whole chunks, two at least) is decoded after, so the
    decode's attention has a point at a long context: carried from the few hundred tokens the caches hold, it was
    not what thousands take (docs/BENCHMARKS.md). The tiny model's 64 positions hold 48 in chunks of 16."""
    from types import SimpleNamespace

    def runs(chunk: int, long: int) -> list:
        config = replace(tiny_llm.engine.config, chunked_prefill_size=chunk)
        plan = calibration_run.FULL | {"long": long}
        return calibration_run._runs(tiny_llm, SimpleNamespace(config=config, stats=tiny_llm.engine.stats), plan)

    steps = calibration_run.FULL["steps"]
    assert runs(16, 50)[-1] == ("a prompt of 48 tokens, in chunks of 16, and a decode after it", 1, 48, steps + 1)
    assert all("chunks" not in label for label, *_ in runs(32, 50))  # one chunk only: no long prompt


def test_the_float_rows_are_in_the_identity_only_of_a_model_with_float_linears(tiny_gguf, tiny_llm, monkeypatch):
    """The rows a float decode is padded to are timed per process (1 or 2 on one host): a quantized model had them
    in its identity, so the full calibration `rooftop calibrate` cached went unused by a later `generate` whenever
    they came out otherwise, and a quick one, timed to 128 tokens, ran in its place (docs/BENCHMARKS.md)."""
    from rooftop import LLM
    from rooftop.quant import linear as linears

    hw = load_or_run_probe(quick=True).to_hardware()
    quantized = LLM(model=tiny_gguf, weights="int8")
    identities = {}
    for rows in (1, 2):
        monkeypatch.setattr(linears, "float_narrow_rows", lambda dtype, rows=rows: rows)
        identities[rows] = [calibration_run.identity(llm, hw, llm.engine) for llm in (quantized, tiny_llm)]
    assert identities[1][0] == identities[2][0] and identities[1][0]["float_narrow_rows"] == ""
    assert identities[1][1]["float_narrow_rows"] == "1" and identities[2][1]["float_narrow_rows"] == "2"


def test_a_benchs_own_prompt_is_calibrated_and_cached_apart(tiny_llm, tmp_path, monkeypatch):
    """`rooftop bench -p N`'s quick calibration times a prompt of N tokens: a quick plan's longest prompt (128
    tokens), carried to a long N, mispredicted it (docs/BENCHMARKS.md). Each calibration keeps the longest context
    its runs reached, which `generate`'s report compares its own with (a quick one's 128 tokens expected a
    3,679-token prompt's decode at twice what it took)."""
    hw = load_or_run_probe(quick=True).to_hardware()
    monkeypatch.setenv("ROOFTOP_CACHE_DIR", str(tmp_path))
    plain = calibration_run.load_or_calibrate(tiny_llm, hw, quick=True)
    runs = calibration_run._runs(tiny_llm, tiny_llm.engine, calibration_run.QUICK, at_prompt=40)
    assert runs[-1] == ("a prompt of 40 tokens", 1, 40, 1)
    at = calibration_run.load_or_calibrate(tiny_llm, hw, quick=True, at_prompt=40)
    assert at.identity["at_prompt"] == "40" and "at_prompt" not in plain.identity
    assert plain.identity["costing"] == str(COSTING)  # curves drawn against another costing are not reused
    assert calibration_run.cache_path(tiny_llm, hw, at_prompt=40) != calibration_run.cache_path(tiny_llm, hw)
    assert 40 in dict(at.curves["prefill.host"].points)  # its prompt, against its tokens
    assert 40 not in dict(plain.curves["prefill.host"].points)
    steps = calibration_run.QUICK["steps"]
    assert (plain.timed_context, at.timed_context) == (32 + steps + 1, 41)  # the 64-token model's: no 128 prompt
    assert Calibration.from_dict(json.loads(json.dumps(at.to_dict()))).timed_context == 41
    with pytest.raises(InvalidRequestError, match="calibrating at a 60-token prompt needs 65 tokens"):
        calibration_run._runs(tiny_llm, tiny_llm.engine, calibration_run.QUICK, at_prompt=60)


def test_the_op_timer_puts_every_patched_op_back(tiny_llm):
    ops, call = tiny_llm.model.ops, FloatLinear.__call__
    timer = calibration_run.OpTimer(tiny_llm.device)
    with timer.installed(tiny_llm):
        assert FloatLinear.__call__ is not call and "attention" in vars(ops)
        tiny_llm.generate("hi", SamplingParams(max_tokens=2, temperature=0))
    assert timer.seconds["linears"] > 0 and timer.seconds["attention"] > 0
    assert FloatLinear.__call__ is call and "attention" not in vars(ops)


def test_the_calibration_takes_the_op_timers_own_cost_out_of_the_steps(tiny_llm, tmp_path, monkeypatch):
    """Timing every op costs Python per call (half a millisecond of a 4 ms decode step of the bundled model): a timer
    made to cost 2 ms a call must leave the expected forward pass of a decode and of a prompt near the untimed
    step's, not calls x 2 ms above it. Each step gives back its calls x the timer's cost per call, measured on a
    small op through the timer and bare.

    The cost is a busy wait on one thread: after a 2 ms sleep an op's worker threads had gone to sleep too, and on a
    busy host waking them took milliseconds inside the clocked op (a loaded run expected 70 ms of linears), which is
    the sleep's doing, not the timer's; a real timer's microseconds never let them sleep. Half the timer's cost is
    the bound: left in, all of it would be there; on a host whose other work takes the CPU from the busy waits for a
    few milliseconds of a step, a quarter failed one run in three."""
    import time

    wrap = calibration_run.OpTimer.wrap

    def costly(self, fn, name):
        timed = wrap(self, fn, name)

        def slower(*args, **kwargs):
            if not self._depth:  # a call the timer counts: its cost outside what it clocks for the op
                until = time.perf_counter() + 0.002
                while time.perf_counter() < until:
                    pass
            return timed(*args, **kwargs)

        return slower

    monkeypatch.setattr(calibration_run.OpTimer, "wrap", costly)
    hw = load_or_run_probe(quick=True).to_hardware()
    monkeypatch.setenv("ROOFTOP_CACHE_DIR", str(tmp_path))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cal = calibration_run.calibrate(tiny_llm, hw, quick=True)
    finally:
        torch.set_num_threads(threads)
    timer = calibration_run.OpTimer(tiny_llm.device)
    with timer.installed(tiny_llm):  # how many calls a step of each phase times: about 20 in this 2-layer model
        calibration_run._run(tiny_llm.engine, [[5] * 16], 3, timer)
        prefill, decode = (calls for _, (_, calls) in calibration_run._run(tiny_llm.engine, [[6] * 16], 2, timer))
    assert prefill >= 10 and decode >= 10
    p, config = tiny_llm.precision, tiny_llm.config
    for shape, calls in ((StepShape.decode(1, 32), decode), (StepShape.prefill(1, 16), prefill)):
        assert cal.expected(config, p, shape, hw).forward_s < 0.5 * calls * 0.002, shape


def test_calibration_refuses_a_busy_engine(tiny_llm):
    hw = load_or_run_probe(quick=True).to_hardware()
    tiny_llm.engine.add_request("busy", "hello", SamplingParams(max_tokens=2))
    try:
        with pytest.raises(Exception, match="calibration needs an idle engine"):
            calibration_run.calibrate(tiny_llm, hw, quick=True)
    finally:
        while tiny_llm.engine.has_unfinished():
            tiny_llm.engine.step()


def phase(
    name, bound, host, around, linears=0.0, compute_time=1.0, memory_time=2.0, measured=None, tokens=10, kv_share=0.1
):
    inefficiency = dict.fromkeys(CLASSES, 0.0) | {"linears": linears}
    total = bound + host + around + linears
    gap = Gap(measured or total, bound, 0.0, inefficiency, host, around, (measured or total) - total)
    return PhaseAttribution(
        Phase(name),
        10,
        tokens,
        measured or total,
        bound,
        bound,
        1e9,
        1e9,
        compute_time,
        memory_time,
        1e9,
        1e9,
        total,
        gap,
        kv_share,
    )


def test_advice_follows_the_largest_part():
    host_bound = phase("decode", bound=1.0, host=2.0, around=1.5)
    assert host_bound.bound == "host"
    assert "host-bound: 78% of its time" in advice("decode", host_bound)
    memory = phase("decode", bound=3.0, host=0.5, around=0.5)
    assert memory.bound == "memory" and "batch more sequences (--max-num-seqs)" in advice("decode", memory)
    assert "--weights int4" in advice("decode", memory)
    said = advice("decode", memory, weight_bits=4.5)  # a 4-bit file is not told to read 4 bits
    assert "--weights int4" not in said and "4.5 bits each already" in said
    kernels = phase("decode", bound=1.0, host=0.2, around=0.2, linears=3.0)
    assert "their kernels, not the hardware, set the pace" in advice("decode", kernels)
    compute = phase("prefill", bound=3.0, host=0.1, around=0.1, compute_time=3.0, memory_time=1.0)
    assert compute.bound == "compute" and "faster matmul format" in advice("prefill", compute)
    waiting = phase("decode", bound=1.0, host=0.2, around=0.2)
    waiting = replace(waiting, gap=replace(waiting.gap, communication_s=3.0), measured_s=4.4, expected_s=4.4)
    assert waiting.bound == "communication"  # a tensor-parallel step over half in its collectives
    assert "communication-bound: 68% of its expected time" in advice("decode", waiting)
    assert waiting.gap.parts()["communication"] == 3.0
    assert "probe --force" not in advice("decode", waiting)  # no probed collectives slower than they ran
    stale = replace(waiting, comm_time_s=3.5)  # the probe gives the collectives more than the calibration timed
    assert "timed them at 3 s, under the 3.5 s the group's probe gives them" in advice("decode", stale)
    assert "`rooftop probe --force` with this run's --tensor-parallel-size" in advice("decode", stale)


def test_a_phase_faster_than_its_bound_is_told_to_probe_again():
    """Measured below its bound, a phase read (or computed) faster than the probe's roof: the advice names the rate
    it reached and the roof, and asks for a new probe instead of a setting."""
    memory = phase("decode", bound=3.0, host=0.5, around=0.5, compute_time=1.0, memory_time=3.0)
    memory = replace(memory, bytes=3e9, measured_s=2.0)  # 3 s of bytes at the probe's 1 GB/s, read in 2
    said = advice("decode", memory)
    assert said.startswith("decode ran faster than its bound: it moved 1.5 GB/s, above the probe's read of 1 GB/s")
    assert "rooftop probe --force" in said and "--max-num-seqs" not in said
    compute = phase("prefill", bound=3.0, host=0.1, around=0.1, compute_time=3.0, memory_time=1.0)
    compute = replace(compute, flops=3e9, measured_s=2.0)
    assert "it moved 1.5 GFLOP/s, above the probe's peak of 1 GFLOP/s" in advice("prefill", compute)
    # a tensor-parallel prefill whose collectives bound it: the all-reduce's probe was slow, not the FLOP/s'
    collectives = replace(compute, comm_time_s=4.0, bound_s=4.0, measured_s=3.5)
    said = advice("prefill", collectives)
    assert said.startswith("prefill ran faster than its bound: 3.5 s against 4 s for its tensor-parallel"), said
    assert "--tensor-parallel-size" in said and "GFLOP/s" not in said


def test_memory_bound_decode_advice_names_what_its_bytes_are():
    """Most of the bytes in the KV cache: a narrower cache, unless it is int8 already; otherwise the weights'
    levers; at one sequence per step, speculative decoding too."""
    long_context = phase("decode", bound=3.0, host=0.1, around=0.1, tokens=40, kv_share=0.6)
    said = advice("decode", long_context, kv_value_bytes=4)
    assert "the KV cache is 60% of each step's bytes" in said and "--kv-cache-dtype int8 takes about 25%" in said
    assert "--speculative-config" not in said  # four sequences per step
    assert "--kv-cache-dtype" not in advice("decode", long_context, kv_value_bytes=1)  # int8 already
    one_sequence = phase("decode", bound=3.0, host=0.1, around=0.1, tokens=10, kv_share=0.2)
    said = advice("decode", one_sequence, kv_value_bytes=4)
    assert "--weights int4" in said and "speculative decoding (--speculative-config" in said
    hybrid = advice("decode", one_sequence, kv_value_bytes=4, speculative=False)  # a model the engine cannot speculate
    assert "--weights int4" in hybrid and "--speculative-config" not in hybrid


@pytest.mark.parametrize(
    "hardware, weights, measured_ms",
    [
        ("a100", "bf16", 1000 / 93.89),  # gpt-fast's README, Llama-3.1-8B, A100-80GB at 330 W (not in the fit)
        ("h100", "bf16", 1000 / 126.90),  # torchao's README, Llama-3.1-8B on an H100 (the check of the A100 fit)
        ("h100", "int8", 1000 / 198.85),
    ],
)
def test_catalog_gpus_expect_the_published_tpot_within_15_percent(hardware, weights, measured_ms):
    from rooftop.roofline.api import predict

    pred = predict("llama-3.1-8b", hardware, prompt_len=5, output_len=200, weights=weights)
    assert pred.tpot_bound_s < pred.expected_tpot_s
    assert abs(pred.expected_tpot_s * 1e3 - measured_ms) / measured_ms < 0.15
    data = pred.to_dict()
    assert data["expected_tpot_s"] == pred.expected_tpot_s and data["tpot_bound_s"] == pred.tpot_bound_s


def test_efficiency_overrides_replace_the_catalogs_and_devices_without_figures_expect_nothing():
    from rooftop.roofline.api import predict

    assert predict("llama-3.1-8b", "h100", memory_efficiency=0.5).expected_tpot_s is None
    assert predict("llama-3.1-8b", "l4", prompt_len=16, output_len=8).expected_ttft_s is None
    by_hand = predict("llama-3.1-8b", "h100", prompt_len=16, output_len=2, batch=1)
    hw = by_hand.hw
    step = by_hand.prefill
    eff = hw.efficiency
    ops = sum(max(op.compute_time(hw) / eff.compute, op.memory_time(hw) / eff.memory) for op in step.ops)
    assert by_hand.expected_ttft_s == pytest.approx(ops + 32 * eff.per_layer_s)
    tp = predict("llama-3.1-8b", "h100", prompt_len=16, output_len=2, tp=2)
    one = tp.prefill.ops
    assert tp.expected_ttft_s == pytest.approx(
        sum(max(o.compute_time(hw) / eff.compute, o.memory_time(hw) / eff.memory, o.comm_time(hw)) for o in one)
        + 32 * eff.per_layer_s
        + (2 * 32 + 3) * eff.all_reduce_s  # two all-reduces per layer, the embedding's, the plan, the logits
    )


@pytest.mark.parametrize("architecture", ["qwen3_moe", "qwen3_5"])
def test_a_quick_calibration_times_moe_and_hybrid_layers(architecture, tmp_path, monkeypatch):
    """The op timer reaches the experts (linears; int8, so a lone row's run in one kernel call) and the Gated
    DeltaNet layers' conv and recurrence (attention): every class of those models gets a curve, and the gap of
    their steps adds up."""
    import test_hybrid
    import test_moe
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from rooftop import LLM

    torch.manual_seed(0)
    if architecture == "qwen3_moe":
        model, source = Qwen3MoeForCausalLM(Qwen3MoeConfig(**test_moe.CONFIG)), test_moe
    else:
        model, source = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**test_hybrid.CONFIG)), test_hybrid
    weights = "int8" if architecture == "qwen3_moe" else "auto"
    llm = LLM(model=source.save_random(model.eval(), tmp_path / architecture), weights=weights)
    assert all(moe.row is not None for moe in llm.model.moe)
    hw = load_or_run_probe(quick=True).to_hardware()
    monkeypatch.setenv("ROOFTOP_CACHE_DIR", str(tmp_path))
    cal = calibration_run.calibrate(llm, hw, quick=True)
    for key in ("decode.linears", "decode.attention", "decode.elementwise", "prefill.attention"):
        assert key in cal.curves and cal.curves[key].points[-1][1] > 0, key
    # the host's share is a difference of two runs' medians, clamped at zero: one batch's can land on zero in a
    # noisy minute (old and new builds alike, 2 of 52 here); every batch's together cannot, where the host is timed
    assert max(y for _, y in cal.curves["decode.host"].points) > 0
    llm.generate("a few words", SamplingParams(max_tokens=3, temperature=0))
    record = llm.step_records[-1]
    step = attribute_step(llm.config, llm.precision, record.shape, record.seconds, hw, record.around_seconds, cal)
    assert sum(step.gap(hw).parts().values()) == pytest.approx(record.wall_seconds)


def test_calibration_fits_a_small_kv_pool_and_leaves_the_engine_idle(tiny_gguf):
    from rooftop import LLM

    small = LLM(model=tiny_gguf, num_kv_blocks=12, block_size=16)  # 192 tokens of KV cache
    cal = calibration_run.calibrate(small, load_or_run_probe(quick=True).to_hardware(), quick=True)
    assert "decode.linears" in cal.curves and not small.engine.has_unfinished()


def test_the_servers_steps_get_their_expected_time_from_a_cached_calibration(tiny_llm, tmp_path, monkeypatch):
    from rooftop.serve.metrics import create_metrics
    from rooftop.serve.monitor import Monitor
    from rooftop.serve.state import calibrated

    hw = load_or_run_probe(quick=True).to_hardware()
    monkeypatch.setenv("ROOFTOP_CACHE_DIR", str(tmp_path))
    assert calibrated(tiny_llm, hw) is None  # none cached: the server starts without running one
    calibration_run.load_or_calibrate(tiny_llm, hw, quick=True)
    cal = calibrated(tiny_llm, hw)
    assert cal is not None
    metrics = create_metrics()
    monitor = Monitor(metrics, tiny_llm.config, tiny_llm.precision, hw, cal)
    tiny_llm.generate("hi", SamplingParams(max_tokens=2, temperature=0))
    record = tiny_llm.step_records[-1]
    monitor._record_step(record, 1)
    expected = cal.expected(tiny_llm.config, tiny_llm.precision, record.shape, hw).total_s
    assert metrics.step_expected_seconds.labels(phase=record.phase)._value.get() == pytest.approx(expected)


def test_the_calibrate_command_labels_each_curves_points_by_what_they_are_drawn_against(
    tiny_gguf, tmp_path, monkeypatch
):
    """A decode's linears are drawn against rows and a prefill's host time against tokens: the table called the
    first seconds and the second sequences."""
    from typer.testing import CliRunner

    from rooftop.cli import app

    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["calibrate", "-m", str(tiny_gguf), "--quick"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line for line in result.stderr.splitlines() if line.strip().startswith("│")}
    assert re.search(r"decode\.linears .* at 1 row .* at \d+ rows", rows["decode.linears"])
    assert re.search(r"at 1 token .* at \d+ tokens", rows["prefill.host"])
    assert re.search(r"at 1 seq .* at \d+ seqs", rows["decode.host"])
    assert re.search(r"\(roofline .*\(roofline ", rows["prefill.linears"])
    # run again, it says it read the cache (it said "cached in" either way)
    again = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["calibrate", "-m", str(tiny_gguf), "--quick"])
    assert "read from the cache (`--force` calibrates again)" in again.stderr
