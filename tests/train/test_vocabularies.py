"""The rooms vocabulary covers every text a rooms run shows or writes: real episodes of the
test split (gold and random valid actions, every observation with AG and OE added, and the
step-wise rows' prompts around them) encode without an unknown id and decode back exactly; the
chat renders to the ChatML string."""

import random

from jaxscaffold.envs import rooms
from jaxscaffold.envs.prompts import history_window_text, system_prompt
from jaxscaffold.feedback import enrichers
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.train.vocabularies import word_tokenizer


def _episode_texts(task, rng, gold: bool):
    env = rooms.RoomsEnv()
    obs = env.reset(task)
    first, seen, texts = obs.text, [], []
    for step in range(20):
        texts += [obs.text, enrichers.rooms_ag(obs, []), enrichers.rooms_oe(obs, [])]
        texts += [history_window_text(first, seen[-window:] if window else [], obs.text, step) for window in (0, 2)]
        acts = obs.privileged["valid_actions"]
        action = obs.privileged["next_walkthrough_action"] if gold else rng.choice(acts + ["open door"])  # an invalid one too
        texts.append(action)
        seen.append((obs.text, action))
        result = env.step(action)
        obs = result.observation
        if result.done:
            texts += [obs.text, enrichers.rooms_oe(obs, [])]
            break
    return texts


def test_real_rooms_episodes_round_trip_without_unknown_words():
    tok = word_tokenizer("rooms")
    rng = random.Random(0)
    texts = [system_prompt("rooms"), "<action>go to red</action>"]
    for i, task in enumerate(rooms.catalogue("test")[:12]):
        texts += _episode_texts(task, rng, gold=i % 2 == 0)
    assert any("Nothing happens." in t for t in texts) and any("Done: the goal holds." in t for t in texts)
    for text in texts:
        ids = tok.encode(text)
        assert tok.unk_id not in ids, text
        assert tok.decode(ids) == text
    # Word-level: an observation is a few dozen ids (Qwen3's BPE needs about as many).
    obs = texts[2]
    assert len(tok.encode(obs)) < len(obs) / 3
    assert tok.vocab_size < 300


def test_rooms_chat_renders_the_chatml_string():
    tok = word_tokenizer("rooms")
    chat = Qwen3ChatRenderer(tok)
    obs = rooms.RoomsEnv().reset(rooms.catalogue("test")[0]).text
    messages = [{"role": "system", "content": system_prompt("rooms")}, {"role": "user", "content": obs}]
    ids = chat.render(messages, add_generation_prompt=True, enable_thinking=False)
    ids += chat.assistant_completion({"role": "assistant", "content": "look"}, enable_thinking=False)
    expected = (f"<|im_start|>system\n{system_prompt('rooms')}<|im_end|>\n<|im_start|>user\n{obs}<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\nlook<|im_end|>")
    assert tok.decode(ids) == expected
    assert tok.unk_id not in ids
