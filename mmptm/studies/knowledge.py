"""The knowledge study (``mmptm demo knowledge``): does a model use the knowledge graph?

toyworld's knowledge view (60 named toys; half of them have their facts stated in the
training text, the other half only in the graph: docs/knowledge.md, "toyworld knowledge") →
tokenizer → TransE vectors of the graph (``mmptm kg train-embeddings``) → per recipe two
pre-trainings of the same architecture and steps, **with the graph** and **without** (the
recipe's switch: no entity vectors, no injected triples, no knowledge-embedding batches) →

- LAMA-style cloze P@1 in every language (``mmptm eval probe --cloze``), in the training
  text's wording and in a paraphrase the text never uses,
- entity typing (micro-F1) and relation classification (accuracy) fine-tuned from each
  pre-trained run (the ``entity_typing`` and ``relation_classification`` recipes),
  on toys the fine-tuning never saw,
- for the vision-language recipe (``ernie_vl_tiny``): a visual cloze (the caption's opening
  fact about a pictured toy, "The red circle is made of [MASK].", on the test scenes, every
  pictured toy and relation: for graph-only toys the fact can only come through the region's
  entity; again with every entity swapped for another toy's, which tells whether the model
  reads the entity or the looks) and knowledge VQA,

- for KnowBERT (``knowbert_tiny``): the linking accuracy of its KAR on the test texts'
  candidate spans (``mmptm data candidates`` with ``CONFUSERS`` shared names per entity:
  toyworld's names are unique) against the prior alone (argmax p(e | alias)),

each split into the toys whose facts the text states (``text``) and the graph-only ones
(``graph``). Without the graph a model can only guess on ``graph`` toys (chance: cloze
13.1 % on average over the relations, relations 50 %, typing micro-F1 about 57 %, the
majority guess); the question is how far the graph lifts them. ERNIE 1.0 (``ernie1_tiny``)
never reads the graph: its "without" run is BERT's masking of the same text.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmptm import toyworld
from mmptm.converters.answers import build_answer_vocab, shard_answers, write_answer_vocab
from mmptm.converters.candidates import (
    CandidateGenerator,
    CandidateStats,
    build_generator,
    sample_candidates,
    write_candidate_shards,
)
from mmptm.converters.spans import convert_spans
from mmptm.converters.triples import write_triple_shards
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.eval.cloze import (
    SPAN,
    evaluate_cloze,
    probe_language,
    query_sample,
    rank_metrics,
    read_cloze,
    realistic_ranks,
    score_queries,
)
from mmptm.eval.linking import evaluate_linking
from mmptm.eval.spans import evaluate_spans
from mmptm.eval.vqa import evaluate_vqa
from mmptm.kg.graph import read_aliases, read_triples
from mmptm.models.load import load_pretrained
from mmptm.objectives.vqa import soft_score
from mmptm.recipe import load_run_config
from mmptm.studies.common import LANGS, draw_curves, relocated
from mmptm.tokenizers.sentencepiece import train_tokenizer
from mmptm.toyworld.knowledge import FACT_RELATIONS, build_world, pictured_fact_sentence
from mmptm.toyworld.scene import Obj
from mmptm.train.kge import KGETrainConfig, train_embeddings
from mmptm.train.trainer import pretrain

log = logging.getLogger(__name__)

#: recipe → (how it is scored: text (cloze, typing, relations) | vqa (knowledge VQA), the
#: "without the graph" overrides: same architecture, steps and data, no knowledge)
KNOWLEDGE_RECIPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ernie_tiny": ("text", ("model.fusion.knowledge=false",)),
    "kbert_tiny": ("text", ("model.fusion.knowledge=false",)),
    "kepler_tiny": ("text", ("data.sources.triples.weight=0",)),
    "ernie_vl_tiny": ("vqa", ("model.fusion.knowledge=false",)),
    "knowbert_tiny": ("text", ("model.fusion.knowledge=false",)),
    # ERNIE 1.0 reads no graph: "without" is BERT's MLM (no phrase or entity units)
    "ernie1_tiny": (
        "text",
        (
            'model.objectives.mlm.mask_spans=""',
            'model.objectives.mlm.mask_phrases=""',
            "model.objectives.mlm.mask_prob=0.15",
        ),
    ),
    # K-Adapter: not one pre-training but a chain of adapters on ernie1_tiny's "without" run
    # (:func:`kadapter_rows`; "without": the same adapters untrained)
    "kadapter": ("kadapter", ()),
}
KNOWLEDGE_DEMO = ("ernie_tiny",)
#: the cloze templates: index 0 a paraphrase the training text never uses, 1 its own wording
CLOZE_WORDINGS = {"text wording": 1, "paraphrase": 0}
GROUPS = ("text", "graph")
#: KnowBERT's candidates: each entity's names shared with this many others (toyworld's names
#: are unique, so without them every span has one candidate and linking decides nothing)
CONFUSERS = 3


def prepare_knowledge(out: Path, *, n_train: int, n_test: int, seed: int, kge_epochs: int,
                      shared_looks: int = 1) -> tuple[Path, dict[str, Any]]:  # fmt: skip
    """toyworld's knowledge view, a BPE tokenizer on its text and captions, the graph's TransE
    vectors, KEPLER's triple shards and the span tasks' shards; returns (data, TransE result).
    ``shared_looks``: toys per look (toyworld's option)."""
    data = out / "toyworld"
    toyworld.generate(data, n_train=n_train, n_val=n_test, n_test=n_test, seed=seed,
                      languages=LANGS, views=("knowledge",), progress=True,
                      shared_looks=shared_looks)  # fmt: skip
    k = data / "knowledge"
    shards = sorted([*(k / "text").glob("train-*.tar"), *(k / "image_text").glob("train-*.tar")])
    train_tokenizer(shards, data / "tokenizer", vocab_size=1000, seed=seed, model_type="bpe",
                    fit_to_data=True)  # fmt: skip
    kge = train_embeddings(k / "graph", k / "transe", KGETrainConfig(epochs=kge_epochs, seed=seed),
                           progress=False)  # fmt: skip
    write_triple_shards(k / "graph", k / "graph" / "descriptions.txt", k / "triples")
    generator = candidate_generator(data, seed)
    write_candidate_shards(f"{k}/text/*.tar", k / "candidates", generator, progress=False)
    for task in ("typing", "relations"):
        for split in ("train", "dev", "test"):
            convert_spans(task, k / task / f"{split}.json", k / task / "shards")
        # KnowBERT fine-tunes with its candidate spans, which these copies carry
        write_candidate_shards(f"{k}/{task}/shards/*.tar", k / task / "candidates", generator,
                               progress=False)  # fmt: skip
    return data, kge


#: a query sample -> the sample with the knowledge fields its run's training shards carry
Annotate = Callable[[dict[str, Any]], dict[str, Any]]


def candidate_generator(data: Path, seed: int) -> CandidateGenerator:
    """KnowBERT's candidate generator of the study (its training shards' and the probe's)."""
    k = data / "knowledge"
    return build_generator(k / "graph" / "aliases.txt", triples=k / "graph" / "train.txt",
                           entities=k / "transe" / "entities.txt", confusers=CONFUSERS,
                           seed=seed)  # fmt: skip


def cloze_annotator(cfg: Any, data: Path, seed: int) -> Annotate | None:
    """What the run's training shards carry that a cloze query lacks, added to each query
    (``evaluate_cloze(annotate=)``): for a run that reads candidate spans (KnowBERT), the
    candidate spans of the query's text by the generator its shards were written with, none
    over the masked answer (whose candidates would hand KAR the answer's own entity); None
    for the others."""
    field = getattr(cfg.model.fusion, "candidates", None)
    if not isinstance(field, str):
        return None
    generator, stats = candidate_generator(data, seed), CandidateStats()

    def annotate(sample: dict[str, Any]) -> dict[str, Any]:
        meta = sample["json"]
        ((a, b, _),) = meta[SPAN]
        spans = sample_candidates(sample["txt"], meta.get("mentions"), generator, stats)
        meta[field] = [x for x in spans if x[1] <= a or x[0] >= b]
        return sample

    return annotate


def _cloze(
    run: Path, data: Path, languages: Sequence[str], annotate: Annotate | None = None
) -> dict[str, Any]:
    """Cloze P@1 per wording, language and facts group (``annotate``: of
    :func:`cloze_annotator`)."""
    loaded = load_pretrained(str(run))
    result: dict[str, Any] = {}
    for wording, index in CLOZE_WORDINGS.items():
        per_lang = {}
        for lang in languages:
            r = evaluate_cloze(str(run), str(data / "knowledge" / "probe" / f"cloze.{lang}.jsonl"),
                               model=loaded, sentence=index, annotate=annotate)  # fmt: skip
            per_lang[lang] = {g: r["by_facts"][g]["p@1"] for g in GROUPS}
        result[wording] = {
            "per_language": per_lang,
            **{g: sum(v[g] for v in per_lang.values()) / len(per_lang) for g in GROUPS},
        }
    return result


def score_spied(
    model: Any, cfg: Any, tokenizer: Any, samples: Any, spy: Callable[..., Any], hooks: list
) -> None:
    """Score cloze ``samples`` with ``model.fuse`` replaced by ``spy`` (which calls the real
    fusion and reads what its forward ``hooks`` kept); then the model is restored and the
    hooks removed, also on an error."""
    model.fuse = spy
    try:
        score_queries(model, cfg, tokenizer, samples)
    finally:
        del model.fuse
        for h in hooks:
            h.remove()


@torch.no_grad()
def tree_attention(
    run: Path | str, probe: Path | str, *, sentence: int = 1, overrides: Sequence[str] = ()
) -> list[dict[str, float]]:
    """Does a K-BERT run carry an injected triple to the cloze's mask? Per layer, on the
    queries of the LAMA file ``probe`` filled with their gold answer (its pieces masked, as
    the cloze scores them): ``mask_to_mention``, the attention mass of the masked pieces on
    the subject's mention, and ``mention_to_branch``, that of the mention's pieces on its
    injected branches (means over heads and pieces), each beside ``uniform``: the mass a
    uniform attention over the keys each may see would give (``*_uniform``)."""
    model, tokenizer, cfg = load_pretrained(str(run), overrides)
    items = read_cloze(probe)
    lang = probe_language(Path(probe))
    samples = [query_sample(it, sentence, it.obj_label, lang, f"{i:07d}")
               for i, it in enumerate(items)]  # fmt: skip
    blocks = model.fusion.stack.blocks
    weights: list[torch.Tensor] = []  # per block [B,H,L,L], filled by the hooks

    def keep(module: Any, args: tuple, kwargs: dict[str, Any], out: Any) -> None:
        weights.append(module.weights(args[0], mask_BK=kwargs["mask_BK"]))

    hooks = [b.attn.register_forward_hook(keep, with_kwargs=True) for b in blocks]
    sums = torch.zeros(len(blocks), 4, dtype=torch.float64)
    counts = torch.zeros(2, dtype=torch.float64)
    fuse = model.fuse

    def spy(batch: dict[str, Any]) -> Any:
        weights.clear()
        out = fuse(batch)
        vis_BLL = batch["visible_mask"] & batch["attention_mask"][:, None, :]
        masked_BL, inj_BL = batch[f"{SPAN}_mask"], batch["injected_mask"]
        mention_BL = batch["entity_mask"] & ~inj_BL
        pairs = ((masked_BL, mention_BL), (mention_BL, inj_BL))
        for k, (q_BL, key_BL) in enumerate(pairs):
            counts[k] += float(q_BL.sum())
            share_BL = (vis_BLL & key_BL[:, None, :]).sum(-1) / vis_BLL.sum(-1).clamp_min(1)
            for n, w_BHLL in enumerate(weights):
                mass_BL = (w_BHLL * key_BL[:, None, None, :]).sum(-1).mean(1)
                sums[n, 2 * k] += float(mass_BL[q_BL].sum())
                sums[n, 2 * k + 1] += float(share_BL[q_BL].sum())
        return out

    score_spied(model, cfg, tokenizer, samples, spy, hooks)
    keys = ("mask_to_mention", "mask_to_mention_uniform", "mention_to_branch",
            "mention_to_branch_uniform")  # fmt: skip
    means = sums / counts.clamp_min(1).repeat_interleave(2)
    return [dict(zip(keys, row.tolist())) for row in means]


def _span_task(task: str, run: Path, data: Path, out: Path, steps: int, seed: int,
               folder: str = "shards", recipe: str = "",
               extra: Sequence[str] = ()) -> dict:  # fmt: skip
    """Fine-tune ``run`` on the typing or relations train toys; metrics on the test toys.
    ``folder``: ``candidates`` for the copies whose json carries KnowBERT's candidate spans;
    ``recipe``, ``extra``: another fine-tuning recipe than the task's own, its overrides."""
    shards = data / "knowledge" / task / folder
    config = recipe or {"typing": "entity_typing", "relations": "relation_classification"}[task]
    head = {"typing": "typing", "relations": "relations"}[task]
    cfg = load_run_config(config, [
        f"init={run}", f"output_dir={out}", "resume=true", f"seed={seed}",
        f"train.max_steps={steps}", f"train.ckpt_every={steps}", f"data.train={shards}/train-*.tar",
        f"data.eval.dev={shards}/dev-*.tar", f"data.eval.test={shards}/test-*.tar",
        f"model.objectives.{head}.labels={shards.with_name('shards')}/labels.txt", *extra,
    ])  # fmt: skip
    pretrain(cfg)
    test = evaluate_spans(str(out), {"test": f"{shards}/test-*.tar"})["test"]
    metric = "micro_f1" if task == "typing" else "acc"
    return {
        "metric": metric,
        "all": test["overall"][metric],
        **{g: test["by_facts"][g][metric] for g in GROUPS},
        "overall": test["overall"],
    }


def _kvqa(run: Path, data: Path, out: Path, steps: int | None, seed: int) -> dict[str, Any]:
    """Fine-tune a vision-language run on knowledge VQA (the ``kvqa`` recipe;
    ``steps`` None: its own; entity answers scored against the graph's vectors); the official
    soft accuracy overall and per facts group (each question's ``facts``, from the test
    shards)."""
    k = data / "knowledge" / "kvqa"
    answers = k / "answers.txt"
    if not answers.exists():
        write_answer_vocab(build_answer_vocab(shard_answers([f"{k}/train-*.tar"]), min_count=1),
                           answers)  # fmt: skip
    cfg = load_run_config("kvqa", [
        f"init={run}", f"output_dir={out}", "resume=true", f"seed={seed}",
        f"data.train={k}/train-*.tar", f"data.test={k}/test-*.tar",
        f"model.objectives.vqa.answers={answers}",
        f"model.objectives.vqa.answer_entities={data}/knowledge/graph/aliases.en.txt",
        *([f"train.max_steps={steps}"] if steps else []),
    ])  # fmt: skip
    pretrain(cfg)
    predictions = out / "test_results.json"
    overall = evaluate_vqa(str(out), split="test", results_file=predictions)["accuracy"]
    answer = {r["question_id"]: r["answer"] for r in json.loads(predictions.read_text())}
    scores: dict[str, list[float]] = {g: [] for g in GROUPS}
    for sample in tar_samples(expand_shards(f"{k}/test-*.tar"), SkipCounter()):
        meta = json.loads(sample["json"])
        scores[meta["facts"]].append(soft_score(meta["answers"], answer[meta["question_id"]]))
    return {"all": overall / 100, **{g: sum(v) / max(len(v), 1) for g, v in scores.items()}}


_SWAP_STREAM = 16  # [seed, 16]: the visual cloze's entity swap
#: test scenes the visual cloze asks about: every pictured toy, every relation (about 2000
#: queries of 6-10 candidates from 250 scenes)
VISUAL_CLOZE_SCENES = 250


def swapped_toys(seed: int) -> dict[str, str]:
    """Toy id -> another toy's id (a random cycle through all the toys: none maps to itself)."""
    ids = [t.id for t in build_world(seed).toys]
    order = np.random.default_rng([seed, _SWAP_STREAM]).permutation(len(ids))
    return {ids[order[i]]: ids[order[(i + 1) % len(ids)]] for i in range(len(ids))}


def visual_cloze_queries(
    data: Path,
    seed: int,
    scenes: int = VISUAL_CLOZE_SCENES,
    lang: str = "en",
    swap_entities: bool = False,
) -> list[dict[str, Any]]:
    """The visual cloze of toyworld knowledge's first ``scenes`` test scenes: per pictured toy
    and relation, the scene's caption opening with the fact sentence about that toy (called by
    its appearance, as the training captions' opening fact) and one sample per candidate
    value in the value's place (``jpg``, ``regions.npz``, ``json`` with the candidate's span
    as ``cloze``). Each query: ``samples``, ``gold`` (the index of the toy's value), ``facts``
    (its group), ``relation``, ``entity``.

    ``swap_entities``: every region's (and name mention's) entity is another toy's
    (:func:`swapped_toys`), and ``gold``, ``facts`` and ``entity`` are that toy's: a model
    that reads the fact off the region's entity follows the swap, one that reads it off the
    appearance does not."""
    manifest = json.loads((data / "manifest.json").read_text())
    world = build_world(seed, manifest["knowledge"].get("shared_looks", 1))
    swap = swapped_toys(seed) if swap_entities else {}
    shards = expand_shards(f"{data}/knowledge/image_text/test-*.tar")
    queries: list[dict[str, Any]] = []
    for n, sample in enumerate(tar_samples(shards, SkipCounter())):
        if n == scenes:
            break
        meta = json.loads(sample["json"])
        pictured = meta["region_entities"]  # the toys the image shows (their looks)
        if swap:  # the regions' entities and the names' mentions alike
            meta = {**meta, "region_entities": [swap[e] for e in meta["region_entities"]],
                    "mentions": {k: [[a, b, swap.get(e, e)] for a, b, e in v]
                                 for k, v in meta["mentions"].items()}}  # fmt: skip
        rest, mentions = meta["captions"][lang], meta["mentions"][lang]
        if meta.get("caption_fact"):  # the names' part of the caption, after its own fact
            cut = rest.index(". ") + 2
            rest = rest[cut:]  # its value's mention goes with it
            mentions = [[a - cut, b - cut, e] for a, b, e in mentions if a >= cut]
        for shown, entity in zip(pictured, meta["region_entities"]):
            toy, looks = world.toy(entity), world.toy(shown)  # the entity's facts, shown's looks
            obj = Obj(looks.shape, looks.color, looks.size, 0.0, 0.0, 0.0)
            for relation in FACT_RELATIONS:
                values = world.values_of(relation)
                samples = []
                for value in values:
                    sentence, (a, b) = pictured_fact_sentence(world, obj, relation, lang, value.id)
                    shift = len(sentence) + 1
                    text = f"{sentence} {rest}"
                    moved = [[x + shift, y + shift, e] for x, y, e in mentions]
                    js = {**meta, "captions": {lang: text}, "mentions": {lang: moved},
                          SPAN: {lang: [[a, b, 0]]}}  # fmt: skip
                    key = f"{len(queries):06d}_{len(samples):02d}"
                    samples.append({"__key__": key, "jpg": sample["jpg"], "txt": text,
                                    "regions.npz": sample["regions.npz"], "json": js})  # fmt: skip
                gold = [v.id for v in values].index(toy.facts[relation])
                queries.append({"samples": samples, "gold": gold, "facts": toy.group,
                                "relation": relation, "entity": entity})  # fmt: skip
    return queries


def visual_cloze(
    run: Path,
    data: Path,
    seed: int,
    scenes: int = VISUAL_CLOZE_SCENES,
    swap_entities: bool = False,
    model: tuple[Any, Any, Any] | None = None,
) -> dict:
    """P@1 / P@10 / MRR of a vision-language run's masked-LM head on
    :func:`visual_cloze_queries` (each candidate's mean piece log-probability; the realistic
    rank of the toy's value): overall, ``text`` and ``graph`` toys (``by_facts``). ``model``:
    the run already loaded, ``(model, tokenizer, cfg)``."""
    queries = visual_cloze_queries(data, seed, scenes, swap_entities=swap_entities)
    net, tokenizer, cfg = model or load_pretrained(str(run))
    net.eval()
    scored = score_queries(net, cfg, tokenizer, (s for q in queries for s in q["samples"]),
                           text_only=False)  # fmt: skip
    ranks = torch.tensor([
        float(realistic_ranks(torch.tensor([[scored[s["__key__"]][0] for s in q["samples"]]]),
                              torch.tensor([q["gold"]]))[0])
        for q in queries
    ])  # fmt: skip
    by = {g: rank_metrics(ranks[[q["facts"] == g for q in queries]]) for g in GROUPS}
    return {"overall": rank_metrics(ranks), "by_facts": by,
            **{g: by[g]["p@1"] for g in GROUPS}}  # fmt: skip


# -- K-Adapter: adapters on the study's plain MLM run, with and without the graph --------------

#: the base: ernie1_tiny's run "without" (BERT's MLM on the knowledge text, mbert_tiny's shape),
#: the same run directory as that recipe's row, so a study running both trains it once
KADAPTER_BASE = "ernie1_tiny"
#: K-Adapter's factual adapter learns relation classification on T-REx, sentences aligned to
#: Wikidata's triples; here every toy's graph triples (and as many wrong values,
#: ``no_relation``) in frames that state no relation and that the relations test never uses
FACT_FRAMES = (
    ("{s}", "was", "next", "to", "{o}", "."),
    ("I", "drew", "{s}", "and", "{o}", "."),
    ("{o}", "and", "{s}", "are", "on", "the", "page", "."),
    ("Here", "are", "{s}", "and", "{o}", "."),
)  # fmt: skip
_FACTS_STREAM = 17  # [seed, 17]: the wrong values of the graph's relation items
_RELATION_TYPE = {"made_of": "MATERIAL", "owned_by": "PERSON", "comes_from": "PLACE"}


def graph_fact_items(graph: Path, seed: int) -> list[dict[str, Any]]:
    """TACRED items of every toy's facts in the graph folder ``graph`` (``train.txt``,
    ``aliases.en.txt``, ``toys.json``): per triple its value and one other value of the
    relation (``no_relation``), in each of :data:`FACT_FRAMES`."""
    names = {e: aliases[0] for e, aliases in read_aliases(graph / "aliases.en.txt").items()}
    group = {t["id"]: "text" if t["facts_in_text"] else "graph"
             for t in json.loads((graph / "toys.json").read_text(encoding="utf-8"))}  # fmt: skip
    triples = [t for t in read_triples(graph / "train.txt") if t[1] in FACT_RELATIONS]
    values = {r: sorted({o for _, rel, o in triples if rel == r}) for r in FACT_RELATIONS}
    rng = np.random.default_rng([seed, _FACTS_STREAM])
    items = []
    for subj, relation, true in triples:
        others = [v for v in values[relation] if v != true]
        for f, frame in enumerate(FACT_FRAMES):
            wrong = others[int(rng.integers(len(others)))]
            for obj, label in ((true, relation), (wrong, "no_relation")):
                slots = {"{s}": names[subj], "{o}": names[obj]}
                items.append({
                    "id": f"{subj}_{obj}_{f}", "token": [slots.get(w, w) for w in frame],
                    "subj_start": frame.index("{s}"), "subj_end": frame.index("{s}"),
                    "obj_start": frame.index("{o}"), "obj_end": frame.index("{o}"),
                    "subj_type": "TOY", "obj_type": _RELATION_TYPE[relation], "relation": label,
                    "subj_id": subj, "obj_id": obj, "facts": group[subj],
                })  # fmt: skip
    return items


def _kadapter_shape(base: Path) -> list[str]:
    """Overrides giving a K-Adapter recipe the base run's shape (its base loads whole)."""
    cfg = load_run_config(str(base / "config.yaml"))
    t, text = cfg.model.fusion.transformer, cfg.model.encoders["text"]
    return [f"model.width={cfg.model.width}", f"model.fusion.transformer.layers={t.layers}",
            f"model.fusion.transformer.heads={t.heads}",
            f"model.encoders.text.max_positions={text.max_positions}"]  # fmt: skip


def kadapter_chain(out: Path, data: Path, *, steps: int, seed: int,
                   overrides: Sequence[str] = ()) -> dict[str, Path]:  # fmt: skip
    """K-Adapter's pre-training: the base (:data:`KADAPTER_BASE`'s plain MLM run, ``steps``),
    then on it, frozen, ``kadapter_facts`` on the graph's relation items
    (:func:`graph_fact_items`) and ``kadapter_cloze`` (entity-masked MLM on the text, the
    factual adapter frozen), ``steps // 2`` each; returns the runs (base, facts, cloze)."""
    k = data / "knowledge"
    base = out / f"{KADAPTER_BASE}_nograph"
    common = ["resume=true", f"seed={seed}"]
    pretrain(load_run_config(KADAPTER_BASE, [
        f"output_dir={base}", *common, f"train.max_steps={steps}",
        *relocated(KADAPTER_BASE, data), *KNOWLEDGE_RECIPES[KADAPTER_BASE][1], *overrides,
    ]))  # fmt: skip
    facts = k / "kadapter_facts"  # rewritten each time: a second, cheap, identical copy
    facts.mkdir(parents=True, exist_ok=True)
    (facts / "train.json").write_text(json.dumps(graph_fact_items(k / "graph", seed)) + "\n")
    convert_spans("relations", facts / "train.json", facts)
    shape, n = _kadapter_shape(base), max(steps // 2, 1)
    runs = {"base": base, "facts": out / "kadapter_facts", "cloze": out / "kadapter_cloze"}
    rel = k / "relations" / "shards"
    pretrain(load_run_config("kadapter_facts", [
        f"init={base}", f"output_dir={runs['facts']}", *common, f"train.max_steps={n}",
        f"train.ckpt_every={n}", f"data.train={facts}/train-*.tar",
        f"data.eval.dev={rel}/dev-*.tar", f"data.eval.test={rel}/test-*.tar",
        f"model.objectives.relations.labels={facts}/labels.txt", *shape, *overrides,
    ]))  # fmt: skip
    pretrain(load_run_config("kadapter_cloze", [
        f"init={runs['facts']}", f"output_dir={runs['cloze']}", *common, f"train.max_steps={n}",
        f"train.ckpt_every={n}", *relocated("kadapter_cloze", data), *shape, *overrides,
    ]))  # fmt: skip
    return runs


def kadapter_rows(out: Path, data: Path, *, steps: int, ft_steps: int, seed: int,
                  languages: Sequence[str],
                  overrides: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """K-Adapter's two rows: **with the graph**, the cloze through the cloze adapter's MLM
    head and typing / relations fine-tuned from the chain (both adapters, the base frozen);
    **without**, the base's own MLM head and the same fine-tunings from the base with the
    adapters untrained (same shape, steps and trainable parameters: only what the adapters
    learnt differs). Also the factual adapter's own relation accuracy, on the test toys and
    on its training items."""
    runs = kadapter_chain(out, data, steps=steps, seed=seed, overrides=overrides)
    shape = _kadapter_shape(runs["base"])
    sets = {"test": f"{data}/knowledge/relations/shards/test-*.tar",
            "own": f"{data}/knowledge/kadapter_facts/train-*.tar"}  # fmt: skip
    facts = evaluate_spans(str(runs["facts"]), sets)
    rows: dict[str, Any] = {}
    # the run each arm's cloze reads and its fine-tunings start from
    for graph, tag, run in (("with graph", "graph", runs["cloze"]),
                            ("without graph", "nograph", runs["base"])):  # fmt: skip
        row: dict[str, Any] = {"cloze": _cloze(run, data, languages)}
        for task in ("typing", "relations"):
            row[task] = _span_task(task, run, data, out / f"kadapter_{tag}_{task}", ft_steps, seed,
                                   recipe=f"kadapter_{task}", extra=shape)  # fmt: skip
        rows[f"kadapter {graph}"] = row
    # "own": its training items, the graph's facts of every toy (has it taken them in?)
    rows["kadapter with graph"]["facts_adapter"] = {
        "metric": "acc", "all": facts["test"]["overall"]["acc"],
        **{g: facts["test"]["by_facts"][g]["acc"] for g in GROUPS},
        "own": facts["own"]["overall"]["acc"],
    }  # fmt: skip
    return {"rows": rows, "runs": runs}


def _kadapter_into(result: dict[str, Any], runs: dict[str, Path], times: dict[str, float],
                   out: Path, data: Path, **settings: Any) -> None:  # fmt: skip
    """:func:`kadapter_rows` into the study's results (rows, curves' runs, times), saved."""
    t0 = time.monotonic()
    got = kadapter_rows(out, data, **settings)
    times["K-Adapter: base, adapters, evaluation"] = time.monotonic() - t0
    result["runs"].update(got["rows"])
    runs.update({f"kadapter {k}": v for k, v in got["runs"].items()})
    result["times_s"] = times
    (out / "results.json").write_text(json.dumps(result, indent=2))


def knowledge_study(
    out: Path,
    *,
    recipes: Sequence[str] = KNOWLEDGE_DEMO,
    n_train: int = 4000,
    n_test: int = 500,
    steps: int = 1200,
    ft_steps: int | None = None,
    kge_epochs: int = 300,
    languages: Sequence[str] = LANGS,
    seed: int = 0,
    overrides: Sequence[str] = (),
    shared_looks: int = 1,
) -> dict[str, Any]:
    """Per recipe, with vs. without the graph: cloze, typing, relations (and knowledge VQA
    for vision-language recipes), by facts group. results.json is rewritten after each run.
    ``ft_steps``: of every fine-tuning (None: 300 for typing and relations, kvqa.yaml's own
    for knowledge VQA). ``shared_looks``: toyworld's toys per look (not 1: data and runs
    under ``out/shared_looks_K``, apart from the default world's)."""
    unknown = [r for r in recipes if r not in KNOWLEDGE_RECIPES]
    if unknown:
        raise ValueError(
            f"knowledge recipes: {unknown} unknown; choices: {list(KNOWLEDGE_RECIPES)}"
        )
    if shared_looks != 1:
        out = out / f"shared_looks_{shared_looks}"
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t0 = time.monotonic()
    data, kge = prepare_knowledge(out, n_train=n_train, n_test=n_test, seed=seed,
                                  kge_epochs=kge_epochs, shared_looks=shared_looks)  # fmt: skip
    times["data, tokenizer, TransE"] = time.monotonic() - t0
    settings = {"n_train": n_train, "steps": steps, "ft_steps": ft_steps,
                "kge_epochs": kge_epochs, "seed": seed, "shared_looks": shared_looks}  # fmt: skip
    result: dict[str, Any] = {"transe": {"test": kge.get("test"), "train": kge.get("train")},
                              "runs": {}, "settings": settings}  # fmt: skip
    runs: dict[str, Path] = {}
    for recipe in recipes:
        kind, without = KNOWLEDGE_RECIPES[recipe]
        if kind == "kadapter":  # a chain of runs on one base, not one pre-training per arm
            _kadapter_into(result, runs, times, out, data, steps=steps, ft_steps=ft_steps or 300,
                           seed=seed, languages=languages, overrides=overrides)  # fmt: skip
            continue
        for graph, extra in (("with graph", ()), ("without graph", without)):
            name = f"{recipe} {graph}"
            run = out / f"{recipe}_{'graph' if not extra else 'nograph'}"
            runs[name] = run
            t0 = time.monotonic()
            cfg = load_run_config(recipe, [
                f"output_dir={run}", "resume=true", f"train.max_steps={steps}", f"seed={seed}",
                *relocated(recipe, data), *extra, *overrides,
            ])  # fmt: skip
            pretrain(cfg)
            times[f"pre-training {name}"] = time.monotonic() - t0
            t0 = time.monotonic()
            row: dict[str, Any] = {}
            if kind == "vqa":
                loaded = load_pretrained(str(run))
                for key, swap in (("visual_cloze", False), ("visual_cloze_swapped", True)):
                    row[key] = visual_cloze(run, data, seed, swap_entities=swap, model=loaded)
                row["kvqa"] = _kvqa(run, data, run.with_name(run.name + "_kvqa"), ft_steps, seed)
            else:
                row["cloze"] = _cloze(run, data, languages, cloze_annotator(cfg, data, seed))
                linker = any(o.type == "linking" for o in cfg.model.objectives.values())
                if linker and getattr(cfg.model.fusion, "knowledge", True):
                    row["linking"] = evaluate_linking(str(run))
                folder = "candidates" if cfg.model.fusion.type == "knowbert" else "shards"
                for task in ("typing", "relations"):
                    row[task] = _span_task(task, run, data, run.with_name(f"{run.name}_{task}"),
                                           ft_steps or 300, seed, folder)  # fmt: skip
            times[f"evaluation {name}"] = time.monotonic() - t0
            result["runs"][name] = row
            result["times_s"] = times
            (out / "results.json").write_text(json.dumps(result, indent=2))
    print("\n" + format_knowledge(result))
    draw_curves(out, "curves.png", runs, ["*_loss", "*_acc"],
                "knowledge pre-training, with and without the graph")  # fmt: skip
    return result


def format_knowledge(result: Mapping[str, Any]) -> str:
    """The with-graph vs. without-graph table: per run, each task's score on the toys whose
    facts the text states and on the graph-only toys (%)."""
    cols = [("cloze", "text wording"), ("cloze", "paraphrase"), ("typing", ""),
            ("relations", ""), ("visual_cloze", ""), ("visual_cloze_swapped", ""),
            ("kvqa", "")]  # fmt: skip
    present = [c for c in cols if any(c[0] in row for row in result["runs"].values())]
    heads = {"cloze": "cloze P@1", "typing": "typing F1", "relations": "relations acc",
             "visual_cloze": "visual cloze P@1", "visual_cloze_swapped": "entity swapped",
             "kvqa": "kvqa acc"}  # fmt: skip
    lines = [f"{'':<30}" + "".join(
        f"{(heads[t] + (' ' + w if w else '')):>26}" for t, w in present)]  # fmt: skip
    lines.append(f"{'':<30}" + "".join(f"{'text toys':>13}{'graph toys':>13}" for _ in present))
    for name, row in result["runs"].items():
        cells = []
        for task, wording in present:
            v = row.get(task)
            if v is None:
                cells.append(f"{'':>26}")
                continue
            v = v[wording] if wording else v
            cells.append("".join(f"{100 * v[g]:>13.1f}" for g in GROUPS))
        lines.append(f"{name:<30}" + "".join(cells))
    for name, row in result["runs"].items():
        link = row.get("linking")
        if link and link.get("acc") is not None:
            acc, prior = 100 * link["acc"], 100 * link["prior_acc"]
            lines.append(f"{name}: linking accuracy {acc:.1f} % vs the prior alone "
                         f"{prior:.1f} % ({link['spans']} test spans)")  # fmt: skip
        facts = row.get("facts_adapter")  # K-Adapter's factual adapter, before any task
        if facts:
            lines.append(f"{name}: its factual adapter's relation accuracy on its own training "
                         f"items {100 * facts['own']:.1f} %, on the test toys "
                         f"{100 * facts['text']:.1f} / {100 * facts['graph']:.1f} % (text / "
                         "graph toys)")  # fmt: skip
    t = result.get("transe", {}).get("test") or {}
    if t:
        m = t["both"]
        lines.append(f"TransE link prediction (held-out friend_of triples): MRR {m['mrr']:.3f}, "
                     f"Hits@10 {m['hits@10']:.3f}")  # fmt: skip
    lines.append(
        "chance: cloze 13.1 % (mean of 1/6, 1/8, 1/10), relations 50 %, "
        "typing micro-F1 about 57 % (the majority guess)"
    )
    return "\n".join(lines)
