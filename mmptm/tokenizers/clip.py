"""CLIP's byte-level BPE tokenizer (OpenAI CLIP, open_clip), behind mmptm's tokenizer interface.

Every open_clip model with the built-in text tower reads ids of this tokenizer: text cleaned
by ftfy, HTML-unescaped, whitespace-collapsed and lower-cased; split by CLIP's regex (letters,
single digits, runs of other symbols, English contractions); each word's UTF-8 bytes mapped
to printable characters and merged by the ranks of ``bpe_simple_vocab_16e6.txt.gz``; the
last piece of a word ends in ``</w>``. The vocabulary is the 256 byte characters, the same
with ``</w>``, the 48 894 merges and ``<start_of_text>`` / ``<end_of_text>``: 49 408 ids.
An input is ``<start_of_text> ids <end_of_text>``, truncated to ``max_len`` with the end
token kept, padded with 0 — ``open_clip.tokenize`` exactly.

One deliberate difference: as every mmptm tokenizer, ``encode`` never produces a special id,
so a literal ``<end_of_text>`` in a caption is split into ordinary pieces (open_clip maps it
to the special, and then pools its text tower there). The closing end token is thereby the
only one and the last real token of every input, which is where ``pooling: last`` reads.
"""

from __future__ import annotations

import gzip
import html
import itertools
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import ftfy
import regex

__all__ = ["ClipTokenizer"]

#: open_clip's SimpleTokenizer reads this many ids' worth of merges from the file
_N_MERGES = 49152 - 256 - 2
SOT, EOT = "<start_of_text>", "<end_of_text>"
#: CLIP's pre-tokenizer, without the alternatives that would match the specials in text
_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""", regex.IGNORECASE
)
#: end-of-word mark of the last piece of each word
END_OF_WORD = "</w>"


@cache
def byte_chars() -> dict[int, str]:
    """Each byte → a printable character (GPT-2 / CLIP): printable Latin-1 bytes map to
    themselves, the rest to code points from 256 up, so no piece holds whitespace."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars = dict(zip(keep, map(chr, keep)))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def clean(text: str) -> str:
    """open_clip's ``lower`` cleaning: ftfy, HTML unescaped twice, whitespace, lower case."""
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return " ".join(text.split()).lower()


class ClipTokenizer:
    """CLIP's BPE over a merges file (``bpe_simple_vocab_16e6.txt.gz``); the same methods and
    properties as :class:`mmptm.tokenizers.sentencepiece.Tokenizer` that the text plug-in and the
    model read. No languages, no mask token (``mask_id`` -1), no word-start marks."""

    def __init__(self, merges_gz: bytes, name: str = "bpe_simple_vocab_16e6.txt.gz") -> None:
        """Build from the bytes of a gzipped merges file (first line a version header)."""
        self._raw = bytes(merges_gz)
        self.name = name
        try:
            lines = gzip.decompress(self._raw).decode("utf-8").split("\n")
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise ValueError(f"{name}: not a gzipped UTF-8 BPE merges file ({e})") from None
        merges = []
        for n, line in enumerate(lines[1 : 1 + _N_MERGES], start=2):
            pair = tuple(line.split())
            if len(pair) != 2:
                raise ValueError(f"{name} line {n}: expected a merge 'a b', got {line!r}")
            merges.append(pair)
        chars = list(byte_chars().values())
        vocab = [*chars, *(c + END_OF_WORD for c in chars), *("".join(m) for m in merges)]
        vocab += [SOT, EOT]
        self._ids = {piece: i for i, piece in enumerate(vocab)}
        if len(self._ids) != len(vocab):
            raise ValueError(f"{name}: the merges give duplicate pieces")
        self._pieces = vocab
        self._ranks = {pair: i for i, pair in enumerate(merges)}
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def load(cls, path: str | Path) -> ClipTokenizer:
        """The tokenizer of a ``.txt.gz`` merges file (open_clip ships one)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"CLIP BPE merges file not found: {path}")
        return cls(path.read_bytes(), path.name)

    def save(self, path: str | Path) -> Path:
        """Write the merges file to ``path`` (``load`` reads it back); returns ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self._raw)
        return path

    def __getstate__(self) -> dict[str, Any]:
        return {"merges_gz": self._raw, "name": self.name}  # loader workers rebuild the rest

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["merges_gz"], state["name"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ClipTokenizer({self.name!r}, vocab_size={self.vocab_size})"

    # -- ids ------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def pad_id(self) -> int:
        """0, as open_clip pads (the piece "!": padding sits after the end token, where a
        causal tower's pooled token never looks)."""
        return 0

    @property
    def cls_id(self) -> int:
        """``<start_of_text>``, which starts every input."""
        return self._ids[SOT]

    @property
    def sep_id(self) -> int:
        """``<end_of_text>``, which ends every input."""
        return self._ids[EOT]

    @property
    def mask_id(self) -> int:
        """-1: CLIP's vocabulary has no mask token."""
        return -1

    @property
    def languages(self) -> list[str]:
        return []

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset({self.cls_id, self.sep_id})

    @property
    def word_start_ids(self) -> frozenset[int]:
        """Empty: CLIP's pieces mark word ends (``</w>``), not starts."""
        return frozenset()

    def is_special(self, tok_id: int) -> bool:
        return int(tok_id) in self.special_ids

    def lang_index(self, lang: str) -> int:
        raise ValueError(f"unknown language {lang!r}: CLIP's BPE tokenizer has no languages")

    def lang_tag_id(self, lang: str) -> int:
        return self.lang_index(lang)

    def id_to_piece(self, tok_id: int) -> str:
        tok_id = int(tok_id)
        if not 0 <= tok_id < self.vocab_size:
            raise ValueError(f"id {tok_id} outside vocabulary of size {self.vocab_size}")
        return self._pieces[tok_id]

    # -- text -----------------------------------------------------------------------------

    def _word_ids(self, word: str) -> list[int]:
        """Ids of one pre-tokenized word: its bytes as characters, merged by rank."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        chars = byte_chars()
        parts = [chars[b] for b in word.encode("utf-8")]
        parts[-1] += END_OF_WORD
        while len(parts) > 1:
            ranked = [
                (self._ranks[pair], i)
                for i, pair in enumerate(itertools.pairwise(parts))
                if pair in self._ranks
            ]
            if not ranked:
                break
            best = parts[min(ranked)[1]], parts[min(ranked)[1] + 1]
            merged, i = [], 0
            while i < len(parts):  # every occurrence of the best pair, left to right
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = [self._ids[p] for p in parts]
        if len(self._cache) < 200_000:  # bounded: captions bring endless new words
            self._cache[word] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Ids of the pieces of ``text``; no start / end token and never a special."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids: list[int] = []
        for word in _PATTERN.findall(clean(text)):
            ids += self._word_ids(word)
        return ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        raise ValueError(
            "CLIP's BPE tokenizer gives no character offsets (its cleaning rewrites the text): "
            "text span annotations need a sentencepiece tokenizer"
        )

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (lower-cased, as encoded), skipping the specials."""
        pieces = "".join(self.id_to_piece(i) for i in ids if not self.is_special(i))
        to_byte = {c: b for b, c in byte_chars().items()}  # "</w>" is four of these
        text = bytes(to_byte[c] for c in pieces).decode("utf-8", errors="replace")
        return text.replace(END_OF_WORD, " ").strip()

    def build_inputs(
        self, ids_a: list[int], ids_b: list[int] | None = None, max_len: int = 77
    ) -> tuple[list[int], list[int]]:
        """``<start_of_text> a <end_of_text>`` cut to ``max_len`` (the end token kept, as
        ``open_clip.tokenize``) and its segment ids (all 0)."""
        if ids_b is not None:
            raise ValueError("CLIP's BPE tokenizer encodes single sentences, not pairs")
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2 to hold the start and end, got {max_len}")
        ids = [self.cls_id, *list(ids_a)[: max_len - 2], self.sep_id]
        return ids, [0] * len(ids)
