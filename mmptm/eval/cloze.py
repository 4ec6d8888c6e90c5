"""LAMA-style cloze probes: does a masked language model know the object of a fact?

Input: LAMA T-REx lines (``{"sub_uri", "sub_label", "obj_uri", "obj_label", "predicate_id",
"masked_sentences": ["Bimo is made of [MASK] ."]}``, any other field such as ``facts`` kept
for grouping; ``language`` if present). Each line is a query; its answer is ``obj_label``. A
line with several masked sentences (templates, or LAMA's several evidence sentences) scores a
candidate by the mean of its scores in each sentence (a prompt ensemble).

**Ranking rule.** LAMA keeps only single-token objects and takes the argmax over the
vocabulary. With a BPE vocabulary many objects are several pieces, so the candidates are
ranked instead: the distinct ``obj_label`` of the line's relation in the file (or the
``candidates`` given), each written into the sentence in place of ``[MASK]`` and tokenised in
context, its pieces replaced by one [MASK] each; its score is the **mean log-probability of its
own pieces** at those masked positions (one forward pass per sentence and candidate). A
single-piece candidate's score is its log-probability, so for single-piece objects the ranking
is LAMA's restricted to the candidates. The mean, not the sum, keeps long names from losing
to short ones only for their length. The result counts the single-piece answers.

**Entities.** Each query is a text sample (``txt`` + ``json``: ``language``, ``mentions``:
the subject's character span and ``sub_uri``), read through the run's own data config and
text plug-in, so a run whose recipe sets ``data.modalities.text.spans: {entity: mentions}``
gets the subject's entity id in ``entity_ids`` as in training. The candidate's span travels as
one more span annotation (``cloze``), which gives its pieces (``cloze_mask``).

**Knowledge.** A query is built through the run's own plug-ins with the knowledge views its
model declares as input (:func:`query_needs`): besides the text views, every encoder's or
fusion's view whose plug-in reads only a text sample's members (``txt``, ``json``). So
K-BERT's sentence tree injects the subject's triples (its ``sentence_tree`` view reads no
member) and KnowBERT's KAR gets candidate spans (``candidates`` reads ``json``); views of
images or regions are left out. A knowledge field that training shards get from an offline
converter (KnowBERT's ``json.candidates``, ``mmptm data candidates``) is not in a query
sample: ``evaluate_cloze(annotate=...)`` adds it to each one.

**Metrics.** A gold answer's rank is the *realistic* rank among its relation's candidates
(1 + the candidates scored above it + half those tied with it, as PyKEEN and
``mmptm.eval.link_prediction``), so a model that scores everything alike gets no credit.
P@1 = share with rank 1, P@10 = rank <= 10, MRR = mean 1/rank: overall, per relation
(``predicate_id``) and per value of each ``group_by`` field (``facts``: text / graph).
Legend: N queries, C candidates, Q rows (query × candidate), L tokens, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmptm.batch import END, KEY, move_to
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.data.shards import ShardWriter
from mmptm.modalities.base import Need, merge_needs
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.mlm import MaskedLM
from mmptm.registry import MODALITIES

MASK = "[MASK]"
#: the span annotation (batch keys ``cloze_ids`` / ``cloze_mask``) marking a candidate's pieces
SPAN = "cloze"
_LANG_IN_NAME = re.compile(r"\.([a-z]{2,3})\.jsonl?$")
#: the members of a text query sample (:func:`query_sample`)
QUERY_MEMBERS = ("txt", "json")


@dataclass
class ClozeItem:
    """One query: sentences with one ``[MASK]`` each, its answer and its subject."""

    sentences: list[str]
    sub_label: str
    obj_label: str
    predicate_id: str
    sub_uri: str = ""
    #: every other field of the line (``facts`` ...), for grouping
    extra: dict[str, Any] = field(default_factory=dict)


def read_cloze(path: str | Path) -> list[ClozeItem]:
    """The queries of a LAMA T-REx jsonl file; a malformed line is a ``ValueError`` naming
    ``file:line``."""
    items = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
            if not isinstance(d, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object")
            for key in ("sub_label", "obj_label", "predicate_id"):
                if not isinstance(d.get(key), str) or not d[key]:
                    raise ValueError(f"{path}:{n}: {key!r} must be a non-empty string")
            sents = d.get("masked_sentences")
            ok = isinstance(sents, list) and bool(sents)
            if not ok or not all(isinstance(x, str) for x in sents):
                raise ValueError(f"{path}:{n}: 'masked_sentences' must be a non-empty list")
            for x in sents:
                if x.count(MASK) != 1:
                    raise ValueError(f"{path}:{n}: a masked sentence needs one {MASK}: {x!r}")
            known = {"sub_label", "obj_label", "predicate_id", "masked_sentences", "sub_uri"}
            items.append(
                ClozeItem(
                    sentences=sents,
                    sub_label=d["sub_label"],
                    obj_label=d["obj_label"],
                    predicate_id=d["predicate_id"],
                    sub_uri=str(d.get("sub_uri") or ""),
                    extra={k: v for k, v in d.items() if k not in known},
                )
            )
    if not items:
        raise ValueError(f"{path}: no cloze queries")
    return items


def read_candidates(path: str | Path) -> dict[str, list[str]] | list[str]:
    """Candidate objects: a ``.json`` ``{predicate_id: [labels]}`` or ``[labels]``, or a text
    file with one label per line (shared by every relation, as LAMA's common vocabulary)."""
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith(".json"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e.msg})") from None
        lists = value.values() if isinstance(value, dict) else [value]
        ok = isinstance(value, (list, dict)) and all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists
        )
        if not ok:
            raise ValueError(f"{path}: expected [labels] or {{predicate_id: [labels]}}")
        return value
    labels = [line.strip() for line in text.splitlines() if line.strip()]
    if not labels:
        raise ValueError(f"{path}: no candidate labels")
    return labels


def relation_candidates(
    items: Sequence[ClozeItem], given: Mapping[str, list[str]] | list[str] | None = None
) -> dict[str, list[str]]:
    """Candidates per relation: ``given`` (a list for every relation, or per relation), else
    the relation's distinct answers in file order; a gold answer missing from them is added."""
    out: dict[str, list[str]] = {}
    for it in items:
        if it.predicate_id not in out:
            if given is None:
                base: list[str] = []
            elif isinstance(given, Mapping):
                base = list(given.get(it.predicate_id, []))
            else:
                base = list(given)
            out[it.predicate_id] = list(dict.fromkeys(base))
    for it in items:
        if it.obj_label not in out[it.predicate_id]:
            out[it.predicate_id].append(it.obj_label)
    return out


def realistic_ranks(scores_NC: torch.Tensor, gold_N: torch.Tensor) -> torch.Tensor:
    """Rank of each row's gold column: 1 + #higher + #tied/2 (NaN = -inf: never above)."""
    s = torch.nan_to_num(scores_NC.double(), nan=float("-inf"))
    g = s.gather(1, gold_N[:, None])
    higher = (s > g).sum(1).double()
    tied = (s == g).sum(1).double() - 1  # the gold itself
    return 1 + higher + tied / 2


def rank_metrics(ranks: torch.Tensor) -> dict[str, float]:
    """P@1, P@10 and MRR of realistic ranks, and their count."""
    r = ranks.double()
    if r.numel() == 0:
        return {"n": 0, "p@1": 0.0, "p@10": 0.0, "mrr": 0.0}
    return {
        "n": int(r.numel()),
        "p@1": float((r <= 1).double().mean()),
        "p@10": float((r <= 10).double().mean()),
        "mrr": float((1 / r).mean()),
    }


def query_sample(
    item: ClozeItem, sentence: int, candidate: str, language: str, key: str
) -> dict[str, Any]:
    """The text sample of one of the query's sentences filled with ``candidate``: txt, and
    json with the candidate's span (``cloze``) and the subject's entity mention (``mentions``)."""
    template = detokenize(item.sentences[sentence])
    at = template.index(MASK)
    text = template[:at] + candidate + template[at + len(MASK) :]
    meta: dict[str, Any] = {"language": language, SPAN: [[at, at + len(candidate), 0]]}
    sub = _subject_start(template, item.sub_label, at)
    if sub is not None and item.sub_uri:
        if sub > at:
            sub += len(candidate) - len(MASK)
        meta["mentions"] = [[sub, sub + len(item.sub_label), item.sub_uri]]
    return {"__key__": key, "txt": text, "json": meta}


#: a space before punctuation: LAMA's sentences are written tokenised ("of [MASK] .")
_DETACHED = re.compile(r"\s+([.,;:!?])")


def detokenize(sentence: str) -> str:
    """The sentence as running text ("of [MASK]."): a word-piece tokenizer (LAMA's BERT) splits
    the punctuation off anyway, but a sentencepiece one reads " ." as another piece than the
    "." of the text it was trained on."""
    return _DETACHED.sub(r"\1", sentence)


def _subject_start(sentence: str, sub_label: str, mask_at: int) -> int | None:
    """Where the subject is written in the sentence (not overlapping the mask), or None."""
    start = sentence.find(sub_label)
    while start >= 0:
        if start + len(sub_label) <= mask_at or start >= mask_at + len(MASK):
            return start
        start = sentence.find(sub_label, start + 1)
    return None


def _mlm_head(model: PretrainModel) -> MaskedLM:
    heads = [o for o in model.objectives.values() if isinstance(o, MaskedLM)]
    if not heads:
        raise ValueError("the run has no mlm objective: a cloze probe needs a masked-LM head")
    return heads[0]


def query_needs(
    model: PretrainModel, members: Sequence[str] | None = QUERY_MEMBERS
) -> dict[str, Need]:
    """The views of ``model`` that query samples with these shard ``members`` can serve: its
    text views, and each view its encoders or fusion read as input whose plug-in reads no
    other member (K-BERT's ``sentence_tree``, KnowBERT's ``candidates``; not an image or
    regions view, nor an objective's labels). ``members`` None: every view."""
    declared = model.data_needs()
    if members is None:
        return declared
    inputs = [model.fusion.data_needs(), *(e.data_needs() for e in model.encoders.values())]
    read = {view for needs in inputs for view in needs}

    def served(need: Need) -> bool:
        return set(MODALITIES.get(need.modality).members) <= set(members)

    return {v: n for v, n in declared.items() if n.modality == "text" or (v in read and served(n))}


@torch.no_grad()
def score_queries(
    model: PretrainModel,
    cfg: Any,
    tokenizer: Any,
    samples: Iterable[dict[str, Any]],
    *,
    device: str = "cpu",
    batch_size: int = 64,
    text_only: bool = True,
) -> dict[str, tuple[float, int]]:
    """Mean log-probability of each sample's ``cloze`` span pieces with them masked, and the
    number of pieces, by sample key (samples as :func:`query_sample` makes them).
    ``text_only``: the samples are text samples: read the views :func:`query_needs` keeps
    (the text and the knowledge the model reads with it; False: every view the model reads,
    for samples that carry its image or regions too, a visual cloze)."""
    mlm = _mlm_head(model)
    view = mlm.cfg.modality
    needs = query_needs(model, QUERY_MEMBERS if text_only else None)
    span = {view: Need("text", {"spans": {SPAN: SPAN}})}
    needs = merge_needs([("model", needs), ("cloze", span)])
    prefix = mlm.prefix
    out: dict[str, tuple[float, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with ShardWriter(Path(tmp) / "cloze-%06d.tar", 10**9) as w:
            for s in samples:
                w.write(s)
        data = dataclasses.replace(cfg.data, batch_size=batch_size)
        stream = stream_config(
            data, tokenizer, split="test", shards=f"{tmp}/cloze-000000.tar", needs=needs
        )
        for batch in single_pass(stream):
            if END in batch:
                continue
            sel_BL = batch[f"{prefix}{SPAN}_mask"]
            ids_BL = batch[f"{prefix}input_ids"]
            target_BL = ids_BL.clone()
            batch[f"{prefix}input_ids"] = ids_BL.masked_fill(sel_BL, tokenizer.mask_id)
            h_BLD = model.fuse(move_to(batch, device)).hidden[view]
            logp_MV = mlm.logits(h_BLD[sel_BL.to(device)]).float().log_softmax(-1)
            mean_B, n_B = mean_piece_logprob(
                logp_MV.cpu(), target_BL[sel_BL], sel_BL.nonzero()[:, 0], len(ids_BL)
            )
            for i, key in enumerate(batch[KEY]):
                out[key] = (float(mean_B[i]), int(n_B[i]))
    return out


def mean_piece_logprob(
    logp_MV: torch.Tensor, target_M: torch.Tensor, row_M: torch.Tensor, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the mean log-probability of its target pieces (M masked positions, each
    with its row) and their number; a row without pieces (truncated away) scores -inf."""
    lp_M = logp_MV.double().gather(1, target_M[:, None])[:, 0]
    n_B = torch.zeros(rows, dtype=torch.long).index_add_(0, row_M, torch.ones_like(row_M))
    sum_B = torch.zeros(rows, dtype=torch.float64).index_add_(0, row_M, lp_M)
    mean_B = torch.where(n_B > 0, sum_B / n_B.clamp_min(1), torch.tensor(float("-inf")))
    return mean_B, n_B


def evaluate_cloze(
    run: str,
    file: str,
    *,
    language: str = "",
    candidates: str | Mapping[str, list[str]] | list[str] | None = None,
    group_by: Sequence[str] = ("facts",),
    overrides: Sequence[str] = (),
    device: str = "cpu",
    batch_size: int = 64,
    model: tuple[PretrainModel, Any, Any] | None = None,
    sentence: int | None = None,
    annotate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Cloze P@1 / P@10 / MRR of a run (directory or checkpoint) on a LAMA T-REx file:
    ``overall``, ``by_relation`` and ``by_<field>`` for each ``group_by`` field present.

    ``annotate``: adds to each query sample (``txt``, ``json`` with the candidate's span
    under ``cloze``) the knowledge fields an offline converter wrote into the run's training
    shards (KnowBERT's candidate spans); it returns the sample.

    ``sentence``: score each line's masked sentence of that index alone (a line without it
    is an error); default: all of them, as a prompt ensemble.

    ``language``: the queries' language (default: a line's ``language``, else from a
    ``NAME.<lang>.jsonl`` file name, else the tokenizer's first). ``model``: an already
    loaded ``(model, tokenizer, cfg)``.
    """
    items = read_cloze(file)
    if sentence is not None:
        items = _one_sentence(items, sentence, file)
    if isinstance(candidates, (str, Path)):
        candidates = read_candidates(candidates)
    cands = relation_candidates(items, candidates)
    net, tokenizer, cfg = model or load_pretrained(run, overrides)
    net = net.to(device).eval()
    default = language or probe_language(Path(file), tokenizer.languages)
    samples = _cloze_samples(items, cands, language, default)
    if annotate is not None:
        samples = (annotate(s) for s in samples)
    scored = score_queries(net, cfg, tokenizer, samples, device=device, batch_size=batch_size)
    r, pieces = _gold_ranks(items, cands, scored)
    result: dict[str, Any] = {
        "file": str(file),
        "language": default,
        "overall": rank_metrics(r),
        "single_piece_answers": sum(p == 1 for p in pieces),
        "candidates": {rel: len(c) for rel, c in cands.items()},
        "no_subject_span": sum(
            _subject_start(x, it.sub_label, x.index(MASK)) is None
            for it in items
            for x in it.sentences
        ),
        "by_relation": _grouped(r, [it.predicate_id for it in items]),
    }
    for name in group_by:
        values = [it.extra.get(name) for it in items]
        if any(v is not None for v in values):
            result[f"by_{name}"] = _grouped(r, [str(v) for v in values])
    return result


def probe_language(file: Path, languages: Sequence[str] = ()) -> str:
    """The language a ``NAME.<lang>.jsonl`` file name gives, else the first of ``languages``
    (else en)."""
    m = _LANG_IN_NAME.search(file.name)
    return m.group(1) if m else (list(languages) or ["en"])[0]


def _one_sentence(items: list[ClozeItem], sentence: int, file: str) -> list[ClozeItem]:
    """``items`` with only their masked sentence of index ``sentence``, which each must have."""
    short = [
        i for i, it in enumerate(items) if not -len(it.sentences) <= sentence < len(it.sentences)
    ]
    if short:
        raise ValueError(
            f"{file}: line {short[0] + 1} has no masked sentence {sentence} "
            f"({len(items[short[0]].sentences)} given)"
        )
    return [dataclasses.replace(it, sentences=[it.sentences[sentence]]) for it in items]


def _cloze_samples(
    items: list[ClozeItem], cands: Mapping[str, list[str]], language: str, default: str
) -> Iterable[dict[str, Any]]:
    """Every query's text samples, one per sentence and candidate, keyed
    ``{item:07d}_{sentence:03d}_{candidate:05d}`` (what :func:`_gold_ranks` looks up)."""
    for i, it in enumerate(items):
        lang = language or str(it.extra.get("language") or default)
        for j in range(len(it.sentences)):
            for c, label in enumerate(cands[it.predicate_id]):
                yield query_sample(it, j, label, lang, f"{i:07d}_{j:03d}_{c:05d}")


def _gold_ranks(
    items: list[ClozeItem], cands: Mapping[str, list[str]], scored: Mapping[str, tuple[float, int]]
) -> tuple[torch.Tensor, list[int]]:
    """Each item's gold rank among its relation's candidates (scores averaged over its
    sentences), and the gold answer's number of pieces."""
    ranks, pieces = [], []
    for i, it in enumerate(items):
        labels = cands[it.predicate_id]
        s_SC = torch.tensor(
            [[scored[f"{i:07d}_{j:03d}_{c:05d}"][0] for c in range(len(labels))]
             for j in range(len(it.sentences))]
        )  # fmt: skip
        gold = labels.index(it.obj_label)
        ranks.append(float(realistic_ranks(s_SC.mean(0)[None], torch.tensor([gold]))[0]))
        pieces.append(scored[f"{i:07d}_000_{gold:05d}"][1])
    return torch.tensor(ranks), pieces


def _grouped(ranks: torch.Tensor, keys: Sequence[str]) -> dict[str, dict[str, float]]:
    rows: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        rows[k].append(i)
    return {k: rank_metrics(ranks[torch.tensor(idx)]) for k, idx in sorted(rows.items())}


def format_cloze(result: Mapping[str, Any]) -> str:
    """A table: overall, then each group and relation, with P@1, P@10, MRR and the count."""
    lines = [f"{'':<28}{'P@1':>8}{'P@10':>8}{'MRR':>8}{'n':>7}"]

    def row(name: str, m: Mapping[str, float]) -> None:
        lines.append(
            f"{name:<28}{100 * m['p@1']:>7.1f}%{100 * m['p@10']:>7.1f}%{m['mrr']:>8.3f}{m['n']:>7}"
        )

    row("overall", result["overall"])
    for key, groups in result.items():
        if key.startswith("by_") and key != "by_relation":
            for value, m in groups.items():
                row(f"{key[3:]}={value}", m)
    for rel, m in result["by_relation"].items():
        row(f"relation {rel}", m)
    n = result["overall"]["n"]
    lines.append(f"single-piece answers: {result['single_piece_answers']} of {n}")
    return "\n".join(lines)


__all__ = [
    "ClozeItem",
    "evaluate_cloze",
    "format_cloze",
    "mean_piece_logprob",
    "probe_language",
    "query_needs",
    "query_sample",
    "rank_metrics",
    "read_candidates",
    "read_cloze",
    "realistic_ranks",
    "relation_candidates",
    "score_queries",
]
