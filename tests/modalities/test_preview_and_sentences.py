"""What a search index reads of a raw sample through the plug-ins: every sentence with its
language (`every_segment`) and a picture (`Modality.preview`)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from mmptm.modalities.base import Modality
from mmptm.modalities.image import ImageData
from mmptm.modalities.sentences import every_segment
from mmptm.modalities.video import VideoData, encode_video


def _texts(sample, meta=None, field="captions"):
    return [(s.lang, s.text) for s in every_segment(sample, meta or {}, field)]


def test_every_segment_by_sample_format():
    captions = {"en": "A red circle.", "de": ["Ein roter Kreis.", "Ein Kreis, rot."]}
    assert _texts({"txt": b"ignored"}, {"captions": captions}) == [
        ("en", "A red circle."), ("de", "Ein roter Kreis."), ("de", "Ein Kreis, rot."),
    ]  # fmt: skip
    pair = {"languages": ["en", "fr"], "texts": ["a cat", "un chat"]}
    assert _texts({}, pair) == [("en", "a cat"), ("fr", "un chat")]  # stored order
    nli = {"premise": "p", "hypothesis": "h", "language": "es", "label": "neutral"}
    assert _texts({}, nli) == [("es", "p"), ("es", "h")]
    assert _texts({"txt": b"Hallo"}, {"language": "de"}) == [("de", "Hallo")]
    assert _texts({"txt": b"no language"}) == [("", "no language")]
    assert _texts({"jpg": b"..."}) == []  # nothing to read: no error
    # another captions field (toyworld video's reversed captions)
    assert _texts({}, {"reversed_captions": {"en": "backwards"}}, "reversed_captions") == [
        ("en", "backwards")
    ]
    with pytest.raises(ValueError, match="not a string"):
        every_segment({}, {"captions": {"en": 3}})


def _jpeg(w: int, h: int) -> bytes:
    x = np.zeros((h, w, 3), np.uint8)
    x[:, : w // 2] = (255, 0, 0)  # left half red, right half blue
    x[:, w // 2 :] = (0, 0, 255)
    buf = io.BytesIO()
    Image.fromarray(x).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def test_image_preview_keeps_the_aspect_and_the_picture():
    picture = ImageData.preview({"jpg": _jpeg(300, 150)}, 128)
    assert picture.size == (128, 64) and picture.mode == "RGB"
    left, right = np.asarray(picture)[32, 10], np.asarray(picture)[32, 117]
    assert left[0] > 200 > left[2] and right[2] > 200 > right[0]
    assert ImageData.preview({"txt": b"x"}, 128) is None
    assert Modality.preview({"jpg": _jpeg(8, 8)}, 128) is None  # plug-ins show nothing by default
    with pytest.raises(ValueError, match="cannot decode the image"):
        ImageData.preview({"png": b"not a png"}, 64)


def test_video_preview_is_the_middle_frame():
    frames = np.zeros((9, 32, 48, 3), np.uint8)
    frames[4] = 255  # only the middle frame is white
    picture = VideoData.preview({"mp4": encode_video(frames, fps=8)}, 16)
    assert picture.size == (16, 16)
    assert np.asarray(picture).mean() > 200
    assert VideoData.preview({"jpg": _jpeg(8, 8)}, 16) is None  # images: the image plug-in's


def test_decoder_record_rides_along_with_the_batch():
    from mmptm.batch import RECORD
    from mmptm.data.decode import Collate, Decoder

    def record(sample, meta):
        return {"key": sample["__key__"], "n": meta["n"]}

    samples = [{"__key__": f"s{i}", "json": json.dumps({"n": i}).encode()} for i in range(3)]
    decoder = Decoder([], train=False, record=record)
    batch = Collate([])([decoder(s) for s in samples])
    assert batch[RECORD] == [{"key": "s0", "n": 0}, {"key": "s1", "n": 1}, {"key": "s2", "n": 2}]
    assert RECORD not in Collate([])([Decoder([], train=False)(s) for s in samples])
