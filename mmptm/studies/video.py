"""The video study (``mmptm demo video``): toyworld video → video–text contrastive pre-training
(VideoCLIP style, over clip features) with a temporal encoder and as a bag of frames →
text↔video retrieval (every language) and the reversal test; optionally the frames model (mp4
decoded, a CNN per frame), VideoBERT and CBT, and video QA fine-tuning from pre-trained weights
vs. from scratch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmptm.converters.answers import build_answer_vocab, shard_answers, write_answer_vocab
from mmptm.eval.retrieval import evaluate_retrieval, evaluate_reversal, format_table
from mmptm.eval.vqa import evaluate_vqa
from mmptm.recipe import load_run_config
from mmptm.studies.common import (
    LANGS,
    draw_curves,
    format_seconds,
    prepare_data,
    recipe_views,
    relocated,
    timed,
    write_results,
)
from mmptm.train.trainer import pretrain
from mmptm.train.units import fit_codebook

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
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Video–text pre-training on toyworld video (``mmptm demo video``).

    Each recipe pre-trains (``videoclip_tiny`` also as a bag of frames: no temporal
    layers; ``steps`` 0: the recipe's) and is scored on text↔video retrieval (English
    captions; per language for the first recipe) and on the reversal test. With
    ``qa_steps``, video QA fine-tunes from the pre-trained encoders and from scratch (same
    shape, same budget) for the recipes that have a QA recipe (``_VIDEO_QA``). results.json
    is rewritten after every run.
    """
    unknown = [r for r in recipes if r not in VIDEO_RECIPES]
    if unknown:
        raise ValueError(f"video study recipes {unknown}: choices {', '.join(VIDEO_RECIPES)}")
    times: dict[str, float] = {}
    with timed(times, "data+tokenizer"):
        data = _prepare(out, recipes, n_train, n_test, seed, qa=bool(qa_steps))
    runs = [n for n in _VIDEO_RUNS if _VIDEO_RUNS[n][0] in recipes]
    result: dict[str, Any] = {"retrieval": {}, "reversal": {}, "languages": {}, "video_qa": {}}
    pretrained: dict[str, Path] = {}
    for name in runs:
        run = pretrained[name] = out / name.replace(" ", "_")
        with timed(times, f"pretrain {name}"):
            _pretrain(name, run, data, steps, seed, overrides)
        with timed(times, f"eval {name}"):
            _evaluate(name, run, result, retrieval_items, by_language=name == runs[0])
        result["seconds"] = times
        write_results(out, result)
    qa_runs = _video_qa(out, data, runs, qa_steps, seed, result, times) if qa_steps else {}
    result["settings"] = {"recipes": list(recipes), "n_train": n_train, "n_test": n_test,
                          "steps": steps, "qa_steps": qa_steps, "seed": seed}  # fmt: skip
    write_results(out, result)
    _print_video(result, runs[0], qa_steps)
    print(format_seconds(times))
    draw_curves(out, "curves.png", pretrained, ["*_loss", "*_acc"], "video pre-training")
    if qa_runs:
        draw_curves(out, "curves_qa.png", qa_runs, ["vqa_loss", "vqa_score"],
                    "video QA fine-tuning")  # fmt: skip
    return result


def _prepare(
    out: Path, recipes: Sequence[str], n_train: int, n_test: int, seed: int, qa: bool
) -> Path:
    """toyworld's views that the recipes read (and video QA's, with ``qa``), a tokenizer on
    the video captions, and VideoBERT's codebook of the clip features when it runs."""
    # the views the recipes read (video_clip_tiny: images too, as 1-frame clips), and QA's
    views = {"video", "video_features"}.union(*(recipe_views(r) for r in recipes))
    write = tuple(sorted(views | ({"video_qa"} if qa else set())))
    data = prepare_data(
        out, n_train, n_test, seed, LANGS, 1000, views=("video",), model_type="bpe", write=write
    )
    codebook = data / "video_features" / "codebook.npy"
    if "videobert_tiny" in recipes:
        fit_codebook(f"{data}/video_features/train-*.tar", codebook, k=256, seed=seed)
    return data


def _pretrain(
    name: str, run: Path, data: Path, steps: int, seed: int, overrides: Sequence[str]
) -> None:
    """Pre-train one of ``_VIDEO_RUNS`` at ``run`` on the study's data (``steps`` 0: the
    recipe's)."""
    recipe, extra = _VIDEO_RUNS[name]
    cfg = load_run_config(
        recipe,
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


def _evaluate(
    name: str, run: Path, result: dict[str, Any], retrieval_items: int, by_language: bool
) -> None:
    """Score one pre-trained run into ``result``: retrieval on English captions, the reversal
    test, and with ``by_language`` text→video retrieval per caption language."""
    recipe = _VIDEO_RUNS[name][0]
    # ITM alone scores every pair (quadratic): fewer candidates for VideoBERT
    items = min(retrieval_items, 200) if recipe == "videobert_tiny" else retrieval_items
    result["retrieval"][name] = evaluate_retrieval(str(run), split="test", max_items=items)
    result["reversal"][name] = evaluate_reversal(str(run), split="test", max_items=items)
    if by_language:
        for lang in LANGS:
            over = [f"data.modalities.text.caption_languages=[{lang}]"]
            r = evaluate_retrieval(str(run), split="test", max_items=items, overrides=over)
            result["languages"][lang] = r


def _video_qa(
    out: Path,
    data: Path,
    runs: Sequence[str],
    qa_steps: int,
    seed: int,
    result: dict[str, Any],
    times: dict[str, float],
) -> dict[str, Path]:
    """Video QA fine-tuned from each pre-trained run that has a QA recipe and from scratch
    (same shape, same budget), accuracies into ``result``; "run how" → fine-tuning run."""
    answers = data / "video_qa" / "answers.txt"
    vocab = build_answer_vocab(shard_answers([f"{data}/video_qa/train-*.tar"]), min_count=9)
    write_answer_vocab(vocab, answers)
    qa_runs: dict[str, Path] = {}
    for name in (n for n in runs if n in _VIDEO_QA):
        qa = _VIDEO_QA[name]
        # from scratch: the QA recipe's own model (same shape), no initialisation
        for how, init in (
            ("pre-trained", f"init={out / name}"),
            ("from scratch", "init=__delete__"),
        ):
            key = f"{name} {how}"
            ft = qa_runs[key] = out / f"{qa}_{name}_{how.replace(' ', '_')}"
            with timed(times, f"video QA {key}"):
                cfg = load_run_config(
                    qa,
                    [init, f"output_dir={ft}", "resume=true",
                     f"seed={seed}", f"train.max_steps={qa_steps}",
                     f"data.tokenizer={data}/tokenizer.model",
                     f"data.train={data}/video_qa/train-*.tar",
                     f"data.val={data}/video_qa/val-*.tar",
                     f"data.test={data}/video_qa/test-*.tar",
                     f"model.objectives.vqa.answers={answers}"],
                )  # fmt: skip
                pretrain(cfg)
                result["video_qa"][key] = evaluate_vqa(str(ft), split="test")["accuracy"]
            write_results(out, result)
    return qa_runs


def _print_video(result: Mapping[str, Any], first: str, qa_steps: int) -> None:
    """The study's tables: retrieval, retrieval per language (``first`` run), the reversal
    test and video QA."""
    n = int(next(iter(result["retrieval"].values()))["n"])
    print(f"\ntext↔video retrieval, toyworld test split ({n} clips, English captions;")
    print("i2t = video→text, t2i = text→video; MdR = median rank):")
    print(format_table(result["retrieval"]))
    print(f"\ntext→video retrieval by caption language ({first}):")
    print(format_table(result["languages"]))
    print("\nreversal test (own caption vs. the caption of the clip played backwards;")
    print("a bag of frames scores 50%):")
    for name, r in result["reversal"].items():
        print(f"  {name:<20} {100 * r['reversal_acc']:5.1f}%")
    if result["video_qa"]:
        print(f"\nvideo QA accuracy (VQA soft score, %), {qa_steps} fine-tuning steps:")
        for key, acc in result["video_qa"].items():
            print(f"  {key:<36} {acc:5.1f}")
