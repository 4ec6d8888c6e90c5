"""The audio plug-in: an audio member (``flac``/``wav``/``ogg``/``mp3``/``m4a``/...) → ``audio``.

Each view writes, prefixed ``<view>_`` when the view is not named ``audio``:

- ``audio``: float32, the waveform [B,S] (``features: waveform``) or a spectrogram [B,T,M]
  (``fbank``: Kaldi filter banks, ``torchaudio.compliance.kaldi.fbank``; ``logmel``:
  ``torchaudio.transforms.MelSpectrogram`` then ``log(x + 1e-6)``); 0 on padding.
- ``audio_mask``: bool [B,S] or [B,T], True = a real sample / frame.
- ``audio_steps_mask``: bool [B,T'], only when the encoder declares ``steps`` (its time
  reduction, ``[[kernel, stride], ...]``): True for the ``conv_steps(real length, steps)``
  first steps of each clip, T' = ``conv_steps(S or T, steps)`` (what the encoder outputs for
  the padded batch). Objectives' masking reads it.

Decoding (in loader workers): the member's header gives its duration (never decoding a long
file to learn it); a clip over ``max_source_seconds`` is refused; a window of at most
``max_seconds`` is chosen — at a random place when training (the sample's generator), the
centre when evaluating — and only that window is read (``audio_io.read_audio``: soundfile
seeks; PyAV seeks to the window and stops after it), mixed down to mono and resampled
(``torchaudio.functional.resample``) to ``sample_rate``. (A PyAV container whose header
states no duration, e.g. a raw ADTS stream without a bit rate, is decoded once to count.)

Features are computed here, in the loader workers, not on the device: it is CPU work that
runs in parallel across workers and overlaps the training step, and the batch that reaches
the device is the model's input as it is. Measured in CPU time on one core of a shared
2-core AMD EPYC VM (``benchmarks/bench_audio.py``, 2026-11-23): fbank of 10 s at 16 kHz
costs 3.0-3.4 ms, logmel 2.0-2.2 ms, reading the 10 s flac window about 2 ms; one worker
gives 110-185 clips/s of 10 s fbank, 180-215 of logmel, 390-480 of waveforms (85-135 of
each from 44.1 kHz sources: 2.8x the samples to decode, ~2 ms resampling). On the device they
would sit in the step's critical path (on CPU-only training, on the step's own cores), and
SpecAugment's per-sample draws, seeded by sample key here, would have to move with them.

Both spectrograms share Kaldi's framing (``frame_length_ms`` windows every
``frame_shift_ms``, ``snip_edges``): T = 1 + (S - W) // H frames for S samples, windows W and
hops H in samples (98 for 1 s at 16 kHz with 25/10 ms). fbank keeps Kaldi's defaults (povey
window, pre-emphasis 0.97, DC removal, no dither); logmel is a Hann-windowed power mel
spectrogram (HTK mel scale, FFT of the window padded to a power of two, as Kaldi's). Both
take the waveform in [-1, 1] (not int16-scaled as Kaldi's own tools do: 20.8 lower).

Normalisation (``normalize``, a fact the encoder declares): a waveform gets zero mean and
unit variance over its real samples, ``(x - mean) / sqrt(var + 1e-7)`` (the HF
``Wav2Vec2FeatureExtractor``'s ``do_normalize``); a spectrogram gets ``(x - spec_mean) /
(2 * spec_std)`` (AST): the defaults -4.27 / 4.57 are AST's AudioSet fbank statistics
(the same scale: [-1, 1] audio, natural log); set your own data's mean and std of the
unnormalised features where they differ much.

SpecAugment (training only, spectrograms only; off by default): ``time_masks`` stretches
of 0 .. ``time_width`` frames and ``freq_masks`` bands of 0 .. ``freq_width`` mel bins, each
placed uniformly (the SpecAugment paper's policy; its LibriSpeech "basic" widths are the
defaults), filled with 0 — the mean after normalisation — or, with ``normalize`` off, the
clip's own mean.

Bad audio raises ``ValueError`` naming the member (the pipeline skips and counts it; no
sample is ever replaced by zeros): no audio member, bytes its decoder cannot read, no
samples, NaN/Inf samples, a source over ``max_source_seconds``, or a clip too short for one
frame (spectrograms) or one encoder step (``steps``).
Legend: B batch, S samples, T frames, M mel bins, T' encoder steps.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from mmptm.config import ConfigError
from mmptm.modalities.audio_io import AUDIO_MEMBERS, audio_info, conv_steps, read_audio, resample
from mmptm.modalities.base import DataContext, Modality, Sample, find_member
from mmptm.registry import MODALITIES

FEATURES = ("waveform", "fbank", "logmel")
#: added to the mel power before the log (``logmel``)
LOG_EPS = 1e-6
#: in the waveform's ``(x - mean) / sqrt(var + eps)`` (HF ``zero_mean_unit_var_norm``)
VAR_EPS = 1e-7


@MODALITIES.register("audio")
class AudioData(Modality):
    """An audio member → a normalised waveform or spectrogram + masks (see the module)."""

    members: ClassVar[tuple[str, ...]] = AUDIO_MEMBERS
    keys: ClassVar[tuple[str, ...]] = ("audio", "audio_mask", "audio_steps_mask")

    @dataclass
    class Config:
        type: str = "audio"
        #: the member to read (its last extension names the format); "" = the first of
        #: flac, wav, ogg, mp3, m4a, aac, opus, mp4, webm, mkv the sample has
        member: str = ""
        #: resampled to this rate, Hz (declared by the encoder)
        sample_rate: int = 16000
        #: waveform | fbank | logmel (declared by the encoder)
        features: str = "waveform"
        #: mel bins M of fbank / logmel (declared by the encoder)
        n_mels: int = 80
        frame_length_ms: float = 25.0
        frame_shift_ms: float = 10.0
        #: waveform: per clip zero mean / unit variance; spectrogram: (x - spec_mean) /
        #: (2 spec_std) (declared by the encoder)
        normalize: bool = True
        spec_mean: float = -4.27
        spec_std: float = 4.57
        #: the window read from each clip, seconds (random when training, centred when
        #: evaluating); 0 = the whole clip
        max_seconds: float = 10.0
        #: a source longer than this (from its header) is a bad sample; 0 = no limit
        max_source_seconds: float = 3600.0
        #: the encoder's time reduction [[kernel, stride], ...] over ``audio``'s time axis
        #: (declared by the encoder); set = also write ``audio_steps_mask``
        steps: list[list[int]] = field(default_factory=list)
        #: SpecAugment (training, spectrograms): masks and their widest width
        time_masks: int = 0
        time_width: int = 100  # frames
        freq_masks: int = 0
        freq_width: int = 27  # mel bins

    def __init__(self, cfg: Config, *, views: Sequence[str], context: DataContext) -> None:
        super().__init__(cfg, views=views, context=context)
        check_settings(cfg)
        self.waveform = cfg.features == "waveform"
        rate = cfg.sample_rate
        #: Kaldi framing in samples: window W, hop H
        self.win = int(rate * cfg.frame_length_ms * 0.001)
        self.hop = int(rate * cfg.frame_shift_ms * 0.001)
        if not self.waveform and (self.win < 2 or self.hop < 1):
            raise ConfigError(
                f"data.modalities.audio.frame_length_ms={cfg.frame_length_ms!r}: with "
                f"frame_shift_ms={cfg.frame_shift_ms!r} at {rate} Hz, under 2 / 1 samples"
            )
        self.member_ext = cfg.member.rsplit(".", 1)[-1] if cfg.member else ""
        self._mel: Any = None  # torchaudio MelSpectrogram, built once per process

    def __getstate__(self) -> dict[str, Any]:  # each loader worker builds its own
        return {**self.__dict__, "_mel": None}

    def view_keys(self, view: str) -> list[str]:
        keys = self.keys if self.cfg.steps else self.keys[:2]
        return [self.prefix(view) + k for k in keys]

    # -- decoding -------------------------------------------------------------------------

    def read(self, sample: Sample, rng: random.Random | None) -> tuple[np.ndarray, str]:
        """The window of the sample's audio as mono float32 [S] at ``sample_rate``, and the
        member it came from."""
        c = self.cfg
        if c.member:
            if c.member not in sample:
                raise ValueError(f"no {c.member} member; has {sorted(sample)}")
            member, ext = c.member, self.member_ext
        else:
            found = find_member(sample, AUDIO_MEMBERS)
            if found is None:
                raise ValueError(f"no audio member (one of {AUDIO_MEMBERS}); has {sorted(sample)}")
            member = ext = found
        data = sample[member]
        if not isinstance(data, bytes | bytearray) or not data:
            raise ValueError(f"{member}: empty")
        offset_s, duration_s = 0.0, None
        if c.max_seconds > 0 or c.max_source_seconds > 0:
            seconds, rate = audio_info(bytes(data), ext, member)
            if c.max_source_seconds > 0 and seconds > c.max_source_seconds:
                raise ValueError(
                    f"{member}: lasts {seconds:.0f} s, over max_source_seconds="
                    f"{c.max_source_seconds:g}"
                )
            total, want = round(seconds * rate), round(c.max_seconds * rate)
            if c.max_seconds > 0 and total > want:
                start = rng.randint(0, total - want) if rng is not None else (total - want) // 2
                offset_s, duration_s = start / rate, want / rate
        wave_S, rate = read_audio(
            bytes(data), ext, member, offset_s=offset_s, duration_s=duration_s
        )
        wave_S = resample(wave_S, rate, c.sample_rate)
        if c.max_seconds > 0:  # resampling rounds up
            wave_S = wave_S[: round(c.max_seconds * c.sample_rate)]
        return wave_S, member

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        wave_S, member = self.read(sample, rng)
        x = torch.from_numpy(np.ascontiguousarray(wave_S))
        if self.waveform:
            if self.cfg.normalize:
                x = (x - x.mean()) / torch.sqrt(x.var(correction=0) + VAR_EPS)
        else:
            frames = 0 if len(x) < self.win else 1 + (len(x) - self.win) // self.hop
            if frames < 1:
                raise ValueError(
                    f"{member}: {len(x)} samples at {self.cfg.sample_rate} Hz are shorter than "
                    f"one {self.cfg.frame_length_ms:g} ms frame"
                )
            x = self.spectrogram(x)
            if self.cfg.normalize:
                x = (x - self.cfg.spec_mean) / (2 * self.cfg.spec_std)
        if self.cfg.steps and conv_steps(len(x), self.cfg.steps) < 1:
            unit = "samples" if self.waveform else "frames"
            raise ValueError(
                f"{member}: {len(x)} {unit} give no encoder step (steps={self.cfg.steps})"
            )
        return {self.prefix(self.views[0]) + "audio": x}

    def spectrogram(self, wave_S: torch.Tensor) -> torch.Tensor:
        """fbank / logmel [T,M] of a waveform [S] (at least one frame long)."""
        c = self.cfg
        if c.features == "fbank":
            from torchaudio.compliance import kaldi

            return kaldi.fbank(
                wave_S[None], sample_frequency=c.sample_rate, num_mel_bins=c.n_mels,
                frame_length=c.frame_length_ms, frame_shift=c.frame_shift_ms, dither=0.0,
            )  # fmt: skip
        # logmel on Kaldi's frames: each W-sample window sits at the centre of an n_fft
        # frame of torch.stft (center=False), so pad the clip by the difference
        left = (self.mel.n_fft - self.win) // 2
        right = self.mel.n_fft - self.win - left
        x_S = torch.nn.functional.pad(wave_S, (left, right))
        return torch.log(self.mel(x_S) + LOG_EPS).T.contiguous()  # [M,T] -> [T,M]

    @property
    def mel(self) -> Any:
        if self._mel is None:
            import torchaudio

            n_fft = 1 << max(self.win - 1, 1).bit_length()  # Kaldi's padded window
            self._mel = torchaudio.transforms.MelSpectrogram(
                sample_rate=self.cfg.sample_rate, n_fft=n_fft, win_length=self.win,
                hop_length=self.hop, n_mels=self.cfg.n_mels, center=False, power=2.0,
            )  # fmt: skip
        return self._mel

    # -- augmentation, batching -------------------------------------------------------------

    def augment(self, item: Sample, rng: random.Random) -> Sample:
        c = self.cfg
        if self.waveform or not (c.time_masks or c.freq_masks):
            return item
        key = self.prefix(self.views[0]) + "audio"
        item[key] = spec_augment(
            item[key], rng, time_masks=c.time_masks, time_width=c.time_width,
            freq_masks=c.freq_masks, freq_width=c.freq_width,
            value=None if c.normalize else float(item[key].mean()),
        )  # fmt: skip
        return item

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        p = self.prefix(self.views[0])
        clips = [s[p + "audio"] for s in samples]
        lengths = [len(x) for x in clips]
        S = max(lengths)
        audio = torch.zeros(len(clips), S, *clips[0].shape[1:])  # [B,S] or [B,T,M]
        for i, x in enumerate(clips):
            audio[i, : len(x)] = x
        mask_BS = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
        out = {p + "audio": audio, p + "audio_mask": mask_BS}
        if self.cfg.steps:
            steps = torch.tensor([conv_steps(n, self.cfg.steps) for n in lengths])
            T = conv_steps(S, self.cfg.steps)
            out[p + "audio_steps_mask"] = torch.arange(T)[None, :] < steps[:, None]
        return out


def spec_augment(
    x_TM: torch.Tensor,
    rng: random.Random,
    *,
    time_masks: int,
    time_width: int,
    freq_masks: int,
    freq_width: int,
    value: float | None = None,
) -> torch.Tensor:
    """A copy of spectrogram [T,M] with ``time_masks`` stretches of 0..``time_width`` frames
    and ``freq_masks`` bands of 0..``freq_width`` bins set to ``value`` (None = 0)."""
    x_TM = x_TM.clone()
    fill = 0.0 if value is None else value
    for masks, width, axis in ((time_masks, time_width, 0), (freq_masks, freq_width, 1)):
        size = x_TM.shape[axis]
        for _ in range(masks):
            w = rng.randint(0, min(width, size))
            start = rng.randint(0, size - w)
            if axis == 0:
                x_TM[start : start + w] = fill
            else:
                x_TM[:, start : start + w] = fill
    return x_TM


def check_settings(cfg: AudioData.Config) -> None:
    """One-line ``ConfigError`` naming the first bad ``data.modalities.audio`` setting."""
    where = "data.modalities.audio"

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{where}.{key}={getattr(cfg, key)!r}: {why}")

    if cfg.features not in FEATURES:
        raise bad("features", f"must be one of {', '.join(FEATURES)}")
    if cfg.member and cfg.member.rsplit(".", 1)[-1] not in AUDIO_MEMBERS:
        raise bad("member", f"must end in one of {', '.join(AUDIO_MEMBERS)}")
    if cfg.sample_rate < 1000:
        raise bad("sample_rate", "must be >= 1000 Hz")
    for key in ("n_mels", "frame_length_ms", "frame_shift_ms", "spec_std"):
        if not getattr(cfg, key) > 0:
            raise bad(key, "must be > 0")
    for key in ("max_seconds", "max_source_seconds"):
        value = getattr(cfg, key)
        if not (value >= 0 and math.isfinite(value)):
            raise bad(key, "must be >= 0 (0 = no limit)")
    if not all(
        isinstance(s, Sequence) and len(s) == 2 and all(isinstance(v, int) and v >= 1 for v in s)
        for s in cfg.steps
    ):
        raise bad("steps", "must be a list of [kernel, stride] pairs of ints >= 1")
    for key in ("time_masks", "time_width", "freq_masks", "freq_width"):
        if getattr(cfg, key) < 0:
            raise bad(key, "must be >= 0")
    if cfg.features == "waveform":
        for key in ("time_masks", "freq_masks"):
            if getattr(cfg, key):
                raise bad(key, "SpecAugment needs features fbank or logmel, not waveform")


__all__ = ["FEATURES", "AudioData", "check_settings", "spec_augment"]
