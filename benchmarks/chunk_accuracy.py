"""What a long prompt's prefill form costs in accuracy: a K-quant file's teacher-forced logits over long chunks of
text, prefilled as one chunk (its Q4_K and Q6_K rows then take activations per 256 and integer super-block sums:
kernels/tiles.cpp's super_blocks) and in chunks below WIDEN_ROWS (every row as a decode's: activations per 32),
each against the same file's float path.

    .venv/bin/python benchmarks/chunk_accuracy.py FILE.gguf [--tokens 384] [--chunks 8]

The text is benchmarks/text/python_reference.txt. Both forms read the same weights; only the activations' int8
rounding differs, so the gap between the two rows is what the prefill form adds.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from rooftop import LLM
from rooftop.models.kv_cache import KVCache
from rooftop.quant.rows import WIDEN_ROWS

TEXT = Path(__file__).parent / "text" / "python_reference.txt"


def logits(llm: LLM, ids: list[int], chunk: int) -> torch.Tensor:
    """Logits at every position of `ids`, prefilled in chunks of `chunk` tokens."""
    cache = KVCache(llm.config, len(ids), llm.dtype, llm.device)
    with torch.inference_mode():
        parts = [
            llm.model.logits(llm.model.forward(torch.tensor(ids[at : at + chunk]), cache, at))
            for at in range(0, len(ids), chunk)
        ]
    return torch.cat(parts).float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a GGUF file whose tensors include Q4_K or Q6_K")
    parser.add_argument("--tokens", type=int, default=384, help="tokens per chunk of text (at least WIDEN_ROWS)")
    parser.add_argument("--chunks", type=int, default=8)
    args = parser.parse_args()
    if args.tokens < WIDEN_ROWS:
        raise SystemExit(f"--tokens must be at least {WIDEN_ROWS}: shorter chunks run as decode rows do")
    reference, native = LLM(model=args.model, weights="float"), LLM(model=args.model)
    text = TEXT.read_text()
    step = len(text) // args.chunks
    forms = {"one chunk (activations per 256)": args.tokens, f"chunks of {WIDEN_ROWS - 1} (per 32)": WIDEN_ROWS - 1}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in forms}
    for i in range(args.chunks):
        ids = native.tokenizer.encode(text[i * step : (i + 1) * step])[: args.tokens]
        ref = logits(reference, ids, args.tokens)
        for name, chunk in forms.items():
            ours = logits(native, ids, chunk)
            top1 = float((ours.argmax(-1) == ref.argmax(-1)).float().mean())
            results[name].append((top1, float((ours - ref).abs().mean() / ref.std()), float((ours - ref).abs().max())))
    print(f"`{Path(args.model).name}`, {args.chunks} chunks of {args.tokens} tokens, against its own float path:")
    print("| prefill | top-1 agreement | mean abs logit error / logit std | max abs logit error |")
    print("|---|---|---|---|")
    for name, rows in results.items():
        top1, mean, worst = (
            statistics.mean(r[0] for r in rows),
            statistics.mean(r[1] for r in rows),
            max(r[2] for r in rows),
        )
        print(f"| {name} | {100 * top1:.1f}% | {mean:.4f} | {worst:.3f} |")


if __name__ == "__main__":
    main()
