"""`rooftop roofline` / `explain` as a user runs them: tables, JSON keys, the plot, model sources, errors."""

import json
import os
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from rooftop.cli import app

runner = CliRunner(env={"COLUMNS": "200"})


def run(*args):
    return runner.invoke(app, list(args))


def assert_error(result, *words):
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error:"), result.output
    for word in words:
        assert word in line, (word, line)


def test_table_has_both_steps_and_the_summary():
    r = run("roofline", "-m", "dense-27b", "-H", "h200", "-p", "4096", "-n", "64")
    assert r.exit_code == 0, r.output
    for text in (
        "prefill step (1 x 4096 tokens)",
        "decode step",
        "qkv_proj",
        "attention",
        "lm_head",
        "TTFT",
        "TPOT",
        "largest batch that fits",
        "prefill compute-bound",
        "decode compute-bound",
        "ridge point",
    ):
        assert text in r.output, text


def test_json_has_self_describing_keys():
    r = run(
        "roofline",
        "-m",
        "qwen3-8b",
        "-H",
        "h100",
        "-p",
        "512",
        "-n",
        "32",
        "-b",
        "4",
        "--weights",
        "int4",
        "--kv",
        "fp8",
        "--json",
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    for key in (
        "ttft_s",
        "tpot_s",
        "tpot_first_s",
        "tpot_last_s",
        "e2e_s",
        "kv_bytes_per_token",
        "weight_bytes",
        "parameters",
        "memory_needed_bytes",
        "max_batch",
        "prefill_compute_bound_from_tokens",
        "decode_compute_bound_from_batch",
        "decode_tokens_per_s_per_seq",
        "decode_tokens_per_s_total",
    ):
        assert key in data, key
    assert data["weights_format"] == "int4" and data["kv_bytes_per_value"] == 1 and data["batch"] == 4
    assert data["decode"]["bound"] == "memory" and data["prefill"]["bound"] in ("compute", "memory")
    names = [op["name"] for op in data["decode"]["ops"]]
    assert {"qkv_proj", "attention", "gate_up_proj", "down_proj", "lm_head", "rope", "norms", "silu_mul"} <= set(names)
    assert all(op["time_s"] >= 0 and "arithmetic_intensity_flops_per_byte" in op for op in data["prefill"]["ops"])


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "roof.png"
    r = run("roofline", "-m", "qwen3-30b-a3b", "-H", "h200", "--plot", str(path))
    assert r.exit_code == 0, r.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000


def test_explain_tells_the_two_phase_story():
    r = run("explain", "-m", "dense-27b", "-H", "h200", "-p", "4096")
    assert r.exit_code == 0, r.output
    for text in ("4096 tokens", "Prefill", "compute-bound", "KV cache", "memory-bound", "TTFT", "TPOT"):
        assert text in r.output, text


def test_bundled_gguf_defaults_to_its_own_weight_format():
    r = run("roofline", "-H", "rtx4090", "--json", "-p", "64", "-n", "8")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["weights_format"] == "q4_1" and data["parameters"] == 134_515_008


def test_hf_config_json_and_directory(tmp_path):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 32000,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    for model in (tmp_path / "config.json", tmp_path):
        r = run("roofline", "-m", str(model), "-H", "l4", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["kv_bytes_per_token"] == 2 * 22 * 4 * 64 * 2


def test_custom_hardware_numbers():
    r = run(
        "roofline", "-m", "qwen3-0.6b", "--peak-tflops", "100", "--bandwidth-tbs", "1", "--memory-gb", "16", "--json"
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["ridge_point_flops_per_byte"] == pytest.approx(100)
    assert data["hardware"].startswith("custom")


def test_unknown_preset_suggests_close_names():
    assert_error(
        run("roofline", "-m", "qwen3-8", "-H", "h200"), "unknown model preset 'qwen3-8'", "did you mean", "qwen3-8b"
    )


def test_unknown_hardware_suggests_close_names():
    assert_error(run("roofline", "-m", "qwen3-8b", "-H", "h20"), "unknown hardware 'h20'", "h200")


def test_config_missing_fields_are_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 10}))
    assert_error(
        run("roofline", "-m", str(tmp_path / "config.json"), "-H", "h200"),
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
    )


@pytest.mark.parametrize("flag", ["--batch", "--prompt", "--output"])
def test_sizes_below_one(flag):
    assert_error(run("roofline", "-m", "qwen3-8b", "-H", "h200", flag, "0"), "must be an integer >= 1")


def test_does_not_fit_says_by_how_much_and_what_fits():
    assert_error(run("roofline", "-m", "llama-3.1-70b", "-H", "l4"), "GB short", "tensor parallelism or fewer bits")


def test_impossible_tensor_parallelism():
    """Sizes above the KV heads work by replicating them, and the list says so."""
    assert_error(
        run("roofline", "-m", "llama-3.1-8b", "-H", "h100", "--tp", "3"),
        "tensor parallel degree 3",
        "valid sizes: 1, 2, 4, 8, 16, 32 (16, 32: more ranks than its 8 KV heads, each KV head replicated on tp / 8 "
        "ranks)",
    )


def test_unknown_weight_format():
    assert_error(run("roofline", "-m", "qwen3-8b", "-H", "h100", "--weights", "int3"), "unknown weight format 'int3'")


def test_tensor_parallel_run():
    r = run("roofline", "-m", "llama-3.1-70b", "-H", "h100", "--tp", "4", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["tp"] == 4 and "all_reduce" in [op["name"] for op in data["decode"]["ops"]]


# A small Llama for hand calculations: 2 layers of qkv 256->512, o 256->256, gate_up 256->1024, down 512->256
# (1,179,648 block weights), an untied 1000 x 256 embedding and lm_head, (2*2+1)*256 norm weights.
SMALL = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
BLOCK_WEIGHTS = 2 * (256 * 512 + 256 * 256 + 256 * 1024 + 512 * 256)
TABLE_WEIGHTS = 1000 * 256
NORMS = 5 * 256


def small_json(tmp_path, **fields):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SMALL, **fields}))
    return str(path)


def analyzed(*args):
    r = run("roofline", *args, "-H", "h100", "-p", "64", "-n", "8", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_awq_config_is_costed_at_4_bits_with_float16_embedding_and_lm_head(tmp_path):
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    data = analyzed("-m", small_json(tmp_path, torch_dtype="float16", quantization_config=awq))
    assert (data["weights_format"], data["embedding_format"], data["lm_head_format"]) == (
        "awq-int4-g128",
        "fp16",
        "fp16",
    )
    # 4-bit weights, an fp16 scale and a 4-bit zero per 128; both tables and the norms at 2 bytes
    assert data["weight_bytes"] == BLOCK_WEIGHTS * (4 + 20 / 128) / 8 + 2 * TABLE_WEIGHTS * 2 + NORMS * 2
    head = next(op for op in data["decode"]["ops"] if op["name"] == "lm_head")
    assert head["bytes_read"] == TABLE_WEIGHTS * 2 + 256 * 2  # 16-bit head, one row of activations
    r = run("roofline", "-m", small_json(tmp_path, quantization_config=awq), "-H", "h100", "-p", "64", "-n", "8")
    assert "awq-int4-g128; embedding and lm_head fp16" in r.output  # no torch_dtype: AWQ's kernels' fp16


def test_gptq_fp8_and_compressed_tensors_configs_set_the_weights(tmp_path):
    gptq = {"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": True, "desc_act": False}
    data = analyzed("-m", small_json(tmp_path, quantization_config=gptq))
    assert data["weights_format"] == "gptq-int8-g128" and data["lm_head_format"] == "fp16"
    assert data["weight_bytes"] == BLOCK_WEIGHTS * (8 + 16 / 128) / 8 + 2 * TABLE_WEIGHTS * 2 + NORMS * 2
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
    data = analyzed("-m", small_json(tmp_path, quantization_config=fp8))
    assert data["weights_format"] == "fp8-block128x128" and data["lm_head_format"] == "bf16"
    assert data["weight_bytes"] == BLOCK_WEIGHTS * (8 + 32 / 128**2) / 8 + 2 * TABLE_WEIGHTS * 2 + NORMS * 2
    w4a16 = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True},
                "input_activations": None,
            }
        },
        "ignore": ["lm_head"],
    }
    data = analyzed("-m", small_json(tmp_path, quantization_config=w4a16))
    assert data["weights_format"] == "ct-w4a16-int4-g128" and data["lm_head_format"] == "bf16"
    assert data["weight_bytes"] == BLOCK_WEIGHTS * (4 + 16 / 128) / 8 + 2 * TABLE_WEIGHTS * 2 + NORMS * 2
    fp8_dynamic = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
            }
        },
        "ignore": [],  # lm_head is a Linear too: quantized
    }
    data = analyzed("-m", small_json(tmp_path, quantization_config=fp8_dynamic))
    assert data["weights_format"] == data["lm_head_format"] == "ct-w8a8-fp8-channel"
    # a byte per weight and a 16-bit scale per output row (2 layers' rows: 512 + 256 + 1024 + 256), the lm_head's
    # too (1000 rows); the embedding table stays bf16
    rows = 2 * (512 + 256 + 1024 + 256)
    assert data["weight_bytes"] == BLOCK_WEIGHTS + 2 * rows + TABLE_WEIGHTS + 2 * 1000 + TABLE_WEIGHTS * 2 + NORMS * 2
    assert data["ridge_point_flops_per_byte"] == pytest.approx(1978.9e12 / 3.35e12)  # W8A8: the fp8 peak


def test_torch_dtype_sets_the_float_format_and_an_explicit_weights_overrides(tmp_path):
    assert analyzed("-m", small_json(tmp_path, torch_dtype="float16"))["weights_format"] == "fp16"
    data = analyzed("-m", small_json(tmp_path, dtype="float32"))  # transformers 5's key
    assert data["weights_format"] == "fp32" and data["kv_bytes_per_value"] == 4
    assert analyzed("-m", small_json(tmp_path))["weights_format"] == "bf16"
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128}
    data = analyzed("-m", small_json(tmp_path, quantization_config=awq), "--weights", "int8")
    assert data["weights_format"] == "int8"  # the tables not: as an int8 checkpoint holds them (integer_tables)
    assert data["lm_head_format"] == data["embedding_format"] == "bf16"


def test_unknown_quant_method_is_named_and_weights_gets_past_it(tmp_path):
    bnb = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    model = small_json(tmp_path, quantization_config=bnb)
    assert_error(
        run("roofline", "-m", model, "-H", "h100"),
        "quant_method 'bitsandbytes'",
        "awq, gptq, fp8, compressed-tensors",
        "pass --weights",
    )
    assert analyzed("-m", model, "--weights", "int4")["weights_format"] == "int4"


@pytest.mark.parametrize("command", ["roofline", "explain"])
def test_a_sequence_longer_than_the_models_positions_is_refused(command):
    r = run(command, "-m", "dense-27b", "-H", "h200", "-p", "8000", "-n", "256")  # 8192 positions
    assert_error(
        r, "prompt 8000 + output 256 = 8256 tokens exceed the model's 8192 positions (max_position_embeddings)"
    )
    assert run(command, "-m", "dense-27b", "-H", "h200", "-p", "7936", "-n", "256").exit_code == 0  # exactly 8192


def test_max_batch_counts_the_engines_share_of_memory_and_the_prefill_activations():
    base = ("roofline", "-m", "qwen3-8b", "-H", "h100", "-p", "2048", "-n", "256", "--json")
    default, half = (json.loads(run(*base, *extra).output) for extra in ((), ("--gpu-memory-utilization", "0.5")))
    assert default["gpu_memory_utilization"] == 0.9 and default["memory_available_bytes"] == 0.9 * 80e9
    assert half["memory_available_bytes"] == 0.5 * 80e9 == 0.5 * half["device_memory_bytes"]
    each = default["kv_bytes_per_token"] * 2304 + default["activation_bytes"]  # batch 1: one sequence's share
    for data in (default, half):
        assert data["max_batch"] == int((data["memory_available_bytes"] - data["weight_bytes"]) // each)
    r = run(*base[:-1])
    assert "of 72 GB usable (0.9 of 80 GB)" in r.output and "prefill activations" in r.output
    assert_error(run(*base, "--gpu-memory-utilization", "1.5"), "gpu_memory_utilization must be in (0, 1], got 1.5")


@pytest.mark.parametrize(
    "args, words",
    [
        (("-m", "llama-3.1-70b", "-H", "l4"), ("the weights alone need 141.", "21.6 GB usable (0.9 of 24.0 GB)")),
        (
            ("-m", "llama-3.1-8b", "-H", "l4", "-p", "60000", "-n", "4000"),
            ("one sequence does not fit: its KV cache at 64000 tokens needs 8.4 GB", "activations 6.1 GB", "short"),
        ),
        (
            ("-m", "llama-3.1-8b", "-H", "l4", "-p", "8000", "-n", "192", "-b", "3"),
            ("batch 3 does not fit: its KV cache at 8192 tokens per sequence needs 3.2 GB", "batch <= 2 fits"),
        ),
    ],
)
def test_does_not_fit_says_which_part_does_not(args, words):
    assert_error(run("roofline", *args), *words)


@pytest.mark.parametrize(
    "args",
    [
        ("-m", "llama-3.1-70b", "-H", "l4"),  # the weights alone
        ("-m", "llama-3.1-8b", "-H", "l4", "-p", "60000", "-n", "4000"),  # one sequence
        ("-m", "llama-3.1-8b", "-H", "h100", "-p", "60000", "-n", "4000", "--gpu-memory-utilization", "0.3"),
    ],
)
def test_explain_checks_memory_as_roofline_does(args):
    explained, analyzed = run("explain", *args), run("roofline", *args)
    assert_error(explained, "does not fit" if "-p" in args else "the weights alone need")
    assert explained.output.strip().splitlines()[-1] == analyzed.output.strip().splitlines()[-1]


def test_explain_takes_the_options_its_memory_check_names():
    args = ("explain", "-m", "llama-3.1-8b", "-H", "l4", "-p", "30000", "-n", "4000")
    assert_error(run(*args), "one sequence does not fit")
    assert run(*args, "--kv", "fp8", "--gpu-memory-utilization", "1").exit_code == 0


@pytest.mark.parametrize("command", ["roofline", "explain"])
@pytest.mark.parametrize("name", ["./no/such/dir", "no/such/model.gguf", "missing.gguf", "config.json", "~/nope"])
def test_a_missing_path_is_named_as_missing_not_as_an_unknown_preset(tmp_path, monkeypatch, command, name):
    monkeypatch.chdir(tmp_path)
    r = run(command, "-m", name, "-H", "h200")
    assert_error(r, f"{name}: no such file or directory")
    assert "preset" not in r.output
    assert run(command, "-m", "Qwen/Qwen3-8B", "-H", "h200").exit_code == 0  # a preset's repo id is no path


def test_a_plot_path_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    args = ("roofline", "-m", "qwen3-0.6b", "-H", "h200", "--plot")
    for path, reason in (
        (tmp_path / "no" / "such" / "dir" / "roof.png", "No such file or directory"),
        (tmp_path / "file" / "roof.png", "Not a directory"),
        (tmp_path, "Is a directory"),
        (tmp_path / "roof.xyz", "Format 'xyz' is not supported"),
    ):
        assert_error(run(*args, str(path)), f"cannot write the roofline chart to {path}: {reason}")
    assert list(tmp_path.parent.glob(tmp_path.name + "*")) == [tmp_path]  # nothing written beside the directory
    r = run(*args, str(tmp_path / "roof"))
    assert r.exit_code == 0 and f"written to {tmp_path / 'roof.png'}" in r.output and (tmp_path / "roof.png").is_file()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_plot_in_a_read_only_directory_is_one_line(tmp_path):
    tmp_path.chmod(0o500)
    try:
        path = tmp_path / "roof.png"
        assert_error(run("roofline", "-m", "qwen3-0.6b", "-H", "h200", "--plot", str(path)), "Permission denied")
    finally:
        tmp_path.chmod(0o700)


def test_state_dtype_sets_the_recurrent_state_bytes():
    """Qwen3.6-27B: 48 Gated DeltaNet layers, each a 48 x 128 x 128 state per sequence and a 3 x 10240 conv
    state (at 2 bytes), and a decode step reads and writes each state once."""
    args = ("roofline", "-m", "qwen3.6-27b", "-H", "h200", "-p", "512", "-n", "8", "--json")
    states, recurrences = {}, {}
    for dtype, width in (("float32", 4), ("bfloat16", 2), ("float16", 2), (None, 4)):
        data = json.loads(run(*args, *(("--state-dtype", dtype) if dtype else ())).output)
        assert data["state_bytes_per_value"] == width
        assert data["state_bytes_per_sequence"] == 48 * (48 * 128 * 128 * width + 3 * 10240 * 2)
        states[dtype] = data["state_bytes_per_sequence"]
        recurrences[dtype] = next(op for op in data["decode"]["ops"] if op["name"] == "linear_recurrence")
    saved = 48 * 48 * 128 * 128 * 2  # bytes per state read (and again written) at 2 bytes instead of 4
    assert recurrences["float32"]["bytes_read"] - recurrences["bfloat16"]["bytes_read"] == saved
    assert recurrences["float32"]["bytes_written"] - recurrences["bfloat16"]["bytes_written"] == saved
    r = run("explain", "-m", "qwen3.6-27b", "-H", "h200", "--state-dtype", "bfloat16")
    assert r.exit_code == 0 and "78.4 MB of recurrent state" in r.output
    assert_error(run(*args, "--state-dtype", "float8"), "unknown recurrent state dtype 'float8'", "float32, bfloat16")


def test_a_ggufs_embedding_and_lm_head_are_costed_in_their_own_formats():
    """The bundled Q4_1 file's token_embd (its tied lm_head) is Q8_0: costed as Q4_1 with the blocks, the weights
    were 12.7% under the file's bytes and a decode step's lm_head read 17.7 MB where it reads 30.1."""
    from rooftop.loading.bundled import bundled_model_path
    from rooftop.loading.gguf_file import read_gguf
    from rooftop.roofline.api import predict

    held = sum(t.data.nbytes for t in read_gguf(bundled_model_path()).tensors)
    p = predict(None, "h100", prompt_len=64, output_len=16)
    assert (p.weights_format, p.embedding_format, p.lm_head_format) == ("q4_1", "q8_0", "q8_0")
    assert p.weight_bytes == pytest.approx(held, rel=0.01)


def test_this_machine_reads_the_weights_at_the_probes_rate_for_their_size(tmp_path, monkeypatch):
    """`rooftop bench` bounds a model by the probe's read of a working set of its weights' size, which may stay
    partly in a cache; `roofline -H this` read at DRAM's rate, so the same model's TPOT bounds disagreed. SMALL as
    the engine runs it on the probe's CPU: 1,179,648 block weights and two 1000 x 256 tables in bf16-fp32 (2 bytes),
    1,280 norm weights in float32: 3,388,416 bytes, halfway in log size between reads of half and twice that."""
    from test_roofline_auto_weights import probed

    held = 1_179_648 * 2 + 2 * 256_000 * 2 + 1280 * 4
    probe = replace(probed(), read_by_size={held // 2: 80e9, held * 2: 40e9}, read_bandwidth=20e9)
    monkeypatch.setattr("rooftop.roofline.commands.load_or_run_probe", lambda: probe)
    bf16 = small_json(tmp_path, torch_dtype="bfloat16")
    r = run("roofline", "-m", bf16, "-H", "this", "-p", "16", "-n", "4", "--json")
    data = json.loads(r.output)
    assert data["weight_bytes"] == held and data["memory_bandwidth_bytes_per_s"] == pytest.approx(60e9)
    assert data["memory_roof"].startswith("60.0 GB/s reading a 3 MB working set (DRAM: 20.0 GB/s): the model's weights")
    r = run("explain", "-m", bf16, "-p", "16", "-n", "4")
    assert "memory traffic at 60 GB/s (this machine's read of 3.39 MB, the model's weights)" in r.output


def test_a_config_that_names_no_dtype_is_costed_on_this_machine_as_the_engine_loads_it(tmp_path, monkeypatch):
    """transformers' save of a model made from a config writes no dtype: the engine (and its dummy) loads such a
    checkpoint as float32, which -H this costed as bf16-fp32. A datasheet device keeps bf16 (vLLM's); a preset is a
    bf16 checkpoint everywhere."""
    from test_roofline_auto_weights import probed

    from rooftop import LLM

    monkeypatch.setattr("rooftop.roofline.commands.load_or_run_probe", probed)
    this = json.loads(run("roofline", "-m", small_json(tmp_path), "-H", "this", "-p", "16", "-n", "4", "--json").output)
    assert this["weights_format"] == "fp32"
    assert LLM(model=small_json(tmp_path), load_format="dummy").precision.weights.name == "fp32"
    assert analyzed("-m", small_json(tmp_path))["weights_format"] == "bf16"
    preset = run("roofline", "-m", "qwen3-0.6b", "-H", "this", "-p", "16", "-n", "4", "--json").output
    assert json.loads(preset)["weights_format"] == "bf16-fp32"


def test_one_output_token_has_no_tpot(tmp_path):
    """TPOT is (E2E - TTFT) / (n - 1): after one output token no decode step follows, and roofline reported the first
    decode step's time as TPOT (bench reports none)."""
    data = json.loads(run("roofline", "-m", small_json(tmp_path), "-H", "h100", "-p", "64", "-n", "1", "--json").output)
    for key in ("tpot_s", "tpot_bound_s", "expected_tpot_s", "tpot_first_s", "decode_tokens_per_s_per_seq"):
        assert data[key] is None, key
    assert data["e2e_s"] == data["ttft_s"]
    text = run("roofline", "-m", small_json(tmp_path), "-H", "h100", "-p", "64", "-n", "1").output
    assert "none: one output token is the prefill's, and no decode step follows (TPOT needs two)" in text
    assert (
        "TPOT is none: one output token" in run("explain", "-m", small_json(tmp_path), "-H", "h100", "-n", "1").output
    )


def test_kv_cache_dtype_is_the_engines_option_and_fp8_its_fp8_e4m3(tmp_path):
    """vLLM's --kv-cache-dtype (generate, bench, serve) and --kv are one option; fp8 is the engine's fp8_e4m3: a byte
    per value and a float32 scale per token and KV head. SMALL: 2 layers x 2 KV heads x (64 + 4 bytes), K and V."""
    per_token = {
        flag: analyzed("-m", small_json(tmp_path), flag, kv)["kv_bytes_per_token"]
        for flag, kv in (("--kv-cache-dtype", "fp8"), ("--kv", "fp8_e4m3"), ("--kv-cache-dtype", "int8"))
    }
    assert set(per_token.values()) == {2 * 2 * 2 * (64 + 4)}


def test_explain_says_which_weights_a_step_reads(tmp_path):
    """Decode reads only the routed experts of a mixture of experts, and one row of an embedding table that is not
    the lm_head; explain said "every weight" of both. SMALL on the H100: 1,179,648 block weights and a 1000 x 256
    lm_head at 2 bytes, 5 norms of 256 and one row of the table: 2,874,368 of the 3,385,856 bytes held."""
    text = run("explain", "-m", small_json(tmp_path), "-H", "h100", "-p", "64", "-n", "8").output
    assert "It must read 2.87 MB of the 3.39 MB of weights (of the embedding table one row per token) again" in text
    tied = run("explain", "-m", small_json(tmp_path, tie_word_embeddings=True), "-H", "h100", "-n", "8").output
    assert "It must read every weight (2.87 MB) again" in tied
    moe = run("explain", "-m", "qwen3-30b-a3b", "-H", "h100", "-p", "64", "-n", "8").output
    assert "of the experts only those its tokens are routed to, 8 of 128 per token in each layer" in moe
    assert "every weight" not in moe


def test_speculation_with_one_output_token_is_refused():
    """One output token is the prefill's: no decode step for speculation to speed up (the sentence and the JSON gave
    a speculative TPOT where the prediction has none)."""
    args = ("roofline", "-m", "qwen3-8b", "-H", "h200", "-n", "1", "--num-speculative-tokens", "3", "--acceptance")
    assert_error(run(*args, "0.7"), "--num-speculative-tokens needs --output 2 or more", "one output token has none")
    assert_error(run(*args, "0.7", "--json"), "--num-speculative-tokens needs --output 2 or more")
    assert run(*args[:6], "2", *args[7:], "0.7").exit_code == 0


def test_speculative_decoding_is_a_lever_only_where_the_engine_runs_it_and_it_helps():
    """explain offered speculative decoding to a hybrid (whose recurrent state the engine cannot roll back: it
    refuses) and to an MoE at one sequence (whose verify step reads the experts of all its tokens, and is predicted
    slower); roofline's what-if for a hybrid says the engine does not run it."""
    lever = "speculative decoding (--speculative-config"
    assert lever in run("explain", "-m", "qwen3-8b", "-H", "h200").output
    assert lever not in run("explain", "-m", "qwen3.6-27b", "-H", "h200").output
    assert lever not in run("explain", "-m", "qwen3-30b-a3b", "-H", "h200").output
    args = ("roofline", "-H", "h200", "--num-speculative-tokens", "1", "--acceptance", "0.7")
    hybrid = run(*args, "-m", "qwen3.6-27b").output
    assert "1 draft token accepted at 70% each" in hybrid
    assert "rooftop's engine does not run speculative decoding on this hybrid model" in hybrid
    assert "does not run speculative" not in run(*args, "-m", "qwen3-8b").output


def test_explain_takes_tensor_parallelism_and_custom_hardware_as_roofline_does():
    """Its memory check told a 70B on an H100 to "use more tensor parallelism", which explain had no option for;
    custom hardware could not be timed under --tp (no option gave its interconnect)."""
    assert_error(run("explain", "-m", "llama-3.1-70b", "-H", "h100"), "use more tensor parallelism")
    text = run("explain", "-m", "llama-3.1-70b", "-H", "h100", "--tp", "4").output
    assert "on NVIDIA H100 SXM, split over 4 of them (tensor parallel" in text
    assert "It must read 34.8 GB of the 35.3 GB of weights" in text  # 141 GB of bf16 weights over 4
    # one device's KV cache too: 2 x 80 layers x 8 KV heads x 128 x 2 bytes per token, 2 of the 8 heads on each
    assert "the KV cache holding 83.9 MB (81.9 kB per token)" in text and "plus the KV cache (84 MB)" in text
    custom = ("-m", "llama-3.1-70b", "--peak-tflops", "100", "--bandwidth-tbs", "1", "--memory-gb", "80", "--tp", "4")
    assert_error(run("roofline", *custom), "has no interconnect bandwidth")
    assert run("roofline", *custom, "--interconnect-gbs", "100").exit_code == 0
    assert run("explain", *custom, "--interconnect-gbs", "100").exit_code == 0
    assert_error(run("roofline", "-H", "h100", "--interconnect-gbs", "100"), "--interconnect-gbs describes custom")


def test_this_machine_is_named_in_any_case_and_a_group_is_checked_before_its_probe():
    """-H THIS was an unknown name (catalog names ignore case), and the list of known names left 'this' out; a tp
    the model cannot split asked for a group probe first, only to be refused after it."""
    assert_error(run("roofline", "-H", "thiss"), "unknown hardware 'thiss'", "this")
    assert_error(run("roofline", "-m", "smollm2-135m", "-H", "THIS", "--tp", "2"), "valid sizes: 1, 3")


def test_a_tp_that_cuts_the_mlps_features_is_refused_as_the_engine_refuses_it():
    """9 ranks split SmolLM2's 9 heads but not its 1536 intermediate features: the analyzer listed and timed 9,
    which the engine refuses."""
    from rooftop.errors import InvalidRequestError
    from rooftop.models.parallel import check_tensor_parallel
    from rooftop.roofline.presets import find_preset

    refused = run("roofline", "-m", "smollm2-135m", "-H", "h100", "--tp", "9")
    assert_error(refused, "tensor parallel degree 9", "1536 intermediate features", "valid sizes: 1, 3")
    assert refused.output.strip().endswith("valid sizes: 1, 3")
    with pytest.raises(InvalidRequestError, match="valid sizes: 1, 3$"):
        check_tensor_parallel(find_preset("smollm2-135m"), 9)
    moe = run("roofline", "-m", "qwen3-30b-a3b", "-H", "h100", "--tp", "3")  # 4 KV heads: 3 splits no heads either
    assert_error(moe, "768 expert intermediate features")


def test_efficiencies_given_are_named_as_the_expectation():
    """Given --compute-efficiency/--memory-efficiency, the expected line said the H100 had no published efficiencies
    (it has; the given ones replace them)."""
    given = run("roofline", "-m", "qwen3-8b", "-H", "h100", "--memory-efficiency", "0.8", "--compute-efficiency", "0.7")
    assert "at the efficiencies given (0.7 of the compute peaks, 0.8 of the memory roof)" in given.output
    assert "no published efficiencies" not in given.output
    assert "at the efficiencies published engines reach here" in run("roofline", "-m", "qwen3-8b", "-H", "h100").output


def test_decode_rate_and_output_throughput_are_told_apart():
    """ "output tok/s" was batch / TPOT, the decode rate; vLLM's output throughput counts the prefill's time too."""
    args = ("roofline", "-m", "qwen3-30b-a3b", "-H", "h100", "-b", "32", "--weights", "int4", "--kv", "fp8")
    data = json.loads(run(*args, "--json").output)
    assert data["decode_tokens_per_s_total"] == pytest.approx(32 / data["tpot_s"])
    assert data["output_tokens_per_s"] == pytest.approx(32 * 256 / data["e2e_s"])
    assert data["output_tokens_per_s"] < data["decode_tokens_per_s_total"]
    text = run(*args).output
    assert "decode tok/s" in text and "(1 / TPOT)" in text and "over the end-to-end time" in text


def test_a_crossover_to_compute_bound_weighs_the_collectives_too():
    """An interconnect-bound tensor-parallel step was called compute-bound from 3 prompt tokens (the crossover
    compared the math with the memory traffic alone)."""
    args = ("-m", "smollm2-135m", "--peak-tflops", "10", "--bandwidth-tbs", "1", "--memory-gb", "80", "--tp", "3")
    data = json.loads(run("roofline", *args, "--interconnect-gbs", "1", "-p", "38", "-n", "16", "--json").output)
    assert data["prefill"]["bound"] == "interconnect" and data["decode"]["bound"] == "interconnect"
    assert data["prefill_compute_bound_from_tokens"] > 38
    assert data["decode_compute_bound_from_batch"] is None or data["decode_compute_bound_from_batch"] > 1
