"""Accuracy of each weight format against the float32 reference on the bundled model.

    .venv/bin/python benchmarks/accuracy.py [--tokens 64]

The float32 model writes a greedy continuation of each prompt; every format then reads the same token
sequence (teacher forcing) and we compare its logits position by position: top-1 agreement, and the
logit error relative to the reference's spread. Then each format's own greedy tokens are compared too.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from rooftop import LLM, SamplingParams
from rooftop.engine.kv_cache import KVCache

PROMPTS = [
    [{"role": "user", "content": "What is the weather in Lagos?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Explain what a transformer is in machine learning."}],
    [{"role": "user", "content": "Give me three tips for learning to cook."}],
    [{"role": "user", "content": "What is 17 times 23?"}],
]


def all_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    cache = KVCache(llm.config, len(ids), llm.dtype, llm.device)
    with torch.inference_mode():
        return llm.model.logits(llm.model.forward(torch.tensor(ids), cache, 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    greedy = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    reference = LLM(dtype="float32", weights="float")
    prompts = [reference.apply_chat_template(m) for m in PROMPTS]
    ref_outputs = reference.generate(prompts, greedy)
    sequences = [o.prompt_token_ids + o.token_ids for o in ref_outputs]
    ref_logits = [all_logits(reference, s) for s in sequences]
    print("| format | top-1 agreement (teacher-forced) | max abs logit error | mean abs logit error / logit std | greedy tokens identical to float32 |")
    print("|---|---|---|---|---|")
    formats = {"float32": {"dtype": "float32"}, "bfloat16": {"dtype": "bfloat16", "weights": "float"}, "int8": {"weights": "int8"}, "int4": {"weights": "int4"}}
    for name, options in formats.items():
        llm = reference if name == "float32" else LLM(**options)
        agree, total, max_err, rel = 0, 0, 0.0, []
        for ids, ref, out in zip(sequences, ref_logits, ref_outputs):
            logits = all_logits(llm, ids).float()
            start = len(out.prompt_token_ids) - 1  # positions that predict the generated tokens
            a, b = logits[start:-1], ref[start:-1]
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += a.shape[0]
            max_err = max(max_err, float((a - b).abs().max()))
            rel.append(float((a - b).abs().mean() / b.std()))
        own = llm.generate(prompts, greedy)
        same = sum(o.token_ids == r.token_ids for o, r in zip(own, ref_outputs))
        first_diff = [next((i for i, (x, y) in enumerate(zip(o.token_ids, r.token_ids)) if x != y), None) for o, r in zip(own, ref_outputs)]
        print(f"| {name} | {100 * agree / total:.1f}% of {total} | {max_err:.3f} | {statistics.mean(rel):.4f} | "
              f"{same}/{len(prompts)} (first difference at token {first_diff}) |")


if __name__ == "__main__":
    main()
