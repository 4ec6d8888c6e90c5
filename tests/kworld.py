"""A miniature of toyworld's knowledge view (the issue-17 contract's layout), for the
knowledge-model tests: a graph of toys and their facts, aliases, descriptions, TransE-shaped
entity vectors, and text shards whose json marks the mentions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from mmptm.converters.triples import write_triple_shards
from mmptm.data.shards import ShardWriter
from mmptm.modalities.regions import regions_npz_bytes

TOYS = {"T000": "Bimo", "T001": "Kato", "T002": "Luma", "T003": "Pira", "T004": "Zeno"}
VALUES = {"M_wood": "wood", "M_metal": "metal", "P_anna": "Anna", "P_ben": "Ben"}
FACTS = {  # toy → {relation: value}
    "T000": {"made_of": "M_wood", "owned_by": "P_anna"},
    "T001": {"made_of": "M_metal", "owned_by": "P_ben"},
    "T002": {"made_of": "M_wood", "owned_by": "P_ben"},
    "T003": {"made_of": "M_metal", "owned_by": "P_anna"},
    "T004": {"made_of": "M_wood", "owned_by": "P_ben"},
}
RELATION_WORDS = {"made_of": "is made of", "owned_by": "belongs to"}


def sentences() -> list[tuple[str, list]]:
    """(text, mentions) pairs: one sentence per fact, mentions of both entities."""
    out = []
    for toy, facts in FACTS.items():
        for rel, value in facts.items():
            name, word = TOYS[toy], VALUES[value]
            text = f"{name} {RELATION_WORDS[rel]} {word} ."
            start = text.index(word, len(name))
            out.append((text, [[0, len(name), toy], [start, start + len(word), value]]))
    return out


def write_knowledge_world(root: Path, dim: int = 100, seed: int = 0) -> Path:
    """``root/knowledge/{graph,text,transe,triples}`` in the contract's layout; returns root."""
    k = root / "knowledge"
    (k / "graph").mkdir(parents=True, exist_ok=True)
    triples = [(t, r, v) for t, facts in FACTS.items() for r, v in facts.items()]
    (k / "graph" / "train.txt").write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in triples))
    names = {**TOYS, **VALUES}
    (k / "graph" / "aliases.txt").write_text("".join(f"{i}\t{n}\n" for i, n in names.items()))
    for lang in ("en", "de", "fr", "ru", "es"):  # toyworld's per-language files (kbert_tiny)
        (k / "graph" / f"aliases.{lang}.txt").write_text(
            "".join(f"{i}\t{n}\n" for i, n in names.items())
        )
    descriptions = {t: f"{n} is a toy ." for t, n in TOYS.items()}
    descriptions.update({v: f"{n} is a thing ." for v, n in VALUES.items()})
    (k / "graph" / "descriptions.txt").write_text(
        "".join(f"{i}\t{d}\n" for i, d in descriptions.items())
    )
    (k / "transe").mkdir(exist_ok=True)
    ids = list(names)
    rng = np.random.default_rng(seed)
    np.save(k / "transe" / "entities.npy", rng.normal(size=(len(ids), dim)).astype(np.float32))
    (k / "transe" / "entities.txt").write_text("".join(f"{i}\n" for i in ids))
    (k / "text").mkdir(exist_ok=True)
    for split in ("train", "val", "test"):
        with ShardWriter(str(k / "text" / f"{split}-en-%06d.tar"), 100) as w:
            for i, (text, mentions) in enumerate(sentences() * 2):
                meta = {"language": "en", "mentions": mentions}
                w.write({"__key__": f"{split}{i:04d}", "txt": text, "json": json.dumps(meta)})
    write_triple_shards(k / "graph", k / "graph" / "descriptions.txt", k / "triples")
    (k / "image_text").mkdir(exist_ok=True)
    toys = list(TOYS)
    with ShardWriter(str(k / "image_text" / "train-%06d.tar"), 100) as w:
        for i in range(16):  # two toys per scene, a third region without an entity
            a, b = toys[i % 5], toys[(i + 2) % 5]
            text = f"{TOYS[a]} and {TOYS[b]} ."
            start = len(TOYS[a]) + 5
            mentions = [[0, len(TOYS[a]), a], [start, start + len(TOYS[b]), b]]
            regions = {"features": rng.normal(size=(3, 64)), "boxes": [[0, 0, 0.5, 0.5]] * 3,
                       "image_size": [32, 32]}  # fmt: skip
            meta = {"captions": {"en": text}, "mentions": {"en": mentions},
                    "region_entities": [a, None, b]}  # fmt: skip
            w.write({"__key__": f"s{i:04d}", "json": json.dumps(meta),
                     "regions.npz": regions_npz_bytes(regions)})  # fmt: skip
    return root


def base_of(sd: dict) -> dict:
    """A K-Adapter state dict's frozen base: the encoders and the stack."""
    return {k: v for k, v in sd.items() if k.startswith(("encoders.", "fusion.stack."))}


def adapter_of(sd: dict, name: str) -> dict:
    """The tensors of adapter ``name``."""
    return {k: v for k, v in sd.items() if k.startswith(f"fusion.adapters.{name}.")}


def equal_sd(a: dict, b: dict) -> bool:
    """Whether two non-empty state dicts hold the same names and equal tensors."""
    assert a and a.keys() == b.keys()
    return all(torch.equal(a[k], b[k]) for k in a)
