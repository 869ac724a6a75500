"""The rooms_wm vocabulary covers RWML's chats on rooms: the world-model prompts (with history,
omitted steps and the current state) and answers of real rooms transitions encode without an
unknown id and decode back exactly; the rooms words keep every id they need."""

from jaxscaffold.envs.local import LocalEnvs
from jaxscaffold.envs import registry, rooms
from jaxscaffold.models.chat import Qwen3ChatRenderer
from jaxscaffold.train.vocabularies import word_tokenizer
from jaxscaffold.train.workloads.world_model import explorer_trajectories
from jaxscaffold.worldmodel import task, triples as triples_lib


def test_world_model_chats_on_rooms_have_no_unknown_word():
    envs = LocalEnvs({"rooms": registry.factory("rooms")})
    try:
        eps = explorer_trajectories(envs, rooms.catalogue("train")[:6], rollouts_per_task=1, max_steps=10,
                                    gold_prob=0.5, seed=0)
    finally:
        envs.close()
    triples = [t for e in eps for t in triples_lib.from_trajectory(e.task.env, e.task.task_id, e.observations,
                                                                   e.actions)]
    assert len(triples) > 30 and any(len(t.history) > 2 for t in triples)
    tok = word_tokenizer("rooms_wm")
    chat = Qwen3ChatRenderer(tok)
    for t in triples:
        for cfg in (task.PromptConfig(history_window=1), task.PromptConfig(history_window=0)):
            prompt, target = task.prompt_ids(chat, t, cfg), task.target_ids(chat, t, cfg)
            assert tok.unk_id not in prompt + target
        answer = tok.decode(task.target_ids(chat, t, cfg))
        assert task.parse_prediction(answer.removesuffix("<|im_end|>")) == t.next_state
    assert set(word_tokenizer("rooms").words) < set(tok.words)
