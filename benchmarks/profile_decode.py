"""Where a decode step's time goes: the engine's own op timer (linears, attention, elementwise ops, the rest) per
decode step, then torch.profiler over 20 decode steps of a model (the bundled one) at batch 1.

.venv/bin/python benchmarks/profile_decode.py [--model FILE.gguf] [--weights auto|float|int8|int4] [--context 2000] [--rows 15]

--context N decodes after a prompt of N random token ids, where attention reads N keys per layer and step; without
it the prompt is a short sentence. A decode step run in one call (models/decode_call.py) is split by the kernels'
own clocks there; torch.profiler's table sees nothing inside that call (its kernels call no PyTorch operator).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from rooftop import LLM, SamplingParams
from rooftop.engine.calibrate import OpTimer
from rooftop.enums import Phase


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF file or HF directory (default: the bundled model)")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--context", type=int, help="prompt length in random token ids (default: a short sentence)")
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args()
    llm = LLM(model=args.model, weights=args.weights)
    eng, params = llm.engine, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    vocab = min(llm.config.vocab_size, llm.tokenizer.vocab_size)
    prompt = (
        torch.randint(vocab, (args.context,), generator=gen).tolist() if args.context else "Hello there, how are you"
    )
    timer = OpTimer(llm.device)
    for rep in range(3):  # two warm-ups, then the timed run
        eng.add_request(f"warm{rep}", prompt, params)
        split = []
        with timer.installed(llm):
            while eng.has_unfinished():
                record = eng.step().record
                seconds, _ = timer.reset()
                if record.phase is Phase.DECODE:
                    split.append((record.seconds, seconds["linears"], seconds["attention"], seconds["elementwise"]))
    step, lin, attn, elem = (statistics.median(column) * 1e3 for column in zip(*split, strict=True))
    print(
        f"median decode step {step:.2f} ms ({args.weights} weights): linears {lin:.2f}, attention {attn:.2f}, "
        f"elementwise {elem:.2f}, the rest {step - lin - attn - elem:.2f} ms (the op timer's own cost included)"
    )
    eng.add_request("profiled", prompt, params)
    eng.step()  # the prefill, not profiled
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            eng.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    while eng.has_unfinished():
        eng.step()


if __name__ == "__main__":
    main()
