"""The shared multilingual sentencepiece tokenizer: training it and using it.

``train_tokenizer`` builds a sentencepiece model from plain text files and webdataset tar
shards; ``Tokenizer`` wraps any sentencepiece ``.model`` file with the special tokens the
pre-training objectives need ([PAD], [UNK], [CLS], [SEP], [MASK] and one tag per language).
With ``id_scheme="fairseq"`` it reproduces the ids of XLM-R checkpoints (see ``Tokenizer``).
``load_tokenizer`` reads ``data.tokenizer``: a sentencepiece model, or CLIP's BPE merges
(``.txt.gz``, :class:`~mmptm.tokenizers.clip.ClipTokenizer`) for imported OpenCLIP runs.
"""

from __future__ import annotations

import glob
import io
import json
import logging
import random
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sentencepiece as spm

from mmptm.data.shards import SkipCounter, tar_samples
from mmptm.modalities.sentences import sample_texts

if TYPE_CHECKING:
    from mmptm.tokenizers.clip import ClipTokenizer

__all__ = [
    "ID_SCHEMES",
    "SPECIALS",
    "Tokenizer",
    "lang_tag",
    "load_tokenizer",
    "train_tokenizer",
]

log = logging.getLogger(__name__)

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Role names used by the sidecar json and in error messages, in SPECIALS order.
ROLES = ("pad", "unk", "cls", "sep", "mask")
# Pieces tried, in order, when a model lacks our own special (XLM-R / fairseq conventions).
_FALLBACK_PIECES = {
    "pad": ("<pad>",),
    "unk": ("<unk>",),
    "cls": ("<s>",),
    "sep": ("</s>",),
    "mask": ("<mask>",),
}
# fairseq's dictionary (XLM-R, RoBERTa): these four come first, then sentencepiece id + 1.
_FAIRSEQ_ROLES = {"cls": ("<s>", 0), "pad": ("<pad>", 1), "sep": ("</s>", 2), "unk": ("<unk>", 3)}
_FAIRSEQ_OFFSET = 1
#: ``sentencepiece``: the model's own ids; ``fairseq``: XLM-R / HF ``XLMRobertaTokenizer`` ids
ID_SCHEMES = ("sentencepiece", "fairseq")
#: sentencepiece's word-boundary mark: a piece starting with it begins a word
WORD_START = "\u2581"
_LANG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_TAG_RE = re.compile(r"\[([A-Za-z0-9][A-Za-z0-9_-]*)\]")
_SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_GLOB_CHARS = frozenset("*?[{")


def lang_tag(lang: str) -> str:
    """The piece that tags ``lang``, e.g. ``"[en]"``."""
    return f"[{lang}]"


def _check_languages(languages: Iterable[str]) -> list[str]:
    out: list[str] = []
    for lang in languages:
        if not isinstance(lang, str) or not _LANG_RE.fullmatch(lang):
            raise ValueError(
                f"invalid language code {lang!r}: use letters, digits, '-' or '_' (e.g. 'en')"
            )
        if lang_tag(lang) in SPECIALS:
            raise ValueError(f"language code {lang!r} clashes with special {lang_tag(lang)}")
        if lang not in out:
            out.append(lang)
    return out


class Tokenizer:
    """Sentencepiece tokenizer with the specials and language tags the objectives need.

    Usually built with ``Tokenizer.load(path)`` or returned by ``train_tokenizer``. With the
    default ``id_scheme="sentencepiece"`` ids are those of the sentencepiece model, except that
    specials the model lacks get new ids.

    ``id_scheme="fairseq"`` gives the ids of XLM-R checkpoints (fairseq's dictionary, as HF's
    ``XLMRobertaTokenizer``): ``<s>``=0 (CLS), ``<pad>``=1, ``</s>``=2 (SEP), ``<unk>``=3, every
    other piece its sentencepiece id + 1, and ``<mask>`` appended last (sentencepiece size + 1).
    The model's own first three pieces (``<unk>``, ``<s>``, ``</s>``) are never produced under
    their shifted ids. ``Tokenizer.from_xlmr(path)`` loads an XLM-R ``sentencepiece.bpe.model``
    this way; ``save`` records the scheme in the sidecar json (``"id_scheme": "fairseq"``) so
    that ``Tokenizer.load`` (and hence ``data.tokenizer``) restores it.

    Specials are resolved per role, first hit wins:

    - the piece named in the sidecar json, then our own piece (``SPECIALS``);
    - a fallback piece of foreign (XLM-R style) models: CLS -> ``<s>``, SEP -> ``</s>``,
      PAD -> ``<pad>``, MASK -> ``<mask>``;
    - the id the model declares for that role (unk, pad, bos for CLS, eos for SEP);
    - otherwise a new id appended after the sentencepiece vocabulary, in ``SPECIALS`` order,
      then language tags the model lacks. ``vocab_size`` counts appended ids, so an embedding
      of that size covers everything; ``encode`` never produces them.

    ``encode`` never produces a special either: our specials are sentencepiece control
    symbols, which are not matched in text, so a literal "[MASK]" is split into ordinary
    pieces. (UNK is the exception only for characters outside the model's alphabet.)
    The role-resolution rules above apply to the sentencepiece scheme only; the fairseq
    scheme's specials are fixed and take no ``specials`` overrides.
    """

    def __init__(
        self,
        model_proto: bytes,
        *,
        languages: Sequence[str] | None = None,
        specials: Mapping[str, str] | None = None,
        id_scheme: str = "sentencepiece",
    ) -> None:
        """Wrap a serialized sentencepiece model; ``specials`` maps role -> piece overrides."""
        if id_scheme not in ID_SCHEMES:
            raise ValueError(f"unknown id_scheme {id_scheme!r}; known: {ID_SCHEMES}")
        self._id_scheme = id_scheme
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor()
        self._sp.LoadFromSerializedProto(self._proto)
        self._specials_given = dict(specials or {})
        unknown_roles = set(self._specials_given) - set(ROLES)
        if unknown_roles:
            raise ValueError(f"unknown special roles {sorted(unknown_roles)}; known: {ROLES}")
        sp_size = self._sp.get_piece_size()
        if languages is None:
            languages = self._languages_from_model()
        self._languages = _check_languages(languages)

        # Shift applied to every sentencepiece id: fairseq put its own four specials first.
        self._id_offset = _FAIRSEQ_OFFSET if id_scheme == "fairseq" else 0
        self._appended: list[str] = []
        self._role_ids: dict[str, int] = {}
        if id_scheme == "fairseq":
            self._init_fairseq_roles(sp_size)
        else:
            for role, ours in zip(ROLES, SPECIALS):
                self._role_ids[role] = self._resolve(role, ours, sp_size)
        self._lang_ids = [self._piece_id(lang_tag(lang), sp_size) for lang in self._languages]

        controls = {
            self._from_sp(i)
            for i in range(sp_size)
            if self._sp.is_control(i) or self._sp.is_unknown(i)
        }
        appended = range(self._id_offset + sp_size, self.vocab_size)
        self._special_ids = frozenset(
            {*self._role_ids.values(), *self._lang_ids, *controls, *appended}
        )
        self._word_starts: frozenset[int] | None = None

    # -- construction helpers -------------------------------------------------------------

    def _init_fairseq_roles(self, sp_size: int) -> None:
        if self._specials_given:
            raise ValueError("id_scheme='fairseq' has fixed specials; 'specials' must be empty")
        # Shifted by one, pieces 0..2 would land on <pad>/</s>/<unk>: only XLM-R's layout
        # (unk, bos, eos: no text pieces there) keeps every text piece distinct.
        for sp_id in range(min(3, sp_size)):
            if not (self._sp.is_control(sp_id) or self._sp.is_unknown(sp_id)):
                raise ValueError(
                    f"id_scheme='fairseq' needs an XLM-R style sentencepiece model (pieces 0-2 "
                    f"<unk>, <s>, </s>); piece {sp_id} is the text piece "
                    f"{self._sp.id_to_piece(sp_id)!r}"
                )
        self._role_ids = {role: fid for role, (_, fid) in _FAIRSEQ_ROLES.items()}
        self._role_ids["mask"] = self._append("<mask>", sp_size)

    def _from_sp(self, sp_id: int) -> int:
        if self._id_scheme == "fairseq" and self._sp.is_unknown(sp_id):
            return self._role_ids["unk"]  # as HF: the model's own <unk> is fairseq's 3
        return sp_id + self._id_offset

    def _to_sp(self, tok_id: int) -> int:
        return tok_id - self._id_offset

    def _find_piece(self, piece: str) -> int | None:
        sp_id = self._sp.piece_to_id(piece)
        # piece_to_id answers unk for a missing piece, so confirm the round trip.
        if self._sp.id_to_piece(sp_id) == piece:
            return self._from_sp(sp_id)
        return None

    def _append(self, piece: str, sp_size: int) -> int:
        self._appended.append(piece)
        return self._id_offset + sp_size + len(self._appended) - 1

    def _piece_id(self, piece: str, sp_size: int) -> int:
        found = self._find_piece(piece)
        return found if found is not None else self._append(piece, sp_size)

    def _resolve(self, role: str, ours: str, sp_size: int) -> int:
        taken = set(self._role_ids.values())
        candidates: list[int | None] = []
        pieces = [self._specials_given.get(role), ours, *_FALLBACK_PIECES[role]]
        candidates += [self._find_piece(p) for p in pieces if p]
        declared = {
            "pad": self._sp.pad_id(),
            "unk": self._sp.unk_id(),
            "cls": self._sp.bos_id(),
            "sep": self._sp.eos_id(),
        }.get(role, -1)
        if declared >= 0:
            candidates.append(self._from_sp(declared))
        for cand in candidates:
            # Two roles sharing an id would make e.g. padding indistinguishable from [SEP].
            if cand is not None and cand not in taken:
                return cand
        return self._append(self._specials_given.get(role, ours), sp_size)

    def _languages_from_model(self) -> list[str]:
        # Without a sidecar, our own models still carry their tags as control symbols.
        langs = []
        for i in range(self._sp.get_piece_size()):
            piece = self._sp.id_to_piece(i)
            m = _TAG_RE.fullmatch(piece)
            if m and self._sp.is_control(i) and piece not in SPECIALS:
                langs.append(m.group(1))
        return langs

    # -- loading and pickling -------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a sentencepiece ``.model`` file (or ``<prefix>``) plus its sidecar json if any."""
        path = Path(path)
        if not path.is_file() and Path(f"{path}.model").is_file():
            path = Path(f"{path}.model")
        if not path.is_file():
            raise FileNotFoundError(f"sentencepiece model not found: {path}")
        languages: list[str] | None = None
        specials: dict[str, str] | None = None
        id_scheme = "sentencepiece"
        sidecar = path.with_suffix(".json")
        if sidecar.is_file():
            meta = json.loads(sidecar.read_text(encoding="utf-8"))
            if not isinstance(meta, dict):
                raise ValueError(f"{sidecar}: expected a json object")
            languages = meta.get("languages")
            specials = meta.get("specials")
            if languages is not None and not isinstance(languages, list):
                raise ValueError(f"{sidecar}: 'languages' must be a list")
            if specials is not None and not isinstance(specials, dict):
                raise ValueError(f"{sidecar}: 'specials' must be an object role -> piece")
            id_scheme = meta.get("id_scheme", id_scheme)
            if id_scheme not in ID_SCHEMES:
                raise ValueError(f"{sidecar}: 'id_scheme' must be one of {ID_SCHEMES}")
        return cls(path.read_bytes(), languages=languages, specials=specials, id_scheme=id_scheme)

    @classmethod
    def from_xlmr(cls, path: str | Path) -> Tokenizer:
        """XLM-R's tokenizer in the fairseq id scheme, from its ``sentencepiece.bpe.model``.

        ``path`` is the model file or a (HF-format) directory holding one; any sidecar json
        is ignored. Ids then equal those of HF's ``XLMRobertaTokenizer``.
        """
        path = Path(path)
        if path.is_dir():
            path = path / "sentencepiece.bpe.model"
        if not path.is_file():
            raise FileNotFoundError(f"XLM-R sentencepiece model not found: {path}")
        return cls(path.read_bytes(), languages=[], id_scheme="fairseq")

    @property
    def id_scheme(self) -> str:
        """How ids relate to sentencepiece ids: ``sentencepiece`` or ``fairseq``."""
        return self._id_scheme

    def save(self, path: str | Path) -> Path:
        """Write ``<path>.model`` and its sidecar ``.json`` so ``load`` gives this tokenizer.

        ``path`` may end in ``.model``; returns the ``.model`` path.
        """
        path = Path(path)
        if path.suffix != ".model":
            path = Path(f"{path}.model")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self._proto)
        sidecar: dict[str, Any] = {"languages": list(self._languages)}
        if self._specials_given:
            sidecar["specials"] = dict(self._specials_given)
        sidecar["id_scheme"] = self._id_scheme
        path.with_suffix(".json").write_text(
            json.dumps(sidecar, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        return path

    def __getstate__(self) -> dict[str, Any]:
        # The proto bytes, not the path: workers may not see the same filesystem.
        return {
            "model_proto": self._proto,
            "languages": list(self._languages),
            "specials": dict(self._specials_given),
            "id_scheme": self._id_scheme,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["model_proto"],
            languages=state["languages"],
            specials=state["specials"],
            id_scheme=state.get("id_scheme", "sentencepiece"),
        )

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, languages={self._languages}, "
            f"appended={self._appended}, id_scheme={self._id_scheme!r})"
        )

    # -- ids ------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids an embedding table needs (sentencepiece pieces + appended specials)."""
        return self._id_offset + self._sp.get_piece_size() + len(self._appended)

    @property
    def pad_id(self) -> int:
        """Id of [PAD] (0 for models trained by ``train_tokenizer``)."""
        return self._role_ids["pad"]

    @property
    def unk_id(self) -> int:
        """Id of [UNK] (1 for models trained by ``train_tokenizer``)."""
        return self._role_ids["unk"]

    @property
    def cls_id(self) -> int:
        """Id of [CLS], which starts every input."""
        return self._role_ids["cls"]

    @property
    def sep_id(self) -> int:
        """Id of [SEP], which ends each segment."""
        return self._role_ids["sep"]

    @property
    def mask_id(self) -> int:
        """Id of [MASK], which replaces masked tokens."""
        return self._role_ids["mask"]

    @property
    def languages(self) -> list[str]:
        """Language codes, in the order used by ``lang_index``."""
        return list(self._languages)

    @property
    def special_ids(self) -> frozenset[int]:
        """All ids that are not text: role specials, language tags, control pieces."""
        return self._special_ids

    @property
    def word_start_ids(self) -> frozenset[int]:
        """Text pieces that begin a word (sentencepiece's ``▁`` prefix), for whole-word masking."""
        if self._word_starts is None:
            self._word_starts = frozenset(
                self._from_sp(i)
                for i in range(self._sp.get_piece_size())
                if self._sp.id_to_piece(i).startswith(WORD_START)
                and self._from_sp(i) not in self._special_ids
            )
        return self._word_starts

    def is_special(self, tok_id: int) -> bool:
        """Whether ``tok_id`` is a special (never to be masked or decoded)."""
        return int(tok_id) in self._special_ids

    def lang_index(self, lang: str) -> int:
        """0-based index of ``lang`` in ``languages``, for language embeddings."""
        try:
            return self._languages.index(lang)
        except ValueError:
            raise ValueError(
                f"unknown language {lang!r}; known languages: {self._languages}"
            ) from None

    def lang_tag_id(self, lang: str) -> int:
        """Id of the ``[lang]`` tag token."""
        return self._lang_ids[self.lang_index(lang)]

    def id_to_piece(self, tok_id: int) -> str:
        """The piece behind ``tok_id``, appended specials included (for debugging)."""
        tok_id = int(tok_id)
        sp_size = self._sp.get_piece_size()
        if not 0 <= tok_id < self.vocab_size:
            raise ValueError(f"id {tok_id} outside vocabulary of size {self.vocab_size}")
        if self._id_scheme == "fairseq":
            for piece, fid in _FAIRSEQ_ROLES.values():
                if tok_id == fid:
                    return piece
        sp_id = self._to_sp(tok_id)
        if sp_id >= sp_size:
            return self._appended[sp_id - sp_size]
        if sp_id < 0:
            raise ValueError(f"id {tok_id} is below the id offset {self._id_offset}")
        return self._sp.id_to_piece(sp_id)

    # -- text -----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Ids of the pieces of ``text``; no [CLS]/[SEP] or other specials are added."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return [self._from_sp(i) for i in self._sp.encode(text, out_type=int)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids of ``text`` and the character span ``[start, end)`` of each piece in ``text``.

        A piece's span leaves out the whitespace it absorbed ("▁blue" in "a blue" is
        ``(2, 6)``); pieces normalisation inserted cover no character (``start == end``).
        Needs the ``protobuf`` package (sentencepiece's offsets come as a protobuf).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode_with_offsets expects a str, got {type(text).__name__}")
        proto = self._sp.encode(text, return_type="proto")
        char_at = _byte_to_char(text)  # sentencepiece's offsets count UTF-8 bytes
        ids, spans = [], []
        for piece in proto.pieces:
            start, end = char_at[piece.begin], char_at[piece.end]
            surface = text[start:end]
            start = min(start + len(surface) - len(surface.lstrip()), end)
            ids.append(self._from_sp(piece.id))
            spans.append((start, end))
        return ids, spans

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, skipping every special id."""
        sp_ids = []
        for raw in ids:
            tok_id = int(raw)
            if not 0 <= tok_id < self.vocab_size:
                raise ValueError(f"id {tok_id} outside vocabulary of size {self.vocab_size}")
            if tok_id not in self._special_ids:
                sp_ids.append(self._to_sp(tok_id))
        return self._sp.decode(sp_ids)

    def build_inputs(
        self, ids_a: list[int], ids_b: list[int] | None = None, max_len: int = 64
    ) -> tuple[list[int], list[int]]:
        """Model inputs ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` and their segment ids.

        The longer side is truncated first (its tail dropped) so the total is <= ``max_len``.
        """
        if max_len < 3:
            raise ValueError(f"max_len must be >= 3 to hold [CLS] and [SEP], got {max_len}")
        a = list(ids_a)
        if ids_b is None:
            a = a[: max_len - 2]
            return [self.cls_id, *a, self.sep_id], [0] * (len(a) + 2)
        b = list(ids_b)
        budget = max_len - 3
        excess = len(a) + len(b) - budget
        if excess > 0:
            # Shorten the longer side down to the shorter, then alternate (b first on ties,
            # so a keeps its extra token when the budget is odd).
            cut_long = min(excess, abs(len(a) - len(b)))
            if len(a) > len(b):
                a = a[: len(a) - cut_long]
            else:
                b = b[: len(b) - cut_long]
            rest = excess - cut_long
            b = b[: len(b) - (rest + 1) // 2]
            a = a[: len(a) - rest // 2]
        input_ids = [self.cls_id, *a, self.sep_id, *b, self.sep_id]
        segment_ids = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        return input_ids, segment_ids


#: ``data.tokenizer`` file names read as CLIP BPE merges rather than sentencepiece models
CLIP_BPE_SUFFIX = ".txt.gz"


def load_tokenizer(path: str | Path) -> Tokenizer | ClipTokenizer:
    """The tokenizer ``data.tokenizer`` names, by file type: CLIP's BPE merges
    (``*.txt.gz``, a :class:`~mmptm.tokenizers.clip.ClipTokenizer`) or else a
    sentencepiece model (:meth:`Tokenizer.load`)."""
    if str(path).endswith(CLIP_BPE_SUFFIX):
        from mmptm.tokenizers.clip import ClipTokenizer  # ftfy and regex only when used

        return ClipTokenizer.load(path)
    return Tokenizer.load(path)


def _byte_to_char(text: str) -> list[int]:
    """For each UTF-8 byte offset of ``text`` (and its end), the character offset."""
    out = []
    for i, ch in enumerate(text):
        out += [i] * len(ch.encode("utf-8"))
    out.append(len(text))
    return out


# -- training ---------------------------------------------------------------------------------


def _is_shard(path: Path) -> bool:
    return path.name.endswith(_SHARD_SUFFIXES)


def _expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Files named by ``inputs``: files as given, directories' shards, glob/brace patterns."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            shards = sorted(p for p in path.iterdir() if p.is_file() and _is_shard(p))
            if not shards:
                raise FileNotFoundError(f"no tar shards ({', '.join(_SHARD_SUFFIXES)}) in {path}")
            files += shards
        elif path.exists():
            files.append(path)
        elif _GLOB_CHARS & set(str(item)):
            matches: list[str] = []
            for pattern in _brace_expand(str(item)):
                matches += sorted(glob.glob(pattern, recursive=True))
            found = [Path(m) for m in matches if Path(m).is_file()]
            if not found:
                raise FileNotFoundError(f"no files match tokenizer input pattern: {item}")
            files += found
        else:
            raise FileNotFoundError(f"tokenizer input not found: {path}")
    return files


def _brace_expand(pattern: str) -> list[str]:
    # webdataset shard lists are written "shard-{000..099}.tar"; braceexpand ships with it.
    if "{" not in pattern:
        return [pattern]
    try:
        from braceexpand import braceexpand
    except ImportError:  # pragma: no cover - webdataset depends on it
        return [pattern]
    return list(braceexpand(pattern))


def _read_text_file(path: Path) -> Iterator[str]:
    try:
        with path.open(encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    yield line
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid UTF-8 text ({e})") from e


def _read_shards(paths: list[Path], languages: set[str], handler: SkipCounter) -> Iterator[str]:
    """Sentences of webdataset shards, read by the pipeline's reader; what the text plug-in
    finds in each sample (:func:`~mmptm.modalities.text.sample_texts`). Unreadable members
    and samples are skipped and counted by ``handler``."""
    for sample in tar_samples([str(p) for p in paths], handler):
        try:
            texts = list(sample_texts(sample))
        except ValueError as e:  # UnicodeDecodeError and JSONDecodeError included
            handler.skip(sample, f"{type(e).__name__}: {e}")
            continue
        for text, lang in texts:
            if lang:
                languages.add(lang)
            yield text


def _sample(sentences: Iterable[str], max_sentences: int, seed: int) -> tuple[list[str], int]:
    """Uniform reservoir sample of at most ``max_sentences``; deterministic for ``seed``."""
    rng = random.Random(seed)
    kept: list[str] = []
    seen = 0
    for s in sentences:
        seen += 1
        if len(kept) < max_sentences:
            kept.append(s)
        else:
            j = rng.randrange(seen)
            if j < max_sentences:
                kept[j] = s
    return kept, seen


def train_tokenizer(
    inputs: list[str | Path],
    out_prefix: str | Path,
    *,
    vocab_size: int = 8000,
    languages: list[str] | None = None,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    seed: int = 0,
    max_sentences: int = 2_000_000,
    num_threads: int = 8,
    fit_to_data: bool = False,
) -> Tokenizer:
    """Train the shared sentencepiece model; writes ``<out_prefix>.model`` and ``.json``.

    ``inputs`` are text files (one sentence per line), webdataset tar shards, directories of
    shards or glob/brace patterns. ``languages`` defaults to those found in shards' json
    (``captions`` keys, ``languages`` lists), sorted. The same inputs, ``seed`` and
    ``num_threads`` give an identical ``.model`` file: the thread count is part of the result
    because unigram training sums its EM statistics per thread.

    ``fit_to_data`` (BPE only) makes ``vocab_size`` a cap: merging stops at that size or when
    every word of the input is one piece, whichever comes first, so a small corpus (a few
    hundred word types, as toyworld's English captions) gets a vocabulary of its own size
    with whole words and no warning (only a word BPE still left split, e.g. one longer than
    sentencepiece's 16-character pieces, is warned about). Without it, a vocabulary under
    half the size asked is warned about (the sign of unigram's letter-level stop).
    """
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    _check_training(model_type, max_sentences, num_threads, fit_to_data)
    files = _expand_inputs(inputs)  # before reading anything: a typo should fail fast
    kept, found_langs = _sample_inputs(files, inputs, max_sentences, seed)
    langs = _check_languages(sorted(found_langs) if languages is None else languages)
    n_meta = len(SPECIALS) + len(langs)
    if vocab_size <= n_meta:
        raise ValueError(f"vocab_size {vocab_size} leaves no room beyond {n_meta} specials/tags")

    model = _train_model(
        kept, langs, model_type, vocab_size, character_coverage, num_threads, fit_to_data
    )
    model_path = Path(f"{out_prefix}.model")
    model_path.parent.mkdir(parents=True, exist_ok=True)
    model_path.write_bytes(model)
    specials = dict(zip(ROLES, SPECIALS))
    sidecar = {"languages": langs, "specials": specials}
    Path(f"{out_prefix}.json").write_text(
        json.dumps(sidecar, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    tok = Tokenizer(model, languages=langs, specials=specials)
    _check_size(tok, kept, vocab_size, model_type, fit_to_data)
    return tok


def _check_training(model_type: str, max_sentences: int, num_threads: int, fit: bool) -> None:
    """Refuse :func:`train_tokenizer` settings sentencepiece would take badly or not at all."""
    if model_type not in ("unigram", "bpe", "char", "word"):
        raise ValueError(f"model_type must be unigram, bpe, char or word, got {model_type!r}")
    if max_sentences < 1:
        raise ValueError(f"max_sentences must be >= 1, got {max_sentences}")
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    if fit and model_type != "bpe":
        raise ValueError(
            f"fit_to_data needs model_type='bpe' (got {model_type!r}): unigram stops short of "
            "whole words on small corpora"
        )


def _sample_inputs(
    files: list[Path], inputs: list[str | Path], max_sentences: int, seed: int
) -> tuple[list[str], set[str]]:
    """The training sentences (at most ``max_sentences``, sampled with ``seed``) of ``files``
    and the languages their shards name; warns about what could not be read."""
    found_langs: set[str] = set()
    handler = SkipCounter()

    def sentences() -> Iterator[str]:
        for path in files:
            if _is_shard(path):
                yield from _read_shards([path], found_langs, handler)
            else:
                yield from _read_text_file(path)

    # Sampled here rather than with sentencepiece's input_sentence_size: with 0.2.x its
    # sampling gave a different model in each process even after set_random_generator_seed.
    kept, seen = _sample(sentences(), max_sentences, seed)
    if handler.count:
        warnings.warn(
            f"tokenizer inputs: skipped {handler.count} unreadable sample(s) or shard part(s); "
            f"last: {handler.last}",
            stacklevel=3,  # train_tokenizer's caller
        )
    if not kept:
        raise ValueError(f"no sentences found in tokenizer inputs {list(map(str, inputs))}")
    if seen > len(kept):
        log.info("tokenizer: sampled %d of %d sentences (seed %d)", len(kept), seen, seed)
    return kept, found_langs


def _train_model(
    kept: list[str],
    langs: list[str],
    model_type: str,
    vocab_size: int,
    character_coverage: float,
    num_threads: int,
    fit_to_data: bool,
) -> bytes:
    """The sentencepiece model trained on ``kept``, serialized: our specials at fixed ids
    ([PAD] 0, [UNK] 1), the rest and the language tags as control symbols."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(kept),
        # Written to memory: with model_prefix the output path would be stored in the model
        # and the bytes would differ between output locations.
        model_writer=buf,
        model_type=model_type,
        vocab_size=vocab_size,
        character_coverage=character_coverage,
        pad_id=0,
        pad_piece=SPECIALS[0],
        unk_id=1,
        unk_piece=SPECIALS[1],
        bos_id=-1,
        eos_id=-1,
        control_symbols=[*SPECIALS[2:], *(lang_tag(lang) for lang in langs)],
        hard_vocab_limit=False,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=num_threads,
        # with fit_to_data, running out of pairs to merge is the expected end, not a warning
        minloglevel=2 if fit_to_data else 1,
    )
    return buf.getvalue()


def _check_size(
    tok: Tokenizer, kept: list[str], vocab_size: int, model_type: str, fit_to_data: bool
) -> None:
    """Warn when the trained vocabulary is far smaller than asked (or, with ``fit_to_data``,
    when BPE stopped short and left words split)."""
    if fit_to_data:
        if tok.vocab_size < vocab_size:
            _check_whole_words(tok, kept)
    elif tok.vocab_size < vocab_size // 2:
        # hard_vocab_limit=False lets sentencepiece stop short. Unigram does so on corpora with
        # few word types (toyworld: 253 pieces of 2000 asked), splitting frequent words into
        # letters; masked LM then becomes spelling completion. BPE reaches whole words there.
        log.warning(
            "tokenizer: %s training gave %d pieces of the %d asked; frequent words may be split "
            "into letters%s",
            model_type, tok.vocab_size, vocab_size,
            " (model_type='bpe' reaches whole words on small vocabularies)"
            if model_type == "unigram" else "",
        )  # fmt: skip


_WORD = re.compile(r"[^\W\d_]+|\d+")


def _check_whole_words(tok: Tokenizer, sentences: list[str]) -> None:
    """BPE stopped short of its size: say so, and warn about any word it left in pieces
    (sentencepiece caps a piece at 16 characters, so a longer word stays split)."""
    # sentencepiece splits at script changes (letters / digits / punctuation): words are runs
    words = {w for line in sentences for w in _WORD.findall(line)}
    split = sorted(w for w in words if len(tok.encode(w)) > 1)
    if split:
        log.warning(
            "tokenizer: bpe stopped at %d pieces with %d of %d words still split (e.g. %s)",
            tok.vocab_size, len(split), len(words), ", ".join(split[:5]),
        )  # fmt: skip
    else:
        log.info("tokenizer: bpe sized to the data: %d pieces, every one of %d words whole",
                 tok.vocab_size, len(words))  # fmt: skip
