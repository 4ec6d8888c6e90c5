"""Real image–text pairs from two Debian packages: emoji pictures and their CLDR names.

- pictures: ``fonts-noto-color-emoji`` (Noto Color Emoji, SIL Open Font License 1.1): every
  emoji the font draws as one colour glyph, rendered with Pillow (``embedded_color=True``;
  the font's CBDT bitmaps are 109 px a side) on white, cropped to the glyph and padded square;
- captions: ``unicode-cldr-core`` (CLDR 41, Unicode licence, SPDX Unicode-DFS-2016):
  ``common/annotations/<lang>.xml`` and ``common/annotationsDerived/<lang>.xml`` give each
  emoji a short name written by people (``type="tts"``: "grinning face", "flag: Germany",
  "woman firefighter") and keywords ("face | grin"), translated into many languages.

An item is one emoji: its picture and, per language, two captions, the name and the name
followed by its keywords ("grinning face: face, grin"). The 5 skin-tone variants that
CLDR derives for ~400 emoji (2,000 entries whose pictures differ only in colour and
whose names add ": medium skin tone") are left out unless asked for; with them, an emoji and
its variants are one group and go to the same split. The test split shares no picture and
no name (in any language) with training: a test item whose name in some language is also a
training item's name moves to training.
"""

from __future__ import annotations

import hashlib
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

FONT = Path("/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf")
CLDR = Path("/usr/share/unicode/cldr/common")
PACKAGES = {"fonts-noto-color-emoji": FONT, "unicode-cldr-core": CLDR}
LICENCES = {
    "fonts-noto-color-emoji": "SIL Open Font License 1.1 (Noto Color Emoji)",
    "unicode-cldr-core": "Unicode License (Unicode-DFS-2016), CLDR annotations",
}
#: the only size of the font's colour bitmaps (CBDT strike); other sizes fail to load
STRIKE_PX = 109
SKIN_TONES = {chr(c) for c in range(0x1F3FB, 0x1F400)}
#: CLDR's marker for "same as the parent locale"
INHERIT = "↑↑↑"


def missing_packages() -> list[str]:
    """The Debian packages whose files are absent (``apt-get install`` them)."""
    return [name for name, path in PACKAGES.items() if not path.exists()]


def read_annotations(cldr: Path, lang: str) -> dict[str, dict[str, object]]:
    """``{emoji: {"name": tts, "keywords": [...]}}`` of one language (annotations and the
    derived ones: sequences, flags, keycaps, skin tones). Emoji lacking a name are left out."""
    out: dict[str, dict[str, object]] = {}
    for sub in ("annotations", "annotationsDerived"):
        path = cldr / sub / f"{lang}.xml"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no CLDR annotations for language {lang!r}")
        for node in ET.parse(path).getroot().iter("annotation"):
            cp, text = node.get("cp"), (node.text or "").strip()
            if not cp or not text or text == INHERIT:
                continue
            entry = out.setdefault(cp, {"name": "", "keywords": []})
            if node.get("type") == "tts":
                entry["name"] = text
            else:
                entry["keywords"] = [k.strip() for k in text.split("|") if k.strip()]
    return {cp: e for cp, e in out.items() if e["name"]}


class Renderer:
    """Draws one emoji as a square RGB picture, or says it is not one colour glyph."""

    def __init__(self, font: Path = FONT, size: int = 96) -> None:
        self.font = ImageFont.truetype(str(font), STRIKE_PX)
        self.size = size
        self.advance = self.font.getlength("\U0001f600")

    def __call__(self, emoji: str) -> Image.Image | None:
        # a sequence the font has no ligature for lays out as several glyphs (wider)
        if abs(self.font.getlength(emoji) - self.advance) > 1:
            return None
        w = int(self.advance) + 8
        canvas = Image.new("RGB", (w, w), "white")
        ImageDraw.Draw(canvas).text((4, 4), emoji, font=self.font, embedded_color=True)
        ink = Image.eval(canvas.convert("L"), lambda v: 255 if v < 250 else 0)
        box = ink.getbbox()
        # no ink: a code point the font lacks; little ink: a plain digit or sign, no picture
        if box is None or sum(ink.histogram()[255:]) < 0.08 * w * w:
            return None
        glyph = canvas.crop(box)
        side = max(glyph.size) + 4
        square = Image.new("RGB", (side, side), "white")
        square.paste(glyph, ((side - glyph.width) // 2, (side - glyph.height) // 2))
        return square.resize((self.size, self.size), Image.Resampling.LANCZOS)


def group_of(emoji: str) -> str:
    """The emoji without skin-tone modifiers: its variants share one group (and split)."""
    return "".join(c for c in emoji if c not in SKIN_TONES)


def collect_items(
    langs: Sequence[str], *, skin_tones: bool = False, cldr: Path = CLDR
) -> list[dict[str, object]]:
    """Every emoji named in all ``langs`` (the first is the reference), in CLDR's order:
    ``{"emoji", "group", "captions": {lang: [name, "name: kw1, kw2"]}}``."""
    tables = {lang: read_annotations(cldr, lang) for lang in langs}
    items = []
    for emoji in tables[langs[0]]:
        if not skin_tones and any(c in SKIN_TONES for c in emoji):
            continue
        if not all(emoji in t for t in tables.values()):
            continue
        captions = {}
        for lang, table in tables.items():
            name, kws = table[emoji]["name"], table[emoji]["keywords"]
            # a keyword that is words of the name adds nothing ("flag" of "flag: Germany")
            held = set(re.findall(r"\w+", str(name).casefold()))
            extra = [k for k in kws if not set(re.findall(r"\w+", k.casefold())) <= held]
            captions[lang] = [name, f"{name}: {', '.join(extra)}" if extra else name]
        items.append({"emoji": emoji, "group": group_of(emoji), "captions": captions})
    return items


def _draw(group: str, seed: int) -> float:
    """A seeded uniform draw in [0, 1) per group (stable across Python runs)."""
    digest = hashlib.sha256(f"{seed}:{group}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _names(items: Iterable[dict]) -> set[tuple[str, str]]:
    return {(lang, c[0].casefold()) for it in items for lang, c in it["captions"].items()}


def split_items(
    items: Iterable[dict[str, object]], val_fraction: float, test_fraction: float, seed: int
) -> tuple[dict[str, list[dict]], int]:
    """({"train", "val", "test"}, moved): a seeded draw per group picks its split; a held-out
    item that shares a name (any language, case-folded) with an item of an earlier split
    (train, then val) moves to training."""
    parts: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for it in items:
        u = _draw(str(it["group"]), seed)
        split = (
            "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"
        )
        parts[split].append(it)
    moved = 0
    for split in ("val", "test"):
        seen = _names(parts["train"]) | (_names(parts["val"]) if split == "test" else set())
        keep = []
        for it in parts[split]:
            shared = any((lang, c[0].casefold()) in seen for lang, c in it["captions"].items())
            (parts["train"] if shared else keep).append(it)
            moved += shared
        parts[split] = keep
    return parts, moved


def karpathy_json(
    parts: dict[str, list[dict]], render: Renderer, image_dir: Path, lang: str
) -> tuple[dict, int]:
    """Karpathy's dataset JSON (``mmptm data karpathy`` reads it) over the pictures written
    to ``image_dir`` (``<index>.png``), and how many emoji the font did not draw."""
    image_dir.mkdir(parents=True, exist_ok=True)
    images, skipped = [], 0
    for split, part in parts.items():
        for it in part:
            picture = render(str(it["emoji"]))
            if picture is None:
                skipped += 1
                continue
            i = len(images)
            picture.save(image_dir / f"{i}.png")
            sentences = [
                {"raw": c, "sentid": 2 * i + j} for j, c in enumerate(it["captions"][lang])
            ]
            images.append(
                {
                    "filename": f"{i}.png",
                    "imgid": i,
                    "split": split,
                    "sentences": sentences,
                    "emoji": it["emoji"],
                }
            )
    return {"images": images, "dataset": "noto-emoji-cldr"}, skipped


def multilingual_records(dataset: dict, items: Sequence[dict]) -> list[dict]:
    """Per drawn picture, its json with the captions of every language (same keys as the
    Karpathy shards: the file stem)."""
    by_emoji = {it["emoji"]: it for it in items}
    out = []
    for img in dataset["images"]:
        it = by_emoji[img["emoji"]]
        out.append(
            {"key": Path(img["filename"]).stem, "file_name": img["filename"],
             "split": img["split"], "emoji": img["emoji"], "captions": it["captions"]}
        )  # fmt: skip
    return out


def write_manifest(path: Path, info: dict) -> None:
    """Sources, licences and counts beside the data."""
    path.write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
