"""Incremental detokenization: text deltas that never split a UTF-8 character and add up to the final text."""

from __future__ import annotations

from rooftop.loading.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decodes a growing list of ids by re-decoding only a short window (vLLM's prefix/read offsets).

    A byte-level token can hold part of a character; until the rest arrives the window decodes to U+FFFD,
    and the delta is held back.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes (possibly "")."""
        self.ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of generation: whatever is held back, even an incomplete character."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        decode, skip = self.tokenizer.decode, self.skip_special_tokens
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=skip)
        window = decode(self.ids[self.prefix_offset :], skip_special_tokens=skip)
        if len(window) <= len(prefix) or (window.endswith(REPLACEMENT) and not final):
            return ""
        delta = window[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta
