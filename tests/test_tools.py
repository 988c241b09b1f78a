"""Tools in the Python API: definitions and tool_choice checked by name, the tool-call reader (whole and streamed,
several calls, cut and malformed blocks), the default tool prompt and a template's own tool syntax, and the grammar
holding the bundled model's calls to the tools (required, a named function, auto)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from rooftop import LLM, InvalidRequestError, SamplingParams, StructuredOutputsParams
from rooftop.engine.structured import GrammarCompiler
from rooftop.engine.tool_calls import Arguments, CallStart, Content, ToolCallReader, parse_tool_calls
from rooftop.engine.tool_prompt import tool_messages
from rooftop.engine.tools import ToolChoice, check_tool_choice, check_tools, tool_grammar
from rooftop.loading.tokenizer import Tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/$defs/n"}},
            "required": ["a", "b"],
            "$defs": {"n": {"type": "integer", "minimum": 0}},
        },
    },
}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Lagos?"}]


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kv_blocks=256)


def function(**fields) -> dict:
    return {"type": "function", "function": {"name": "f", **fields}}


@pytest.mark.parametrize(
    "tools, param, words",
    [
        ({"a": 1}, "tools", "must be a list"),
        ([{"type": "custom", "custom": {"name": "f"}}], "tools[0].type", "only function tools"),
        ([{"type": "function", "function": {"description": "no name"}}], "tools[0].function.name", "1 to 64 letters"),
        ([function(name="a b")], "tools[0].function.name", "1 to 64 letters"),
        ([function(parameters={"type": "string"})], "tools[0].function.parameters", "type: object"),
        ([function(parameters=[1])], "tools[0].function.parameters", "JSON schema of an object"),
        (
            [function(parameters={"type": "object", "properties": {"x": {"type": "integr"}}})],
            "tools[0].function.parameters",
            "Invalid type",
        ),
        ([WEATHER, function(), function()], "tools", "given more than once: ['f']"),
        ([function(strict="yes")], "tools[0].function.strict", "must be a boolean"),
        ([function(examples=[])], "tools[0].function.examples", "not a field rooftop knows"),
    ],
)
def test_bad_tool_definitions_are_refused_by_name(tools, param, words):
    with pytest.raises(InvalidRequestError) as e:
        check_tools(tools)
    assert words in str(e.value) and e.value.param == param


def test_tool_choice_defaults_and_refusals():
    functions = check_tools(TOOLS)
    assert check_tool_choice(None, functions) == ToolChoice("auto")
    assert check_tool_choice(None, []) == ToolChoice("none")
    assert check_tool_choice("required", functions) == ToolChoice("required")
    named = {"type": "function", "function": {"name": "add"}}
    assert check_tool_choice(named, functions) == ToolChoice("function", "add")
    assert functions[0].parameters["required"] == ["city"] and check_tools([function()])[0].parameters == {
        "type": "object",
        "properties": {},
    }
    for choice, words in [
        ({"type": "function", "function": {"name": "nope"}}, "which tools does not define"),
        ("sometimes", 'tool_choice is "none", "auto", "required"'),
        ({"type": "allowed_tools", "allowed_tools": {}}, 'tool_choice is "none"'),
    ]:
        with pytest.raises(InvalidRequestError, match=words) as e:
            check_tool_choice(choice, functions)
        assert e.value.param == "tool_choice"
    with pytest.raises(InvalidRequestError, match="needs tools"):
        check_tool_choice("required", [])


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lagos"}}\n</tool_call>'
READS = [  # (output, content, [(name, arguments)])
    ("Hello there.", "Hello there.", []),
    ("  spaced  ", "  spaced  ", []),
    (CALL, None, [("get_weather", '{"city": "Lagos"}')]),
    (
        'Sure!\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": {"c": [1, "</tool_call>"]}}}\n</tool_call>\n'
        + CALL
        + "\n",
        "Sure!",
        [("add", '{"a": 1, "b": {"c": [1, "</tool_call>"]}}'), ("get_weather", '{"city": "Lagos"}')],
    ),
    (CALL + "\nDone.", "Done.", [("get_weather", '{"city": "Lagos"}')]),
    ('<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>', None, [("f", '{"x": 1}')]),  # another order
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "La', None, [("get_weather", '{"city": "La')]),
    # cut by max_tokens: a call once its name is complete, its arguments as far as they got; before that, nothing
    ('Hi <tool_call>\n{"name": "get_w', "Hi", []),  # inside the name: dropped
    ("Hi <tool_call>", "Hi", []),  # just after <tool_call>
    ("<tool_call>\n", None, []),
    (CALL + "\n<tool_call>", None, [("get_weather", '{"city": "Lagos"}')]),
    ('<tool_call>\n{"name": "get_weather"', None, [("get_weather", "")]),  # the name complete
    (
        CALL + '\n<tool_call>\n{"name": "get_weather", "arguments',
        None,
        [("get_weather", '{"city": "Lagos"}'), ("get_weather", "")],
    ),
    ('<tool_call>\n{"name": "add", "arguments": ', None, [("add", "")]),
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b', None, [("add", '{"a": 1, "b')]),  # inside the arguments
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_c', None, [("add", '{"a": 1}')]),
    (CALL + "\n<tool_c", None, [("get_weather", '{"city": "Lagos"}')]),  # inside the next tag: dropped
    ("  <tool", None, []),
    ("a < b, <tool", "a < b, <tool", []),  # after text: content
    ("<tool_call>\nnot JSON\n</tool_call> ok", "<tool_call>\nnot JSON\n</tool_call> ok", []),  # malformed: content
    (
        '<tool_call>{"name": "a\\q", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "a\\q", "arguments": {}}</tool_call>',
        [],
    ),
]


@pytest.mark.parametrize("output, content, calls", READS)
def test_the_reader_reads_the_same_calls_whole_and_streamed(output, content, calls):
    """Fed at once or in seeded random pieces: the same content and calls; a call's id and name come before its
    arguments, whose pieces add up to the whole; nothing of a call is said as content."""
    assert [(c.name, c.arguments) for c in parse_tool_calls(output)[1]] == calls
    assert parse_tool_calls(output)[0] == content
    rng = random.Random(len(output))
    for _ in range(3):
        reader, events, at = ToolCallReader(), [], 0
        while at < len(output):
            step = rng.randint(1, 6)
            events += reader.feed(output[at : at + step])
            at += step
        events += reader.finish()
        said = "".join(e.text for e in events if isinstance(e, Content)) or None
        started = [e.index for e in events if isinstance(e, CallStart)]
        arguments = {}
        for e in events:
            if isinstance(e, Arguments):
                assert e.index in started
                arguments[e.index] = arguments.get(e.index, "") + e.text
        assert said == content and started == list(range(len(calls)))
        assert [(c.name, arguments.get(i, "")) for i, c in enumerate(reader.calls)] == calls
        assert len({c.id for c in reader.calls}) == len(calls) and all(len(c.id) == 29 for c in reader.calls)


@pytest.mark.slow
def test_the_default_tool_prompt_writes_tools_calls_and_results(llm):
    """SmolLM2's template has no tool syntax: the tools go in a system prompt, earlier calls back into the assistant's
    turn as <tool_call> blocks, a turn's tool results into one user turn of <tool_response> blocks."""
    assert not llm.tokenizer.template_takes_tools
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lagos"}'}}
    messages = [
        {"role": "system", "content": "Be brief."},
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call, call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "31 C"},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    rendered = tool_messages(messages, check_tools(TOOLS), False)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert rendered[0]["content"].startswith("Be brief.\n\nYou can call functions")
    assert json.dumps(check_tools(TOOLS)[1].as_tool()) in rendered[0]["content"]
    assert rendered[2]["content"] == "\n".join([CALL] * 2)
    assert rendered[3]["content"] == "<tool_response>\n31 C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>"
    prompt = llm.apply_chat_template(messages, check_tools(TOOLS))
    assert prompt.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n") and "<tools>" in prompt
    assert "<tools>" not in llm.apply_chat_template(messages)  # tool_choice none: the tools are not offered
    bad = {**call, "function": {"name": "get_weather", "arguments": {"city": "Lagos"}}}
    with pytest.raises(InvalidRequestError, match="must be a string") as e:
        tool_messages([*ASK, {"role": "assistant", "tool_calls": [bad]}], [], False)
    assert e.value.param == "messages[1].tool_calls[0].function.arguments"


TOOL_TEMPLATE = (  # a template with its own tool syntax, as Qwen's: it reads `tools` and each call's arguments
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}"
    "{% for m in messages %}|{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} a={{ c.function.arguments.a }}{% endfor %}"
    "{% endfor %}"
)


@pytest.mark.slow
def test_a_template_with_its_own_tool_syntax_gets_the_tools_and_the_calls_as_objects(llm):
    tokenizer = Tokenizer(llm.tokenizer.backend, chat_template=TOOL_TEMPLATE)
    assert tokenizer.template_takes_tools
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 4, "b": 5}'}}
    messages = [*ASK, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "9"}]
    as_given = tool_messages(messages, check_tools(TOOLS), True)
    assert as_given[1]["tool_calls"][0]["function"]["arguments"] == {"a": 4, "b": 5} and as_given[2]["role"] == "tool"
    tools = [f.as_tool() for f in check_tools(TOOLS)]
    rendered = tokenizer.apply_chat_template(as_given, tools=tools)
    assert rendered == "TOOLS:get_weather;add;|user: What is the weather in Lagos?|assistant: CALL add a=4|tool: 9"


def cut_call(arguments: str) -> dict:
    return {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def test_a_cut_call_goes_back_into_the_default_prompt_as_its_text():
    """Arguments that are no object's JSON text (a call cut by max_tokens: partial, or "" when cut after its name)
    are taken: the block holds them as a JSON string; an object's text is written back as the object."""
    for arguments in ['{"city": "La', "", "[1]", "not JSON"]:
        rendered = tool_messages([*ASK, {"role": "assistant", "tool_calls": [cut_call(arguments)]}], [], False)
        block = json.dumps({"name": "get_weather", "arguments": arguments})
        assert rendered[1]["content"] == f"<tool_call>\n{block}\n</tool_call>"
    whole = tool_messages([*ASK, {"role": "assistant", "tool_calls": [cut_call('{"city": "Lagos"}')]}], [], False)
    assert whole[1]["content"] == CALL


ARGUMENTS_TEMPLATE = (  # the ways templates with a tool syntax read a call's arguments
    "{% for m in messages %}{% for c in m.tool_calls or [] %}"
    "{% if c.function.arguments is string %}text={{ c.function.arguments }}{% endif %}"
    " json={{ c.function.arguments | tojson }} a={{ c.function.arguments.a }}"
    " items={% for k, v in c.function.arguments | items %}{{ k }}:{{ v }},{% endfor %}"
    " dict={% for k, v in c.function.arguments.items() %}{{ k }}:{{ v }},{% endfor %}"
    "{% endfor %}{% endfor %}{{ tools | length }}"
)


@pytest.mark.slow
def test_a_template_with_its_own_tool_syntax_gets_a_cut_calls_arguments_as_text(llm):
    """Such a template gets text arguments as the string they are (written as is, tojson a JSON string), and where
    it reads them as a mapping, an empty one instead of a failed rendering."""
    tokenizer = Tokenizer(llm.tokenizer.backend, chat_template=ARGUMENTS_TEMPLATE)
    for arguments, expected in [
        ('{"a": 4}', ' json={"a": 4} a=4 items=a:4, dict=a:4,'),
        ('{"a": 4', 'text={"a": 4 json="{\\"a\\": 4" a= items= dict='),
        ("", 'text= json="" a= items= dict='),
    ]:
        messages = tool_messages([*ASK, {"role": "assistant", "tool_calls": [cut_call(arguments)]}], [], True)
        assert tokenizer.apply_chat_template(messages, tools=[]) == expected + "0"


def valid_calls(calls, names) -> None:
    by_name = {f.name: f for f in check_tools(TOOLS)}
    for call in calls:
        assert call.name in names
        jsonschema.validate(json.loads(call.arguments), by_name[call.name].parameters)


@pytest.mark.slow
def test_required_and_named_tool_choices_call_defined_functions_with_valid_arguments(llm):
    """Greedy and seeded (two outputs each, n=2): `required` makes the output calls only (exactly one without
    parallel calls), a named function one call of it; every call's arguments validate against its parameters ($refs
    included). Each of the n outputs carries the calls read from its own text."""
    named = {"type": "function", "function": {"name": "add"}}
    runs = [("required", False, None), ("required", True, 3), (named, True, None), (named, True, 4)]
    for choice, parallel, seed in runs:
        n = 1 if seed is None else 2
        params = SamplingParams(max_tokens=48, temperature=0 if seed is None else 1.0, seed=seed, n=n)
        request = llm.chat(ASK, params, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel)[0]
        assert len(request.outputs) == n and request.tool_calls is request.outputs[0].tool_calls
        for out in request.outputs:
            content, calls = parse_tool_calls(out.text)
            assert out.tool_calls is not None and [c.name for c in out.tool_calls] == [c.name for c in calls]
            if out.finish_reason == "stop":
                assert content is None and calls and (parallel or len(calls) == 1)
                valid_calls(calls, ["add"] if choice is named else ["add", "get_weather"])
                assert choice is not named or len(calls) == 1
            else:
                assert out.finish_reason == "length" and len(out.token_ids) == 48


@pytest.mark.slow
def test_auto_lets_text_through_and_holds_calls_to_the_tools(llm):
    """The grammar of `auto` takes free text, and a call only of a defined function with valid arguments; without
    parallel calls nothing follows the first call."""
    compiler = GrammarCompiler(llm.tokenizer.backend, llm.model.config.vocab_size, llm.tokenizer.eos_token_ids)
    functions = check_tools(TOOLS)

    def takes(text: str, parallel: bool = True) -> bool:
        state = compiler.start(tool_grammar(functions, ToolChoice("auto"), parallel))
        ids = llm.tokenizer.encode(text, add_special_tokens=False)
        return state.matcher.validate_tokens(ids) == len(ids)

    assert takes("It is sunny <b>today</b>, no tool needed.") and takes("Let me check. " + CALL + " Done.")
    assert takes(CALL + CALL) and not takes(CALL + "\nmore", parallel=False)
    assert not takes('<tool_call>\n{"name": "get_time", "arguments": {}}')
    assert not takes('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": -2}}')  # b's $ref: minimum 0
    assert not takes('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}')  # none but its own


@pytest.mark.slow
def test_a_tool_round_trip_in_the_python_api(llm):
    """A call forced by name, its result sent back as a tool message, then an answer: text, not another call."""
    params = SamplingParams(max_tokens=40, temperature=0)
    named = {"type": "function", "function": {"name": "get_weather"}}
    out = llm.chat(ASK, params, tools=TOOLS, tool_choice=named)[0]
    assert out.finish_reason == "stop" and [c.name for c in out.tool_calls] == ["get_weather"]
    call = out.tool_calls[0]
    valid_calls([call], ["get_weather"])
    result = {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 31, "sky": "sunny"})}
    conversation = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.as_openai()]}, result]
    answer = llm.chat(conversation, params, tools=TOOLS, tool_choice="none")[0]
    assert answer.tool_calls is None and answer.text and "<tool_call>" not in answer.text
    with pytest.raises(InvalidRequestError) as e:
        spec = StructuredOutputsParams(json_object=True)
        llm.chat(ASK, SamplingParams(structured_outputs=spec), tools=TOOLS, tool_choice="required")
    assert e.value.param == "structured_outputs"


CITY_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.slow
def test_a_call_cut_by_max_tokens_is_a_call_as_far_as_it_got_and_goes_back(llm):
    """Greedy, `required`: a second call cut after its name (48 tokens) or inside its arguments (52) is a call of
    that name, its arguments where the output stopped; no markup is content. The reply goes back as it came."""
    texts = {}
    for max_tokens in (36, 48, 52):
        params = SamplingParams(max_tokens=max_tokens, temperature=0)
        out = llm.chat(ASK, params, tools=[CITY_WEATHER], tool_choice="required", use_tqdm=False)[0].outputs[0]
        content, calls = parse_tool_calls(out.text)
        assert out.finish_reason == "length" and content is None
        assert [(c.name, c.arguments) for c in out.tool_calls] == [(c.name, c.arguments) for c in calls]
        assert [c.name for c in calls] == ["get_weather"] * (1 if max_tokens == 36 else 2)
        assert calls[0].arguments == '{"city": "Lagos"}'
        texts[max_tokens] = out.text, calls
    assert texts[36][0].endswith("\n<tool_call")  # cut inside the second call's tag: dropped
    assert texts[48][0].endswith('"arguments') and texts[48][1][1].arguments == ""
    cut = texts[52][1][1].arguments
    assert cut and texts[52][0].endswith(cut) and '{"city": "Lagos"}'.startswith(cut)
    calls = [c.as_openai() for c in texts[52][1]]
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "31 C"} for c in calls]
    conversation = [*ASK, {"role": "assistant", "content": None, "tool_calls": calls}, *results]
    params = SamplingParams(max_tokens=8, temperature=0)
    answer = llm.chat(conversation, params, tools=[CITY_WEATHER], tool_choice="none", use_tqdm=False)[0]
    assert answer.outputs[0].token_ids
