"""Masked frame modelling with a contrastive target (CBT's NCE over frame features).

Data side (:class:`MaskFrames`): selects ``mask_prob`` of each clip's real steps
(``<prefix>features_mask``), at least one per clip of two or more steps (a 1-step clip has
no context to predict it from and is left whole); writes ``<prefix>features_masked [B,T]``,
where the features encoder puts its learned [MASK] embedding. The original ``features``
stay in the batch: they are the targets.

Loss side: the fused hidden state at each masked step, through a prediction head, must pick
its own step's feature, through a target head applied to the *original* features, among the
features of every real step of the batch (the other steps of its clip and all steps of the
other clips, masked or not: CBT's negatives). Both sides are L2-normalised and compared at
a fixed ``temperature``; loss = cross-entropy, metric ``acc`` = the own step scores highest.
With ITM negatives in the batch only positive pairs' masked steps are predicted.

Targets: the encoder's own ``ModalityTokens.targets`` [B,T,F] (its per-step features before
the [MASK] replacement) when it gives them, else the batch's ``<prefix>features``. ``plugin``
names the keys of the view: ``features`` (default; ``features_mask`` → ``features_masked``,
exactly as before) or ``audio`` (SpeechBERT-style masked audio frames over an
``audio_spectrogram`` view: ``audio_steps_mask`` → ``audio_masked``; targets from the
encoder, whose ``target_dim`` gives F). ``mask_length`` > 1 masks spans of that many steps
instead (:func:`~mmptm.objectives.masking.select_spans`; ``mask_prob`` is then the
probability of a step to start a span, at least one span per clip of two or more steps).

The frames encoder (``video_frames``) is not supported as a view: its per-frame target would
be the backbone's feature of the unmasked frame, which the batch does not hold; use
pre-extracted features (``video_features``), as CBT does (S3D features).

Legend: B batch, T steps, F feature dim, D width, E embedding dim, M masked steps, N real
steps of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import VocabInfo, init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import view_prefix
from mmptm.objectives.base import Objective, encoder_target_dim
from mmptm.objectives.masking import audio_encoder, select_positions, select_spans
from mmptm.registry import OBJECTIVES

#: per ``plugin``: the view's modality, its real-steps key and the masked-steps key written
KEYS = {
    "features": ("features", "features_mask", "features_masked"),
    "audio": ("audio", "audio_steps_mask", "audio_masked"),
}


@dataclass(frozen=True)
class MaskFrames:
    """Masked-frame data side over one view; writes ``features_masked`` (``audio_masked``)."""

    data_priority: ClassVar[int] = 20

    prefix: str
    mask_prob: float
    plugin: str = "features"
    mask_length: int = 1

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        p = self.prefix
        _, real_key, masked_key = KEYS[self.plugin]
        if self.plugin == "features":
            if f"{p}features" not in batch:  # another source of a mixture: nothing to mask
                return batch
            B, T = batch[f"{p}features"].shape[:2]
            real_BT = batch.get(f"{p}{real_key}")
            real_BT = torch.ones(B, T, dtype=torch.bool) if real_BT is None else real_BT.bool()
        elif f"{p}{real_key}" not in batch:
            return batch
        else:
            real_BT = batch[f"{p}{real_key}"].bool()
        several_B1 = real_BT.sum(dim=1, keepdim=True) >= 2
        if self.mask_length > 1:
            masked_BT = select_spans(real_BT & several_B1, self.mask_prob, self.mask_length, 1, g)
        else:
            masked_BT = select_positions(real_BT & several_B1, self.mask_prob, g, at_least_one=True)
        batch[f"{p}{masked_key}"] = masked_BT
        return batch


def frame_nce(
    pred_ME: torch.Tensor, target_NE: torch.Tensor, own_M: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, accuracy): each prediction must pick row ``own_M`` of the targets.

    Both sides are L2-normalised; logits = cosine / temperature. M = 0 gives loss 0.
    """
    logits_MN = F.normalize(pred_ME, dim=-1) @ F.normalize(target_NE, dim=-1).T / temperature
    n = own_M.numel()
    loss = F.cross_entropy(logits_MN, own_M, reduction="sum") / max(n, 1)
    acc = (logits_MN.argmax(-1) == own_M).float().sum() / max(n, 1)
    return loss, acc.detach()


@OBJECTIVES.register("masked_frames")
class MaskedFrames(Objective):
    """CBT's masked frame NCE on a ``video_features`` view (or an audio view's frames)."""

    @dataclass
    class Config:
        type: str = "masked_frames"
        weight: float = 1.0
        #: the features encoder (view, and hidden-state stream) this objective reads
        modality: str = "features"
        mask_prob: float = 0.15
        #: width of the compared embeddings (0 = the fusion width)
        embed_dim: int = 0
        temperature: float = 0.1
        layer_norm_eps: float = 1e-12
        #: the view's keys: features (features_mask → features_masked) | audio
        #: (audio_steps_mask → audio_masked)
        plugin: str = "features"
        #: > 1: mask spans of this many steps (mask_prob = probability to start one)
        mask_length: int = 1
        #: width F of the encoder's targets (0 = its target_dim, or feature_dim)
        target_dim: int = 0

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> MaskFrames:
        if not 0.0 < cfg.mask_prob < 1.0:
            raise ValueError(f"masked_frames.mask_prob must be in (0, 1), got {cfg.mask_prob}")
        if cfg.plugin not in KEYS or cfg.mask_length < 1:
            raise ValueError(
                f"masked_frames: plugin must be one of {sorted(KEYS)} and mask_length >= 1, got "
                f"{cfg.plugin!r}, {cfg.mask_length}"
            )
        return MaskFrames(
            prefix=view_prefix(KEYS[cfg.plugin][0], cfg.modality),
            mask_prob=cfg.mask_prob,
            plugin=cfg.plugin,
            mask_length=cfg.mask_length,
        )

    def __init__(self, cfg: Config, *, width: int, encoders: nn.ModuleDict, **_: object) -> None:
        super().__init__()
        if cfg.temperature <= 0:
            raise ValueError(f"masked_frames.temperature must be > 0, got {cfg.temperature}")
        if cfg.plugin not in KEYS:
            raise ValueError(f"masked_frames.plugin must be in {sorted(KEYS)}, got {cfg.plugin!r}")
        enc = encoders[cfg.modality] if cfg.modality in encoders else None  # noqa: SIM401
        modality = KEYS[cfg.plugin][0]
        where = f"masked_frames.modality={cfg.modality!r}"
        if cfg.plugin == "audio":
            enc = audio_encoder(encoders, cfg.modality, "masked_frames.modality")
            feature_dim = encoder_target_dim(enc, cfg.target_dim, where)
        else:
            feature_dim = int(cfg.target_dim or getattr(enc, "target_dim", 0)
                              or getattr(enc, "feature_dim", 0))  # fmt: skip
            if enc is None or enc.modality != "features" or feature_dim < 1:
                raise ValueError(
                    f"{where} is not a video_features encoder of this model (frames encoders "
                    "are not supported: see the module docstring)"
                )
        self.cfg = cfg
        dim = cfg.embed_dim or width
        self.predict = nn.Sequential(
            nn.Linear(width, width),
            nn.GELU(),
            nn.LayerNorm(width, eps=cfg.layer_norm_eps),
            nn.Linear(width, dim),
        )
        self.target = nn.Linear(feature_dim, dim)
        self.prefix = view_prefix(modality, cfg.modality)
        init_weights(self)

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        p, v = self.prefix, self.cfg.modality
        _, real_key, masked_key = KEYS[self.cfg.plugin]
        if f"{p}{masked_key}" not in batch or v not in out.hidden:
            return {}  # a batch without this view (another source of a mixture)
        given = out.encoded[v].targets if v in out.encoded else None
        if given is None and self.cfg.plugin != "features":
            raise ValueError(f"masked_frames: encoder {v!r} gives no ModalityTokens.targets")
        feats_BTF = batch[f"{p}features"] if given is None else given
        B, T = feats_BTF.shape[:2]
        real_BT = batch.get(f"{p}{real_key}")
        if real_BT is None and v in out.encoded:
            real_BT = out.encoded[v].mask
        if real_BT is None:
            real_BT = torch.ones(B, T, dtype=torch.bool, device=feats_BTF.device)
        real_BT = real_BT.bool()
        masked_BT = batch[f"{p}{masked_key}"].bool() & real_BT
        if "itm_labels" in batch:
            masked_BT = masked_BT & (batch["itm_labels"] != 0).unsqueeze(1)
        h_BTD = out.hidden[v]
        if h_BTD.shape[:2] != (B, T):
            source = f"{p}features" if given is None else f"encoded[{v!r}].targets"
            raise ValueError(
                f"masked_frames: hidden[{v!r}] is {tuple(h_BTD.shape)} but {source} is "
                f"{tuple(feats_BTF.shape)}"
            )
        # Row of each real step among the real steps of the batch, in [B,T] order.
        row_BT = torch.cumsum(real_BT.flatten(), 0).view(B, T) - 1
        target_NE = self.target(feats_BTF[real_BT].float()).float()
        pred_ME = self.predict(h_BTD[masked_BT]).float()
        loss, acc = frame_nce(pred_ME, target_NE, row_BT[masked_BT], self.cfg.temperature)
        return {"loss": loss, "acc": acc}
