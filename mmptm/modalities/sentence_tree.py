"""K-BERT's sentence trees (Liu et al. 2020): the graph's triples injected into the text.

It reads the graph at data time with :mod:`mmptm.kg.graph`'s readers and registers itself
like every plug-in of this package (the ``kbert`` fusion declares it by name). A plug-in
without shard members: it reads no sample, it adds a batch stage, :class:`InjectTriples`,
that rewrites the text view after the text plug-in has marked the mentions (``entity_ids``
at a mention's first piece, ``entity_mask`` on all its pieces, from ``spans``). For each
mention, up to ``max_entity_triples`` triples (entity, relation, tail) of the graph become branches
inserted right after the mention: the relation's name and the tail's name, tokenised in
the sentence's language (``aliases``: a Wikidata5M alias file per language, ``*`` for one
of every language; a relation id reads as words, ``made_of`` → "made of", unless
``relation_names`` names it). At most ``max_triples`` per sentence, and no more
than fit in ``max_len`` tokens.

What it writes (the text view's keys, re-laid out, plus two):

- **soft positions** (``position_ids``): the sentence's tokens keep their positions; a
  branch's tokens continue from its mention's last token (mention at p → p+1, p+2, ...), so
  a branch and the sentence after the mention share positions, as in the paper;
- **the visible matrix** ``visible_mask [B,L,L]`` (True = may attend): the sentence's tokens
  see each other; a mention's tokens also see their branches; a branch's tokens see their
  branch and their mention only, so injected knowledge reaches the sentence through the
  entity alone. Padding sees itself only (no empty attention row);
- ``injected_mask [B,L]``: True on branch tokens (MLM never masks them).

Branch tokens take their mention's segment and language ids; span keys are -1 / False
there. ``max_triples: 0`` injects nothing (the without-graph baseline with the same model).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from mmptm.kg.graph import load_graph, read_aliases
from mmptm.modalities.base import Modality, Sample, read_id_list, view_prefix
from mmptm.registry import MODALITIES


def _names(path: str) -> dict[str, str]:
    """id → first alias of a Wikidata5M alias file (``id<TAB>alias[<TAB>alias...]``)."""
    return {i: a[0] for i, a in read_aliases(path).items()}


@dataclass
class Branch:
    """One injected triple: its token ids, placed after sentence token ``anchor`` (the
    mention's last piece), visible to the mention's pieces ``mention`` [start, end)."""

    ids: list[int]
    anchor: int
    mention: tuple[int, int]


def sentence_tree(
    ids: Sequence[int], positions: Sequence[int], branches: Sequence[Branch]
) -> tuple[list[int], list[int], list[bool], torch.Tensor, list[int]]:
    """Lay out one sentence with its branches.

    Returns (token ids, soft positions, injected flags, visible matrix [n,n], and for each
    output token the sentence index it copies its segment / language from).
    """
    after: dict[int, list[int]] = defaultdict(list)
    for k, br in enumerate(branches):
        after[br.anchor].append(k)
    out_ids, pos, injected, source, owner = [], [], [], [], []  # owner: branch k or -1
    for i, tok in enumerate(ids):
        out_ids.append(tok)
        pos.append(positions[i])
        injected.append(False)
        source.append(i)
        owner.append(-1)
        for k in after.get(i, []):
            for step, t in enumerate(branches[k].ids, 1):
                out_ids.append(t)
                pos.append(positions[i] + step)
                injected.append(True)
                source.append(i)
                owner.append(k)
    owner_t = torch.tensor(owner)
    sentence = owner_t < 0
    vis = sentence[:, None] & sentence[None, :]  # the sentence sees itself
    vis |= (owner_t[:, None] == owner_t[None, :]) & ~sentence[:, None]  # a branch itself
    index = torch.tensor(source)
    for k, br in enumerate(branches):
        in_mention = sentence & (index >= br.mention[0]) & (index < br.mention[1])
        mine = owner_t == k
        vis |= in_mention[:, None] & mine[None, :]  # the entity sees its branch
        vis |= mine[:, None] & in_mention[None, :]  # the branch sees its entity
    return out_ids, pos, injected, vis, source


@dataclass
class InjectTriples:
    """The batch stage (priority 16: after pair packing, before masking); module docstring."""

    data_priority: ClassVar[int] = 16

    prefix: str
    #: entity row → [(relation words, tail id)]
    facts: dict[int, list[tuple[str, str]]]
    #: language → (tail id → name); "*" for every language
    names: dict[str, dict[str, str]]
    languages: tuple[str, ...]
    tokenizer: Any
    max_entity_triples: int
    max_triples: int
    max_len: int
    _cache: dict = field(default_factory=dict, repr=False)

    def _branch_ids(self, words: str, tail: str, lang: str) -> list[int]:
        key = (words, tail, lang)
        if key not in self._cache:
            table = self.names.get(lang) or self.names.get("*") or {}
            name = table.get(tail) or self.names.get("*", {}).get(tail) or tail
            self._cache[key] = self.tokenizer.encode(f"{words} {name}")
        return self._cache[key]

    def __call__(self, batch: dict, g: torch.Generator) -> dict:
        p = self.prefix
        if f"{p}entity_ids" not in batch:
            return batch
        ids_BL, real_BL = batch[f"{p}input_ids"], batch[f"{p}attention_mask"]
        ents_BL, inside_BL = batch[f"{p}entity_ids"], batch[f"{p}entity_mask"]
        B, L = ids_BL.shape
        pos_BL = batch.get(f"{p}position_ids")
        if pos_BL is None:
            pos_BL = torch.arange(L).expand(B, L)
        lang_BL = batch.get(f"{p}lang_ids")
        rows = []
        for b in range(B):
            n = int(real_BL[b].sum())
            lang_id = int(lang_BL[b, 0]) if lang_BL is not None else 0
            lang = self.languages[lang_id] if lang_id < len(self.languages) else ""
            branches, budget = [], self.max_len - n
            for j in range(n):
                e = int(ents_BL[b, j])
                if e < 0 or len(branches) >= self.max_triples:
                    continue
                end = j + 1  # the mention: its first piece and the span pieces after it
                while end < n and bool(inside_BL[b, end]) and int(ents_BL[b, end]) < 0:
                    end += 1
                for words, tail in self.facts.get(e, [])[: self.max_entity_triples]:
                    t = self._branch_ids(words, tail, lang)
                    if len(branches) >= self.max_triples or len(t) > budget:
                        break
                    branches.append(Branch(t, end - 1, (j, end)))
                    budget -= len(t)
            rows.append(sentence_tree(ids_BL[b, :n].tolist(), pos_BL[b, :n].tolist(), branches))
        L2 = max(len(r[0]) for r in rows)
        out: dict[str, torch.Tensor] = {
            "input_ids": torch.full((B, L2), self.tokenizer.pad_id, dtype=ids_BL.dtype),
            "attention_mask": torch.zeros(B, L2, dtype=torch.bool),
            "position_ids": torch.zeros(B, L2, dtype=torch.long),
            "injected_mask": torch.zeros(B, L2, dtype=torch.bool),
            "visible_mask": torch.eye(L2, dtype=torch.bool).repeat(B, 1, 1),
        }
        copied = {k: batch[f"{p}{k}"] for k in ("segment_ids", "lang_ids") if f"{p}{k}" in batch}
        for k, t in copied.items():
            out[k] = torch.zeros(B, L2, dtype=t.dtype)
        # every span annotation of the text plug-in (``<name>_ids`` + ``<name>_mask``: the
        # entity mentions, a fine-tuning head's mention or subject / object spans) follows its
        # tokens into the tree; branch tokens are in none
        spans = {
            k[len(p) : -len("_ids")]: (batch[k], batch[f"{k[: -len('_ids')]}_mask"])
            for k in batch
            if k.startswith(p) and k.endswith("_ids") and f"{k[: -len('_ids')]}_mask" in batch
            and k[len(p) :] not in ("input_ids", "segment_ids", "lang_ids", "position_ids")
            and batch[k].shape == ids_BL.shape
        }  # fmt: skip
        for name in spans:
            out[f"{name}_ids"] = torch.full((B, L2), -1, dtype=torch.long)
            out[f"{name}_mask"] = torch.zeros(B, L2, dtype=torch.bool)
        for b, (ids, pos, injected, vis, source) in enumerate(rows):
            m = len(ids)
            src = torch.tensor(source)
            inj = torch.tensor(injected)
            out["input_ids"][b, :m] = torch.tensor(ids)
            out["attention_mask"][b, :m] = True
            out["position_ids"][b, :m] = torch.tensor(pos)
            out["injected_mask"][b, :m] = inj
            out["visible_mask"][b, :m, :m] = vis
            for k, t in copied.items():
                out[k][b, :m] = t[b, src]
            for name, (span_ids_BL, span_mask_BL) in spans.items():
                out[f"{name}_ids"][b, :m] = torch.where(inj, -1, span_ids_BL[b, src])
                out[f"{name}_mask"][b, :m] = span_mask_BL[b, src] & ~inj
        batch.update({p + k: v for k, v in out.items()})
        return batch


@MODALITIES.register("sentence_tree")
class SentenceTreeData(Modality):
    """K-BERT's knowledge injection into a text view (module docstring); reads no member."""

    members: ClassVar[tuple[str, ...]] = ()
    keys: ClassVar[tuple[str, ...]] = ("visible_mask", "injected_mask")

    @dataclass
    class Config:
        type: str = "sentence_tree"
        #: the text view the branches go into
        text_view: str = "text"
        #: a graph folder or triples file (``load_graph``): the triples of its train split
        graph: str = ""
        #: the id list whose rows ``entity_ids`` hold (the text plug-in's span vocabulary)
        entities: str = ""
        #: language → alias file (Wikidata5M format) naming the tails; "*": every language
        aliases: dict[str, str] = field(default_factory=dict)
        #: relation id → name file (``id<TAB>name``); default: the id with _ as spaces
        relation_names: str = ""
        max_entity_triples: int = 2
        #: per sentence; 0 = inject nothing
        max_triples: int = 8
        #: tokens of a sentence with its branches (branches that do not fit are left out)
        max_len: int = 128

    def __init__(self, cfg: Config, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        tok = self.context.tokenizer
        if tok is None:
            raise ValueError("sentence_tree needs a tokenizer (data.tokenizer)")
        self.facts: dict[int, list[tuple[str, str]]] = {}
        self.names: dict[str, dict[str, str]] = {}
        if cfg.max_triples > 0:
            if not cfg.graph or not cfg.entities:
                raise ValueError("data.modalities.sentence_tree needs graph and entities")
            kg = load_graph(cfg.graph)
            rows = read_id_list(cfg.entities)
            rel_names = _names(cfg.relation_names) if cfg.relation_names else {}
            ents, rels = kg.entities.names, kg.relations.names
            for h, r, t in kg.splits["train"].tolist():
                if ents[h] in rows:
                    words = rel_names.get(rels[r]) or rels[r].replace("_", " ")
                    self.facts.setdefault(rows[ents[h]], []).append((words, ents[t]))
            self.names = {lang: _names(path) for lang, path in cfg.aliases.items()}

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        return {}

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        return {}

    def transforms(self) -> list[Any]:
        tok = self.context.tokenizer
        return [
            InjectTriples(
                prefix=view_prefix("text", self.cfg.text_view),
                facts=self.facts,
                names=self.names,
                languages=tuple(tok.languages),
                tokenizer=tok,
                max_entity_triples=self.cfg.max_entity_triples,
                max_triples=self.cfg.max_triples,
                max_len=self.cfg.max_len,
            )
        ]
