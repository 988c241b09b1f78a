"""Structured output in a request: OpenAI's `response_format` or vLLM's `structured_outputs`, either one becoming
SamplingParams.structured_outputs (engine/structured.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rooftop.engine.structured import StructuredOutputsParams
from rooftop.errors import InvalidRequestError
from rooftop.serve.body import Body


class JsonSchemaFormat(Body):
    """OpenAI's response_format.json_schema. `strict` false is accepted, and the schema is enforced all the same."""

    name: str
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def structured_outputs(self) -> StructuredOutputsParams | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.json_schema is None or self.json_schema.schema_ is None:
            raise InvalidRequestError(
                "response_format of type json_schema needs json_schema.schema", "response_format.json_schema"
            )
        try:
            return StructuredOutputsParams(json=self.json_schema.schema_)
        except InvalidRequestError as e:  # name the field the client sent
            message = str(e).replace("structured_outputs.json", "response_format.json_schema.schema")
            raise InvalidRequestError(message, "response_format.json_schema.schema") from None


class StructuredOutputs(Body):
    """vLLM's structured_outputs: exactly one of its fields."""

    json_: dict | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None

    def params(self) -> StructuredOutputsParams:
        return StructuredOutputsParams(
            json=self.json_,
            regex=self.regex,
            choice=self.choice,
            grammar=self.grammar,
            json_object=self.json_object,
            disable_any_whitespace=self.disable_any_whitespace,
        )
