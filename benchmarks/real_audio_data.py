"""Recorded drum sounds from Debian's ``hydrogen-drumkits``: one clip per sample file, labelled
by instrument, in kit-held-out folds (``benchmarks/real_audio.py prepare`` calls this).

The package ships 14 Hydrogen drum kits (``usr/share/hydrogen/data/drumkits/<kit>/``), each a
``drumkit.xml`` naming its instruments and, per instrument, the sample files of its velocity
layers (wav, flac, aiff recorded or synthesised by the kit's author). An instrument's name
gives the class through :data:`RULES` (kick, snare, hi-hat, tom, cymbal, clap; anything else —
cowbell, djembe, shaker, loops — is dropped and counted). A file whose bytes occur twice is
kept once. Kits go into folds whole, and kits by one author (who reuse recordings) go into
the same fold, so a test fold holds no kit — and no author — seen in training. The folds are
written in ESC-50's layout (``meta/esc50.csv`` + ``audio/``), which ``mmptm data esc50``
turns into ``fold<k>/*.tar`` shards and ``labels.txt``. Licences are per kit (the package's
DEP-5 copyright file; the kit's own ``<license>`` line beside it).
"""

from __future__ import annotations

import csv
import hashlib
import re
import shutil
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "hydrogen-drumkits"
KITS_DIR = Path("usr/share/hydrogen/data/drumkits")
CLASSES = ("kick", "snare", "hihat", "tom", "cymbal", "clap")
#: (class, pattern on the lower-cased instrument name), first match wins: "Snare Rimshot"
#: is a snare, "Sabian Hat Open" a hi-hat before its maker makes it a cymbal
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("kick", re.compile(r"kick|bass ?drum|\bbd\b")),
    ("snare", re.compile(r"snare")),
    ("hihat", re.compile(r"\bhh\b|hi-?hat|\bhat\b|hihat")),
    ("tom", re.compile(r"\btom")),
    ("clap", re.compile(r"clap")),
    ("cymbal", re.compile(r"crash|ride|splash|china|cymbal|paiste|sabian|zildjian")),
)
AUDIO_EXTS = (".wav", ".flac", ".aiff", ".aif")


def instrument_class(name: str) -> str | None:
    """The class of an instrument name, or None when no rule matches."""
    low = name.lower()
    for cls, pattern in RULES:
        if pattern.search(low):
            return cls
    return None


def author_key(author: str) -> str:
    """Who made a kit, folded so that one author's spellings agree: the first word of letters
    ("emillo.net", "Emillo <emillo@…>" → "emillo")."""
    words = re.findall(r"[a-z]+", author.lower())
    return words[0] if words else "(unknown)"


@dataclass
class Sample:
    """One sample file of a kit: where it is, the instrument naming it, the class."""

    path: Path
    instrument: str
    label: str


@dataclass
class Kit:
    """One Hydrogen kit: folder name, author, its own licence line, its labelled samples."""

    name: str
    author: str
    licence: str
    samples: list[Sample] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)


def _text(elem: ET.Element, tag: str) -> str:
    """The text of the first child ``tag`` whatever its namespace ("" when none)."""
    for child in elem:
        if child.tag.rsplit("}", 1)[-1] == tag:
            return (child.text or "").strip()
    return ""


def _children(elem: ET.Element, tag: str) -> list[ET.Element]:
    return [c for c in elem.iter() if c.tag.rsplit("}", 1)[-1] == tag]


def read_kit(folder: Path) -> Kit:
    """A kit from its ``drumkit.xml``: each instrument's layers' files with the class of its
    name. Files the XML names but the folder lacks are dropped as ``missing file``."""
    xml = folder / "drumkit.xml"
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ValueError(f"{xml}: not a readable drumkit.xml ({exc})") from None
    kit = Kit(folder.name, _text(root, "author"), _text(root, "license"))
    for inst in _children(root, "instrument"):
        name = _text(inst, "name")
        files = [f.text.strip() for f in _children(inst, "filename") if f.text and f.text.strip()]
        label = instrument_class(name)
        for file in files:
            path = folder / file
            if label is None:
                kit.dropped["instrument of no class"] += 1
            elif not path.is_file() or path.suffix.lower() not in AUDIO_EXTS:
                kit.dropped["missing file"] += 1
            else:
                kit.samples.append(Sample(path, name, label))
    return kit


def read_kits(root: Path) -> list[Kit]:
    """Every kit under ``root`` (folders with a ``drumkit.xml``), in name order."""
    return [read_kit(p.parent) for p in sorted(root.glob("*/drumkit.xml"))]


def dedupe(kits: Sequence[Kit]) -> Counter:
    """Keep the first occurrence of each file's bytes (kits in order); returns what went."""
    seen: set[str] = set()
    dropped: Counter = Counter()
    for kit in kits:
        kept = []
        for s in kit.samples:
            digest = hashlib.sha1(s.path.read_bytes()).hexdigest()
            if digest in seen:
                dropped["duplicate bytes"] += 1
                continue
            seen.add(digest)
            kept.append(s)
        kit.samples = kept
    return dropped


def assign_folds(kits: Sequence[Kit], k: int) -> dict[str, int]:
    """Kit name → fold 1..k: kits grouped by author, groups placed largest first into the
    fold with the fewest samples so far (deterministic: ties go to the lower fold)."""
    if k < 2:
        raise ValueError(f"need at least 2 folds, got {k}")
    groups: dict[str, list[Kit]] = defaultdict(list)
    for kit in kits:
        if kit.samples:
            groups[author_key(kit.author)].append(kit)
    if len(groups) < k:
        raise ValueError(f"{len(groups)} kit authors cannot fill {k} folds")
    sizes = [0] * k
    folds: dict[str, int] = {}
    order = sorted(groups.items(), key=lambda g: (-sum(len(x.samples) for x in g[1]), g[0]))
    for _, members in order:
        fold = min(range(k), key=lambda i: (sizes[i], i))
        for kit in members:
            folds[kit.name] = fold + 1
            sizes[fold] += len(kit.samples)
    return folds


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "_"


def write_esc50(kits: Sequence[Kit], folds: dict[str, int], out: Path) -> dict[str, int]:
    """ESC-50's layout under ``out``: ``audio/<kit>__<file>`` (aiff converted to wav, as the
    audio reader decodes wav/flac with soundfile) and ``meta/esc50.csv`` (filename, fold,
    target, category, src_file = kit, take = instrument). Returns clips per fold."""
    import soundfile as sf

    audio, meta = out / "audio", out / "meta"
    audio.mkdir(parents=True, exist_ok=True)
    meta.mkdir(parents=True, exist_ok=True)
    per_fold: Counter = Counter()
    rows = []
    for kit in kits:
        for s in kit.samples:
            name = f"{_slug(kit.name)}__{_slug(s.path.stem)}"
            if s.path.suffix.lower() in (".aiff", ".aif"):
                name += ".wav"
                if not (audio / name).exists():
                    wave, rate = sf.read(s.path, always_2d=True)
                    sf.write(audio / name, wave, rate, subtype="PCM_16")
            else:
                name += s.path.suffix.lower()
                if not (audio / name).exists():
                    shutil.copyfile(s.path, audio / name)
            target = CLASSES.index(s.label)
            rows.append([name, folds[kit.name], target, s.label, kit.name, s.instrument])
            per_fold[folds[kit.name]] += 1
    with open(meta / "esc50.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["filename", "fold", "target", "category", "src_file", "take"])
        w.writerows(rows)
    return dict(sorted(per_fold.items()))


def summary(kits: Sequence[Kit], folds: dict[str, int]) -> list[dict[str, object]]:
    """Per kit: fold, author, licence line, clips per class, dropped counts."""
    return [
        {
            "kit": kit.name,
            "fold": folds.get(kit.name, 0),
            "author": kit.author,
            "licence": kit.licence or "(see the package's copyright file)",
            "clips": dict(Counter(s.label for s in kit.samples)),
            "dropped": dict(kit.dropped),
        }
        for kit in kits
    ]
