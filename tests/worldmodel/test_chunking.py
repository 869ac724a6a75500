"""Chunking long texts for an embedder: every chunk within the limit, nothing lost, the
coarsest boundary that works (lines, then sentences, list items, commas, words, characters)."""

import pytest

from jaxscaffold.worldmodel.chunking import split_text


def words(text):
    return len(text.split())


def test_a_text_within_the_limit_is_its_own_chunk():
    assert split_text("a b c", words, 3) == ["a b c"]
    assert split_text("", words, 3) == [""]


def test_lines_are_packed_whole_and_nothing_is_lost():
    text = "one two\nthree four\nfive six\nseven"
    chunks = split_text(text, words, 4)
    assert chunks == ["one two\nthree four\n", "five six\nseven"]
    assert "".join(chunks) == text


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 8])
def test_every_chunk_fits_and_the_chunks_rebuild_the_text(limit):
    text = ("You arrive at cabinet 1. On the cabinet 1, you see a mug 2, a plate 1, and a fork 3.\n"
            '{"order_id":"#W1","status":"pending","items":[{"name":"lamp","price":12.5}]}\n' * 3)
    chunks = split_text(text, words, limit)
    assert "".join(chunks) == text
    assert all(words(c) <= limit for c in chunks)


def test_a_long_line_is_cut_at_sentences_then_list_items():
    text = "a b c. d e f. g h, i j, k l"
    assert split_text(text, words, 3) == ["a b c. ", "d e f. ", "g h, ", "i j, ", "k l"]


def test_compact_json_is_cut_between_fields():
    text = '{"a":"x y","b":"z w","c":"v u"}'
    assert split_text(text, words, 2) == ['{"a":"x y",', '"b":"z w",', '"c":"v u"}']


def test_an_unbroken_run_is_cut_by_characters():
    chunks = split_text("abcdefghij", len, 4)
    assert chunks == ["abcd", "efgh", "ij"]


def test_a_limit_below_one_token_is_refused():
    with pytest.raises(ValueError, match="at least one token"):
        split_text("abc", len, 0)
