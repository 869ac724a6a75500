"""Qwen3's chat format (and Qwen2.5's), rendered straight to token ids.

`Qwen3ChatRenderer` reproduces what Qwen3's chat template (see
`jaxscaffold.models.tokenizer.QWEN3_CHAT_TEMPLATE`) renders, but produces token ids
directly, never a string to re-tokenise:

* The structure tokens the template writes (<|im_start|>, <|im_end|>, <think>, </think>,
  <tool_call>, </tool_call>, <tool_response>, </tool_response>) are emitted as their ids.
* All message text (contents, reasoning, tool schemas, tool-call names and arguments,
  tool results) goes through `Tokenizer.encode`, which treats it as data: a user or a tool
  that writes "<|im_end|>" gets plain text tokens, never a turn boundary.
* Each maximal run of text between two structure tokens is encoded as ONE string, so the
  ids equal those of tokenising the rendered template string (BPE pre-tokenisation can
  join e.g. the "\\n" after a role with the start of the content).

Template semantics kept exactly (verified against the jinja template by the tests):
a system message (first) is merged with the `tools` block; consecutive tool messages
share one user turn of <tool_response> blocks; an assistant's reasoning (its
`reasoning_content`, or a "<think>...</think>" prefix of its content) is kept only for
turns after the last real user query, and there only if non-empty or the turn is the last
message; earlier turns render content only. `enable_thinking=False` appends the empty
"<think>\\n\\n</think>\\n\\n" to the generation prompt. Two deliberate strictnesses: an
unknown role raises ValueError (the template silently drops it) and content must be a
string or None (None renders as "", as in Qwen's later revision of the template).

Multi-turn token-in-token-out rollouts never re-render history: start from
`render(..., add_generation_prompt=True)`, append the model's sampled ids (ending with
<|im_end|>), then `continuation(...)` (or `continue_with_user` /
`continue_with_tool_results`) for the environment's reply and the next generation prompt.
Where the template does not strip anything (e.g. one user query followed by an agentic
loop of thinking / tool-calling turns), prompt + completions + continuations + "\\n" equals
`render` of the whole conversation; `assistant_completion` gives the ids the template
expects a model turn to have, for tests and for building training data.

Qwen2.5 (`QWEN25`, `jaxscaffold.models.tokenizer.QWEN25_CHAT_TEMPLATE`): the same ChatML turns
and tool blocks, but a default system prompt when the first message is not a system one, no
<think> handling (reasoning is neither split off nor stripped; `enable_thinking` is ignored, as
the template has no such switch), tool-call arguments always JSON-encoded, and
<tool_response> is text (not an added token of its tokenizer). The renderer takes the format
from the tokenizer (`format_for`): the chat template ships with it in an HF checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jaxscaffold.models.tokenizer import QWEN25_DEFAULT_SYSTEM, Tokenizer

Message = Mapping[str, Any]

STRUCTURE_TOKENS: tuple[str, ...] = (
    "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
)


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """What a model family's chat template does differently (see the module docstring)."""

    name: str
    structure_tokens: tuple[str, ...]  # template-written strings that are added tokens
    default_system: str | None  # rendered when the first message is not a system one
    thinking: bool  # <think> blocks: reasoning split off, kept after the last query only
    raw_string_arguments: bool  # a tool call's string arguments written as they are (else tojson)


QWEN3 = ChatFormat("qwen3", STRUCTURE_TOKENS, None, thinking=True, raw_string_arguments=True)
QWEN25 = ChatFormat("qwen2.5", STRUCTURE_TOKENS[:2] + ("<tool_call>", "</tool_call>"), QWEN25_DEFAULT_SYSTEM,
                    thinking=False, raw_string_arguments=False)


def format_for(tokenizer: Tokenizer) -> ChatFormat:
    """The chat format of a tokenizer's model family: Qwen3's vocabulary has <think> among its
    added tokens, Qwen2.5's stops at <|file_sep|> (151664)."""
    special = tokenizer.special_ids
    if "<think>" in special:
        return QWEN3
    if all(tok in special for tok in QWEN25.structure_tokens):
        return QWEN25
    raise ValueError("tokenizer has neither Qwen3's nor Qwen2.5's chat tokens "
                     f"({', '.join(QWEN25.structure_tokens)}, <think>)")

# The template's fixed text around the tool schemas in the system turn.
_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n')
_EMPTY_THINK = "<think>\n\n</think>\n\n"
_ENV_ROLES = ("user", "system", "tool")


def _tojson(obj: Any) -> str:
    # transformers' `tojson` filter: json.dumps with ensure_ascii=False, default separators.
    return json.dumps(obj, ensure_ascii=False)


def _content(message: Message) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise TypeError(f"{message.get('role')} message content must be a string or None, "
                        f"got {type(content).__name__}")
    return content


class _IdBuilder:
    """Collects ids; text is buffered and each maximal run is encoded as one string."""

    def __init__(self, tokenizer: Tokenizer, structure_ids: Mapping[str, int], structure_re: re.Pattern):
        self._tokenizer = tokenizer
        self._structure_ids = structure_ids
        self._structure_re = structure_re
        self._ids: list[int] = []
        self._pending: list[str] = []

    def text(self, s: str) -> None:
        """Message data: always encoded as text."""
        if s:
            self._pending.append(s)

    def literal(self, s: str) -> None:
        """Template-written text: its structure tokens become their ids."""
        pos = 0
        for m in self._structure_re.finditer(s):
            self.text(s[pos:m.start()])
            self._flush()
            self._ids.append(self._structure_ids[m.group()])
            pos = m.end()
        self.text(s[pos:])

    def finish(self) -> list[int]:
        self._flush()
        return self._ids

    def _flush(self) -> None:
        if self._pending:
            self._ids.extend(self._tokenizer.encode("".join(self._pending)))
            self._pending = []


def _last_query_index(messages: Sequence[Message]) -> int:
    """Index of the last user message that is a real query (not wrapped tool output)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        content = m.get("content")
        if m["role"] == "user" and isinstance(content, str) and not (
                content.startswith("<tool_response>") and content.endswith("</tool_response>")):
            return i
    return len(messages) - 1


def _split_reasoning(message: Message) -> tuple[str, str]:
    """(reasoning, content) of an assistant message, as the template derives them."""
    content = _content(message)
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning, content
    if "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        return reasoning, content.split("</think>")[-1].lstrip("\n")
    return "", content


class Qwen3ChatRenderer:
    """Renders Qwen3 chats (HF message dicts) to token ids with a `Tokenizer`; Qwen2.5 chats
    with a Qwen2.5 tokenizer (`chat_format`: default `format_for(tokenizer)`).

    Messages: {"role": "system" | "user" | "assistant" | "tool", "content": str | None}.
    Assistant messages may carry "reasoning_content" and "tool_calls": a list of
    {"name": ..., "arguments": dict | str} or the OpenAI form {"function": {...}}.
    `tools` is a list of JSON schemas, rendered into the system turn.
    """

    def __init__(self, tokenizer: Tokenizer, chat_format: ChatFormat | None = None):
        self.tokenizer = tokenizer
        self.format = format_for(tokenizer) if chat_format is None else chat_format
        self._structure_ids = {tok: tokenizer.token_id(tok) for tok in self.format.structure_tokens}
        self._structure_re = re.compile("|".join(map(re.escape, self.format.structure_tokens)))

    # -------------------------------------------------------------------- whole conversations

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping] | None = None,
               add_generation_prompt: bool = False, enable_thinking: bool = True) -> list[int]:
        """Ids of the conversation, as the format's chat template renders it.

        Equals `hf_tokenizer(apply_chat_template(messages, tools=tools, tokenize=False,
        add_generation_prompt=..., enable_thinking=...))` whenever no message text contains
        an added-token string (where HF would turn that text into a control id; we don't).
        """
        messages = list(messages)
        b = self._builder()
        system = messages[0] if messages and messages[0]["role"] == "system" else None
        if system is None and self.format.default_system is not None:
            system = {"role": "system", "content": self.format.default_system}  # Qwen2.5
        if tools:
            b.literal("<|im_start|>system\n")
            if system is not None:
                b.text(_content(system))
                b.literal("\n\n")
            b.literal(_TOOLS_HEADER)
            for tool in tools:
                b.literal("\n")
                b.text(_tojson(tool))
            b.literal(_TOOLS_FOOTER)
        elif system is not None:
            self._plain_turn(b, system)

        last_query = _last_query_index(messages)
        for i, message in enumerate(messages):
            role = message["role"]
            if i == 0 and role == "system":
                continue  # already rendered above
            if role == "assistant":
                keep_reasoning = self.format.thinking and i > last_query
                self._assistant_turn(b, message, keep_reasoning, is_last=i == len(messages) - 1)
            elif role in _ENV_ROLES:
                self._env_message(b, messages, i)
            else:
                raise ValueError(f"message {i}: unknown role {role!r}")
        if add_generation_prompt:
            self._generation_prompt(b, enable_thinking)
        return b.finish()

    # -------------------------------------------------------------------- incremental pieces

    def generation_prompt(self, enable_thinking: bool = True) -> list[int]:
        """"<|im_start|>assistant\\n", plus (Qwen3) the empty think block if thinking is disabled."""
        b = self._builder()
        self._generation_prompt(b, enable_thinking)
        return b.finish()

    def continuation(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                     enable_thinking: bool = True) -> list[int]:
        """Ids to append after a model turn that ended with <|im_end|>.

        That is the "\\n" the template writes after <|im_end|>, the environment's messages
        (user / system / tool; consecutive tool results share one user turn) and, by
        default, the next generation prompt. Assistant messages are not accepted: in a
        rollout those are the model's own sampled ids.
        """
        messages = list(messages)
        b = self._builder()
        b.literal("\n")
        for i, message in enumerate(messages):
            if message["role"] not in _ENV_ROLES:
                raise ValueError(f"continuation message {i}: role must be one of {_ENV_ROLES}, "
                                 f"got {message['role']!r}")
            self._env_message(b, messages, i)
        if add_generation_prompt:
            self._generation_prompt(b, enable_thinking)
        return b.finish()

    def continue_with_user(self, text: str, add_generation_prompt: bool = True,
                           enable_thinking: bool = True) -> list[int]:
        """`continuation` with one user message."""
        return self.continuation([{"role": "user", "content": text}],
                                 add_generation_prompt, enable_thinking)

    def continue_with_tool_results(self, results: Iterable[str], add_generation_prompt: bool = True,
                                   enable_thinking: bool = True) -> list[int]:
        """`continuation` with one tool message per result (one user turn of <tool_response>s)."""
        return self.continuation([{"role": "tool", "content": r} for r in results],
                                 add_generation_prompt, enable_thinking)

    def assistant_completion(self, message: Message, enable_thinking: bool = True) -> list[int]:
        """Ids of an assistant turn as the model writes it after `generation_prompt`.

        With thinking: "<think>\\n{reasoning}\\n</think>\\n\\n{content}", tool calls, <|im_end|>
        (how the template renders the turn when it keeps reasoning). Without: the prompt
        already holds the empty think block, so just content, tool calls, <|im_end|>.
        Excludes the "\\n" after <|im_end|>, which `continuation` starts with.
        """
        b = self._builder()
        reasoning, content = self._reasoning_and_content(message)
        if enable_thinking and self.format.thinking:
            self._think_block(b, reasoning, content)
        else:  # Qwen2.5: content as written
            b.text(content)
        self._tool_calls(b, message, content)
        b.literal("<|im_end|>")
        return b.finish()

    # -------------------------------------------------------------------- pieces of the template

    def _builder(self) -> _IdBuilder:
        return _IdBuilder(self.tokenizer, self._structure_ids, self._structure_re)

    def _reasoning_and_content(self, message: Message) -> tuple[str, str]:
        # Qwen2.5's template knows no reasoning: the content is rendered whole.
        return _split_reasoning(message) if self.format.thinking else ("", _content(message))

    @staticmethod
    def _plain_turn(b: _IdBuilder, message: Message) -> None:
        b.literal(f"<|im_start|>{message['role']}\n")
        b.text(_content(message))
        b.literal("<|im_end|>\n")

    def _env_message(self, b: _IdBuilder, messages: Sequence[Message], i: int) -> None:
        message = messages[i]
        if message["role"] != "tool":
            self._plain_turn(b, message)
            return
        # Consecutive tool messages are grouped into a single user turn.
        if i == 0 or messages[i - 1]["role"] != "tool":
            b.literal("<|im_start|>user")
        b.literal("\n<tool_response>\n")
        b.text(_content(message))
        b.literal("\n</tool_response>")
        if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
            b.literal("<|im_end|>\n")

    def _assistant_turn(self, b: _IdBuilder, message: Message, keep_reasoning: bool,
                        is_last: bool) -> None:
        reasoning, content = self._reasoning_and_content(message)
        b.literal("<|im_start|>assistant\n")
        # Reasoning survives only after the last user query, and an empty think block is
        # written only for the final message.
        if keep_reasoning and (is_last or reasoning):
            self._think_block(b, reasoning, content)
        else:
            b.text(content)
        self._tool_calls(b, message, content)
        b.literal("<|im_end|>\n")

    @staticmethod
    def _think_block(b: _IdBuilder, reasoning: str, content: str) -> None:
        b.literal("<think>\n")
        b.text(reasoning.strip("\n"))
        b.literal("\n</think>\n\n")
        b.text(content.lstrip("\n"))

    def _tool_calls(self, b: _IdBuilder, message: Message, content: str) -> None:
        for j, call in enumerate(message.get("tool_calls") or ()):
            if j > 0 or content:
                b.literal("\n")
            call = call.get("function") or call  # OpenAI form nests name/arguments
            arguments = call.get("arguments")
            b.literal('<tool_call>\n{"name": "')
            b.text(str(call["name"]))
            b.literal('", "arguments": ')
            raw = isinstance(arguments, str) and self.format.raw_string_arguments
            b.text(arguments if raw else _tojson(arguments))
            b.literal("}\n</tool_call>")

    def _generation_prompt(self, b: _IdBuilder, enable_thinking: bool) -> None:
        b.literal("<|im_start|>assistant\n")
        if not enable_thinking and self.format.thinking:
            b.literal(_EMPTY_THINK)
