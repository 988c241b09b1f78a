"""The device check (benchmarks/gpu_check.sh, gpu_check.py, gpu_wheels.txt) on the CPU: its wheel list against what
rooftop needs, the script's arguments, and every kind of section run with --dry-run on tiny models."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
DEVICE_PYTHON = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3"}


def wheel_list() -> tuple[dict[str, str], set[str]]:
    """The pins (name -> version) and the packages the list says the device has."""
    pins, present = {}, set()
    for line in (ROOT / "benchmarks" / "gpu_wheels.txt").read_text().splitlines():
        if line.startswith("# present on the device:"):
            present = {canonicalize_name(n) for n in line.split(":", 1)[1].split()}
        elif line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[0-9][0-9a-z.]*", version), f"not an exact pin: {line}"
            assert canonicalize_name(name) not in pins, f"pinned twice: {name}"
            pins[canonicalize_name(name)] = version
    return pins, present


def needs(requirement: str) -> bool:
    """Whether a requirement applies on the device (Python 3.12, no extras)."""
    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate({**DEVICE_PYTHON, "extra": ""})


def test_every_dependency_is_pinned_or_on_the_device():
    pins, present = wheel_list()
    block = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S).group(1)
    project = re.findall(r'^\s*"([^"]+)"', block, re.M)
    assert "torch>=2.5" in project and len(project) > 10
    for dependency in map(Requirement, project):
        name = canonicalize_name(dependency.name)
        assert name in pins or name in present, f"{name}: neither pinned nor on the device"
        if name in pins:
            assert Version(pins[name]) in dependency.specifier, f"{name}=={pins[name]} against {dependency}"


def test_each_wheels_own_requirements_travel_too():
    """What a pinned wheel requires (its metadata where it is installed here) is pinned or on the device."""
    pins, present = wheel_list()
    for name in pins:
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in filter(needs, requires):
            wanted = canonicalize_name(Requirement(requirement).name)
            assert wanted in pins or wanted in present, f"{name} needs {requirement}"
            if wanted in pins:
                assert Version(pins[wanted]) in Requirement(requirement).specifier, f"{name} needs {requirement}"


def run_script(*args: str, tmpdir: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, **({"TMPDIR": str(tmpdir)} if tmpdir else {})}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("args", [[], ["--dry-run"], ["out", "--bogus"], ["out", "no-such-section"]])
def test_the_script_refuses_bad_arguments(tmp_path, args):
    result = run_script(*[str(tmp_path / a) if a == "out" else a for a in args])
    assert result.returncode == 2 and "usage: benchmarks/gpu_check.sh OUT" in result.stderr


def test_the_script_reports_each_section_and_packs_what_it_wrote(tmp_path):
    """A summary with no results: the section still runs; OUT holds the four files the device tool brings back, and
    the script's work folder is gone."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = run_script(str(tmp_path / "out"), "--dry-run", "summary", tmpdir=scratch)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    assert (out / "steps.txt").read_text().startswith("summary: ok in ")
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.tar.gz", "steps.txt", "summary.json", "summary.md"]
    assert list(scratch.iterdir()) == []


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_tokenizer_written_for_the_device_is_the_bundled_one(gpu_check, tmp_path):
    from rooftop.loading.bundled import bundled_model_path
    from rooftop.loading.gguf_file import read_gguf
    from rooftop.loading.tokenizer import Tokenizer

    assert gpu_check.main(["tokenizer", str(tmp_path)]) == 0
    written = Tokenizer.from_hf_dir(tmp_path, [])
    bundled = Tokenizer.from_gguf_metadata(read_gguf(bundled_model_path()).metadata)
    text = "What is the weather in Lagos? 12345 <|im_start|>user"
    assert written.encode(text) == bundled.encode(text) and written.eos_token_ids == bundled.eos_token_ids
    assert written.chat_template == bundled.chat_template
    assert (tmp_path / "tokenizer.json").stat().st_size < 2_000_000


def test_the_sections_run_dry(gpu_check, tmp_path):
    """probe, a model section and the summary on the CPU: their JSON, the plot, the targets."""
    tokenizer = tmp_path / "tokenizer"
    gpu_check.main(["tokenizer", str(tokenizer)])
    out = tmp_path / "out"
    for section in ("probe", "llama-3.1-8b-bf16", "summary"):
        assert gpu_check.main([section, "--out", str(out), "--tokenizer", str(tokenizer), "--dry-run"]) == 0
    kernels = json.loads((out / "kernels.json").read_text())
    assert {(r["format"], r["path"]) for r in kernels["runs"]} == {("fp32", "kernel")}
    result = json.loads((out / "llama-3.1-8b-bf16.json").read_text())
    assert [p["prompt"] for p in result["ttft"]] == [48] and [p["batch"] for p in result["tpot"]] == [1, 2]
    for point in result["ttft"] + result["tpot"]:
        assert point["step_s"] > 0 and 0 < point["bound_s"] and point["expected_s"] > point["bound_s"]
    assert all(p["decode_steps"] == 3 and p["graph_replay_s"] is None for p in result["tpot"])  # no graphs on a CPU
    assert (out / "llama-3.1-8b-bf16.png").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert [t["target"] for t in summary["targets"]] == [
        "8B bf16 decode at batch 1: share of the read bandwidth"
    ]  # the dry run's prompt is not 2048 tokens, and no 27B section ran
    assert len(summary["table"]) == 2 + 3
