"""The prompts a load run sends: random token strings of a given length, ShareGPT conversations, or JSONL,
with vLLM's sampling rules, and the tokenizer that counts their tokens."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rooftop.errors import InvalidRequestError
from rooftop.loading.tokenizer import Tokenizer

DEFAULT_OUTPUT_LEN = 128  # vLLM's --random-output-len


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int  # tokens, with the bench's tokenizer
    output_len: int  # sent as max_tokens


def load_tokenizer(path: str | None) -> Tokenizer:
    """The tokenizer of a GGUF file or a Hugging Face directory; the bundled SmolLM2's when none is given."""
    from rooftop.loading.bundled import bundled_model_path
    from rooftop.loading.gguf_file import read_gguf

    p = Path(path) if path else bundled_model_path()
    if p.is_dir():
        return Tokenizer.from_hf_dir(p, [])
    if not p.is_file():
        raise InvalidRequestError(f"--tokenizer {p}: no such file or directory")
    return Tokenizer.from_gguf_metadata(read_gguf(p).metadata)


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def random_requests(
    tokenizer: Tokenizer, n: int, input_len: int, output_len: int, range_ratio: float, seed: int
) -> list[SampleRequest]:
    """Prompts of random ordinary (non-special) tokens. Lengths are drawn uniformly from
    [len * (1 - r), len * (1 + r)] as vLLM's random dataset does; the text is re-tokenized so that
    `prompt_len` is what the tokenizer really makes of it."""
    if not 0 <= range_ratio < 1:
        raise InvalidRequestError(f"--range-ratio must be in [0, 1), got {range_ratio}")
    if input_len < 1 or output_len < 1:
        raise InvalidRequestError("--input-len and --output-len must be >= 1")
    rng = np.random.default_rng(seed)
    special = set(tokenizer.backend.get_added_tokens_decoder())
    ordinary = np.array([i for i in range(tokenizer.vocab_size) if i not in special])
    ins = rng.integers(int(input_len * (1 - range_ratio)), int(input_len * (1 + range_ratio)) + 1, size=n)
    outs = rng.integers(int(output_len * (1 - range_ratio)), int(output_len * (1 + range_ratio)) + 1, size=n)
    requests = []
    for length, out in zip(ins.tolist(), outs.tolist(), strict=True):
        length = max(length, 1)
        ids = rng.choice(ordinary, size=length).tolist()
        for _ in range(4):  # decoding then encoding merges or splits some tokens: trim or top up, re-check
            ids = tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)
            if len(ids) == length:
                break
            ids = ids[:length] + rng.choice(ordinary, size=max(0, length - len(ids))).tolist()
        prompt = tokenizer.decode(ids)
        requests.append(SampleRequest(prompt, count_tokens(tokenizer, prompt), max(out, 1)))
    return requests


def sharegpt_requests(
    path: Path, tokenizer: Tokenizer, n: int, output_len: int | None, seed: int
) -> list[SampleRequest]:
    """First human turn as the prompt; the reply's length as max_tokens unless --output-len fixes it.
    Shuffled with the seed and pruned like vLLM: prompt or reply under 4 tokens, prompt over 1024 tokens,
    or both over 2048 are skipped."""
    data = _read_json(path)
    if not isinstance(data, list):
        raise InvalidRequestError(f"{path}: a ShareGPT file is a JSON list of {{'conversations': [...]}} objects")
    pairs = []
    for item in data:
        turns = item.get("conversations") if isinstance(item, dict) else None
        if isinstance(turns, list) and len(turns) >= 2 and all(isinstance(t, dict) and "value" in t for t in turns[:2]):
            pairs.append((str(turns[0]["value"]), str(turns[1]["value"])))
    random.Random(seed).shuffle(pairs)
    requests = []
    for prompt, reply in pairs:
        prompt_len = count_tokens(tokenizer, prompt)
        out = output_len or count_tokens(tokenizer, reply)
        if prompt_len < 4 or (output_len is None and out < 4) or prompt_len > 1024 or prompt_len + out > 2048:
            continue
        requests.append(SampleRequest(prompt, prompt_len, out))
        if len(requests) == n:
            break
    return _fill(requests, n, path)


def jsonl_requests(path: Path, tokenizer: Tokenizer, n: int, output_len: int, seed: int) -> list[SampleRequest]:
    """One JSON object per line with a "prompt" string; shuffled with the seed (as vLLM's custom dataset)."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"{path}: cannot read ({e})") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            raise InvalidRequestError(f"{path} line {number}: not valid JSON ({e})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"]:
            raise InvalidRequestError(f"{path} line {number}: needs a non-empty string field 'prompt'")
        prompts.append(item["prompt"])
    random.Random(seed).shuffle(prompts)
    requests = [SampleRequest(p, count_tokens(tokenizer, p), output_len) for p in prompts[:n]]
    return _fill(requests, n, path)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"{path}: cannot read ({e})") from None
    except ValueError as e:
        raise InvalidRequestError(f"{path}: not valid JSON ({e})") from None


def _fill(requests: list[SampleRequest], n: int, path: Path) -> list[SampleRequest]:
    """Repeat the usable prompts in order when the file has fewer than --num-prompts."""
    if not requests:
        raise InvalidRequestError(f"{path}: no usable prompts")
    return [requests[i % len(requests)] for i in range(n)]


def build_requests(
    dataset: str,
    path: Path | None,
    tokenizer: Tokenizer,
    n: int,
    input_len: int,
    output_len: int | None,
    range_ratio: float,
    seed: int,
) -> list[SampleRequest]:
    """The --dataset's prompts; --output-len defaults to 128, or for ShareGPT to each reply's length."""
    if dataset == "random":
        return random_requests(tokenizer, n, input_len, output_len or DEFAULT_OUTPUT_LEN, range_ratio, seed)
    if dataset not in ("sharegpt", "jsonl"):
        raise InvalidRequestError(f"--dataset must be random, sharegpt or jsonl, got {dataset!r}")
    if path is None:
        raise InvalidRequestError(f"--dataset {dataset} needs --dataset-path FILE")
    if output_len is not None and output_len < 1:
        raise InvalidRequestError("--output-len must be >= 1")
    if dataset == "sharegpt":
        return sharegpt_requests(path, tokenizer, n, output_len, seed)
    return jsonl_requests(path, tokenizer, n, output_len or DEFAULT_OUTPUT_LEN, seed)
