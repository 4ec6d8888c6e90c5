"""Link prediction for a KEPLER run: every entity encoded from its description, ranked by
TransE with the run's relation table (filtered MRR / Hits@k of ``eval/link_prediction.py``).

Legend: E entities, R relations, D width.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mmptm.eval.link_prediction import link_prediction, named_relations
from mmptm.kg.graph import load_graph, read_descriptions
from mmptm.modalities.base import DataContext, Need, build_modalities, read_id_list
from mmptm.models.kge import KGEModel
from mmptm.objectives.kepler import KnowledgeEmbedding


@torch.no_grad()
def encode_texts(model, tokenizer, cfg, texts: list[str], view: str = "text",
                 language: str = "en", batch_size: int = 64) -> torch.Tensor:  # fmt: skip
    """[len(texts), D]: each text encoded alone, the final state of its first token."""
    (plugin,) = build_modalities({view: Need("text")}, cfg.data.modalities,
                                 DataContext(tokenizer=tokenizer))  # fmt: skip
    device = next(model.parameters()).device
    rows = []
    for start in range(0, len(texts), batch_size):
        batch = plugin.collate(
            [plugin.encode(t, language) for t in texts[start : start + batch_size]]
        )
        batch = {k: v.to(device) for k, v in batch.items()}
        rows.append(model.fuse(batch).hidden[view][:, 0].float().cpu())
    return torch.cat(rows) if rows else torch.zeros(0, model.cfg.width)


def kepler_link_prediction(
    model,
    tokenizer,
    cfg,
    graph: str | Path,
    *,
    descriptions: str | Path | None = None,
    split: str = "test",
    objective: str = "",
    max_triples: int = 0,
) -> dict:
    """Filtered link prediction of ``graph``'s ``split`` by a model with a
    ``knowledge_embedding`` objective (``objective``: its name; default the only one).

    ``descriptions``: ``id<TAB>text`` (default ``graph/descriptions.txt``); an entity without
    one is encoded from its id string and counted (``no_description``).
    """
    kes = {n: o for n, o in model.objectives.items() if isinstance(o, KnowledgeEmbedding)}
    if objective:
        kes = {n: o for n, o in kes.items() if n == objective}
    if len(kes) != 1:
        raise ValueError(f"the run needs one knowledge_embedding objective; has {sorted(kes)}")
    (ke,) = kes.values()
    kg = load_graph(graph)
    if split not in kg.splits:
        raise ValueError(f"{graph}: no {split} split (has {sorted(kg.splits)})")
    text = read_descriptions(descriptions or Path(graph) / "descriptions.txt")
    names = kg.entities.names
    missing = sum(n not in text for n in names)
    was_training = model.training
    model.eval()
    entities_ED = encode_texts(model, tokenizer, cfg, [text.get(n, n) for n in names],
                               view=ke.cfg.modality)  # fmt: skip
    model.train(was_training)
    table = ke.relation_table().detach().float().cpu()
    if ke.cfg.relations:
        rows = read_id_list(ke.cfg.relations)
        unknown = [r for r in kg.relations.names if r not in rows]
        if unknown:
            raise ValueError(f"{graph}: relations {unknown[:5]} are not in {ke.cfg.relations}")
        table = table[[rows[r] for r in kg.relations.names]]
    scorer = KGEModel(1, 1, entities_ED.shape[1], model=ke.cfg.model, p_norm=ke.cfg.p_norm,
                      normalize_entities=False)  # fmt: skip
    scorer.entities, scorer.relations = entities_ED, table
    metrics = link_prediction(scorer, kg.splits[split], kg.all_true(), max_triples=max_triples,
                              per_relation=True)  # fmt: skip
    metrics = named_relations(metrics, kg.relations.names)
    n = len(kg.splits[split])
    counts = {
        "entities": len(names),
        "no_description": missing,
        "triples": min(n, max_triples or n),
    }
    return {**metrics, **counts}


def kepler_link_prediction_run(run: str, graph: str | Path, **kwargs) -> dict:
    """:func:`kepler_link_prediction` of a run directory or checkpoint file."""
    from mmptm.models.load import load_pretrained

    model, tokenizer, cfg = load_pretrained(run)
    return kepler_link_prediction(model, tokenizer, cfg, graph, **kwargs)


__all__ = ["encode_texts", "kepler_link_prediction", "kepler_link_prediction_run"]
