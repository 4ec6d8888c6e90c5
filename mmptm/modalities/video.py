"""The video plug-in: a clip member (``mp4``/``webm``/``mkv``/``avi``/``mov``) → ``frames``.

Each view writes ``frames`` float32 [B,T,3,H,W] (normalised with the encoder's mean/std,
padding frames are 0) and ``frames_mask`` bool [B,T] (True = real frame), T = the most
frames of a clip in the batch (at most ``frames``). Images (``jpg``/``png``/``webp``) are
read as 1-frame clips, so images and videos train in one recipe.

Which frames: ``frames`` (T) of a clip, by default spread over the whole clip in T equal
segments (TSN): training takes a random frame of each segment (the sample's generator),
evaluation each segment's centre frame. With ``stride`` k: T frames k apart; with ``fps``
f: T frames 1/f s apart; both start at a random offset when training and are centred in
the clip when evaluating. Clips with fewer frames give fewer (the mask says so).

Decoding (PyAV, FFmpeg inside the ``av`` wheel; imported in the functions that use it, so
importing this module stays cheap) does only what the chosen frames need: target times come
from the stream's metadata (duration, frame rate, time base, frame count; a clip without
them is scanned once), packets are demultiplexed in order, a group of pictures (key frame
and the frames that depend on it) is decoded only if it holds a target, and only up to the
target, skipping frames no other frame refers to; a gap of more than ``_SEEK_GAP_S``
seconds to the next target is jumped with ``container.seek`` (to the key frame before it);
demultiplexing stops after the last target.
Frames are resized in FFmpeg's scaler (short side to ``size``, then the centre
``size``×``size`` crop; the sample aspect ratio is ignored). ``crop_scale`` (training)
crops one random box from every frame of a clip, resized back to ``size``.

Bad clips raise ``ValueError`` (the pipeline skips and counts them): bytes FFmpeg cannot
read, no video stream, no frame, a frame side over ``max_side``, a duration over
``max_duration_s``, or a clip that ends well before its metadata says (truncated).

:func:`encode_video` is what toyworld, the converters and the tests write clips with.
Encoded bytes embed the library version (``av`` is pinned): compare decoded frames, never
encoded bytes.
Legend: T frames, H×W pixels, C = 3 colour channels, B batch.
"""

from __future__ import annotations

import bisect
import functools
import io
import math
import os
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image

from mmptm.modalities.base import DataContext, Modality, Sample, find_member, segment_indices
from mmptm.modalities.pixels import (
    IMAGE_MEMBERS,
    RESAMPLE,
    check_pixel_settings,
    normalise,
    random_resized_crop,
)
from mmptm.registry import MODALITIES

#: clip members, in the order they are looked for
VIDEO_MEMBERS = ("mp4", "webm", "mkv", "avi", "mov")
#: FFmpeg scaler name by ``interpolation`` setting
_SWS = {"bicubic": "BICUBIC", "bilinear": "BILINEAR", "nearest": "POINT"}
#: jump (``container.seek``) instead of reading on when the next target is this far ahead
_SEEK_GAP_S = 4.0

#: container → (codec, pixel format) written by :func:`encode_video`
CODECS: dict[str, tuple[str, str]] = {
    "mp4": ("libx264", "yuv420p"),
    "webm": ("libvpx-vp9", "yuv420p"),
    "mkv": ("libx264", "yuv420p"),
}


def encode_video(
    frames_THWC: np.ndarray,
    fps: float = 8.0,
    container: str = "mp4",
    *,
    quality: int = 18,
    options: dict[str, str] | None = None,
) -> bytes:
    """Encode uint8 RGB frames ``[T,H,W,3]`` as a video file in memory.

    ``quality`` is the constant rate factor (lower = better; 18 is visually lossless for
    x264). H and W must be even (4:2:0 chroma). ``options`` go to the codec as they are
    (e.g. ``{"g": "4"}``: a key frame every 4 frames).
    """
    if container not in CODECS:
        raise ValueError(f"container must be one of {sorted(CODECS)}, got {container!r}")
    frames = np.asarray(frames_THWC)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [T,H,W,3], got {frames.dtype} {frames.shape}")
    T, H, W, _ = frames.shape
    if T < 1 or H % 2 or W % 2:
        raise ValueError(f"need >= 1 frame of even height and width, got {frames.shape}")
    import av  # imported here: reading shards without video must not need it

    codec, pix_fmt = CODECS[container]
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska" if container == "mkv" else container) as out:
        stream = out.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = W, H, pix_fmt
        stream.options = {"crf": str(quality), **(options or {})}
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# Which frames


def clip_times(
    n: int,
    rate: float,
    frames: int,
    *,
    fps: float = 0.0,
    stride: int = 0,
    rng: random.Random | None = None,
) -> list[float]:
    """Times (s after the first frame) of the frames to take from a clip of ``n`` frames at
    ``rate`` frames/s: at most ``frames``, ascending (see the module docstring)."""
    if fps > 0:
        last = (n - 1) / rate  # time of the last frame
        slack = last - (frames - 1) / fps  # room to move a window of T frames
        start = (rng.uniform(0.0, slack) if rng else slack / 2) if slack > 0 else 0.0
        times = [start + k / fps for k in range(frames)]
        return [t for t in times if t <= last + 0.5 / rate]
    if stride > 0:
        slack = n - ((frames - 1) * stride + 1)
        start = (rng.randint(0, slack) if rng else slack // 2) if slack > 0 else 0
        return [i / rate for i in range(start, n, stride)[:frames]]
    return [i / rate for i in segment_indices(n, frames, rng)]


# --------------------------------------------------------------------------------------------
# Decoding


@dataclass
class DecodeStats:
    """What one :func:`decode_clip` call cost (tests and benchmarks read it)."""

    packets: int = 0  # demultiplexed
    decoded: int = 0  # frames out of the decoder
    seeks: int = 0


@dataclass(frozen=True)
class _Timing:
    start: int  # pts of the first frame (stream time base)
    time_base: Fraction
    rate: float  # frames per second
    duration: float  # seconds
    frames: int


def _duration_tag(stream: Any) -> float | None:
    """Matroska/WebM keep a track's duration in a ``DURATION`` tag (``HH:MM:SS.nnn``)."""
    m = re.fullmatch(r"(\d+):(\d\d):(\d\d(?:\.\d+)?)", stream.metadata.get("DURATION", ""))
    return int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]) if m else None


def _timing(container: Any, stream: Any) -> _Timing | None:
    """Frame rate, duration and frame count from the metadata; None when they are missing."""
    tb = stream.time_base
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    start = stream.start_time if stream.start_time is not None else 0
    if stream.duration:
        duration = float(stream.duration * tb)
    else:
        duration = _duration_tag(stream)
        if duration is None and container.duration:  # all streams: a last resort
            duration = container.duration / 1_000_000 - float(start * tb)
    if tb is None or not duration or duration <= 0:
        return None
    n = stream.frames
    if not rate:
        if not n:
            return None
        rate = n / duration
    if not n:
        n = max(round(duration * float(rate)), 1)
    return _Timing(start, tb, float(rate), duration, n)


def _scan(container: Any, stream: Any) -> _Timing:
    """Timing read off the packets, for a clip whose metadata lack it."""
    pts = [p.pts if p.pts is not None else p.dts for p in container.demux(stream) if p.size]
    pts = sorted(t for t in pts if t is not None)
    if not pts:
        raise ValueError("the video stream has no frames")
    tb = stream.time_base
    span = float((pts[-1] - pts[0]) * tb)
    rate = (len(pts) - 1) / span if span > 0 else 1.0
    return _Timing(pts[0], tb, rate, span + 1 / rate, len(pts))


def decode_clip(
    data: bytes,
    times: Callable[[int, float], list[float]],
    *,
    size: int,
    interpolation: str = "bicubic",
    threads: int = 1,
    max_side: int = 4096,
    max_duration_s: float = 3600.0,
    stats: DecodeStats | None = None,
) -> np.ndarray:
    """The frames of a clip at ``times(n_frames, rate)`` seconds, as uint8 ``[t,S,S,3]``.

    Frames are resized (short side to ``size`` = S) and centre-cropped. ``threads``: FFmpeg
    decoding threads (frame and slice threads); 0 = as many as it likes. Raises
    ``ValueError`` for a clip that cannot be read (see the module docstring).
    """
    import av  # here: reading shards without video must not need it

    stats = stats if stats is not None else DecodeStats()
    try:
        with av.open(io.BytesIO(data), metadata_errors="ignore") as container:
            if not container.streams.video:
                raise ValueError("no video stream")
            stream = container.streams.video[0]
            W, H = stream.codec_context.width, stream.codec_context.height
            if not 0 < max(W, H) <= max_side or min(W, H) < 1:
                raise ValueError(f"frame size {W}x{H} is not within 1..{max_side} (max_side)")
            timing = _timing(container, stream)
            if timing is None:
                timing = _scan(container, stream)
                container.seek(0, stream=stream)
            if timing.duration > max_duration_s:
                raise ValueError(
                    f"clip lasts {timing.duration:.0f} s, over max_duration_s={max_duration_s:g}"
                )
            wanted = times(timing.frames, timing.rate)
            if not wanted:
                raise ValueError("no frame to take")
            if threads != 1:
                stream.thread_type = "AUTO"
                stream.thread_count = threads
            return _decode_at(container, stream, timing, wanted, size, interpolation, stats)
    except av.FFmpegError as e:
        raise ValueError(f"cannot decode the clip: {e}") from None


@functools.cache
def _scaler(pid: int) -> Any:
    """Process ``pid``'s FFmpeg scaler: it keeps its set-up (filter tables) between frames of
    one shape, which ``frame.to_ndarray(width=...)`` rebuilds on every call (10× slower).
    One per process: a loader worker forked from a process that used one must not inherit
    it (its state belongs to the parent)."""
    from av.video.reformatter import VideoReformatter

    return VideoReformatter()


class _Frames:
    """The frames one :func:`_decode_at` call collects, and the decoder setting they call for.

    A target (pts t) takes the first frame with pts >= t - half a frame (the frame at t on a
    regular grid); frames are scaled (short side to ``size``) and centre-cropped as taken.
    """

    def __init__(
        self,
        stream: Any,
        timing: _Timing,
        wanted: Sequence[float],
        size: int,
        interpolation: str,
        stats: DecodeStats,
    ) -> None:
        tb = timing.time_base
        self.half = 0.5 / timing.rate / tb  # half a frame, in pts
        self.targets = [timing.start + t / tb for t in wanted]  # ascending
        W, H = stream.codec_context.width, stream.codec_context.height
        scale = size / min(W, H)
        self.w, self.h = max(size, round(W * scale)), max(size, round(H * scale))
        self.top, self.left = (self.h - size) // 2, (self.w - size) // 2
        self.size, self.interpolation = size, interpolation
        self.scaler = _scaler(os.getpid())
        self.stream, self.ctx, self.stats = stream, stream.codec_context, stats
        self.out: list[np.ndarray] = []
        # the last frame decoded and its pts (a clip may end before its metadata say)
        self.last: tuple[Any, Any] | None = None
        self.skip = ""  # the decoder's skip_frame setting now

    @property
    def done(self) -> bool:
        return len(self.out) == len(self.targets)

    def take(self, frame: Any) -> None:
        """``frame`` for every next target it is the frame of; kept as the last either way."""
        self.stats.decoded += 1
        out, targets, half, size = self.out, self.targets, self.half, self.size
        pts = frame.pts if frame.pts is not None else targets[len(out)]
        if targets[len(out)] <= pts + half:
            rgb = self.scaler.reformat(
                frame, width=self.w, height=self.h, format="rgb24",
                interpolation=_SWS[self.interpolation],
                threads=1,  # no scaler thread pool: small frames, and workers run in parallel
            ).to_ndarray()  # fmt: skip
            rgb = rgb[self.top : self.top + size, self.left : self.left + size]
            while len(out) < len(targets) and targets[len(out)] <= pts + half:
                out.append(rgb)
        self.last = (frame, pts)

    def feed(self, packet: Any) -> None:
        """Give ``packet`` to the decoder (None: drain it) and take what comes out."""
        if packet is not None and packet.pts is not None:
            # a frame no other frame refers to is decoded only if it is a target's
            i = bisect.bisect_left(self.targets, packet.pts - self.half)
            hit = i < len(self.targets) and self.targets[i] <= packet.pts + self.half
            mode = "DEFAULT" if hit else "NONREF"
            if mode != self.skip:
                self.ctx.skip_frame = self.skip = mode
        for frame in self.stream.decode(packet):
            if not self.done:
                self.take(frame)


def _decode_at(
    container: Any,
    stream: Any,
    timing: _Timing,
    wanted: Sequence[float],
    size: int,
    interpolation: str,
    stats: DecodeStats,
) -> np.ndarray:
    """Demultiplex in order; decode a group of pictures only from the packet that reaches
    a target; jump long gaps. A target (pts t) takes the first frame with pts >= t - half a
    frame (the frame at t on a regular grid)."""
    frames = _Frames(stream, timing, wanted, size, interpolation, stats)
    buf, fresh = _read_groups(container, stream, timing, frames)
    if not frames.done:  # end of stream: what the decoder still holds
        if fresh and buf:
            frames.ctx.flush_buffers()
        for q in buf:
            frames.feed(q)
        if buf or not fresh:
            frames.feed(None)
    if not frames.done:
        _stand_in_last(frames, timing)
    return np.stack(frames.out)


def _read_groups(
    container: Any, stream: Any, timing: _Timing, frames: _Frames
) -> tuple[list[Any], bool]:
    """Demultiplex until every target is taken or the stream ends, giving the decoder a group
    of pictures only from the packet that reaches a target, and seeking over long gaps.

    Returns the packets of the current group not yet given to the decoder and whether the
    decoder holds nothing of that group (``fresh``): at the end of the stream, what is left.
    """
    targets, half, stats = frames.targets, frames.half, frames.stats
    gap = _SEEK_GAP_S / timing.time_base
    packets = container.demux(stream)
    buf: list[Any] = []  # packets of the current group of pictures not given to the decoder
    fresh = True  # the decoder holds nothing of the current group
    fed = -math.inf  # highest pts given to the decoder in the current group
    can_seek, seeked_at = True, None
    while not frames.done:
        packet = next(packets, None)
        if packet is None:
            break
        pts = packet.pts if packet.pts is not None else packet.dts
        if not packet.size or pts is None:
            continue  # the demuxer's end-of-stream packet
        stats.packets += 1
        if seeked_at is not None:  # the first packet after a jump: did it move forward?
            if not packet.is_keyframe:
                continue  # decoding starts at a key frame
            can_seek, seeked_at = pts > seeked_at, None
        target = targets[len(frames.out)]
        if packet.is_keyframe:
            if not fresh and fed >= target - half:  # the target's frame may be in the decoder
                frames.feed(None)
                if frames.done:
                    break
                target = targets[len(frames.out)]
            buf, fresh, fed = [], True, -math.inf
        if fresh and can_seek and target - pts > gap:
            container.seek(int(target - half), stream=stream)
            packets = container.demux(stream)
            buf, seeked_at = [], pts
            stats.seeks += 1
            continue
        buf.append(packet)
        if max(fed, pts) >= target - half:
            if fresh:
                frames.ctx.flush_buffers()
                fresh = False
            for q in buf:
                fed = max(fed, q.pts if q.pts is not None else q.dts)
                frames.feed(q)
            buf = []
    return buf, fresh


def _stand_in_last(frames: _Frames, timing: _Timing) -> None:
    """A clip that ends a little before its metadata say: its last frame stands in for the
    targets past its end. One that ends well before (truncated) is refused."""
    if frames.last is None:
        raise ValueError("no frame could be decoded")
    frame, pts = frames.last
    tb = timing.time_base
    end = float((pts - timing.start) * tb)
    missing = float((frames.targets[-1] - pts) * tb)
    if missing > max(0.5, 0.1 * timing.duration):
        raise ValueError(
            f"the clip ends at {end:.2f} s, its metadata say {timing.duration:.2f} s (truncated?)"
        )
    frames.take(frame)
    frames.stats.decoded -= 1  # take counts a decoded frame; this one was counted already
    while not frames.done:
        frames.out.append(frames.out[-1])


# --------------------------------------------------------------------------------------------
# The plug-in


@MODALITIES.register("video")
class VideoData(Modality):
    """Clips (and images as 1-frame clips) → normalised ``frames`` + ``frames_mask``."""

    members: ClassVar[tuple[str, ...]] = VIDEO_MEMBERS + IMAGE_MEMBERS
    keys: ClassVar[tuple[str, ...]] = ("frames", "frames_mask")

    @dataclass
    class Config:
        type: str = "video"
        #: side of the square frames (declared by the video encoder)
        size: int = 0
        #: per-channel normalisation (declared by the video encoder)
        mean: list[float] = field(default_factory=list)
        std: list[float] = field(default_factory=list)
        #: frames per clip (T)
        frames: int = 8
        #: take frames at this rate (frames/s) instead of spreading them over the clip
        fps: float = 0.0
        #: take every ``stride``-th frame instead of spreading them over the clip
        stride: int = 0
        interpolation: str = "bicubic"
        #: training only: one random crop of this fraction range of the area per clip (same
        #: box on every frame), resized back to ``size``; [1, 1] = no crop
        crop_scale: list[float] = field(default_factory=lambda: [1.0, 1.0])
        #: read ``jpg``/``jpeg``/``png``/``webp`` members as 1-frame clips
        images: bool = True
        #: bad-input guards: a longer frame side or clip is skipped and counted
        max_side: int = 4096
        max_duration_s: float = 3600.0
        #: FFmpeg decoding threads per clip; 0 = 1 in a loader worker (workers already
        #: decode in parallel), FFmpeg's frame+slice threads on all cores in the main process
        threads: int = 0

    def __init__(self, cfg: Config, *, views: Sequence[str], context: DataContext) -> None:
        super().__init__(cfg, views=views, context=context)
        where = "data.modalities.video"
        check_pixel_settings(cfg, where, "video frame")
        if cfg.frames < 1:
            raise ValueError(f"{where}.frames must be >= 1, got {cfg.frames}")
        if cfg.fps < 0 or cfg.stride < 0 or (cfg.fps > 0 and cfg.stride > 0):
            raise ValueError(f"{where}: set fps (> 0) or stride (>= 1), not both")
        if cfg.max_side < 1 or cfg.max_duration_s <= 0 or cfg.threads < 0:
            raise ValueError(f"{where}: max_side, max_duration_s must be > 0, threads >= 0")
        self.extensions = VIDEO_MEMBERS + (IMAGE_MEMBERS if cfg.images else ())
        self.mean_C11 = torch.tensor(cfg.mean).view(3, 1, 1)
        self.std_C11 = torch.tensor(cfg.std).view(3, 1, 1)

    def _threads(self) -> int:
        if self.cfg.threads:
            return self.cfg.threads
        return 1 if torch.utils.data.get_worker_info() is not None else 0

    def read(self, sample: Sample, rng: random.Random | None) -> np.ndarray:
        """The chosen frames of the sample's clip (or image), uint8 ``[t,S,S,3]``."""
        ext = find_member(sample, self.extensions)
        if ext is None:
            raise ValueError(f"no video member (one of {self.extensions}); has {sorted(sample)}")
        c = self.cfg
        if ext not in VIDEO_MEMBERS:
            return _read_image(sample[ext], ext, c.size, c.interpolation, c.max_side)[None]

        def times(n: int, rate: float) -> list[float]:
            return clip_times(n, rate, c.frames, fps=c.fps, stride=c.stride, rng=rng)

        try:
            return decode_clip(
                sample[ext], times, size=c.size, interpolation=c.interpolation,
                threads=self._threads(), max_side=c.max_side, max_duration_s=c.max_duration_s,
            )  # fmt: skip
        except ValueError as e:
            raise ValueError(f"{ext}: {e}") from None

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        x_THWC = torch.from_numpy(self.read(sample, rng))
        return {
            self.prefix(self.views[0]) + "frames": normalise(x_THWC, self.mean_C11, self.std_C11)
        }

    def augment(self, item: Sample, rng: random.Random) -> Sample:
        if self.cfg.crop_scale[0] < 1.0:
            key = self.prefix(self.views[0]) + "frames"
            item[key] = random_resized_crop(
                item[key], self.cfg.crop_scale, self.cfg.interpolation, rng
            )
        return item

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        p = self.prefix(self.views[0])
        clips = [s[p + "frames"] for s in samples]
        lengths = torch.tensor([len(x) for x in clips])
        T = int(lengths.max())
        frames_BTCHW = torch.zeros(len(clips), T, *clips[0].shape[1:])
        for i, x_TCHW in enumerate(clips):
            frames_BTCHW[i, : len(x_TCHW)] = x_TCHW
        mask_BT = torch.arange(T)[None, :] < lengths[:, None]
        return {p + "frames": frames_BTCHW, p + "frames_mask": mask_BT}

    @classmethod
    def preview(cls, sample: Sample, size: int) -> Image.Image | None:
        """The clip's middle frame (short side to ``size``, centre crop); images are left to
        the image plug-in."""
        ext = find_member(sample, VIDEO_MEMBERS)
        if ext is None:
            return None
        try:
            (frame_HWC,) = decode_clip(
                sample[ext], lambda n, rate: clip_times(n, rate, 1), size=size
            )
        except ValueError as e:
            raise ValueError(f"{ext}: {e}") from None
        return Image.fromarray(frame_HWC)


def _read_image(data: bytes, ext: str, size: int, interpolation: str, max_side: int) -> np.ndarray:
    """An image member as one frame: short side to ``size``, centre crop, uint8 ``[S,S,3]``."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            W, H = img.size
            if not 0 < max(W, H) <= max_side:
                raise ValueError(f"image size {W}x{H} is not within 1..{max_side} (max_side)")
            img.load()  # decode now, so a truncated file fails here
            rgb = img.convert("RGB")
    except (OSError, Image.DecompressionBombError) as e:
        raise ValueError(f"{ext}: cannot decode the image: {e}") from None
    scale = size / min(W, H)
    w, h = max(size, round(W * scale)), max(size, round(H * scale))
    top, left = (h - size) // 2, (w - size) // 2
    if (w, h) != (W, H):
        rgb = rgb.resize((w, h), RESAMPLE[interpolation])
    return np.array(rgb)[top : top + size, left : left + size]


__all__ = [
    "CODECS",
    "VIDEO_MEMBERS",
    "DecodeStats",
    "VideoData",
    "clip_times",
    "decode_clip",
    "encode_video",
    "segment_indices",
]
