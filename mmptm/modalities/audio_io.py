"""Reading and writing audio from bytes: soundfile for flac/wav/ogg/mp3, PyAV for the rest.

:func:`read_audio` decodes a member (any of :data:`AUDIO_MEMBERS`) to mono float32 at its own
sample rate, reading only a window of it when asked (``offset_s``, ``duration_s``: a long
file is never decoded whole by soundfile, which seeks; PyAV seeks to the window's start).
:func:`resample` brings it to the rate an encoder declares (``torchaudio.functional``).
:func:`encode_audio` writes flac/wav/ogg/mp3 bytes (toyworld, the converters, the tests).
:func:`conv_steps` is the number of outputs of a stack of unpadded 1-D convolutions
(``[[kernel, stride], ...]``): what the plug-in and the encoders agree on as an encoder's
time steps (wav2vec 2.0's feature encoder, a spectrogram's stacked frames).

Bad bytes raise ``ValueError`` naming ``where``: unreadable, no audio stream, no samples,
NaN or Inf samples, a WAV cut short (its header promises more frames than it holds).
``torchaudio.load`` is not used: in torchaudio 2.11 it needs torchcodec and a system FFmpeg.
Legend: S samples, C channels.
"""

from __future__ import annotations

import io
import re
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

#: audio members, in the order they are looked for; the first four go through soundfile
SOUNDFILE_MEMBERS = ("flac", "wav", "ogg", "mp3")
AUDIO_MEMBERS = (*SOUNDFILE_MEMBERS, "m4a", "aac", "opus", "mp4", "webm", "mkv")


def audio_info(data: bytes, ext: str, where: str) -> tuple[float, int]:
    """(duration in seconds, sample rate) of an audio member, from its header.

    soundfile formats: the frame count. PyAV formats: the audio stream's duration, else a
    Matroska ``DURATION`` tag, else the container's; a file whose header gives none is
    decoded once to count (rare: raw streams)."""
    if ext in SOUNDFILE_MEMBERS:
        import soundfile as sf

        _check_wav_whole(data, where)
        try:
            info = sf.info(io.BytesIO(data))
        except (RuntimeError, sf.LibsndfileError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: not readable as {ext} ({_line(e)})") from None
        if info.samplerate <= 0:
            raise ValueError(f"{where}: sample rate {info.samplerate}")
        return info.frames / info.samplerate, int(info.samplerate)
    header = _info_av(data, where)
    if header is not None:
        return header
    wave, rate = read_audio(data, ext, where)
    return len(wave) / rate, rate


def _info_av(data: bytes, where: str) -> tuple[float, int] | None:
    """(duration, rate) from a PyAV container's header; None when it states no duration."""
    import av

    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            stream = _audio_stream(container, where)
            rate = _rate(stream, where)
            tb = stream.time_base
            if stream.duration and tb:
                return float(stream.duration * tb), rate
            tag = re.fullmatch(
                r"(\d+):(\d\d):(\d\d(?:\.\d+)?)", stream.metadata.get("DURATION", "")
            )
            if tag:
                return int(tag[1]) * 3600 + int(tag[2]) * 60 + float(tag[3]), rate
            if container.duration:
                return container.duration / 1_000_000, rate
    except av.error.FFmpegError as e:
        raise ValueError(f"{where}: not readable by FFmpeg ({_line(e)})") from None
    return None


def read_audio(
    data: bytes,
    ext: str,
    where: str,
    *,
    offset_s: float = 0.0,
    duration_s: float | None = None,
) -> tuple[np.ndarray, int]:
    """Mono float32 [S] (channels averaged) and its sample rate, from ``offset_s`` for at
    most ``duration_s`` seconds (all of it when None). ``ValueError`` on bad audio."""
    if ext in SOUNDFILE_MEMBERS:
        wave_SC, rate = _read_soundfile(data, ext, where, offset_s, duration_s)
    else:
        wave_SC, rate = _read_av(data, where, offset_s, duration_s)
    if wave_SC.size == 0 or len(wave_SC) == 0:
        raise ValueError(f"{where}: no audio samples")
    wave_S = wave_SC.mean(axis=1, dtype=np.float32) if wave_SC.ndim == 2 else wave_SC
    if not np.isfinite(wave_S).all():
        raise ValueError(f"{where}: holds NaN or Inf samples")
    return np.ascontiguousarray(wave_S, dtype=np.float32), rate


def _read_soundfile(
    data: bytes, ext: str, where: str, offset_s: float, duration_s: float | None
) -> tuple[np.ndarray, int]:
    import soundfile as sf

    _check_wav_whole(data, where)
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate = int(f.samplerate)
            start = max(0, round(offset_s * rate))
            if start:
                f.seek(min(start, f.frames))
            frames = -1 if duration_s is None else max(0, round(duration_s * rate))
            wave_SC = f.read(frames, dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: not readable as {ext} ({_line(e)})") from None
    return wave_SC, rate


def _check_wav_whole(data: bytes, where: str) -> None:
    """``ValueError`` when ``data`` is a WAV whose ``data`` chunk is cut short.

    libsndfile shrinks such a file's frame count to what is there, so a download or copy
    that stopped early would otherwise pass for a clip of a few milliseconds. A size of 0 or
    0xFFFFFFFF (a stream written before its length was known) promises nothing."""
    if len(data) < 12 or data[:4] not in (b"RIFF", b"RIFX") or data[8:12] != b"WAVE":
        return
    endian = "<" if data[:4] == b"RIFF" else ">"
    pos, block_align = 12, 0
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack(endian + "I", data[pos + 4 : pos + 8])[0]
        if chunk == b"fmt " and pos + 22 <= len(data):
            block_align = struct.unpack(endian + "H", data[pos + 20 : pos + 22])[0]
        elif chunk == b"data":
            if size in (0, 0xFFFFFFFF) or block_align == 0:
                return
            promised, held = size // block_align, (len(data) - pos - 8) // block_align
            if held < promised:
                raise ValueError(
                    f"{where}: truncated wav: its header promises {promised} frames, "
                    f"the file holds {held}"
                )
            return
        pos += 8 + size + (size & 1)  # chunks are padded to an even size


def _read_av(
    data: bytes, where: str, offset_s: float, duration_s: float | None
) -> tuple[np.ndarray, int]:
    """Times are from the stream's first sample (its ``start_time``; Matroska and WebM
    audio often starts at the codec delay, e.g. 64 ms), as a whole read counts them. A seek
    that lands after the window's start (Matroska without cues does) is redone as a read
    from the start."""
    wave_SC, rate, late = _decode_av(data, where, offset_s, duration_s, seek=offset_s > 0)
    if late:
        wave_SC, rate, _ = _decode_av(data, where, offset_s, duration_s, seek=False)
    return wave_SC, rate


def _decode_av(
    data: bytes, where: str, offset_s: float, duration_s: float | None, *, seek: bool
) -> tuple[np.ndarray, int, bool]:
    """(window [S,C], rate, whether the seek went past the window's start)."""
    import av

    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            stream = _audio_stream(container, where)
            rate = _rate(stream, where)
            tb = stream.time_base
            start_s = float(stream.start_time * tb) if stream.start_time and tb else 0.0
            begin_s = start_s + offset_s  # stream time of the window's first sample
            seek = seek and bool(tb)
            if seek:
                container.seek(int(begin_s / tb), stream=stream, backward=True)
            end_s = None if duration_s is None else begin_s + duration_s
            chunks: list[np.ndarray] = []
            first_s: float | None = None
            for frame in container.decode(stream):
                t = float(frame.pts * frame.time_base) if frame.pts is not None else None
                if first_s is None:
                    if seek and (t is None or t > begin_s + max(1 / rate, float(tb))):
                        return np.zeros((0, 1), np.float32), rate, True
                    first_s = t if t is not None else start_s
                x = frame.to_ndarray()  # planar [C,n] or packed [1,n·C]
                x = (
                    x.reshape(-1, frame.samples)
                    if frame.format.is_planar
                    else x.reshape(frame.samples, -1).T
                )
                chunks.append(_as_float(x).T)
                if end_s is not None and t is not None and t > end_s:
                    break
    except av.error.FFmpegError as e:
        raise ValueError(f"{where}: not readable by FFmpeg ({_line(e)})") from None
    if not chunks:
        raise ValueError(f"{where}: no audio samples")
    wave_SC = np.concatenate(chunks)
    skip = max(0, round((begin_s - (first_s or 0.0)) * rate))
    wave_SC = wave_SC[skip:]
    if duration_s is not None:
        wave_SC = wave_SC[: max(0, round(duration_s * rate))]
    return wave_SC, rate, False


def _audio_stream(container: Any, where: str) -> Any:
    if not container.streams.audio:
        raise ValueError(f"{where}: no audio stream")
    return container.streams.audio[0]


def _rate(stream: Any, where: str) -> int:
    rate = int(stream.rate or stream.codec_context.sample_rate or 0)
    if rate <= 0:
        raise ValueError(f"{where}: unknown sample rate")
    return rate


def _line(e: BaseException) -> str:
    """An exception's message on one line (libsndfile's may span several)."""
    return " ".join(str(e).split())


def _as_float(x: np.ndarray) -> np.ndarray:
    """Integer PCM to float32 in [-1, 1]; floats as they are."""
    if x.dtype == np.uint8:  # unsigned 8-bit PCM is centred on 128
        return (x.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.float32) / float(np.iinfo(x.dtype).max)
    return x.astype(np.float32, copy=False)


def resample(wave_S: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``wave_S`` at ``target`` Hz (``torchaudio.functional.resample``; as is when equal)."""
    if rate == target:
        return wave_S
    import torch
    import torchaudio.functional as AF

    out = AF.resample(torch.from_numpy(wave_S), rate, target)
    return out.numpy()


def encode_audio(wave: np.ndarray, rate: int, fmt: str = "flac") -> bytes:
    """``wave`` ([S] or [S,C], float in [-1, 1]) as ``flac``/``wav``/``ogg``/``mp3`` bytes
    (16-bit PCM for flac and wav, Vorbis for ogg, MPEG layer III for mp3)."""
    import soundfile as sf

    subtype = {"flac": "PCM_16", "wav": "PCM_16", "ogg": "VORBIS", "mp3": "MPEG_LAYER_III"}
    if fmt not in subtype:
        raise ValueError(f"cannot write audio as {fmt!r} (flac, wav, ogg or mp3)")
    buf = io.BytesIO()
    sf.write(buf, np.clip(wave, -1.0, 1.0), rate, format=fmt.upper(), subtype=subtype[fmt])
    return buf.getvalue()


def conv_steps(length: int, layout: Sequence[Sequence[int]]) -> int:
    """Outputs of unpadded 1-D convolutions ``[[kernel, stride], ...]`` over ``length``
    inputs (0 when too short); ``length`` itself for an empty layout."""
    for kernel, stride in layout:
        length = 0 if length < kernel else (length - kernel) // stride + 1
    return length


__all__ = [
    "AUDIO_MEMBERS",
    "SOUNDFILE_MEMBERS",
    "audio_info",
    "conv_steps",
    "encode_audio",
    "read_audio",
    "resample",
]
