"""Accuracy of each weight format against the float32 reference on the bundled model.

    .venv/bin/python benchmarks/accuracy.py [--tokens 64] [--gguf NAME=FILE ...]

--gguf adds a file of the same model in another GGUF type (e.g. the bundled model requantized by llama.cpp's
quantizer to Q4_K_M), run as `--weights auto` runs it: each tensor in the format the file holds.

The float32 model writes a greedy continuation of each prompt; every format then reads the same token
sequence (teacher forcing) and we compare its logits position by position: top-1 agreement, and the
logit error relative to the reference's spread. Then each format's own greedy tokens are compared too, and at
each first difference the float32 logit margin of its choice over the format's says how near a tie it was.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from rooftop import LLM, SamplingParams
from rooftop.enums import Phase
from rooftop.models.kv_cache import KVCache

PROMPTS = [
    [{"role": "user", "content": "What is the weather in Lagos?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Explain what a transformer is in machine learning."}],
    [{"role": "user", "content": "Give me three tips for learning to cook."}],
    [{"role": "user", "content": "What is 17 times 23?"}],
]


def all_logits(llm: LLM, ids: list[int], prompt_len: int) -> torch.Tensor:
    """Logits at every position, computed as generation computes them: the prompt as one prefill, then one decode
    step per token (decode-sized steps run other kernels than a long prefill does)."""
    cache = KVCache(llm.config, len(ids), llm.dtype, llm.device)
    with torch.inference_mode():
        steps = [llm.model.logits(llm.model.forward(torch.tensor(ids[:prompt_len]), cache, 0))]
        for pos in range(prompt_len, len(ids)):
            steps.append(
                llm.model.logits(llm.model.forward(torch.tensor(ids[pos : pos + 1]), cache, pos, Phase.DECODE))
            )
    return torch.cat(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--gguf", action="append", default=[], metavar="NAME=FILE", help="another file of the model")
    args = parser.parse_args()
    greedy = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    reference = LLM(dtype="float32", weights="float")
    prompts = [reference.apply_chat_template(m) for m in PROMPTS]
    ref_outputs = reference.generate(prompts, greedy)
    sequences = [o.prompt_token_ids + o.token_ids for o in ref_outputs]
    ref_logits = [
        all_logits(reference, s, len(o.prompt_token_ids)) for s, o in zip(sequences, ref_outputs, strict=True)
    ]
    print(
        "| format | top-1 agreement (teacher-forced) | max abs logit error | mean abs logit error / logit std "
        "| greedy tokens identical to float32 | first differences: token (float32's logit margin there) |"
    )
    print("|---|---|---|---|---|---|")
    formats = {
        "float32": {"dtype": "float32"},
        "bfloat16": {"dtype": "bfloat16", "weights": "float"},
        "int8": {"weights": "int8"},
        "int4": {"weights": "int4"},
        **{name: {"model": path} for name, _, path in (g.partition("=") for g in args.gguf)},
    }
    for name, options in formats.items():
        llm = reference if name == "float32" else LLM(**options)
        agree, total, max_err, rel = 0, 0, 0.0, []
        for ids, ref, out in zip(sequences, ref_logits, ref_outputs, strict=True):
            logits = all_logits(llm, ids, len(out.prompt_token_ids)).float()
            start = len(out.prompt_token_ids) - 1  # positions that predict the generated tokens
            a, b = logits[start:-1], ref[start:-1]
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += a.shape[0]
            max_err = max(max_err, float((a - b).abs().max()))
            rel.append(float((a - b).abs().mean() / b.std()))
        own = llm.generate(prompts, greedy)
        same = sum(o.token_ids == r.token_ids for o, r in zip(own, ref_outputs, strict=True))
        divergences = []  # (token index, float32's logit margin there for its own choice over this format's)
        for o, r, ref in zip(own, ref_outputs, ref_logits, strict=True):
            i = next((i for i, (x, y) in enumerate(zip(o.token_ids, r.token_ids, strict=False)) if x != y), None)
            if i is not None:  # the prefixes agree up to i, so float32's logits there are the reference's own
                at = ref[len(r.prompt_token_ids) - 1 + i]
                divergences.append(f"{i} ({float(at[r.token_ids[i]] - at[o.token_ids[i]]):.2f})")
        print(
            f"| {name} | {100 * agree / total:.1f}% of {total} | {max_err:.3f} | {statistics.mean(rel):.4f} | "
            f"{same}/{len(prompts)} | {', '.join(divergences) or '-'} |"
        )


if __name__ == "__main__":
    main()
