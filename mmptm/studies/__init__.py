"""Reproducible studies on toyworld, run by ``mmptm demo``: each writes results.json, tables
and its training curves (``curves*.png``: the runs it compares, one figure per stage).

Studies sit beside the command line and call library functions only.

- ``clip``: toyworld → tokenizer → clip_tiny pre-training on captions in four languages →
  image↔text retrieval per language → a search index of the test images, queried in three
  languages (``mmptm serve`` opens it).
- ``video``: toyworld video → video–text contrastive pre-training (VideoCLIP style, over clip
  features) with a temporal encoder and as a bag of frames → text↔video retrieval (every
  language) and the reversal test; optionally the frames model (mp4 decoded, a CNN per
  frame), VideoBERT and CBT, and video QA fine-tuning from pre-trained weights vs. from
  scratch.
- ``audio``: toyworld scene sounds (and spoken captions) → CLAP text↔audio retrieval,
  sound↔image retrieval, wav2vec 2.0 / HuBERT pre-training scored by a linear probe against
  the same architecture untrained, SpeechBERT-style pre-training then spoken caption ↔ image
  retrieval (pre-trained vs. from scratch).
- ``multilingual``: MLM-only vs MLM+TLM vs MLM+TLM+XLCO (sentence-level cross-lingual
  contrast) pre-training (same model, same steps), compared on
  cross-lingual sentence retrieval (Tatoeba protocol) and zero-shot XNLI (fine-tune on
  English, test every language), against a from-scratch model of the same shape, over seeds.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmptm import toyworld
from mmptm.config import load_yaml_tree
from mmptm.eval.classification import evaluate_sets, format_accuracy
from mmptm.eval.curves import plot_curves
from mmptm.eval.probe import evaluate_probe, format_probe
from mmptm.eval.retrieval import (
    evaluate_retrieval,
    evaluate_reversal,
    format_table,
    retrieval_heads,
)
from mmptm.eval.vqa import evaluate_vqa
from mmptm.eval.xlingual import evaluate_xlingual
from mmptm.models.load import load_pretrained
from mmptm.objectives.vqa import build_answer_vocab, shard_answers, write_answer_vocab
from mmptm.recipe import load_run_config
from mmptm.search.index import SearchIndex, build_index, format_hits
from mmptm.tokenizers.sentencepiece import train_tokenizer
from mmptm.train.trainer import Trainer, pretrain
from mmptm.train.units import fit_audio_codebook, fit_codebook

log = logging.getLogger(__name__)
LANGS = ("en", "de", "fr", "ru", "es")
#: what the clip demo asks its index (query, language of the query and of the captions shown)
DEMO_QUERIES = (
    ("a large red circle", "en"),
    ("ein kleiner gelber Stern", "de"),
    ("большой синий квадрат", "ru"),
)
#: the VL study's pre-training runs: name → (recipe, overrides). The last two are UNITER's
#: architecture at the two-stream recipes' budget: every objective on every step (no task
#: sampling) and 9 fusion layers (1.80 M parameters, ViLBERT's 1.82 M), with ViLBERT's
#: objectives (MLM, ITM, MRFR, masked region classes against the detector's distribution)
#: and with LXMERT's (the same, the region classes against the true labels)
VL_RUNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "visualbert_tiny": ("visualbert_tiny", ()),
    "uniter_tiny": ("uniter_tiny", ()),
    "vilbert_tiny": ("vilbert_tiny", ()),
    "lxmert_tiny": ("lxmert_tiny", ()),
    "albef_tiny": ("albef_tiny", ()),
    "oscar_tiny": ("oscar_tiny", ()),
    "single_stream_9l": (
        "uniter_tiny",
        ("model.task_mix=__delete__", "model.fusion.transformer.layers=9"),
    ),
    "single_stream_9l_mrc": (
        "uniter_tiny",
        (
            "model.task_mix=__delete__",
            "model.fusion.transformer.layers=9",
            "model.objectives.mrc_kl=__delete__",
            "model.objectives.mrc={type: mrc, num_classes: 5, target: labels}",
        ),
    ),
}
VL_RECIPES = tuple(VL_RUNS)


def _prepare(
    out: Path,
    n_train: int,
    n_test: int,
    seed: int,
    languages,
    vocab_size: int,
    views=("image_text",),
    model_type: str = "unigram",
    write=None,
    fit_to_data: bool = False,
) -> Path:
    """toyworld under ``out`` (the ``write`` views; default: the image and text views) and a
    tokenizer trained on the train shards of ``views`` (``fit_to_data``: see
    :func:`train_tokenizer`)."""
    data = out / "toyworld"
    toyworld.generate(
        data, n_train=n_train, n_val=n_test, n_test=n_test, seed=seed, languages=languages,
        views=write, progress=True,
    )  # fmt: skip
    shards = sorted(p for view in views for p in (data / view).glob("train-*.tar"))
    train_tokenizer(
        shards, data / "tokenizer", vocab_size=vocab_size, seed=seed, model_type=model_type,
        fit_to_data=fit_to_data,
    )  # fmt: skip
    return data


def relocated(recipe: str, data: Path) -> list[str]:
    """Overrides that move every ``data/toyworld`` path of a recipe (shards of every split and
    source, tokenizer, codebooks, entity vectors, graph files) to a study's data, which has
    toyworld's layout."""
    over: list[str] = []

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, str) and node.startswith("data/toyworld"):
            over.append(f"{key}={node.replace('data/toyworld', str(data), 1)}")

    walk(load_yaml_tree(f"configs/pretrain/{recipe}.yaml"), "")
    return over


def recipe_views(recipe: str) -> set[str]:
    """The toyworld views (``data/toyworld/<view>/...``) a pre-training recipe reads."""
    moved = relocated(recipe, Path("@"))
    return {o.split("=", 1)[1].split("/")[1] for o in moved if o.split("=", 1)[1].count("/") > 1}


def _curves(
    out: Path, name: str, runs: Mapping[str, Path], metrics: Sequence[str], title: str
) -> Path:
    """A study's training curves (label → run) as ``out/name``; ``metrics`` are patterns, and
    those no run logs are passed over (recipes log different terms)."""
    path = plot_curves(runs, metrics, out / name, title=title, skip_missing=True)
    print(f"training curves: {path}")
    return path


#: the clip demo's caption languages (one text tower for all, Russian the non-Latin one) and
#: its steps: 2500 reach about 77% R@1 in each language, where the recipe's 1500 on English
#: alone reach about 84% in English but nothing in the others (README, Results)
CLIP_DEMO_LANGS = ("en", "de", "fr", "ru")
CLIP_DEMO_STEPS = 2500


def clip_study(out: Path, *, n_train=4000, n_test=500, steps=0, seed=0, overrides=()) -> dict:
    """The default demo: a multilingual CLIP on toyworld, retrieval R@1/5/10 on the test split
    per caption language, then a search index of the test images."""
    times: dict[str, float] = {}
    t = time.perf_counter()
    # BPE at 1000 pieces: toyworld's captions (257 word types in 4 languages) have room for
    # about 1200 BPE pieces, so every word is whole and no piece count falls short of the
    # request; unigram stops at ~220 pieces there, near letter level, with a warning.
    data = _prepare(
        out, n_train, n_test, seed, CLIP_DEMO_LANGS, 1000, model_type="bpe",
        write=("image_text",),
    )  # fmt: skip
    times["data+tokenizer"] = time.perf_counter() - t
    run = out / "clip_tiny"
    t = time.perf_counter()
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
            f"train.max_steps={steps or CLIP_DEMO_STEPS}",
            *overrides,
        ],
    )
    pretrain(cfg)
    times["pretrain"] = time.perf_counter() - t
    t = time.perf_counter()
    by_lang = {
        lang: evaluate_retrieval(
            str(run), split="test", overrides=[f"data.modalities.text.caption_languages=[{lang}]"]
        )
        for lang in CLIP_DEMO_LANGS
    }
    times["retrieval"] = time.perf_counter() - t
    n = int(by_lang[CLIP_DEMO_LANGS[0]]["n"])
    print(f"\nclip_tiny on toyworld, test split ({n} images, each against its caption in "
          "one language):")  # fmt: skip
    print(format_table({f"clip_tiny, {lang}": r for lang, r in by_lang.items()}))
    t = time.perf_counter()
    index = _demo_index(run, f"{data}/image_text/test-*.tar", out / "index")
    times["index"] = time.perf_counter() - t
    result = {"retrieval": by_lang[CLIP_DEMO_LANGS[0]], "retrieval_by_language": by_lang}
    (out / "results.json").write_text(json.dumps({**result, "seconds": times}, indent=2))
    print("\nseconds: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    _curves(out, "curves.png", {"clip_tiny": run},
            ["contrastive_loss", "contrastive_acc", "contrastive_logit_scale", "lr"],
            "clip_tiny pre-training on toyworld")  # fmt: skip
    print(f"search the test images in a browser: mmptm serve {index}")
    return result


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


def multilingual_study(
    out: Path,
    *,
    n_train: int = 4000,
    n_test: int = 500,
    steps: int = 2000,
    ft_steps: int = 1500,
    seeds: tuple[int, ...] = (0, 1, 2),
    seed: int = 0,
    overrides=(),
) -> dict[str, Any]:
    """MLM vs MLM+TLM vs MLM+TLM+XLCO: cross-lingual retrieval and zero-shot XNLI (module doc)."""
    # BPE: unigram stops at ~250 pieces on toyworld, near letter level (README, Results).
    # The tokenizer sees all the pre-training text (captions and statements), as XLM-R's
    # saw CommonCrawl; captions alone left NLI words such as "The" as [UNK].
    data = _prepare(out, n_train, n_test, seed, LANGS, 2000, views=("mono",), model_type="bpe")
    paths = [
        f"data.tokenizer={data}/tokenizer.model",
        f"data.sources.mono.shards={data}/mono/train-{{lang}}-*.tar",
    ]
    runs = {"mlm": out / "mlm", "mlm+tlm": out / "mlm_tlm", "mlm+tlm+xlco": out / "mlm_tlm_xlco"}
    tlm = f"data.sources.tlm.shards={data}/parallel/train-*.tar"
    xlco = f"data.sources.xlco.shards={data}/parallel/train-*.tar"
    variants = {  # recipe, overrides
        "mlm": ("xlm_tlm_tiny", ["data.sources.tlm=__delete__"]),
        "mlm+tlm": ("xlm_tlm_tiny", [tlm]),
        "mlm+tlm+xlco": ("xlm_xlco_tiny", [tlm, xlco]),
    }
    for name, run in runs.items():
        recipe, variant = variants[name]
        cfg = load_run_config(
            f"configs/pretrain/{recipe}.yaml",
            [f"output_dir={run}", "resume=true", f"train.max_steps={steps}", f"seed={seed}", *paths,
             *variant, *overrides],
        )  # fmt: skip
        pretrain(cfg)
    xret = {
        name: evaluate_xlingual(str(run), f"{data}/parallel/test-*.tar", pivot="en")
        for name, run in runs.items()
    }
    eval_sets = [f"data.eval.{lang}={data}/nli/test-{lang}-*.tar" for lang in LANGS]
    inits = {
        "from scratch": [f"init={runs['mlm']}", "init_mode=architecture"],
        "mlm": [f"init={runs['mlm']}"],
        "mlm+tlm": [f"init={runs['mlm+tlm']}"],
        "mlm+tlm+xlco": [f"init={runs['mlm+tlm+xlco']}"],
    }
    xnli: dict[str, dict[str, float]] = {}
    per_seed: dict[str, list[dict[str, float]]] = {}
    first: dict[str, Path] = {}  # the first seed's fine-tuning runs, for their curves
    for name, init in inits.items():
        per_seed[name] = []
        for s in seeds:
            cfg = load_run_config(
                "configs/finetune/xnli.yaml",
                [f"output_dir={out}/xnli_{name.replace(' ', '_')}_{s}", "resume=true", f"seed={s}",
                 f"train.max_steps={ft_steps}", f"data.train={data}/nli/train-en-*.tar",
                 *eval_sets, *init],
            )  # fmt: skip
            first.setdefault(name, Path(cfg.output_dir))
            trainer = Trainer(cfg)
            trainer.fit()
            per_seed[name].append(
                evaluate_sets(trainer.model, cfg, trainer.tokenizer, cfg.data.eval)
            )
        xnli[name] = {k: statistics.mean(r[k] for r in per_seed[name]) for k in per_seed[name][0]}
    result = {"xlingual_retrieval": xret, "xnli_zero_shot_mean": xnli, "xnli_per_seed": per_seed,
              "settings": {"n_train": n_train, "steps": steps, "ft_steps": ft_steps,
                           "seeds": list(seeds)}}  # fmt: skip
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print("\n(a) cross-lingual sentence retrieval accuracy vs English (Tatoeba protocol):")
    print(format_accuracy(xret))
    print(f"\n(b) zero-shot XNLI accuracy (fine-tuned on en), mean of {len(seeds)} seeds:")
    print(format_accuracy(xnli))
    _curves(out, "curves.png", runs, ["*_loss", "*_acc"], "pre-training (same model, same steps)")
    _curves(out, "curves_xnli.png", first, ["xnli_loss", "xnli_acc"],
            f"XNLI fine-tuning on English (seed {seeds[0]})")  # fmt: skip
    return result


def vqa_study(
    out: Path,
    *,
    recipes: tuple[str, ...] = VL_RECIPES,
    n_train: int = 4000,
    n_test: int = 500,
    steps: int = 1000,
    ft_steps: int = 1500,
    seeds: tuple[int, ...] = (0, 1, 2),
    seed: int = 0,
    retrieval_items: int = 500,
    rerank_k: int = 16,
    overrides=(),
) -> dict[str, Any]:
    """Per VL run (``VL_RUNS`` names, or any recipe's): retrieval after pre-training, and VQA
    accuracy of fine-tuning from the pre-trained weights vs. from scratch (same shape, same
    fine-tuning budget), over seeds; each run's budget (parameters, objectives per step).

    Retrieval over ``retrieval_items`` test pairs (default: the whole test split; 0: none):
    ITM scores every pair, and with a contrastive head too (ALBEF) the contrastive ranking
    alone and its top ``rerank_k`` re-ranked. results.json is rewritten after every run.
    """
    # BPE sized to the English captions and questions (about 340 pieces, every word whole):
    # unigram at 1000 stopped at 69 pieces, letter level, with a warning.
    data = _prepare(
        out, n_train, n_test, seed, ("en",), 1000, views=("image_text", "vqa"), model_type="bpe",
        fit_to_data=True,
    )  # fmt: skip
    answers = data / "vqa" / "answers.txt"
    vocab = build_answer_vocab(shard_answers([f"{data}/vqa/train-*.tar"]), min_count=9)
    write_answer_vocab(vocab, answers)
    paths = [f"data.tokenizer={data}/tokenizer.model"] + [
        f"data.{split}={data}/regions/{split}-*.tar" for split in ("train", "val", "test")
    ]
    result: dict[str, Any] = {"budget": {}, "retrieval": {}, "vqa_mean": {}, "vqa_per_seed": {}}
    finetuned: dict[str, Path] = {}  # the first seed's fine-tuning runs, for their curves
    for recipe in recipes:  # a run's name: the recipe's, or a VL_RUNS variant's
        base, variant = VL_RUNS.get(recipe, (recipe, ()))
        run = out / recipe
        cfg = load_run_config(
            f"configs/pretrain/{base}.yaml",
            [
                f"output_dir={run}",
                "resume=true",
                f"train.max_steps={steps}",
                f"seed={seed}",
                *paths,
                *variant,
                *overrides,
            ],
        )
        pretrain(cfg)
        result["budget"][recipe] = model_budget(load_pretrained(str(run))[0], cfg.data.batch_size)
        if retrieval_items:  # 0: VQA only (ITM over every pair is the costly part)
            result["retrieval"].update(_vl_retrieval(recipe, run, retrieval_items, rerank_k))
        for name, init in (("pre-trained", []), ("from scratch", ["init_mode=architecture"])):
            scores = []
            for s in seeds:
                ft = out / f"vqa_{recipe}_{name.replace(' ', '_')}_{s}"
                finetuned.setdefault(f"{recipe} {name}", ft)
                cfg = load_run_config(
                    "configs/finetune/vqa.yaml",
                    [f"init={run}", *init, f"output_dir={ft}", "resume=true", f"seed={s}",
                     f"train.max_steps={ft_steps}", f"data.train={data}/vqa/train-*.tar",
                     f"data.test={data}/vqa/test-*.tar", f"model.objectives.vqa.answers={answers}"],
                )  # fmt: skip
                pretrain(cfg)
                scores.append(evaluate_vqa(str(ft), split="test")["accuracy"])
            key = f"{recipe} {name}"
            result["vqa_per_seed"][key] = scores
            result["vqa_mean"][key] = statistics.mean(scores)
        result["settings"] = {"n_train": n_train, "steps": steps, "ft_steps": ft_steps,
                              "seeds": list(seeds), "retrieval_items": retrieval_items,
                              "rerank_k": rerank_k}  # fmt: skip
        (out / "results.json").write_text(json.dumps(result, indent=2))
    print(
        f"\npre-training budgets ({steps} steps each; objectives: share of the steps each trains):"
    )
    print(format_budgets(result["budget"]))
    if retrieval_items:
        print(f"\nimage↔text retrieval on {retrieval_items} test pairs (ITM scores every pair; "
              f"with a contrastive head too: contrastive alone, ITM over all, top {rerank_k} "
              "re-ranked):")  # fmt: skip
        print(format_table(result["retrieval"]))
    print(f"\nVQA accuracy (official soft score, %), mean of {len(seeds)} fine-tuning seeds:")
    for key, acc in result["vqa_mean"].items():
        runs = ", ".join(f"{a:.1f}" for a in result["vqa_per_seed"][key])
        print(f"  {key:<28} {acc:5.1f}   ({runs})")
    _curves(out, "curves.png", {r: out / r for r in recipes}, ["*_loss", "*_acc"],
            "vision-language pre-training")  # fmt: skip
    _curves(out, "curves_vqa.png", finetuned, ["vqa_loss", "vqa_score"],
            f"VQA fine-tuning (seed {seeds[0]})")  # fmt: skip
    return result


def model_budget(model, batch_size: int) -> dict[str, Any]:
    """What a pre-training run spends, to compare recipes at equal budgets: parameters (all,
    and the fusion's), the batch size, and the share of steps each objective trains (1 for
    every objective without ``task_mix``; its weight's share with it)."""
    mix = model.cfg.task_mix
    total = sum(mix.values())
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "fusion_parameters": sum(p.numel() for p in model.fusion.parameters()),
        "batch_size": batch_size,
        "objectives": {n: mix.get(n, 0.0) / total if mix else 1.0 for n in model.cfg.objectives},
    }


def format_budgets(budgets: Mapping[str, Mapping[str, Any]]) -> str:
    """One line per run: parameters, fusion parameters, batch, objectives with their shares."""
    lines = [f"  {'run':<20} {'params':>8} {'fusion':>8} {'batch':>5}  objectives (share of steps)"]
    for name, b in budgets.items():
        objs = ", ".join(
            n if share == 1.0 else f"{n} {share:.2f}" for n, share in b["objectives"].items()
        )
        lines.append(
            f"  {name:<20} {b['parameters'] / 1e6:7.2f}M {b['fusion_parameters'] / 1e6:7.2f}M "
            f"{b['batch_size']:>5}  {objs}"
        )
    return "\n".join(lines)


def _vl_retrieval(recipe: str, run: Path, items: int, rerank_k: int) -> dict[str, dict]:
    """Retrieval rows of one VL run: ITM over every pair, and with a contrastive head as
    well (ALBEF) the contrastive ranking alone and its top ``rerank_k`` re-ranked by ITM."""
    path = str(run)
    contrastive, itm = retrieval_heads(load_pretrained(path)[0])
    if contrastive is None or itm is None:
        return {recipe: evaluate_retrieval(path, split="test", max_items=items)}
    return {
        f"{recipe}, contrastive": evaluate_retrieval(path, split="test", max_items=items),
        f"{recipe}, ITM over all pairs": evaluate_retrieval(
            path, split="test", max_items=items, itm_all=True
        ),
        f"{recipe}, top {rerank_k} re-ranked": evaluate_retrieval(
            path, split="test", max_items=items, rerank_k=rerank_k
        ),
    }


VIDEO_RECIPES = ("videoclip_tiny", "video_clip_tiny", "videobert_tiny", "cbt_tiny")
#: pre-training runs of the video study: name → (recipe, overrides)
_VIDEO_RUNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "videoclip_tiny": ("videoclip_tiny", ()),
    "bag of frames": ("videoclip_tiny", ("model.encoders.features.temporal_layers=0",)),
    "video_clip_tiny": ("video_clip_tiny", ()),
    "videobert_tiny": ("videobert_tiny", ()),
    "cbt_tiny": ("cbt_tiny", ()),
}
#: video QA fine-tuning: pre-trained run → its QA recipe (frames or features)
_VIDEO_QA = {
    "videoclip_tiny": "video_qa_features",
    "video_clip_tiny": "video_qa",
    "cbt_tiny": "video_qa_features",
}


def video_study(
    out: Path,
    *,
    recipes: tuple[str, ...] = ("videoclip_tiny",),
    n_train: int = 4000,
    n_test: int = 500,
    steps: int = 0,
    qa_steps: int = 0,
    seed: int = 0,
    retrieval_items: int = 500,
    overrides=(),
) -> dict[str, Any]:
    """Video–text pre-training on toyworld video (``mmptm demo video``).

    Each recipe pre-trains (``videoclip_tiny`` also as a bag of frames: no temporal
    layers) and is scored on text↔video retrieval (English captions; per language for the
    first recipe) and on the reversal test. With ``qa_steps``, video QA fine-tunes from
    the pre-trained encoders and from scratch (same shape, same budget) for the recipes
    that have a QA recipe (``_VIDEO_QA``). results.json is rewritten after every run.
    """
    unknown = [r for r in recipes if r not in VIDEO_RECIPES]
    if unknown:
        raise ValueError(f"video study recipes {unknown}: choices {', '.join(VIDEO_RECIPES)}")
    times: dict[str, float] = {}
    t = time.perf_counter()
    # the views the recipes read (video_clip_tiny: images too, as 1-frame clips), and QA's
    views = {"video", "video_features"}.union(*(recipe_views(r) for r in recipes))
    write = tuple(sorted(views | ({"video_qa"} if qa_steps else set())))
    data = _prepare(
        out, n_train, n_test, seed, LANGS, 1000, views=("video",), model_type="bpe", write=write
    )
    codebook = data / "video_features" / "codebook.npy"
    if "videobert_tiny" in recipes:
        fit_codebook(f"{data}/video_features/train-*.tar", codebook, k=256, seed=seed)
    times["data+tokenizer"] = time.perf_counter() - t
    runs = [n for n in _VIDEO_RUNS if _VIDEO_RUNS[n][0] in recipes]
    result: dict[str, Any] = {"retrieval": {}, "reversal": {}, "languages": {}, "video_qa": {}}
    pretrained: dict[str, Path] = {}
    qa_runs: dict[str, Path] = {}
    for name in runs:
        recipe, extra = _VIDEO_RUNS[name]
        run = pretrained[name] = out / name.replace(" ", "_")
        t = time.perf_counter()
        cfg = load_run_config(
            f"configs/pretrain/{recipe}.yaml",
            [
                f"output_dir={run}",
                "resume=true",
                f"seed={seed}",
                *relocated(recipe, data),  # shards, tokenizer, VideoBERT's codebook
                # captions in every language (one drawn per clip and epoch): text→video
                # retrieval is then measured per language; evaluation reads English
                f"data.modalities.text.caption_languages=[{','.join(LANGS)}]",
                *([f"train.max_steps={steps}"] if steps else []),
                *extra,
                *overrides,
            ],
        )  # fmt: skip
        pretrain(cfg)
        times[f"pretrain {name}"] = time.perf_counter() - t
        t = time.perf_counter()
        # ITM alone scores every pair (quadratic): fewer candidates for VideoBERT
        items = min(retrieval_items, 200) if recipe == "videobert_tiny" else retrieval_items
        result["retrieval"][name] = evaluate_retrieval(str(run), split="test", max_items=items)
        result["reversal"][name] = evaluate_reversal(str(run), split="test", max_items=items)
        if name == runs[0]:
            for lang in LANGS:
                over = [f"data.modalities.text.caption_languages=[{lang}]"]
                r = evaluate_retrieval(str(run), split="test", max_items=items, overrides=over)
                result["languages"][lang] = r
        times[f"eval {name}"] = time.perf_counter() - t
        result["seconds"] = times
        (out / "results.json").write_text(json.dumps(result, indent=2))
    if qa_steps:
        answers = data / "video_qa" / "answers.txt"
        vocab = build_answer_vocab(shard_answers([f"{data}/video_qa/train-*.tar"]), min_count=9)
        write_answer_vocab(vocab, answers)
        for name in (n for n in runs if n in _VIDEO_QA):
            qa = _VIDEO_QA[name]
            # from scratch: the QA recipe's own model (same shape), no initialisation
            for how, init in (
                ("pre-trained", f"init={out / name}"),
                ("from scratch", "init=__delete__"),
            ):
                ft = out / f"{qa}_{name}_{how.replace(' ', '_')}"
                qa_runs[f"{name} {how}"] = ft
                t = time.perf_counter()
                cfg = load_run_config(
                    f"configs/finetune/{qa}.yaml",
                    [init, f"output_dir={ft}", "resume=true",
                     f"seed={seed}", f"train.max_steps={qa_steps}",
                     f"data.tokenizer={data}/tokenizer.model",
                     f"data.train={data}/video_qa/train-*.tar",
                     f"data.val={data}/video_qa/val-*.tar",
                     f"data.test={data}/video_qa/test-*.tar",
                     f"model.objectives.vqa.answers={answers}"],
                )  # fmt: skip
                pretrain(cfg)
                acc = evaluate_vqa(str(ft), split="test")["accuracy"]
                result["video_qa"][f"{name} {how}"] = acc
                times[f"video QA {name} {how}"] = time.perf_counter() - t
                (out / "results.json").write_text(json.dumps(result, indent=2))
    result["settings"] = {"recipes": list(recipes), "n_train": n_train, "n_test": n_test,
                          "steps": steps, "qa_steps": qa_steps, "seed": seed}  # fmt: skip
    (out / "results.json").write_text(json.dumps(result, indent=2))
    n = int(next(iter(result["retrieval"].values()))["n"])
    print(f"\ntext↔video retrieval, toyworld test split ({n} clips, English captions;")
    print("i2t = video→text, t2i = text→video; MdR = median rank):")
    print(format_table(result["retrieval"]))
    print(f"\ntext→video retrieval by caption language ({runs[0]}):")
    print(format_table(result["languages"]))
    print("\nreversal test (own caption vs. the caption of the clip played backwards;")
    print("a bag of frames scores 50%):")
    for name, r in result["reversal"].items():
        print(f"  {name:<20} {100 * r['reversal_acc']:5.1f}%")
    if result["video_qa"]:
        print(f"\nvideo QA accuracy (VQA soft score, %), {qa_steps} fine-tuning steps:")
        for key, acc in result["video_qa"].items():
            print(f"  {key:<36} {acc:5.1f}")
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    _curves(out, "curves.png", pretrained, ["*_loss", "*_acc"], "video pre-training")
    if qa_runs:
        _curves(out, "curves_qa.png", qa_runs, ["vqa_loss", "vqa_score"],
                "video QA fine-tuning")  # fmt: skip
    return result


AUDIO_RECIPES = (
    "clap_tiny",
    "audio_image_tiny",
    "wav2vec2_tiny",
    "hubert_tiny",
    "speechbert_tiny",
)
#: audio-view runs whose label probe (number of objects) is reported, with a random-init
#: baseline of the same architecture
_PROBED = ("clap_tiny", "wav2vec2_tiny", "hubert_tiny")
_COUNT_NAMES = "1,2,3,4"
#: what ``mmptm demo audio`` runs by default (within 10 minutes on 2 cores)
AUDIO_DEMO = ("clap_tiny", "wav2vec2_tiny")


def audio_study(
    out: Path,
    *,
    recipes: tuple[str, ...] = AUDIO_DEMO,
    n_train: int = 4000,
    n_test: int = 500,
    steps: int = 0,
    ft_steps: int = 600,
    seed: int = 0,
    retrieval_items: int = 500,
    overrides=(),
) -> dict[str, Any]:
    """Audio pre-training on toyworld's scene sounds and spoken captions (``mmptm demo audio``).

    ``clap_tiny``: text↔audio retrieval (English, and per language); ``audio_image_tiny``:
    sound↔image retrieval; ``wav2vec2_tiny`` / ``hubert_tiny`` (and CLAP's audio tower): a
    linear probe of how many objects a scene sound holds, beside the same architecture with
    its initial weights; ``speechbert_tiny``: pre-training on spoken + written captions, then
    spoken caption ↔ image retrieval fine-tuned from its audio encoder and from scratch
    (``ft_steps``). results.json is rewritten after every run.
    """
    unknown = [r for r in recipes if r not in AUDIO_RECIPES]
    if unknown:
        raise ValueError(f"audio study recipes {unknown}: choices {', '.join(AUDIO_RECIPES)}")
    times: dict[str, float] = {}
    t = time.perf_counter()
    write = ("audio", "speech") if "speechbert_tiny" in recipes else ("audio",)
    data = _prepare(
        out, n_train, n_test, seed, LANGS[:4], 1000, views=("audio",), model_type="bpe",
        write=write,
    )  # fmt: skip
    codebook = data / "audio" / "mfcc_codebook.npy"
    if "hubert_tiny" in recipes:
        fit_audio_codebook(f"{data}/audio/train-*.tar", codebook, k=32, seed=seed)  # MFCC
    times["data+tokenizer"] = time.perf_counter() - t
    result: dict[str, Any] = {"retrieval": {}, "languages": {}, "probe": {}}
    spoken: dict[str, Path] = {}  # spoken caption ↔ image fine-tuning runs
    audio = {split: f"{data}/audio/{split}-*.tar" for split in ("train", "val", "test")}

    def save() -> None:
        result["seconds"] = times
        (out / "results.json").write_text(json.dumps(result, indent=2))

    def train(recipe: str, run: Path, extra=()) -> None:
        t = time.perf_counter()
        folder = "finetune" if recipe == "speech_image" else "pretrain"
        cfg = load_run_config(
            f"configs/{folder}/{recipe}.yaml",
            [f"output_dir={run}", "resume=true", f"seed={seed}",
             f"data.tokenizer={data}/tokenizer.model", *extra, *overrides],
        )  # fmt: skip
        pretrain(cfg)
        times[f"train {run.name}"] = time.perf_counter() - t

    for recipe in recipes:
        run = out / recipe
        if recipe == "speechbert_tiny":
            speech = [f"data.{s}={data}/speech/{s}-*.tar" for s in ("train", "val", "test")]
            train(recipe, run, [*speech, *([f"train.max_steps={steps}"] if steps else [])])
            # spoken caption ↔ image: English spoken captions of the test scenes
            for how, init in (("pre-trained", f"init={run}"), ("from scratch", "init=__delete__")):
                ft = out / f"speech_image_{how.replace(' ', '_')}"
                spoken[how] = ft
                train("speech_image", ft, [init, f"train.max_steps={ft_steps}",
                      f"data.train={data}/speech/train-*.tar",
                      f"data.val={data}/speech/val-en-*.tar",
                      f"data.test={data}/speech/test-en-*.tar"])  # fmt: skip
                r = evaluate_retrieval(str(ft), split="test", max_items=retrieval_items)
                result["retrieval"][f"spoken caption↔image, {how}"] = r
                save()
            continue
        paths = [f"data.{s}={audio[s]}" for s in ("train", "val", "test")]
        if recipe == "clap_tiny":  # captions in every language, one drawn per sound and epoch
            paths.append(f"data.modalities.text.caption_languages=[{','.join(LANGS[:4])}]")
        if recipe == "hubert_tiny":
            paths.append(f"model.objectives.hubert.codebook={codebook}")
        train(recipe, run, [*paths, *([f"train.max_steps={steps}"] if steps else [])])
        t = time.perf_counter()
        if recipe in ("clap_tiny", "audio_image_tiny"):
            name = "text↔audio (CLAP)" if recipe == "clap_tiny" else "image↔sound"
            r = evaluate_retrieval(str(run), split="test", max_items=retrieval_items)
            result["retrieval"][name] = r
        if recipe == "clap_tiny":
            for lang in LANGS[:4]:
                over = [f"data.modalities.text.caption_languages=[{lang}]"]
                r = evaluate_retrieval(
                    str(run), split="test", max_items=retrieval_items, overrides=over
                )
                result["languages"][lang] = r
        if recipe in _PROBED:
            names = [f'"{n}"' for n in _COUNT_NAMES.split(",")]
            over = [f"data.modalities.label.names=[{', '.join(names)}]"]
            for how, random_init in (("pre-trained", False), ("random init", True)):
                result["probe"][f"{recipe} {how}"] = evaluate_probe(
                    str(run), train=audio["train"], test=audio["test"], overrides=over,
                    random_init=random_init,
                )  # fmt: skip
        times[f"eval {recipe}"] = time.perf_counter() - t
        save()
    result["settings"] = {"recipes": list(recipes), "n_train": n_train, "n_test": n_test,
                          "steps": steps, "ft_steps": ft_steps, "seed": seed}  # fmt: skip
    save()
    if result["retrieval"]:
        n = int(next(iter(result["retrieval"].values()))["n"])
        print(f"\nretrieval, toyworld test split ({n} items; i2t = item→text/image, t2i = the")
        print("other way; English captions; MdR = median rank):")
        print(format_table(result["retrieval"]))
    if result["languages"]:
        print("\ntext↔audio retrieval by caption language (clap_tiny):")
        print(format_table(result["languages"]))
    if result["probe"]:
        print("\nlinear probe: how many objects a scene sound holds (1-4):")
        print(format_probe(result["probe"]))
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    _curves(out, "curves.png", {r: out / r for r in recipes}, ["*_loss", "*_acc"],
            "audio pre-training")  # fmt: skip
    if spoken:
        _curves(out, "curves_speech_image.png", spoken, ["contrastive_loss", "contrastive_acc"],
                "spoken caption ↔ image fine-tuning")  # fmt: skip
    return result
