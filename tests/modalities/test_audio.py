"""The audio plug-in: decoding flac/wav/ogg/mp3/m4a, resampling, mixdown, which window a clip
gives (train / eval) and that only it is read, normalisation (against HF's feature
extractors), Kaldi framing, fbank / logmel values (against transformers' numpy
implementation), padding and steps masks, SpecAugment, bad audio, settings, and the plug-in
inside the real pipeline with loader workers.

Test audio is made here: tones (their frequency is read back with an FFT), ramps written as
float wav (a sample's value says where it came from), chirps (the frequency says when).
"""

from __future__ import annotations

import io
import pickle
import random
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch

from mmptm.config import ConfigError
from mmptm.data.decode import Decoder
from mmptm.data.pipeline import Loader, stream_config
from mmptm.data.shards import ShardWriter
from mmptm.modalities import DataContext, Need, build_modalities
from mmptm.modalities.audio import AudioData
from mmptm.modalities.audio_io import audio_info, encode_audio, read_audio
from mmptm.recipe import DataConfig

SR = 16000
#: wav2vec 2.0's feature encoder: [kernel, stride] per conv layer
W2V2 = [[10, 5], [3, 2], [3, 2], [3, 2], [3, 2], [2, 2], [2, 2]]


def plugin(view: str = "audio", **cfg) -> AudioData:
    return AudioData(AudioData.Config(**cfg), views=[view], context=DataContext())


def tone(freq: float, seconds: float, rate: int = SR, amp: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def float_wav(wave: np.ndarray, rate: int = SR) -> bytes:
    """32-bit float wav: samples come back exactly (NaN and Inf too)."""
    buf = io.BytesIO()
    sf.write(buf, wave, rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def encode_av(wave: np.ndarray, rate: int, container: str = "ipod", codec: str = "aac") -> bytes:
    """Mono float [S] → AAC in an m4a (``ipod``) container, with PyAV."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(
            wave[None].astype(np.float32), format="flt", layout="mono"
        )
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode()]:
            out.mux(packet)
    return buf.getvalue()


def peak_hz(wave: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(wave * np.hanning(len(wave))))
    return float(np.fft.rfftfreq(len(wave), 1 / rate)[spectrum.argmax()])


def crossings_hz(wave: np.ndarray, rate: int) -> float:
    """Mean frequency of a tone from its upward zero crossings."""
    up = np.flatnonzero((wave[:-1] < 0) & (wave[1:] >= 0))
    return (len(up) - 1) / ((up[-1] - up[0]) / rate)


# -- decoding --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["flac", "wav", "ogg", "mp3", "m4a"])
def test_every_format_decodes_to_the_tone_it_holds(fmt):
    wave = tone(440, 1.0)
    data = encode_av(wave, SR) if fmt == "m4a" else encode_audio(wave, SR, fmt)
    x = plugin(normalize=False).decode({fmt: data}, {}, None)["audio"].numpy()
    assert x.dtype == np.float32 and x.ndim == 1
    # lossy codecs add encoder delay / padding (AAC: 1024 samples, mp3: up to ~2 frames)
    assert 16000 <= len(x) <= 16000 + 2400, len(x)
    assert abs(peak_hz(x, SR) - 440) <= 1.5
    assert 0.3 < np.sqrt(np.mean(x[2000:14000] ** 2)) < 0.4  # rms of a 0.5 sine: 0.354


def test_a_44k1_tone_is_resampled_to_16k():
    x = plugin(normalize=False).decode(
        {"flac": encode_audio(tone(440, 1.0, 44100), 44100)}, {}, None
    )
    x = x["audio"].numpy()
    assert len(x) == 16000
    assert peak_hz(x, SR) == 440.0  # 1 Hz bins
    # and 3 kHz (under the new Nyquist) survives with its amplitude
    y = plugin(normalize=False).read({"wav": float_wav(tone(3000, 1.0, 44100), 44100)}, None)[0]
    assert peak_hz(y, SR) == 3000.0 and abs(np.abs(y[1000:-1000]).max() - 0.5) < 0.01


def test_stereo_is_mixed_down_to_the_mean_of_its_channels():
    left = np.linspace(-0.8, 0.8, 8000, dtype=np.float32)
    right = np.full(8000, 0.2, np.float32)
    data = float_wav(np.stack([left, right], axis=1))
    x = plugin(normalize=False).decode({"wav": data}, {}, None)["audio"].numpy()
    np.testing.assert_allclose(x, (left + right) / 2, atol=1e-6)


@pytest.mark.parametrize("rate", [SR, 44100])
def test_evaluation_reads_the_centre_window_and_training_a_seeded_random_one(rate):
    n = 4 * rate  # a 4 s ramp: sample i holds i / n, so a value says its time (value * 4 s)
    data = float_wav(np.arange(n, dtype=np.float32) / n, rate)
    p = plugin(normalize=False, max_seconds=1.0)
    x = p.decode({"wav": data}, {}, None)["audio"].numpy()
    assert len(x) == SR
    assert abs(x[SR // 2] * 4 - 2.0) < 1e-3  # the window's middle is the clip's (2 s)
    starts = []
    for seed in range(8):
        y = p.decode({"wav": data}, {}, random.Random(seed))["audio"].numpy()
        assert len(y) == SR
        slope, _ = np.polyfit(np.arange(SR - 20), y[10:-10], 1)  # one contiguous stretch
        assert abs(slope * 4 * SR - 1) < 1e-3
        starts.append(round(float(y[SR // 2]) * 4 - 0.5, 3))  # seconds into the clip
        again = p.decode({"wav": data}, {}, random.Random(seed))["audio"].numpy()
        assert np.array_equal(y, again)
    assert all(-0.001 <= s <= 3.001 for s in starts) and len(set(starts)) == 8


def test_an_m4a_window_comes_from_the_right_time():
    t = np.arange(4 * SR) / SR  # a chirp: frequency 200 + 100 t Hz
    chirp = (0.5 * np.sin(2 * np.pi * (200 * t + 50 * t**2))).astype(np.float32)
    p = plugin(normalize=False, max_seconds=1.0)
    x = p.decode({"m4a": encode_av(chirp, SR)}, {}, None)["audio"].numpy()
    assert len(x) == SR
    # centred: 1.5 .. 2.5 s → 350 .. 450 Hz, mean 400 (AAC's 64 ms priming: +6 Hz)
    assert abs(crossings_hz(x, SR) - 400) < 12


@pytest.mark.parametrize(("container", "ext"), [("ipod", "m4a"), ("matroska", "mkv")])
def test_a_pyav_window_starts_where_a_whole_read_says(container, ext):
    """Offsets count from the stream's first sample; Matroska's AAC starts at 64 ms."""
    noise = np.convolve(np.random.default_rng(3).standard_normal(3 * SR), np.ones(4) / 4)
    data = encode_av((0.3 * noise).astype(np.float32), SR, container)
    whole, _ = read_audio(data, ext, ext)
    part, _ = read_audio(data, ext, ext, offset_s=1.25, duration_s=0.5)
    assert len(part) == SR // 2
    lag = np.correlate(whole[: 2 * SR], part[1000:3000], mode="valid").argmax() - 1000
    assert lag == round(1.25 * SR)


def test_only_the_window_of_a_long_file_is_read(monkeypatch):
    data = encode_audio(tone(300, 30.0), SR)
    asked = []
    real = sf.SoundFile.read

    def spy(self, frames=-1, *args, **kwargs):
        asked.append(frames)
        return real(self, frames, *args, **kwargs)

    monkeypatch.setattr(sf.SoundFile, "read", spy)
    x = plugin(max_seconds=2.0).decode({"flac": data}, {}, random.Random(0))["audio"]
    assert len(x) == 2 * SR and asked == [2 * SR]


# -- normalisation, features, masks ------------------------------------------------------------


def test_waveform_normalisation_and_padding_match_hf_wav2vec2():
    transformers = pytest.importorskip("transformers")
    rng = np.random.default_rng(0)
    raw = [0.1 * rng.standard_normal(n).astype(np.float32) + 0.05 for n in (12000, 7000)]
    p = plugin(normalize=True, steps=W2V2)
    batch = p.collate([p.decode({"wav": float_wav(w)}, {}, None) for w in raw])
    fe = transformers.Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=SR, padding_value=0.0, do_normalize=True,
        return_attention_mask=True,
    )  # fmt: skip
    want = fe(raw, sampling_rate=SR, padding=True, return_tensors="pt")
    torch.testing.assert_close(batch["audio"], want["input_values"], atol=1e-6, rtol=1e-5)
    assert torch.equal(batch["audio_mask"], want["attention_mask"].bool())
    real = batch["audio"][1, :7000]
    assert abs(float(real.mean())) < 1e-5 and abs(float(real.std(correction=0)) - 1) < 1e-5


def test_masks_and_the_encoder_steps_mask_of_a_padded_batch():
    p = plugin(normalize=False, steps=W2V2)
    items = [p.decode({"wav": float_wav(tone(100, s))}, {}, None) for s in (1.0, 0.5)]
    batch = p.collate(items)
    assert batch["audio"].shape == (2, 16000)
    assert batch["audio_mask"].sum(1).tolist() == [16000, 8000]
    assert not batch["audio"][1, 8000:].any()  # padding is 0
    # wav2vec 2.0 makes 49 steps of 1 s at 16 kHz (20 ms each, minus its receptive field)
    assert batch["audio_steps_mask"].shape == (2, 49)
    assert batch["audio_steps_mask"].sum(1).tolist() == [49, 24]
    assert batch["audio_steps_mask"][1].tolist() == [True] * 24 + [False] * 25
    # stacking 4 frames of a spectrogram: 98 frames → 24 steps, 48 frames → 12
    q = plugin(features="fbank", steps=[[4, 4]])
    batch = q.collate([q.decode({"wav": float_wav(tone(100, s))}, {}, None) for s in (1.0, 0.5)])
    assert batch["audio"].shape == (2, 98, 80) and batch["audio_mask"].sum(1).tolist() == [98, 48]
    assert batch["audio_steps_mask"].sum(1).tolist() == [24, 12]
    assert not batch["audio"][1, 48:].any()


def test_no_steps_no_steps_mask_and_other_views_are_prefixed():
    p = plugin(view="speech", features="logmel")
    item = p.decode({"flac": encode_audio(tone(200, 0.5), SR)}, {}, None)
    assert set(item) == {"speech_audio"}
    assert set(p.collate([item])) == {"speech_audio", "speech_audio_mask"}
    assert p.view_keys("speech") == ["speech_audio", "speech_audio_mask"]
    q = plugin(view="speech", steps=[[2, 2]], features="logmel")
    assert set(q.collate([item])) == set(q.view_keys("speech")) == {
        "speech_audio", "speech_audio_mask", "speech_audio_steps_mask"
    }  # fmt: skip


@pytest.mark.parametrize("features", ["fbank", "logmel"])
def test_spectrogram_frames_follow_kaldi_framing(features):
    """98 frames of 25 ms every 10 ms in 1 s; a click at sample 1000 is heard in exactly the
    frames whose window [160 k, 160 k + 400) holds it: k = 4, 5, 6."""
    click = np.zeros(SR, np.float32)
    click[1000] = 0.9
    x = plugin(features=features, normalize=False).decode({"wav": float_wav(click)}, {}, None)
    x_TM = x["audio"]
    assert x_TM.shape == (98, 80)
    loud = (x_TM.max(dim=1).values > x_TM.min() + 1.0).nonzero().flatten().tolist()
    assert loud == [4, 5, 6]


def test_fbank_matches_a_numpy_kaldi_implementation():
    audio_utils = pytest.importorskip("transformers.audio_utils")
    wave = (0.1 * np.random.default_rng(1).standard_normal(SR)).astype(np.float32)
    got = plugin(features="fbank", normalize=False).decode({"wav": float_wav(wave)}, {}, None)
    mel = audio_utils.mel_filter_bank(
        num_frequency_bins=257, num_mel_filters=80, min_frequency=20, max_frequency=8000,
        sampling_rate=SR, norm=None, mel_scale="kaldi", triangularize_in_mel_space=True,
    )  # fmt: skip
    want = audio_utils.spectrogram(
        wave.astype(np.float64), audio_utils.window_function(400, "povey", periodic=False),
        frame_length=400, hop_length=160, fft_length=512, power=2.0, center=False,
        preemphasis=0.97, mel_filters=mel, log_mel="log", mel_floor=1.192092955078125e-07,
        remove_dc_offset=True,
    ).T  # fmt: skip
    assert want.shape == (98, 80)
    np.testing.assert_allclose(got["audio"].numpy(), want, atol=2e-3, rtol=0)
    normed = plugin(features="fbank").decode({"wav": float_wav(wave)}, {}, None)["audio"]
    np.testing.assert_allclose(normed.numpy(), (want + 4.27) / (2 * 4.57), atol=1e-3, rtol=0)


def test_logmel_matches_a_numpy_mel_spectrogram():
    audio_utils = pytest.importorskip("transformers.audio_utils")
    wave = (0.1 * np.random.default_rng(2).standard_normal(SR)).astype(np.float32)
    got = plugin(features="logmel", n_mels=64, normalize=False).decode(
        {"wav": float_wav(wave)}, {}, None
    )["audio"]
    mel = audio_utils.mel_filter_bank(
        num_frequency_bins=257, num_mel_filters=64, min_frequency=0, max_frequency=8000,
        sampling_rate=SR, norm=None, mel_scale="htk",
    )  # fmt: skip
    power = audio_utils.spectrogram(
        wave.astype(np.float64), audio_utils.window_function(400, "hann"), frame_length=400,
        hop_length=160, fft_length=512, power=2.0, center=False, mel_filters=mel,
        mel_floor=1e-30,
    ).T  # fmt: skip
    assert got.shape == power.shape == (98, 64)
    np.testing.assert_allclose(got.numpy(), np.log(power + 1e-6), atol=2e-3, rtol=0)


# -- SpecAugment ------------------------------------------------------------------------------


def _runs(zero: np.ndarray) -> list[int]:
    """Lengths of the runs of True."""
    edges = np.diff(np.concatenate([[0], zero.astype(int), [0]]))
    return (np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).tolist()


def test_spec_augment_masks_only_when_training_and_at_most_as_many_as_asked():
    p = plugin(features="fbank", time_masks=2, time_width=10, freq_masks=3, freq_width=6)
    sample = {"__key__": "k", "flac": encode_audio(tone(300, 1.0) + tone(2000, 1.0, amp=0.2), SR)}
    clean = Decoder([p], train=False)(sample)["audio"]
    assert (clean != 0).all()  # no mask when evaluating
    seen = set()
    for seed in range(20):
        x = Decoder([p], seed=seed, train=True)(sample)["audio"]  # 1 s < max_seconds: no crop
        zero = x == 0
        rows, cols = zero.all(dim=1).numpy(), zero.all(dim=0).numpy()
        t_runs, f_runs = _runs(rows), _runs(cols)
        assert len(t_runs) <= 2 and sum(t_runs) <= 20 and max(t_runs, default=0) <= 20
        assert len(f_runs) <= 3 and sum(f_runs) <= 18
        assert torch.equal(zero, torch.from_numpy(rows[:, None] | cols[None, :]))  # nothing else
        assert torch.equal(x[~zero], clean[~zero])
        seen.add((len(t_runs), len(f_runs)))
    assert (2, 3) in seen  # the asked-for counts do occur


def test_spec_augment_without_normalisation_fills_with_the_clip_mean():
    p = plugin(features="logmel", normalize=False, time_masks=1, time_width=50, freq_masks=0)
    x = p.decode({"flac": encode_audio(tone(300, 1.0), SR)}, {}, None)["audio"]
    y = p.augment({"audio": x.clone()}, random.Random(4))["audio"]
    changed = (y != x).any(dim=1)
    assert changed.any() and torch.allclose(y[changed], x.mean().expand_as(y[changed]))


# -- bad audio, settings ---------------------------------------------------------------------


def test_bad_audio_raises_value_errors_that_name_the_member():
    from mmptm.modalities.video import encode_video

    flac = encode_audio(tone(440, 1.0), SR)
    bad_wave = tone(440, 0.5)
    nan, inf = bad_wave.copy(), bad_wave.copy()
    nan[100], inf[2000] = np.nan, -np.inf
    cases = {
        "empty": ({"flac": b""}, "flac: empty"),
        "garbage": ({"wav": b"RIFF not a wave file" * 8}, "wav: not readable as wav"),
        "truncated": ({"flac": flac[: len(flac) // 2]}, "flac: not readable as flac"),
        "no samples": ({"wav": float_wav(np.zeros(0, np.float32))}, "wav: no audio samples"),
        "NaN": ({"wav": float_wav(nan)}, "wav: holds NaN or Inf"),
        "Inf": ({"wav": float_wav(inf)}, "wav: holds NaN or Inf"),
        "bad m4a": ({"m4a": b"\x00\x00\x00\x18ftypM4A " + b"x" * 64}, "m4a: not readable by"),
        "no audio stream": (
            {"mp4": encode_video(np.zeros((2, 16, 16, 3), np.uint8))},
            "mp4: no audio stream",
        ),
        "no member": ({"txt": b"hello"}, r"no audio member \(one of .*flac.*\); has \['txt'\]"),
    }
    for name, (sample, message) in cases.items():
        with pytest.raises(ValueError, match=f"^{message}") as e:
            plugin().decode(sample, {}, None)
        assert "\n" not in str(e.value), name
    with pytest.raises(ValueError, match=r"^flac: lasts 1 s, over max_source_seconds=0.5"):
        plugin(max_source_seconds=0.5).decode({"flac": flac}, {}, None)
    with pytest.raises(ValueError, match=r"^no speech.flac member; has \['flac'\]"):
        plugin(member="speech.flac").decode({"flac": flac}, {}, None)
    assert plugin(member="speech.flac").decode({"speech.flac": flac}, {}, None)["audio"].shape == (
        16000,
    )


def test_clips_too_short_for_a_frame_or_a_step_are_bad_samples():
    short = float_wav(tone(440, 300 / SR))  # 300 samples: under one 400-sample window
    with pytest.raises(ValueError, match=r"^wav: 300 samples at 16000 Hz are shorter than one 25"):
        plugin(features="fbank").decode({"wav": short}, {}, None)
    # 300 samples: 59, 29, 14, 6, 2, 1, then 0 outputs through wav2vec 2.0's convolutions
    with pytest.raises(ValueError, match=r"^wav: 300 samples give no encoder step"):
        plugin(steps=W2V2).decode({"wav": short}, {}, None)
    assert plugin(steps=W2V2).decode({"wav": float_wav(tone(440, 400 / SR))}, {}, None)


def test_bad_settings_are_named_in_one_line():
    cases = {
        "features": {"features": "mfcc"},
        "member": {"member": "speech.txt"},
        "sample_rate": {"sample_rate": 0},
        "n_mels": {"features": "fbank", "n_mels": 0},
        "spec_std": {"spec_std": 0.0},
        "max_seconds": {"max_seconds": -1.0},
        "steps": {"steps": [[10, 5], [3]]},
        "time_width": {"features": "fbank", "time_width": -1},
        "time_masks": {"time_masks": 2},  # SpecAugment on a waveform
        "freq_masks": {"freq_masks": 1},
        "frame_length_ms": {"features": "logmel", "frame_length_ms": 0.1},
    }
    for key, cfg in cases.items():
        with pytest.raises(ConfigError, match=rf"^data\.modalities\.audio\.{key}=") as e:
            plugin(**cfg)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="time_masks=2: SpecAugment needs features fbank or"):
        plugin(time_masks=2)


def test_declared_facts_and_recipe_settings_build_the_plugin():
    needs = {"audio": Need("audio", {"features": "fbank", "n_mels": 64, "steps": [[4, 4]]})}
    recipe = {"audio": {"type": "audio", "max_seconds": 2.0, "time_masks": 2}}
    (p,) = build_modalities(needs, recipe, DataContext())
    assert isinstance(p, AudioData)
    assert (p.cfg.features, p.cfg.n_mels, p.cfg.steps, p.cfg.max_seconds, p.cfg.time_masks) == (
        "fbank", 64, [[4, 4]], 2.0, 2,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="data.modalities.audio.features='logmel' contradicts"):
        build_modalities(needs, {"audio": {"type": "audio", "features": "logmel"}}, DataContext())
    with pytest.raises(ConfigError, match="unknown key 'data.modalities.audio.n_mel'"):
        build_modalities(needs, {"audio": {"type": "audio", "n_mel": 40}}, DataContext())


def test_a_worker_gets_a_pickle_without_the_mel_transform():
    p = plugin(features="logmel")
    data = {"flac": encode_audio(tone(500, 0.5), SR)}
    want = p.decode(data, {}, None)["audio"]
    assert p._mel is not None
    q = pickle.loads(pickle.dumps(p))  # as a spawned loader worker gets it
    assert q._mel is None
    torch.testing.assert_close(q.decode(data, {}, None)["audio"], want)


def test_importing_the_module_imports_no_audio_library():
    code = (
        "import sys, mmptm.modalities.audio; "
        "print(sorted(m for m in ('av', 'soundfile', 'torchaudio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_audio_info_reads_the_header():
    assert audio_info(encode_audio(tone(1, 2.5, 8000), 8000), "flac", "flac") == (2.5, 8000)
    seconds, rate = audio_info(encode_av(tone(440, 2.0), SR), "m4a", "m4a")
    assert rate == SR and 2.0 <= seconds < 2.1  # AAC's priming and padding count
    wave, rate = read_audio(encode_audio(tone(440, 2.0), SR), "flac", "x", offset_s=0.5)
    assert rate == SR and len(wave) == int(1.5 * SR)


# -- in the pipeline ---------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_corrupt_clip_is_skipped_and_counted_and_the_others_arrive(tmp_path, workers):
    seconds = {f"k{i}": 0.3 + 0.1 * i for i in range(7)}
    with ShardWriter(str(tmp_path / "a-%06d.tar"), 3) as w:
        for i, (key, s) in enumerate(seconds.items()):
            flac = encode_audio(tone(200 + 50 * i, s, 22050), 22050)
            w.write({"__key__": key, "flac": flac if i != 4 else flac[:100], "txt": "x"})
    needs = {"audio": Need("audio", {"features": "fbank", "n_mels": 40, "steps": [[2, 2]]})}
    cfg = DataConfig(
        train=",".join(w.shards), batch_size=2, modalities={"audio": {"type": "audio"}}
    )
    sc = stream_config(cfg, None, needs=needs)
    sc = replace(sc, shuffle=False, shuffle_buffer=1, drop_last=False)
    loader = Loader(sc, num_workers=workers)
    batches = list(loader._epoch_batches())
    keys = [k for b in batches for k in b["__key__"]]
    assert sorted(keys) == [k for k in seconds if k != "k4"]
    assert loader.skipped == 1
    for b in batches:
        frames = [1 + (round(seconds[k] * SR) - 400) // 160 for k in b["__key__"]]
        assert b["audio"].shape == (len(frames), max(frames), 40)
        assert b["audio_mask"].sum(1).tolist() == frames
        assert b["audio_steps_mask"].sum(1).tolist() == [f // 2 for f in frames]
        assert torch.isfinite(b["audio"]).all()
