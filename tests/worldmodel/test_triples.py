"""Trajectories -> triples: every transition once, with its history; dedupe; round trip."""

from jaxscaffold.worldmodel import triples as T


def test_each_transition_has_its_history_and_next_observation():
    obs, acts = ["o0", "o1", "o2", "o3"], ["a0", "a1", "a2"]
    out = T.from_trajectory("alfworld", "g1", obs, acts)
    assert [(t.observation, t.action, t.next_state) for t in out] == [("o0", "a0", "o1"), ("o1", "a1", "o2"),
                                                                      ("o2", "a2", "o3")]
    assert out[2].history == (("o0", "a0"), ("o1", "a1"))
    # A trajectory cut by a failure (no observation after the last action) loses that step only.
    assert len(T.from_trajectory("alfworld", "g1", obs[:3], acts)) == 2


def test_dedupe_keeps_first_occurrences_and_statistics_count_them():
    a = T.from_trajectory("alfworld", "g1", ["o0", "o1", "o2"], ["a0", "a1"])
    b = T.from_trajectory("alfworld", "g1", ["o0", "o1", "o1"], ["a0", "b1"])  # same first step
    unique = T.dedupe(a + b)
    assert unique == a + b[1:]
    s = T.statistics(a + b, unique)
    assert s["triples/raw"] == 4 and s["triples/unique"] == 3 and s["triples/duplicate_share"] == 0.25
    assert s["triples/unchanged_share"] == 1 / 3  # o1 --b1--> o1


def test_save_and_load_round_trip(tmp_path):
    ts = T.from_trajectory("alfworld", "g1", ["o0", "o1", "o2"], ["a0", "a1"])
    T.save(str(tmp_path / "t.jsonl"), ts, split=["train", "heldout"], kept=[True, False])
    back, cols = T.load(str(tmp_path / "t.jsonl"))
    assert back == ts and cols == [{"split": "train", "kept": True}, {"split": "heldout", "kept": False}]


def test_triples_keep_their_task_category_and_older_files_load(tmp_path):
    import json
    ts = T.from_trajectory("tau2", "retail/5", ["o0", "o1", "o2"], ["a0", "a1"], category="retail")
    assert {t.category for t in ts} == {"retail"}
    assert ts[0].key() == T.from_trajectory("tau2", "retail/5", ["o0", "o1"], ["a0"])[0].key()  # not identity
    T.save(str(tmp_path / "t.jsonl"), ts, split=["train", "train"])
    back, cols = T.load(str(tmp_path / "t.jsonl"))
    assert back == ts and cols == [{"split": "train"}] * 2
    old = {k: v for k, v in ts[0].to_json().items() if k != "category"}  # a file written before the field
    (tmp_path / "old.jsonl").write_text(json.dumps(old) + "\n")
    assert T.load(str(tmp_path / "old.jsonl"))[0][0].category == ""
