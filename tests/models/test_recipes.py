"""Every pre-training recipe builds; every tiny one trains a step reaching every weight."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_overrides

from mmptm.data.pipeline import Loader, stream_config
from mmptm.data.shards import expand_shards
from mmptm.encoders.base import VocabInfo
from mmptm.models.load import build_model
from mmptm.models.pretrain import data_transforms
from mmptm.recipe import list_recipes, load_run_config, recipe_kind, recipe_path
from mmptm.registry import MODALITIES

RECIPES = [recipe_path(n) for n in list_recipes() if recipe_kind(n) == "pretrain"]
TINY = [p for p in RECIPES if p.stem.endswith("_tiny")]
BASE = [p for p in RECIPES if p.stem.endswith("_base")]


def test_recipes_are_found():
    assert {p.stem for p in TINY} >= {"clip_tiny", "vilt_tiny"}
    assert {p.stem for p in BASE} >= {"clip_base", "vilt_base", "mbert_base", "xlm_tlm_base"}
    assert {p.stem for p in TINY} >= {"mbert_tiny", "xlm_tlm_tiny", "unicoder_tiny"}


def _not_in_world(cfg) -> str:
    """Why tiny_world cannot feed this recipe (e.g. no video shards or codebook yet), or ''."""
    specs = [cfg.data.train] if cfg.data.train else []
    # (sources' specs with {lang} are the multilingual recipes': tiny_world has their data)
    specs += [s.shards for s in cfg.data.sources.values() if "{lang}" not in s.shards]
    for spec in specs:
        try:
            expand_shards(spec)
        except FileNotFoundError as e:
            return str(e)
    for part in (*cfg.model.encoders.values(), *cfg.model.objectives.values()):
        if getattr(part, "codebook", "") and not Path(part.codebook).is_file():
            return f"no codebook {part.codebook}"
        if getattr(part, "answers", "") and not Path(part.answers).is_file():
            return f"no answer list {part.answers}"  # tests/objectives/test_lxmert_qa.py
    return ""


@pytest.mark.parametrize("recipe", TINY, ids=lambda p: p.stem)
def test_tiny_recipe_forward_backward_reaches_every_parameter(recipe, tiny_world, tmp_path):
    cfg = load_run_config(str(recipe), tiny_overrides(tiny_world, tmp_path, recipe.stem))
    missing_data = _not_in_world(cfg)
    if missing_data:  # tests/models/test_video_recipes.py steps them on synthetic batches
        pytest.skip(f"{recipe.stem}: tiny_world lacks its data ({missing_data})")
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    absent = {n.modality for n in model.data_needs().values()} - set(MODALITIES.names())
    if absent:
        pytest.skip(f"{recipe.stem}: no modality plug-in {sorted(absent)}")
    stream = stream_config(
        cfg.data,
        tok,
        needs=model.data_needs(),
        transforms=data_transforms(cfg.model, VocabInfo.from_tokenizer(tok)),
    )
    # One batch of every source of a mixture (e.g. monolingual MLM and parallel TLM) and of
    # every task of a per-step task mix (UNITER).
    tasks = list(cfg.model.task_mix) or [None]
    wanted = {(s.name, t) for s in stream.sources for t in tasks}
    batches = {}
    for _, batch in zip(range(100), Loader(stream, 0)):
        batches.setdefault((batch["__source__"], batch.get("__task__")), batch)
    assert set(batches) == wanted
    model.train()
    for batch in batches.values():
        out = model(batch)
        assert torch.isfinite(out.loss)
        assert any(k.endswith("_loss") for k in out.terms)
        out.loss.backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in trainable if p.grad is None]
    assert not missing, f"no gradient reaches {missing}"
    # Non-zero everywhere mmptm initialises; timm ResNets zero-init the last norm of each
    # residual branch, so that branch's earlier weights get exactly 0 on the first step.
    zero = [n for n, p in trainable if ".backbone." not in n and not p.grad.abs().sum() > 0]
    assert not zero, f"zero gradient at {zero}"


@pytest.mark.parametrize("recipe", BASE, ids=lambda p: p.stem)
def test_base_recipe_instantiates_at_published_size(recipe, tiny_world, tmp_path):
    over = [f"data.tokenizer={tiny_world}/tokenizer.model"]
    if recipe.stem == "videobert_base":  # VideoBERT's 12^4 visual words
        np.save(tmp_path / "codebook.npy", np.zeros((20736, 2), dtype=np.float32))
        over.append(f"model.encoders.units.codebook={tmp_path}/codebook.npy")
    if recipe.stem == "hubert_base":  # HuBERT iteration 1: 100 MFCC units
        np.save(tmp_path / "mfcc.npy", np.zeros((100, 39), dtype=np.float32))
        over.append(f"model.objectives.hubert.codebook={tmp_path}/mfcc.npy")
    if recipe.stem == "lxmert_full_base":  # LXMERT's QA head over its 9500 answers
        (tmp_path / "answers.txt").write_text("".join(f"a{i}\n" for i in range(9500)))
        over.append(f"model.objectives.vqa.answers={tmp_path}/answers.txt")
    cfg = load_run_config(str(recipe), over)
    model, _tok = build_model(cfg)
    n = sum(p.numel() for p in model.parameters())
    # Published sizes without their vocabularies (ours is the toy tokenizer's): CLIP ViT-B/16
    # 86M image + 38M text tower; ViLT-B/32 87M; mBERT-base 85M Transformer (+ 92M of
    # embeddings for its 119k vocabulary); XLM-15 12 x 1024: 151M Transformer.
    expected = {
        "clip_base": (120e6, 135e6),
        "vilt_base": (85e6, 95e6),
        "mbert_base": (85e6, 88e6),
        "xlm_tlm_base": (151e6, 156e6),
        "unicoder_base": (151e6, 156e6),
        # VisualBERT / UNITER: BERT-base + region embedding (+ heads); ViLBERT 221M and
        # LXMERT 228M as published include ~24M of word embeddings, and LXMERT its QA head.
        "visualbert_base": (86e6, 92e6),
        "uniter_base": (88e6, 96e6),
        "uniter_full_base": (88e6, 96e6),  # WRA is parameter-free
        "oscar_base": (86e6, 92e6),  # Oscar-B: VisualBERT's shape, tags read as text
        "vlp_base": (86e6, 92e6),  # VLP: BERT-base + the region embedding, MLM only
        # VL-BERT / Unicoder-VL / ImageBERT: VisualBERT's shape with their heads (counted
        # exactly in tests/models/test_vl_survey_recipes.py); B2T2: BERT-base's stack over
        # text alone + ResNet-152 (58M without its classifier)
        "vlbert_base": (88e6, 95e6),
        "unicoder_vl_base": (88e6, 94e6),
        "imagebert_base": (88e6, 96e6),
        "b2t2_base": (140e6, 155e6),
        "vilbert_base": (195e6, 225e6),
        "lxmert_base": (180e6, 210e6),
        "lxmert_full_base": (195e6, 225e6),  # + the QA head (768 → 1536 → 9500): 15.8M
        # ALBEF: BERT-base split 6 text + 6 fusion layers (here single-stream, so no
        # cross-attention weights) with a 2-layer region tower instead of its ViT-B/16.
        "albef_base": (98e6, 108e6),
        # BLIP-style: ALBEF-base + a 12-layer decoder with cross-attention (self, cross and
        # MLP at 768: 9.45M a layer) and its LM head; the embeddings are the text encoder's
        "blip_base": (210e6, 225e6),
        # mBART-cc25: 12 + 12 layers at 1024 wide, 354M without its 250k x 1024 embeddings
        "mbart_base": (350e6, 360e6),
        # Frozen-in-Time: ViT-B/16 86M + 2 temporal layers 14M + a 6-layer text tower 43M
        # (DistilBERT without its word embeddings)
        "video_clip_base": (140e6, 150e6),
        # VideoBERT: BERT-large 302M without word embeddings + 20736 x 1024 visual words
        "videobert_base": (320e6, 330e6),
        # CBT: BERT-base text tower 85M + 2 visual and 2 joint layers 28M + S3D projection
        "cbt_base": (112e6, 120e6),
        # VideoCLIP: BERT-base text tower 85M + 6 video layers 43M + S3D projection (512-d)
        "videoclip_base": (128e6, 133e6),
        # CLAP: AST-B 86M + a 12-layer text tower 85M; wav2vec 2.0 / HuBERT BASE: 94.4M
        # encoder + quantiser / unit heads; SpeechBERT-style: 6 audio layers 43M + BERT-base
        "clap_base": (165e6, 180e6),
        "wav2vec2_base": (94e6, 96e6),
        "hubert_base": (94e6, 96e6),
        "speechbert_base": (125e6, 140e6),
        # ERNIE (THU): BERT-base's 86M over 6 + 6 layers, each K-Encoder layer with an entity
        # stream (attention 100 wide, W_e, the entity split) and a 5040 x 100 entity table
        "ernie_base": (88e6, 93e6),
        # KEPLER: RoBERTa-base's 85M Transformer (+ its MLM head and 822 relations x 768)
        "kepler_base": (85e6, 88e6),
        "kbert_base": (85e6, 88e6),  # K-BERT: BERT-base; the graph is data, not weights
        "ernie1_base": (85e6, 88e6),  # ERNIE 1.0: BERT-base; knowledge masking adds nothing
        # KnowBERT-Wiki: BERT-base + one KAR at width 300 (2.6M, counted by hand in
        # tests/models/test_knowbert.py) + a frozen 5040 x 300 entity table
        "knowbert_base": (88e6, 93e6),
    }[recipe.stem]
    assert expected[0] < n < expected[1], f"{recipe.stem}: {n / 1e6:.1f}M parameters"
    widths = {"clip_base": 512, "xlm_tlm_base": 1024, "unicoder_base": 1024, "videobert_base": 1024,
              "mbart_base": 1024}  # fmt: skip
    assert model.cfg.width == widths.get(recipe.stem, 768)


def test_routes_must_name_data_sources(tiny_world, tmp_path):
    from mmptm.train.trainer import Trainer

    over = tiny_overrides(tiny_world, tmp_path, "xlm_xlco_tiny")
    cfg = load_run_config("xlm_xlco_tiny", over)
    cfg.model.routes["pairs"] = ["xlco"]  # the recipe's source is called xlco
    with pytest.raises(ValueError, match=r"model.routes names \['pairs'\], which are not data"):
        Trainer(cfg)
