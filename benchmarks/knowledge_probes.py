"""Why K-BERT's and KEPLER's cloze stay at chance on toyworld: the measurements behind
docs/results/knowledge.md (``knowledge_kbert_path``, ``knowledge_kepler_facts``).

    python benchmarks/knowledge_probes.py branches RUN DATA  # K-BERT: branches changed
    python benchmarks/knowledge_probes.py layers RUN DATA    # K-BERT: linear probe by layer
    python benchmarks/knowledge_probes.py tails RUN DATA     # K-BERT: attention in branches
    python benchmarks/knowledge_probes.py kepler RUN DATA    # KEPLER: KE side and cloze
    python benchmarks/knowledge_probes.py pictured RUN DATA  # ERNIE-VL: whose value the swap gives
    python benchmarks/knowledge_probes.py lookmates FT DATA  # kvqa answers vs looks (shared looks)
    python benchmarks/knowledge_probes.py kvqa-swap FT DATA  # kvqa, each region's entity swapped

RUN: a pre-training run (directory or checkpoint file); DATA: the study's toyworld folder
(``mmptm demo knowledge --out OUT`` writes ``OUT/toyworld``). Every cloze here is the study's:
the text wording (sentence 1) of ``knowledge/probe/cloze.{lang}.jsonl``, text / graph toys.

- ``branches``: cloze P@1 as trained, with nothing injected (``model.fusion.knowledge=false``),
  and with every value of the graph replaced by the next value of its relation (values.json
  order): P@1 of the gold and of the swapped-in value. A model that reads its branches follows
  the swap.
- ``layers``: per block, the state of the masked answer (mean of its pieces), of the subject's
  mention and of its injected branches (means); a logistic regression per relation predicts
  the gold value, trained on the queries of half the toys (even index), tested on the other
  half, languages pooled; with the branches and without. The masked answer's state leaks its
  number of pieces, so compare it with the no-branch control, not with chance.
- ``tails``: per layer (English), the attention mass of the subject's mention on its branches'
  relation words and on their tails (the other branch tokens), beside uniform attention over
  what it may see.
- ``kepler``: TransE over the run's description encodings (``mmptm.eval.kepler.encode_texts``
  and its relation table): is h + r nearest to the toy's own value among its relation's
  values? Beside the cloze P@1 per language and relation.
- ``pictured`` (ERNIE-VL; the study's visual cloze): the cloze with every entity swapped for
  another toy's, scored against the swapped-in toy's value (what the study reports) and
  against the pictured toy's (the toy the region's looks and the caption's name words
  belong to): a model that reads the entity follows the swap, one that reads looks does not.
- ``lookmates`` (a kvqa fine-tuning run FT, its ``test_results.json``; a world made with
  ``--shared-looks``): how often a test answer is the asked toy's own value, a look-mate's
  (another toy drawn in the same look) or neither, beside a uniform guess's shares.
- ``kvqa-swap`` (a kvqa fine-tuning run FT): the kvqa test as it is and with every region's
  entity swapped for another toy's (``swapped_toys``, the visual cloze's swap; written to
  ``--out``): per facts group and by whether the swapped-in toy was a fine-tuning (training)
  toy, the share of answers that name the pictured toy's value and the swapped-in toy's. A
  head that reads the region's entity follows the swap; on the plain test the swapped-in
  share is the rate at which another toy's value is named by coincidence.

Prints JSON. Run on one thread (``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmptm.eval.cloze import (
    SPAN,
    evaluate_cloze,
    probe_language,
    query_sample,
    read_cloze,
    score_queries,
)
from mmptm.eval.kepler import encode_texts
from mmptm.kg.graph import read_descriptions
from mmptm.modalities.base import read_id_list
from mmptm.models.load import load_pretrained
from mmptm.objectives.kepler import KnowledgeEmbedding
from mmptm.studies.knowledge import score_spied
from mmptm.toyworld.knowledge import FACT_RELATIONS

LANGS = ("en", "de", "fr", "ru", "es")


def _p1(run: str, loaded: Any, probe: Path) -> dict[str, float]:
    """Cloze P@1 (%) of text and graph toys and per relation, the text wording."""
    r = evaluate_cloze(run, str(probe), model=loaded, sentence=1)
    out = {g: round(100 * r["by_facts"][g]["p@1"], 1) for g in ("text", "graph")}
    return out | {rel: round(100 * x["p@1"], 1) for rel, x in r["by_relation"].items()}


def branches(run: str, data: Path, out: Path) -> dict[str, Any]:
    """The cloze as trained, without branches, and with every tail swapped (module doc)."""
    k = data / "knowledge"
    by_rel: dict[str, list[dict]] = {}
    for v in json.loads((k / "graph" / "values.json").read_text()):
        by_rel.setdefault(v["relation"], []).append(v)
    shift = {v["id"]: vs[(i + 1) % len(vs)] for vs in by_rel.values() for i, v in enumerate(vs)}
    swapped = out / "swapped_graph"
    swapped.mkdir(parents=True, exist_ok=True)
    rows = [line.split("\t") for line in (k / "graph" / "train.txt").read_text().splitlines()]
    (swapped / "train.txt").write_text(
        "".join(f"{h}\t{r}\t{shift[t]['id'] if t in shift else t}\n" for h, r, t in rows)
    )
    models = {
        "as trained": load_pretrained(run),
        "no branch": load_pretrained(run, ["model.fusion.knowledge=false"]),
        "swapped": load_pretrained(run, [f"model.fusion.graph={swapped}"]),
    }
    res = {}
    for lang in LANGS:
        probe = k / "probe" / f"cloze.{lang}.jsonl"
        injected = swapped / f"cloze.{lang}.jsonl"
        with injected.open("w", encoding="utf-8") as f:
            for line in probe.read_text(encoding="utf-8").splitlines():
                it = json.loads(line)
                v = shift[it["obj_uri"]]
                it |= {"obj_uri": v["id"], "obj_label": v["names"][lang]}
                f.write(json.dumps(it, ensure_ascii=False) + "\n")
        res[lang] = {
            "as trained": _p1(run, models["as trained"], probe),
            "no branch": _p1(run, models["no branch"], probe),
            "swapped branch, gold": _p1(run, models["swapped"], probe),
            "swapped branch, injected value": _p1(run, models["swapped"], injected),
        }
    return res


def _queries(data: Path, langs: tuple[str, ...]) -> tuple[list[dict], dict[str, Any]]:
    """The cloze queries filled with their gold answer (masked when scored), by key."""
    samples, meta = [], {}
    for lang in langs:
        probe = data / "knowledge" / "probe" / f"cloze.{lang}.jsonl"
        for j, it in enumerate(read_cloze(probe)):
            key = f"{lang}{j:07d}"
            samples.append(query_sample(it, 1, it.obj_label, probe_language(probe), key))
            meta[key] = it
    return samples, meta


@torch.no_grad()
def _states(run: str, data: Path, overrides: list[str]) -> tuple[dict, dict]:
    """key → (masked answer, mention, branches) states [layers, D] of every cloze query."""
    model, tok, cfg = load_pretrained(run, overrides)
    outs: list[torch.Tensor] = []

    def keep(module: Any, args: Any, out: Any) -> None:
        outs.append(out[0] if isinstance(out, tuple) else out)

    hooks = [b.register_forward_hook(keep) for b in model.fusion.stack.blocks]
    rows: dict[str, tuple] = {}
    fuse = model.fuse

    def spy(batch: dict[str, Any]) -> Any:
        outs.clear()
        res = fuse(batch)
        masked_BL = batch[f"{SPAN}_mask"]
        inj_BL = batch.get("injected_mask", torch.zeros_like(masked_BL))
        parts = (masked_BL, batch["entity_mask"] & ~inj_BL & ~masked_BL, inj_BL)
        for i, key in enumerate(batch["__key__"]):
            rows[key] = tuple(
                torch.stack(
                    [h[i][p[i]].mean(0) if p[i].any() else h[i][0] * 0 for h in outs]
                ).numpy()
                for p in parts
            )
        return res

    samples, meta = _queries(data, LANGS)
    score_spied(model, cfg, tok, samples, spy, hooks)
    return rows, meta


def _probe(rows: dict, meta: dict) -> dict[str, list[float]]:
    """Held-out-toy accuracy (%) per layer of a probe per relation, averaged over relations."""
    from sklearn.linear_model import LogisticRegression

    toys = sorted({it.sub_uri for it in meta.values()})
    train_toys = set(toys[0::2])
    n_layers = len(next(iter(rows.values()))[0])
    res = {}
    for k, which in enumerate(("masked answer", "mention", "branches")):
        acc = np.zeros(n_layers)
        for rel in FACT_RELATIONS:
            keys = [key for key, it in meta.items() if it.predicate_id == rel]
            y = np.array([meta[key].extra["obj_uri"] for key in keys])
            tr = np.array([meta[key].sub_uri in train_toys for key in keys])
            for layer in range(n_layers):
                X = np.stack([rows[key][k][layer] for key in keys])
                clf = LogisticRegression(max_iter=2000).fit(X[tr], y[tr])
                acc[layer] += (clf.predict(X[~tr]) == y[~tr]).mean() / len(FACT_RELATIONS)
        res[which] = [round(100 * a, 1) for a in acc]
    return res


def layers(run: str, data: Path, out: Path) -> dict[str, Any]:
    """The probe by layer with the branches and without (module doc)."""
    res = {}
    for name, over in (("with branches", []), ("no branch", ["model.fusion.knowledge=false"])):
        res[name] = _probe(*_states(run, data, over))
    return res


@torch.no_grad()
def tails(run: str, data: Path, out: Path) -> dict[str, Any]:
    """Per layer, the mention's attention on its branches' relation words and tails."""
    model, tok, cfg = load_pretrained(run)
    rel_ids = torch.tensor(
        sorted({i for r in FACT_RELATIONS for i in tok.encode(r.replace("_", " "))})
    )
    weights: list[torch.Tensor] = []

    def keep(module: Any, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
        weights.append(module.weights(args[0], mask_BK=kwargs["mask_BK"]))

    blocks = model.fusion.stack.blocks
    hooks = [b.attn.register_forward_hook(keep, with_kwargs=True) for b in blocks]
    sums = torch.zeros(len(blocks), 4, dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    fuse = model.fuse

    def spy(batch: dict[str, Any]) -> Any:
        nonlocal count
        weights.clear()
        res = fuse(batch)
        vis_BLL = batch["visible_mask"] & batch["attention_mask"][:, None, :]
        inj_BL = batch["injected_mask"]
        mention_BL = batch["entity_mask"] & ~inj_BL & ~batch[f"{SPAN}_mask"]
        is_rel_BL = torch.isin(batch["input_ids"], rel_ids)
        count += float(mention_BL.sum())
        for n, w_BHLL in enumerate(weights):
            for k, key_BL in enumerate((inj_BL & is_rel_BL, inj_BL & ~is_rel_BL)):
                mass_BL = (w_BHLL * key_BL[:, None, None, :]).sum(-1).mean(1)
                share_BL = (vis_BLL & key_BL[:, None, :]).sum(-1) / vis_BLL.sum(-1).clamp_min(1)
                sums[n, 2 * k] += float(mass_BL[mention_BL].sum())
                sums[n, 2 * k + 1] += float(share_BL[mention_BL].sum())
        return res

    score_spied(model, cfg, tok, _queries(data, ("en",))[0], spy, hooks)
    keys = ("relation_words", "relation_words_uniform", "tails", "tails_uniform")
    return {f"layer {n + 1}": dict(zip(keys, [round(x, 3) for x in row], strict=True))
            for n, row in enumerate((sums / count).tolist())}  # fmt: skip


def kepler(run: str, data: Path, out: Path) -> dict[str, Any]:
    """KE side (h + r nearest to the toy's value) against the cloze (module doc)."""
    model, tok, cfg = load_pretrained(run)
    k = data / "knowledge"
    toys = json.loads((k / "graph" / "toys.json").read_text())
    values = json.loads((k / "graph" / "values.json").read_text())
    desc = read_descriptions(k / "graph" / "descriptions.txt")
    ids = [t["id"] for t in toys] + [v["id"] for v in values]
    row = {e: i for i, e in enumerate(ids)}
    (ke,) = [o for o in model.objectives.values() if isinstance(o, KnowledgeEmbedding)]
    enc_ED = encode_texts(model, tok, cfg, [desc[e] for e in ids], view=ke.cfg.modality)
    rel_rows = read_id_list(ke.cfg.relations)
    table_RD = ke.relation_table().detach().float()
    hits: dict[str, dict[str, float]] = {}
    for rel in FACT_RELATIONS:
        cands = [v["id"] for v in values if v["relation"] == rel]
        c_CD = enc_ED[[row[c] for c in cands]]
        got: dict[str, list[bool]] = {"text": [], "graph": []}
        for t in toys:
            q_D = enc_ED[row[t["id"]]] + table_RD[rel_rows[rel]]
            d_C = torch.linalg.vector_norm(q_D[None] - c_CD, ord=ke.cfg.p_norm, dim=-1)
            group = "text" if t["facts_in_text"] else "graph"
            got[group].append(cands[int(d_C.argmin())] == t["facts"][rel])
        hits[rel] = {g: round(100 * sum(h) / len(h), 1) for g, h in got.items()}
        hits[rel]["chance"] = round(100 / len(cands), 1)
    loaded = (model, tok, cfg)
    cloze = {lang: _p1(run, loaded, k / "probe" / f"cloze.{lang}.jsonl") for lang in LANGS}
    return {"ke_hits@1": hits, "cloze": cloze}


def pictured(run: str, data: Path, out: Path) -> dict[str, Any]:
    from mmptm.eval.cloze import rank_metrics, realistic_ranks
    from mmptm.models.load import load_pretrained
    from mmptm.studies.knowledge import visual_cloze_queries

    plain = visual_cloze_queries(data, 0)
    swapped = visual_cloze_queries(data, 0, swap_entities=True)
    model, tok, cfg = load_pretrained(run)
    model.eval()
    with torch.no_grad():
        samples = (s for q in swapped for s in q["samples"])
        scored = score_queries(model, cfg, tok, samples, text_only=False)
    # one row of candidate scores per query, the same for both golds
    scores_Q = [torch.tensor([[scored[s["__key__"]][0] for s in q["samples"]]]) for q in swapped]
    result = {}
    for name, golds in (("swapped-in toy", swapped), ("pictured toy", plain)):
        ranks = torch.tensor(
            [
                float(realistic_ranks(row, torch.tensor([g["gold"]]))[0])
                for row, g in zip(scores_Q, golds, strict=True)
            ]
        )
        result[name] = {
            group: rank_metrics(ranks[[g["facts"] == group for g in golds]])
            for group in ("text", "graph")
        }
    return result


def lookmates(run: str, data: Path, out: Path) -> dict[str, Any]:
    from collections import defaultdict

    from mmptm.data.shards import SkipCounter, expand_shards, tar_samples

    k = data / "knowledge"
    toys = {t["id"]: t for t in json.loads((k / "graph" / "toys.json").read_text())}
    values = json.loads((k / "graph" / "values.json").read_text())
    name = {v["id"]: v["names"]["en"].lower() for v in values}
    n_values: dict[str, int] = defaultdict(int)
    for v in values:
        n_values[v["relation"]] += 1
    results = json.loads((Path(run) / "test_results.json").read_text())
    answer = {r["question_id"]: r["answer"] for r in results}

    def look(toy: dict) -> tuple:
        return toy["shape"], toy["color"], toy["size"]

    shares: dict[str, dict[str, float]] = {g: defaultdict(float) for g in ("text", "graph")}
    for sample in tar_samples(expand_shards(str(k / "kvqa" / "test-*.tar")), SkipCounter()):
        meta = json.loads(sample["json"])
        toy, rel = toys[meta["entity"]], meta["relation"]
        mates = {
            name[t["facts"][rel]]
            for t in toys.values()
            if look(t) == look(toy) and t["id"] != toy["id"]
        }
        got, row = answer[meta["question_id"]], shares[meta["facts"]]
        row["n"] += 1
        row["own"] += got == name[toy["facts"][rel]]
        row["look-mate"] += got in mates
        row["uniform own"] += 1 / n_values[rel]
        row["uniform look-mate"] += len(mates) / n_values[rel]
    return {
        group: {"queries": int(row["n"])}
        | {what: round(100 * v / row["n"], 1) for what, v in row.items() if what != "n"}
        for group, row in shares.items()
        if row["n"]
    }


def swap_shares(
    metas: list[dict[str, Any]],
    answers: dict[Any, str],
    toys: dict[str, dict[str, Any]],
    name: dict[str, str],
    swap: dict[str, str],
) -> dict[str, dict[str, Any]]:
    """Per "facts group, swapped-in toy trained on / held out": questions, and the % of
    answers naming the pictured toy's value and the swapped-in toy's (the question's relation)."""
    from collections import defaultdict

    rows: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for meta in metas:
        pictured, other, rel = meta["entity"], swap[meta["entity"]], meta["relation"]
        held = "trained on" if toys[other]["split"] == "train" else "held out"
        row = rows[f"{meta['facts']}, swapped-in toy {held}"]
        got = answers[meta["question_id"]]
        row["questions"] += 1
        row["pictured toy's value"] += got == name[toys[pictured]["facts"][rel]]
        row["swapped-in toy's value"] += got == name[toys[other]["facts"][rel]]
    return {
        key: {"questions": int(r["questions"])}
        | {what: round(100 * v / r["questions"], 1) for what, v in r.items() if what != "questions"}
        for key, r in sorted(rows.items())
    }


def kvqa_swap(run: str, data: Path, out: Path) -> dict[str, Any]:
    from mmptm.converters.linking import rewrite_shards, with_json
    from mmptm.data.shards import expand_shards
    from mmptm.eval.vqa import evaluate_vqa
    from mmptm.studies.knowledge import swapped_toys

    k = data / "knowledge"
    toys = {t["id"]: t for t in json.loads((k / "graph" / "toys.json").read_text())}
    values = json.loads((k / "graph" / "values.json").read_text())
    name = {v["id"]: v["names"]["en"].lower() for v in values}
    swap = swapped_toys(json.loads((data / "manifest.json").read_text())["seed"])
    swapped = out / "kvqa_swapped"
    swapped.mkdir(parents=True, exist_ok=True)
    metas = []

    def swapped_entities(group: list, url: str) -> list:
        meta = json.loads(next(blob for info, blob in group if info.name.endswith(".json")))
        meta["region_entities"] = [swap[e] for e in meta["region_entities"]]
        metas.append(meta)
        return with_json(group, meta)

    list(rewrite_shards(expand_shards(f"{k}/kvqa/test-*.tar"), swapped, swapped_entities))
    result = {}
    for label, shards in (("plain", k / "kvqa"), ("swapped", swapped)):
        predictions = out / f"test_results_{label}.json"
        acc = evaluate_vqa(run, shards=f"{shards}/test-*.tar", results_file=predictions)
        answers = {r["question_id"]: r["answer"] for r in json.loads(predictions.read_text())}
        result[label] = {"accuracy": round(acc["accuracy"], 1)} | swap_shares(
            metas, answers, toys, name, swap
        )
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fns = {"branches": branches, "layers": layers, "tails": tails, "kepler": kepler,
           "pictured": pictured, "lookmates": lookmates, "kvqa-swap": kvqa_swap}  # fmt: skip
    p.add_argument("what", choices=tuple(fns))
    p.add_argument("run")
    p.add_argument("data", type=Path, help="the study's toyworld folder")
    p.add_argument("--out", type=Path, default=Path("runs/knowledge_probes"))
    a = p.parse_args()
    print(json.dumps(fns[a.what](a.run, a.data, a.out), indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
