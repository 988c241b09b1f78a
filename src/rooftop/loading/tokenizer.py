"""Tokenizer: the `tokenizers` library for text <-> ids, jinja2 for the chat template, and the special ids."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from rooftop.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError
from rooftop.loading.hf_config import read_json

# How llama.cpp splits text before BPE, by the GGUF's `tokenizer.ggml.pre`; the regexes are llama.cpp's.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):
        # Trained with every digit its own pre-token, then GPT-2's split.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3", "pixtral"):
        split = _LLAMA3_SPLIT
    elif pre in ("qwen2", "deepseek-r1-qwen", "megrez"):
        split = _QWEN2_SPLIT
    else:  # "gpt2", "default" and the rest: GPT-2's own split
        return byte_level
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@dataclass
class Tokenizer:
    """Encodes prompts, decodes tokens, renders chat messages; knows which ids end generation."""

    backend: HFTokenizer
    bos_token: str | None = None
    eos_token: str | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    add_bos: bool = False
    chat_template: str | None = None

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self.backend.token_to_id(self.bos_token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in the text (e.g. `<|im_start|>`) become their ids. Through
        `encode_batch`, even for one text: it releases the GIL while it works and `encode` does not (a 2 MB prompt
        held every other thread, a server's event loop and engine among them, for over a second); same ids."""
        ids = self.backend.encode_batch([text], add_special_tokens=False)[0].ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    @functools.cached_property
    def max_token_bytes(self) -> int | None:
        """The most bytes of text one token can stand for: a text of more than n times this many bytes (counted by
        `text_bytes`) has more than n tokens, which a server can tell without tokenizing it. A token's UTF-8 length
        never undercounts what it covers (a byte-level character or '\u2581' is one byte of text spelled in two
        or three, '<0x0A>' one in six). None where no such bound holds: a model that is not BPE, or a BPE that
        turns a run of unknown text into one unknown token (an unknown token without byte fallback)."""
        model = self.backend.model
        if not isinstance(model, models.BPE) or (model.unk_token and not model.byte_fallback):
            return None
        return max(len(token.encode()) for token in self.backend.get_vocab(with_added_tokens=True))

    def text_bytes(self, text: str) -> int:
        """The UTF-8 length of `text` as the vocabulary sees it: after the tokenizer's normalizer, if it has one
        (NFC, say, can shorten a text threefold)."""
        normalizer = self.backend.normalizer
        return len((text if normalizer is None else normalizer.normalize_str(text)).encode())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids`; an id outside the vocabulary (a dummy-weights model's, larger than its tokenizer's)
        reads `<id:N>`, where the tokenizers library would drop it without a trace."""
        size = self.vocab_size
        if all(0 <= i < size for i in ids):
            return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        parts, run = [], []
        for i in ids:
            if 0 <= i < size:
                run.append(i)
                continue
            parts += [self.backend.decode(run, skip_special_tokens=skip_special_tokens), f"<id:{i}>"]
            run = []
        parts.append(self.backend.decode(run, skip_special_tokens=skip_special_tokens))
        return "".join(parts)

    @property
    def template_takes_tools(self) -> bool:
        """Whether the chat template has its own tool syntax: it reads a `tools` variable (as Qwen's do)."""
        return bool(self.chat_template) and _reads_tools(self.chat_template)

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
        tokenize: bool = False,
    ) -> str | list[int]:
        """The prompt text for `messages` (and `tools`, for a template that takes them), rendered like
        transformers' `apply_chat_template`: `chat_template_kwargs` become variables of the template (vLLM's, e.g.
        Qwen3's enable_thinking), and `continue_final_message` leaves the last message open for the model to go on
        with (transformers' rule, which vLLM uses: the text ends where that message's content does). `tokenize`:
        its token ids instead (transformers' option; its default here is the text, which vLLM's callers ask for)."""
        if not self.chat_template:
            raise InvalidRequestError("this model has no chat template; pass the prompt as raw text")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise InvalidRequestError(f"message {i} must be a dict with 'role' and 'content'")
        if continue_final_message and add_generation_prompt:
            raise InvalidRequestError(
                "continue_final_message and add_generation_prompt cannot both be true: one goes on with the last "
                "message, the other starts a new one (set add_generation_prompt to false)",
                "continue_final_message",
            )
        variables = check_chat_template_kwargs(chat_template_kwargs)
        try:
            text = _compile(self.chat_template).render(
                **variables,
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except (jinja2.TemplateError, TypeError) as e:  # a TypeError: a value the template's expressions cannot take
            raise InvalidRequestError(f"the chat template rejected these messages: {e}") from None
        text = _open_final_message(text, messages) if continue_final_message else text
        return self.encode(text, add_special_tokens=False) if tokenize else text

    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> Tokenizer:
        """Rebuild the tokenizer a GGUF describes: BPE vocabulary and merges, split rule, special tokens."""
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise UnsupportedModelError(
                f"GGUF tokenizer model {kind!r} is not supported (supported: 'gpt2', byte-level BPE)"
            )
        tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
        if not tokens:
            raise ModelLoadError("the GGUF has no tokenizer vocabulary (tokenizer.ggml.tokens)")
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        backend = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
        backend.pre_tokenizer = _gpt2_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
        backend.decoder = decoders.ByteLevel()
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        # 3 = control (e.g. <|im_end|>), 4 = user-defined: both are matched whole in the text, never split.
        backend.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types, strict=True) if k == 3]
        )
        backend.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types, strict=True) if k == 4]
        )

        def token(key: str) -> str | None:
            i = meta.get(f"tokenizer.ggml.{key}")
            return tokens[i] if i is not None and 0 <= i < len(tokens) else None

        eos = meta.get("tokenizer.ggml.eos_token_id")
        eos_ids = [eos] if eos is not None else []
        eot = meta.get("tokenizer.ggml.eot_token_id")
        if eot is not None and eot not in eos_ids:
            eos_ids.append(eot)
        return cls(
            backend=backend,
            bos_token=token("bos_token_id"),
            eos_token=token("eos_token_id"),
            eos_token_ids=eos_ids,
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=meta.get("tokenizer.chat_template"),
        )

    @classmethod
    def from_hf_dir(cls, path: Path, eos_token_ids: list[int]) -> Tokenizer:
        """tokenizer.json, with specials and chat template from tokenizer_config.json (or chat_template.jinja)."""
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelLoadError(f"{path}: no tokenizer.json")
        try:
            backend = HFTokenizer.from_file(str(tok_file))
        except Exception as e:
            raise ModelLoadError(f"{tok_file}: not a valid tokenizer.json ({e})") from None
        cfg = read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() else {}
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
        ids = list(eos_token_ids)
        if eos is not None and backend.token_to_id(eos) is not None and backend.token_to_id(eos) not in ids:
            ids.append(backend.token_to_id(eos))
        add_bos = cfg.get("add_bos_token")
        if add_bos is None and (first := _post_processor_bos(backend)) is not None:
            bos, add_bos = backend.id_to_token(first), True
        return cls(backend, bos, eos, ids, bool(add_bos), template)


def _post_processor_bos(backend: HFTokenizer) -> int | None:
    """The one token tokenizer.json's post-processor puts before a text (Llama 3's BOS, which its
    tokenizer_config.json leaves to it: transformers and vLLM add it through the post-processor), or None."""
    plain = backend.encode("a", add_special_tokens=False).ids
    marked = backend.encode("a", add_special_tokens=True).ids
    head = marked[: len(marked) - len(plain)]
    return head[0] if len(head) == 1 and marked[len(head) :] == plain else None


# what rooftop itself hands the template: chat_template_kwargs may not override them (each has its own parameter)
RENDER_ARGUMENTS = ("messages", "add_generation_prompt", "tools", "bos_token", "eos_token", "continue_final_message")


def check_chat_template_kwargs(kwargs: dict | None) -> dict:
    """vLLM's chat_template_kwargs: a dict of string keys, each a variable of the chat template (a variable the
    template does not read changes nothing, as in vLLM). The names rooftop sets itself are refused: each has its
    own parameter, and a second value for it would be silently lost on one side."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise InvalidRequestError(
            f"chat_template_kwargs is a dict of template variables, not {type(kwargs).__name__}",
            "chat_template_kwargs",
        )
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise InvalidRequestError(f"chat_template_kwargs keys are strings, got {bad[0]!r}", "chat_template_kwargs")
    reserved = [k for k in kwargs if k in RENDER_ARGUMENTS]
    if reserved:
        raise InvalidRequestError(
            f"chat_template_kwargs may not set {reserved[0]!r}: pass it as its own parameter", "chat_template_kwargs"
        )
    return kwargs


def _open_final_message(text: str, messages: list[dict]) -> str:
    """The rendered conversation cut right after the last message's content (what the template closes it with,
    an end-of-turn token or a newline, dropped), so the model continues that message: transformers'
    continue_final_message. A template that does not write the content as given cannot be continued."""
    content = _final_text(messages[-1]["content"]) if messages else None
    if content is None or not content.strip():
        raise InvalidRequestError(
            "continue_final_message needs a last message with text content to continue", "continue_final_message"
        )
    at = text.rfind(content.strip())
    if at < 0:
        raise InvalidRequestError(
            "continue_final_message: the chat template does not write the last message's content as given, so "
            "there is no place to continue it from",
            "continue_final_message",
        )
    kept = len(content.lstrip())  # the template kept the message's trailing spaces, or they go too
    return text[: at + kept] if text[at : at + kept] == content.lstrip() else text[: at + len(content.strip())]


def _final_text(content) -> str | None:
    """A message's text: its content, or its last text part (OpenAI's content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return texts[-1] if texts else None
    return None


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    """Compile once per template text, in a sandbox with the helpers chat templates expect."""
    try:
        return _compile_environment().from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ModelLoadError(f"the model's chat template does not parse: {e}") from None


@functools.lru_cache(maxsize=16)
def _reads_tools(source: str) -> bool:
    try:
        return "tools" in jinja2.meta.find_undeclared_variables(_compile_environment().parse(source))
    except jinja2.TemplateSyntaxError:
        return False  # rendering says what is wrong with it


@functools.cache
def _compile_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env
