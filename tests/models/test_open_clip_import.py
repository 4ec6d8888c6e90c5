"""Importing OpenCLIP checkpoints: numerical parity with open_clip (ViT and ResNet towers, the
text tower, logits), the end-to-end path from shards, a normal run directory, clear errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from conftest import cli_error
from PIL import Image

from mmptm.cli import main
from mmptm.config import load_config
from mmptm.data.shards import ShardWriter
from mmptm.eval.retrieval import evaluate_retrieval
from mmptm.models import checkpoint
from mmptm.models.load import build_model, init_from, load_init, load_pretrained
from mmptm.models.open_clip_import import (
    import_open_clip,
    open_clip_model_config,
    open_clip_state_dict_to_mmptm,
    read_model_config,
)
from mmptm.recipe import RunConfig

open_clip = pytest.importorskip("open_clip")
pytest.importorskip("safetensors")

TEXT = {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2}
#: tiny models of the three kinds: a QuickGELU ViT (OpenAI's), a GELU ViT whose embedding
#: width equals the text width, a ResNet whose embedding is wider than the text (as RN50)
TINY = {
    "tiny-vit-quickgelu": {
        "embed_dim": 24,
        "quick_gelu": True,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8,
                       "head_width": 16},
        "text_cfg": TEXT,
    },
    "tiny-vit": {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 48, "patch_size": 16,
                       "head_width": 16, "mlp_ratio": 2.0},
        "text_cfg": {**TEXT, "mlp_ratio": 2.0},
    },
    "tiny-rn": {
        "embed_dim": 48,
        "vision_cfg": {"image_size": 64, "layers": [3, 4, 6, 3], "width": 8},
        "text_cfg": TEXT,
    },
}  # fmt: skip
#: how each is saved: a bare state dict, safetensors, an open_clip training checkpoint
FORMATS = {"tiny-vit-quickgelu": "pt", "tiny-vit": "safetensors", "tiny-rn": "train"}
CAPTIONS = [
    "a photo of a cat",
    "Two dogs playing in the SNOW!",
    "",
    "a red circle left of a blue square, next to a green triangle",
    "Ein Hund läuft über die Wiese — schnell",
    "猫と犬",
    "it's 3:45pm & the café's closed",
    " ".join(["long"] * 120),
]
TOL = 1e-5


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every float tensor (parameters and BatchNorm statistics) moved off its initial value,
    so that no default initialisation (zeros, ones, identity) can hide a mapping bug."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.dtype.is_floating_point:
                continue
            noise = torch.randn(t.shape, generator=g)
            if name.endswith("running_var"):
                t.copy_(0.5 + noise.abs())
            else:
                t.add_(0.05 * noise)
    return model.eval()


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """name → (open_clip model, run dir, config json) for each tiny model."""
    root = tmp_path_factory.mktemp("open_clip")
    configs = root / "configs"
    configs.mkdir()
    for name, cfg in TINY.items():
        (configs / f"{name}.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(configs)
    out = {}
    for seed, name in enumerate(TINY):
        torch.manual_seed(seed)
        oc = perturbed(open_clip.create_model(name), seed)
        sd = oc.state_dict()
        fmt = FORMATS[name]
        if fmt == "safetensors":
            from safetensors.torch import save_file

            ckpt = root / f"{name}.safetensors"
            save_file({k: v.contiguous() for k, v in sd.items()}, str(ckpt))
        elif fmt == "train":  # what open_clip's trainer writes under DDP
            ckpt = root / f"epoch_1_{name}.pt"
            state = {f"module.{k}": v for k, v in sd.items()}
            torch.save({"epoch": 1, "name": name, "state_dict": state}, ckpt)
        else:
            ckpt = root / f"{name}.pt"
            torch.save(sd, ckpt)
        run = root / f"run-{name}"
        config = configs / f"{name}.json"
        argv = ["import", "open_clip", str(ckpt), "--model", name, "--out", str(run)]
        assert main([*argv, "--config", str(config)]) == 0
        out[name] = (oc, run, config)
    return out


def text_batch(tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    """What the text plug-in collates: ids padded to the longest, with the attention mask."""
    rows = [tokenizer.build_inputs(tokenizer.encode(t), None, 77)[0] for t in texts]
    L = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_id] * (L - len(r)) for r in rows])
    mask = torch.tensor([[True] * len(r) + [False] * (L - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("name", list(TINY))
def test_embeddings_and_logits_match_open_clip(imported, name: str):
    oc, run, _ = imported[name]
    model, tokenizer, _ = load_pretrained(str(run))
    S = TINY[name]["vision_cfg"]["image_size"]
    images = torch.randn(5, 3, S, S, generator=torch.Generator().manual_seed(1))
    ours_text = text_batch(tokenizer, CAPTIONS)
    theirs_ids = open_clip.tokenize(CAPTIONS)
    L = ours_text["input_ids"].shape[1]
    assert torch.equal(ours_text["input_ids"], theirs_ids[:, :L])  # tokenised both ways
    assert not theirs_ids[:, L:].any()
    head = model.objectives["contrastive"]
    with torch.no_grad():
        zi = head.embed(model.fuse({"pixels": images}), "image")
        zt = head.embed(model.fuse(ours_text), "text")
        want_i = oc.encode_image(images, normalize=True)
        want_t = oc.encode_text(theirs_ids, normalize=True)
        want_logits, _ = oc.get_logits(images, theirs_ids)
    assert (zi - want_i).abs().max().item() <= TOL
    assert (zt - want_t).abs().max().item() <= TOL
    logits = head.scale() * zi @ zt.T
    assert (logits - want_logits).abs().max().item() <= TOL * oc.logit_scale.detach().exp().item()
    # the towers differ between the tiny models, so this parity is not vacuous
    assert want_i.std() > 0.01 and (want_t[0] - want_t[1]).abs().max() > 0.01


def test_run_directory_is_a_normal_run(imported, tmp_path: Path):
    oc, run, _ = imported["tiny-rn"]
    ck = checkpoint.read(run / "checkpoints" / "step_00000000.pt")
    cfg = load_config(str(run / "config.yaml"), schema=RunConfig)
    assert cfg == ck.run_config() and ck.step == 0
    assert ck.extra["source"]["open_clip_model"] == "tiny-rn"
    # self-contained: the merges file is inside the run
    assert Path(cfg.data.tokenizer) == (run / "bpe_simple_vocab_16e6.txt.gz").resolve()
    assert cfg.data.modalities["text"].max_len == 77
    m = cfg.model
    assert m.width == 32 and m.widths == {"image": 48}  # RN: the embedding is wider than text
    assert m.encoders["image"].backbone.model_name == "resnet50_clip"
    assert m.encoders["image"].backbone.model_kwargs == {"img_size": 64, "width_factor": 0.125}
    assert (m.fusion.transformer.causal, m.fusion.transformer.activation) == (True, "gelu")
    assert m.fusion.pooling == {"text": "last", "image": "first"}
    needs = build_model(cfg)[0].data_needs()["image"].facts
    assert needs["size"] == 64 and needs["resize_mode"] == "shortest"
    torch.testing.assert_close(
        torch.tensor(needs["mean"]), torch.tensor(open_clip.OPENAI_DATASET_MEAN)
    )
    torch.testing.assert_close(
        torch.tensor(needs["std"]), torch.tensor(open_clip.OPENAI_DATASET_STD)
    )
    assert float(ck.model["objectives.contrastive.logit_scale"]) == oc.logit_scale.detach().item()

    # `init:` from the import: the architecture, tokenizer and weights come along
    recipe = RunConfig(output_dir=str(tmp_path / "ft"), init=str(run))
    recipe.model.objectives = cfg.model.objectives
    init = init_from(recipe)
    model, tokenizer = build_model(recipe)
    assert recipe.model == cfg.model and type(tokenizer).__name__ == "ClipTokenizer"
    load_init(model, init.model, recipe.init)
    own = model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in ck.model.items())


def write_shards(tmp: Path) -> tuple[str, list[bytes], list[str]]:
    """Six image-caption samples; images of several shapes, so the crop matters."""
    g = torch.Generator().manual_seed(3)
    sizes = [(80, 50), (50, 80), (64, 64), (97, 71), (40, 120), (70, 66)]
    words = ["red", "blue", "square", "circle", "dog", "cat", "left", "right", "big", "small"]
    pngs, captions = [], []
    writer = ShardWriter(str(tmp / "test-%06d.tar"), max_count=4)
    for i, (w, h) in enumerate(sizes):
        pixels = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels.numpy()).save(buf, format="PNG")
        pngs.append(buf.getvalue())
        caption = " ".join(words[j] for j in torch.randperm(10, generator=g)[:4].tolist())
        captions.append(f"A {caption} #{i}")
        meta = {"captions": {"en": captions[-1]}}
        writer.write({"__key__": f"{i:04d}", "png": buf.getvalue(), "json": meta})
    writer.close()
    return str(tmp / "test-*.tar"), pngs, captions


def ranks(sim_IT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank of the true pair per image (over texts) and per text (over images), 0 = first."""
    diag = sim_IT.diagonal()
    return (sim_IT > diag[:, None]).sum(1), (sim_IT > diag[None, :]).sum(0)


@pytest.mark.parametrize("name", ["tiny-vit-quickgelu", "tiny-rn"])
def test_shards_to_retrieval_matches_open_clip(imported, tmp_path: Path, name: str):
    """decode → preprocess → embed → rank through mmptm's pipeline and retrieval evaluation,
    against open_clip's own transform and towers on the same PNG bytes and captions."""
    from mmptm.data.pipeline import single_pass, stream_config

    oc, run, _ = imported[name]
    spec, pngs, captions = write_shards(tmp_path)
    model, tokenizer, cfg = load_pretrained(str(run))
    stream = stream_config(
        cfg.data, tokenizer, split="test", shards=spec, needs=model.data_needs(), seed=0
    )
    stream.batch_size = 6
    batch = next(iter(single_pass(stream)))
    S = TINY[name]["vision_cfg"]["image_size"]
    preprocess = open_clip.image_transform(
        S, is_train=False, mean=open_clip.OPENAI_DATASET_MEAN, std=open_clip.OPENAI_DATASET_STD
    )
    keys = [int(k) for k in batch["__key__"]]
    want_px = torch.stack([preprocess(Image.open(io.BytesIO(pngs[k]))) for k in keys])
    # the same PIL resize, crop and float arithmetic: equal to float rounding (measured 0)
    assert (batch["pixels"] - want_px).abs().max().item() <= 1e-6
    ids = open_clip.tokenize([captions[k] for k in keys])
    L = batch["input_ids"].shape[1]
    assert torch.equal(batch["input_ids"], ids[:, :L])

    result = evaluate_retrieval(str(run), shards=spec)
    with torch.no_grad():
        zi = oc.encode_image(want_px, normalize=True)
        zt = oc.encode_text(ids, normalize=True)
    r_i2t, r_t2i = ranks(zi @ zt.T)
    assert result["n"] == 6
    for k in (1, 5, 10):
        assert result[f"i2t_R@{k}"] == pytest.approx((r_i2t < k).float().mean().item())
        assert result[f"t2i_R@{k}"] == pytest.approx((r_t2i < k).float().mean().item())


def test_published_configs_map_to_mmptm_shapes():
    """The common open_clip configs (read from the installed package) and what they become,
    without building their full-size weights."""
    b32 = open_clip_model_config(read_model_config("ViT-B-32")[0])
    assert (b32.width, b32.widths) == (512, {"image": 768})
    image = b32.encoders["image"]
    assert image.backbone.model_name == "vit_base_patch32_clip_224" and image.output == "tokens"
    assert (image.projection, image.norm, image.position_embedding) == (False, False, False)
    assert b32.fusion.transformer.activation == "gelu"
    assert b32.objectives["contrastive"].embed_dim == 512
    quick = open_clip_model_config(read_model_config("ViT-B-16-quickgelu")[0])
    assert quick.encoders["image"].backbone.model_name == "vit_base_patch16_clip_quickgelu_224"
    assert quick.fusion.transformer.activation == "quick_gelu"
    l14 = open_clip_model_config(read_model_config("ViT-L-14")[0])
    assert (l14.width, l14.widths, l14.fusion.transformer.heads) == (768, {"image": 1024}, 12)
    assert l14.encoders["image"].backbone.model_name == "vit_large_patch14_clip_224"
    rn50 = open_clip_model_config(read_model_config("RN50-quickgelu")[0])
    assert (rn50.width, rn50.widths) == (512, {"image": 1024})
    assert rn50.encoders["image"].backbone.model_name == "resnet50_clip"
    assert rn50.encoders["image"].output == "pooled"


def test_unknown_and_unsupported_models_are_named(tmp_path: Path, capsys):
    with pytest.raises(ValueError, match=r"unknown open_clip model 'ViT-Q-99'.*ViT-B-32") as e:
        read_model_config("ViT-Q-99")
    assert "SigLIP" not in str(e.value) and "RN50" in str(e.value)
    bad = {
        "text_cfg.no_causal_mask": {
            **TINY["tiny-vit"],
            "text_cfg": {**TEXT, "no_causal_mask": True},
        },
        "vision_cfg.ls_init_value": {
            **TINY["tiny-vit"],
            "vision_cfg": {**TINY["tiny-vit"]["vision_cfg"], "ls_init_value": 1e-5},
        },
        "init_logit_bias": {**TINY["tiny-vit"], "init_logit_bias": -10},
        "text_cfg.hf_model_name": {
            **TINY["tiny-vit"],
            "text_cfg": {"hf_model_name": "roberta-base"},
        },
        "pool_type='eos'": {**TINY["tiny-vit"], "text_cfg": {**TEXT, "pool_type": "eos"}},
        "stage depths [2, 2, 2, 2]": {
            **TINY["tiny-rn"],
            "vision_cfg": {"image_size": 64, "layers": [2, 2, 2, 2], "width": 8},
        },
    }
    for what, cfg in bad.items():
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(cfg))
        line = cli_error(
            capsys,
            ["import", "open_clip", "x.pt", "--model", "bad", "--config", str(path),
             "--out", str(tmp_path / "r")],
        )  # fmt: skip
        assert what in line, line
    assert not (tmp_path / "r").exists()  # refused before reading the weights


def test_missing_extra_and_misshapen_tensors_are_named(imported):
    oc, _, _ = imported["tiny-vit"]
    sd = oc.state_dict()
    cfg = TINY["tiny-vit"]
    missing = {k: v for k, v in sd.items() if k != "ln_final.bias"}
    with pytest.raises(
        ValueError, match=r"does not initialise: \['fusion.towers.text.norm.bias'\]"
    ):
        open_clip_state_dict_to_mmptm(missing, cfg)
    with pytest.raises(ValueError, match=r"no mmptm counterpart: \['text_head.weight'\]"):
        open_clip_state_dict_to_mmptm({**sd, "text_head.weight": torch.zeros(2)}, cfg)
    shorter = {**cfg, "text_cfg": {**TEXT, "context_length": 64}}
    with pytest.raises(ValueError, match=r"encoders.text.position.weight: checkpoint \(77, 32\)"):
        open_clip_state_dict_to_mmptm(sd, shorter)
    with pytest.raises(ValueError, match="visual.class_embedding: not an open_clip ViT"):
        open_clip_state_dict_to_mmptm(imported["tiny-rn"][0].state_dict(), cfg)
    with pytest.raises(ValueError, match="logit_bias"):
        open_clip_state_dict_to_mmptm({**sd, "logit_bias": torch.zeros(())}, cfg)


def test_file_errors_are_named(imported, tmp_path: Path, capsys):
    _, _, config = imported["tiny-vit"]
    jit = tmp_path / "jit.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(jit))
    argv = ["import", "open_clip", str(jit), "--model", "tiny-vit", "--config", str(config)]
    line = cli_error(capsys, [*argv, "--out", str(tmp_path / "r")])
    assert "jit.pt" in line and "TorchScript" in line
    line = cli_error(capsys, [*argv[:2], str(tmp_path / "nope.pt"), *argv[3:], "--out", "r"])
    assert "nope.pt" in line
    vocab = tmp_path / "vocab.txt.gz"
    vocab.write_bytes(b"not gzip")
    line = cli_error(capsys, [*argv, "--vocab", str(vocab), "--out", str(tmp_path / "r")])
    assert "vocab.txt.gz: not a gzipped" in line
    with pytest.raises(ValueError, match="not valid json"):
        import_open_clip(jit, "x", tmp_path / "r", config=vocab)


def test_finetune_from_the_import(imported, tmp_path: Path):
    """``mmptm finetune`` with ``init=`` the imported run: it trains (weights move, the loss
    is finite) and starts from the imported weights (the logit scale comes along)."""
    oc, run, _ = imported["tiny-vit-quickgelu"]
    spec, _, _ = write_shards(tmp_path)
    out = tmp_path / "ft"
    recipe = {
        "init": str(run),
        "output_dir": str(out),
        "data": {"train": spec, "batch_size": 3, "num_workers": 0, "shuffle_buffer": 0},
        "model": {"objectives": {"contrastive": {"type": "contrastive", "embed_dim": 24}}},
        "train": {"max_steps": 2, "lr": 1e-3, "warmup_steps": 0, "log_every": 1,
                  "ckpt_every": 2, "progress": False},
    }  # fmt: skip
    path = tmp_path / "ft.yaml"
    path.write_text(json.dumps(recipe))  # json is yaml
    assert main(["finetune", str(path)]) == 0
    start = checkpoint.read(run).model
    tuned = checkpoint.read(out).model
    assert tuned.keys() == start.keys()
    moved = [k for k in start if not torch.equal(start[k], tuned[k])]
    assert "fusion.towers.text.blocks.0.attn.q.weight" in moved
    assert "encoders.image.backbone.blocks.0.attn.qkv.weight" in moved
    scale = tuned["objectives.contrastive.logit_scale"]
    assert abs(float(scale) - oc.logit_scale.detach().item()) < 0.01  # imported, 2 small steps


def test_hub_config_with_its_preprocessing(imported, tmp_path: Path):
    """An HF hub ``open_clip_config.json`` (``model_cfg`` + ``preprocess_cfg``): its mean,
    std, interpolation and resize mode reach the image plug-in, whose pixels then equal
    open_clip's transform built from the same settings."""
    from mmptm.data.pipeline import single_pass, stream_config

    oc, _, _ = imported["tiny-vit"]
    pre = {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3], "interpolation": "bilinear",
           "resize_mode": "squash"}  # fmt: skip
    hub = tmp_path / "open_clip_config.json"
    hub.write_text(json.dumps({"model_cfg": TINY["tiny-vit"], "preprocess_cfg": pre}))
    torch.save(oc.state_dict(), tmp_path / "model.pt")
    import_open_clip(tmp_path / "model.pt", "tiny-vit", tmp_path / "run", config=hub)
    model, tokenizer, cfg = load_pretrained(str(tmp_path / "run"))
    spec, pngs, _ = write_shards(tmp_path)
    stream = stream_config(
        cfg.data, tokenizer, split="test", shards=spec, needs=model.data_needs(), seed=0
    )
    batch = next(iter(single_pass(stream)))
    preprocess = open_clip.image_transform(
        32, is_train=False, mean=pre["mean"], std=pre["std"], resize_mode="squash",
        interpolation="bilinear",
    )  # fmt: skip
    want = torch.stack([preprocess(Image.open(io.BytesIO(pngs[int(k)]))) for k in batch["__key__"]])
    assert (batch["pixels"] - want).abs().max().item() <= 1e-6
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"model_cfg": TINY["tiny-vit"], "preprocess_cfg": {"resize_mode": "longest"}})
    )
    with pytest.raises(ValueError, match="resize_mode='longest' is unsupported"):
        import_open_clip(tmp_path / "model.pt", "tiny-vit", tmp_path / "run2", config=bad)
