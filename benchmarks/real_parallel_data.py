"""Real parallel text from Debian's gettext catalogs: English UI and help sentences paired
with their human translations (``benchmarks/real_parallel.py prepare`` calls this).

Debian packages ship compiled message catalogs (``.mo``) that map each English source string
(msgid) to its translation (msgstr). This module fetches a fixed list of packages with
``apt-get download`` (no installation, no root needed beyond apt's own), unpacks them with
``dpkg-deb -x``, reads every catalog of the wanted languages, keeps sentence-like strings
(enough words, no format specifiers, markup, accelerators or paths), and splits by English
sentence into train and test with no near-duplicate across the split: English sentences
whose word sets overlap (Jaccard >= ``NEAR``) form one cluster, a test sentence is the only
one of its cluster in the test set and its whole cluster stays out of training. A
translation that occurs in the test set is kept out of the training text too.
Licences come from each package's ``/usr/share/doc/<pkg>/copyright``.
"""

from __future__ import annotations

import gettext
import hashlib
import json
import random
import re
import shutil
import subprocess
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: packages whose catalogs are read, by language ({lang} is filled in). LibreOffice's UI
#: (tooltips, dialog help, function descriptions) gives most of the sentences; GNU and
#: Debian tools add messages and help texts in the other domains.
PACKAGES: tuple[str, ...] = (
    "libreoffice-l10n-{lang}",
    # GNU and Debian tools
    "coreutils", "git", "gnupg-l10n", "libc-l10n", "dpkg", "libdpkg-perl", "apt",
    "libapt-pkg6.0", "bash", "tar", "wget", "diffutils", "findutils", "grep", "sed", "make",
    "gettext", "binutils-common", "procps", "login", "psmisc", "cpio", "krb5-locales",
    # desktop libraries and applications
    "libglib2.0-data", "libgtk-3-common", "system-config-printer-common",
    "gsettings-desktop-schemas", "appstream", "shared-mime-info", "gimp", "inkscape",
    "digikam-data", "vlc-l10n", "gnucash-common", "gramps", "evolution-common",
    "gnumeric-common", "audacity-data", "kdenlive-data", "pidgin-data", "filezilla-common",
    "gnome-control-center-data", "geany-common", "nautilus-data", "rhythmbox-data",
    "synaptic",
)  # fmt: skip

#: LibreOffice's placeholder for its own name, in English and translations alike
PRODUCT = "%PRODUCTNAME"
#: English strings whose word sets overlap at least this much are near duplicates
NEAR = 0.5
_FORMAT = re.compile(
    r"%[-+ #0-9.*lhzjtLqI']*[a-zA-Z%]|%\(\w+\)|\{[^}]*\}|\$[({\w]|<[^>]*>|&\w+;|\\[ntr]"
    r"|[\t\n\r]|https?:|www\.|\S+/\S+|\S+\.(?:[ch]|py|txt|so|conf|exe|png|xml|html?)\b"
    r"|(?<![\w-])--?\w|_\w|~\w|&\w|\w_\w|`|''|\[[^\]]*\]|\|"
)
_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*")
_CYRILLIC = re.compile(r"[\u0400-\u04FF]")
_LATIN = re.compile(r"[A-Za-zÀ-ÿ]")


def is_sentence(text: str, min_words: int = 4, max_words: int = 30) -> bool:
    """A natural-language string: ``min_words``..``max_words`` words, mostly letters, no
    format specifier, markup, accelerator, option, path or file name."""
    if _FORMAT.search(text) or text != text.strip() or "  " in text:
        return False
    words = _WORD.findall(text)
    if not min_words <= len(words) <= max_words:
        return False
    letters = sum(c.isalpha() for c in text)
    return letters >= 0.75 * len(text.replace(" ", ""))


def script_ok(text: str, lang: str) -> bool:
    """Russian must be written in Cyrillic, the others in Latin letters."""
    if lang == "ru":
        return len(_CYRILLIC.findall(text)) >= 0.5 * sum(c.isalpha() for c in text)
    return not _CYRILLIC.search(text) and bool(_LATIN.search(text))


def normalise(text: str) -> str:
    """Case, accents and punctuation folded: the identity under which strings are duplicates."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_WORD.findall(text))


def read_catalog(path: Path) -> Iterable[tuple[str, str]]:
    """(English msgid, translation) of a compiled catalog; contexts dropped, plural forms and
    untranslated entries skipped."""
    with open(path, "rb") as f:
        catalog = gettext.GNUTranslations(f)._catalog  # the parsed table
    for key, value in catalog.items():
        if not isinstance(key, str) or not key or not value:
            continue  # plural forms are (msgid, n) keys; "" is the header
        en = key.split("\x04", 1)[-1]
        if en.endswith("\n") and value.endswith("\n"):  # a message's closing newline
            en, value = en[:-1], value[:-1]
        yield en.replace(PRODUCT, "LibreOffice"), value.replace(PRODUCT, "LibreOffice")


# -- fetching -----------------------------------------------------------------------------


@dataclass
class Package:
    """One unpacked Debian package: name, version, licences, and its catalogs per language."""

    name: str
    version: str
    licences: list[str]
    catalogs: dict[str, list[Path]] = field(default_factory=dict)


def fetch(name: str, debs: Path, root: Path) -> tuple[str, Path]:
    """Download ``name``'s .deb into ``debs`` (once) and unpack it under ``root/name``."""
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{name}_*.deb"))
    if not found:
        cmd = ["apt-get", "download", name]
        run = subprocess.run(cmd, cwd=debs, capture_output=True, text=True)
        found = sorted(debs.glob(f"{name}_*.deb"))
        if run.returncode != 0 or not found:
            raise OSError(
                f"apt-get download {name} failed ({run.stderr.strip()[-300:]}); "
                "run `apt-get update` first, or drop the package from --packages"
            )
    deb = found[-1]
    version = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dest = root / name
    if not dest.exists():  # unpacked apart, then renamed: a killed run leaves no half tree
        part = dest.with_name(dest.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(part)], check=True)
        part.rename(dest)
    return version, dest


def licences(copyright_file: Path) -> list[str]:
    """The licence names a DEP-5 copyright file lists (``License:`` lines), in order."""
    if not copyright_file.exists():
        return ["(no copyright file)"]
    text = copyright_file.read_text(errors="replace")
    names = re.findall(r"^License:\s*(.+)$", text, re.M)
    if not names:  # a free-form file: the licences it names in prose
        prose = r"GNU (?:Lesser |Library )?General Public License|GNU Free Documentation License"
        names = re.findall(prose, text)
    return list(dict.fromkeys(n.strip() for n in names)) or ["(see copyright file)"]


def catalogs(root: Path, lang: str) -> list[Path]:
    """Every compiled catalog of ``lang`` under an unpacked package (system and LibreOffice)."""
    return sorted(
        p
        for p in root.rglob("*.mo")
        if p.parent.name == "LC_MESSAGES" and p.parent.parent.name == lang
    )


def fetch_all(packages: Sequence[str], langs: Sequence[str], work: Path) -> list[Package]:
    """Download and unpack the packages (``{lang}`` in a name: one per language)."""
    out: list[Package] = []
    for spec in packages:
        names = sorted({spec.format(lang=lang) for lang in langs})
        for name in names:
            version, root = fetch(name, work / "debs", work / "unpacked")
            pkg = Package(name, version, licences(root / "usr/share/doc" / name / "copyright"))
            pkg.catalogs = {lang: catalogs(root, lang) for lang in langs}
            out.append(pkg)
    return out


# -- pairs and the split ------------------------------------------------------------------


def collect(
    packages: Sequence[Package], langs: Sequence[str]
) -> tuple[dict[str, dict[str, str]], dict[str, str], Counter]:
    """Sentence pairs ``{english: {lang: translation}}``, the package each English sentence
    was first seen in, and counts of what was dropped.

    English duplicates (after :func:`normalise`) collapse to one entry; where packages
    translate it differently, the most frequent translation wins (ties: the first seen).
    """
    votes: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    english: dict[str, str] = {}  # normalised → first English spelling
    origin: dict[str, str] = {}
    dropped: Counter = Counter()
    for pkg in packages:
        for lang in langs:
            for path in pkg.catalogs.get(lang, []):
                for en, tr in read_catalog(path):
                    if not is_sentence(en):
                        dropped["english not a sentence"] += 1
                        continue
                    if not is_sentence(tr, min_words=2, max_words=45) or not script_ok(tr, lang):
                        dropped["translation not a sentence"] += 1
                        continue
                    key = normalise(en)
                    if normalise(tr) == key:
                        dropped["untranslated"] += 1
                        continue
                    english.setdefault(key, en)
                    origin.setdefault(key, pkg.name)
                    votes[key][lang][tr] += 1
    pairs: dict[str, dict[str, str]] = {}
    for key, by_lang in votes.items():
        pairs[english[key]] = {lang: c.most_common(1)[0][0] for lang, c in by_lang.items()}
    return pairs, {english[k]: v for k, v in origin.items()}, dropped


def near_duplicate_clusters(sentences: Sequence[str], near: float = NEAR) -> list[int]:
    """Cluster id per sentence: connected components of word-set Jaccard >= ``near``.

    Candidates come from MinHash banding (32 bands of 2 hashes: a pair at Jaccard 0.5 is
    a candidate with probability 1 - 0.75^32 > 0.9999) and are checked exactly.
    """
    words = [frozenset(normalise(s).split()) for s in sentences]
    parent = list(range(len(sentences)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    bands, rows, prime = 32, 2, 4294967311  # a prime above 2^32: (a x + b) mod p
    g = np.random.default_rng(0)
    a_H = g.integers(1, 2**32, bands * rows, dtype=np.uint64)
    b_H = g.integers(0, 2**32, bands * rows, dtype=np.uint64)
    vocab = {w: i for i, w in enumerate(sorted(set().union(*words)))}
    base_W = np.array(
        [int.from_bytes(hashlib.blake2b(w.encode(), digest_size=4).digest()) for w in vocab],
        dtype=np.uint64,
    )
    buckets: dict[tuple, list[int]] = defaultdict(list)
    for i, ws in enumerate(words):
        if not ws:
            continue
        x_N1 = base_W[[vocab[w] for w in ws]][:, None]
        sig_H = ((a_H * x_N1 + b_H) % prime).min(0)  # [N,H] → [H]
        for b in range(bands):
            buckets[(b, *sig_H[b * rows : (b + 1) * rows].tolist())].append(i)
    for members in buckets.values():
        for x, j in enumerate(members[1:], 1):
            for k in members[:x]:
                if find(k) != find(j) and len(words[k] & words[j]) >= near * len(
                    words[k] | words[j]
                ):
                    ri, rj = find(k), find(j)
                    parent[max(ri, rj)] = min(ri, rj)
    return [find(i) for i in range(len(sentences))]


@dataclass
class Split:
    """Train and test pairs per language; ``test`` holds the same English sentences in
    every language."""

    train: dict[str, list[tuple[str, str]]]
    test: dict[str, list[tuple[str, str]]]
    stats: dict[str, object]


def split(
    pairs: dict[str, dict[str, str]], langs: Sequence[str], n_test: int, seed: int = 0
) -> Split:
    """Test: ``n_test`` English sentences translated into every language, one per cluster of
    near duplicates; train: every pair whose English shares no cluster with a test sentence
    and whose translation is no test translation."""
    english = sorted(pairs)
    cluster = dict(zip(english, near_duplicate_clusters(english)))
    everywhere = [en for en in english if all(lang in pairs[en] for lang in langs)]
    rng = random.Random(seed)
    rng.shuffle(everywhere)
    test_en: list[str] = []
    used: set[int] = set()
    for en in everywhere:
        if len(test_en) == n_test:
            break
        if cluster[en] not in used:
            used.add(cluster[en])
            test_en.append(en)
    if len(test_en) < n_test:
        raise ValueError(f"only {len(test_en)} test sentences in every language, need {n_test}")
    held = {lang: {normalise(pairs[en][lang]) for en in test_en} for lang in langs}
    held["en"] = {normalise(en) for en in test_en}
    train: dict[str, list[tuple[str, str]]] = {lang: [] for lang in langs}
    leaks = Counter()
    for en in english:
        if cluster[en] in used:
            leaks["near a test sentence"] += 1
            continue
        for lang, tr in pairs[en].items():
            if normalise(tr) in held[lang]:
                leaks[f"{lang} translation in test"] += 1
                continue
            train[lang].append((en, tr))
    for lang in langs:
        rng.shuffle(train[lang])
    test = {lang: [(en, pairs[en][lang]) for en in test_en] for lang in langs}
    stats = {
        "english_sentences": len(english),
        "clusters": len(set(cluster.values())),
        "dropped_from_train": dict(leaks),
    }
    return Split(train, test, stats)


def write_text(split_: Split, out: Path) -> dict[str, list[Path]]:
    """Line-aligned files ``{split}.en-{lang}.{en,lang}`` and mono files ``mono.{lang}``."""
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[Path]] = {}
    for name, part in (("train", split_.train), ("test", split_.test)):
        for lang, pp in part.items():
            paths = [out / f"{name}.en-{lang}.en", out / f"{name}.en-{lang}.{lang}"]
            for path, side in zip(paths, zip(*pp)):
                path.write_text("".join(s + "\n" for s in side), encoding="utf-8")
            files[f"{name}-{lang}"] = paths
    mono: dict[str, list[str]] = defaultdict(list)
    for lang, pp in split_.train.items():
        mono[lang] += [tr for _, tr in pp]
        mono["en"] += [en for en, _ in pp]
    for lang, sentences in mono.items():
        path = out / f"mono.{lang}"
        path.write_text("".join(s + "\n" for s in dict.fromkeys(sentences)), encoding="utf-8")
        files[f"mono-{lang}"] = [path]
    return files


def manifest(packages: Sequence[Package], origin: dict[str, str], split_: Split) -> dict:
    """What went into the data set: packages (version, licences, sentences used) and counts."""
    used = Counter(origin[en] for pp in split_.train.values() for en, _ in pp)
    used.update(origin[en] for en, _ in next(iter(split_.test.values())))
    return {
        "source": "Debian bookworm gettext catalogs (.mo), via apt-get download",
        "packages": [
            {
                "name": p.name,
                "version": p.version,
                "licences": p.licences,
                "english_sentences_used": used.get(p.name, 0),
            }
            for p in packages
        ],
        "train_pairs": {lang: len(pp) for lang, pp in split_.train.items()},
        "test_pairs": {lang: len(pp) for lang, pp in split_.test.items()},
        **split_.stats,
    }


def prepare_text(
    work: Path, langs: Sequence[str], n_test: int, seed: int, packages: Sequence[str] = PACKAGES
) -> tuple[Split, dict]:
    """Fetch, read, filter and split; returns the split and its manifest."""
    pkgs = fetch_all(packages, langs, work)
    pairs, origin, dropped = collect(pkgs, langs)
    result = split(pairs, langs, n_test, seed)
    info = manifest(pkgs, origin, result)
    info["dropped"] = dict(dropped)
    (work / "manifest.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n")
    return result, info
