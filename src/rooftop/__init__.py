"""rooftop: LLM inference with prefill and decode made explicit and measured against the machine's roofs."""

from rooftop.engine.llm import LLM, StreamChunk
from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.sampling_params import SamplingParams
from rooftop.engine.sequence import RequestOutput
from rooftop.errors import (
    InvalidRequestError,
    ModelLoadError,
    PromptTooLongError,
    RooftopError,
    UnsupportedModelError,
)

__version__ = "0.1.0"
__all__ = [
    "LLM",
    "SamplingParams",
    "RequestOutput",
    "RequestMetrics",
    "StreamChunk",
    "RooftopError",
    "ModelLoadError",
    "UnsupportedModelError",
    "InvalidRequestError",
    "PromptTooLongError",
]
