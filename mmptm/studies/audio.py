"""The audio study (``mmptm demo audio``): toyworld scene sounds (and spoken captions) → CLAP
text↔audio retrieval, sound↔image retrieval, wav2vec 2.0 / HuBERT pre-training scored by a
linear probe against the same architecture untrained, SpeechBERT-style pre-training then spoken
caption ↔ image retrieval (pre-trained vs. from scratch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmptm.eval.probe import evaluate_probe, format_probe
from mmptm.eval.retrieval import evaluate_retrieval, format_table
from mmptm.recipe import load_run_config
from mmptm.studies.common import (
    LANGS,
    draw_curves,
    format_seconds,
    prepare_data,
    timed,
    write_results,
)
from mmptm.train.trainer import pretrain
from mmptm.train.units import fit_audio_codebook

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
#: the caption languages of the audio view
_LANGS = LANGS[:4]


@dataclass
class _Study:
    """What every run of one audio study shares: its folder and data, the seed and recipe
    overrides, the clock and the results (results.json is rewritten after every run)."""

    out: Path
    data: Path
    seed: int
    overrides: Sequence[str]
    retrieval_items: int
    times: dict[str, float]
    result: dict[str, Any] = field(
        default_factory=lambda: {"retrieval": {}, "languages": {}, "probe": {}}
    )

    def save(self) -> None:
        """results.json as it stands, with the seconds so far."""
        self.result["seconds"] = self.times
        write_results(self.out, self.result)

    def train(self, recipe: str, run: Path, extra: Sequence[str] = ()) -> None:
        """Pre-train (or, ``speech_image``, fine-tune) ``recipe`` at ``run``."""
        with timed(self.times, f"train {run.name}"):
            cfg = load_run_config(
                recipe,
                [f"output_dir={run}", "resume=true", f"seed={self.seed}",
                 f"data.tokenizer={self.data}/tokenizer.model", *extra, *self.overrides],
            )  # fmt: skip
            pretrain(cfg)


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
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Audio pre-training on toyworld's scene sounds and spoken captions (``mmptm demo audio``).

    ``clap_tiny``: text↔audio retrieval (English, and per language); ``audio_image_tiny``:
    sound↔image retrieval; ``wav2vec2_tiny`` / ``hubert_tiny`` (and CLAP's audio tower): a
    linear probe of how many objects a scene sound holds, beside the same architecture with
    its initial weights; ``speechbert_tiny``: pre-training on spoken + written captions, then
    spoken caption ↔ image retrieval fine-tuned from its audio encoder and from scratch
    (``ft_steps``). ``steps`` 0: each recipe's own. results.json is rewritten after every run.
    """
    unknown = [r for r in recipes if r not in AUDIO_RECIPES]
    if unknown:
        raise ValueError(f"audio study recipes {unknown}: choices {', '.join(AUDIO_RECIPES)}")
    times: dict[str, float] = {}
    with timed(times, "data+tokenizer"):
        data = _prepare(out, recipes, n_train, n_test, seed)
    study = _Study(out, data, seed, overrides, retrieval_items, times)
    spoken: dict[str, Path] = {}  # spoken caption ↔ image fine-tuning runs
    max_steps = [f"train.max_steps={steps}"] if steps else []
    for recipe in recipes:
        run = out / recipe
        if recipe == "speechbert_tiny":
            spoken = _speechbert(study, run, max_steps, ft_steps)
            continue
        study.train(recipe, run, [*_audio_paths(recipe, data), *max_steps])
        with timed(times, f"eval {recipe}"):
            _evaluate(study, recipe, run)
        study.save()
    result = study.result
    result["settings"] = {"recipes": list(recipes), "n_train": n_train, "n_test": n_test,
                          "steps": steps, "ft_steps": ft_steps, "seed": seed}  # fmt: skip
    study.save()
    _print_audio(result)
    print(format_seconds(times))
    draw_curves(out, "curves.png", {r: out / r for r in recipes}, ["*_loss", "*_acc"],
                "audio pre-training")  # fmt: skip
    if spoken:
        draw_curves(out, "curves_speech_image.png", spoken, ["contrastive_loss", "contrastive_acc"],
                    "spoken caption ↔ image fine-tuning")  # fmt: skip
    return result


def _prepare(out: Path, recipes: Sequence[str], n_train: int, n_test: int, seed: int) -> Path:
    """toyworld's scene sounds (and spoken captions for SpeechBERT), a tokenizer on the
    captions, and HuBERT's MFCC codebook when it runs."""
    write = ("audio", "speech") if "speechbert_tiny" in recipes else ("audio",)
    data = prepare_data(
        out, n_train, n_test, seed, _LANGS, 1000, views=("audio",), model_type="bpe",
        write=write,
    )  # fmt: skip
    if "hubert_tiny" in recipes:
        fit_audio_codebook(f"{data}/audio/train-*.tar", _codebook(data), k=32, seed=seed)  # MFCC
    return data


def _audio_paths(recipe: str, data: Path) -> list[str]:
    """The overrides that point a scene-sound recipe at the study's data."""
    paths = [f"data.{s}={data}/audio/{s}-*.tar" for s in ("train", "val", "test")]
    if recipe == "clap_tiny":  # captions in every language, one drawn per sound and epoch
        paths.append(f"data.modalities.text.caption_languages=[{','.join(_LANGS)}]")
    if recipe == "hubert_tiny":
        paths.append(f"model.objectives.hubert.codebook={_codebook(data)}")
    return paths


def _codebook(data: Path) -> Path:
    """HuBERT's first-iteration targets: k-means units of the scene sounds' MFCCs."""
    return data / "audio" / "mfcc_codebook.npy"


def _speechbert(
    study: _Study, run: Path, max_steps: Sequence[str], ft_steps: int
) -> dict[str, Path]:
    """SpeechBERT pre-trained on spoken + written captions, then spoken caption ↔ image
    retrieval fine-tuned from it and from scratch; how → fine-tuning run."""
    data = study.data
    speech = [f"data.{s}={data}/speech/{s}-*.tar" for s in ("train", "val", "test")]
    study.train("speechbert_tiny", run, [*speech, *max_steps])
    spoken: dict[str, Path] = {}
    # spoken caption ↔ image: English spoken captions of the test scenes
    for how, init in (("pre-trained", f"init={run}"), ("from scratch", "init=__delete__")):
        ft = spoken[how] = study.out / f"speech_image_{how.replace(' ', '_')}"
        study.train("speech_image", ft, [init, f"train.max_steps={ft_steps}",
                    f"data.train={data}/speech/train-*.tar",
                    f"data.val={data}/speech/val-en-*.tar",
                    f"data.test={data}/speech/test-en-*.tar"])  # fmt: skip
        r = evaluate_retrieval(str(ft), split="test", max_items=study.retrieval_items)
        study.result["retrieval"][f"spoken caption↔image, {how}"] = r
        study.save()
    return spoken


def _evaluate(study: _Study, recipe: str, run: Path) -> None:
    """Score one scene-sound run into the study's results: retrieval (CLAP also per
    language), and the object-count probe beside the same architecture untrained."""
    result, items = study.result, study.retrieval_items
    if recipe in ("clap_tiny", "audio_image_tiny"):
        name = "text↔audio (CLAP)" if recipe == "clap_tiny" else "image↔sound"
        result["retrieval"][name] = evaluate_retrieval(str(run), split="test", max_items=items)
    if recipe == "clap_tiny":
        for lang in _LANGS:
            over = [f"data.modalities.text.caption_languages=[{lang}]"]
            r = evaluate_retrieval(str(run), split="test", max_items=items, overrides=over)
            result["languages"][lang] = r
    if recipe in _PROBED:
        names = [f'"{n}"' for n in _COUNT_NAMES.split(",")]
        over = [f"data.modalities.label.names=[{', '.join(names)}]"]
        audio = {s: f"{study.data}/audio/{s}-*.tar" for s in ("train", "test")}
        for how, random_init in (("pre-trained", False), ("random init", True)):
            result["probe"][f"{recipe} {how}"] = evaluate_probe(
                str(run), train=audio["train"], test=audio["test"], overrides=over,
                random_init=random_init,
            )  # fmt: skip


def _print_audio(result: dict[str, Any]) -> None:
    """The study's tables: retrieval, CLAP's retrieval per language, the probes."""
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
