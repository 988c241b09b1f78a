"""The `rooftop` command as a user runs it: streaming output, the report, chat, and one-line errors."""

import json
import os
import subprocess
import sys

import gguf
import pytest
import torch
from gguf_factory import with_nan_output_norm, write_tiny_gguf
from typer.testing import CliRunner

from rooftop.cli import app


def rooftop(*args, stdin=None, timeout=300):
    """The real command in its own process: exit codes, stdout/stderr and the absence of tracebacks as a user sees them."""
    return subprocess.run(
        [sys.executable, "-m", "rooftop", *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def rooftop_in_process(*args, stdin=None):
    """The same command in this process (no interpreter start-up): for the many one-line error cases."""
    result = CliRunner(env={"COLUMNS": "250"}).invoke(app, list(args), input=stdin)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def assert_user_error(result, *words):
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error:"), result.stderr
    for word in words:
        assert word in line, (word, line)


def test_generate_streams_text_and_reports(tiny_gguf):
    r = rooftop("generate", "hello", "--model", str(tiny_gguf), "-n", "6", "--temperature", "0", "--raw")
    assert r.returncode == 0, r.stderr
    for field in ("prompt tokens", "output tokens", "TTFT", "TPOT", "prefill", "decode", "tok/s"):
        assert field in r.stderr
    assert "6 (length)" in r.stderr
    # the phases' rates are forward passes alone, so they read faster than TPOT: the report says so
    assert "prefill and decode: the model's forward passes alone; TTFT and TPOT include sampling" in r.stderr


def test_a_decode_faster_than_the_probes_read_raises_it_for_later_runs(tiny_gguf, tiny_llm, tmp_path, monkeypatch):
    """A probe from a slow minute (here a read of 1 kB/s): generate's decode moved more, the report says so, and the
    cached read of the model's working set is what the decode moved, so the next run's bound is below its steps."""
    import dataclasses
    import json

    from rooftop.roofline import probe

    measured = probe.read_cache(probe.cache_path())
    monkeypatch.setenv("ROOFTOP_CACHE_DIR", str(tmp_path))
    slow = dataclasses.replace(measured, read_bandwidth=1e3, read_by_size={s: 1e3 for s in measured.read_by_size})
    probe.cache_path().write_text(json.dumps(slow.to_dict()))
    r = rooftop_in_process("generate", "hello", "--model", str(tiny_gguf), "-n", "6", "--temperature", "0", "--raw")
    assert r.returncode == 0, r.stderr
    assert "decode ran faster than its bound" in r.stderr
    assert "rooftop now keeps" in " ".join(r.stderr.split()), r.stderr
    raised = probe.read_cache(probe.cache_path())
    assert raised.read_bandwidth_at(tiny_llm.weight_bytes) > 1e3 and raised.read_bandwidth == 1e3
    assert "moved by a decode of tiny.gguf" in raised.notes[probe.OBSERVED]
    shown = rooftop_in_process("probe")  # the cached roofs, with the reads runs raised
    assert shown.returncode == 0 and "observed_reads" in shown.stdout and "a decode of tiny.gguf" in shown.stdout


def test_generate_output_matches_the_python_api(tiny_gguf, tiny_llm):
    from rooftop import SamplingParams

    expected = tiny_llm.generate(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", SamplingParams(max_tokens=8, temperature=0)
    )[0].text
    r = rooftop_in_process("generate", "hi", "--model", str(tiny_gguf), "-n", "8", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected + "\n"


@pytest.mark.slow
def test_demo_answers_the_lagos_question():
    r = rooftop("generate", "What is the weather in Lagos?", "-n", "40", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert "Lagos" in r.stdout
    assert "TTFT" in r.stderr and "SmolLM2" not in r.stdout


def test_chat_is_multi_turn_and_ends_on_eof(tiny_gguf, tiny_llm):
    """Piped input gets no `>>> ` prompts (python's REPL prints them only to a terminal): stdout is the answers, one
    line each, the second given the first turn as history."""
    from rooftop import SamplingParams

    r = rooftop_in_process("chat", "--model", str(tiny_gguf), "-n", "4", "--temperature", "0", stdin="hi\n\nagain\n")
    assert r.returncode == 0, r.stderr
    greedy = SamplingParams(max_tokens=4, temperature=0)
    messages, answers = [], []
    for line in ("hi", "again"):  # the empty line is skipped
        messages.append({"role": "user", "content": line})
        answers.append(tiny_llm.generate(tiny_llm.apply_chat_template(messages), greedy)[0].text)
        messages.append({"role": "assistant", "content": answers[-1]})
    assert r.stdout == "".join(f"{a}\n" for a in answers)


def test_chat_takes_stop_strings_as_generate_does(tiny_gguf, tiny_llm):
    """The README's sampling options hold for chat too: --stop was "No such option" there."""
    from rooftop import SamplingParams

    prompt = tiny_llm.apply_chat_template([{"role": "user", "content": "hi"}])
    full = tiny_llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0))[0].text
    assert len(full) >= 3
    stop = full[2]
    r = rooftop_in_process(
        "chat", "--model", str(tiny_gguf), "-n", "8", "--temperature", "0", "--stop", stop, stdin="hi\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == full[: full.index(stop)] + "\n"


def test_chat_prompts_a_terminal_on_stderr_and_keeps_stdout_the_answers(tiny_gguf, tiny_llm):
    """Typed at a terminal, `>>> ` goes to stderr, as python's REPL writes it: `rooftop chat > answers.txt` kept
    the prompts in the file when they went to stdout."""
    import pty

    from rooftop import SamplingParams

    leader, follower = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "rooftop", "chat", "--model", str(tiny_gguf), "-n", "3", "--temperature", "0"],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as chat:
        os.close(follower)
        os.write(leader, b"hi\n\x04")  # a line, then Ctrl-D at the start of the next
        out, errors = chat.communicate(timeout=300)
    os.close(leader)
    assert chat.returncode == 0, errors
    prompt = tiny_llm.apply_chat_template([{"role": "user", "content": "hi"}])
    assert out == tiny_llm.generate(prompt, SamplingParams(max_tokens=3, temperature=0))[0].text + "\n"
    assert errors.count(">>> ") == 2


def test_chat_reset_says_so_and_forgets_the_history(tiny_gguf):
    r = rooftop_in_process("chat", "--model", str(tiny_gguf), "-n", "2", "--stats", stdin="hi\nhi\n/reset\nhi\n")
    assert r.returncode == 0, r.stderr
    assert "history cleared" in r.stderr
    prompts = [line.split()[2] for line in r.stderr.splitlines() if line.strip().startswith("prompt tokens")]
    assert len(prompts) == 3 and prompts[2] == prompts[0] != prompts[1]  # after /reset, the first turn's prompt again


def test_chat_exit_command(tiny_gguf):
    r = rooftop_in_process("chat", "--model", str(tiny_gguf), "-n", "4", "--stats", stdin="/exit\nnever sent\n")
    assert r.returncode == 0 and r.stdout == ""


def test_chat_reports_a_too_long_turn_and_goes_on(tiny_gguf):
    r = rooftop_in_process("chat", "--model", str(tiny_gguf), "-n", "2", stdin="x" * 200 + "\nhi\n")
    assert r.returncode == 0
    assert "the prompt has" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout.count("\n") == 1 and ">>>" not in r.stdout  # the answer to hi alone


@pytest.mark.parametrize(
    "args, words",
    [
        (["-n", "0"], ["max_tokens"]),
        (["--temperature", "-1"], ["temperature"]),
        (["--top-p", "0"], ["top_p"]),
        (["--top-p", "1.5"], ["top_p"]),
        (["--top-k", "-2"], ["top_k"]),  # -1 is vLLM's spelling of 0
        (["--min-p", "1.5"], ["min_p"]),
        (["--dtype", "int3"], ["dtype"]),
    ],
)
def test_invalid_sampling_options(tiny_gguf, args, words):
    assert_user_error(rooftop_in_process("generate", "hi", "--model", str(tiny_gguf), *args), *words)


@pytest.mark.parametrize("command", [["generate", "hi"], ["probe"]])
def test_a_device_rooftop_cannot_run_on_is_one_line(tiny_gguf, command):
    """Every command that takes --device: an unknown device, or CUDA in a PyTorch without it, is refused by name
    (they were tracebacks from torch.device or the first CUDA call)."""
    model = ["--model", str(tiny_gguf)] if command[0] == "generate" else []
    for device in ("tpu", "mps", "cuda:x"):
        result = rooftop_in_process(*command, *model, "--device", device)
        assert_user_error(result, f"device must be cpu, cuda or cuda:N; got '{device}'")
    if not torch.cuda.is_available():
        result = rooftop_in_process(*command, *model, "--device", "cuda")
        assert_user_error(result, f"device cuda: this PyTorch ({torch.__version__})")


def test_empty_prompt(tiny_gguf):
    assert_user_error(rooftop_in_process("generate", "", "--model", str(tiny_gguf)), "empty")


def test_prompt_longer_than_context(tiny_gguf):
    assert_user_error(rooftop_in_process("generate", "x" * 100, "--raw", "--model", str(tiny_gguf)), "100 tokens", "64")


def test_missing_model_path(tmp_path):
    assert_user_error(rooftop("generate", "hi", "--model", str(tmp_path / "nope.gguf")), "no such file")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"this is not a model" * 100)
    assert_user_error(rooftop_in_process("generate", "hi", "--model", str(path)), "not a valid GGUF")


def test_truncated_gguf(tiny_gguf, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    assert_user_error(rooftop_in_process("generate", "hi", "--model", str(path)), str(path))


def test_generate_fails_with_the_engines_reason_when_the_model_gives_non_finite_logits(tiny_gguf, tmp_path):
    """It exited 0 with an empty answer and only "(error)" in the report."""
    result = rooftop_in_process(
        "generate",
        "hi",
        "--raw",
        "-n",
        "4",
        "--no-roofline",
        "--model",
        str(with_nan_output_norm(tiny_gguf, tmp_path / "nan.gguf")),
    )
    assert_user_error(result, "generation failed", "non-finite logits")
    assert "0 (error)" in result.stderr  # the report still comes first


def test_chat_says_why_a_turn_failed_and_goes_on(tiny_gguf, tmp_path):
    r = rooftop_in_process(
        "chat", "--model", str(with_nan_output_norm(tiny_gguf, tmp_path / "nan.gguf")), "-n", "2", stdin="hi\nagain\n"
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert r.stderr.count("generation failed: the model produced non-finite logits (try /reset)") == 2
    assert r.stdout == "\n\n"  # both turns' empty answers, no prompts


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "gpt2.gguf"
    write_tiny_gguf(path, arch="gpt2")
    assert_user_error(rooftop_in_process("generate", "hi", "--model", str(path)), "'gpt2'", "not supported")


def test_unsupported_tensor_type(tmp_path):
    path = tmp_path / "q8_1.gguf"  # an activation type: gguf's reader does not decode it
    write_tiny_gguf(path, qtype=gguf.GGMLQuantizationType.Q8_1)
    assert_user_error(rooftop_in_process("generate", "hi", "--model", str(path)), "Q8_1", "not supported")


def test_unsupported_tokenizer(tmp_path):
    path = tmp_path / "spm.gguf"
    write_tiny_gguf(path, tokenizer_model="llama")
    assert_user_error(rooftop_in_process("generate", "hi", "--model", str(path)), "tokenizer model 'llama'")


def test_hf_directory_without_config(tmp_path):
    assert_user_error(rooftop_in_process("generate", "hi", "--model", str(tmp_path)), "config.json")


def test_a_config_without_weights_points_at_dummy_weights(tmp_path):
    """A config.json (or a directory holding only one) has no weights to read: the error says what runs it."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 64}
    config |= {"num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for model in (tmp_path / "config.json", tmp_path):
        assert_user_error(rooftop_in_process("generate", "hi", "--model", str(model)), "--load-format dummy")


def test_help_lists_the_commands():
    r = rooftop_in_process("--help")
    assert r.returncode == 0 and "generate" in r.stdout and "chat" in r.stdout


ENGINE_OPTIONS = (
    "--model",
    "--dtype",
    "--device",
    "--weights",
    "--threads",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--block-size",
    "--kv-cache-bytes",
    "--num-kv-blocks",
    "--enable-prefix-caching",
    "--max-model-len",
    "--load-format",
    "--dummy-seed",
    "--speculative-config",
)


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench"])
def test_every_command_that_starts_an_engine_takes_the_same_engine_options(command):
    from rooftop.cli_options import RUN_HELP

    shown = rooftop_in_process(command, "--help").stdout
    assert all(option in shown for option in ENGINE_OPTIONS), [o for o in ENGINE_OPTIONS if o not in shown]
    words = " ".join(shown.replace("│", " ").split())  # the help table's cells, unwrapped
    assert RUN_HELP["weights"][-1] in words  # one option, one help text


@pytest.mark.parametrize(
    "args, words",
    [
        (["generate", "hi", "--max-num-seqs", "0"], ["max_num_seqs must be an integer >= 1"]),
        (["chat", "--block-size", "0"], ["block_size must be an integer >= 1"]),
        (["serve", "--max-model-len", "0"], ["max_model_len must be an integer >= 1"]),
        (["generate", "hi", "--threads", "0"], ["threads must be an integer >= 1"]),
        (["bench", "--dtype", "float8"], ["dtype must be one of auto, float32, bfloat16, float16"]),
        (["generate", "hi", "--weights", "int3"], ["unknown weight format 'int3' (known: auto, float, int8, int4"]),
        (["serve", "--speculative-config", "{method: ngram}"], ["--speculative-config is not valid JSON"]),
        (
            ["bench", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 0}'],
            ["num_speculative_tokens must be an integer >= 1"],
        ),
        (
            ["chat", "--speculative-config", '{"method": "medusa", "num_speculative_tokens": 2}'],
            ["method must be one of ngram, draft; got 'medusa'"],
        ),
        # llama.cpp's spellings: click read -ctk as -c with "tk" and -md FILE as -m with "d"
        (["generate", "hi", "-ctk", "q8_0"], ["llama.cpp's -ctk", "--kv-cache-dtype"]),
        (
            ["serve", "-md", "draft.gguf"],
            ["llama.cpp's -md has no counterpart in rooftop serve", "--speculative-config"],
        ),
        (["chat", "-c", "4096"], ["llama.cpp's -c", "--max-model-len"]),
        # infinity (or 1e12) overflowed the clocks' arithmetic: a traceback after the group started
        (["generate", "hi", "-tp", "3", "--distributed-timeout", "inf"], ["--distributed-timeout", "at most 604800"]),
        (["generate", "hi", "--distributed-timeout", "1e12"], ["must be a number of seconds > 0 and at most"]),
        # a CUDA option on the CPU was ignored without a word
        (["generate", "hi", "--cuda-graph-sizes", "8"], ["cuda_graph_sizes", "cpu captures none"]),
    ],
)
def test_bad_engine_options_fail_in_one_line_before_anything_loads(args, words):
    assert_user_error(rooftop_in_process(*args), *words)


def test_generate_takes_max_model_len(tiny_gguf):
    """An engine option serve always had: a context shorter than the model's refuses a prompt that does not fit."""
    args = ["generate", "a prompt of some length", "--model", str(tiny_gguf), "--raw", "--max-model-len", "8"]
    assert_user_error(rooftop_in_process(*args), "the context holds 8")


def test_a_prompt_after_two_dashes_is_not_taken_for_llama_cpps_option(tiny_gguf):
    r = rooftop_in_process("generate", "--model", str(tiny_gguf), "-n", "2", "--raw", "--no-roofline", "--", "-c")
    assert r.returncode == 0, r.stderr
    # nor the value of one of rooftop's own options
    r = rooftop_in_process("generate", "hi", "--model", str(tiny_gguf), "-n", "2", "--no-roofline", "--stop", "-c")
    assert r.returncode == 0, r.stderr


def test_a_request_the_kv_pool_cannot_hold_names_the_options_that_change_it(tiny_gguf):
    """The refusal named Python's parameters (kv_cache_bytes, max_tokens) to a user of the command line."""
    args = ["generate", "hi", "--model", str(tiny_gguf), "--num-kv-blocks", "1", "-n", "50", "--raw"]
    assert_user_error(rooftop_in_process(*args), "tokens of KV cache", "--kv-cache-bytes", "--num-kv-blocks", "-n")


def test_a_max_model_len_past_the_models_positions_is_refused(tiny_gguf):
    """It was cut to the model's 64 positions without a word (an option silently ignored); vLLM refuses it too."""
    args = ["generate", "hi", "--model", str(tiny_gguf), "--max-model-len", "100000"]
    assert_user_error(rooftop_in_process(*args), "max_model_len 100000 is more than the model's 64 positions")


def test_a_command_option_named_like_an_engine_option_is_refused_unless_it_sets_the_field():
    """A command's own option may stand for a RunConfig field only with a parser to the field's value (bench's -t);
    any other clash with the shared options is a programming error, caught at import."""
    from rooftop.cli_options import with_run_config
    from rooftop.config import RunConfig

    def command(threads: str = "1", *, run: RunConfig) -> None: ...

    with pytest.raises(TypeError, match=r"command declares shared engine options of its own: \['threads'\]"):
        with_run_config(command)
    assert with_run_config(command, run_fields={"threads": int}).__signature__.parameters["threads"].default == "1"
