"""toyworld's sentence-retrieval analogues of Tatoeba and BUCC, written in the real sets' file
formats and converted by the same converters (``mmptm data tatoeba``, ``mmptm data bucc``).

- **Tatoeba**: the captions of ``n_tatoeba`` test scenes in each language and in English,
  line-aligned, as ``tatoeba/tatoeba.{x}-en.{x}`` and ``tatoeba/tatoeba.{x}-en.en``; shards
  in ``tatoeba/shards/`` (``test-{x}-en-*.tar``).
- **BUCC**: per language two comparable corpora of ``n_bucc`` captions each, a
  ``parallel`` share of them translations of each other (BUCC's are a few percent), the
  rest captions of other scenes; the English side's lines shuffled. ``bucc/{x}-en.sample.*``
  (val scenes: where the threshold is chosen) and ``bucc/{x}-en.training.*`` (test scenes:
  scored), each with ``.{x}``, ``.en`` (``id<TAB>sentence``) and ``.gold``; shards in
  ``bucc/shards/``.

The scenes are toyworld's (``sample_scene(seed, split, i)``), so the captions are those of
its views; distinct scenes may share a caption, as real corpora repeat sentences.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmptm.converters.retrieval import convert_bucc, convert_tatoeba
from mmptm.registry import CONVERTERS
from mmptm.toyworld.language import LANGUAGES, describe
from mmptm.toyworld.scene import SPLITS, sample_scene

_OTHERS = ("de", "fr", "ru", "es")


def _write_bucc(root: Path, lang: str, split: str, n: int, parallel: float, seed: int) -> None:
    """One language's BUCC-format files of one split (module doc)."""
    name = {"val": "sample", "test": "training"}[split]
    shared = round(parallel * n)
    src_scenes = list(range(n))
    tgt_scenes = list(range(shared)) + list(range(n, 2 * n - shared))
    np.random.default_rng([seed, 7, SPLITS[split]]).shuffle(tgt_scenes)  # 7: this stream
    cap = {i: sample_scene(seed, split, i) for i in range(2 * n - shared)}
    prefix = root / f"{lang}-en.{name}"
    src = [f"{lang}-{i:09d}\t{describe(cap[i], lang)}\n" for i in src_scenes]
    tgt = [f"en-{i:09d}\t{describe(cap[i], 'en')}\n" for i in tgt_scenes]
    gold = [f"{lang}-{i:09d}\ten-{i:09d}\n" for i in range(shared)]
    for ext, lines in ((lang, src), ("en", tgt), ("gold", gold)):
        Path(f"{prefix}.{ext}").write_text("".join(lines), encoding="utf-8")


def write_retrieval(
    out: str | Path,
    *,
    languages: Sequence[str] = _OTHERS,
    n_tatoeba: int = 200,
    n_bucc: int = 200,
    parallel: float = 0.25,
    seed: int = 0,
) -> dict[str, Any]:
    """Write both analogues under ``out`` and convert them to shards (module doc)."""
    for lang in languages:
        if lang == "en" or lang not in LANGUAGES:
            raise ValueError(f"--languages: {lang!r} is not a toyworld language other than en "
                             f"({', '.join(x for x in LANGUAGES if x != 'en')})")  # fmt: skip
    if not 0 < parallel <= 1:
        raise ValueError(f"--parallel {parallel}: the share of translations is in (0, 1]")
    root = Path(out)
    (root / "tatoeba").mkdir(parents=True, exist_ok=True)
    (root / "bucc").mkdir(parents=True, exist_ok=True)
    scenes = [sample_scene(seed, "test", i) for i in range(n_tatoeba)]
    files = []
    for lang in languages:
        stem = root / "tatoeba" / f"tatoeba.{lang}-en"
        for ext in (lang, "en"):
            lines = "".join(describe(s, ext) + "\n" for s in scenes)
            Path(f"{stem}.{ext}").write_text(lines, encoding="utf-8")
        files.append(f"{stem}.{lang}")
        for split in ("val", "test"):
            _write_bucc(root / "bucc", lang, split, n_bucc, parallel, seed)
    stats = {"tatoeba": convert_tatoeba(files, root / "tatoeba" / "shards")["written"]}
    for lang in languages:
        for name in ("sample", "training"):
            s = convert_bucc(root / "bucc" / f"{lang}-en.{name}", root / "bucc" / "shards")
            stats[f"bucc {lang} {name}"] = {"sentences": s["written"], "gold": s["gold_pairs"]}
    return stats


CONVERTERS.register_writer(
    "toyworld-retrieval", "toyworld's Tatoeba and BUCC analogues (captions in 5 languages)",
    write_retrieval, ("languages", "n_tatoeba", "n_bucc", "parallel", "seed"),
    "data/toyworld/retrieval",
    {"languages": "comma list of toyworld languages paired with en",
     "parallel": "share of BUCC sentences that are translations"},
)  # fmt: skip


__all__ = ["write_retrieval"]
