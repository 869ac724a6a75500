"""Moving a model to a larger word vocabulary keeps what it learned: on a real rooms
observation the moved model gives every old piece the logit the original gave (computed by
the original on the old ids), and the new world-model words get ids of their own."""

import jax
import numpy as np
import pytest

from jaxscaffold.envs import rooms
from jaxscaffold.models import config as model_configs
from experiments.rooms_rwml import vocab_transfer
from jaxscaffold.models import qwen3
from jaxscaffold.models.word_tokenizer import padded_vocab_size
from jaxscaffold.train.vocabularies import word_tokenizer


def test_moved_model_keeps_every_old_pieces_logit():
    old, new = word_tokenizer("rooms"), word_tokenizer("rooms_wm")
    config = model_configs.tiny(vocab_size=padded_vocab_size(old), compute_dtype="float32", remat_policy="none")
    params = qwen3.init_params(config, jax.random.key(1))
    moved_config, moved = vocab_transfer.transfer(config, params, old, new, seed=3)
    assert moved_config.vocab_size == padded_vocab_size(new) > config.vocab_size
    text = rooms.RoomsEnv().reset(rooms.catalogue("train")[0]).text
    old_ids, new_ids = old.encode(text), new.encode(text)
    assert old.unk_id not in old_ids and new.unk_id not in new_ids
    assert old.decode(old_ids) == new.decode(new_ids) == text
    mapping = vocab_transfer.id_map(old, new)
    assert [mapping[i] for i in new_ids] == old_ids  # the same pieces, other ids
    before = np.asarray(qwen3.forward(params, config, np.asarray([old_ids])))[0]
    after = np.asarray(qwen3.forward(moved, moved_config, np.asarray([new_ids])))[0]
    cols_new, cols_old = zip(*sorted(mapping.items()))
    np.testing.assert_allclose(after[:, list(cols_new)], before[:, list(cols_old)], rtol=1e-5, atol=1e-5)
    # The world-model tags are words of the new vocabulary only.
    assert new.unk_id not in new.encode("<next_state>You carry: nothing.</next_state>")
    assert old.unk_id in old.encode("<next_state>You carry: nothing.</next_state>")


def test_a_smaller_target_vocabulary_is_refused():
    old, new = word_tokenizer("rooms_wm"), word_tokenizer("rooms")
    config = model_configs.tiny(vocab_size=padded_vocab_size(old), compute_dtype="float32", remat_policy="none")
    params = qwen3.init_params(config, jax.random.key(0))
    with pytest.raises(ValueError, match="not in the new one"):
        vocab_transfer.transfer(config, params, old, new)
