"""`rooftop probe`: one quick measurement of this machine, then its cache (hits, forced and invalid re-measures)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from rooftop.engine import probe as engine_probe
from rooftop.errors import InvalidRequestError
from rooftop.kernels import cpu
from rooftop.roofline import probe
from rooftop.roofline.report import si


@pytest.fixture(scope="module")
def measured():
    steps: list[str] = []
    return engine_probe.run_probe(quick=True, on_step=steps.append), steps


@pytest.fixture
def result(measured) -> probe.ProbeResult:
    return measured[0]


@pytest.fixture
def runs(monkeypatch, tmp_path, result) -> list[bool]:
    """A tmp cache dir and a stand-in for `run_probe` that counts calls and stamps each result with its number."""
    monkeypatch.setenv("ROOFTOP_CACHE_DIR", str(tmp_path))
    calls: list[bool] = []

    def run_probe(device="cpu", quick=False, on_step=None, engine=None, collectives=None):
        calls.append(quick)
        return dataclasses.replace(result, date=f"run {len(calls)}", quick=quick, notes=dict(result.notes))

    monkeypatch.setattr(probe, "run_probe", run_probe)
    return calls


def test_measured_roofs_are_plausible(measured):
    result, steps = measured
    assert steps == list(probe.STEPS)
    assert 1e9 <= result.fp32_flops <= 1e16
    # A CPU without bf16 units runs a bf16 matmul through a slow fallback: far below fp32, still positive.
    assert 1e7 <= result.bf16_flops <= 1e16
    for name in ("int8_weight_only", "int4_weight_only"):
        value = getattr(result, f"{name}_flops")
        assert value is None or 1e6 <= value <= 1e16, name
        assert result.notes[name]
    assert 1e9 <= result.copy_bandwidth <= 1e14
    assert 1e9 <= result.read_bandwidth <= 1e14
    assert sorted(result.read_by_size) == [16 << 20, 64 << 20]  # the quick ladder, then the DRAM read
    assert result.read_by_size[64 << 20] == result.read_bandwidth
    assert all(1e9 <= bw <= 1e14 for bw in result.read_by_size.values())
    assert result.memory_bytes > 1e8
    assert result.cpu_count >= 1 and result.torch_threads >= 1
    assert result.torch_version == torch.__version__
    assert result.quick and result.device == "cpu" and result.date
    assert set(result.engine_formats) == {"float", "int8", "int4"}  # what the engine's linears report being here
    assert result.to_hardware().engine_formats == result.engine_formats


def test_cache_is_written_then_reused_without_measuring(runs, monkeypatch):
    first = probe.load_or_run_probe(quick=True)
    path = probe.cache_path("cpu")
    assert runs == [True] and path.is_file()
    assert json.loads(path.read_text())["read_bandwidth_bytes_per_s"] == first.read_bandwidth

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(probe, "run_probe", no_measuring)
    assert probe.load_or_run_probe(quick=True) == first
    assert probe.load_or_run_probe(quick=True).date == "run 1"


def test_the_analyzer_reads_the_engines_probe_whichever_kernels_it_timed(runs, result):
    """The engine's probe (engine.probe) measures again when its kernels differ from the cached ones; the analyzer,
    which times no kernels, takes the cached roofs as they are."""
    other = "pytorch" if result.weight_only_kernels.startswith("rooftop") else "rooftop"
    probe.cache_path("cpu").write_text(json.dumps(result.to_dict() | {"weight_only_kernels": other}))
    assert probe.load_or_run_probe(quick=True).weight_only_kernels == other
    assert engine_probe.load_or_run_probe(quick=True).date == "run 1"
    assert runs == [True]


def test_the_analyzers_own_probe_leaves_the_weight_only_peaks_out():
    own = probe.run_probe(quick=True)
    assert own.weight_only_kernels == "none"
    assert own.int8_weight_only_flops is None and own.int4_weight_only_flops is None
    assert "int4_weight_only" not in own.to_hardware().peak_flops


def test_force_measures_again_and_rewrites(runs):
    probe.load_or_run_probe(quick=True)
    forced = probe.load_or_run_probe(quick=True, force=True)
    assert runs == [True, True] and forced.date == "run 2"
    assert probe.load_or_run_probe(quick=True).date == "run 2"


def _cache_faster_read(result: probe.ProbeResult, quick: bool = True) -> probe.ProbeResult:
    """A cached probe of this machine from an earlier minute: its read twice as fast, its fp32 matmul half."""
    earlier = dataclasses.replace(
        result,
        date="earlier",
        quick=quick,
        read_bandwidth=2 * result.read_bandwidth,
        read_by_size={size: 2 * bw for size, bw in result.read_by_size.items()},
        fp32_flops=result.fp32_flops / 2,
    )
    probe.cache_path("cpu").write_text(json.dumps(earlier.to_dict()))
    return earlier


def test_force_keeps_each_roof_the_fastest_a_probe_of_this_machine_has_shown(runs, result):
    """A shared host's read moved between 42 and 74 GB/s within an hour: measured again in a slow minute, the roof
    stays what the fast one showed, so that the bound stays below the steps a fast minute runs."""
    earlier = _cache_faster_read(result)
    forced = engine_probe.load_or_run_probe(quick=True, force=True)
    assert runs == [True] and forced.date == "run 1"
    assert forced.read_bandwidth == earlier.read_bandwidth and forced.read_by_size == earlier.read_by_size
    assert forced.fp32_flops == result.fp32_flops  # this probe's, the faster
    assert forced.probes == 2 and forced.first_date == "earlier"
    read = f"read_bandwidth {si(earlier.read_bandwidth, 'B/s')} (this probe {si(result.read_bandwidth, 'B/s')})"
    small = result.read_by_size[16 << 20]
    read += f", read of 16 MiB {si(2 * small, 'B/s')} (this probe {si(small, 'B/s')})"  # a ladder step's own peak
    assert forced.notes["peaks"] == f"each roof the fastest of 2 probes since earlier; from earlier probes: {read}"
    assert forced.to_hardware(working_set=1e12).memory_bandwidth == earlier.read_bandwidth
    assert probe.read_cache(probe.cache_path("cpu")) == forced
    again = engine_probe.load_or_run_probe(quick=True, force=True)
    assert again.probes == 3 and again.first_date == "earlier" and again.read_bandwidth == earlier.read_bandwidth


def test_reset_or_a_probe_of_other_thoroughness_or_kernels_keeps_no_earlier_roof(runs, result):
    _cache_faster_read(result)
    reset = engine_probe.load_or_run_probe(quick=True, reset=True)  # reset measures: no force needed
    assert runs == [True]
    assert reset.read_bandwidth == result.read_bandwidth and reset.probes == 1 and "peaks" not in reset.notes
    _cache_faster_read(result, quick=False)
    quick = engine_probe.load_or_run_probe(quick=True, force=True)  # a quick probe's ladder is not the full one's
    assert quick.read_bandwidth == result.read_bandwidth and quick.probes == 1
    earlier = _cache_faster_read(result)
    other = "pytorch" if result.weight_only_kernels.startswith("rooftop") else "rooftop"
    path = probe.cache_path("cpu")
    path.write_text(json.dumps(json.loads(path.read_text()) | {"weight_only_kernels": other}))
    # a probe whose weight-only figures came from other kernels (the analyzer's own times none) lends it no roof
    forced = probe.load_or_run_probe(quick=True, force=True)
    assert forced.probes == 1 and forced.read_bandwidth == result.read_bandwidth != earlier.read_bandwidth


def test_the_all_reduce_keeps_its_fastest_times_and_says_so(result):
    def group(seconds: dict[int, float], latency: float, bandwidth: float) -> probe.ProbeResult:
        return dataclasses.replace(
            result,
            tensor_parallel="gloo x2",
            all_reduce_seconds=seconds,
            all_reduce_latency_s=latency,
            all_reduce_bandwidth=bandwidth,
        )

    before = group({1024: 20e-6, 65536: 100e-6}, 20e-6, 5e9)
    merged = probe.keep_peaks(before, group({1024: 30e-6, 65536: 90e-6}, 30e-6, 4e9))
    assert merged.all_reduce_seconds == {1024: 20e-6, 65536: 90e-6}
    assert (merged.all_reduce_latency_s, merged.all_reduce_bandwidth) == (20e-6, 5e9)
    assert merged.notes["peaks"].endswith(
        "from earlier probes: all_reduce_bandwidth 5 GB/s (this probe 4 GB/s), all-reduce of 1 KiB 20 us "
        "(this probe 30 us), all-reduce latency 20 us (this probe 30 us)"
    )


def test_probe_command_says_which_roofs_earlier_probes_set(runs, result):
    from typer.testing import CliRunner

    from rooftop.cli import app

    earlier = _cache_faster_read(result, quick=False)
    out = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["probe", "--force"])
    assert out.exit_code == 0, out.output
    assert "each roof the fastest of 2 probes since earlier; from earlier probes: read_bandwidth" in out.output
    assert si(earlier.read_bandwidth, "B/s") in out.output and "measured now, cached in" in out.output
    again = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["probe"])  # it said "cached in" as if it had measured
    assert "read from the cache (" in again.output and "--force` measures again" in again.output
    assert " None\n" not in again.output  # fields without a value are left out
    out = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["probe", "--reset", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["probes"] == 1 and data["read_bandwidth_bytes_per_s"] == result.read_bandwidth
    assert runs == [False, False]


def test_cpu_spellings_share_one_cache(runs):
    probe.load_or_run_probe("cpu:0", quick=True)
    assert probe.cache_path("cpu").is_file()
    assert probe.load_or_run_probe("cpu", quick=True).date == "run 1"


def test_a_quick_cache_does_not_answer_a_full_probe(runs):
    probe.load_or_run_probe(quick=True)
    assert probe.load_or_run_probe(quick=False).date == "run 2"
    assert probe.load_or_run_probe(quick=True).date == "run 2"  # a full result serves a quick request
    assert runs == [True, False]


@pytest.mark.parametrize(
    "text",
    ["", "{not json", "[]", '{"fp32_matmul_flops_per_s": 1e9}', '"a string"'],
    ids=["empty", "not-json", "list", "missing-keys", "string"],
)
def test_a_corrupt_cache_is_measured_again(runs, text):
    path = probe.cache_path("cpu")
    path.write_text(text)
    assert probe.load_or_run_probe(quick=True).date == "run 1"
    assert probe.ProbeResult.from_dict(json.loads(path.read_text())).date == "run 1"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("torch_version", "1.0.0"),
        ("cpu_signature", "family 0 model 0, no host has this"),
        ("fp32_matmul_flops_per_s", "fast"),
        ("procedure", 1),  # medians and PyTorch's sum alone: not peaks
    ],
)
def test_a_cache_from_elsewhere_or_malformed_is_measured_again(runs, result, key, value):
    data = result.to_dict() | {key: value}
    probe.cache_path("cpu").write_text(json.dumps(data))
    assert probe.load_or_run_probe(quick=True).date == "run 1"


def test_dict_round_trip_with_si_keys(result):
    data = json.loads(json.dumps(result.to_dict()))
    for key in ("fp32_matmul_flops_per_s", "bf16_matmul_flops_per_s", "copy_bandwidth_bytes_per_s"):
        assert data[key] > 0
    assert data["read_bandwidth_bytes_per_s"] == result.read_bandwidth and data["memory_bytes"] == result.memory_bytes
    assert probe.ProbeResult.from_dict(data) == result


def test_to_hardware_carries_the_roofs(result):
    hardware = result.to_hardware()
    assert hardware.peak("bf16") == result.bf16_flops
    assert hardware.peak("fp32") == result.fp32_flops
    assert hardware.memory_bandwidth == result.read_bandwidth
    assert hardware.memory_bytes == result.memory_bytes
    assert "int8" not in hardware.peak_flops  # the weight-only kernels compute in bf16
    if result.int8_weight_only_flops is not None:  # the int8 weight format's measured compute roof
        assert hardware.peak("int8_weight_only") == result.int8_weight_only_flops
    if result.int4_weight_only_flops is not None:
        assert hardware.peak("int4_weight_only") == result.int4_weight_only_flops
    assert hardware.name.startswith("this machine (") and f"{result.torch_threads} threads" in hardware.name
    assert hardware.source == f"rooftop probe {result.date}"


def test_cache_path_precedence(monkeypatch, tmp_path):
    """Where the probe is cached; a CPU probe on a thread count other than the process's cores in a file of its own
    (`rooftop bench -t 1,2`), a GPU's and a tensor-parallel group's whatever the threads."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ROOFTOP_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    threads, cores = torch.get_num_threads(), probe.available_cores()
    try:
        torch.set_num_threads(cores)
        assert probe.cache_path("cpu") == tmp_path / "home" / ".cache" / "rooftop" / "probe-cpu.json"
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert probe.cache_path("cuda:1") == tmp_path / "xdg" / "rooftop" / "probe-cuda-1.json"
        monkeypatch.setenv("ROOFTOP_CACHE_DIR", str(tmp_path / "mine"))
        assert probe.cache_path("cpu") == tmp_path / "mine" / "probe-cpu.json"
        torch.set_num_threads(cores + 1)
        assert probe.cache_path("cpu") == tmp_path / "mine" / f"probe-cpu-t{cores + 1}.json"
        assert probe.cache_path("cuda:1").name == "probe-cuda-1.json"
        assert probe.cache_path("cpu", "gloo x2").name == "probe-cpu-gloo-x2.json"
    finally:
        torch.set_num_threads(threads)


def test_ladder_stops_before_a_size_that_would_take_too_long():
    measured_sizes = []

    def measure(size):
        measured_sizes.append(size)
        return 0.01 + size * 1e-3  # a fixed cost per call does not stop the climb, the marginal cost does

    rate, size = probe.best_on_ladder((1, 8, 64, 512), float, measure, cap_s=0.2)
    assert measured_sizes == [1, 8, 64] and size == 64
    assert rate == pytest.approx(64 / (0.01 + 0.064))


def test_unsupported_devices_are_refused():
    for device in ("meta", "tpu"):
        with pytest.raises(InvalidRequestError, match=f"device must be cpu, cuda or cuda:N; got '{device}'"):
            probe.run_probe(device, quick=True)
    if not torch.cuda.is_available():
        with pytest.raises(
            InvalidRequestError, match="device cuda: this PyTorch .* (was built without CUDA|sees no GPU)"
        ):
            probe.run_probe("cuda", quick=True)


def test_the_memory_roof_follows_the_working_set(result):
    """Reads that fit a cache are faster: the roof of a working set is interpolated in log size between the sizes
    read, the smallest's below them, DRAM's past them; a cache written before the ladder answers DRAM everywhere."""
    mib = 1 << 20
    curve = dataclasses.replace(
        result, read_by_size={8 * mib: 100e9, 32 * mib: 60e9, 1024 * mib: 20e9}, read_bandwidth=20e9
    )
    assert curve.read_bandwidth_at(4 * mib) == 100e9
    assert curve.read_bandwidth_at(16 * mib) == pytest.approx(80e9)  # halfway between 8 and 32 MiB in log size
    assert curve.read_bandwidth_at(2048 * mib) == 20e9
    hardware = curve.to_hardware(working_set=16 * mib)
    assert hardware.memory_bandwidth == pytest.approx(80e9)
    assert hardware.notes["read_bandwidth"] == "80.0 GB/s reading a 17 MB working set (DRAM: 20.0 GB/s)"
    assert curve.to_hardware().memory_bandwidth == 20e9
    old = {k: v for k, v in result.to_dict().items() if k != "read_by_size"}
    assert probe.ProbeResult.from_dict(old).to_hardware(working_set=mib).memory_bandwidth == result.read_bandwidth


class FastReader:
    """An engine whose own read outruns PyTorch's sum at every size (kernels that fetch ahead), timing no linears."""

    def kernels(self, device):
        return "fast reader"

    def flops(self, kind, device, plan):
        return None, "not timed"

    def formats(self, device):
        return {}

    def read_bandwidth(self, size, device, plan):
        return 1e15 + size


def test_the_read_roof_is_the_faster_of_the_sum_and_the_engines_read():
    """A roof below what a kernel reaches makes no bound: where the engine reads faster than `sum`, its read counts,
    at each size, and the note says both."""
    own = probe.run_probe(quick=True, engine=FastReader())
    assert own.read_by_size == {16 << 20: 1e15 + (16 << 20), 64 << 20: 1e15 + (64 << 20)}
    assert own.read_bandwidth == 1e15 + (64 << 20)
    assert "the faster of PyTorch's sum of float32 and the engine's streaming read" in own.notes["read_bandwidth"]
    assert "16 MiB: sum " in own.notes["read_bandwidth"] and "engine 1000000.0 GB/s" in own.notes["read_bandwidth"]
    assert own.weight_only_kernels == "fast reader" and own.procedure == probe.PROCEDURE


class FastLinears(FastReader):
    """An engine whose float32 linears outrun `torch.mm` (oneDNN's matmul where MKL's sgemm is slow)."""

    def flops(self, kind, device, plan):
        return (1e15, "FloatLinear, M=16 (scripted)") if kind == "float32" else (None, "not timed")


def test_the_float32_roof_is_the_faster_of_torch_mm_and_the_engines_linears():
    """As with the read: the engine's float32 linears set the roof where they beat `torch.mm`, and the note says
    both; where they are not timed (the analyzer's probe) `torch.mm` alone does."""
    own = probe.run_probe(quick=True, engine=FastLinears())
    assert own.fp32_flops == 1e15
    assert own.notes["fp32_matmul"].startswith("FloatLinear, M=16 (scripted); torch.mm's best ")
    plain = probe.run_probe(quick=True, engine=FastReader())
    assert plain.fp32_flops < 1e15 and "the best of the sizes tried" in plain.notes["fp32_matmul"]


def test_the_engines_read_is_measured_where_its_kernels_are_built(result):
    if cpu.ops() is None:
        assert "engine" not in result.notes["read_bandwidth"]
    else:
        assert ", engine " in result.notes["read_bandwidth"]
        assert engine_probe.ENGINE_KERNELS.read_bandwidth(16 << 20, "cpu", probe._QUICK) > 1e9
    assert engine_probe.ENGINE_KERNELS.read_bandwidth(16 << 20, "meta", probe._QUICK) is None


def test_a_roof_is_the_fastest_repetition(monkeypatch):
    """Peaks, not medians: on a shared host the slower repetitions time the neighbours, and a bound from a median
    rate was above the time the kernels then took. A scripted clock: two warm-up calls, then repetitions of 3, 1
    and 2 seconds."""
    ticks = iter([0.0, 1.0, 10.0, 13.0, 20.0, 21.0, 30.0, 32.0])
    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(ticks))
    plan = dataclasses.replace(probe._QUICK, reps=3, min_rep_s=0.5)
    assert probe.best_seconds(lambda: None, "cpu", plan) == 1.0


def test_a_decode_faster_than_every_probe_raises_the_read_of_its_working_set(runs, result):
    """A probe in a slow minute read 36 GB/s where the next minute's decode moved 66: what the engine was measured
    moving becomes the machine's read at that working set (a point of its own below DRAM's size, DRAM's read past it),
    for later runs; a slower rate changes nothing, and the next probe keeps the point and says where it came from."""
    mib = 1 << 20
    probe.cache_path("cpu").write_text(json.dumps(result.to_dict()))
    at = 40 * mib  # between the quick ladder's 16 MiB and its 64 MiB DRAM read
    fast = 3 * result.read_bandwidth_at(at)
    assert engine_probe.keep_observed_read("cpu", at, result.read_bandwidth_at(at) / 2, "a slow decode") is None
    assert probe.read_cache(probe.cache_path("cpu")) == result
    raised = engine_probe.keep_observed_read("cpu", at, fast, "a decode of m.gguf")
    assert raised == probe.read_cache(probe.cache_path("cpu"))
    assert raised.read_by_size == {**result.read_by_size, at: fast}
    assert raised.to_hardware(working_set=at).memory_bandwidth == fast
    assert raised.read_bandwidth == result.read_bandwidth  # DRAM's read is not what a 40 MiB working set shows
    assert raised.notes[probe.OBSERVED] == (
        f"read of 42 MB {si(fast, 'B/s')} moved by a decode of m.gguf (the probes: {si(fast / 3, 'B/s')})"
    )
    dram = 3 * result.read_bandwidth
    raised = engine_probe.keep_observed_read("cpu", 1e12, dram, "a decode of a big model")
    assert raised.read_bandwidth == dram and raised.read_by_size[64 * mib] == dram
    assert raised.to_hardware(working_set=1e12).memory_bandwidth == dram
    assert raised.notes[probe.OBSERVED].count("moved by") == 2
    forced = engine_probe.load_or_run_probe(quick=True, force=True)
    assert runs == [True] and forced.read_by_size[at] == fast and forced.read_bandwidth == dram
    assert forced.notes[probe.OBSERVED] == raised.notes[probe.OBSERVED]
    assert "read of 40 MiB" in forced.notes["peaks"]


def test_no_read_is_raised_without_a_cached_probe_of_these_kernels(runs, result):
    assert engine_probe.keep_observed_read("cpu", 1 << 20, 1e15, "a decode") is None  # nothing cached
    other = result.to_dict() | {"weight_only_kernels": "pytorch" if result.weight_only_kernels != "pytorch" else "x"}
    probe.cache_path("cpu").write_text(json.dumps(other))
    assert engine_probe.keep_observed_read("cpu", 1 << 20, 1e15, "a decode") is None
    assert probe.cache_path("cpu").read_text() == json.dumps(other)  # left as it was


def test_this_machine_is_costed_in_what_the_engine_computes_in(result):
    """`roofline -H this`: activations and an auto KV cache in the dtype rooftop's engine runs the model in on the
    probed device (float32 on a CPU, bfloat16 on a GPU), as `generate` attributes its run; a datasheet device keeps
    the weights' compute width, and a KV cache asked for by name is that one."""
    from rooftop.roofline.api import resolve_precision
    from rooftop.roofline.catalog import find_hardware
    from rooftop.roofline.precision import WEIGHT_FORMATS

    q4_k = WEIGHT_FORMATS["q4_k"]
    cpu = resolve_precision(None, None, q4_k, result.to_hardware())
    assert (cpu.kv_bytes, cpu.activation_bytes) == (4, 4)
    gpu = resolve_precision(None, "auto", q4_k, dataclasses.replace(result, device="cuda").to_hardware())
    assert (gpu.kv_bytes, gpu.activation_bytes) == (2, 2)
    assert resolve_precision(None, None, q4_k, find_hardware("h200")).kv_bytes == 2
    assert resolve_precision(None, "bf16", q4_k, result.to_hardware()).kv_bytes == 2
