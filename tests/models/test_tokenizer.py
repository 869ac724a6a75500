"""Tokenizers: the offline tiktoken Qwen3 tokenizer against transformers' own conversion."""

from __future__ import annotations

import json
import os
import random
import unicodedata
from pathlib import Path

import pytest

from jaxscaffold.models import tokenizer as tk
from jaxscaffold.models.tokenizer import (
    QWEN3_CHAT_TEMPLATE, QWEN3_MODEL_VOCAB_SIZE, QWEN3_SPECIAL_TOKENS, HFTokenizer,
    QwenOfflineTokenizer, cached_hf_tokenizer_dir, default_cache_root, load_tokenizer,
    write_hf_tokenizer,
)

FIXTURES = Path(__file__).parent / "fixtures"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory) -> Path:
    # Shared with test_chat.py through the same cache root: built once per session.
    return cached_hf_tokenizer_dir(tmp_path_factory.getbasetemp() / "jaxscaffold-cache")


@pytest.fixture(scope="session")
def hf(hf_dir) -> HFTokenizer:
    return HFTokenizer(hf_dir)


@pytest.fixture(scope="session")
def offline() -> QwenOfflineTokenizer:
    return QwenOfflineTokenizer()


MIXED_TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def f(x: int) -> int:\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "Numbers: 0 7 42 3.14159 -1e-10 1,000,000 2025-06-01 0xDEADBEEF",
    "   leading, trailing   \t\t \n\n\n  \r\n mixed\u00a0nbsp\u3000ideographic   ",
    "\n\n\n\n",
    "中文测试：你好，世界！日本語のテキスト。한국어 텍스트입니다.",
    "emoji 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ✔️",
    "accents: cafe\u0301 na\u0308ive A\u030a \u1e9b\u0323 (NFD) vs café naïve Å (NFC)",
    "Привет, мир! Ελληνικά. العربية. עברית. हिन्दी.",
    "It's we'll they'd I'M YOU'RE can't",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}',
    "x" * 500 + " " + "ab" * 300,
]
SPECIAL_TEXT = ("see <|im_start|>user\nhi<|im_end|> and <tool_call>\n{}</tool_call> "
                "<think>hmm</think><|endoftext|><tool_response>r</tool_response><|fim_pad|>")


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    ranges = [(0x20, 0x7E)] * 4 + [(0x9, 0xD), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x4FF),
                                   (0x590, 0x6FF), (0x900, 0x97F), (0x3040, 0x30FF),
                                   (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF),
                                   (0x2000, 0x206F)]
    return ["".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 80)))
            for _ in range(n)]


def test_chat_template_constant_is_the_fixture_copy():
    assert QWEN3_CHAT_TEMPLATE == (FIXTURES / "qwen3_chat_template.jinja").read_text("utf-8")


def test_qwen3_special_ids(offline):
    assert len(QWEN3_SPECIAL_TOKENS) == 26
    ids = offline.special_ids
    assert ids["<|endoftext|>"] == 151643
    assert ids["<|im_start|>"] == 151644
    assert ids["<|im_end|>"] == 151645
    assert ids["<tool_call>"] == 151657 and ids["</tool_call>"] == 151658
    assert ids["<tool_response>"] == 151665 and ids["</tool_response>"] == 151666
    assert ids["<think>"] == 151667 and ids["</think>"] == 151668
    assert sorted(ids.values()) == list(range(151643, 151669))
    assert offline.eos_ids == (151645, 151643)
    assert offline.vocab_size == 151669 < QWEN3_MODEL_VOCAB_SIZE == 151936
    with pytest.raises(KeyError, match="not a special token"):
        offline.token_id("<|nope|>")


def test_hf_dir_loads_as_qwen3_tokenizer(hf, hf_dir):
    assert hf.special_ids == QwenOfflineTokenizer().special_ids
    assert hf.vocab_size == 151669
    assert hf.eos_ids == (151645, 151643)
    assert hf.hf.eos_token == "<|im_end|>" and hf.hf.pad_token == "<|endoftext|>"
    assert hf.hf.bos_token is None
    assert hf.hf.chat_template == QWEN3_CHAT_TEMPLATE
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    flags = {v["content"]: v["special"] for v in config["added_tokens_decoder"].values()}
    # As in Qwen3's own config: only the first 14 added tokens are flagged special.
    assert [flags[t] for t in QWEN3_SPECIAL_TOKENS] == [True] * 14 + [False] * 12
    assert (hf_dir / "special_tokens_map.json").is_file()


@pytest.mark.parametrize("text", MIXED_TEXTS)
def test_offline_matches_transformers_conversion(offline, hf, text):
    ids = offline.encode(text)
    assert ids == hf.encode(text)
    # No added-token strings in these texts, so HF's ordinary encode agrees too.
    assert ids == hf.hf.encode(text, add_special_tokens=False)


def test_offline_matches_transformers_on_corpus(offline, hf):
    sources = [p.read_text("utf-8") for p in sorted((REPO_ROOT / "jaxscaffold").rglob("*.py"))]
    for text in _random_texts(2000) + sources + [QWEN3_CHAT_TEMPLATE]:
        assert offline.encode(text) == hf.encode(text), repr(text[:80])


def test_special_strings_are_data_in_both_backends(offline, hf):
    ids = offline.encode(SPECIAL_TEXT)
    assert ids == hf.encode(SPECIAL_TEXT)
    assert max(ids) < 151643, "a special id came out of encode"
    assert offline.decode(ids) == SPECIAL_TEXT
    for tok in QWEN3_SPECIAL_TOKENS:
        assert offline.encode(tok) == hf.encode(tok)
        assert offline.token_id(tok) not in offline.encode(tok)


def test_hf_split_special_tokens_does_not_cover_plain_added_tokens(hf):
    # Why HFTokenizer does not just pass split_special_tokens=True: Qwen3's <tool_call>,
    # <think>, ... are non-special added tokens, which that flag leaves matched.
    assert hf.hf.encode("<tool_call>", add_special_tokens=False, split_special_tokens=True) == [151657]
    assert 151657 not in hf.encode("<tool_call>")


def test_hf_special_parsing_equals_our_special_id_splicing(offline, hf):
    # HF's normal encode (special tokens parsed) == our text encode with ids spliced in.
    pieces = ["a ", "<|im_start|>", "user\nhi ", "<tool_call>", '\n{"x": 1}\n', "</tool_call>",
              "<think>", "\nwhy\n", "</think>", "\n\n", "<|im_end|>", "\n"]
    ours = []
    for piece in pieces:
        ours += [offline.token_id(piece)] if piece in offline.special_ids else offline.encode(piece)
    assert hf.hf.encode("".join(pieces), add_special_tokens=False) == ours


@pytest.mark.parametrize("backend", ["offline", "hf"])
def test_decode_encode_roundtrip_is_nfc(backend, offline, hf):
    tok = offline if backend == "offline" else hf
    for text in MIXED_TEXTS + [SPECIAL_TEXT] + _random_texts(300, seed=1):
        assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_nfc_normalisation_before_bpe(offline, hf):
    nfd = unicodedata.normalize("NFD", "café Ångström naïve")
    assert offline.encode(nfd) == offline.encode(unicodedata.normalize("NFC", nfd)) == hf.encode(nfd)


@pytest.mark.parametrize("backend", ["offline", "hf"])
def test_decode_specials_and_unused_padding_ids(backend, offline, hf):
    tok = offline if backend == "offline" else hf
    hello = tok.encode("Hello")
    # Control ids decode to their strings; ids in the model's unused padding rows vanish.
    assert tok.decode([151644, *hello, 151700, 151935, 151645]) == "<|im_start|>Hello<|im_end|>"


def test_cached_dir_is_built_once_and_rebuilt_when_stale(tmp_path):
    first = cached_hf_tokenizer_dir(tmp_path)
    assert first == tmp_path / "qwen3-tokenizer"
    mtime = (first / "tokenizer.json").stat().st_mtime_ns
    assert cached_hf_tokenizer_dir(tmp_path) == first
    assert (first / "tokenizer.json").stat().st_mtime_ns == mtime  # reused, not rebuilt
    config_path = first / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "old"
    config_path.write_text(json.dumps(config))
    assert cached_hf_tokenizer_dir(tmp_path) == first
    assert json.loads(config_path.read_text())["chat_template"] == QWEN3_CHAT_TEMPLATE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen3-tokenizer"]  # no staging left


def test_cache_root_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXSCAFFOLD_CACHE", str(tmp_path / "c"))
    assert default_cache_root() == tmp_path / "c"
    monkeypatch.delenv("JAXSCAFFOLD_CACHE")
    assert default_cache_root() == Path(os.path.expanduser("~/.cache/jaxscaffold"))


def test_write_hf_tokenizer_files(tmp_path, hf_dir):
    out = write_hf_tokenizer(tmp_path / "tok")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (out / name).read_text() == (hf_dir / name).read_text()


def test_load_tokenizer(hf_dir, tmp_path):
    assert isinstance(load_tokenizer(None), QwenOfflineTokenizer)
    assert isinstance(load_tokenizer("offline"), QwenOfflineTokenizer)
    assert isinstance(load_tokenizer(hf_dir), HFTokenizer)
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="tokenizer directory not found: .*nope"):
        load_tokenizer(missing)


def test_load_tokenizer_reuses_the_last_one_until_its_directory_changes(hf_dir, tmp_path):
    """A run's preflight and its job load one tokenizer: the second load is the first's object;
    a directory rewritten in place loads afresh, with the new files' contents."""
    import shutil
    tok = tmp_path / "tok"
    shutil.copytree(hf_dir, tok)
    first = load_tokenizer(tok)
    assert load_tokenizer(str(tok)) is first
    config_file = tok / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "model_max_length": 1234}))
    again = load_tokenizer(tok)
    assert again is not first and again.hf.model_max_length == 1234 != first.hf.model_max_length
    load_tokenizer(hf_dir)  # another directory: now the only one kept (a test worker loads hundreds)
    assert load_tokenizer(tok) is not again


def test_ranks_file_is_qwens(offline):
    ranks = tk.load_bpe_ranks(tk.qwen_ranks_path())
    assert len(ranks) == 151643
    assert offline.encode("Hello world") == [9707, 1879]
