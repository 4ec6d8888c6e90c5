"""Reproducible studies on toyworld, run by ``mmptm demo STUDY``: each writes results.json,
tables and its training curves (``curves*.png``: the runs it compares, one figure per stage).

Studies sit beside the command line and call library functions only; one module per study,
``common`` holds what several share. A study's keyword defaults are the demo's defaults.

- ``clip`` (:mod:`~mmptm.studies.clip`): a multilingual CLIP, retrieval per caption
  language, a search index of the test images.
- ``multilingual``: MLM vs MLM+TLM vs MLM+TLM+XLCO on cross-lingual retrieval and zero-shot
  XNLI.
- ``vqa``: the vision-language recipes' retrieval and VQA from pre-trained vs. from scratch,
  at their budgets.
- ``video``: video–text pre-training, retrieval per language, the reversal test, video QA.
- ``audio``: CLAP, sound↔image, wav2vec 2.0 / HuBERT probes, SpeechBERT.
- ``knowledge``: knowledge-graph recipes with and without the graph.
- ``captioning``: captioning and translation fine-tuned from generative pre-training vs. from
  scratch, against baselines that learn nothing.
- ``tasks``: toyworld's analogues of the downstream tasks (referring expressions, NLVR2,
  tagging, QA, XNLI), pre-trained vs. from scratch, mean ± std over fine-tuning seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mmptm.studies.audio import AUDIO_DEMO, AUDIO_RECIPES, audio_study
from mmptm.studies.captioning import FINETUNES, captioning_study
from mmptm.studies.clip import CLIP_DEMO_LANGS, DEMO_QUERIES, clip_study
from mmptm.studies.common import LANGS, recipe_views, relocated
from mmptm.studies.knowledge import KNOWLEDGE_DEMO, KNOWLEDGE_RECIPES, knowledge_study
from mmptm.studies.multilingual import multilingual_study
from mmptm.studies.tasks import TASKS, tasks_study
from mmptm.studies.video import VIDEO_RECIPES, video_study
from mmptm.studies.vqa import VL_RECIPES, VL_RUNS, format_budgets, model_budget, vqa_study

#: ``mmptm demo STUDY``: study name → the function that runs it (``fn(out, **settings)``)
STUDIES: dict[str, Callable[..., dict[str, Any]]] = {
    "clip": clip_study,
    "multilingual": multilingual_study,
    "vqa": vqa_study,
    "video": video_study,
    "audio": audio_study,
    "knowledge": knowledge_study,
    "captioning": captioning_study,
    "tasks": tasks_study,
}
#: what each study's ``recipes`` may name (vqa: also any other vision-language recipe)
RECIPES: dict[str, tuple[str, ...]] = {
    "vqa": VL_RECIPES,
    "video": VIDEO_RECIPES,
    "audio": AUDIO_RECIPES,
    "knowledge": tuple(KNOWLEDGE_RECIPES),
    "captioning": tuple(FINETUNES),
    "tasks": TASKS,
}

__all__ = [
    "AUDIO_DEMO",
    "AUDIO_RECIPES",
    "CLIP_DEMO_LANGS",
    "DEMO_QUERIES",
    "KNOWLEDGE_DEMO",
    "KNOWLEDGE_RECIPES",
    "LANGS",
    "RECIPES",
    "STUDIES",
    "TASKS",
    "VIDEO_RECIPES",
    "VL_RECIPES",
    "VL_RUNS",
    "audio_study",
    "captioning_study",
    "clip_study",
    "format_budgets",
    "knowledge_study",
    "model_budget",
    "multilingual_study",
    "recipe_views",
    "relocated",
    "tasks_study",
    "video_study",
    "vqa_study",
]
