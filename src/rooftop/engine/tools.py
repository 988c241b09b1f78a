"""Tools (OpenAI's function tools): their definitions checked, tool_choice resolved, and the grammar that holds a
tool call to a defined function and to that function's parameters.

The calls are hermes-style, as Qwen's templates and rooftop's default tool prompt (engine/tool_prompt.py) teach:
`<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`. Every mode but `none` is held to that by a grammar
(llguidance's Lark with an embedded JSON schema per function):
- `required`: one or more calls and nothing else (one with parallel_tool_calls false);
- a named function: exactly one call of it;
- `auto`: free text, and once the model writes `<tool_call>` the call that follows (a lazy trigger, as llguidance
  does tool calling inside free text); without parallel calls the output ends after the first call.
So a parsed call always names a defined function, and its arguments validate against that function's parameters
(unless max_tokens cut it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from rooftop.engine.sampling_params import SamplingParams
from rooftop.engine.structured import StructuredOutputsParams, bounded
from rooftop.errors import InvalidRequestError

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# A call's arguments are spaced as json.dumps spaces them, as chat templates print tool calls, with no free
# whitespace (a small model allowed it loops in it)
CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NO_PARAMETERS = {"type": "object", "properties": {}}
MODES = ("none", "auto", "required")


@dataclass(frozen=True)
class Function:
    """One function tool: its name, what it does, and its parameters (a JSON schema of an object)."""

    name: str
    description: str | None
    parameters: dict

    def as_tool(self) -> dict:
        """The tool as OpenAI writes it, for a chat template or the default tool prompt."""
        function = {"name": self.name} | ({"description": self.description} if self.description else {})
        return {"type": "function", "function": function | {"parameters": self.parameters}}


@dataclass(frozen=True)
class ToolChoice:
    """`none`, `auto`, `required`, or `function` with the function's `name`."""

    mode: str
    name: str | None = None


def check_tools(tools) -> list[Function]:
    """OpenAI's `tools` (a list of {"type": "function", "function": {name, description, parameters, strict}}) as
    Functions; a malformed one is an InvalidRequestError naming its field (`tools[1].function.parameters`)."""
    if not isinstance(tools, list):
        raise InvalidRequestError(f"tools must be a list of function tools, got {type(tools).__name__}", "tools")
    functions = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequestError(f"{where} must be an object, got {type(tool).__name__}", where)
        if tool.get("type") != "function":
            raise InvalidRequestError(
                f"{where}.type: only function tools are supported, got {tool.get('type')!r}", f"{where}.type"
            )
        _only(tool, ("type", "function"), where)
        functions.append(_function(tool.get("function"), f"{where}.function"))
    names = [f.name for f in functions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidRequestError(f"tools: each function needs its own name; given more than once: {twice}", "tools")
    return functions


def _function(function, where: str) -> Function:
    if not isinstance(function, dict):
        raise InvalidRequestError(f"{where} must be an object with a name", where)
    _only(function, ("name", "description", "parameters", "strict"), where)
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequestError(
            f"{where}.name must be 1 to 64 letters, digits, underscores or dashes, got {name!r}", f"{where}.name"
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequestError(f"{where}.description must be a string", f"{where}.description")
    if not isinstance(function.get("strict", False), bool | None):
        raise InvalidRequestError(f"{where}.strict must be a boolean", f"{where}.strict")
    parameters = function.get("parameters")
    parameters = NO_PARAMETERS if parameters is None else parameters
    where = f"{where}.parameters"
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise InvalidRequestError(f"{where} must be a JSON schema of an object (type: object)", where)
    parameters = {"type": "object", **parameters}
    try:
        StructuredOutputsParams(json=parameters)  # checked here, so a bad schema is blamed on its own function
    except InvalidRequestError as e:
        raise InvalidRequestError(str(e).replace("structured_outputs.json", where), where) from None
    return Function(name, description, parameters)


def _only(given: dict, known: tuple[str, ...], where: str) -> None:
    unknown = [k for k in given if k not in known]
    if unknown:
        raise InvalidRequestError(
            f"{where}.{unknown[0]} is not a field rooftop knows here (it takes {', '.join(known)})",
            f"{where}.{unknown[0]}",
        )


def check_tool_choice(choice, functions: list[Function]) -> ToolChoice:
    """OpenAI's tool_choice: "none", "auto", "required" or {"type": "function", "function": {"name": ...}};
    by default `auto` with tools and `none` without."""
    if choice is None:
        return ToolChoice("auto" if functions else "none")
    if isinstance(choice, str) and choice in MODES:
        if choice != "none" and not functions:
            raise InvalidRequestError(f"tool_choice {choice!r} needs tools to choose from", "tool_choice")
        return ToolChoice(choice)
    named = isinstance(choice, dict) and choice.get("type") == "function" and set(choice) == {"type", "function"}
    function = choice.get("function") if named else None
    if not isinstance(function, dict) or set(function) != {"name"} or not isinstance(function["name"], str):
        raise InvalidRequestError(
            'tool_choice is "none", "auto", "required" or {"type": "function", "function": {"name": NAME}}, '
            f"got {json.dumps(choice)[:80]}",
            "tool_choice",
        )
    if function["name"] not in {f.name for f in functions}:
        raise InvalidRequestError(
            f"tool_choice names the function {function['name']!r}, which tools does not define", "tool_choice"
        )
    return ToolChoice("function", function["name"])


def tool_grammar(functions: list[Function], choice: ToolChoice, parallel: bool = True) -> StructuredOutputsParams:
    """The grammar the output follows under `choice` (not `none`), as a structured-output spec."""
    if choice.mode == "none":
        raise InvalidRequestError("tool_choice none calls no tool: there is no tool grammar", "tool_choice")
    chosen = [f for f in functions if choice.mode != "function" or f.name == choice.name]
    rules = [f"call_{i}: {_literal(_head(f))} %json {_arguments(f)} {_literal('}')}" for i, f in enumerate(chosen)]
    calls = " | ".join(f"call_{i}" for i in range(len(chosen)))
    body = f'"\\n" ({calls}) "\\n{CALL_CLOSE}"'
    if choice.mode == "auto":
        start = "start: call* TEXT" if parallel else "start: TEXT | call"
        lines = ["%llguidance {}", start, f"call: opening {body}", f"opening[lazy]: TEXT {_literal(CALL_OPEN)}"]
        lines.append(r"TEXT: /(.|\n)*/")
    else:
        many = choice.mode == "required" and parallel
        start = 'start: call ("\\n" call)*' if many else "start: call"
        lines = [start, f"call: {_literal(CALL_OPEN)} {body}"]
    return StructuredOutputsParams(grammar="\n".join(lines + rules) + "\n")


def with_tool_grammar(
    params: SamplingParams, functions: list[Function], choice: ToolChoice, parallel: bool = True
) -> SamplingParams:
    """`params` with the tool grammar of `choice` (unchanged for `none`); a structured output of its own is refused:
    both would constrain the same tokens."""
    if choice.mode == "none":
        return params
    if params.structured_outputs is not None:
        raise InvalidRequestError(
            f"a structured output and tools with tool_choice {choice.mode!r} both constrain the output: send one "
            "(or tool_choice none)",
            "structured_outputs",
        )
    return replace(params, structured_outputs=tool_grammar(functions, choice, parallel))


def _head(f: Function) -> str:
    return f'{{"name": "{f.name}", "arguments": '


def _literal(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: the same escapes as JSON's


def _arguments(f: Function) -> str:
    """The function's parameters as the embedded schema of its arguments: its own root (its $defs and $refs work),
    bounded as structured output's schemas are (open numbers bounded; no arguments beyond those it names unless it
    says otherwise: a small model otherwise makes some up), spaced as CALL_JSON."""
    return json.dumps({**bounded(f.parameters), "x-guidance": CALL_JSON})
