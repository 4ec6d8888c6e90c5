"""A fake search index for the tests of ``mmptm serve``'s HTTP layer (tests/search/): it
implements SearchIndex's interface with its refusals (ValueError, KeyError), over three
single-colour images with captions in en and de."""

from __future__ import annotations

import io
import struct
import time
import zlib

from PIL import Image

from mmptm.search.index import Hit

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}
#: the test client's base URL: a Host the app answers by default
LOCAL = "http://localhost"


def jpeg(rgb: tuple[int, int, int], size: int = 24, fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), rgb).save(buf, fmt)
    return buf.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A 1×1 PNG whose header says ``width``×``height`` (PIL reads only the header to size it)."""
    png = jpeg((0, 0, 0), size=1, fmt="PNG")
    assert png[12:16] == b"IHDR"
    ihdr = png[12:16] + struct.pack(">II", width, height) + png[24:29]
    return png[:8] + png[8:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]


class FakeIndex:
    """Three single-colour images with captions in en and de; a text query scores each item
    by the words it shares with its caption, an image query by the colour distance."""

    #: the model's image input: uploads past 2·3·8 pixels a side are shrunk before searching
    image_size = 8

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.captions = {
            c: {"en": f"a {c} square", "de": f"ein {d} Quadrat"}
            for c, d in zip(COLOURS, ("rotes", "grünes", "blaues"))
        }
        self.info = {  # the shape of SearchIndex.info
            "checkpoint": "runs/fake/ckpt.pt", "languages": ["de", "en"], "items": 3, "dim": 8,
            "sides": {"image": {"partner": "text", "text": False, "n": 3, "languages": []},
                      "text": {"partner": "image", "text": True, "n": 6,
                               "languages": ["de", "en"]}},
            "counts": {"items": 3, "image": 3, "text": 6}, "options": {"type": "flat"},
        }  # fmt: skip

    def _hits(self, scores: dict[str, float], k: int, side: str, lang: str | None) -> list[Hit]:
        lang = self._lang(lang)
        ranked = sorted(scores, key=lambda key: -scores[key])[:k]
        return [Hit(key, scores[key], r, side, self.captions[key][lang], lang, True)
                for r, key in enumerate(ranked, 1)]  # fmt: skip

    def _lang(self, lang: str | None) -> str:
        if lang not in (None, "en", "de"):
            raise ValueError(f"unknown language {lang!r}: the index has en, de")
        return lang or "en"

    def _side(self, side: str | None, default: str) -> str:
        if side not in (None, "image", "text"):
            raise ValueError(f"unknown side {side!r}: the index has image, text")
        return side or default

    def search_text(self, query, k=10, *, lang=None, side=None, rerank_k=0, query_lang=None):
        time.sleep(self.delay)
        if not query.strip():
            raise ValueError("empty query")
        if len(query) > 1000:
            raise ValueError(f"query too long: {len(query)} characters, the limit is 1000")
        if rerank_k:
            raise ValueError("rerank_k: the model has no itm head")
        if query_lang is not None:
            self._lang(query_lang)
        words = set(query.lower().split())
        scores = {c: len(words & set(cap["en"].split())) / 3 for c, cap in self.captions.items()}
        return self._hits(scores, k, self._side(side, "image"), lang)

    def search_image(self, image, k=10, *, side=None, lang=None):
        try:
            rgb = Image.open(io.BytesIO(image)).convert("RGB").getpixel((0, 0))
        except Exception:
            raise ValueError("not a decodable image") from None
        scores = {c: -sum(abs(a - b) for a, b in zip(rgb, v)) / 765 for c, v in COLOURS.items()}
        return self._hits(scores, k, self._side(side, "text"), lang)

    def search_key(self, key, k=10, *, side=None, lang=None):
        item = self.item(key)
        scores = {c: -sum(abs(a - b) for a, b in zip(COLOURS[key], COLOURS[c])) / 765
                  for c in COLOURS if c != key}  # fmt: skip
        return self._hits(scores, k, self._side(side, "image"), lang or item["languages"][0])

    def thumbnail(self, key):
        return jpeg(COLOURS[self.item(key)["key"]])

    def item(self, key):
        if key not in COLOURS:
            raise KeyError(f"no item {key!r} in the index")
        return {"key": key, "captions": self.captions[key], "languages": ["en", "de"]}
