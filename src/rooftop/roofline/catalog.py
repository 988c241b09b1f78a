"""The hardware catalog: dense datasheet peaks, memory and interconnect of common accelerators, found by name."""

from __future__ import annotations

import re

from rooftop.errors import InvalidRequestError
from rooftop.roofline.hardware import GIGA, TERA, Efficiency, Hardware, suggest

# What engines reach on NVIDIA's A100/H100-class GPUs, for the analyzer's expected times (`predict.expected_time`).
# Fit on one set of published figures and checked on another (docs/PERFORMANCE.md, "Catalog GPUs"):
# - decode, batch 1: TPOT = bytes / (memory x bandwidth) + layers x per_layer_s, least squares on the A100-80GB bf16
#   and int8 weight-only figures of torchao's README (pytorch/ao, torchao/quantization/README.md, 2024-10-07:
#   Llama-2-7B 107.38 / 170.83 tok/s, Llama-3-8B 95.64 / 153.03 tok/s, gpt-fast's harness, CUDA graphs): memory 0.926,
#   2.43 ms per step for these 32-layer models = 76 us per layer; int4 (tinygemm, group 64: 201.14 and 180.80 tok/s)
#   refit with the per-layer time held: memory_4bit 0.695. Checked on the same README's H100 Llama-3.1-8B
#   (126.90 tok/s bf16, 198.85 int8, 241.39 int4) and gpt-fast's README (pytorch-labs/gpt-fast, A100-80GB at 330 W:
#   Llama-2-7B 104.9 tok/s, Llama-3.1-8B 93.89).
# - prefill: compute 0.63 of the dense bf16 peak, the mean of TensorRT-LLM v0.5's A100 first-token latencies at
#   2048 tokens, batch 1 (docs/source/performance.md: LLaMA 7B 133 ms = 0.666, GPT-J 6B 129 ms = 0.598).
# - all-reduce of a decode step's hidden states (8-32 KB): on H100, vLLM's custom all-reduce 8.5-11.8 us at 2-8
#   GPUs (sglang PR #2904's unit test; NCCL ~6 us at 2 GPUs, nccl issue #1259): 9 us; on A100 no microbenchmark was
#   found: gpt-fast's TP8 Llama-2-7B (3.045 ms per token over 64 all-reduces) leaves at most ~31 us per call.
# The per-layer time comes from 32-layer models on one GPU; under tensor parallelism part of it shrinks with each
# GPU's share of the work, which this does not model.
NVIDIA_DECODE = {"memory": 0.926, "memory_4bit": 0.695, "compute": 0.63, "per_layer_s": 76e-6}

# Conventions, the same for every entry:
# - peaks are dense: vendors headline 2:4 structured sparsity, twice these; we halve such figures;
# - "bf16" is the 16-bit tensor rate with FP32 accumulation (what inference kernels use), "fp8" likewise;
#   "int8" is tensor TOPS; "fp32" is the plain (non-tensor) FP32 rate;
# - memory_bytes and bytes/s are decimal (GB = 1e9), as the datasheets print them;
# - interconnect_bandwidth is per GPU and one direction: NVLink's "900 GB/s" is the bidirectional total, so 450e9;
#   PCIe-only cards get their x16 link, one direction (Gen4 x16: "64 GB/s" bidirectional, so 32e9).
CATALOG: dict[str, Hardware] = {
    "h100": Hardware(
        name="NVIDIA H100 SXM",
        # datasheet: 1,979 TFLOPS bf16 / 3,958 fp8 / 3,958 TOPS int8 with sparsity; whitepaper: 989.4 dense bf16
        peak_flops={"fp32": 67 * TERA, "bf16": 989.4 * TERA, "fp8": 1978.9 * TERA, "int8": 1978.9 * TERA},
        memory_bandwidth=3.35 * TERA,
        memory_bytes=80 * GIGA,
        interconnect_bandwidth=450 * GIGA,  # NVLink 4: 900 GB/s bidirectional
        source="NVIDIA H100 Tensor Core GPU datasheet (2023), SXM column; H100 architecture whitepaper (2022)",
        efficiency=Efficiency(**NVIDIA_DECODE, all_reduce_s=9e-6),
    ),
    "h200": Hardware(
        name="NVIDIA H200 SXM",
        # the H100's compute die with HBM3e: the same peaks, more and faster memory
        peak_flops={"fp32": 67 * TERA, "bf16": 989.4 * TERA, "fp8": 1978.9 * TERA, "int8": 1978.9 * TERA},
        memory_bandwidth=4.8 * TERA,
        memory_bytes=141 * GIGA,
        interconnect_bandwidth=450 * GIGA,  # NVLink 4: 900 GB/s bidirectional
        source="NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column",
        efficiency=Efficiency(**NVIDIA_DECODE, all_reduce_s=9e-6),  # the H100's, not checked on an H200
    ),
    "b200": Hardware(
        name="NVIDIA B200 (HGX B200, per GPU)",
        # HGX B200 8-GPU board: 36 PFLOPS bf16 / 72 fp8 / 72 POPS int8 with sparsity, 600 TFLOPS fp32, 1.44 TB,
        # 64 TB/s; divided by 8 and halved for density
        peak_flops={"fp32": 75 * TERA, "bf16": 2250 * TERA, "fp8": 4500 * TERA, "int8": 4500 * TERA},
        memory_bandwidth=8 * TERA,
        memory_bytes=180 * GIGA,
        interconnect_bandwidth=900 * GIGA,  # NVLink 5: 1.8 TB/s bidirectional
        source="NVIDIA HGX B200 specifications (2024), divided per GPU; Blackwell architecture technical brief (2024)",
        notes={"memory": "180 GB usable of the 192 GB of HBM3e on the package (1,440 GB per 8-GPU board)"},
    ),
    "a100": Hardware(
        name="NVIDIA A100 80GB SXM",
        # no fp8 units: Hardware.peak() runs fp8 weights at the bf16 rate
        peak_flops={"fp32": 19.5 * TERA, "bf16": 312 * TERA, "int8": 624 * TERA},
        memory_bandwidth=2.039 * TERA,
        memory_bytes=80 * GIGA,
        interconnect_bandwidth=300 * GIGA,  # NVLink 3: 600 GB/s bidirectional
        source="NVIDIA A100 Tensor Core GPU datasheet (2021), 80GB SXM column",
        efficiency=Efficiency(**NVIDIA_DECODE, all_reduce_s=31e-6),
    ),
    "mi300x": Hardware(
        name="AMD Instinct MI300X",
        # datasheet: 2,614.9 TFLOPS bf16 / 5,229.8 fp8 / 5,229.8 TOPS int8 with sparsity; 163.4 TFLOPS fp32
        peak_flops={"fp32": 163.4 * TERA, "bf16": 1307.4 * TERA, "fp8": 2614.9 * TERA, "int8": 2614.9 * TERA},
        memory_bandwidth=5.3 * TERA,
        memory_bytes=192 * GIGA,
        interconnect_bandwidth=448 * GIGA,  # 7 Infinity Fabric links, 896 GB/s aggregate bidirectional
        source="AMD Instinct MI300X accelerator datasheet (2023)",
        notes={"interconnect": "aggregate of 7 peer links; one peer pair gets 1/7 of it"},
    ),
    "l4": Hardware(
        name="NVIDIA L4",
        # datasheet: 242 TFLOPS bf16 / 485 fp8 / 485 TOPS int8, all with sparsity
        peak_flops={"fp32": 30.3 * TERA, "bf16": 121 * TERA, "fp8": 242.5 * TERA, "int8": 242.5 * TERA},
        memory_bandwidth=300 * GIGA,
        memory_bytes=24 * GIGA,
        interconnect_bandwidth=32 * GIGA,  # PCIe Gen4 x16: 64 GB/s bidirectional
        source="NVIDIA L4 Tensor Core GPU datasheet (2023)",
    ),
    "rtx4090": Hardware(
        name="NVIDIA GeForce RTX 4090",
        # whitepaper, dense: 165.2 TFLOPS fp16/bf16 and 330.3 fp8 with FP32 accumulate (GeForce runs FP16
        # accumulate at twice that), 660.6 TOPS int8
        peak_flops={"fp32": 82.6 * TERA, "bf16": 165.2 * TERA, "fp8": 330.3 * TERA, "int8": 660.6 * TERA},
        memory_bandwidth=1008 * GIGA,
        memory_bytes=24 * GIGA,
        interconnect_bandwidth=32 * GIGA,  # PCIe Gen4 x16, no NVLink
        source="NVIDIA Ada Lovelace GPU architecture whitepaper (2022), GeForce RTX 4090 column",
    ),
}

# compact spellings (lowercase, letters and digits only, vendor words dropped) -> catalog key
ALIASES = {
    "h100sxm": "h100",
    "h100sxm5": "h100",
    "h200sxm": "h200",
    "h200sxm5": "h200",
    "hgxb200": "b200",
    "b200hgx": "b200",
    "b200sxm": "b200",
    "a10080gb": "a100",
    "a100sxm": "a100",
    "a100sxm4": "a100",
    "a10080gbsxm": "a100",
    "a100sxm80gb": "a100",
    "a100sxm480gb": "a100",
    "4090": "rtx4090",
}
_VENDOR_WORDS = ("nvidia", "amd", "geforce", "instinct")


def _compact(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    stripped = True
    while stripped:
        stripped = False
        for word in _VENDOR_WORDS:
            if key.startswith(word) and len(key) > len(word):
                key, stripped = key[len(word) :], True
    return key


def find_hardware(name: str) -> Hardware:
    """The catalog entry for `name` ("H200", "h200-sxm", "RTX 4090", "4090", "MI300X"), case and spacing ignored."""
    key = _compact(name)
    key = ALIASES.get(key, key)
    if key in CATALOG:
        return CATALOG[key]
    raise InvalidRequestError(f"unknown hardware {name!r}" + suggest(key or name, [*CATALOG, "this"]))
