"""Prompts: the server's tokenizing, with the work a request can cause bounded before it is admitted. A text whose
length in bytes already shows that it cannot fit the context is refused without tokenizing it (a token stands
for at most the vocabulary's longest token in bytes); the rest are tokenized on one worker thread, so neither the
event loop nor the engine thread waits for them (the tokenizer releases the GIL), and one huge prompt at a time
holds the tokenizer's working memory."""

from __future__ import annotations

import asyncio
import ctypes
from concurrent.futures import ThreadPoolExecutor

from rooftop.loading.tokenizer import Tokenizer
from rooftop.serve.errors import ApiError

# glibc keeps the memory a tokenizer freed for reuse, in this thread's own arena: a 1.2 MB prompt left ~190 MB
# behind. malloc_trim hands it back (tens of ms on this thread, after long texts only; no glibc: nothing to do).
MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)
TRIM_AFTER_CHARS = 64 << 10


class Prompts:
    def __init__(self, tokenizer: Tokenizer, max_model_len: int, vocab_size: int):
        self.tokenizer, self.max_model_len, self.vocab_size = tokenizer, max_model_len, vocab_size
        self.token_bytes = tokenizer.max_token_bytes  # None: no bound holds, every text is tokenized
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="rooftop-tokenize")

    def check_text(self, text: str, param: str) -> None:
        """400 for a text too long in bytes for any tokenization of it to fit the context."""
        if self.token_bytes is None:
            return
        size, limit = self.tokenizer.text_bytes(text), self.max_model_len * self.token_bytes
        if size > limit:
            raise ApiError(
                400,
                f"the prompt is {size} bytes; the context holds {self.max_model_len} tokens, at most {limit} bytes "
                f"of text ({self.token_bytes} bytes per token at most in this vocabulary)",
                param,
            )

    def check_ids(self, ids: list[int], param: str) -> list[int]:
        """`ids`, or a 400 naming the ones outside the vocabulary."""
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ApiError(400, f"token ids out of range [0, {self.vocab_size}): {bad[:5]}", param)
        return ids

    async def encode(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        self.check_text(text, param)
        return await self._run(self._encode, text, add_special_tokens)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens)
        if len(text) >= TRIM_AFTER_CHARS and MALLOC_TRIM is not None:
            MALLOC_TRIM(0)
        return ids

    async def decode(self, ids: list[int], param: str) -> str:
        return await self._run(self.tokenizer.decode, self.check_ids(ids, param))

    async def _run(self, work, *args):
        return await asyncio.get_running_loop().run_in_executor(self.worker, work, *args)
