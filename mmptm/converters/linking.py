"""Alias-dictionary entity linking: mentions of known entities in text shards.

:class:`AliasDictionary` holds a language's aliases (Wikidata5M's ``wikidata5m_entity.txt``
or any ``id<TAB>alias<TAB>alias...`` file); :meth:`AliasDictionary.link` finds mentions in a
text and :func:`link_shards` writes copies of shards whose ``json`` carries them as
``mentions`` (the layout the text plug-in's ``spans`` read):

    txt member (language: json.language)    json.mentions = [[start, end, id], ...]
    json.captions = {lang: caption}          json.mentions = {lang: [[start, end, id], ...]}
    json.captions = {lang: [c0, c1, ...]}    json.mentions = {lang: [[[s, e, id], ...], ...]}

``start``/``end`` count characters of the text (end exclusive: ``text[start:end]`` is the
alias as written); ``id`` is the entity's id string from the alias file.

Matching: at each word boundary, left to right, the longest alias that ends at a word
boundary wins, and the scan resumes after it (leftmost-longest, so mentions never overlap;
"New York City" beats "New York"). A mention never starts or ends inside a word ("Bimo" is
not found in "Bimodal"): word characters come from Unicode categories (letters, marks,
digits), so Cyrillic, Greek and accented Latin behave as English, and a character of a script
written without spaces (CJK ideographs, kana) is a word of its own, so "東京" is found in
"東京都". The dictionary is a trie whose nodes are the aliases' prefixes that end at a
boundary, held in a hash set: the scan stops as soon as no alias continues. Case: an alias is
matched exactly or case-folded (character by character, so offsets never shift): ``auto``
matches short aliases (≤ 3 characters) and all-caps ones (acronyms) exactly — "US" does not
match "us" — and the others case-insensitively.

Ambiguity (one alias, several entities): the alias links to the entity with the most triples
in a graph when one is given (``degree``), else the one with the most aliases (Wikidata's
popular entities have more), ties to the first in the file. Ambiguous aliases are counted,
and so are the mentions that used one.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import tarfile
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from mmptm.data.shards import count_samples, encode_member, expand_shards
from mmptm.kg.graph import iter_triples, read_aliases
from mmptm.progress import progress_bar
from mmptm.registry import CONVERTERS, default_of

log = logging.getLogger(__name__)

CASE_MODES = ("auto", "sensitive", "insensitive")
#: ``auto``: aliases this short are matched with their exact case
SHORT_ALIAS = 3
#: the dictionary that serves every language without its own (``--aliases FILE``)
ANY_LANGUAGE = "*"
#: scripts written without spaces between words: each character is a word
_UNSPACED = ("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH", "HIRAGANA", "KATAKANA")

Mention = list  # [start, end, entity id]: a list, as json gives it back


@lru_cache(maxsize=65536)
def _char_class(c: str) -> int:
    """0: not part of a word; 1: a word character; 2: a word by itself (unspaced scripts)."""
    cat = unicodedata.category(c)
    if cat[0] not in "LNM":
        return 0
    return 2 if cat == "Lo" and unicodedata.name(c, "").startswith(_UNSPACED) else 1


def word_edges(text: str) -> tuple[list[int], list[int]]:
    """(positions a mention may start at, positions it may end at) in ``text``, ascending.

    Neither lies between two characters of one word; a start is not a space and an end
    does not follow one (aliases carry no outer spaces).
    """
    classes = [_char_class(c) for c in text]
    starts, ends = [], []
    for i, c in enumerate(text):
        inner = i > 0 and classes[i - 1] == 1 and classes[i] == 1
        if not inner and not c.isspace():
            starts.append(i)
        if i > 0 and not inner and not text[i - 1].isspace():
            ends.append(i)
    if text and not text[-1].isspace():
        ends.append(len(text))
    return starts, ends


@lru_cache(maxsize=65536)
def _fold_char(c: str) -> str:
    folded = c.casefold()
    return folded if len(folded) == 1 else c  # "ß" → "ss" would shift every offset after it


def fold(text: str) -> str:
    """``text`` case-folded character by character (same length, offsets unchanged)."""
    return "".join(map(_fold_char, text))


def exact_case(alias: str, mode: str) -> bool:
    """Whether ``alias`` is matched with its exact case under ``mode`` (module docstring)."""
    if mode != "auto":
        return mode == "sensitive"
    cased = [c for c in alias if c.lower() != c.upper()]
    acronym = len(cased) >= 2 and alias == alias.upper()
    return len(alias) <= SHORT_ALIAS or acronym


@dataclass
class AliasDictionary:
    """One language's aliases → entity ids, matched exactly or case-folded (module docstring)."""

    #: alias (as written) → entity, for aliases matched with their case
    exact: dict[str, str] = field(default_factory=dict)
    #: case-folded alias → entity, for the others
    folded: dict[str, str] = field(default_factory=dict)
    #: every prefix of an alias that ends at a word end (the trie's inner nodes, hashed)
    prefixes: set[str] = field(default_factory=set)
    folded_prefixes: set[str] = field(default_factory=set)
    #: keys of ``exact`` / ``folded`` that several entities share
    ambiguous: set[str] = field(default_factory=set)
    #: entities dropped because the vocabulary given does not have them, and their aliases
    unknown_entities: int = 0
    source: str = ""

    @classmethod
    def build(
        cls,
        aliases: Mapping[str, list[str]],
        case: str = "auto",
        degree: Mapping[str, int] | None = None,
        vocabulary: Iterable[str] | None = None,
        source: str = "",
    ) -> AliasDictionary:
        """From ``{entity: [alias, ...]}`` (file order); ambiguity as the module docstring."""
        if case not in CASE_MODES:
            raise ValueError(f"case must be one of {', '.join(CASE_MODES)}, got {case!r}")
        known = set(vocabulary) if vocabulary is not None else None
        out = cls(source=source)
        rank: dict[str, tuple[int, int, int]] = {}  # entity → (degree, aliases, -file order)
        owners: dict[tuple[bool, str], list[str]] = {}
        for order, (entity, names) in enumerate(aliases.items()):
            if known is not None and entity not in known:
                out.unknown_entities += 1
                continue
            rank[entity] = ((degree or {}).get(entity, 0), len(set(names)), -order)
            for alias in names:
                exact = exact_case(alias, case)
                key = alias if exact else fold(alias)
                found = owners.setdefault((exact, key), [])
                if entity not in found:
                    found.append(entity)
        for (exact, key), entities in owners.items():
            table = out.exact if exact else out.folded
            prefixes = out.prefixes if exact else out.folded_prefixes
            table[key] = max(entities, key=rank.__getitem__)
            if len(entities) > 1:
                out.ambiguous.add(key)
            _, ends = word_edges(key)
            prefixes.update(key[:e] for e in ends)
        return out

    def __len__(self) -> int:
        return len(self.exact) + len(self.folded)

    def link(self, text: str) -> tuple[list[Mention], int]:
        """Mentions ``[[start, end, entity], ...]`` in ``text`` and how many used an ambiguous
        alias."""
        starts, ordered_ends = word_edges(text)
        folded = fold(text) if self.folded else text
        mentions: list[Mention] = []
        n_ambiguous = 0
        after = 0  # the end of the last mention: no overlaps
        j = 0  # index into ordered_ends
        for s in starts:
            if s < after:
                continue
            while j < len(ordered_ends) and ordered_ends[j] <= s:
                j += 1
            best: tuple[int, str, str] | None = None
            in_exact = in_folded = True
            for e in ordered_ends[j:]:
                in_exact = in_exact and text[s:e] in self.prefixes
                in_folded = in_folded and folded[s:e] in self.folded_prefixes
                if not (in_exact or in_folded):
                    break  # no alias goes on like this: the trie has no such node
                if in_exact and (hit := self.exact.get(text[s:e])) is not None:
                    best = (e, hit, text[s:e])
                elif in_folded and (hit := self.folded.get(folded[s:e])) is not None:
                    best = (e, hit, folded[s:e])
            if best is not None:
                e, entity, key = best
                mentions.append([s, e, entity])
                n_ambiguous += key in self.ambiguous
                after = e
        return mentions, n_ambiguous


def read_dictionaries(
    specs: Iterable[str],
    case: str = "auto",
    triples: str | Path | None = None,
    entities: str | Path | None = None,
) -> dict[str, AliasDictionary]:
    """``--aliases`` values (``FILE`` for every language, ``LANG=FILE`` for one) → dictionaries.

    ``triples``: a ``head<TAB>relation<TAB>tail`` file whose entity degrees break ties;
    ``entities``: an id list (``entities.txt``): aliases of other entities are dropped.
    """
    degree: Counter[str] = Counter()
    if triples is not None:
        for h, _, t in iter_triples(triples):
            degree[h] += 1
            degree[t] += 1
    vocabulary = None
    if entities is not None:
        from mmptm.kg.graph import Vocabulary

        vocabulary = Vocabulary.load(entities).names
    out: dict[str, AliasDictionary] = {}
    for spec in specs:
        lang, sep, path = spec.partition("=")
        lang, path = (lang.strip(), path) if sep else (ANY_LANGUAGE, spec)
        if not lang or lang in out:
            raise ValueError(f"--aliases {spec!r}: language {lang!r} empty or given twice")
        out[lang] = AliasDictionary.build(
            read_aliases(path), case, degree or None, vocabulary, source=path
        )
    if not out:
        raise ValueError("no alias files given (--aliases FILE or LANG=FILE)")
    return out


@dataclass
class LinkStats:
    """What :func:`link_shards` did (its summary)."""

    samples: int = 0
    texts: int = 0
    mentions: int = 0
    #: samples without the text field, and samples whose json or txt cannot be read (both
    #: copied as they are); texts in a language with no dictionary or not in ``languages``
    no_text: int = 0
    bad: int = 0
    other_language: int = 0
    ambiguous_mentions: int = 0
    per_language: Counter[str] = field(default_factory=Counter)
    dictionaries: dict[str, dict[str, int]] = field(default_factory=dict)
    shards: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "shards"}
        out["per_language"] = dict(sorted(self.per_language.items()))
        out["shards"] = len(self.shards)
        return out


def link_sample_json(
    meta: dict[str, Any],
    txt: str | None,
    dictionaries: Mapping[str, AliasDictionary],
    languages: set[str] | None,
    text_field: str,
    stats: LinkStats,
) -> bool:
    """Set ``meta["mentions"]`` for one sample; False when it has no text to link."""

    def one(text: Any, lang: str) -> list[Mention] | None:
        if not isinstance(text, str):
            raise ValueError(f"{text_field} of language {lang!r} is not a string")
        table = dictionaries.get(lang) or dictionaries.get(ANY_LANGUAGE)
        if table is None or (languages is not None and lang not in languages):
            stats.other_language += 1
            return None
        found, n_ambiguous = table.link(text)
        stats.texts += 1
        stats.mentions += len(found)
        stats.per_language[lang] += len(found)
        stats.ambiguous_mentions += n_ambiguous
        return found

    field_ = text_field if text_field != "auto" else "captions" if "captions" in meta else "txt"
    if field_ == "txt":
        if txt is None:
            return False
        found = one(txt, str(meta.get("language") or ANY_LANGUAGE))
        if found is not None:
            meta["mentions"] = found
        return True
    captions = meta.get("captions")
    if not isinstance(captions, dict) or not captions:
        return False
    mentions: dict[str, Any] = {}
    for lang, caption in captions.items():
        if isinstance(caption, list):
            many = [one(c, lang) for c in caption]
            if all(m is not None for m in many):
                mentions[lang] = many
        elif (found := one(caption, lang)) is not None:
            mentions[lang] = found
    meta["mentions"] = mentions
    return True


def _tar_samples(path: str) -> Iterator[list[tuple[tarfile.TarInfo, bytes]]]:
    """The members of a shard grouped by sample key, in file order, as (header, bytes)."""
    from webdataset.tariterators import base_plus_ext

    group: list[tuple[tarfile.TarInfo, bytes]] = []
    current = None
    with tarfile.open(path) as tar:
        for m in tar:
            if not m.isreg():
                continue
            key, _ = base_plus_ext(m.name)
            if group and key != current:
                yield group
                group = []
            current = key
            data = tar.extractfile(m).read()  # type: ignore[union-attr]
            group.append((m, data))
    if group:
        yield group


def link_shards(
    shards: str,
    out: str | Path,
    dictionaries: Mapping[str, AliasDictionary],
    *,
    languages: Iterable[str] | None = None,
    text_field: str = "auto",
    progress: bool = True,
) -> LinkStats:
    """Copy each shard of ``shards`` into ``out`` (same file name) with ``json.mentions``.

    Every member but ``json`` is copied byte for byte, in the same order and with the same
    header; a sample without its text field is copied unchanged and counted (``no_text``);
    a shard is written under a temporary name and renamed once complete. ``text_field``:
    ``txt``, ``captions`` or ``auto`` (captions if the json has them, else txt).
    """
    if text_field not in ("auto", "txt", "captions"):
        raise ValueError(f"--field must be txt, captions or auto, got {text_field!r}")
    urls = expand_shards(shards)
    out = Path(out)
    names = [Path(u).name for u in urls]
    if len(set(names)) != len(names):
        raise ValueError(f"{shards!r}: two shards share a file name; link them separately")
    if any(Path(u).resolve().parent == out.resolve() for u in urls):
        raise ValueError(f"--out {out} holds the input shards; write elsewhere")
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(languages) if languages else None
    sizes = {
        lang: {"aliases": len(d), "ambiguous_aliases": len(d.ambiguous),
               "unknown_entities": d.unknown_entities}
        for lang, d in dictionaries.items()
    }  # fmt: skip
    stats = LinkStats(dictionaries=sizes)

    bar = progress_bar(total=count_samples(urls), desc="link", unit="sample", enabled=progress)

    def one(group: list[tuple[tarfile.TarInfo, bytes]], url: str) -> list:
        stats.samples += 1
        bar.update()
        return _link_group(group, url, dictionaries, wanted, text_field, stats)

    with bar:
        for target in rewrite_shards(urls, out, one):
            stats.shards.append(target)
            bar.set_postfix(mentions=stats.mentions)
    return stats


def rewrite_shards(
    urls: Sequence[str],
    out: Path,
    rewrite: Callable[
        [list[tuple[tarfile.TarInfo, bytes]], str], Iterable[tuple[tarfile.TarInfo, bytes]]
    ],
) -> Iterator[str]:
    """Copy each shard of ``urls`` into ``out`` under its file name, each sample's members
    (header, bytes) through ``rewrite(members, url)``; a shard is written under a temporary
    name and renamed once complete. Yields each shard written."""
    for url in urls:
        target = out / Path(url).name
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        try:
            with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as dst:
                for group in _tar_samples(url):
                    for info, data in rewrite(group, url):
                        dst.addfile(info, io.BytesIO(data))
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()
        yield str(target)


def with_json(
    group: list[tuple[tarfile.TarInfo, bytes]], meta: dict[str, Any]
) -> list[tuple[tarfile.TarInfo, bytes]]:
    """A sample's tar members with its json member replaced by ``meta`` (same header)."""
    from webdataset.tariterators import base_plus_ext

    data = encode_member(meta)
    out = []
    for info, blob in group:
        if base_plus_ext(info.name)[1].lower() == "json":
            new = tarfile.TarInfo(info.name)
            new.mode, new.mtime, new.uid, new.gid = info.mode, info.mtime, info.uid, info.gid
            new.uname, new.gname, new.size = info.uname, info.gname, len(data)
            info, blob = new, data
        out.append((info, blob))
    return out


def _link_group(
    group: list[tuple[tarfile.TarInfo, bytes]],
    url: str,
    dictionaries: Mapping[str, AliasDictionary],
    languages: set[str] | None,
    text_field: str,
    stats: LinkStats,
) -> list[tuple[tarfile.TarInfo, bytes]]:
    """One sample's members with its json rewritten (or a json added to hold the mentions)."""
    from webdataset.tariterators import base_plus_ext

    key, _ = base_plus_ext(group[0][0].name)
    by_ext = {base_plus_ext(info.name)[1].lower(): i for i, (info, _) in enumerate(group)}
    try:
        meta = json.loads(group[by_ext["json"]][1]) if "json" in by_ext else {}
        txt = group[by_ext["txt"]][1].decode("utf-8") if "txt" in by_ext else None
        if not isinstance(meta, dict):
            raise ValueError("json is not an object")
        linked = link_sample_json(meta, txt, dictionaries, languages, text_field, stats)
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        stats.bad += 1
        log.warning("%s: sample %r copied unlinked: %s", url, key, e)
        return group
    if not linked:
        stats.no_text += 1
        return group
    if "json" in by_ext:
        return with_json(group, meta)
    data = encode_member(meta)
    first = group[0][0]
    new = tarfile.TarInfo(f"{key}.json")
    new.mode, new.mtime, new.size = first.mode, first.mtime, len(data)
    return [*group, (new, data)]


# --------------------------------------------------------------------------------------------
# mmptm data link


def _link_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="text shards (glob, brace pattern, folder)")
    p.add_argument("--aliases", action="append", required=True, metavar="[LANG=]FILE",
                   help="id<TAB>alias... lines (wikidata5m_entity.txt); LANG=FILE for one "
                        "language, FILE for every other; repeatable")  # fmt: skip
    p.add_argument("--out", required=True, help="folder: the linked shards and link.json")
    p.add_argument("--languages", default="", help="link only these (comma list)")
    p.add_argument("--field", default=default_of(link_shards, "text_field"),
                   choices=["auto", "txt", "captions"],
                   help="the text to link (auto: json.captions if present, else txt)")  # fmt: skip
    p.add_argument("--case", default=default_of(read_dictionaries, "case"), choices=CASE_MODES,
                   help="auto: exact case for aliases of <= 3 characters and "
                        "acronyms")  # fmt: skip
    p.add_argument("--triples", default=None,
                   help="head<TAB>relation<TAB>tail file: an ambiguous alias links to the "
                        "entity with the most triples")  # fmt: skip
    p.add_argument("--entities", default=None,
                   help="entity id list (entities.txt of kg train-embeddings): link "
                        "only these")  # fmt: skip
    p.add_argument("--no-progress", action="store_true")


@CONVERTERS.register("link", "entity mentions by alias dictionary → json.mentions", _link_arguments)
def _link_command(args: argparse.Namespace) -> int:
    dictionaries = read_dictionaries(args.aliases, args.case, args.triples, args.entities)
    languages = [x.strip() for x in args.languages.split(",") if x.strip()] or None
    stats = link_shards(args.input, args.out, dictionaries, languages=languages,
                        text_field=args.field, progress=not args.no_progress)  # fmt: skip
    summary = stats.summary()
    Path(args.out, "link.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0
