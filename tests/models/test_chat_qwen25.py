"""Qwen2.5's chat format to ids, against transformers' apply_chat_template over a local Qwen2.5
tokenizer dir (its template: `tokenizer.QWEN25_CHAT_TEMPLATE`), plus hand-written
expectations of what that template is known to render (default system prompt, no <think>)."""

from __future__ import annotations

import copy
import unicodedata

import pytest

from jaxscaffold.models import chat
from jaxscaffold.models.chat import QWEN25, Qwen3ChatRenderer
from jaxscaffold.models.tokenizer import (QWEN25_DEFAULT_SYSTEM, QWEN25_TOKENIZER_SIZE, HFTokenizer,
                                          QwenOfflineTokenizer, write_hf_tokenizer)
from tests.models.test_chat import AGENT_LOOP, CASES, GEN_OPTIONS, SYSTEM, TOOLS


@pytest.fixture(scope="session")
def hf(tmp_path_factory) -> HFTokenizer:
    return HFTokenizer(write_hf_tokenizer(tmp_path_factory.mktemp("qwen25-tok"), family="qwen2.5"))


@pytest.fixture(params=["offline", "hf"])
def renderer(request, hf) -> Qwen3ChatRenderer:
    # The offline tokenizer is Qwen3's; told the format, it gives Qwen2.5's ids (same BPE, and
    # the tokens Qwen2.5 lacks are text in its format).
    if request.param == "offline":
        return Qwen3ChatRenderer(QwenOfflineTokenizer(), QWEN25)
    return Qwen3ChatRenderer(hf)


def hf_text(hf, messages, tools=None, **kwargs) -> str:
    return hf.hf.apply_chat_template(copy.deepcopy(messages), tools=tools, tokenize=False, **kwargs)


def hf_ids(hf, messages, tools=None, **kwargs) -> list[int]:
    return hf.hf.encode(hf_text(hf, messages, tools, **kwargs), add_special_tokens=False)


def test_the_tokenizer_is_qwen25s(hf):
    """22 added tokens (no <think> / <tool_response>), which the format is read from."""
    assert hf.vocab_size == QWEN25_TOKENIZER_SIZE == 151665
    assert "<think>" not in hf.special_ids and hf.token_id("<tool_call>") == 151657
    assert chat.format_for(hf) is QWEN25 and chat.format_for(QwenOfflineTokenizer()) is chat.QWEN3
    assert max(hf.hf.encode("<tool_response>x</tool_response><think>", add_special_tokens=False)) < 151643


@pytest.mark.parametrize("with_tools", [False, True], ids=["no_tools", "tools"])
@pytest.mark.parametrize("gen", GEN_OPTIONS)
@pytest.mark.parametrize("case", CASES)
def test_render_matches_hf_template(renderer, hf, case, gen, with_tools):
    messages, tools, kwargs = CASES[case], TOOLS if with_tools else None, GEN_OPTIONS[gen]
    ids = renderer.render(messages, tools=tools, **kwargs)
    assert ids == hf_ids(hf, messages, tools, **kwargs)
    assert renderer.tokenizer.decode(ids) == unicodedata.normalize("NFC", hf_text(hf, messages, tools, **kwargs))


def test_default_system_prompt_and_no_thinking(renderer):
    """What Qwen2.5's template is known to write, independently of the template text above:
    its default system turn when none is given, reasoning dropped, content kept as written,
    and the same generation prompt with or without `enable_thinking`."""
    tok = renderer.tokenizer
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "<think>x</think>Hello", "reasoning_content": "hidden"}]
    assert tok.decode(renderer.render(messages, add_generation_prompt=True, enable_thinking=False)) == (
        f"<|im_start|>system\n{QWEN25_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>x</think>Hello<|im_end|>\n<|im_start|>assistant\n")
    assert QWEN25_DEFAULT_SYSTEM not in tok.decode(renderer.render([SYSTEM, messages[0]]))
    assert renderer.generation_prompt(enable_thinking=False) == renderer.generation_prompt() == [
        151644, *tok.encode("assistant\n")]


def test_tool_turns_and_string_arguments(renderer):
    """Tool calls as in Qwen's function-calling format, string arguments JSON-encoded (the
    template's `tojson`), results in one user turn whose <tool_response> tags are text."""
    tok = renderer.tokenizer
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": '{"a": 1}'}]},
                {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}]
    ids = renderer.render(messages)
    assert tok.decode(ids).endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n")
    assert ids.count(151644) == 4 and max(i for i in ids if i not in (151644, 151645, 151657, 151658)) < 151643


def test_incremental_rollout_equals_full_render(renderer, hf):
    """Prompt + sampled turns + continuations + "\\n" is the whole conversation's render (the
    template strips nothing in Qwen2.5: no reasoning to drop)."""
    tok = renderer.tokenizer
    ids = renderer.render(AGENT_LOOP[:2], tools=TOOLS, add_generation_prompt=True)
    i = 2
    while i < len(AGENT_LOOP):
        ids += renderer.assistant_completion(AGENT_LOOP[i])
        j = i + 1
        while j < len(AGENT_LOOP) and AGENT_LOOP[j]["role"] == "tool":
            j += 1
        if j > i + 1:
            ids += renderer.continue_with_tool_results([m["content"] for m in AGENT_LOOP[i + 1:j]])
        i = j
    full = renderer.render(AGENT_LOOP, tools=TOOLS)
    assert ids + tok.encode("\n") == full == hf_ids(hf, AGENT_LOOP, TOOLS)


def test_a_tokenizer_of_neither_family_is_refused(tmp_path):
    class Bare(QwenOfflineTokenizer):
        special_ids = {"<|im_start|>": 1}

    with pytest.raises(ValueError, match="neither Qwen3's nor Qwen2.5's"):
        Qwen3ChatRenderer(Bare())
