"""Video encoders: frames (timm per frame + time), pre-extracted features, codebook units."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mmptm.encoders.features import UnitsEncoder, VideoFeaturesEncoder
from mmptm.encoders.video import VideoBackboneEncoder, VideoFramesEncoder
from mmptm.fusion.base import pool

WIDTH = 32
VIT = {
    "model_name": "vit_tiny_patch16_224",
    "model_kwargs": {"img_size": 16, "patch_size": 8, "embed_dim": 16, "depth": 1, "num_heads": 2},
    "image_size": 16,
}
#: no ViT blocks: each patch token is a function of its own 8×8 patch
VIT0 = {**VIT, "model_kwargs": {**VIT["model_kwargs"], "depth": 0}}


def _config(cls, **kwargs):
    """``cls(**kwargs)`` with the keys of its ``backbone`` block (:class:`BackboneConfig` or
    a subclass) moved into that block."""
    block = next(f.default_factory for f in dataclasses.fields(cls) if f.name == "backbone")
    names = {f.name for f in dataclasses.fields(block)}
    backbone = block(**{k: kwargs.pop(k) for k in list(kwargs) if k in names})
    return cls(backbone=backbone, **kwargs)


def _frames(**cfg) -> VideoFramesEncoder:
    torch.manual_seed(0)
    base = {"model_name": "test_resnet", "image_size": 32}
    enc = VideoFramesEncoder(_config(VideoFramesEncoder.Config, **{**base, **cfg}), width=WIDTH)
    with torch.no_grad():
        enc.type_embedding.normal_()
    return enc


def _clips(B: int, T: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(B, T, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _layer_norm(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


@pytest.mark.parametrize(("tokens", "cfg", "per_frame"), [("frame", {}, 1), ("patch", VIT, 5)])
def test_frames_shapes_and_masks(tokens, cfg, per_frame) -> None:
    enc = _frames(tokens=tokens, temporal_layers=1, **cfg).eval()
    size = enc.cfg.backbone.image_size
    mask = torch.tensor([[True, True, True], [True, False, False]])
    with torch.no_grad():
        out = enc({"frames": _clips(2, 3, size), "frames_mask": mask})
    assert out.tokens.shape == (2, 3 * per_frame, WIDTH)
    assert torch.equal(out.mask, mask.repeat_interleave(per_frame, dim=1))
    assert torch.isfinite(out.tokens).all()
    needs = enc.data_needs()["video"]
    assert needs.modality == "video" and needs.facts["size"] == size
    assert len(needs.facts["mean"]) == 3 and len(needs.facts["std"]) == 3


def test_one_frame_clip_is_the_image_through_backbone_projection_and_type() -> None:
    enc = _frames().eval()
    clip = _clips(1, 1, 32)
    with torch.no_grad():
        out = enc({"frames": clip, "frames_mask": torch.ones(1, 1, dtype=torch.bool)})
        f_C = enc.backbone(clip[0])[0]  # the image model alone
        want = _layer_norm(f_C @ enc.proj.weight.T + enc.proj.bias, enc.norm)
        want = want + enc.type_embedding  # temporal position 0 is zero at initialisation
    torch.testing.assert_close(out.tokens[0, 0], want, rtol=1e-5, atol=1e-5)


def test_images_and_clips_go_through_one_encoder() -> None:
    enc = _frames(temporal_layers=1).train()
    images = {"frames": _clips(4, 1, 32), "frames_mask": torch.ones(4, 1, dtype=torch.bool)}
    clips = {"frames": _clips(2, 8, 32, seed=1), "frames_mask": torch.ones(2, 8, dtype=torch.bool)}
    a, b = enc(images), enc(clips)
    assert a.tokens.shape == (4, 1, WIDTH) and b.tokens.shape == (2, 8, WIDTH)
    (a.tokens.sum() + b.tokens.sum()).backward()
    assert enc.temporal.pos.grad is not None and enc.temporal.pos.grad[:8].abs().sum() > 0


def _pooled(enc, clips: torch.Tensor) -> torch.Tensor:
    t = enc({"frames": clips})
    return pool(t.tokens, t.mask, "mean")


@pytest.mark.parametrize(("tokens", "cfg"), [("frame", {}), ("patch", VIT)])
def test_bag_of_frames_at_init_and_temporal_layers_learn_order(tokens, cfg) -> None:
    size = cfg.get("image_size", 32)
    clips = _clips(3, 5, size) * torch.linspace(0.2, 3.0, 5)[None, :, None, None, None]
    perm = torch.tensor([3, 0, 4, 1, 2])
    # a frozen backbone: a big step on it could make every frame look alike
    bag = _frames(tokens=tokens, freeze=True, **cfg).eval()
    temporal = _frames(tokens=tokens, temporal_layers=2, freeze=True, **cfg).eval()
    with torch.no_grad():
        for enc in (bag, temporal):  # zero temporal positions: order-blind at initialisation
            torch.testing.assert_close(
                _pooled(enc, clips), _pooled(enc, clips[:, perm]), rtol=0, atol=1e-6
            )
    target = torch.randn(3, 5, WIDTH, generator=torch.Generator().manual_seed(5))
    for enc in (bag, temporal):  # one step towards a different target for every position
        opt = torch.optim.Adam(enc.parameters(), lr=0.05)
        t = enc({"frames": clips})
        ((t.tokens.view(3, 5, -1, WIDTH) - target[:, :, None]) ** 2).sum().backward()
        opt.step()
    assert temporal.temporal.pos.detach().abs().sum() > 0
    with torch.no_grad():
        # without temporal layers mean pooling stays a bag of frames, positions or not
        bag_gap = (_pooled(bag, clips) - _pooled(bag, clips[:, perm])).abs().max()
        gap = (_pooled(temporal, clips) - _pooled(temporal, clips[:, perm])).abs().max()
    assert bag_gap < 1e-5, bag_gap
    assert gap > 2e-4 and gap > 50 * bag_gap, (gap, bag_gap)


@pytest.mark.parametrize(("layers", "norm"), [(0, "layer"), (2, "layer"), (2, "batch")])
def test_padding_frames_change_nothing_and_skip_the_backbone(layers, norm) -> None:
    # train: BatchNorm (the backbone's, and proj_norm: batch) uses batch statistics, which
    # must come from the real frames alone
    enc = _frames(temporal_layers=layers, proj_norm=norm).train()
    clips = _clips(2, 3, 32)
    calls = []
    enc.backbone.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    short = enc({"frames": clips, "frames_mask": torch.ones(2, 3, dtype=torch.bool)})
    padded = torch.cat([clips, 100 * _clips(2, 2, 32, seed=9)], dim=1)  # garbage padding
    mask = torch.tensor([[True] * 3 + [False] * 2] * 2)
    long = enc({"frames": padded, "frames_mask": mask})
    assert calls == [6, 6]  # the 4 padding frames never reach the backbone
    torch.testing.assert_close(long.tokens[:, :3], short.tokens, rtol=1e-5, atol=1e-5)
    assert torch.equal(long.mask, mask)


def test_batch_proj_norm_standardises_each_channel_over_the_real_frames() -> None:
    """proj_norm: batch removes what every frame of the batch shares (a ViT's plain
    background): each channel of the projected real frames, standardised over them by hand,
    is the token before the type embedding (temporal positions start at zero and there are
    no temporal layers); padding frames are not among them."""
    enc = _frames(proj_norm="batch", frame_vector="grid", **VIT).train()
    clips = 2.0 + 0.3 * _clips(3, 4, 16)  # a shared picture, each frame a little different
    mask = torch.tensor([[True] * 4, [True] * 4, [True, True, False, False]])
    out = enc({"frames": clips, "frames_mask": mask})
    with torch.no_grad():
        f = enc.backbone.forward_features(clips[mask]).flatten(1)  # [10, grid]
        x = enc.proj(f)
        mu, var = x.mean(0), x.var(0, unbiased=False)
        want = (x - mu) / torch.sqrt(var + enc.norm.eps)
    real = out.tokens[out.mask] - enc.type_embedding  # [10, D]
    torch.testing.assert_close(real, want, atol=1e-4, rtol=1e-4)
    layer = _frames(frame_vector="grid", **VIT).train()  # per token: the shared part stays
    same = layer({"frames": clips, "frames_mask": mask}).tokens[out.mask] - layer.type_embedding
    spread = lambda x: ((x - x.mean(0)).norm(dim=-1).mean() / x.mean(0).norm()).item()  # noqa: E731
    assert spread(real) > 10 * spread(same)


def test_patch_tokens_attend_over_time_per_spatial_position() -> None:
    enc = _frames(tokens="patch", temporal_layers=2, **VIT0).eval()
    torch.nn.init.normal_(enc.temporal.pos, std=0.5)
    enc.spatial_pos = None  # so each patch token depends only on its own frame
    clips = _clips(1, 3, 16)
    changed = clips.clone()
    changed[0, 2, :, :8, :8] += 3.0  # frame 2, patch 0 only (a ViT patch is 8×8)
    with torch.no_grad():
        a = enc({"frames": clips}).tokens.view(1, 3, 5, WIDTH)
        b = enc({"frames": changed}).tokens.view(1, 3, 5, WIDTH)
    moved = (a - b).abs().amax(dim=(0, 1, 3))  # per spatial token (0 = ViT's class token)
    assert moved[1] > 1e-3
    assert moved[[0, 2, 3, 4]].max() < 1e-6  # other positions never see frame 2's patch 0
    assert (a - b)[0, :, 1].abs().amax(-1).min() > 1e-4  # every frame at that position did


def test_masked_frames_become_the_mask_embedding() -> None:
    enc = _frames(mask_embedding=True).eval()
    clips = _clips(2, 4, 32)
    masked = torch.tensor([[False, True, False, False], [False, False, False, True]])
    with torch.no_grad():
        out = enc({"frames": clips, "frames_masked": masked}).tokens
        other = enc({"frames": _clips(2, 4, 32, seed=3), "frames_masked": masked}).tokens
        plain = enc({"frames": clips}).tokens
    want = enc.temporal.mask_embedding + enc.type_embedding + enc.temporal.pos[:4][None]
    torch.testing.assert_close(out[masked], want.expand(2, 4, WIDTH)[masked])
    torch.testing.assert_close(other[masked], out[masked])  # frame content is gone
    torch.testing.assert_close(out[~masked], plain[~masked])


def test_frames_errors_name_the_problem() -> None:
    enc = _frames(max_frames=4)
    with pytest.raises(ValueError, match="image_size=32"):
        enc({"frames": _clips(1, 2, 16)})
    with pytest.raises(ValueError, match=r"\[B,T,3,H,W\]"):
        enc({"frames": torch.zeros(1, 3, 32, 32)})
    with pytest.raises(ValueError, match="max_frames=4"):
        enc({"frames": _clips(1, 5, 32)})
    assert enc.temporal.mask_embedding is None  # off by default: no objective masks frames
    with pytest.raises(ValueError, match="frames_masked.*mask_embedding: true"):
        enc({"frames": _clips(1, 2, 32), "frames_masked": torch.ones(1, 2, dtype=torch.bool)})


# ------------------------------------------------------------------------------- features


def test_features_encoder_is_ln_of_projection_plus_positions_and_mask() -> None:
    torch.manual_seed(0)
    enc = VideoFeaturesEncoder(VideoFeaturesEncoder.Config(feature_dim=12), width=WIDTH).eval()
    with torch.no_grad():
        enc.type_embedding.normal_()
        enc.temporal.pos.normal_()
    f = torch.randn(2, 4, 12)
    real = torch.tensor([[True] * 4, [True, True, False, False]])
    masked = torch.tensor([[False, False, True, False], [True, False, False, False]])
    with torch.no_grad():
        out = enc({"features": f, "features_mask": real, "features_masked": masked})
        x = _layer_norm(f @ enc.proj.weight.T + enc.proj.bias, enc.norm)
        x = torch.where(masked[..., None], enc.temporal.mask_embedding, x)
        want = x + enc.temporal.pos_scale * enc.temporal.pos[:4] + enc.type_embedding
    torch.testing.assert_close(out.tokens, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.mask, real)
    assert enc.data_needs() == {"features": enc.data_needs()["features"]}
    assert enc.data_needs()["features"].facts == {"dim": 12}
    with pytest.raises(ValueError, match=r"\[B,T,12\]"):
        enc({"features": torch.zeros(1, 3, 10)})


def test_features_padding_does_not_change_real_steps_with_temporal_layers() -> None:
    torch.manual_seed(0)
    cfg = VideoFeaturesEncoder.Config(feature_dim=8, temporal_layers=2, dropout=0.0)
    enc = VideoFeaturesEncoder(cfg, width=WIDTH).eval()
    f = torch.randn(1, 3, 8)
    with torch.no_grad():
        a = enc({"features": f}).tokens
        padded = torch.cat([f, 50 * torch.randn(1, 2, 8)], dim=1)
        b = enc({"features": padded, "features_mask": torch.tensor([[1, 1, 1, 0, 0]]).bool()})
    torch.testing.assert_close(b.tokens[:, :3], a, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------- units


def test_units_encoder_reads_k_from_the_codebook(tmp_path) -> None:
    book = tmp_path / "codebook.npy"
    np.save(book, np.zeros((7, 5), dtype=np.float32))
    torch.manual_seed(0)
    enc = UnitsEncoder(UnitsEncoder.Config(codebook=str(book)), width=WIDTH).eval()
    assert enc.num_units == 7 and enc.unit.num_embeddings == 7
    assert enc.data_needs()["units"].facts == {"codebook": str(book)}
    ids = torch.tensor([[6, 0, 3], [2, 5, 0]])
    real = torch.tensor([[True, True, True], [True, True, False]])
    masked = torch.tensor([[False, True, False], [False, False, False]])
    with torch.no_grad():
        out = enc({"unit_ids": ids, "unit_mask": real, "unit_masked": masked})
        x = _layer_norm(enc.unit.weight[ids], enc.norm)
        x = torch.where(masked[..., None], enc.temporal.mask_embedding, x)
        want = x + enc.type_embedding  # temporal positions start at zero
    torch.testing.assert_close(out.tokens, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.mask, real)

    with pytest.raises(ValueError, match=r"ids outside \[0, 7\)"):
        enc({"unit_ids": torch.tensor([[7]])})
    with pytest.raises(ValueError, match="num_units=5 but"):
        UnitsEncoder(UnitsEncoder.Config(codebook=str(book), num_units=5), width=WIDTH)
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        UnitsEncoder(UnitsEncoder.Config(codebook=str(tmp_path / "missing.npy")), width=WIDTH)
    with pytest.raises(ValueError, match="needs a codebook"):
        UnitsEncoder(UnitsEncoder.Config(), width=WIDTH)
    assert (
        UnitsEncoder(UnitsEncoder.Config(num_units=3), width=WIDTH).data_needs()["units"].facts
        == {}
    )


# -- video_backbone: torchvision's video networks by name --------------------------------------

#: (model, frame size, frames) small enough for CPU; S3D and MViT need their published
#: input (their pooling / positions are sized for it) and run in the slow test
SMALL_TV = [("r3d_18", 32, 8), ("mc3_18", 32, 8), ("r2plus1d_18", 32, 8), ("swin3d_t", 64, 8)]


def _tv_pair(name: str, size: int, tmp_path, **cfg):
    """A random torchvision model, and a video_backbone encoder loading its saved weights."""
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.get_model(name, weights=None).eval()
    path = tmp_path / f"{name}.pth"
    torch.save(net.state_dict(), path)
    enc = VideoBackboneEncoder(
        _config(
            VideoBackboneEncoder.Config, model_name=name, image_size=size, weights=str(path), **cfg
        ),
        width=WIDTH,
    ).eval()
    return net, enc


def _tv_head(net, name: str):
    """The classifier of torchvision's model, as a function of the pooled clip vector."""
    if name == "s3d":  # a 1x1x1 convolution, then the mean over what is left (one position)
        return lambda v: net.classifier(v[:, :, None, None, None]).flatten(1)
    return net.head if name.startswith(("mvit", "swin")) else net.fc


@pytest.mark.parametrize(("name", "size", "T"), SMALL_TV)
def test_video_backbone_features_are_torchvisions(name, size, T, tmp_path) -> None:
    """Oracle: torchvision's own forward. Its classifier applied to the encoder's clip vector
    (the mean of its time tokens before projection) gives torchvision's logits, so the
    weights file was loaded and the features are read where the network's pooling reads."""
    net, enc = _tv_pair(name, size, tmp_path)
    x_BTCHW = _clips(2, T, size)
    with torch.no_grad():
        want = net(x_BTCHW.transpose(1, 2))
        f_BSC = enc._features(x_BTCHW.transpose(1, 2))
        got = _tv_head(net, name)(f_BSC.mean(dim=1))
        out = enc({"frames": x_BTCHW})
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), (got - want).abs().max()
    S = f_BSC.shape[1]
    assert out.tokens.shape == (2, S, WIDTH) and bool(out.mask.all())
    assert not any(isinstance(m, torch.nn.Linear) and m.out_features == 400
                   for m in enc.backbone.modules())  # the classifier is gone  # fmt: skip


def test_video_backbone_time_tokens_masks_and_clip_token(tmp_path) -> None:
    _, enc = _tv_pair("mc3_18", 32, tmp_path)  # MC3 keeps the time axis: 8 frames, 8 steps
    mask = torch.tensor([[True] * 8, [True] * 3 + [False] * 5])
    with torch.no_grad():
        out = enc({"frames": _clips(2, 8, 32), "frames_mask": mask})
    assert out.tokens.shape == (2, 8, WIDTH) and torch.equal(out.mask, mask)
    _, swin = _tv_pair("swin3d_t", 64, tmp_path)  # patches of 2 frames: 4 steps
    with torch.no_grad():
        out = swin({"frames": _clips(2, 8, 64), "frames_mask": mask})
    assert torch.equal(out.mask, torch.tensor([[True] * 4, [True, True, False, False]]))
    _, clip = _tv_pair("mc3_18", 32, tmp_path, tokens="clip")
    with torch.no_grad():
        out = clip({"frames": _clips(2, 8, 32)})
    assert out.tokens.shape == (2, 1, WIDTH)
    needs = enc.data_needs()["video"]
    assert needs.facts["size"] == 32 and needs.facts["mean"] == pytest.approx(
        [0.43216, 0.394666, 0.37645]
    )


def test_video_backbone_errors_name_the_problem(tmp_path) -> None:
    def cfg(**kwargs):
        return _config(VideoBackboneEncoder.Config, **kwargs)

    with pytest.raises(ValueError, match="unknown model_name 'x3d'.*r2plus1d_18"):
        VideoBackboneEncoder(cfg(model_name="x3d"), width=WIDTH)
    with pytest.raises(ValueError, match="mvit_v2_s gives one vector per clip: set tokens: clip"):
        VideoBackboneEncoder(cfg(model_name="mvit_v2_s"), width=WIDTH)
    _tv_pair("r3d_18", 32, tmp_path)  # writes r3d_18.pth
    with pytest.raises(ValueError, match=r"r3d_18\.pth: weights do not fit 'r2plus1d_18'"):
        VideoBackboneEncoder(cfg(model_name="r2plus1d_18", weights=str(tmp_path / "r3d_18.pth")),
                             width=WIDTH)  # fmt: skip
    with pytest.raises(FileNotFoundError, match="nowhere.pth"):
        VideoBackboneEncoder(cfg(weights=str(tmp_path / "nowhere.pth")), width=WIDTH)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["s3d", "mvit_v2_s"])
def test_video_backbone_at_published_input(name, tmp_path) -> None:
    net, enc = _tv_pair(name, 224, tmp_path, tokens="clip")
    x_BTCHW = _clips(1, 16, 224)
    with torch.no_grad():
        want = net(x_BTCHW.transpose(1, 2))
        got = _tv_head(net, name)(enc._features(x_BTCHW.transpose(1, 2)).mean(dim=1))
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), (got - want).abs().max()
