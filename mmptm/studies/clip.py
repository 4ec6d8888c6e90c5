"""The clip study (``mmptm demo``, the default): toyworld → tokenizer → clip_tiny pre-training
on captions in four languages → image↔text retrieval per language → a search index of the test
images, queried in three languages (``mmptm serve`` opens it)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from mmptm.eval.retrieval import evaluate_retrieval, format_table
from mmptm.recipe import load_run_config
from mmptm.search.index import SearchIndex, build_index, format_hits
from mmptm.studies.common import draw_curves, format_seconds, prepare_data, timed, write_results
from mmptm.train.trainer import pretrain

#: what the clip demo asks its index (query, language of the query and of the captions shown)
DEMO_QUERIES = (
    ("a large red circle", "en"),
    ("ein kleiner gelber Stern", "de"),
    ("большой синий квадрат", "ru"),
)
#: the clip demo's caption languages (one text tower for all, Russian the non-Latin one) and
#: its steps: 2500 reach about 77% R@1 in each language, where the recipe's 1500 on English
#: alone reach about 84% in English but nothing in the others (README, Results)
CLIP_DEMO_LANGS = ("en", "de", "fr", "ru")
CLIP_DEMO_STEPS = 2500


def clip_study(
    out: Path,
    *,
    n_train: int = 4000,
    n_test: int = 500,
    steps: int = CLIP_DEMO_STEPS,
    seed: int = 0,
    overrides: Sequence[str] = (),
) -> dict:
    """The default demo: a multilingual CLIP on toyworld, retrieval R@1/5/10 on the test split
    per caption language, then a search index of the test images."""
    times: dict[str, float] = {}
    with timed(times, "data+tokenizer"):
        # BPE at 1000 pieces: toyworld's captions (257 word types in 4 languages) have room
        # for about 1200 BPE pieces, so every word is whole and no piece count falls short of
        # the request; unigram stops at ~220 pieces there, near letter level, with a warning.
        data = prepare_data(
            out, n_train, n_test, seed, CLIP_DEMO_LANGS, 1000, model_type="bpe",
            write=("image_text",),
        )  # fmt: skip
    run = out / "clip_tiny"
    with timed(times, "pretrain"):
        _pretrain(run, data, steps, seed, overrides)
    with timed(times, "retrieval"):
        by_lang = {
            lang: evaluate_retrieval(
                str(run),
                split="test",
                overrides=[f"data.modalities.text.caption_languages=[{lang}]"],
            )
            for lang in CLIP_DEMO_LANGS
        }
    n = int(by_lang[CLIP_DEMO_LANGS[0]]["n"])
    print(f"\nclip_tiny on toyworld, test split ({n} images, each against its caption in "
          "one language):")  # fmt: skip
    print(format_table({f"clip_tiny, {lang}": r for lang, r in by_lang.items()}))
    with timed(times, "index"):
        index = _demo_index(run, f"{data}/image_text/test-*.tar", out / "index")
    result = {"retrieval": by_lang[CLIP_DEMO_LANGS[0]], "retrieval_by_language": by_lang}
    write_results(out, {**result, "seconds": times})
    print("\n" + format_seconds(times))
    draw_curves(out, "curves.png", {"clip_tiny": run},
                ["contrastive_loss", "contrastive_acc", "contrastive_logit_scale", "lr"],
                "clip_tiny pre-training on toyworld")  # fmt: skip
    print(f"search the test images in a browser: mmptm serve {index}")
    return result


def _pretrain(run: Path, data: Path, steps: int, seed: int, overrides: Sequence[str]) -> None:
    """clip_tiny on the study's captions, each training sample's in one language."""
    cfg = load_run_config(
        "configs/pretrain/clip_tiny.yaml",
        [
            f"output_dir={run}",
            "resume=true",  # a second `make demo` continues or only evaluates
            f"data.train={data}/image_text/train-*.tar",
            f"data.val={data}/image_text/val-*.tar",
            f"data.test={data}/image_text/test-*.tar",
            f"data.tokenizer={data}/tokenizer.model",
            # each training sample's caption in one of the languages, drawn at random
            f"data.modalities.text.caption_languages=[{','.join(CLIP_DEMO_LANGS)}]",
            f"seed={seed}",
            f"train.max_steps={steps}",
            *overrides,
        ],
    )
    pretrain(cfg)


def _demo_index(run: Path, shards: str, out: Path) -> Path:
    """Index ``shards`` with ``run`` at ``out`` (rebuilt: the run may have trained on since)
    and print the images the demo queries find, with their captions in the query's language."""
    shutil.rmtree(out, ignore_errors=True)
    summary = build_index(str(run), shards, out)
    parts = ", ".join(f"{name} {n}" for name, n in summary["parts"].items())
    print(f"\nsearch index {out}: {summary['items']} test images; vectors: {parts}")
    index = SearchIndex.open(out)
    for query, lang in DEMO_QUERIES:
        print(f"\n{query!r} → images (their {lang} captions):")
        print(format_hits(index.search_text(query, k=3, lang=lang), width=80))
    return out
