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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mmptm.converters.linking import CASE_MODES, exact_case, fold, word_edges

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
