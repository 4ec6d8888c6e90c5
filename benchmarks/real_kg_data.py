"""A real lexical graph for link prediction, built from Debian's ``wordnet-base`` (WordNet 3.0).

Source: ``/usr/share/wordnet/data.{noun,verb,adj,adv}`` of the Debian package ``wordnet-base``
(``apt-get install -y wordnet-base``), WordNet 3.0, © 2006 Princeton University, under the
WordNet 3.0 licence (use, copy, modify and distribute for any purpose without fee, keeping the
copyright notice; no warranty: ``/usr/share/doc/wordnet-base/copyright``).

Entities are synsets (``n02084071``: part of speech, then WordNet's byte offset; adjective
satellites count as adjectives); each one's description is its lemmas and its gloss
(``descriptions.txt``, ``id<TAB>text``: KEPLER's setting). Relations are WN18RR's eleven
(Dettmers et al. 2018), one direction of every inverse pair (hypernym but not hyponym,
meronym but not holonym, a domain's member but not the domain's list), which is how WN18RR
removed the leakage of WN18's inverse relations: derivationally related form, similar to,
also see and verb group are symmetric (WordNet states both directions), so both directions
of one pair form one *fact* and go to the same split. The graph is the ``k``-core (every
entity in ≥ k triples, repeated until stable; WN18 filtered rare entities the same way) of
the union of these relations, then its largest connected component, so that a run fits
minutes on 2 cores. Valid and test facts are drawn (seeded) only where both entities keep a
training triple, so no test triple, nor its reverse, is in training and no test entity is
unseen.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from pathlib import Path

WORDNET = Path("/usr/share/wordnet")
POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}

#: WordNet pointer symbol → relation (WN18RR's eleven; the inverse symbols are left out)
RELATIONS = {
    "@": "hypernym", "@i": "instance_hypernym", "%m": "member_meronym", "%p": "has_part",
    ";c": "synset_domain_topic_of", ";r": "member_of_domain_region",
    ";u": "member_of_domain_usage", "+": "derivationally_related_form", "&": "similar_to",
    "^": "also_see", "$": "verb_group",
}  # fmt: skip
SYMMETRIC = {"derivationally_related_form", "similar_to", "also_see", "verb_group"}


def _sid(pos: str, offset: str) -> str:
    return ("a" if pos == "s" else pos) + offset


def read_wordnet(root: Path = WORDNET) -> tuple[set[tuple[str, str, str]], dict[str, str]]:
    """(every triple of the eleven relations, synset id → 'lemma, lemma: gloss')."""
    triples: set[tuple[str, str, str]] = set()
    texts: dict[str, str] = {}
    for pos, name in POS_FILES.items():
        path = root / f"data.{name}"
        if not path.exists():
            raise SystemExit(f"{path}: missing; install it with 'apt-get install -y wordnet-base'")
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line or line.startswith(" "):
                continue  # the licence header
            data, _, gloss = line.partition(" | ")
            f = data.split()
            head = _sid(pos, f[0])
            n_words = int(f[3], 16)
            lemmas = [w.replace("_", " ") for w in f[4 : 4 + 2 * n_words : 2]]
            i = 4 + 2 * n_words
            n_ptr = int(f[i])
            for j in range(n_ptr):
                sym, off, tpos = f[i + 1 + 4 * j : i + 4 + 4 * j]
                if sym in RELATIONS:
                    tail = _sid(tpos, off)
                    if tail != head:
                        triples.add((head, RELATIONS[sym], tail))
            texts[head] = f"{', '.join(dict.fromkeys(lemmas))}: {gloss.strip()}"
    return triples, texts


def core_component(triples: set[tuple[str, str, str]], k: int) -> set[tuple[str, str, str]]:
    """The triples of the largest connected component of the graph's ``k``-core."""
    kept = set(triples)
    while True:
        degree = Counter(e for h, _, t in kept for e in (h, t))
        drop = {e for e, d in degree.items() if d < k}
        if not drop:
            break
        kept = {x for x in kept if x[0] not in drop and x[2] not in drop}
    adj: dict[str, set[str]] = defaultdict(set)
    for h, _, t in kept:
        adj[h].add(t)
        adj[t].add(h)
    seen: set[str] = set()
    best: set[str] = set()
    for start in sorted(adj):
        if start in seen:
            continue
        comp, stack = {start}, [start]
        while stack:
            for nb in adj[stack.pop()]:
                if nb not in comp:
                    comp.add(nb)
                    stack.append(nb)
        seen |= comp
        best = max(best, comp, key=len)
    return {x for x in kept if x[0] in best}


def facts(triples: set[tuple[str, str, str]]) -> list[list[tuple[str, str, str]]]:
    """Triples grouped so that a symmetric pair's two directions are one fact (sorted)."""
    groups: dict[tuple, list[tuple[str, str, str]]] = defaultdict(list)
    for h, r, t in sorted(triples):
        key = (r, *sorted((h, t))) if r in SYMMETRIC else (h, r, t)
        groups[key].append((h, r, t))
    return [groups[k] for k in sorted(groups)]


def split_facts(groups: list[list[tuple[str, str, str]]], share: float, seed: int
                ) -> dict[str, list[tuple[str, str, str]]]:  # fmt: skip
    """train/valid/test: ``share`` of the facts each for valid and test, drawn only where
    both entities keep a training triple (no entity is unseen in training)."""
    order = list(range(len(groups)))
    random.Random(seed).shuffle(order)
    degree = Counter(e for g in groups for h, _, t in g for e in (h, t))
    quota = {"test": int(share * len(groups)), "valid": int(share * len(groups))}
    parts: dict[str, list[tuple[str, str, str]]] = {"train": [], "valid": [], "test": []}
    for i in order:
        g = groups[i]
        need = Counter(e for h, _, t in g for e in (h, t))
        split = next((s for s in ("test", "valid") if quota[s]), "train")
        if split != "train" and all(degree[e] > n for e, n in need.items()):
            quota[split] -= 1
            degree.subtract(need)
        else:
            split = "train"
        parts[split].extend(g)
    return parts


def write_graph(folder: Path, k: int = 4, share: float = 0.05, seed: int = 0) -> dict:
    """``train.txt``/``valid.txt``/``test.txt`` (``head<TAB>relation<TAB>tail``, what
    ``mmptm kg train-embeddings`` reads) and ``descriptions.txt``; returns the counts."""
    triples, texts = read_wordnet()
    kept = core_component(triples, k)
    parts = split_facts(facts(kept), share, seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in parts.items():
        (folder / f"{name}.txt").write_text("".join("\t".join(x) + "\n" for x in part))
    entities = sorted({e for h, _, t in kept for e in (h, t)})
    (folder / "descriptions.txt").write_text("".join(f"{e}\t{texts[e]}\n" for e in entities))
    rels = Counter(r for _, r, _ in kept)
    return {"wordnet_triples": len(triples), "wordnet_synsets": len(texts), "k_core": k,
            "entities": len(entities), "relations": len(rels), "triples": len(kept),
            **{name: len(part) for name, part in parts.items()},
            "per_relation": dict(sorted(rels.items(), key=lambda x: -x[1])),
            "test_per_relation": dict(Counter(r for _, r, _ in parts["test"]))}  # fmt: skip
