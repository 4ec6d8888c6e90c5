"""Converters for XTREME's sentence-retrieval sets, Tatoeba and BUCC 2018, to text shards.

**Tatoeba** (Artetxe & Schwenk 2019; LASER's ``data/tatoeba/v1``): two line-aligned files per
language, ``tatoeba.{xx}-eng.{xx}`` and ``tatoeba.{xx}-eng.eng`` (XTREME's renamed copies
``{x}-en.{x}`` / ``{x}-en.en`` read the same). Line i of one is the translation of line i of
the other. They become parallel-text shards, ``{split}-{x}-en-%06d.tar`` (split: ``test``),
one sample per line pair with ``json`` = ``{"languages": [x, "en"], "texts": [...]}``, which
``mmptm eval xret`` reads. ISO 639-3 codes of XTREME's 36 languages (``deu``, ``cmn``) are
written as the two-letter codes the multilingual recipes use (``de``, ``zh``); others stay.

**BUCC 2018** (Zweigenbaum et al. 2018): per language pair and split (``sample``,
``training``, ``test``; XTREME's copies ``dev`` and ``test``) ``{x}-en.{split}.{x}`` and
``{x}-en.{split}.en`` with one ``id<TAB>sentence`` a line, and ``{x}-en.{split}.gold`` with
one ``x_id<TAB>en_id`` a line (the test split ships none). One sample per sentence in
``{split}-{x}-en-%06d.tar``: ``txt`` = the sentence, ``json`` = ``{"language", "id", "side":
"source" | "target", "pair": [x, "en"]}``, and on a source sentence of a split with gold
pairs ``"gold"``: the target ids it is paired with (often ``[]``). ``mmptm eval bucc`` mines
them.

Malformed input is one error naming the file and line: a BUCC line without exactly one tab,
an empty id or sentence, an id twice, a gold pair naming an id the sentence files lack;
Tatoeba files of different line counts or an empty line.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mmptm.converters import print_stats
from mmptm.data.shards import ShardWriter
from mmptm.registry import CONVERTERS

PathLike = str | os.PathLike[str]
#: XTREME's Tatoeba languages: LASER's ISO 639-3 codes → the codes XTREME (and mmptm) use
TATOEBA_CODES = {
    "afr": "af", "ara": "ar", "ben": "bn", "bul": "bg", "cmn": "zh", "deu": "de", "ell": "el",
    "eng": "en", "est": "et", "eus": "eu", "fin": "fi", "fra": "fr", "heb": "he", "hin": "hi",
    "hun": "hu", "ind": "id", "ita": "it", "jav": "jv", "jpn": "ja", "kat": "ka", "kaz": "kk",
    "kor": "ko", "mal": "ml", "mar": "mr", "nld": "nl", "pes": "fa", "por": "pt", "rus": "ru",
    "spa": "es", "swh": "sw", "tam": "ta", "tel": "te", "tgl": "tl", "tha": "th", "tur": "tr",
    "urd": "ur", "vie": "vi",
}  # fmt: skip
_PAIR = re.compile(r"(?:tatoeba\.)?([A-Za-z_]+)-([A-Za-z_]+)\.([A-Za-z_]+)")
_BUCC = re.compile(r"([A-Za-z_]+)-([A-Za-z_]+)\.([A-Za-z_]+)")


def _lines(path: PathLike) -> Iterator[tuple[int, str]]:
    # newline="\n": a stray '\r' inside a sentence must not split it and shift the alignment
    with open(path, encoding="utf-8", newline="\n") as f:
        for n, line in enumerate(f, 1):
            yield n, line.rstrip("\r\n")


def tatoeba_pair(path: PathLike) -> tuple[Path, Path, str, str]:
    """(source file, English file, source code, English code) of one side of a Tatoeba pair,
    from its name: ``tatoeba.deu-eng.deu`` (or ``.eng``) or XTREME's ``de-en.de``."""
    path = Path(path)
    m = _PAIR.fullmatch(path.name)
    if m is None or m.group(3) not in (m.group(1), m.group(2)):
        raise ValueError(
            f"{path}: not a Tatoeba file name (tatoeba.xxx-eng.xxx, tatoeba.xxx-eng.eng or "
            "XTREME's xx-en.xx)"
        )
    src, eng = m.group(1), m.group(2)
    stem = path.name[: -len(m.group(3)) - 1]
    return path.with_name(f"{stem}.{src}"), path.with_name(f"{stem}.{eng}"), src, eng


def convert_tatoeba(
    inputs: list[PathLike], out: PathLike, *, split: str = "test", shard_size: int = 10000
) -> dict[str, Any]:
    """Tatoeba file pairs (either file of a pair names it; a directory: every pair in it) →
    ``out/{split}-{x}-en-%06d.tar`` (module docstring)."""
    files: list[Path] = []
    for item in map(Path, inputs):  # a directory's other files are not Tatoeba's
        files += (
            [f for f in sorted(item.iterdir()) if _PAIR.fullmatch(f.name)]
            if item.is_dir()
            else [item]
        )
    pairs = {}
    for f in files:
        src_file, eng_file, src, eng = tatoeba_pair(f)
        pairs[src_file, eng_file] = (src, eng)
    if not pairs:
        raise ValueError(f"{', '.join(map(str, inputs))}: no Tatoeba files")
    stats: dict[str, Any] = {"written": {}, "shards": []}
    for (src_file, eng_file), (src, eng) in sorted(pairs.items()):
        x, en = TATOEBA_CODES.get(src, src), TATOEBA_CODES.get(eng, eng)
        texts = [[t for _, t in _checked_lines(p)] for p in (src_file, eng_file)]
        if len(texts[0]) != len(texts[1]):
            raise ValueError(f"line counts differ: {src_file} has {len(texts[0])} lines, "
                             f"{eng_file} has {len(texts[1])}")  # fmt: skip
        with ShardWriter(Path(out) / f"{split}-{x}-{en}-%06d.tar", shard_size) as writer:
            for n, (a, b) in enumerate(zip(*texts), 1):
                record = {"languages": [x, en], "texts": [a, b]}
                writer.write({"__key__": f"{x}-{en}-{n:06d}", "json": record})
        stats["written"][x] = len(texts[0])
        stats["shards"] += writer.shards
    return stats


def _checked_lines(path: Path) -> Iterator[tuple[int, str]]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (the other side of a Tatoeba pair)")
    for n, text in _lines(path):
        if not text.strip():
            raise ValueError(f"{path}:{n}: empty line (Tatoeba's files have a sentence a line)")
        yield n, text.strip()


def _bucc_sentences(path: Path) -> dict[str, str]:
    """id → sentence of a BUCC sentence file."""
    out: dict[str, str] = {}
    for n, line in _lines(path):
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise ValueError(f"{path}:{n}: expected 'id<TAB>sentence'")
        sid = parts[0].strip()
        if sid in out:
            raise ValueError(f"{path}:{n}: id {sid!r} again")
        out[sid] = parts[1].strip()
    if not out:
        raise ValueError(f"{path}: no sentences")
    return out


def _bucc_gold(path: Path, src: dict[str, str], tgt: dict[str, str]) -> dict[str, list[str]]:
    """source id → its gold target ids."""
    gold: dict[str, list[str]] = {}
    for n, line in _lines(path):
        parts = line.split("\t")
        if len(parts) != 2:
            raise ValueError(f"{path}:{n}: expected 'source_id<TAB>target_id'")
        a, b = (p.strip() for p in parts)
        for sid, side in ((a, src), (b, tgt)):
            if sid not in side:
                raise ValueError(f"{path}:{n}: id {sid!r} is in no sentence file of the pair")
        gold.setdefault(a, []).append(b)
    return gold


def convert_bucc(
    prefix: PathLike, out: PathLike, *, split: str = "", shard_size: int = 10000
) -> dict[str, Any]:
    """One BUCC language pair and split, ``{x}-en.{split}`` (its files ``.{x}``, ``.en`` and
    ``.gold`` if any), → ``out/{split}-{x}-en-%06d.tar`` (module docstring)."""
    prefix = Path(prefix)
    m = _BUCC.fullmatch(prefix.name)
    if m is None:
        raise ValueError(f"{prefix}: not a BUCC prefix (de-en.sample, de-en.training, de-en.test)")
    x, en, split = m.group(1), m.group(2), split or m.group(3)
    files = {lang: prefix.with_name(f"{prefix.name}.{lang}") for lang in (x, en)}
    for f in files.values():
        if not f.is_file():
            raise FileNotFoundError(f"{f}: no such file (BUCC's {prefix.name} sentences)")
    src, tgt = (_bucc_sentences(files[lang]) for lang in (x, en))
    gold_file = prefix.with_name(f"{prefix.name}.gold")
    gold = _bucc_gold(gold_file, src, tgt) if gold_file.is_file() else None
    with ShardWriter(Path(out) / f"{split}-{x}-{en}-%06d.tar", shard_size) as writer:
        for side, lang, sentences in (("source", x, src), ("target", en, tgt)):
            for sid, text in sentences.items():
                meta: dict[str, Any] = {"language": lang, "id": sid, "side": side,
                                        "pair": [x, en]}  # fmt: skip
                if gold is not None and side == "source":
                    meta["gold"] = gold.get(sid, [])
                key = re.sub(r"[^\w-]", "_", f"{side[0]}-{sid}")
                writer.write({"__key__": key, "txt": text, "json": meta})
    pairs = sum(map(len, gold.values())) if gold is not None else None
    return {"written": len(src) + len(tgt), "source": len(src), "target": len(tgt),
            "gold_pairs": pairs, "split": split, "shards": writer.shards}  # fmt: skip


# --------------------------------------------------------------------------------------------
# mmptm data tatoeba | bucc


def _tatoeba_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", required=True,
                   help="Tatoeba files (either of a pair) or directories of them")  # fmt: skip
    p.add_argument("--out", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--shard-size", type=int, default=10000)


@CONVERTERS.register(
    "tatoeba", "sentence retrieval: Tatoeba's line-aligned tatoeba.xxx-eng.{xxx,eng} files",
    _tatoeba_arguments,
)  # fmt: skip
def _tatoeba_command(args: argparse.Namespace) -> int:
    stats = convert_tatoeba(args.input, args.out, split=args.split, shard_size=args.shard_size)
    print_stats(stats)
    return 0


def _bucc_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", required=True,
                   help="BUCC prefixes: de-en.sample (its .de, .en and .gold files)")  # fmt: skip
    p.add_argument("--out", required=True)
    p.add_argument("--split", default="", help="default: the prefix's (sample, training, test)")
    p.add_argument("--shard-size", type=int, default=10000)


@CONVERTERS.register(
    "bucc", "bitext mining: BUCC 2018's id<TAB>sentence files and gold pairs", _bucc_arguments
)
def _bucc_command(args: argparse.Namespace) -> int:
    for prefix in args.input:
        stats = convert_bucc(prefix, args.out, split=args.split, shard_size=args.shard_size)
        print_stats(stats)
    return 0


__all__ = ["TATOEBA_CODES", "convert_bucc", "convert_tatoeba", "tatoeba_pair"]
