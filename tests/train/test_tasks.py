"""Task specs ("env:split:n") and the training task stream."""

import pytest

from jaxscaffold.train.tasks import TaskSpec, TaskStream, env_names, load_tasks, parse_task_spec


def test_task_spec_entries():
    assert parse_task_spec(" sciworld:train:4, bfcl:validation ,letters::2,") == [
        TaskSpec("sciworld", "train", 4), TaskSpec("bfcl", "validation"), TaskSpec("letters", "", 2)]
    assert env_names("sciworld,bfcl:validation") == ["sciworld", "bfcl"]
    for bad in ("letters:test:x", "letters:a:1:2"):
        with pytest.raises(ValueError, match="task spec entry"):
            parse_task_spec(bad)


def test_load_tasks_takes_each_entrys_split_and_count():
    tests = load_tasks("letters", "test")
    assert tests and {t.split for t in tests} == {"test"}
    assert load_tasks("letters::2", "test") == tests[:2]
    assert load_tasks("letters", "test", limit=3) == tests[:3]
    assert load_tasks("letters:train:1,letters", "test", limit=2) == load_tasks("letters", "train")[:1] + tests[:2]


def test_task_stream_resumes_where_it_was():
    stream = TaskStream(list(range(5)), seed=3)
    first = stream.take(7)
    assert sorted(first[:5]) == list(range(5))  # an epoch is a permutation
    state = stream.get_state()
    rest = stream.take(4)
    again = TaskStream(list(range(5)), seed=3)
    again.set_state(state)
    assert again.take(4) == rest
    with pytest.raises(ValueError, match="no training tasks"):
        TaskStream([], seed=0)
