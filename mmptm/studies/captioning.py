"""The generation study (``mmptm demo captioning``): toyworld captioning fine-tuned from a
pre-trained captioner vs. from scratch (same shape, same fine-tuning budget), for the
BLIP-style decoder and for VLP's seq2seq-masked MLM, scored with CIDEr-D, BLEU-4 and chrF on
the test scenes' captions; and translation fine-tuned from mBART's denoising vs. from scratch,
scored with BLEU and chrF beside two baselines that learn nothing (copy the source, a
word-by-word dictionary learned from the same training pairs)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmptm.eval.text_generation import evaluate_captioning, evaluate_translation
from mmptm.generate.decoding import DecodeConfig
from mmptm.recipe import load_run_config
from mmptm.studies.common import LANGS, draw_curves, prepare_data, relocated, write_results
from mmptm.train.trainer import pretrain

#: pre-training recipe → the fine-tuning recipe that trains it to write
FINETUNES = {"blip_tiny": "captioning", "vlp_tiny": "captioning_vlp", "mbart_tiny": "translation"}
#: fine-tuning starts: name → overrides besides ``init=<pre-trained run>``
_STARTS = (("pre-trained", []), ("from scratch", ["init_mode=architecture"]))


def captioning_study(
    out: Path,
    *,
    recipes: tuple[str, ...] = tuple(FINETUNES),
    n_train: int = 4000,
    n_test: int = 500,
    steps: int = 1000,
    ft_steps: int = 600,
    seed: int = 0,
    targets: tuple[str, ...] = ("de", "ru"),
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Captioning (English) and translation (English → each of ``targets``) fine-tuned from
    the pre-trained recipes vs. from scratch (module docstring); greedy and beam-3 decoding."""
    unknown = sorted(set(recipes) - set(FINETUNES))
    if unknown:
        raise ValueError(f"captioning study: no fine-tuning for {unknown}; recipes: "
                         f"{sorted(FINETUNES)}")  # fmt: skip
    # one BPE vocabulary over the captions and the monolingual text of every language
    data = prepare_data(out, n_train, n_test, seed, LANGS, 2000,
                        views=("image_text", "mono"), model_type="bpe")  # fmt: skip
    result: dict[str, Any] = {"captioning": {}, "translation": {}, "settings": {
        "n_train": n_train, "n_test": n_test, "steps": steps, "ft_steps": ft_steps,
        "seed": seed, "targets": list(targets)}}  # fmt: skip
    finetuned: dict[str, Path] = {}
    for recipe in recipes:
        run = out / recipe
        _train(recipe, run, data, [f"train.max_steps={steps}", *overrides], seed)
        for name, start in _STARTS:
            ft = out / f"{FINETUNES[recipe]}_{recipe}_{name.replace(' ', '_')}"
            finetuned[f"{recipe} {name}"] = ft
            _train(FINETUNES[recipe], ft, data,
                   [f"init={run}", *start, f"train.max_steps={ft_steps}"], seed)  # fmt: skip
            _score(result, recipe, name, ft, targets)
            write_results(out, result)
    _print(result)
    draw_curves(out, "curves.png", {r: out / r for r in recipes}, ["*_loss", "*_acc"],
                "generative pre-training")  # fmt: skip
    draw_curves(out, "curves_finetune.png", finetuned, ["lm_loss", "mlm_loss", "*_acc"],
                "fine-tuning to write")  # fmt: skip
    return result


def _train(recipe: str, run: Path, data: Path, extra: Sequence[str], seed: int) -> None:
    """Train ``recipe`` at ``run`` on the study's toyworld (its paths moved there)."""
    over = [*relocated(recipe, data), f"data.tokenizer={data}/tokenizer.model",
            f"output_dir={run}", "resume=true", f"seed={seed}", *extra]  # fmt: skip
    pretrain(load_run_config(recipe, over))


def _score(result: dict, recipe: str, start: str, ft: Path, targets: Sequence[str]) -> None:
    """Greedy and beam-3 scores of one fine-tuned run into ``result``."""
    for label, decoding in (("greedy", DecodeConfig()), ("beam 3", DecodeConfig(beam=3))):
        key = f"{recipe} {start}, {label}"
        if FINETUNES[recipe] == "translation":
            for tgt in targets:
                r = evaluate_translation(str(ft), src="en", tgt=tgt, decoding=decoding)
                result["translation"].setdefault(f"en→{tgt}", {})[key] = r
        else:
            result["captioning"][key] = evaluate_captioning(str(ft), lang="en", decoding=decoding)


def _print(result: dict) -> None:
    if result["captioning"]:
        print("\ncaptioning, English test scenes (every caption of a scene a reference):")
        print(f"  {'run':<40} {'CIDEr-D':>8} {'BLEU-4':>7} {'chrF':>6}")
        rows = dict(result["captioning"])
        for r in list(result["captioning"].values())[:1]:  # the same for every run
            rows.update({f"baseline: {k}": v for k, v in r.get("baselines", {}).items()})
        for key, r in rows.items():
            print(f"  {key:<40} {r['cider_d']:8.1f} {r['bleu4']:7.1f} {r['chrf']:6.1f}")
            if r.get("examples"):
                ex = r["examples"][0]
                print(f"    e.g. {ex['written']!r} ({ex['reference']!r})")
    for pair, rows in result["translation"].items():
        print(f"\ntranslation {pair}, test pairs:")
        print(f"  {'run':<40} {'BLEU':>6} {'chrF':>6}")
        baselines = next(iter(rows.values())).get("baselines", {})
        for key, r in [*rows.items(), *baselines.items()]:
            print(f"  {key:<40} {r['bleu']:6.1f} {r['chrf']:6.1f}")
