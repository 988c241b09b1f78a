"""The base of every request body: strict types ("16" is not a number, NaN is not a temperature) and no field
rooftop does not know (a field it would silently drop is refused, naming it)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Float = Annotated[float, Field(allow_inf_nan=False)]


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
