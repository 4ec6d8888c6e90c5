"""The frame features whose k-means ids are HuBERT's targets, written once and used twice: by
the ``hubert`` objective (on the device, from the batch waveform) and by ``mmptm units fit
--audio-features`` (from audio shards, to fit the codebook).

Both featurizers give one vector per encoder step of the wav2vec 2.0 layout (receptive field
400 samples, stride 320 at 16 kHz): frame i covers samples [320 i, 320 i + 400), so an
utterance of S samples has ``conv_steps(S, WAV2VEC2_STEPS)`` = ⌊(S − 400) / 320⌋ + 1 frames.

- :class:`MfccFeaturizer` (HuBERT iteration 1): 13 MFCCs + deltas + delta-deltas = 39-d, as
  fairseq's HuBERT ``dump_mfcc_feature`` (``torchaudio.compliance.kaldi.mfcc`` with
  ``use_energy=False``, 25 ms windows every 10 ms, 23 mel bins; ``compute_deltas`` over 5
  frames at 100 Hz), then every other frame: 100 Hz frame 2i is the 50 Hz step i's window,
  and there are exactly ⌈n₁₀₀ / 2⌉ = conv_steps of them (fairseq's HuBERT reads its 100 Hz
  labels at the same frames). Kaldi's MFCC rather than ``torchaudio.transforms.MFCC``: it is
  the reference featurizer of HuBERT's published codebooks, and it runs per utterance, so
  padding never reaches the deltas at an utterance's end and the objective sees the very
  features ``units fit`` clustered. Each utterance is first normalised to zero mean and unit
  variance, so the features do not depend on whether the audio plug-in normalised the
  waveform (normalising twice = once) nor on the recording level.
- :class:`TeacherFeaturizer` (iteration 2): a frozen earlier run's audio encoder, its hidden
  states after Transformer layer L (``encoder.layer_features(batch, L)`` [B,T,D], the
  interface the audio encoders provide). The encoder comes built and loaded
  (:func:`mmptm.models.resources.load_encoder`, under the student's view name): objectives
  read no checkpoints. It reads the batch's keys of the student's view (the waveform the
  plug-in made with the facts the teacher also declares), never its [MASK] steps, in float32
  without autocast.

:func:`mmptm.train.units.audio_sample_featurizer` wraps either for ``units fit``: decode the
sample's audio member, resample to 16 kHz and featurize.
Legend: B batch, S samples, T steps (frames), F feature width, D teacher width.
"""

from __future__ import annotations

from typing import Any

import torch

from mmptm.batch import Batch
from mmptm.encoders.base import Encoder
from mmptm.modalities.audio_io import conv_steps

SAMPLE_RATE = 16000
#: the wav2vec 2.0 / HuBERT conv feature encoder: [kernel, stride] per layer
WAV2VEC2_STEPS = [[10, 5], [3, 2], [3, 2], [3, 2], [3, 2], [2, 2], [2, 2]]
MFCC_DIM = 39


def normalize_wave(wave_S: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit variance (HF's ``do_normalize``: (x − mean) / sqrt(var + 1e-7))."""
    wave_S = wave_S.float()
    return (wave_S - wave_S.mean()) / torch.sqrt(wave_S.var(unbiased=False) + 1e-7)


def mfcc_features(wave_S: torch.Tensor) -> torch.Tensor:
    """[T,39] float32 for one 16 kHz utterance, T = conv_steps(S, WAV2VEC2_STEPS)."""
    from torchaudio.compliance import kaldi
    from torchaudio.functional import compute_deltas

    T = conv_steps(len(wave_S), WAV2VEC2_STEPS)
    if T == 0:
        return wave_S.new_zeros(0, MFCC_DIM, dtype=torch.float32)
    x_1S = normalize_wave(wave_S)[None]
    mfcc_NC = kaldi.mfcc(x_1S, sample_frequency=SAMPLE_RATE, use_energy=False)  # 100 Hz
    d1_CN = compute_deltas(mfcc_NC.T)
    d2_CN = compute_deltas(d1_CN)
    feats_NF = torch.cat([mfcc_NC, d1_CN.T, d2_CN.T], dim=1)
    return feats_NF[::2].contiguous()  # 50 Hz: frame 2i of 100 Hz covers [320 i, 320 i + 400)


def batch_lengths(batch: Batch, prefix: str, where: str) -> tuple[torch.Tensor, list[int]]:
    """(waveform [B,S], real samples per row) of an audio view in a batch."""
    key = f"{prefix}audio"
    wave_BS = batch.get(key)
    if wave_BS is None or wave_BS.dim() != 2:
        shape = None if wave_BS is None else tuple(wave_BS.shape)
        raise ValueError(f"{where}: needs the waveform {key} [B,S] (features: waveform), "
                         f"got {shape}")  # fmt: skip
    mask_BS = batch.get(f"{prefix}audio_mask")
    if mask_BS is None:
        return wave_BS, [wave_BS.shape[1]] * len(wave_BS)
    return wave_BS, mask_BS.sum(dim=1).tolist()


class MfccFeaturizer:
    """HuBERT iteration 1's features (see the module docstring)."""

    dim = MFCC_DIM

    def describe(self) -> dict[str, Any]:
        return {"kind": "mfcc"}

    def facts(self) -> dict[str, Any]:
        return {"sample_rate": SAMPLE_RATE, "features": "waveform"}

    def utterance(self, wave_S: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return mfcc_features(wave_S)

    def batch(self, batch: Batch, prefix: str, steps_BT: torch.Tensor) -> torch.Tensor:
        """[B,T,39] at each row's real steps, 0 elsewhere; the frame counts must be the
        steps mask's (the encoder has the wav2vec 2.0 layout)."""
        wave_BS, lengths = batch_lengths(batch, prefix, "hubert (mfcc)")
        B, T = steps_BT.shape
        out_BTF = wave_BS.new_zeros(B, T, self.dim, dtype=torch.float32)
        for b, n in enumerate(lengths):
            feats_TF = self.utterance(wave_BS[b, : int(n)])
            real = int(steps_BT[b].sum())
            if len(feats_TF) != real:
                raise ValueError(
                    f"hubert (mfcc): {len(feats_TF)} frames for row {b} ({int(n)} samples) but "
                    f"{prefix}audio_steps_mask has {real}: the encoder's steps are not the "
                    "wav2vec 2.0 layout (400-sample window, stride 320)"
                )
            out_BTF[b, :real] = feats_TF
        return out_BTF


# --------------------------------------------------------------------------------------------
# The teacher: a frozen earlier run's audio encoder


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() not in ("", "none", "false", "off", "no")
    return bool(value)


class TeacherFeaturizer:
    """Hidden states of a frozen earlier run's audio encoder after Transformer layer L."""

    def __init__(self, encoder: Encoder, layer: int, *, run: str = "") -> None:
        """``encoder``: built and loaded under the student's view name; ``run``: where it
        came from (recorded in a codebook's sidecar)."""
        if layer < 1:
            raise ValueError(f"hubert teacher layer must be >= 1, got {layer}")
        if not hasattr(encoder, "layer_features"):
            raise ValueError(
                f"{run}: encoder {type(encoder).__name__} has no layer_features(batch, L)"
            )
        self.encoder = encoder.requires_grad_(False).eval()
        self.run, self.layer, self.view = str(run), layer, encoder.view
        self.prefix = encoder.prefix
        need = encoder.data_needs().get(self.view)
        self.needs = dict(need.facts) if need is not None else {}
        self.dim = 0  # known after the first call

    def describe(self) -> dict[str, Any]:
        return {"kind": "teacher", "run": self.run, "layer": self.layer}

    def facts(self) -> dict[str, Any]:
        """The plug-in settings the teacher fixes: the student's view must agree with them."""
        return self.needs

    def _features(self, batch: Batch) -> torch.Tensor:
        enc = self.encoder
        device = batch[f"{self.prefix}audio"].device
        if next(enc.parameters(), torch.empty(0)).device != device:
            self.encoder = enc = enc.to(device)
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            return enc.layer_features(batch, self.layer).float()

    def utterance(self, wave_S: torch.Tensor) -> torch.Tensor:
        """[T,D] for one utterance at the teacher's sample rate (the plug-in's normalisation
        applied here when the teacher declares ``normalize``)."""
        p = self.prefix
        wave_S = wave_S.float()
        if _truthy(self.needs.get("normalize")):
            wave_S = normalize_wave(wave_S)
        steps = self.needs.get("steps") or WAV2VEC2_STEPS
        T = conv_steps(len(wave_S), steps)
        if T == 0:
            return wave_S.new_zeros(0, self.dim)
        dev = next(self.encoder.parameters(), torch.empty(0)).device
        batch = {
            f"{p}audio": wave_S[None].to(dev),
            f"{p}audio_mask": torch.ones(1, len(wave_S), dtype=torch.bool, device=dev),
            f"{p}audio_steps_mask": torch.ones(1, T, dtype=torch.bool, device=dev),
        }
        out_TD = self._features(batch)[0]
        self.dim = out_TD.shape[-1]
        return out_TD

    def batch(self, batch: Batch, prefix: str, steps_BT: torch.Tensor) -> torch.Tensor:
        """[B,T,D] from the batch's view keys, without its [MASK] steps."""
        clean = {k: v for k, v in batch.items() if k != f"{prefix}audio_masked"}
        out_BTD = self._features(clean)
        if out_BTD.shape[:2] != steps_BT.shape:
            raise ValueError(
                f"hubert (teacher {self.run}): layer_features gives {tuple(out_BTD.shape)} but "
                f"{prefix}audio_steps_mask is {tuple(steps_BT.shape)}"
            )
        self.dim = out_BTD.shape[-1]
        return out_BTD


Featurizer = MfccFeaturizer | TeacherFeaturizer


__all__ = [
    "MFCC_DIM",
    "SAMPLE_RATE",
    "WAV2VEC2_STEPS",
    "MfccFeaturizer",
    "TeacherFeaturizer",
    "mfcc_features",
    "normalize_wave",
]
