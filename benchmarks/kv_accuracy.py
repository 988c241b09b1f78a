"""Accuracy of each KV cache dtype against the float32 KV cache, on the bundled model at long context.

    PYTHONPATH=src python benchmarks/kv_accuracy.py [--weights auto|float|...] [--tokens N] [--prompt 256] [--kv ...]

The text is benchmarks/text/python_reference.txt: real English prose, about 5,900 tokens (its source and license
are in benchmarks/text/README.md). Its first --prompt tokens run as one prefill chunk; every later token is then fed
as a decode step of its own (teacher forcing), so that each position's logits come from decode attention reading
the cache as stored, at every context from --prompt to the text's length. All dtypes run in lockstep, position by
position, so that the float32 cache's logits are compared as they come instead of kept (49,152 floats each).

Per KV dtype: the bytes it stores per token, top-1 agreement with the float32 cache's logits, the mean |logit
error| (also relative to the mean standard deviation of the reference's logits) and the perplexity of the text.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rooftop import LLM
from rooftop.config import KV_CACHE_DTYPES
from rooftop.enums import Phase
from rooftop.models.kv_cache import KVCache, KVPool, kv_storage_dtype

TEXT = Path(__file__).with_name("text") / "python_reference.txt"


@dataclass
class Tally:
    """Running sums over the decoded positions of one KV dtype."""

    agree: int = 0
    positions: int = 0
    abs_error: float = 0.0  # sum over positions of the mean |logit error| over the vocabulary
    nll: float = 0.0  # sum of -log p(next token), nats
    errors: list[float] = field(default_factory=list)

    def add(self, logits: torch.Tensor, reference: torch.Tensor, next_token: int) -> None:
        self.agree += int(logits.argmax() == reference.argmax())
        self.positions += 1
        error = float((logits - reference).abs().mean())
        self.abs_error += error
        self.errors.append(error)
        self.nll -= float(torch.log_softmax(logits, -1)[next_token])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=None, help="use the text's first N tokens (default: all)")
    parser.add_argument("--prompt", type=int, default=256, help="tokens prefilled before the decodes start")
    parser.add_argument("--weights", default="auto", help="the bundled model's weights: auto (its Q4_1), float, ...")
    parser.add_argument("--kv", nargs="+", default=[d for d in KV_CACHE_DTYPES if d not in ("auto", "float32")])
    args = parser.parse_args()
    llm = LLM(dtype="float32", weights=args.weights)  # float32 activations: rooftop's kernels, float32 KV by default
    ids = llm.tokenizer.encode(TEXT.read_text())[: args.tokens]
    if len(ids) <= args.prompt:
        raise SystemExit(f"the text has {len(ids)} tokens, not more than --prompt {args.prompt}")
    names = ["float32", *args.kv]
    caches = {n: KVCache(llm.config, len(ids), llm.dtype, llm.device, kv_dtype=kv_storage_dtype(n, llm.dtype)) for n in names}  # fmt: skip
    tallies = {n: Tally() for n in names}
    spread = 0.0  # sum of the reference logits' standard deviations
    began = time.perf_counter()
    with torch.inference_mode():
        last = {n: llm.model.logits(llm.model.forward(torch.tensor(ids[: args.prompt]), c, 0)[-1:])[0] for n, c in caches.items()}  # fmt: skip
        for pos in range(args.prompt, len(ids)):
            reference = last["float32"]
            spread += float(reference.std())
            for n in names:
                tallies[n].add(last[n], reference, ids[pos])
            if pos + 1 < len(ids):
                token = torch.tensor([ids[pos]])
                last = {n: llm.model.logits(llm.model.forward(token, c, pos, Phase.DECODE))[0] for n, c in caches.items()}  # fmt: skip
            if pos % 500 == 0:
                print(f"  position {pos} of {len(ids)}, {time.perf_counter() - began:.0f} s", flush=True)
    positions = len(ids) - args.prompt
    print(
        f"\n{len(ids)} tokens of {TEXT.name}: {args.prompt} prefilled, then {positions} teacher-forced decodes "
        f"(contexts {args.prompt} to {len(ids) - 1}); the bundled model, {llm.model.weight_policy} weights\n"
    )
    print("| KV cache | bytes per token | top-1 agreement with float32 | mean abs logit error | / logit std | p99 of per-position error | perplexity |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n in names:
        t = tallies[n]
        per_token = KVPool.bytes_per_block(llm.config, 1, kv_storage_dtype(n, llm.dtype))
        p99 = sorted(t.errors)[int(0.99 * (len(t.errors) - 1))]
        print(
            f"| {n} | {per_token:,} | {100 * t.agree / t.positions:.2f}% of {t.positions} | {t.abs_error / t.positions:.4f} "
            f"| {t.abs_error / spread:.4f} | {p99:.4f} | {math.exp(t.nll / t.positions):.3f} |"
        )


if __name__ == "__main__":
    main()
