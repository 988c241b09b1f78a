"""Typed errors: every bad input a user can give ends in one of these, with a message that names the problem."""

from __future__ import annotations


class RooftopError(Exception):
    """Base of every error rooftop raises on purpose; the CLI prints its message on one line."""


class ModelLoadError(RooftopError):
    """The model path is missing, truncated, corrupt or incomplete."""


class UnsupportedModelError(RooftopError):
    """The file is readable but describes an architecture, tensor type or tokenizer rooftop does not run."""


class InvalidRequestError(RooftopError, ValueError):
    """A prompt or sampling parameter is out of range; `param` names the field, where one is to blame (the server
    returns it as OpenAI's `param`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class PromptTooLongError(InvalidRequestError):
    """The prompt does not fit in the model's context."""

    @classmethod
    def of(cls, tokens: int, context: int, name: str = "the prompt") -> PromptTooLongError:
        """The engine's refusal of a prompt of `tokens` tokens (`name`: which prompt, in a batch)."""
        return cls(
            f"{name} has {tokens} tokens; the context holds {context}, with room needed for at least one output token"
        )


class TensorParallelError(RooftopError):
    """A rank of the tensor-parallel group died, hung or failed: the group cannot run another step (the server
    answers 503 and exits)."""
