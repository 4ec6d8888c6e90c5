"""Knowledge-graph data: triples, entity/relation vocabularies, aliases, descriptions, embeddings.

Formats read (the ones people have):

- tab-separated ``head<TAB>relation<TAB>tail`` lines: FB15k-237, WN18RR, Wikidata5M's
  ``wikidata5m_transductive_{train,valid,test}.txt``;
- a folder in the FB15k-237 / WN18RR layout (``train.txt``, ``valid.txt``, ``test.txt``) or
  Wikidata5M's (``*_train.txt``, ``*_valid.txt``, ``*_test.txt``);
- an OpenKE folder: ``entity2id.txt`` / ``relation2id.txt`` (a count line, then ``name<TAB>id``)
  and ``train2id.txt`` (a count line, then ``head tail relation`` ids: tail before relation),
  with ``valid2id.txt`` / ``test2id.txt`` if present;
- Wikidata5M's aliases (``wikidata5m_entity.txt``: id, then its aliases, tab-separated) and
  descriptions (``wikidata5m_text.txt``: id TAB text);
- entity embeddings: a ``.npy`` [N,D] with an id list (one id per line, row i = line i; the
  files ``mmptm kg train-embeddings`` writes), OpenKE-TF / Fast-TransX ``entity2vec.vec``
  (row i = entity id i, tab-separated floats) and OpenKE-PyTorch ``save_parameters`` JSON
  (``{"ent_embeddings.weight": [[...]], "rel_embeddings.weight": ...}``) or its
  ``save_checkpoint`` state dict (``.ckpt``), each with the
  folder's ``entity2id.txt`` naming the rows.

A malformed line is a ValueError naming ``file:line``. A valid/test triple whose entity or
relation training never saw (or, in OpenKE files, beyond ``entity2id.txt``) is dropped and
counted (``KnowledgeGraph.unknown``), as PyKEEN and LibKGE do, never a crash.
"""

from __future__ import annotations

import json
import logging
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")


@dataclass
class Vocabulary:
    """Id strings ↔ row numbers (row i of an embedding table is ``names[i]``)."""

    names: list[str]
    index: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.index:
            self.index = {name: i for i, name in enumerate(self.names)}
        if len(self.index) != len(self.names):
            dup = next(n for n, c in Counter(self.names).items() if c > 1)
            raise ValueError(f"vocabulary: id {dup!r} occurs twice")

    def __len__(self) -> int:
        return len(self.names)

    def save(self, path: str | Path) -> None:
        """One id per line, in row order."""
        for name in self.names:
            if not name or "\n" in name or "\t" in name:
                raise ValueError(f"vocabulary: id {name!r} cannot be written one per line")
        Path(path).write_text("".join(f"{n}\n" for n in self.names), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """Read a file :meth:`save` wrote (one id per line; row i = line i)."""
        names = []
        for lineno, line in _lines(path):
            if not line or "\t" in line:
                raise ValueError(f"{path}:{lineno}: expected one id per line, got {line!r}")
            names.append(line)
        return cls(names)


@dataclass
class KnowledgeGraph:
    """Triples as ints ``[N,3]`` (head, relation, tail) per split, with their vocabularies."""

    entities: Vocabulary
    relations: Vocabulary
    splits: dict[str, np.ndarray]
    #: per split: valid/test triples dropped, their head, relation or tail unseen in training
    unknown: dict[str, int] = field(default_factory=dict)
    source: str = ""

    def all_true(self) -> np.ndarray:
        """Every known true triple (train, valid, test): the filter of filtered ranking."""
        parts = [t for t in self.splits.values() if len(t)]
        return np.concatenate(parts) if parts else np.zeros((0, 3), np.int64)

    def summary(self) -> dict[str, int]:
        out = {"entities": len(self.entities), "relations": len(self.relations)}
        out.update({f"{k}_triples": len(v) for k, v in self.splits.items()})
        out.update({f"{k}_unknown": n for k, n in self.unknown.items() if n})
        return out


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its end of line); blank lines are skipped."""
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115 (a generator holds it)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    with f:
        for lineno, raw in enumerate(f, 1):
            line = raw.rstrip("\r\n")
            if line.strip():
                yield lineno, line


def iter_triples(path: str | Path) -> Iterator[tuple[str, str, str]]:
    """``head<TAB>relation<TAB>tail`` lines as string triples, one at a time."""
    for lineno, line in _lines(path):
        parts = line.split("\t")
        if len(parts) != 3 or not all(p.strip() for p in parts):
            raise ValueError(
                f"{path}:{lineno}: expected 'head<TAB>relation<TAB>tail', got {line[:80]!r}"
            )
        yield parts[0].strip(), parts[1].strip(), parts[2].strip()


def read_triples(path: str | Path) -> list[tuple[str, str, str]]:
    """``head<TAB>relation<TAB>tail`` lines as string triples."""
    return list(iter_triples(path))


def _tsv_graph(files: dict[str, Path], source: str) -> KnowledgeGraph:
    # Streamed and encoded line by line: a split is held as int64 [N,3], never as strings
    # (Wikidata5M's 20 M training triples as Python string tuples would take ~5 GB).
    # The vocabulary is training's, in order of first appearance (reproducible rows).
    ent_ids: dict[str, int] = {}
    rel_ids: dict[str, int] = {}
    flat = array("q")
    for h, r, t in iter_triples(files["train"]):
        flat.extend((ent_ids.setdefault(h, len(ent_ids)), rel_ids.setdefault(r, len(rel_ids)),
                     ent_ids.setdefault(t, len(ent_ids))))  # fmt: skip
    splits = {"train": np.frombuffer(flat, dtype=np.int64).reshape(-1, 3)}
    unknown = {"train": 0}
    for split, path in files.items():
        if split == "train":
            continue
        flat, dropped = array("q"), 0
        for h, r, t in iter_triples(path):
            if h in ent_ids and r in rel_ids and t in ent_ids:
                flat.extend((ent_ids[h], rel_ids[r], ent_ids[t]))
            else:
                dropped += 1
        splits[split] = np.frombuffer(flat, dtype=np.int64).reshape(-1, 3)
        unknown[split] = dropped
    ents = Vocabulary(list(ent_ids), ent_ids)
    rels = Vocabulary(list(rel_ids), rel_ids)
    return KnowledgeGraph(ents, rels, splits, unknown, source)


def read_openke_ids(path: str | Path) -> Vocabulary:
    """OpenKE's ``entity2id.txt`` / ``relation2id.txt``: a count line, then ``name<TAB>id``."""
    lines = list(_lines(path))
    count = _count_line(path, lines)
    names: list[str | None] = [None] * count
    for lineno, line in lines[1:]:
        parts = line.split("\t") if "\t" in line else line.split()
        if len(parts) != 2 or not parts[1].strip().isdigit():
            raise ValueError(f"{path}:{lineno}: expected 'name<TAB>id', got {line[:80]!r}")
        i = int(parts[1])
        if i >= count or names[i] is not None:
            raise ValueError(f"{path}:{lineno}: id {i} out of range or repeated (count {count})")
        names[i] = parts[0].strip()
    if any(n is None for n in names):
        raise ValueError(f"{path}: {count} declared, {len(lines) - 1} given")
    return Vocabulary(names)  # type: ignore[arg-type]


def _count_line(path: str | Path, lines: list[tuple[int, str]]) -> int:
    if not lines or not lines[0][1].strip().isdigit():
        first = lines[0] if lines else (1, "")
        raise ValueError(f"{path}:{first[0]}: expected OpenKE's count line, got {first[1]!r}")
    return int(lines[0][1])


def read_openke_triples(path: str | Path) -> np.ndarray:
    """OpenKE's ``*2id.txt``: a count line, then ``head tail relation`` → ints [N,3] (h, r, t)."""
    lines = list(_lines(path))
    count = _count_line(path, lines)
    rows = []
    for lineno, line in lines[1:]:
        parts = line.split()
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"{path}:{lineno}: expected 'head tail relation' ids, got {line!r}")
        h, t, r = (int(p) for p in parts)
        rows.append((h, r, t))
    if len(rows) != count:
        raise ValueError(f"{path}: count line says {count} triples, the file has {len(rows)}")
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def _openke_graph(folder: Path) -> KnowledgeGraph:
    ents = read_openke_ids(folder / "entity2id.txt")
    rels = read_openke_ids(folder / "relation2id.txt")
    splits, unknown = {}, {}
    train = read_openke_triples(folder / "train2id.txt")
    bad = (train[:, [0, 2]] >= len(ents)).any(1) | (train[:, 1] >= len(rels))
    if bad.any():
        raise ValueError(f"{folder / 'train2id.txt'}: triple {int(np.flatnonzero(bad)[0]) + 1} "
                         "has an id beyond entity2id/relation2id")  # fmt: skip
    splits["train"], unknown["train"] = train, 0
    # as for tab-separated files: a valid/test triple is scored only if training saw its
    # entities and relation (an entity2id row never trained is still a random vector)
    seen_e = np.zeros(len(ents), bool)
    seen_e[train[:, [0, 2]].ravel()] = True
    seen_r = np.zeros(len(rels), bool)
    seen_r[train[:, 1]] = True
    for split in SPLITS[1:]:
        path = folder / f"{split}2id.txt"
        if not path.exists():
            continue
        arr = read_openke_triples(path)
        ok = (arr[:, [0, 2]] < len(ents)).all(1) & (arr[:, 1] < len(rels))
        ok[ok] = seen_e[arr[ok][:, [0, 2]]].all(1) & seen_r[arr[ok][:, 1]]
        splits[split], unknown[split] = arr[ok], int((~ok).sum())
    return KnowledgeGraph(ents, rels, splits, unknown, str(folder))


def _split_files(folder: Path) -> dict[str, Path] | None:
    """FB15k-237 / WN18RR names, else Wikidata5M's ``*_<split>.txt``; None if neither."""
    if (folder / "train.txt").exists():
        return {s: folder / f"{s}.txt" for s in SPLITS if (folder / f"{s}.txt").exists()}
    found = {}
    for split in SPLITS:
        matches = sorted(folder.glob(f"*_{split}.txt"))
        if len(matches) > 1:
            raise ValueError(f"{folder}: several *_{split}.txt files: {[m.name for m in matches]}")
        if matches:
            found[split] = matches[0]
    return found if "train" in found else None


def load_graph(path: str | Path) -> KnowledgeGraph:
    """A triples file (all training), a split folder (tab-separated), or an OpenKE folder."""
    path = Path(path)
    if path.is_dir():
        if (path / "train2id.txt").exists():
            graph = _openke_graph(path)
        elif (files := _split_files(path)) is not None:
            graph = _tsv_graph(files, str(path))
        else:
            raise ValueError(
                f"{path}: no train.txt (FB15k-237 / WN18RR layout), *_train.txt (Wikidata5M) "
                "or train2id.txt (OpenKE) in this folder"
            )
    elif path.exists():
        graph = _tsv_graph({"train": path}, str(path))
    else:
        raise FileNotFoundError(f"{path}: no such file or folder")
    if not len(graph.splits["train"]):
        raise ValueError(f"{path}: no training triples")
    for split, n in graph.unknown.items():
        if n:
            log.warning("%s: %d %s triples name an entity or relation unknown to training; "
                        "dropped", path, n, split)  # fmt: skip
    return graph


def read_aliases(path: str | Path) -> dict[str, list[str]]:
    """Wikidata5M's ``wikidata5m_entity.txt``: id, then one or more aliases, tab-separated."""
    out: dict[str, list[str]] = {}
    for lineno, line in _lines(path):
        parts = [p.strip() for p in line.split("\t")]
        aliases = [p for p in parts[1:] if p]
        if len(parts) < 2 or not parts[0] or not aliases:
            raise ValueError(f"{path}:{lineno}: expected 'id<TAB>alias[<TAB>alias...]'")
        out.setdefault(parts[0], []).extend(aliases)
    return out


def read_descriptions(path: str | Path) -> dict[str, str]:
    """Wikidata5M's ``wikidata5m_text.txt``: id TAB text (the text may hold further tabs)."""
    out: dict[str, str] = {}
    for lineno, line in _lines(path):
        parts = line.split("\t", 1)
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise ValueError(f"{path}:{lineno}: expected 'id<TAB>text', got {line[:80]!r}")
        out[parts[0].strip()] = parts[1].strip()
    return out


@dataclass
class Embeddings:
    """An embedding table ``vectors [N,D]`` whose row i is ``vocab.names[i]``."""

    vocab: Vocabulary
    vectors: np.ndarray

    def __post_init__(self) -> None:
        if self.vectors.ndim != 2 or len(self.vectors) != len(self.vocab):
            raise ValueError(
                f"embeddings: {tuple(self.vectors.shape)} rows for {len(self.vocab)} ids"
            )

    def lookup(self, names: list[str]) -> np.ndarray:
        """Rows of ``names`` [len(names), D]; an unknown id is a KeyError naming it."""
        missing = [n for n in names if n not in self.vocab.index]
        if missing:
            raise KeyError(f"no embedding for {missing[:5]} ({len(missing)} unknown ids)")
        return self.vectors[[self.vocab.index[n] for n in names]]


#: the files :func:`save_embeddings` writes into a folder, per kind
EMBEDDING_FILES = {"entities": ("entities.npy", "entities.txt"),
                   "relations": ("relations.npy", "relations.txt")}  # fmt: skip


def save_embeddings(folder: str | Path, kind: str, emb: Embeddings) -> None:
    """``<kind>.npy`` [N,D] float32 and ``<kind>.txt`` (ids, row order) into ``folder``."""
    npy, txt = EMBEDDING_FILES[kind]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / npy
    vectors = np.asarray(emb.vectors, dtype=np.float32)
    if not (isinstance(emb.vectors, np.memmap) and Path(emb.vectors.filename) == target.resolve()):
        np.save(target, vectors)  # a memory-mapped table already is that file
    emb.vocab.save(folder / txt)


def load_embeddings(
    path: str | Path, ids: str | Path | None = None, *, kind: str = "entities", mmap: bool = False
) -> Embeddings:
    """Entity (or relation) embeddings from any of the formats in the module docstring.

    ``path``: a folder ``mmptm kg train-embeddings`` wrote (``<kind>.npy`` + ``<kind>.txt``),
    a ``.npy`` (``ids``: its id list, one per line), OpenKE's ``entity2vec.vec`` /
    ``relation2vec.vec``, ``save_parameters`` JSON or ``save_checkpoint`` state dict
    (``.ckpt``, ``.pt``, ``.pth``) (``ids``: the ``entity2id.txt`` /
    ``relation2id.txt``; default: the one beside ``path``). ``mmap``: a ``.npy`` is
    memory-mapped (read-only), so a 4.6 M × 100 table is not read into memory.
    """
    path = Path(path)
    if path.is_dir():
        npy, txt = EMBEDDING_FILES[kind]
        path, ids = path / npy, ids or path / txt
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    openke_ids = "entity2id.txt" if kind == "entities" else "relation2id.txt"
    if path.suffix == ".npy":
        if ids is None:
            raise ValueError(f"{path}: a .npy table needs its id list (one id per line)")
        vectors = np.load(path, mmap_mode="r" if mmap else None)
        vocab = Vocabulary.load(ids)
    elif path.suffix in (".json", ".ckpt", ".pt", ".pth"):
        vectors = _openke_params(path, kind)
        vocab = read_openke_ids(ids or path.parent / openke_ids)
    else:  # OpenKE-TF / Fast-TransX text: one row of floats per id
        vectors = _vec_text(path)
        vocab = read_openke_ids(ids or path.parent / openke_ids)
    try:
        return Embeddings(vocab, vectors)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _openke_params(path: Path, kind: str) -> np.ndarray:
    """The table of OpenKE-PyTorch's ``save_parameters`` JSON or ``save_checkpoint`` file."""
    key = "ent_embeddings" if kind == "entities" else "rel_embeddings"
    if path.suffix == ".json":
        try:
            params = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
    else:
        import torch  # only for checkpoints: the readers above need no torch

        try:
            params = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a pickle error or a zip error, depending on the damage
            raise ValueError(f"{path}: not a PyTorch state dict ({type(e).__name__})") from None
    for name in (f"{key}.weight", key):  # OpenKE-PyTorch, OpenKE-TF's *.vec.json
        if isinstance(params, dict) and name in params:
            value = params[name]
            value = value.numpy() if hasattr(value, "numpy") else value
            return np.asarray(value, dtype=np.float32)
    raise ValueError(f"{path}: no '{key}.weight' (OpenKE's parameter names) in this file")


def _vec_text(path: Path) -> np.ndarray:
    rows, width = [], None
    for lineno, line in _lines(path):
        try:
            row = [float(x) for x in line.split()]
        except ValueError:
            raise ValueError(f"{path}:{lineno}: expected numbers, got {line[:80]!r}") from None
        if width is None:
            width = len(row)
        if len(row) != width or not row:
            raise ValueError(f"{path}:{lineno}: {len(row)} numbers, the first row has {width}")
        rows.append(row)
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), width or 0)
