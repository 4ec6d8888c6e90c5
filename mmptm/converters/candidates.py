"""KnowBERT's candidate generator over ``mmptm data link``'s alias table.

Where :class:`~mmptm.converters.linking.AliasDictionary` resolves each alias to one entity
and keeps the leftmost-longest mentions, KnowBERT's linker needs every candidate span and, per
span, every entity the alias may name with a prior p(e | alias). :class:`CandidateGenerator`
gives them: each run of 1..``max_words`` words (word edges and case rules as ``data link``'s:
spans never start or end inside a word; ``auto`` matches short and all-caps aliases exactly,
the others case-folded) that is an alias, overlaps allowed, with its entities ranked by
prior. The prior of an entity for an alias is proportional to its weight (1 + its degree in
the graph when given, else its number of aliases, as ``data link`` ranks them), normalised
over the alias's entities; at most ``k`` per span.

``mmptm data candidates`` (:func:`write_candidate_shards`) runs it offline over text shards
and writes, for KnowBERT's data side (the ``candidates`` plug-in), each sample's

    json.candidates = [[start, end, [entity, ...], [prior, ...], gold], ...]

over its ``txt`` member (characters, end exclusive; ``gold`` the index of the entity of the
gold mention in ``json.mentions`` with exactly this span, -1 when none or when its entity is
not a candidate). toyworld's names are unique (every alias names one entity), so
``--confusers K`` gives each entity's aliases to K others as well (:func:`shared_aliases`).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tarfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmptm.converters.linking import (
    CASE_MODES,
    exact_case,
    fold,
    rewrite_shards,
    with_json,
    word_edges,
)
from mmptm.data.shards import count_samples, expand_shards
from mmptm.kg.graph import iter_triples, read_aliases
from mmptm.modalities.base import read_id_list
from mmptm.progress import progress_bar
from mmptm.registry import CONVERTERS, default_of

log = logging.getLogger(__name__)

#: one candidate span: (start, end, [(entity, prior), ...] best first), characters end-exclusive
Span = tuple[int, int, list[tuple[str, float]]]


@dataclass
class CandidateGenerator:
    """Alias → ranked (entity, prior) lists; :meth:`spans` finds a text's candidate spans."""

    exact: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    folded: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    max_words: int = 5
    k: int = 30

    @classmethod
    def build(
        cls,
        aliases: Mapping[str, list[str]],
        *,
        case: str = "auto",
        degree: Mapping[str, int] | None = None,
        vocabulary: Iterable[str] | None = None,
        max_words: int = 5,
        k: int = 30,
    ) -> CandidateGenerator:
        """From ``{entity: [alias, ...]}`` (``read_aliases``' layout)."""
        if case not in CASE_MODES:
            raise ValueError(f"case must be one of {', '.join(CASE_MODES)}, got {case!r}")
        if max_words < 1 or k < 1:
            raise ValueError(f"max_words and k must be >= 1, got {max_words}, {k}")
        known = set(vocabulary) if vocabulary is not None else None
        owners: dict[tuple[bool, str], dict[str, float]] = {}
        for entity, names in aliases.items():
            if known is not None and entity not in known:
                continue
            weight = 1.0 + degree.get(entity, 0) if degree is not None else len(set(names))
            for alias in names:
                exact = exact_case(alias, case)
                owners.setdefault((exact, alias if exact else fold(alias)), {})[entity] = weight
        out = cls(max_words=max_words, k=k)
        for (exact, key), weights in owners.items():
            total = sum(weights.values())
            ranked = sorted(weights.items(), key=lambda ew: -ew[1])  # stable: file order on ties
            (out.exact if exact else out.folded)[key] = [(e, w / total) for e, w in ranked[:k]]
        return out

    def spans(self, text: str) -> list[Span]:
        """Every span of ``text`` from a word start to one of the next ``max_words`` word ends
        (a punctuation mark counts as a word) that is an alias, in text order."""
        starts, ends = word_edges(text)
        folded = fold(text) if self.folded else text
        found: list[Span] = []
        for s in starts:
            for e in [e for e in ends if e > s][: self.max_words]:
                hit = self.exact.get(text[s:e]) or self.folded.get(folded[s:e])
                if hit:
                    found.append((s, e, hit))
        return found


def gold_index(span: Span, entity: str) -> int:
    """Where ``entity`` stands among a span's candidates (-1: not among them)."""
    return next((i for i, (e, _) in enumerate(span[2]) if e == entity), -1)


def shared_aliases(
    aliases: Mapping[str, list[str]], confusers: int, seed: int = 0
) -> dict[str, list[str]]:
    """``aliases`` with each entity's aliases also given to ``confusers`` other entities
    drawn at random (seeded): ambiguity for a table whose aliases are all unique (toyworld's
    made-up names), so that linking has something to decide. 0: ``aliases`` unchanged."""
    if confusers < 0:
        raise ValueError(f"confusers must be >= 0, got {confusers}")
    out = {e: list(names) for e, names in aliases.items()}
    ids = list(aliases)
    if confusers == 0 or len(ids) < 2:
        return out
    rng = random.Random(seed)
    for e in ids:
        others = [o for o in ids if o != e]
        for o in rng.sample(others, min(confusers, len(others))):
            out[o].extend(aliases[e])
    return out


def sample_candidates(
    text: str, mentions: Any, generator: CandidateGenerator, stats: CandidateStats
) -> list[list[Any]]:
    """``json.candidates`` of one text: ``[start, end, [entity, ...], [prior, ...], gold]``
    per candidate span (gold: the index of the entity of a gold mention with exactly this
    span, -1 without one or when its entity is not a candidate)."""
    gold = {}
    for m in mentions or []:
        if not (isinstance(m, list) and len(m) == 3 and isinstance(m[2], str)):
            raise ValueError(f"mention {m!r} is not [start, end, id]")
        gold[(m[0], m[1])] = m[2]
    out, found = [], set()
    for span in generator.spans(text):
        entity = gold.get(span[:2])
        index = gold_index(span, entity) if entity is not None else -1
        if entity is not None:
            found.add(span[:2])
        out.append([span[0], span[1], [e for e, _ in span[2]],
                    [round(p, 6) for _, p in span[2]], index])  # fmt: skip
        stats.spans += 1
        stats.candidates += len(span[2])
        stats.gold_spans += index >= 0
        stats.gold_missed += entity is not None and index < 0
    stats.texts += 1
    stats.mentions += len(gold)
    stats.mentions_without_span += len(set(gold) - found)
    return out


@dataclass
class CandidateStats:
    """What :func:`write_candidate_shards` did (its summary)."""

    samples: int = 0
    texts: int = 0
    spans: int = 0
    candidates: int = 0
    #: spans whose gold entity is among their candidates (what the linker trains on)
    gold_spans: int = 0
    #: spans of a gold mention whose entity is not among the candidates
    gold_missed: int = 0
    mentions: int = 0
    #: gold mentions no candidate span matches exactly
    mentions_without_span: int = 0
    #: samples without a txt member (copied unchanged), samples that cannot be read
    no_text: int = 0
    bad: int = 0
    shards: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "shards"}
        out["shards"] = len(self.shards)
        return out


def _candidate_group(
    group: list, url: str, generator: CandidateGenerator, field_name: str, stats: CandidateStats
) -> list:
    """One sample's members with ``json.candidates`` of its txt member added."""
    from webdataset.tariterators import base_plus_ext

    by_ext = {base_plus_ext(info.name)[1].lower(): blob for info, blob in group}
    if "txt" not in by_ext or "json" not in by_ext:
        stats.no_text += 1
        return group
    try:
        meta = json.loads(by_ext["json"])
        if not isinstance(meta, dict):
            raise ValueError("json is not an object")
        text = by_ext["txt"].decode("utf-8")
        meta[field_name] = sample_candidates(text, meta.get("mentions"), generator, stats)
    except (ValueError, UnicodeDecodeError) as e:
        stats.bad += 1
        log.warning("%s: sample %r copied without candidates: %s", url, group[0][0].name, e)
        return group
    return with_json(group, meta)


def write_candidate_shards(
    shards: str,
    out: str | Path,
    generator: CandidateGenerator,
    *,
    field_name: str = "candidates",
    progress: bool = True,
) -> CandidateStats:
    """Copy each shard of ``shards`` into ``out`` (same file name), each sample's json with
    the candidate spans of its ``txt`` member (:func:`sample_candidates`) under
    ``field_name``; gold entities come from ``json.mentions`` (``mmptm data link``'s, or
    toyworld's). Other members are copied byte for byte; a shard is renamed once complete."""
    urls = expand_shards(shards)
    out = Path(out)
    if any(Path(u).resolve().parent == out.resolve() for u in urls):
        raise ValueError(f"--out {out} holds the input shards; write elsewhere")
    out.mkdir(parents=True, exist_ok=True)
    stats = CandidateStats()
    bar = progress_bar(total=count_samples(urls), desc="candidates", unit="sample",
                       enabled=progress)  # fmt: skip

    def one(group: list[tuple[tarfile.TarInfo, bytes]], url: str) -> list:
        stats.samples += 1
        bar.update()
        return _candidate_group(group, url, generator, field_name, stats)

    with bar:
        stats.shards.extend(rewrite_shards(urls, out, one))
    return stats


def build_generator(
    aliases: str | Path,
    *,
    triples: str | Path | None = None,
    entities: str | Path | None = None,
    confusers: int = 0,
    seed: int = 0,
    case: str = "auto",
    max_words: int = 5,
    k: int = 30,
) -> CandidateGenerator:
    """A generator from an alias file (``id<TAB>alias...``), priors by graph degree when
    ``triples`` is given, only the entities of the id list ``entities``, and ``confusers``
    (:func:`shared_aliases`)."""
    degree: Counter[str] | None = None
    if triples is not None:
        degree = Counter()
        for h, _, t in iter_triples(triples):
            degree[h] += 1
            degree[t] += 1
    vocabulary = list(read_id_list(entities)) if entities is not None else None
    table = shared_aliases(read_aliases(aliases), confusers, seed)
    return CandidateGenerator.build(table, case=case, degree=degree, vocabulary=vocabulary,
                                    max_words=max_words, k=k)  # fmt: skip


# --------------------------------------------------------------------------------------------
# mmptm data candidates


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="text shards with json.mentions (gold)")
    p.add_argument("--aliases", required=True, help="id<TAB>alias... lines (every language)")
    p.add_argument("--out", required=True, help="folder: the shards and candidates.json")
    p.add_argument("--triples", default=None,
                   help="head<TAB>relation<TAB>tail file: priors by 1 + degree")  # fmt: skip
    p.add_argument("--entities", default=None, help="entity id list: candidates only these")
    p.add_argument("--confusers", type=int, default=default_of(build_generator, "confusers"),
                   help="give each entity's aliases to this many others too (synthetic "
                        "ambiguity, for tables whose aliases are unique)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="of the confusers' draw")
    p.add_argument("--case", default="auto", choices=CASE_MODES)
    p.add_argument("--max-words", type=int, default=default_of(build_generator, "max_words"))
    p.add_argument("-k", type=int, default=default_of(build_generator, "k"),
                   help="candidates per span at most (KnowBERT: 30)")  # fmt: skip
    p.add_argument("--field", default="candidates", help="the json field written")
    p.add_argument("--no-progress", action="store_true")


@CONVERTERS.register("candidates", "KnowBERT's candidate spans by alias table → json.candidates",
                     _arguments)  # fmt: skip
def _command(args: argparse.Namespace) -> int:
    generator = build_generator(args.aliases, triples=args.triples, entities=args.entities,
                                confusers=args.confusers, seed=args.seed, case=args.case,
                                max_words=args.max_words, k=args.k)  # fmt: skip
    stats = write_candidate_shards(args.input, args.out, generator, field_name=args.field,
                                   progress=not args.no_progress)  # fmt: skip
    summary = stats.summary()
    Path(args.out, "candidates.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0
