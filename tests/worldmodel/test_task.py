"""The world-model prompt and answer format; model answers are untrusted text."""

import pytest

from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.models.tokenizer import QwenOfflineTokenizer
from jaxscaffold.worldmodel import task
from jaxscaffold.worldmodel.triples import from_trajectory

TRIPLES = from_trajectory("alfworld", "g", ["You are in a room. Task: put a mug in the sink.", "You arrive at desk 1.",
                                            "You open drawer 1. In it, you see a pen 1.", "Nothing happens."],
                          ["go to desk 1", "open drawer 1", "jump"])


@pytest.mark.parametrize("text, expected", [
    ("<think>the drawer opens</think><next_state>The drawer 1 is open.</next_state>", "The drawer 1 is open."),
    ("<next_state>\n  Nothing happens. \n</next_state>", "Nothing happens."),
    ("<think>\nreasoning\n</think>\n\n<next_state>x</next_state>", "x"),
])
def test_well_formed_answers_parse(text, expected):
    assert task.parse_prediction(text) == expected


@pytest.mark.parametrize("text", [
    "The drawer is open.",  # no tags
    "<next_state>The drawer is open.",  # unclosed
    "<think>never closed <next_state>x</next_state>",  # the think block swallows it
    "<next_state>a</next_state><next_state>b</next_state>",  # two answers
    "<next_state></next_state>",  # empty
    "<next_state>a <next_state>b</next_state></next_state>",  # nested
    "<next_state>a</next_state><think>late</think>",  # a think block after the answer
    "<next_state>__import__('os').system('ls')" + "x" * 100000,  # code, huge, unclosed
])
def test_garbled_answers_are_refused(text):
    assert task.parse_prediction(text) is None


def test_prompt_shows_the_window_and_the_action_and_the_target_closes_the_turn():
    tok = QwenOfflineTokenizer()
    chat = Qwen3ChatRenderer(tok)
    t = TRIPLES[2]
    text = task.user_text(t, task.PromptConfig(history_window=1))
    assert "put a mug in the sink" in text  # the initial observation (the task) is always shown
    assert "(1 earlier steps omitted)" in text and "Action 1: open drawer 1" in text
    assert "go to desk 1" not in text and text.endswith("Next action: jump\n\nPredict the next observation.")
    ids = task.prompt_ids(chat, t)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    target = task.target_ids(chat, t)
    assert target[-1] == tok.token_id("<|im_end|>")
    assert task.parse_prediction(tok.decode(target[:-1])) == "Nothing happens."
