"""Unit tests of the shared <think>/<action> parser (pure, no env)."""

import time

import pytest

from jaxscaffold.envs.actions import clean_text, invalid_action_message, parse_action


@pytest.mark.parametrize(
    "text, action",
    [
        ("<think>go</think><action>look around</action>", "look around"),
        ("<action>  go   to\n kitchen </action>", "go to kitchen"),
        ("<ACTION>open door</Action>", "open door"),
        ("< action >wait</ action >", "wait"),
        ("<action>first</action> then <action>second</action>", "second"),
        ("<action>a <action>b</action>", "b"),  # nested: innermost closed last
        ("<action>a</action> b</action>", "a"),  # stray close after a good block
        ("<action>`go to kitchen`</action>", "go to kitchen"),
        ("<action>\"focus on seed\"</action>", "focus on seed"),
        ("<action>ok</action> trailing <action>unclosed", "ok"),  # strict by default
        ("<action>look\u200b around</action>", "look around"),  # zero-width space removed
        ("<action>e\u0301tape</action>", "\u00e9tape"),  # NFC
        ("<action>look\x00 around\x1b</action>", "look around"),  # control chars
    ],
)
def test_extracts(text, action):
    p = parse_action(text)
    assert p.error is None and p.ok
    assert p.action == action


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "no <action>"),
        ("just words", "no <action>"),
        ("<action>go to kitchen", "unclosed"),
        ("go to kitchen</action>", "without an opening"),
        ("</action>x<action>", "right order"),
        ("<action>   </action>", "empty"),
        ("<action>``</action>", "empty"),
        ("<action>" + "a" * 600 + "</action>", "longer than"),
        (None, "not text"),
        (b"<action>look around</action>", "not text"),
        (12, "not text"),
    ],
)
def test_errors(text, fragment):
    p = parse_action(text)
    assert p.action is None and not p.ok
    assert fragment in p.error
    assert len(p.error) < 120


def test_think_forms():
    assert parse_action("<think> plan </think>\n<action>x</action>").think == "plan"
    # Qwen3 templates open <think> in the prompt: only the close is generated
    assert parse_action("reasoning here</think><action>x</action>").think == "reasoning here"
    assert parse_action("<action>x</action>").think is None
    # the think block that precedes the chosen action, not a later one
    p = parse_action("<think>a</think><action>x</action><think>b</think>")
    assert p.action == "x" and p.think == "a"
    # think is still reported when the action is missing
    p = parse_action("<think>t</think> no action")
    assert p.think == "t" and p.action is None


def test_unclosed_allowed_option():
    assert parse_action("<think>t</think><action>go north", allow_unclosed=True).action == "go north"
    assert parse_action("<action>a</action><action>b", allow_unclosed=True).action == "b"
    assert parse_action("<action>a</action>", allow_unclosed=True).action == "a"


def test_other_tag_and_bad_tag():
    assert parse_action("<answer>42</answer>", tag="answer").action == "42"
    with pytest.raises(ValueError):
        parse_action("x", tag="a|b")


def test_code_is_just_text():
    # the parser returns code as an inert string; nothing is evaluated
    p = parse_action("<action>__import__('os').system('echo hi')</action>")
    assert p.action == "__import__('os').system('echo hi')"


def test_huge_inputs_are_bounded():
    big = "x" * 5_000_000
    t = time.perf_counter()
    assert parse_action(big + "<action>look around</action>").action == "look around"
    assert parse_action("<action>look around</action>" + big).action is None  # cut off by the cap
    assert parse_action("<action>" * 200_000).action is None
    assert parse_action("<" + " " * 1_000_000 + "action>").action is None
    assert parse_action(("<action>a</action>" * 100_000)).action == "a"
    assert time.perf_counter() - t < 5.0
    p = parse_action("<action>" + "a" * 1_000_000 + "</action>")
    assert p.action is None


def test_clean_text_and_message():
    assert clean_text("a\u202eb\ufeffc\td\n") == "abc\td\n"
    msg = invalid_action_message("empty <action>")
    assert "empty <action>" in msg and "<action>...</action>" in msg
