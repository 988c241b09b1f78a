"""Structured output on the bundled model: how many JSON outputs validate, what the grammar costs per token.

    .venv/bin/python benchmarks/structured_output.py [--requests 24] [--max-tokens 64] [--validity-only] [--json FILE]

Twelve JSON schemas (nested objects, arrays, enums, bounded numbers, required and optional fields); request i asks
for schema i mod 12 with seed i at temperature 1.0 (every fourth greedy). Each request runs alone, once with the
schema and once without (same prompt, alternating), so the two TPOTs (a request's time after its first token over
its tokens after the first, sampling included) are comparable. A constrained output counts as valid when its
finish_reason is stop and it parses and validates with jsonschema. The mask time per token is the grammar's own
host work in the sampler (filling the bitmask and masking the logits) plus advancing the grammar by the token.
`--validity-only` skips the unconstrained runs: the counts without the TPOT comparison, in about half the time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import datetime, timezone

import jsonschema

from rooftop import LLM, SamplingParams, StructuredOutputsParams
from rooftop.engine import sampler, structured

INT = {"type": "integer", "minimum": 0, "maximum": 100}
NAME = {"type": "string", "maxLength": 16}
SCHEMAS = [
    {"type": "object", "properties": {"name": NAME, "age": INT}, "required": ["name", "age"]},
    {"type": "object", "properties": {"city": NAME, "country": NAME, "population": INT}, "required": ["city"]},
    {
        "type": "object",
        "properties": {"title": NAME, "tags": {"type": "array", "items": NAME, "maxItems": 3}},
        "required": ["title", "tags"],
    },
    {
        "type": "object",
        "properties": {"status": {"enum": ["open", "closed", "pending"]}, "priority": INT},
        "required": ["status"],
    },
    {
        "type": "object",
        "properties": {
            "user": {"type": "object", "properties": {"name": NAME, "email": NAME}, "required": ["name"]},
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    {
        "type": "object",
        "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 60}, "unit": {"enum": ["C", "F"]}},
        "required": ["temperature", "unit"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"name": NAME, "qty": INT}, "required": ["name", "qty"]},
                "maxItems": 3,
            }
        },
        "required": ["items"],
    },
    {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["answer"],
    },
    {
        "type": "object",
        "properties": {
            "book": {
                "type": "object",
                "properties": {
                    "title": NAME,
                    "author": NAME,
                    "year": {"type": "integer", "minimum": 1400, "maximum": 2030},
                },
                "required": ["title", "author"],
            }
        },
        "required": ["book"],
    },
    {
        "type": "object",
        "properties": {"colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
        "required": ["colors"],
    },
    {
        "type": "object",
        "properties": {"x": INT, "y": INT, "label": NAME},
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "event": NAME,
            "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
            "attendees": {"type": "integer", "minimum": 1, "maximum": 500},
        },
        "required": ["event", "date"],
        "additionalProperties": False,
    },
]


def timed(function, seconds: list[float], counts=lambda *args: True):
    """`function`, adding the duration of each call that `counts` to `seconds`."""

    def wrapper(*args):
        t0 = time.perf_counter()
        result = function(*args)
        if counts(*args):
            seconds.append(time.perf_counter() - t0)
        return result

    return wrapper


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def tpot(output) -> float:
    m = output.metrics
    return (m.e2e - m.ttft) / max(1, m.output_tokens - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--validity-only", action="store_true", help="skip the unconstrained runs (no TPOT)")
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args()

    llm = LLM()
    masks, advances = [], []
    constrained_step = lambda logits, grammars: any(g is not None for g in grammars)  # noqa: E731
    sampler.apply_grammars = timed(structured.apply_grammars, masks, constrained_step)
    structured.GrammarState.advance = timed(structured.GrammarState.advance, advances)
    # kernels built, first-step costs out of the way
    llm.generate(["warm up"], SamplingParams(max_tokens=4), use_tqdm=False)
    valid, stopped, with_schema, without, tokens = 0, 0, [], [], 0
    for i in range(args.requests):
        schema = SCHEMAS[i % len(SCHEMAS)]
        content = f"Reply with a JSON object that follows this schema: {json.dumps(schema)}"
        prompt = llm.apply_chat_template([{"role": "user", "content": content}])
        sampling = dict(max_tokens=args.max_tokens, temperature=0.0 if i % 4 == 0 else 1.0, seed=i)
        spec = StructuredOutputsParams(json=schema)
        for constrained in (i % 2 == 0, i % 2 == 1):  # alternate which runs first
            if args.validity_only and not constrained:
                continue
            params = SamplingParams(**sampling, structured_outputs=spec if constrained else None)
            out = llm.generate([prompt], params, use_tqdm=False)[0]
            (with_schema if constrained else without).append(tpot(out))
            if not constrained:
                continue
            tokens += len(out.token_ids)
            if out.finish_reason == "stop":
                stopped += 1
                try:
                    jsonschema.validate(json.loads(out.text), schema)
                    valid += 1
                except (json.JSONDecodeError, jsonschema.ValidationError):
                    pass
    per_token = [m + a for m, a in zip(masks, advances, strict=False)]
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
        "cpu": cpu_model(),
        "requests": args.requests,
        "schemas": min(args.requests, len(SCHEMAS)),
        "max_tokens": args.max_tokens,
        "valid_percent": 100 * valid / args.requests,
        "stopped": stopped,  # the others were cut by max_tokens
        "stopped_and_invalid": stopped - valid,  # the grammar's guarantee: always 0
        "constrained_tokens": tokens,
        "mask_ms_per_token_median": 1e3 * statistics.median(per_token),
        "tpot_ms_with_schema_median": 1e3 * statistics.median(with_schema),
        "tpot_ms_without_median": 1e3 * statistics.median(without) if without else None,
    }
    for key, value in result.items():
        print(f"{key:28} {value:.3f}" if isinstance(value, float) else f"{key:28} {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
