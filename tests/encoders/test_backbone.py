"""The shared timm backbone builder: errors name the model, local weights, freezing."""

from __future__ import annotations

import pytest
import timm
import torch

from mmptm.encoders.backbone import BackboneConfig, create_backbone
from mmptm.encoders.image import TimmImageEncoder
from mmptm.encoders.regions import RoIRegionEncoder


@pytest.mark.parametrize(
    ("name", "model_kwargs", "timm_kwargs", "want"),
    [
        ("no_such_backbone_xyz", {}, {"num_classes": 0}, "Unknown model"),
        ("test_resnet", {"bogus_arg": 1}, {}, "bogus_arg"),
        ("test_resnet", {}, {"features_only": True, "out_indices": (9,)}, "out_indices=(9,)"),
        ("test_resnet", {"pretrained": True}, {}, "pretrained"),  # never downloads
    ],
    ids=["unknown", "bad-kwarg", "bad-stage", "pretrained"],
)
def test_construction_errors_are_one_line_value_errors_naming_the_model(
    name: str, model_kwargs: dict, timm_kwargs: dict, want: str
) -> None:
    with pytest.raises(ValueError) as info:
        create_backbone(name, model_kwargs, **timm_kwargs)
    msg = str(info.value)
    assert f"timm could not build {name!r}" in msg and want in msg
    assert "\n" not in msg


def test_encoders_report_the_model_they_could_not_build() -> None:
    for cls in (TimmImageEncoder, RoIRegionEncoder):
        with pytest.raises(ValueError, match="'no_such_backbone_xyz'"):
            cls(cls.Config(backbone=BackboneConfig(model_name="no_such_backbone_xyz")), width=16)


def test_freeze_turns_off_every_backbone_gradient() -> None:
    assert all(p.requires_grad for p in create_backbone("test_resnet").parameters())
    frozen = create_backbone("test_resnet", freeze=True, features_only=True)
    params = list(frozen.parameters())
    assert params and not any(p.requires_grad for p in params)
    # In the encoders only the backbone is frozen: the projection and embeddings still learn.
    for cls in (TimmImageEncoder, RoIRegionEncoder):
        enc = cls(cls.Config(backbone=BackboneConfig(freeze=True)), width=16)
        grads = {n: p.requires_grad for n, p in enc.named_parameters()}
        assert not any(v for n, v in grads.items() if n.startswith("backbone.")), cls
        assert any(v for n, v in grads.items() if not n.startswith("backbone.")), cls


def test_local_weights_are_loaded_before_freezing(tmp_path) -> None:
    torch.manual_seed(0)
    full = timm.create_model("test_resnet", pretrained=False)
    with torch.no_grad():
        for p in full.parameters():
            p.normal_()
    path = tmp_path / "resnet.pt"
    torch.save({"model": full.state_dict()}, path)
    torch.manual_seed(1)
    feats = create_backbone("test_resnet", weights=path, freeze=True, features_only=True)
    own = feats.state_dict()
    assert own and all(torch.equal(v, full.state_dict()[k]) for k, v in own.items())
    assert not any(p.requires_grad for p in feats.parameters())
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        create_backbone("test_resnet", weights=tmp_path / "missing.pt")
    torch.save({"conv1.weight": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="bad.pt: weights do not fit 'test_resnet'"):
        create_backbone("test_resnet", weights=tmp_path / "bad.pt")
