"""Structured output: a grammar (JSON schema, regex, choice, Lark/GBNF) that every sampled token must follow.

llguidance does the grammar work: it compiles a spec against the tokenizer and, at each step, fills a bitmask of
the tokens that keep the output inside the grammar. The sampler applies every constrained row's mask to the logits
in one op before penalties and temperature (engine/sampler.py), so greedy, seeded and filtered sampling all draw
among allowed tokens only; unconstrained rows are not touched. Once the grammar is complete the mask holds EOS
alone, so `finish_reason` is `stop` exactly when the output is complete (or a stop string or stop token came
first), and `length` when max_tokens cut it.

JSON is compact: no free whitespace and "," / ":" separators. A small model allowed free whitespace between
tokens tends to emit newlines and spaces until max_tokens; with none allowed every token makes progress. Numbers
are bounded where the schema leaves them open, and objects that list their properties take no others (`bounded`):
a small model asked for an id writes digits until max_tokens, each one as valid as the last, and one allowed extra
keys makes them up. Strings and arrays are bounded only by the schema's own maxLength and maxItems and by the
request's max_tokens.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from dataclasses import dataclass, field

import llguidance
import tokenizers
import torch

from rooftop.errors import InvalidRequestError

CACHE_SIZE = 64  # compiled grammars kept per engine (least recently used dropped first)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
# An open number gets at most this many digits before the point and after it (|x| < 10**15 is exact in a double)
INTEGER_DIGITS, FRACTION_DIGITS = 15, 6
# The keywords whose values are subschemas: a schema or a list of them, or a map of names to them
SUBSCHEMAS = ("additionalProperties", "items", "prefixItems", "contains", "not", "if", "then", "else")
SUBSCHEMAS += ("anyOf", "oneOf", "allOf", "propertyNames", "unevaluatedProperties", "unevaluatedItems")
OPEN_OBJECT = {"additionalProperties", "patternProperties", "unevaluatedProperties"}  # the schema decides itself
OPEN_TUPLE = {"items", "unevaluatedItems"}
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# json_object: any JSON object, its values spelled out so that their numbers are bounded like a schema's
ANY_VALUE = {
    "anyOf": [
        {"type": "object", "additionalProperties": {"$ref": "#/$defs/value"}},
        {"type": "array", "items": {"$ref": "#/$defs/value"}},
        {"type": ["string", "number", "boolean", "null"]},
    ]
}
ANY_OBJECT = {"$defs": {"value": ANY_VALUE}, "type": "object", "additionalProperties": {"$ref": "#/$defs/value"}}
KINDS = ("json", "regex", "choice", "grammar", "json_object")
_BITS = torch.arange(32, dtype=torch.int32)


@dataclass
class StructuredOutputsParams:
    """vLLM's: exactly one of a JSON schema (a dict or its text), a regex, a list of choices, a Lark or GBNF grammar,
    or json_object (any JSON object). Checked when built: a malformed spec is an InvalidRequestError naming its
    field, with llguidance's message. `disable_any_whitespace` (vLLM's): rooftop's JSON is always compact (no
    whitespace between tokens: a small model otherwise writes spaces until max_tokens), so only True, or None, is
    taken."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None
    # llguidance's form of the spec: what is compiled, and the compiled grammars' cache key
    llguidance_grammar: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.disable_any_whitespace not in (None, True):
            raise InvalidRequestError(
                f"structured_outputs.disable_any_whitespace must be true (rooftop's JSON has no whitespace between "
                f"tokens), got {self.disable_any_whitespace!r}",
                "structured_outputs.disable_any_whitespace",
            )
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise InvalidRequestError(
                f"structured_outputs takes exactly one of {', '.join(KINDS)}; got {given or 'none'}",
                "structured_outputs",
            )
        kind = given[0]
        self.llguidance_grammar = _to_llguidance(kind, getattr(self, kind))
        error = llguidance.LLMatcher.validate_grammar(self.llguidance_grammar)
        if error:
            raise InvalidRequestError(f"structured_outputs.{kind}: {error.strip()}", f"structured_outputs.{kind}")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))


def _to_llguidance(kind: str, value) -> str:
    """The spec as llguidance's grammar text; a value of the wrong type or unparsable JSON is refused by name."""

    def refuse(message: str):
        return InvalidRequestError(f"structured_outputs.{kind}: {message}", f"structured_outputs.{kind}")

    if kind == "json_object":
        if value is not True:
            raise refuse(f"must be true, got {value!r}")
        return json_grammar(ANY_OBJECT)
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise refuse(f"a schema is a JSON object: {e}") from None
        if not isinstance(value, dict):
            raise refuse(f"must be a JSON schema (an object or its text), got {type(value).__name__}")
        return json_grammar(value)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise refuse(f"must be a non-empty list of non-empty strings, got {value!r}")
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in value))
    if not isinstance(value, str) or not value:
        raise refuse(f"must be a non-empty string, got {value!r}")
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(value)
    try:
        return llguidance.grammar_from("grammar", value)  # Lark, or GBNF converted to Lark
    except ValueError as e:
        raise refuse(str(e)) from None


def json_grammar(schema: dict, options: dict | None = None) -> str:
    """llguidance's grammar of a JSON schema, compact (JSON_OPTIONS, or `options`), its open numbers bounded."""
    return llguidance.LLMatcher.grammar_from_json_schema(bounded(schema), defaults=options or JSON_OPTIONS)


def bounded(schema, close: bool = True):
    """A copy of `schema` with what a small model could go on writing forever bounded, so that every token makes
    progress; every output it allows validates against `schema`:
    - an integer or number without bounds gets |x| < 10**INTEGER_DIGITS, a number without a multipleOf at most
      FRACTION_DIGITS decimals (the schema's own bounds and multipleOf are kept);
    - an object that lists its properties takes no others, and a tuple (prefixItems) no more items, unless the
      schema says otherwise (additionalProperties, patternProperties, unevaluatedProperties; items,
      unevaluatedItems): vLLM's default grammar backend, xgrammar, does the same in its strict mode. Not inside
      allOf (`close` false), whose parts each list only some of the properties."""
    if isinstance(schema, list):
        return [bounded(s, close) for s in schema]
    if not isinstance(schema, dict):
        return schema
    schema = dict(schema)
    for key in SUBSCHEMAS:
        if key in schema:
            schema[key] = bounded(schema[key], close and key != "allOf")
    for key in SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            schema[key] = {name: bounded(s) for name, s in schema[key].items()}
    if close and "properties" in schema and not OPEN_OBJECT.intersection(schema):
        schema["additionalProperties"] = False
    if close and "prefixItems" in schema and not OPEN_TUPLE.intersection(schema):
        schema["items"] = False
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    if "integer" in types or "number" in types:
        limit = 10**INTEGER_DIGITS
        low, high = schema.get("minimum", schema.get("exclusiveMinimum")), schema.get("maximum")
        high = schema.get("exclusiveMaximum") if high is None else high
        if high is None and _number(low, -limit) < limit:
            schema["exclusiveMaximum"] = limit
        if low is None and _number(high, limit) > -limit:
            schema["exclusiveMinimum"] = -limit
        if "number" in types and "multipleOf" not in schema:
            schema["multipleOf"] = 10**-FRACTION_DIGITS
    return schema


def _number(value, default: float) -> float:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else default


@dataclass
class GrammarState:
    """One sequence's place in its grammar: advanced by each token it keeps, so it always matches its output
    tokens (a preempted sequence keeps it: its replayed tokens are not sampled again)."""

    matcher: llguidance.LLMatcher

    def advance(self, token_ids: list[int]) -> bool:
        """Take the tokens in order; False (the grammar in its error state, `error` says why) at one it rejects,
        which the mask should have made impossible."""
        for token_id in token_ids:
            if self.matcher.is_stopped():  # EOS was taken: nothing follows it in this request
                return True
            if not self.matcher.consume_token(token_id):
                return False
        return True

    @property
    def error(self) -> str:
        return self.matcher.get_error()


class GrammarCompiler:
    """One tokenizer's compiled grammars: each spec compiled once, kept in an LRU, and copied for each request
    (a copy shares the compiled grammar and costs far less than compiling)."""

    def __init__(
        self, source: tokenizers.Tokenizer, vocab_size: int, eos_token_ids: list[int], cache_size: int = CACHE_SIZE
    ):
        self._source, self.vocab_size, self.eos_token_ids = source, vocab_size, eos_token_ids
        self._tokenizer: llguidance.LLTokenizer | None = None  # built on first use (~0.25 s for 49152 tokens)
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self.cache_size = cache_size

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            try:
                self._tokenizer = llguidance.LLTokenizer(
                    self._source.to_str(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids
                )
            except ValueError as e:  # a dummy preset's: SmolLM2's tokenizer beside the config's end-of-sequence ids
                raise InvalidRequestError(
                    f"structured output and tools need a tokenizer that holds the model's end-of-sequence ids "
                    f"{self.eos_token_ids}, and this model's does not ({e}); a dummy model of a preset borrows "
                    "SmolLM2's tokenizer",
                    "structured_outputs",
                ) from None
        return self._tokenizer

    def start(self, spec: StructuredOutputsParams) -> GrammarState:
        """A fresh state of `spec`'s grammar; InvalidRequestError if it does not compile for this tokenizer."""
        key = spec.llguidance_grammar
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = llguidance.LLMatcher(self.tokenizer, key, log_level=0)
            if compiled.is_error():
                raise InvalidRequestError(
                    f"structured_outputs.{spec.kind}: {compiled.get_error()}", f"structured_outputs.{spec.kind}"
                )
            self._compiled[key] = compiled
            if len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(key)
        return GrammarState(compiled.deep_copy())

    def __len__(self) -> int:
        return len(self._compiled)


@functools.cache
def _executor() -> llguidance.LLExecutor:
    """llguidance's thread pool for filling a step's masks in parallel (one per process)."""
    return llguidance.LLExecutor()


def apply_grammars(logits: torch.Tensor, grammars: list[GrammarState | None]) -> torch.Tensor:
    """(B, vocab) logits with each constrained row's disallowed tokens at -inf: one bitmask for the step (all bits
    set in unconstrained rows), the constrained rows' filled in parallel by llguidance's executor, applied in one
    op that copies every other logit as it was. The input itself when no row is constrained; a new tensor otherwise
    (the logprobs are reported from the model's own distribution)."""
    constrained = [(g.matcher, i) for i, g in enumerate(grammars) if g is not None]
    if not constrained:
        return logits
    rows, vocab = logits.shape
    words = (vocab + 31) // 32
    bitmask = torch.full((rows, words), -1, dtype=torch.int32)
    _executor().unsafe_compute_mask_ptr(constrained, bitmask.data_ptr(), words * 4, rows)
    allowed = ((bitmask[:, :, None] >> _BITS) & 1).bool().reshape(rows, words * 32)[:, :vocab]
    return torch.where(allowed.to(logits.device), logits, float("-inf"))
