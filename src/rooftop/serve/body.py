"""The base of every request body: strict types ("16" is not a number, NaN is not a temperature) and no field
rooftop does not know (a field it would silently drop is refused, naming it)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

Float = Annotated[float, Field(allow_inf_nan=False)]
# OpenAI's `boolean | null` with a default of false (or true): null is the default, as OpenAI and vLLM read it (SDKs
# that send every field send the unset ones as null)
NullFalse = Annotated[bool, BeforeValidator(lambda v: False if v is None else v)]
NullTrue = Annotated[bool, BeforeValidator(lambda v: True if v is None else v)]


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
