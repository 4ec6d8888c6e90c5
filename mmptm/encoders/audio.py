"""Audio as tokens: the raw waveform (wav2vec 2.0 / HuBERT layout) or a spectrogram.

``audio_waveform`` reads ``audio [B,S]`` (16 kHz samples, 0 on padding) and
``audio_mask [B,S]`` (True = real sample, right-padded) and is wav2vec 2.0's model::

    audio [B,S] ─► conv feature encoder: 7 × (Conv1d, norm, GELU), kernels 10,3,3,3,3,2,2,
                   strides 5,2,2,2,2,2,2 (400-sample receptive field, 320-sample hop = 20 ms)
                ─► [B,T,C] ─► LayerNorm = ``targets`` ─► Linear C→D ─► [MASK] at ``audio_masked``
                ─► + convolutional relative positions (grouped Conv1d, kernel 128, weight norm,
                   GELU) ─► Transformer: post-LN (LayerNorm first; wav2vec2-base, HuBERT-base)
                   or pre-LN (closing LayerNorm; the "stable layer norm" large models)

``feature_norm: group`` is the base models' GroupNorm (one group per channel: each channel
normalised over time) on the first conv only; ``layer`` is a LayerNorm over channels after
every conv. Parameter for parameter it is HF ``Wav2Vec2Model`` / ``HubertModel`` (see
``mmptm.models.hf_audio_import``, which imports them with exact parity on unpadded input).

Padding. A step is real when its whole receptive field lies in real samples: per sample
``conv_steps(length, conv_layout)`` (the torch twin :func:`conv_lengths`), the count the
audio plug-in writes as ``audio_steps_mask``. The real steps of a padded sample equal those
of the sample run alone: a real step's receptive field holds no padding; padded steps are
zeroed before the position convolution, whose own zero padding they then imitate; attention
masks them as keys. GroupNorm statistics span time, so with padding mmptm takes them over
the real steps only. HF normalises over the padding too (its base models are documented to
be run on zero-padded input without ``attention_mask``), so on padded input mmptm and HF
differ for ``feature_norm: group``; on unpadded input they agree.

``audio_spectrogram`` reads ``audio [B,T,M]`` (log-mel or Kaldi fbank frames from the
plug-in) and ``audio_mask [B,T]``:

- ``tokens: frame``: ``stack`` consecutive frames concatenated (steps ``[[stack, stack]]``)
  → ``LN(W x)``; ``targets`` are the stacked raw frames [B,T',stack·M] (masked-frame
  prediction);
- ``tokens: patch``: AST's patches over time × frequency (Conv2d, ``patch_size`` square,
  ``patch_stride`` apart) → LN, plus a learned frequency position; tokens are time-major
  (N = T'·F'), ``targets`` are each patch's raw values [B,N,p·p];
- ``backbone: <timm name>``: a timm model on the one-channel spectrogram as an image (time
  down, frequency across): ``tokens: pool`` (one pooled vector) or ``patch`` (its feature
  map or patch tokens). The backbone sees padding frames as part of the image.

Frame and patch modes then run :class:`~mmptm.encoders.temporal.TemporalStage` per time step:
[MASK] at ``audio_masked`` (a masked step masks every frequency patch of it) and the
zero-initialised time positions; optional own Transformer ``layers`` follow over all tokens.

Legend: B batch, S samples, C conv channels, T' (T) encoder steps, M mel bins, F' frequency
patches, P tokens per step, N tokens, D width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.encoders.backbone import create_backbone
from mmptm.encoders.base import Encoder, ModalityTokens, init_weights
from mmptm.encoders.temporal import TemporalStage, frame_mask, no_empty_rows
from mmptm.layers import TransformerConfig, TransformerStack
from mmptm.modalities.base import Need
from mmptm.registry import ENCODERS

#: wav2vec 2.0's feature encoder as [kernel, stride] per conv layer
WAV2VEC2_LAYOUT = ((10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2))
#: eps of the conv stack's GroupNorm / LayerNorms (torch's default, as in wav2vec 2.0)
CONV_NORM_EPS = 1e-5


def conv_lengths(lengths: torch.Tensor, layout: Sequence[Sequence[int]]) -> torch.Tensor:
    """:func:`mmptm.modalities.audio_io.conv_steps` on a tensor of lengths (no host sync)."""
    for kernel, stride in layout:
        lengths = torch.where(
            lengths < kernel, 0, torch.div(lengths - kernel, stride, rounding_mode="floor") + 1
        )
    return lengths


def steps_mask(lengths_B: torch.Tensor, steps: int) -> torch.Tensor:
    """bool [B,steps]: the first ``lengths_B[b]`` steps of row b are real."""
    return torch.arange(steps, device=lengths_B.device) < lengths_B[:, None]


def receptive_field(layout: Sequence[Sequence[int]]) -> int:
    """The fewest inputs that give one output of the conv stack."""
    n = 1
    for kernel, stride in reversed(layout):
        n = (n - 1) * stride + kernel
    return n


def _masked_group_norm(x_BCT: torch.Tensor, real_BT: torch.Tensor, norm: nn.GroupNorm):
    """GroupNorm with one group per channel, statistics over the real steps only."""
    m_B1T = real_BT[:, None, :].float()
    x = x_BCT.float()
    n_B11 = m_B1T.sum(-1, keepdim=True).clamp(min=1)
    mean = (x * m_B1T).sum(-1, keepdim=True) / n_B11
    var = (((x - mean) * m_B1T) ** 2).sum(-1, keepdim=True) / n_B11
    y = (x - mean) * torch.rsqrt(var + norm.eps)
    return (y * norm.weight[:, None] + norm.bias[:, None]).to(x_BCT.dtype)


class ConvLayer(nn.Module):
    """Conv1d → (GroupNorm | LayerNorm over channels | nothing) → GELU."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, bias: bool, norm: str):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, bias=bias)
        self.norm: nn.Module | None = None
        if norm == "group":
            self.norm = nn.GroupNorm(c_out, c_out, eps=CONV_NORM_EPS)
        elif norm == "layer":
            self.norm = nn.LayerNorm(c_out, eps=CONV_NORM_EPS)

    def forward(self, x_BCT: torch.Tensor, real_BT: torch.Tensor | None) -> torch.Tensor:
        """``real_BT``: this layer's real output steps, None when every step is real."""
        x_BCT = self.conv(x_BCT)
        if isinstance(self.norm, nn.GroupNorm):
            if real_BT is None:
                x_BCT = self.norm(x_BCT)
            else:
                x_BCT = _masked_group_norm(x_BCT, real_BT, self.norm)
        elif self.norm is not None:
            x_BCT = self.norm(x_BCT.transpose(1, 2)).transpose(1, 2)
        return F.gelu(x_BCT)


class ConvFeatureEncoder(nn.Module):
    """wav2vec 2.0's conv stack: waveform [B,S] → features [B,C,T']."""

    def __init__(self, dim: int, layout: Sequence[Sequence[int]], bias: bool, norm: str):
        super().__init__()
        self.layout = [tuple(ks) for ks in layout]
        # group: a GroupNorm on the first conv only; layer: a LayerNorm after every conv
        norms = [norm if norm == "layer" or i == 0 else "none" for i in range(len(self.layout))]
        self.layers = nn.ModuleList(
            ConvLayer(1 if i == 0 else dim, dim, k, s, bias, n)
            for i, ((k, s), n) in enumerate(zip(self.layout, norms))
        )
        for layer in self.layers:  # fairseq's initialisation of the feature encoder
            nn.init.kaiming_normal_(layer.conv.weight)

    def forward(self, wave_BS: torch.Tensor, lengths_B: torch.Tensor | None) -> torch.Tensor:
        """``lengths_B``: real samples per row, None when no row is padded."""
        x_BCT = wave_BS[:, None, :]
        for (kernel, stride), layer in zip(self.layout, self.layers):
            real_BT = None
            if lengths_B is not None:
                lengths_B = conv_lengths(lengths_B, [(kernel, stride)])
                if isinstance(layer.norm, nn.GroupNorm):
                    T = (x_BCT.shape[-1] - kernel) // stride + 1
                    real_BT = steps_mask(lengths_B, T)
            x_BCT = layer(x_BCT, real_BT)
        return x_BCT


class PositionConv(nn.Module):
    """wav2vec 2.0's relative positions: grouped Conv1d over time (weight norm over the
    kernel axis, dim=2, as fairseq/HF), the last output dropped for an even kernel, GELU."""

    def __init__(self, width: int, kernel: int, groups: int) -> None:
        super().__init__()
        conv = nn.Conv1d(width, width, kernel, padding=kernel // 2, groups=groups)
        nn.init.normal_(conv.weight, std=math.sqrt(4.0 / (kernel * width)))
        nn.init.zeros_(conv.bias)
        self.conv = nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)
        self.trim = 1 if kernel % 2 == 0 else 0

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        y_BDT = self.conv(x_BTD.transpose(1, 2))
        if self.trim:
            y_BDT = y_BDT[:, :, : -self.trim]
        return F.gelu(y_BDT).transpose(1, 2)


@ENCODERS.register("audio_waveform")
class AudioWaveformEncoder(Encoder):
    """wav2vec 2.0 / HuBERT: conv features + conv positions + Transformer; reads ``audio [B,S]``."""

    modality = "audio"
    main_key = "audio"

    @dataclass
    class Config:
        type: str = "audio_waveform"
        sample_rate: int = 16000
        #: per-utterance zero mean / unit variance of the waveform (the plug-in does it;
        #: HF's ``do_normalize``)
        normalize: bool = True
        #: C, channels of every conv layer
        conv_dim: int = 512
        #: [kernel, stride] per conv layer (wav2vec 2.0's 7 layers)
        conv_layout: list[list[int]] = field(
            default_factory=lambda: [list(ks) for ks in WAV2VEC2_LAYOUT]
        )
        conv_bias: bool = False
        #: group: GroupNorm on the first conv (base models); layer: LayerNorm after every conv
        feature_norm: Literal["group", "layer"] = "group"
        #: the LayerNorm on the conv features before the projection (HF HuBERT's
        #: ``feat_proj_layer_norm``); without it ``targets`` are the raw conv features
        projection_norm: bool = True
        layers: int = 12
        heads: int = 12
        mlp_ratio: float = 4.0
        #: false: post-LN (wav2vec2-base, HuBERT-base); true: pre-LN + closing LayerNorm
        prenorm: bool = False
        layer_norm_eps: float = 1e-5
        pos_conv_kernel: int = 128
        pos_conv_groups: int = 16
        #: dropout in the Transformer and after the position embedding
        dropout: float = 0.1
        attn_dropout: float = 0.1
        #: dropout on the projected conv features (HF ``feat_proj_dropout``)
        feature_dropout: float = 0.0
        #: probability of skipping each Transformer layer in training (LayerDrop); needs
        #: ``train.find_unused_parameters`` under DDP
        layer_drop: float = 0.0
        #: a learned [MASK] embedding for the steps an objective marks in ``audio_masked``
        mask_embedding: bool = True

    def __init__(self, cfg: Config, *, width: int, name: str = "audio", **_: object) -> None:
        super().__init__(width, name)
        self.cfg = cfg
        layout = cfg.conv_layout
        if not layout or any(len(ks) != 2 or min(ks) < 1 for ks in layout):
            raise ValueError(
                f"encoder {name!r}: conv_layout must be [[kernel, stride], ...] of positive "
                f"ints, got {layout}"
            )
        if cfg.conv_dim < 1:
            raise ValueError(f"encoder {name!r}: conv_dim must be >= 1, got {cfg.conv_dim}")
        if cfg.pos_conv_kernel < 1 or width % cfg.pos_conv_groups:
            raise ValueError(
                f"encoder {name!r}: pos_conv_kernel {cfg.pos_conv_kernel} must be >= 1 and "
                f"width {width} divisible by pos_conv_groups {cfg.pos_conv_groups}"
            )
        if not 0.0 <= cfg.layer_drop < 1.0:
            raise ValueError(
                f"encoder {name!r}: layer_drop must be in [0, 1), got {cfg.layer_drop}"
            )
        self.layout = [(int(k), int(s)) for k, s in layout]
        self.min_samples = receptive_field(self.layout)
        self.conv = ConvFeatureEncoder(cfg.conv_dim, self.layout, cfg.conv_bias, cfg.feature_norm)
        eps = cfg.layer_norm_eps
        self.conv_norm = nn.LayerNorm(cfg.conv_dim, eps=eps) if cfg.projection_norm else None
        self.proj = nn.Linear(cfg.conv_dim, width)
        self.feature_drop = nn.Dropout(cfg.feature_dropout)
        self.mask_embedding: nn.Parameter | None = None
        if cfg.mask_embedding:  # fairseq / HF draw it uniformly from [0, 1)
            self.mask_embedding = nn.Parameter(torch.empty(width).uniform_())
        self.pos_conv = PositionConv(width, cfg.pos_conv_kernel, cfg.pos_conv_groups)
        self.pos_norm = None if cfg.prenorm else nn.LayerNorm(width, eps=eps)
        self.drop = nn.Dropout(cfg.dropout)
        tcfg = TransformerConfig(
            layers=cfg.layers, heads=cfg.heads, mlp_ratio=cfg.mlp_ratio, dropout=cfg.dropout,
            attn_dropout=cfg.attn_dropout, prenorm=cfg.prenorm, layer_norm_eps=eps,
        )  # fmt: skip
        self.stack = TransformerStack(width, tcfg)
        for module in (self.conv_norm, self.proj, self.pos_norm, self.stack):
            if module is not None:
                init_weights(module)

    def data_needs(self) -> dict[str, Need]:
        facts = {
            "sample_rate": self.cfg.sample_rate,
            "features": "waveform",
            "steps": [list(ks) for ks in self.layout],
            "normalize": self.cfg.normalize,
        }
        return {self.view: Need(self.modality, facts)}

    @property
    def target_dim(self) -> int:
        """F of ``targets`` [B,T',F]: the conv features' channels."""
        return self.cfg.conv_dim

    def forward(self, batch: dict) -> ModalityTokens:
        return self.encode(batch)

    def layer_features(self, batch: dict, layer: int) -> torch.Tensor:
        """[B,T',D]: the states after Transformer layer ``layer`` (HuBERT's teacher features)."""
        return self.encode(batch, layer).tokens

    def encode(self, batch: dict, layer: int | None = None) -> ModalityTokens:
        """The tokens after ``layer`` Transformer layers (all when None: ``forward``).

        ``layer = 0`` is the Transformer's input; an intermediate layer's states are HF's
        ``hidden_states[layer]`` (un-normalised in the pre-LN layout), the HuBERT featurizer
        of a second iteration. The type embedding is added only to the full output.
        """
        n_layers = len(self.stack.blocks)
        if layer is not None and not 0 <= layer <= n_layers:
            raise ValueError(f"encoder {self.view!r} has {n_layers} layers; asked for {layer}")
        x_BTD, real_BT, targets_BTC = self._features(batch)
        x_BTD = self._contextualise(x_BTD, real_BT, n_layers if layer is None else layer)
        if layer is None:
            x_BTD = self.add_type(x_BTD)
        return ModalityTokens(x_BTD, real_BT, targets_BTC)

    def _features(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projected features with [MASK] in place [B,T',D], real steps [B,T'], targets."""
        wave_BS = batch[self.input_key]
        if wave_BS.ndim != 2:
            raise ValueError(
                f"{self.input_key} must be a waveform [B,S] for encoder {self.view!r}, got "
                f"{tuple(wave_BS.shape)} (a spectrogram needs audio_spectrogram)"
            )
        B, S = wave_BS.shape
        if S < self.min_samples:
            raise ValueError(
                f"{self.input_key} has {S} samples; encoder {self.view!r} needs at least "
                f"{self.min_samples} (its receptive field) for one step"
            )
        real_BS = frame_mask(batch, f"{self.input_key}_mask", (B, S), wave_BS.device)
        padded = not bool(real_BS.all())
        lengths_B = real_BS.sum(1) if padded else None
        wave_BS = wave_BS.to(self.proj.weight.dtype)
        f_BTC = self.conv(wave_BS, lengths_B).transpose(1, 2)
        T = f_BTC.shape[1]
        if lengths_B is None:
            real_BT = torch.ones(B, T, dtype=torch.bool, device=wave_BS.device)
        else:
            real_BT = steps_mask(conv_lengths(lengths_B, self.layout), T)
        targets_BTC = f_BTC if self.conv_norm is None else self.conv_norm(f_BTC)
        x_BTD = self.feature_drop(self.proj(targets_BTC))
        masked_BT = batch.get(f"{self.prefix}audio_masked")
        if masked_BT is not None:
            if self.mask_embedding is None:
                raise ValueError(
                    f"the batch masks steps ({self.prefix}audio_masked) but encoder "
                    f"{self.view!r} has no [MASK] embedding: set mask_embedding: true"
                )
            if masked_BT.shape != (B, T):
                raise ValueError(
                    f"{self.prefix}audio_masked is {tuple(masked_BT.shape)} but encoder "
                    f"{self.view!r} gives {(B, T)} steps (conv_layout {self.layout})"
                )
            replace_BT1 = (masked_BT.bool() & real_BT)[:, :, None]
            x_BTD = torch.where(replace_BT1, self.mask_embedding.to(x_BTD.dtype), x_BTD)
        return x_BTD, real_BT, targets_BTC

    def _contextualise(self, x_BTD: torch.Tensor, real_BT: torch.Tensor, upto: int):
        padded = not bool(real_BT.all())
        if padded:  # as the position conv's own zero padding beyond the last real step
            x_BTD = x_BTD.masked_fill(~real_BT[:, :, None], 0.0)
        x_BTD = x_BTD + self.pos_conv(x_BTD)
        if self.pos_norm is not None:
            x_BTD = self.pos_norm(x_BTD)
        x_BTD = self.drop(x_BTD)
        keys_BT = no_empty_rows(real_BT) if padded else None  # None: SDPA's fastest kernels
        for block in self.stack.blocks[:upto]:
            if (
                self.training
                and self.cfg.layer_drop
                and float(torch.rand(())) < self.cfg.layer_drop
            ):
                continue
            x_BTD = block(x_BTD, keys_BT)
        if upto == len(self.stack.blocks):
            x_BTD = self.stack.norm(x_BTD)
        return x_BTD


@ENCODERS.register("audio_spectrogram")
class AudioSpectrogramEncoder(Encoder):
    """Stacked frames, AST patches or a timm backbone over ``audio [B,T,M]`` (log-mel/fbank)."""

    modality = "audio"
    main_key = "audio"

    @dataclass
    class Config:
        type: str = "audio_spectrogram"
        #: the plug-in's features: Kaldi fbank or torchaudio log-mel
        features: Literal["fbank", "logmel"] = "fbank"
        n_mels: int = 80
        sample_rate: int = 16000
        #: frame: stacked frames; patch: AST patches (or a backbone's patch tokens);
        #: pool: one pooled backbone vector
        tokens: Literal["frame", "patch", "pool"] = "frame"
        #: frames concatenated into one step (tokens: frame)
        stack: int = 4
        #: side of the square time × frequency patches (tokens: patch)
        patch_size: int = 16
        #: distance between patches in time and frequency (0 = patch_size: no overlap)
        patch_stride: int = 0
        #: a timm model run on the spectrogram as a one-channel image (tokens: pool | patch)
        backbone: str = ""
        #: passed to timm.create_model, e.g. {img_size: [128, 80], patch_size: 16}
        model_kwargs: dict[str, Any] = field(default_factory=dict)
        #: local weights file for the backbone (never downloaded)
        weights: str | None = None
        freeze_backbone: bool = False
        #: rows of the time position table (the most steps this encoder accepts)
        max_steps: int = 1024
        #: multiplier of the (zero-initialised) time position table: its effective
        #: learning rate, against tokens that are layer-normed to about 1 per channel
        pos_scale: float = 16.0
        #: own Transformer layers over all tokens (0 = none: tokens meet in the fusion)
        layers: int = 0
        heads: int = 4
        dropout: float = 0.1
        #: a learned [MASK] embedding for the steps an objective marks in ``audio_masked``
        mask_embedding: bool = True

    def __init__(self, cfg: Config, *, width: int, name: str = "audio", **_: object) -> None:
        super().__init__(width, name)
        self.cfg = cfg
        where = f"encoder {name!r}"
        if cfg.n_mels < 1:
            raise ValueError(f"{where}: n_mels must be >= 1, got {cfg.n_mels}")
        if cfg.backbone and cfg.tokens == "frame":
            raise ValueError(f"{where}: a backbone gives tokens: pool or patch, not frame")
        if not cfg.backbone and cfg.tokens == "pool":
            raise ValueError(f"{where}: tokens: pool needs a backbone")
        self.layout: list[tuple[int, int]] = []
        self.backbone: nn.Module | None = None
        self.patch: nn.Conv2d | None = None
        self.freq_pos: nn.Parameter | None = None
        self.temporal: TemporalStage | None = None
        if cfg.backbone:
            self.backbone = create_backbone(
                cfg.backbone, cfg.model_kwargs, weights=cfg.weights, freeze=cfg.freeze_backbone,
                in_chans=1, num_classes=0,
            )  # fmt: skip
            channels = int(self.backbone.num_features)
        elif cfg.tokens == "frame":
            if cfg.stack < 1:
                raise ValueError(f"{where}: stack must be >= 1, got {cfg.stack}")
            self.layout = [(cfg.stack, cfg.stack)]
            channels = cfg.stack * cfg.n_mels
        else:
            p, s = cfg.patch_size, cfg.patch_stride or cfg.patch_size
            if p < 1 or s < 1 or p > cfg.n_mels:
                raise ValueError(
                    f"{where}: patch_size {p} and patch_stride {s} must be >= 1 and the patch "
                    f"fit n_mels={cfg.n_mels}"
                )
            self.layout = [(p, s)]
            self.patch = nn.Conv2d(1, width, p, s)
            n_freq = (cfg.n_mels - p) // s + 1
            self.freq_pos = nn.Parameter(torch.empty(n_freq, width).normal_(std=0.02))
            channels = width
        self.proj = nn.Linear(channels, width) if self.patch is None else nn.Identity()
        self.norm = nn.LayerNorm(width)
        self.drop = nn.Dropout(cfg.dropout)
        init_weights(self.proj)
        if self.backbone is None:
            self.temporal = TemporalStage(
                width, max_frames=cfg.max_steps, layers=0, heads=cfg.heads, dropout=cfg.dropout,
                mask_embedding=cfg.mask_embedding, masked_key=f"{self.prefix}audio_masked",
                pos_scale=cfg.pos_scale,
            )  # fmt: skip
        self.stack: TransformerStack | None = None
        if cfg.layers > 0:
            tcfg = TransformerConfig(
                layers=cfg.layers, heads=cfg.heads, dropout=cfg.dropout, attn_dropout=cfg.dropout
            )
            self.stack = TransformerStack(width, tcfg)
            init_weights(self.stack)

    @property
    def target_dim(self) -> int:
        """F of ``targets`` [B,N,F]: stack·M (frame), p·p (patch); 0 with a backbone (none)."""
        if self.backbone is not None:
            return 0
        kernel = self.layout[0][0]
        return kernel * self.cfg.n_mels if self.patch is None else kernel * kernel

    def data_needs(self) -> dict[str, Need]:
        facts: dict[str, Any] = {
            "sample_rate": self.cfg.sample_rate,
            "features": self.cfg.features,
            "n_mels": self.cfg.n_mels,
        }
        if self.layout:
            facts["steps"] = [list(ks) for ks in self.layout]
        return {self.view: Need(self.modality, facts)}

    def forward(self, batch: dict) -> ModalityTokens:
        spec_BTM = batch[self.input_key]
        M = self.cfg.n_mels
        if spec_BTM.ndim != 3 or spec_BTM.shape[-1] != M:
            raise ValueError(
                f"{self.input_key} must be a spectrogram [B,T,{M}] (encoder {self.view!r} "
                f"n_mels), got {tuple(spec_BTM.shape)}"
            )
        B, T = spec_BTM.shape[:2]
        real_BT = frame_mask(batch, f"{self.input_key}_mask", (B, T), spec_BTM.device)
        spec_BTM = spec_BTM.to(self.norm.weight.dtype)
        masked_BT = batch.get(f"{self.prefix}audio_masked")
        if self.backbone is not None:
            if masked_BT is not None:
                raise ValueError(
                    f"the batch masks steps ({self.prefix}audio_masked) but encoder "
                    f"{self.view!r} runs a backbone, which has no [MASK] steps"
                )
            x_BND = self.drop(self.norm(self.proj(self._backbone(spec_BTM))))
            mask_BN = torch.ones(x_BND.shape[:2], dtype=torch.bool, device=x_BND.device)
            return ModalityTokens(self.add_type(x_BND), mask_BN)
        kernel, stride = self.layout[0]
        if T < kernel:
            raise ValueError(
                f"{self.input_key} has {T} frames; encoder {self.view!r} needs at least {kernel}"
            )
        T2 = (T - kernel) // stride + 1
        if T2 > self.cfg.max_steps:
            raise ValueError(
                f"{self.input_key} gives {T2} steps; encoder {self.view!r} has max_steps="
                f"{self.cfg.max_steps} (raise it, or lower the plug-in's max_seconds)"
            )
        steps_BT = steps_mask(conv_lengths(real_BT.sum(1), self.layout), T2)
        if self.patch is None:  # frames: [B,T,M] -> [B,T',stack·M], step t = frames t·s..t·s+s-1
            targets_BNF = spec_BTM[:, : T2 * kernel].reshape(B, T2, kernel * M)
            x_BTPD = self.norm(self.proj(targets_BNF))[:, :, None]
        else:  # patches: [B,1,T,M] -> [B,D,T',F'] -> [B,T',F',D]
            x_BTPD = self.norm(self.patch(spec_BTM[:, None]).permute(0, 2, 3, 1))
            patches = spec_BTM.unfold(1, kernel, stride).unfold(2, kernel, stride)
            targets_BNF = patches.reshape(B, -1, kernel * kernel)  # [B,T',F',p,p] time-major
        x_BTPD = self.temporal(x_BTPD, steps_BT, masked_BT)
        if self.freq_pos is not None:
            x_BTPD = x_BTPD + self.freq_pos
        T2, P = x_BTPD.shape[1:3]
        x_BND = self.drop(x_BTPD.reshape(B, T2 * P, self.width))  # time-major
        mask_BN = steps_BT.repeat_interleave(P, dim=1)
        if self.stack is not None:
            x_BND = self.stack(x_BND, no_empty_rows(mask_BN))
        return ModalityTokens(self.add_type(x_BND), mask_BN, targets_BNF)

    def _backbone(self, spec_BTM: torch.Tensor) -> torch.Tensor:
        """The backbone on [B,1,T,M]: [B,1,C] pooled or [B,N,C] patch tokens."""
        image_B1TM = spec_BTM[:, None]
        if self.cfg.tokens == "pool":
            return self.backbone(image_B1TM).unsqueeze(1)  # num_classes=0: pooled features
        f = self.backbone.forward_features(image_B1TM)
        if f.ndim == 4:  # CNN map [B,C,h,w] -> [B,h·w,C], time-major
            return f.flatten(2).transpose(1, 2)
        if f.ndim == 3:  # ViT-style [B,N,C]
            return f
        raise ValueError(f"{self.cfg.backbone}: unsupported feature shape {tuple(f.shape)}")
