"""A word-level tokenizer for small closed-vocabulary testbeds (e.g. the `rooms` env).

Why: Qwen3's 151,936-row vocabulary makes the embedding and LM head of a tiny model dominate
its cost on CPU; a testbed that writes a few dozen words needs a few hundred ids.

Text is split into pieces: a run of ASCII letters, one digit, or one other non-space character,
each optionally with the one space before it, and any other single whitespace character (so
"go to red" is three pieces: "go", " to", " red"). A piece in the vocabulary gets its id; any
other piece gets `unk_id` (decoded as U+FFFD), so encoding never fails. Every letter-word of
`words` (and of the chat roles, `CHAT_WORDS`) is in the vocabulary with and without its
leading space, as are the digits, the printable ASCII punctuation, "\\n", " " and "\\t".

Control tokens are Qwen3's chat structure tokens (<|im_start|>, <|im_end|>, <think>, ...), so
`jaxscaffold.models.chat.Qwen3ChatRenderer` renders chats with it unchanged. As with the other
tokenizers, `encode` treats all text as data: "<|im_end|>" in a message becomes the pieces
"<", "|", "im", ... (or unk), never the control id.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

from jaxscaffold.models.tokenizer import Tokenizer

# The structure tokens the Qwen3 chat renderer writes, plus <|endoftext|> (an end of generation).
CONTROL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
)
# The roles the chat renderer writes as text after <|im_start|>: always in the vocabulary.
CHAT_WORDS: tuple[str, ...] = ("system", "user", "assistant", "tool")
UNK_TEXT = "\ufffd"
_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\s")
_WORD = re.compile(r"[A-Za-z]+")


def pieces(text: str) -> list[str]:
    """The pieces `text` is split into (they concatenate back to `text`)."""
    return _PIECE.findall(text)


class WordTokenizer(Tokenizer):
    """Word-level ids over a fixed word list; ids: control tokens, unk, then the pieces (in
    a deterministic order: the sorted words, then digits and punctuation)."""

    def __init__(self, words: Iterable[str]):
        found = sorted({w for text in (*words, *CHAT_WORDS) for w in _WORD.findall(text)})
        chars = list(string.digits) + list(string.punctuation)
        vocab = [p for w in found for p in (w, " " + w)] + [p for c in chars for p in (c, " " + c)]
        vocab += ["\n", " ", "\t"]
        self._special = {tok: i for i, tok in enumerate(CONTROL_TOKENS)}
        self.unk_id = len(CONTROL_TOKENS)
        start = self.unk_id + 1
        self._ids = {p: start + i for i, p in enumerate(vocab)}
        self._text = [*CONTROL_TOKENS, UNK_TEXT, *vocab]
        self.words = tuple(found)

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(p, self.unk_id) for p in pieces(text)]

    def decode(self, ids: Iterable[int]) -> str:
        n = len(self._text)
        return "".join(self._text[i] for i in map(int, ids) if 0 <= i < n)

    @property
    def vocab_size(self) -> int:
        return len(self._text)

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self._special)

    def save_hf(self, directory: str) -> None:
        """Writes this vocabulary as an HF fast tokenizer (`tokenizer.json`: a WordLevel model
        behind the same piece regex; `tokenizer_config.json`), so an exported testbed model
        loads with its own words in transformers (`AutoTokenizer.from_pretrained`). It encodes
        and decodes text as `encode` / `decode` do, except that HF matches the control tokens'
        strings inside text (`split_special_tokens=True` makes them data, as here)."""
        import json
        import os

        from tokenizers import Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        hf = HFTokenizer(models.WordLevel({text: i for i, text in enumerate(self._text)}, unk_token=UNK_TEXT))
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(_PIECE.pattern), behavior="isolated")
        hf.decoder = decoders.Fuse()  # pieces carry their own spaces: concatenate them
        hf.add_special_tokens(list(CONTROL_TOKENS))
        os.makedirs(directory, exist_ok=True)
        hf.save(os.path.join(directory, "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": UNK_TEXT, "eos_token": "<|im_end|>",
                  "pad_token": "<|endoftext|>", "model_max_length": 1 << 20}
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=1)


def padded_vocab_size(tokenizer: Tokenizer, multiple: int = 64) -> int:
    """Embedding rows for `tokenizer`: its size rounded up (ids past it decode to nothing)."""
    return -(-tokenizer.vocab_size // multiple) * multiple
