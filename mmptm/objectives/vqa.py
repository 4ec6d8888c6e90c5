"""VQA v2: the official answer normalisation and soft score, soft targets, the answer head.

Scoring follows the official evaluation (``vqaEval.py``), re-implemented from its definition:

- :func:`normalize_answer`: newlines/tabs to spaces and strip; punctuation (see
  :func:`_process_punctuation`); then lower-case, number words → digits, articles dropped,
  apostrophe-less contractions restored ("dont" → "don't").
- :func:`soft_score`: a candidate's accuracy against the human answers is the mean, over the
  leave-one-out subsets of the answers (10 subsets of 9 for VQA), of min(1, #matches / 3).

Two deliberate differences from the official script: answers are *always* normalised (the
script skips normalisation of a question whose ten answers are all identical, which only
matters for oddly formatted predictions), and :data:`CONTRACTIONS` holds the common entries of
the official table, not every one of its rarer forms (the mechanism is the same; extend the
table to add more).

The ``vqa`` objective is the fine-tuning head: an MLP on the joint pooled vector trained with
binary cross-entropy against soft scores (``vqa_targets [B,A]``, built with :func:`soft_targets`).
Its answer vocabulary (and aliases file) are resources: ``mmptm.models`` reads the files and
hands the lists over. Building a vocabulary from shards: :mod:`mmptm.converters.answers`;
accuracy over a data set and the official results file: :mod:`mmptm.eval.vqa`.

Legend: B batch, D width, A answers in the vocabulary.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need
from mmptm.objectives.base import Aliases, Lines, Objective, Resource
from mmptm.objectives.heads import mlp_head
from mmptm.registry import OBJECTIVES

# --------------------------------------------------------------------------------------------
# Normalisation

_PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">",
                "<", "@", "`", ",", "?", "!")  # fmt: skip
# The official pattern's look-behind is mistyped as a look-ahead (``(?!<=\d)``), so in effect
# a period is removed unless a digit follows it ("2.5" stays, "dog." → "dog").
_PERIOD_STRIP = re.compile(r"\.(?!\d)")
# A comma between digits anywhere in the answer ("1,000") switches punctuation from
# "replace by a space" to "delete", so numbers stay whole.
_COMMA_STRIP = re.compile(r"\d,\d")

NUMBER_WORDS = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
    "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
}  # fmt: skip
ARTICLES = frozenset({"a", "an", "the"})
#: apostrophe-less spelling → the official form (common entries of the official table; its
#: capitalised keys such as "Im" are left out: words are lower-cased first, so they never match)
CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've",
    "couldnt": "couldn't", "couldn'tve": "couldn't've", "couldnt've": "couldn't've",
    "didnt": "didn't", "doesnt": "doesn't", "dont": "don't", "hadnt": "hadn't",
    "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't", "havent": "haven't",
    "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd",
    "howll": "how'll", "hows": "how's", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've",
    "it'dve": "it'd've",
    "itll": "it'll", "let's": "let's", "maam": "ma'am", "mightnt": "mightn't",
    "mightve": "might've", "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't",
    "notve": "not've", "oclock": "o'clock", "oughtnt": "oughtn't", "shant": "shan't",
    "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's", "shouldve": "should've",
    "shouldnt": "shouldn't", "shouldnt've": "shouldn't've", "shouldn'tve": "shouldn't've",
    "somebodyd": "somebody'd", "somebodys": "somebody's", "someoned": "someone'd",
    "someones": "someone's", "somethingd": "something'd", "somethings": "something's",
    "thered": "there'd", "therere": "there're", "theres": "there's", "theyd": "they'd",
    "theyll": "they'll", "theyre": "they're", "theyve": "they've", "twas": "'twas",
    "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've",
    "werent": "weren't", "whatll": "what'll", "whatre": "what're", "whats": "what's",
    "whatve": "what've", "whens": "when's", "whered": "where'd", "wheres": "where's",
    "whereve": "where've", "whod": "who'd", "wholl": "who'll", "whos": "who's",
    "whove": "who've", "whyll": "why'll", "whyre": "why're", "whys": "why's", "wont": "won't",
    "wouldve": "would've", "wouldnt": "wouldn't", "yall": "y'all", "youd": "you'd",
    "youll": "you'll", "youre": "you're", "youve": "you've",
}  # fmt: skip


def _process_punctuation(text: str) -> str:
    """Punctuation next to a space (or any, if digits are comma-grouped) is deleted; other
    punctuation becomes a space ("black-and-white" → "black and white")."""
    delete_all = _COMMA_STRIP.search(text) is not None
    out = text
    for p in _PUNCTUATION:
        if delete_all or f"{p} " in text or f" {p}" in text:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD_STRIP.sub("", out)


def _process_digit_article(text: str) -> str:
    words = [NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    words = [CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES]
    return " ".join(words)


def normalize_answer(answer: str) -> str:
    """The official VQA answer normalisation (see the module docstring)."""
    answer = answer.replace("\n", " ").replace("\t", " ").strip()
    return _process_digit_article(_process_punctuation(answer))


# --------------------------------------------------------------------------------------------
# Scores


def _score(matches: int, n: int) -> float:
    """Leave-one-out mean of min(1, matches/3) over ``n`` answers, ``matches`` of which agree."""
    if n == 0:
        return 0.0
    if n == 1:  # no leave-one-out subset is left: score the single answer directly
        return min(1.0, matches / 3)
    # Leaving out one of the agreeing answers leaves matches-1; leaving out another, matches.
    return (matches * min(1.0, (matches - 1) / 3) + (n - matches) * min(1.0, matches / 3)) / n


def soft_score(answers: Sequence[str], candidate: str) -> float:
    """Official VQA accuracy of ``candidate`` against the human ``answers`` (in [0, 1])."""
    want = normalize_answer(candidate)
    return _score(sum(normalize_answer(a) == want for a in answers), len(answers))


def soft_targets(
    answers: Sequence[str], vocab: Mapping[str, int] | Sequence[str]
) -> dict[int, float]:
    """Training targets {answer index: soft score > 0} for the vocabulary's answers.

    ``vocab`` holds normalised answers (as :mod:`mmptm.converters.answers` writes them), either
    as a list (index = position) or a mapping answer → index.
    """
    index = vocab if isinstance(vocab, Mapping) else {a: i for i, a in enumerate(vocab)}
    counts = Counter(normalize_answer(a) for a in answers)
    out = {}
    for ans, m in counts.items():
        if ans in index and (s := _score(m, len(answers))) > 0:
            out[index[ans]] = s
    return out


# --------------------------------------------------------------------------------------------
# Head


def answer_entity_rows(
    answers: Sequence[str], aliases: Mapping[str, Sequence[str]], fusion: object, where: str = ""
) -> list[int]:
    """Per answer, the entity-table row of the entity one of whose ``aliases`` (entity id →
    names) it is (both normalised as VQA answers), -1 for none; an alias of two entities
    names neither. ``where``: the aliases file, for errors."""
    table = getattr(fusion, "entities", None)
    if table is None or not getattr(table, "names", None):
        raise ValueError(
            f"vqa.answer_entities scores answers against the fusion's entity table, loaded "
            f"from a file; fusion {type(fusion).__name__} has none (use fusion: ernie with "
            "entities.embeddings)"
        )
    if not answers:
        raise ValueError("vqa.answer_entities needs the answer vocabulary (vqa.answers)")
    row_of = {name: i for i, name in enumerate(table.names)}
    owner: dict[str, int] = {}
    for entity, names in aliases.items():
        if entity not in row_of:
            continue
        row = row_of[entity]
        for name in {normalize_answer(a) for a in names}:
            owner[name] = row if owner.get(name, row) == row else -2  # -2: ambiguous
    rows = [max(owner.get(a, -1), -1) for a in answers]
    if all(r < 0 for r in rows):
        raise ValueError(
            f"vqa.answer_entities: none of the {len(answers)} answers is an alias of an entity "
            f"of the table in {where}"
        )
    return rows


@dataclass
class SoftTargets:
    """VQA data side: the raw ``answers`` of each question → ``vqa_targets [B,A]`` soft scores.

    The vocabulary lives in the objective's config alone; batches without answers (other
    sources of a mixture, test questions) are left as they are.
    """

    data_priority: ClassVar[int] = 5

    vocab: tuple[str, ...]

    def __call__(self, batch: dict, g: torch.Generator) -> dict:
        if "answers" not in batch:
            return batch
        index = {a: i for i, a in enumerate(self.vocab)}
        targets_BA = torch.zeros(len(batch["answers"]), len(self.vocab))
        for b, answers in enumerate(batch["answers"]):
            for i, score in soft_targets(answers, index).items():
                targets_BA[b, i] = score
        batch["vqa_targets"] = targets_BA
        return batch


@OBJECTIVES.register("vqa")
class VQAHead(Objective):
    """Soft-score answer classifier on a pooled vector (UNITER/LXMERT VQA head).

    The loss is ``binary_cross_entropy_with_logits(logits, vqa_targets) * A``: BCE summed over
    the answers and averaged over the batch. The metric ``score`` is the mean soft score of
    the argmax answer. A batch without ``vqa_targets`` (another source of a mixture) gets no
    loss from it.

    As a pre-training task (LXMERT's image QA, ``lxmert_full_tiny``) it reads the questions of
    a VQA-style source with the answer vocabulary fine-tuning uses, so that the head carries
    over; beside ITM, only the matched pairs (``itm_labels`` 1) are answered, as in LXMERT.
    """

    @dataclass
    class Config:
        type: str = "vqa"
        weight: float = 1.0
        #: answer vocabulary file, one normalised answer per line
        answers: str = ""
        #: A; 0 = the number of lines in ``answers``
        num_answers: int = 0
        #: which pooled vector: ``joint`` (single/two stream) or a modality name
        pooled: str = "joint"
        #: hidden size of the MLP as a multiple of the width
        hidden_mult: int = 2
        #: answers that name knowledge-graph entities: an aliases file (Wikidata5M's
        #: ``id<TAB>alias...``); an answer equal to an alias (both normalised) is scored
        #: against its entity's vector in the fusion's entity table (``fusion: ernie``)
        #: instead of by a classifier row, so an answer about an unseen entity can be read
        #: off the graph. "" = a plain classifier
        answer_entities: str = ""
        layer_norm_eps: float = 1e-12

    @classmethod
    def resources(cls, cfg: Config) -> dict[str, Resource]:
        """``answers`` (the data side's too) and ``aliases``: the files the config names."""
        out: dict[str, Resource] = {}
        if cfg.answers:
            out["answers"] = Lines("vqa.answers", cfg.answers, data_side=True)
        if cfg.answer_entities:
            out["aliases"] = Aliases("vqa.answer_entities", cfg.answer_entities)
        return out

    @classmethod
    def data_transform(
        cls, cfg: Config, vocab: object, answers: Sequence[str] | None = None
    ) -> SoftTargets | None:
        if not cfg.answers:
            return None
        if answers is None:
            raise ValueError(f"vqa: the data side needs the answers of {cfg.answers} (resources)")
        return SoftTargets(tuple(answers))

    def __init__(
        self, cfg: Config, *, width: int, fusion: nn.Module | None = None,
        answers: Sequence[str] | None = None, aliases: Mapping[str, Sequence[str]] | None = None,
        **_: object,
    ) -> None:  # fmt: skip
        """``answers``, ``aliases``: the lists of ``cfg.answers``, ``cfg.answer_entities``
        (see :meth:`resources`)."""
        super().__init__()
        self.cfg = cfg
        if (cfg.answers and answers is None) or (cfg.answer_entities and aliases is None):
            raise ValueError(
                "vqa: the answer and aliases files are read by mmptm.models (build the "
                "objective with mmptm.models.resources.build_objective)"
            )
        self.answers: list[str] = list(answers or []) if cfg.answers else []
        n = cfg.num_answers or len(self.answers)
        if n < 1:
            raise ValueError("vqa needs an answer vocabulary: set vqa.answers or vqa.num_answers")
        if self.answers and n != len(self.answers):
            raise ValueError(
                f"vqa.num_answers={n} but {cfg.answers} lists {len(self.answers)} answers"
            )
        if cfg.hidden_mult < 1:
            raise ValueError(f"vqa.hidden_mult must be >= 1, got {cfg.hidden_mult}")
        self.num_answers = n
        hidden = cfg.hidden_mult * width
        self.head = mlp_head(width, hidden, n, cfg.layer_norm_eps)
        self._fusion = (fusion,)  # a tuple keeps the fusion's modules out of this one
        self.to_entity: nn.Linear | None = None
        if cfg.answer_entities:
            rows = answer_entity_rows(self.answers, aliases or {}, fusion, cfg.answer_entities)
            self.register_buffer("answer_rows", torch.tensor(rows), persistent=False)
            self.to_entity = nn.Linear(hidden, fusion.cfg.entity_dim, bias=False)
        init_weights(self)

    def data_needs(self) -> dict[str, Need]:
        return {"answers": Need("answers")}

    def logits(self, out: FusionOutput) -> torch.Tensor:
        """Answer logits [B,A]."""
        if self.cfg.pooled not in out.pooled:
            raise ValueError(
                f"vqa.pooled={self.cfg.pooled!r} is not produced by this fusion "
                f"(has {sorted(out.pooled)})"
            )
        hidden_BH = self.head[:-1](out.pooled[self.cfg.pooled])
        (fusion,) = self._fusion
        if self.to_entity is None or not fusion.cfg.knowledge:
            return self.head[-1](hidden_BH).float()
        # an entity answer: <W h, e_a> + its bias, no free classifier row (which would learn
        # the fine-tuning's entities by heart); other answers: the classifier
        rows_A = self.answer_rows
        has_A1 = (rows_A >= 0).unsqueeze(-1)
        out_layer = self.head[-1]
        logits_BA = F.linear(hidden_BH, out_layer.weight * ~has_A1, out_layer.bias)
        e_AK = fusion.entities.rows(rows_A.clamp_min(0)) * has_A1
        return (logits_BA + self.to_entity(hidden_BH) @ e_AK.to(hidden_BH.dtype).T).float()

    @torch.no_grad()
    def predict(self, out: FusionOutput) -> torch.Tensor:
        """Index [B] of the highest-scoring answer."""
        return self.logits(out).argmax(-1)

    def answer_strings(self, indices_B: torch.Tensor) -> list[str]:
        """Answers of predicted indices (needs the ``answers`` file)."""
        if not self.answers:
            raise ValueError("vqa.answers is not set: indices cannot be turned into answers")
        return [self.answers[i] for i in indices_B.tolist()]

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "vqa_targets" not in batch:
            return {}
        targets_BA = batch["vqa_targets"].float()
        if targets_BA.shape[-1] != self.num_answers:
            raise ValueError(
                f"vqa_targets have {targets_BA.shape[-1]} answers, the head {self.num_answers}"
            )
        logits_BA = self.logits(out)
        if "itm_labels" in batch:  # pre-training (LXMERT): a question whose image ITM's data
            # side swapped for another (itm_labels 0) has no answer to learn
            matched_B = batch["itm_labels"].to(logits_BA.device) != 0
            if not bool(matched_B.any()):
                return {"loss": logits_BA.sum() * 0.0}
            logits_BA, targets_BA = logits_BA[matched_B], targets_BA[matched_B]
        loss = F.binary_cross_entropy_with_logits(logits_BA, targets_BA) * self.num_answers
        best_B1 = logits_BA.argmax(-1, keepdim=True)
        score = targets_BA.gather(1, best_B1).mean()
        return {"loss": loss, "score": score.detach()}
