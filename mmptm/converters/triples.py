"""Knowledge-graph triples as training shards for KEPLER's knowledge-embedding objective.

One sample per training triple (h, r, t): ``json = {"texts": [description of h, description
of t], "languages": [lang, lang], "relation": r, "head": h, "tail": t}``. The text plug-in
reads the descriptions as a sentence pair, which a source with ``pairs: stack`` lays out as
rows i (heads) and B + i (tails) of one text view, each encoded alone; the relation plug-in
reads ``relation``. ``relations.txt`` (the relation vocabulary, graph order) and
``entities.txt`` (the entities with a description, graph order) are written beside the
shards. Triples with an entity lacking a description are skipped and counted.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from mmptm.data.shards import ShardWriter
from mmptm.kg.graph import Vocabulary, load_graph, read_descriptions
from mmptm.registry import CONVERTERS, default_of

log = logging.getLogger(__name__)


def write_triple_shards(
    graph: str | Path,
    descriptions: str | Path,
    out: str | Path,
    *,
    split: str = "train",
    language: str = "en",
    shard_size: int = 10_000,
) -> dict[str, int]:
    """Write ``out/{split}-%06d.tar`` (module docstring); returns counts."""
    kg = load_graph(graph)
    if split not in kg.splits:
        raise ValueError(f"{graph}: no {split} split (has {sorted(kg.splits)})")
    text = read_descriptions(descriptions)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names, rels = kg.entities.names, kg.relations.names
    written = skipped = 0
    with ShardWriter(str(out / f"{split}-%06d.tar"), shard_size) as w:
        for i, (h, r, t) in enumerate(kg.splits[split].tolist()):
            head, tail = names[h], names[t]
            if head not in text or tail not in text:
                skipped += 1
                continue
            meta = {"texts": [text[head], text[tail]], "languages": [language, language],
                    "relation": rels[r], "head": head, "tail": tail}  # fmt: skip
            w.write({"__key__": f"{split}{i:09d}", "json": json.dumps(meta, ensure_ascii=False)})
            written += 1
    if skipped:
        log.warning("%s: %d triples skipped, an entity has no description", graph, skipped)
    Vocabulary(list(rels)).save(out / "relations.txt")
    Vocabulary([n for n in names if n in text]).save(out / "entities.txt")
    return {"triples": written, "skipped": skipped, "relations": len(rels)}


def _triples_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph", help="a graph folder (train/valid/test.txt) or triples file")
    p.add_argument("--descriptions", default=None,
                   help="id<TAB>text file (default: GRAPH/descriptions.txt)")  # fmt: skip
    p.add_argument("--out", required=True, help="folder: SPLIT-%%06d.tar and relations.txt")
    p.add_argument("--split", default=default_of(write_triple_shards, "split"))
    p.add_argument("--language", default=default_of(write_triple_shards, "language"),
                   help="the descriptions' language")  # fmt: skip
    p.add_argument("--shard-size", type=int, default=default_of(write_triple_shards, "shard_size"))


@CONVERTERS.register("triples", "graph triples + descriptions → KEPLER shards", _triples_arguments)
def _triples_command(args: argparse.Namespace) -> int:
    descriptions = args.descriptions or str(Path(args.graph) / "descriptions.txt")
    counts = write_triple_shards(args.graph, descriptions, args.out, split=args.split,
                                 language=args.language, shard_size=args.shard_size)  # fmt: skip
    print(json.dumps(counts))
    return 0
