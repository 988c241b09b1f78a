"""rooftop: LLM inference with prefill and decode made explicit and measured against the machine's roofs."""

from rooftop.config import EngineConfig, RunConfig
from rooftop.engine.llm import LLM, StreamChunk
from rooftop.engine.metrics import RequestMetrics
from rooftop.engine.outputs import CompletionOutput, RequestOutput
from rooftop.engine.sampling_params import SamplingParams
from rooftop.engine.structured import StructuredOutputsParams
from rooftop.engine.tool_calls import ToolCall, parse_tool_calls
from rooftop.enums import FinishReason, Phase
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
    "RunConfig",
    "EngineConfig",
    "SamplingParams",
    "StructuredOutputsParams",
    "ToolCall",
    "parse_tool_calls",
    "RequestOutput",
    "CompletionOutput",
    "RequestMetrics",
    "StreamChunk",
    "FinishReason",
    "Phase",
    "RooftopError",
    "ModelLoadError",
    "UnsupportedModelError",
    "InvalidRequestError",
    "PromptTooLongError",
]
