"""``mmptm demo``: the reproducible toyworld studies."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm demo [STUDY]``."""
    de = sub.add_parser("demo", help="reproducible toyworld studies (default: clip)")
    de.add_argument(
        "study",
        nargs="?",
        default="clip",
        choices=["clip", "multilingual", "vqa", "video", "audio", "knowledge"],
    )
    de.add_argument("--recipes", default=None,
                    help="vqa: comma list of VL recipes or study runs (default: the six tiny "
                    "recipes and single_stream_9l, UNITER at ViLBERT's budget); "
                    "video: of videoclip_tiny (default), video_clip_tiny, videobert_tiny, "
                    "cbt_tiny; audio: of clap_tiny, audio_image_tiny, wav2vec2_tiny, "
                    "hubert_tiny, speechbert_tiny (default: clap_tiny,wav2vec2_tiny); "
                    "knowledge: of ernie_tiny (default), kbert_tiny, kepler_tiny, "
                    "ernie_vl_tiny")  # fmt: skip
    de.add_argument("--qa-steps", type=int, default=0,
                    help="video: video QA fine-tuning steps (0: no QA)")  # fmt: skip
    de.add_argument("--out", default=None, help="default: runs/demo-<study>")
    de.add_argument("--n-train", type=int, default=4000)
    de.add_argument("--n-test", type=int, default=500)
    de.add_argument(
        "--steps",
        type=int,
        default=0,
        help="pre-training steps (0: clip 2500, multilingual 2000, knowledge 1200, else the "
        "recipe's)",
    )
    de.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds (multilingual)")
    de.add_argument("--ft-steps", type=int, default=0,
                    help="fine-tuning steps (0: the study's own, 1500; audio: 600; "
                    "knowledge: 300, its knowledge VQA kvqa.yaml's 3000)")  # fmt: skip
    de.add_argument("--retrieval-items", type=int, default=None,
                    help="vqa: test pairs ranked after pre-training (default: the whole test "
                    "split; 0: no retrieval, VQA only)")  # fmt: skip
    de.add_argument("--seed", type=int, default=0)
    de.add_argument("--set", dest="overrides", action="append", default=[],
                    help="key=value override of the pre-training recipe")  # fmt: skip
    de.set_defaults(fn=_demo)


def _demo(args: argparse.Namespace) -> int:
    from mmptm import studies

    out = Path(args.out or f"runs/demo-{args.study}")
    if args.study == "clip":
        studies.clip_study(
            out, n_train=args.n_train, n_test=args.n_test, steps=args.steps, seed=args.seed,
            overrides=args.overrides,
        )  # fmt: skip
    elif args.study == "video":
        studies.video_study(
            out, recipes=tuple(args.recipes.split(",")) if args.recipes else ("videoclip_tiny",),
            n_train=args.n_train, n_test=args.n_test, steps=args.steps,
            qa_steps=args.qa_steps, seed=args.seed, overrides=args.overrides,
        )  # fmt: skip
    elif args.study == "audio":
        studies.audio_study(
            out, recipes=tuple(args.recipes.split(",")) if args.recipes else studies.AUDIO_DEMO,
            n_train=args.n_train, n_test=args.n_test, steps=args.steps,
            ft_steps=args.ft_steps or 600, seed=args.seed,
            overrides=args.overrides,
        )  # fmt: skip
    elif args.study == "knowledge":
        from mmptm.studies.knowledge import KNOWLEDGE_DEMO, knowledge_study

        knowledge_study(
            out, recipes=tuple(args.recipes.split(",")) if args.recipes else KNOWLEDGE_DEMO,
            n_train=args.n_train, n_test=args.n_test, steps=args.steps or 1200,
            ft_steps=args.ft_steps or None, seed=args.seed, overrides=args.overrides,
        )  # fmt: skip
    elif args.study == "vqa":
        studies.vqa_study(
            out, recipes=tuple(args.recipes.split(",")) if args.recipes else studies.VL_RECIPES,
            n_train=args.n_train,
            n_test=args.n_test, steps=args.steps or 1000, ft_steps=args.ft_steps or 1500,
            seeds=tuple(range(args.seeds)), seed=args.seed, overrides=args.overrides,
            retrieval_items=args.n_test if args.retrieval_items is None else args.retrieval_items,
        )  # fmt: skip
    else:
        studies.multilingual_study(
            out, n_train=args.n_train, n_test=args.n_test, steps=args.steps or 2000,
            ft_steps=args.ft_steps or 1500, seeds=tuple(range(args.seeds)), seed=args.seed,
            overrides=args.overrides,
        )  # fmt: skip
    return 0
