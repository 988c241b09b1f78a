"""rooftop's progress bars, on stderr where it is a terminal and removed when done: `LLM.generate`'s (vLLM's
`use_tqdm`): prompts finished out of all, with the input and output tokens per second so far, fed by the engine's
steps, so a request counts when it finishes, whatever order the batch finishes in; and a model's load, its layers
built out of all (vLLM shows its checkpoint's shards)."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rooftop.engine.outputs import StepOutput


def _bar(title: str, *columns) -> Progress:
    """A bar of `title`, done out of all, the time so far and `columns`."""
    console = Console(stderr=True)
    return Progress(
        TextColumn(title),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        *columns,
        console=console,
        transient=True,
        disable=not console.is_terminal,  # no refresh thread where nothing would be drawn
        redirect_stdout=False,  # the caller's prints stay on stdout
        redirect_stderr=False,
    )


class PromptProgress:
    """A bar over prompts, each its `groups` entry's requests (one per output, SamplingParams.n): a prompt is done
    when all of them are; `on_step` takes each engine step. Drawn only on a terminal, on a console of its own
    (beside any the caller shows), and removed when done, as rooftop's other bars are. `tqdm`: vLLM's use_tqdm as a
    callable, a tqdm-like bar's constructor, called as vLLM calls it (total, desc, dynamic_ncols, postfix) and
    drawn instead."""

    def __init__(self, groups: list[list[str]], tqdm: Callable | None = None):
        self.prompt_of = {request_id: i for i, group in enumerate(groups) for request_id in group}
        self.left = [len(group) for group in groups]  # each prompt's requests not finished yet
        self.prefilled: set[str] = set()  # requests whose prompt has been computed (they have a token)
        self.input_tokens = self.output_tokens = 0
        self.started = time.perf_counter()
        self.tqdm = None
        if tqdm is not None:
            self.tqdm = tqdm(total=len(groups), desc="Processed prompts", dynamic_ncols=True, postfix="")
            return
        self.progress = _bar("Processed prompts", TextColumn("{task.fields[speed]}"))
        self.task = self.progress.add_task("", total=len(groups), speed="")

    def __enter__(self) -> PromptProgress:
        if self.tqdm is None:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.tqdm is not None:
            self.tqdm.close()
        else:
            self.progress.stop()

    def on_step(self, step: StepOutput) -> None:
        finished = 0
        for delta in step.deltas:
            prompt = self.prompt_of.get(delta.request_id)
            if prompt is None:
                continue
            if delta.request_id not in self.prefilled:
                self.prefilled.add(delta.request_id)
                self.input_tokens += delta.metrics.prompt_tokens
            self.output_tokens += len(delta.new_token_ids)
            if delta.finished:
                self.left[prompt] -= 1
                finished += self.left[prompt] == 0
        seconds = max(time.perf_counter() - self.started, 1e-9)
        speed = f"input {self.input_tokens / seconds:.1f} tok/s, output {self.output_tokens / seconds:.1f} tok/s"
        if self.tqdm is not None:
            self.tqdm.postfix = speed
            self.tqdm.update(finished)
        else:
            self.progress.update(self.task, advance=finished, speed=speed)


class LoadProgress:
    """A bar over a model's `layers` while it is built; `on_layer` takes each one built. A large file's load is
    mostly its layers' weights read and put in the form they run in, and nothing else is printed meanwhile."""

    def __init__(self, layers: int):
        self.progress = _bar("Loading the model's layers")
        self.task = self.progress.add_task("", total=layers)

    def __enter__(self) -> LoadProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def on_layer(self) -> None:
        self.progress.advance(self.task)
