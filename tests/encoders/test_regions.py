"""Region encoders: shapes, box geometry, the LN(Wf)+LN(W_p g) embedding, padding, RoI pooling.

Legend: B batch, R regions, F feature dim, C channels, D width.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import timm
import torch
from torch import nn
from torchvision.ops import roi_align

from mmptm.encoders.regions import RegionEncoder, RoIRegionEncoder, box_geometry
from mmptm.registry import ENCODERS

WIDTH = 32
FEAT = 16


def _config(cls, **kwargs):
    """``cls(**kwargs)`` with the keys of its ``backbone`` block (:class:`BackboneConfig` or
    a subclass) moved into that block."""
    block = next(f.default_factory for f in dataclasses.fields(cls) if f.name == "backbone")
    names = {f.name for f in dataclasses.fields(block)}
    backbone = block(**{k: kwargs.pop(k) for k in list(kwargs) if k in names})
    return cls(backbone=backbone, **kwargs)


def _boxes(g: torch.Generator, B: int, R: int) -> torch.Tensor:
    xy = torch.rand(B, R, 2, generator=g) * 0.5
    wh = 0.1 + torch.rand(B, R, 2, generator=g) * 0.4
    return torch.cat([xy, xy + wh], dim=-1)


def _region_batch(seed: int = 0, B: int = 2, R: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, R, dtype=torch.bool)
    mask[1, 3:] = False
    return {
        "region_feats": torch.randn(B, R, FEAT, generator=g),
        "region_boxes": _boxes(g, B, R),
        "region_mask": mask,
    }


def _encoder() -> RegionEncoder:
    torch.manual_seed(0)
    enc = RegionEncoder(RegionEncoder.Config(feature_dim=FEAT), width=WIDTH)
    with torch.no_grad():  # non-trivial LN affine and type embedding, so they are checked
        enc.type_embedding.normal_()
        for norm in (enc.embed.feat_norm, enc.embed.loc_norm):
            norm.weight.normal_()
            norm.bias.normal_()
    return enc.eval()


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def test_registered() -> None:
    assert ENCODERS.get("regions") is RegionEncoder
    assert ENCODERS.get("roi_regions") is RoIRegionEncoder
    assert RegionEncoder.modality == "regions" and RegionEncoder.main_key == "region_feats"
    assert RoIRegionEncoder.modality == "regions" and RoIRegionEncoder.main_key == "region_boxes"


def test_box_geometry_matches_hand_computation() -> None:
    boxes = np.array([[[0.1, 0.2, 0.5, 0.9], [0.0, 0.0, 1.0, 1.0]]], dtype=np.float64)
    want = np.zeros((1, 2, 7))
    for i, (x1, y1, x2, y2) in enumerate(boxes[0]):
        w, h = x2 - x1, y2 - y1
        want[0, i] = [x1, y1, x2, y2, w, h, w * h]
    got = box_geometry(torch.from_numpy(boxes)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(got[0, 0, 4:], [0.4, 0.7, 0.28], atol=1e-12)


def test_region_encoder_shapes_and_explicit_embedding() -> None:
    enc = _encoder()
    batch = _region_batch()
    with torch.no_grad():
        tokens, mask, _ = enc(batch)
    assert tokens.shape == (2, 5, WIDTH)
    assert mask.dtype == torch.bool and torch.equal(mask, batch["region_mask"])

    e = enc.embed
    p = {n: t.detach().double().numpy() for n, t in e.named_parameters()}
    f = batch["region_feats"].double().numpy()
    bx = batch["region_boxes"].double().numpy()
    x1, y1, x2, y2 = (bx[..., i] for i in range(4))
    geo = np.stack([x1, y1, x2, y2, x2 - x1, y2 - y1, (x2 - x1) * (y2 - y1)], -1)
    eps = enc.cfg.layer_norm_eps
    want = _layer_norm(
        f @ p["feat_proj.weight"].T + p["feat_proj.bias"],
        p["feat_norm.weight"], p["feat_norm.bias"], eps,
    ) + _layer_norm(
        geo @ p["loc_proj.weight"].T + p["loc_proj.bias"],
        p["loc_norm.weight"], p["loc_norm.bias"], eps,
    )  # fmt: skip
    want = want + enc.type_embedding.detach().double().numpy()
    real = batch["region_mask"].numpy()
    np.testing.assert_allclose(tokens.double().numpy()[real], want[real], rtol=1e-5, atol=1e-5)


def test_region_encoder_padding_invariance() -> None:
    enc = _encoder()
    batch = _region_batch()
    padded = {k: v.clone() for k, v in batch.items()}
    g = torch.Generator().manual_seed(9)
    extra = 4
    padded["region_feats"] = torch.cat(
        [padded["region_feats"], 1e3 * torch.randn(2, extra, FEAT, generator=g)], 1
    )
    garbage = torch.full((2, extra, 4), float("nan"))
    padded["region_boxes"] = torch.cat([padded["region_boxes"], garbage], 1)
    padded["region_mask"] = torch.cat(
        [padded["region_mask"], torch.zeros(2, extra, dtype=torch.bool)], 1
    )
    # garbage under the existing padding too
    padded["region_feats"][1, 3:5] = float("nan")
    with torch.no_grad():
        a, _, _ = enc(batch)
        b, mask_b, _ = enc(padded)
    real = batch["region_mask"]
    torch.testing.assert_close(b[:, :5][real], a[real], rtol=0, atol=0)
    assert bool(torch.isfinite(b).all()), "padding must never produce NaN tokens"
    assert not bool(mask_b[:, 5:].any())


def test_region_encoder_rejects_wrong_feature_dim() -> None:
    enc = _encoder()
    batch = _region_batch()
    batch["region_feats"] = batch["region_feats"][..., :8]
    with pytest.raises(ValueError, match="feature_dim=16"):
        enc(batch)


# ---------------------------------------------------------------------------------------------
# RoI encoder


def _roi(**cfg) -> RoIRegionEncoder:
    torch.manual_seed(0)
    cfg = _config(RoIRegionEncoder.Config, **{"model_name": "test_resnet", "image_size": 64, **cfg})
    return RoIRegionEncoder(cfg, width=WIDTH).eval()


class _RampBackbone(nn.Module):
    """A predictable 'feature map' [B,C,8,8]: even channels = column index, odd = row index."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels

    def forward(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        B = pixels.shape[0]
        ys, xs = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
        ramp = torch.stack([xs if c % 2 == 0 else ys for c in range(self.channels)])
        return [ramp.expand(B, -1, -1, -1).contiguous()]


def test_roi_pooling_of_a_known_feature_map() -> None:
    enc = _roi()
    C = enc.feature_dim
    enc.backbone = _RampBackbone(C)
    # 64 px image, 8×8 map (scale 1/8). The box [16,8,40,32] px is [2,1,5,4] on the map. With
    # aligned=True a map cell i sits at coordinate i + 0.5, and bilinear samples of a linear
    # ramp placed symmetrically about the box centre average to the ramp at the centre:
    # column (2+5)/2 - 0.5 = 3.0, row (1+4)/2 - 0.5 = 2.0.
    boxes = torch.tensor([[[16 / 64, 8 / 64, 40 / 64, 32 / 64]]])
    pixels = torch.zeros(1, 3, 64, 64)
    with torch.no_grad():
        feats = enc.pool_regions(pixels, boxes, torch.ones(1, 1, dtype=torch.bool))
    assert feats.shape == (1, 1, C)
    torch.testing.assert_close(feats[0, 0, 0::2], torch.full((C // 2,), 3.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(feats[0, 0, 1::2], torch.full((C // 2,), 2.0), atol=1e-5, rtol=0)


def test_roi_encoder_matches_direct_roi_align_and_padding() -> None:
    enc = _roi()
    g = torch.Generator().manual_seed(0)
    pixels = torch.randn(2, 3, 64, 64, generator=g)
    boxes = _boxes(g, 2, 3)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    boxes[1, 1:] = torch.tensor([0.7, 0.7, 0.1, 0.1])  # inverted garbage under the padding
    batch = {"pixels": pixels, "region_boxes": boxes, "region_mask": mask}
    assert enc.has_input(batch) and not enc.has_input({"region_boxes": boxes})
    with torch.no_grad():
        tokens, got_mask, _ = enc(batch)
        fmap = enc.backbone(pixels)[-1]
        scale = fmap.shape[-1] / 64
        want = torch.stack(
            [
                roi_align(
                    fmap,
                    torch.tensor([[float(b), *(boxes[b, r] * 64).tolist()]]),
                    output_size=7,
                    spatial_scale=scale,
                    sampling_ratio=2,
                    aligned=True,
                )
                .mean((2, 3))
                .squeeze(0)
                for b, r in [(0, 0), (0, 1), (0, 2), (1, 0)]
            ]
        )
        got = enc.pool_regions(pixels, boxes, mask)[mask]
        emb_want = enc.embed(want.unsqueeze(0), boxes[mask].unsqueeze(0), mask[mask][None])[0]
    assert tokens.shape == (2, 3, WIDTH) and torch.equal(got_mask, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tokens[mask], emb_want + enc.type_embedding, atol=1e-5, rtol=1e-5)
    assert bool(torch.isfinite(tokens).all())


def test_roi_encoder_local_weights(tmp_path) -> None:
    full = timm.create_model("test_resnet", pretrained=False)
    path = tmp_path / "resnet.pt"
    torch.save(full.state_dict(), path)  # a full model's state dict, head included
    enc = _roi(weights=str(path))
    for k, v in enc.backbone.state_dict().items():
        assert torch.equal(v, full.state_dict()[k]), k
    torch.save({"conv1.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="do not fit"):
        _roi(weights=str(tmp_path / "bad.pt"))


def test_roi_encoder_several_stages_concatenate() -> None:
    enc = _roi(out_indices=[-2, -1])
    assert enc.feature_dim == sum(enc.backbone.feature_info.channels())
    batch = {
        "pixels": torch.zeros(1, 3, 64, 64),
        "region_boxes": torch.tensor([[[0.1, 0.1, 0.6, 0.7]]]),
    }
    with torch.no_grad():
        tokens, mask, _ = enc(batch)
    assert tokens.shape == (1, 1, WIDTH) and bool(mask.all())
