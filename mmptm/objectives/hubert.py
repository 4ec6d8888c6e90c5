"""HuBERT's objective: predict the k-means unit of masked steps from their context.

Data side: span masking, as wav2vec 2.0 (:class:`~mmptm.objectives.masking.MaskSpans`;
HuBERT base: a real step starts a span with probability 0.08, spans of 10 steps, at least 2).

Targets, computed on the device each step from the batch waveform ``<prefix>audio`` [B,S] and
``<prefix>audio_mask``: a featurizer (:mod:`mmptm.objectives.audio_units`) gives one vector
per encoder step — ``features: mfcc`` (iteration 1: 39-d MFCC + deltas) or ``features:
teacher`` (iteration 2: a frozen earlier run's audio encoder after ``teacher_layer``; the run
is a resource, loaded by ``mmptm.models`` and handed over as the encoder) — and
each real step's unit is the id of its nearest row of ``codebook`` (a ``.npy`` [K,F] from
``mmptm units fit --audio-features``, fitted on the same featurizer; its json sidecar is
checked to say so). Targets carry no gradient.

Loss side (HuBERT's masked prediction): the context vectors ``hidden[view]`` [B,T,D] through
``final_proj`` (D → E) are compared with learned unit embeddings [K,E] by cosine /
``logit_temperature``; cross-entropy over the K units, averaged over the masked real steps
(weight ``pred_masked_weight``, name ``loss``) and, when ``pred_nomask_weight`` > 0, over the
unmasked real steps (``unmasked_loss``). Metrics: ``acc_masked`` (and ``acc_unmasked``).
HuBERT's feature penalty (on the conv features before their layer norm) is left out, as in
``wav2vec2`` (see there).

Legend: B batch, S samples, T steps, F feature width, D width, E ``final_dim``, K units,
M predicted steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import Encoder, VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need
from mmptm.modalities.features import load_codebook, nearest
from mmptm.objectives.audio_units import Featurizer, MfccFeaturizer, TeacherFeaturizer
from mmptm.objectives.base import Objective, Resource, RunEncoder
from mmptm.objectives.masking import MaskSpans, SpanMaskConfig, audio_encoder
from mmptm.registry import OBJECTIVES

IGNORE = -100


def unit_targets(
    feats_BTF: torch.Tensor, steps_BT: torch.Tensor, codebook_KF: torch.Tensor
) -> torch.Tensor:
    """[B,T] long: the nearest codebook row of each real step's features, -100 elsewhere."""
    ids_N, _ = nearest(feats_BTF[steps_BT].float(), codebook_KF.float())
    labels_BT = torch.full(steps_BT.shape, IGNORE, dtype=torch.long, device=steps_BT.device)
    labels_BT[steps_BT] = ids_N
    return labels_BT


def check_sidecar(codebook: str, featurizer: Featurizer) -> None:
    """The codebook's json (from ``units fit``) must name the same kind of features (and
    teacher layer) as the objective computes; a codebook without one is taken on trust."""
    side = Path(codebook).with_suffix(".json")
    if not side.is_file():
        return
    try:
        fitted = json.loads(side.read_text()).get("features")
    except (OSError, ValueError, AttributeError):
        return
    if not isinstance(fitted, dict):
        return
    want = featurizer.describe()
    if fitted.get("kind") != want["kind"] or fitted.get("layer") != want.get("layer"):
        raise ValueError(
            f"hubert: codebook {codebook!r} was fitted on {fitted} features, but the objective "
            f"computes {want}"
        )


@OBJECTIVES.register("hubert")
class Hubert(Objective):
    """Masked prediction of k-means units of MFCC or teacher features (HuBERT)."""

    @dataclass
    class Config(SpanMaskConfig):
        type: str = "hubert"
        mask_prob: float = 0.08
        #: what the units are k-means ids of: mfcc (iteration 1) | teacher (iteration 2)
        features: str = "mfcc"
        #: ``.npy`` [K,F] from ``mmptm units fit --audio-features``
        codebook: str = ""
        #: features: teacher — the earlier run (dir or checkpoint, sharded ones too), its
        #: layer, its view name (loaded by ``mmptm.models``, handed over as ``teacher``)
        teacher: str = ""
        teacher_layer: int = 0
        teacher_view: str = ""
        final_dim: int = 256
        logit_temperature: float = 0.1
        pred_masked_weight: float = 1.0
        pred_nomask_weight: float = 0.0

    @classmethod
    def resources(cls, cfg: Config) -> dict[str, Resource]:
        """``teacher``: the earlier run's audio encoder (features: teacher)."""
        if cfg.features != "teacher" or not cfg.teacher:
            return {}
        return {"teacher": RunEncoder("hubert.teacher", cfg.teacher, modality="audio",
                                      view=cfg.teacher_view, name=cfg.modality)}  # fmt: skip

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> MaskSpans:
        return cfg.span_masking()

    def __init__(
        self, cfg: Config, *, width: int, encoders: nn.ModuleDict, teacher: Encoder | None = None,
        **_: object,
    ) -> None:  # fmt: skip
        """``teacher``: the frozen encoder of ``cfg.teacher`` (see :meth:`resources`)."""
        super().__init__()
        audio_encoder(encoders, cfg.modality, "hubert.modality")
        if cfg.logit_temperature <= 0 or min(cfg.pred_masked_weight, cfg.pred_nomask_weight) < 0:
            raise ValueError("hubert: logit_temperature must be > 0 and the weights >= 0")
        if not cfg.codebook:
            raise ValueError("hubert.codebook is unset (`mmptm units fit --audio-features`)")
        self.cfg = cfg
        self.prefix = cfg.prefix
        self.featurizer: Featurizer
        if cfg.features == "mfcc":
            self.featurizer = MfccFeaturizer()
        elif cfg.features == "teacher":
            if not cfg.teacher or cfg.teacher_layer < 1:
                raise ValueError("hubert: features: teacher needs a teacher run, teacher_layer > 0")
            if teacher is None:
                raise ValueError(
                    "hubert: features: teacher needs the teacher run's encoder, loaded by "
                    "mmptm.models (build the objective with mmptm.models.resources."
                    "build_objective)"
                )
            self.featurizer = TeacherFeaturizer(teacher, cfg.teacher_layer, run=cfg.teacher)
        else:
            raise ValueError(f"hubert.features must be mfcc or teacher, got {cfg.features!r}")
        codebook_KF = torch.from_numpy(load_codebook(cfg.codebook))
        mfcc = isinstance(self.featurizer, MfccFeaturizer)
        if mfcc and codebook_KF.shape[1] != self.featurizer.dim:
            raise ValueError(
                f"hubert: codebook {cfg.codebook!r} has width {codebook_KF.shape[1]}, mfcc "
                f"features {self.featurizer.dim}"
            )
        check_sidecar(cfg.codebook, self.featurizer)
        # the codebook is data named by the config, not a learned weight: kept out of the
        # state dict (a checkpoint stays loadable when the file is refitted with another K)
        self.register_buffer("codebook", codebook_KF, persistent=False)
        K = len(codebook_KF)
        self.final_proj = nn.Linear(width, cfg.final_dim)
        self.unit_embeddings = nn.Parameter(torch.empty(K, cfg.final_dim).uniform_())

    def data_needs(self) -> dict[str, Need]:
        """The waveform at the featurizer's rate (a teacher's facts: its rate, normalisation,
        steps — a student that reads its view otherwise gets an error naming both)."""
        return {self.cfg.modality: Need("audio", self.featurizer.facts())}

    def targets(self, batch: Batch, steps_BT: torch.Tensor) -> torch.Tensor:
        """[B,T] unit ids at real steps (-100 elsewhere), without gradient; in float32 even
        under autocast (the ids must be the ones ``units fit`` assigned)."""
        with torch.no_grad(), torch.autocast(steps_BT.device.type, enabled=False):
            feats_BTF = self.featurizer.batch(batch, self.prefix, steps_BT)
            if feats_BTF.shape[-1] != self.codebook.shape[1]:
                raise ValueError(
                    f"hubert: {self.cfg.features} features have width {feats_BTF.shape[-1]} but "
                    f"codebook {self.cfg.codebook!r} has {self.codebook.shape[1]}"
                )
            return unit_targets(feats_BTF, steps_BT, self.codebook)

    def logits(self, h_MD: torch.Tensor) -> torch.Tensor:
        """[M,K]: cosine(final_proj(h), unit embedding) / temperature (float32, as HuBERT)."""
        p_ME = F.normalize(self.final_proj(h_MD).float(), dim=-1)
        with torch.autocast(p_ME.device.type, enabled=False):
            e_KE = F.normalize(self.unit_embeddings.float(), dim=-1)
            return p_ME @ e_KE.T / self.cfg.logit_temperature

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        v, key = self.cfg.modality, f"{self.prefix}audio_masked"
        if key not in batch or v not in out.hidden:
            return {}  # a batch without this view (another source of a mixture)
        h_BTD = out.hidden[v]
        steps_BT = batch.get(f"{self.prefix}audio_steps_mask")
        steps_BT = out.encoded[v].mask if steps_BT is None else steps_BT
        steps_BT = steps_BT.bool()
        masked_BT = batch[key].bool() & steps_BT
        if h_BTD.shape[:2] != steps_BT.shape:
            raise ValueError(
                f"hubert: hidden[{v!r}] is {tuple(h_BTD.shape)} but {key} is "
                f"{tuple(masked_BT.shape)}"
            )
        labels_BT = self.targets(batch, steps_BT)
        terms: dict[str, torch.Tensor] = {}
        parts = [("masked", masked_BT, self.cfg.pred_masked_weight, "loss")]
        if self.cfg.pred_nomask_weight > 0:
            parts.append(("unmasked", steps_BT & ~masked_BT, self.cfg.pred_nomask_weight,
                          "unmasked_loss"))  # fmt: skip
        for name, sel_BT, weight, loss_key in parts:
            logits_MK = self.logits(h_BTD[sel_BT])
            target_M = labels_BT[sel_BT]
            n = target_M.numel()  # sum / count: nothing selected gives 0, not NaN
            loss = F.cross_entropy(logits_MK, target_M, reduction="sum") / max(n, 1)
            terms[loss_key] = weight * loss
            hits = (logits_MK.argmax(-1) == target_M).float().sum()
            terms[f"acc_{name}"] = (hits / max(n, 1)).detach()
        return terms
