"""K-BERT (Liu et al. 2020): a single-stream Transformer over sentence trees, attention
limited by each sentence's visible matrix.

The knowledge injection itself is a data stage (:mod:`mmptm.modalities.sentence_tree`): this
fusion declares it with the graph settings, and the text plug-in's mention spans with the
entity id list, so the recipe states them once. In the forward pass the text view's
``visible_mask [B,L,L]`` replaces its key-padding mask (``single_stream`` honours it);
soft positions arrive as the text view's ``position_ids``.
``knowledge: false`` injects nothing (``max_triples: 0``): the same model without the graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mmptm.fusion.single_stream import SingleStreamFusion
from mmptm.modalities.base import Need
from mmptm.registry import FUSIONS


@FUSIONS.register("kbert")
class KBertFusion(SingleStreamFusion):
    """``single_stream`` whose text view attends through K-BERT's visible matrix."""

    @dataclass
    class Config(SingleStreamFusion.Config):
        type: str = "kbert"
        #: the graph (a folder or triples file ``load_graph`` reads): its train split
        graph: str = ""
        #: the id list the mention ids are rows of (e.g. ``entities.txt``)
        entities: str = ""
        #: language → alias file naming the injected tails ("*": every language)
        aliases: dict[str, str] = field(default_factory=dict)
        #: relation id → name file (default: the id with _ as spaces)
        relation_names: str = ""
        #: the text view's json field of mentions
        mentions: str = "mentions"
        max_entity_triples: int = 2
        max_triples: int = 8
        #: tokens of a sentence with its branches
        max_len: int = 128
        #: false: inject nothing (the without-graph baseline)
        knowledge: bool = True

    cfg: Config

    def data_needs(self) -> dict[str, Need]:
        c = self.cfg
        text = {"spans": {"entity": c.mentions}, "span_vocabularies": {"entity": c.entities}}
        tree = {
            "graph": c.graph, "entities": c.entities, "aliases": dict(c.aliases),
            "relation_names": c.relation_names, "max_entity_triples": c.max_entity_triples,
            "max_triples": c.max_triples if c.knowledge else 0, "max_len": c.max_len,
        }  # fmt: skip
        return {"text": Need("text", text), "sentence_tree": Need("sentence_tree", tree)}
