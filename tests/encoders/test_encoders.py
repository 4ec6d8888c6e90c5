"""Text and timm image encoders: shapes, masks, embeddings, errors, local backbone weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mmptm.encoders.base import VocabInfo
from mmptm.encoders.image import TimmImageEncoder
from mmptm.encoders.text import TextEncoder

WIDTH = 32
VIT_KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 1, "num_heads": 2}


def _config(cls, **kwargs):
    """``cls(**kwargs)`` with the keys of its ``backbone`` block (:class:`BackboneConfig` or
    a subclass) moved into that block."""
    block = next(f.default_factory for f in dataclasses.fields(cls) if f.name == "backbone")
    names = {f.name for f in dataclasses.fields(block)}
    backbone = block(**{k: kwargs.pop(k) for k in list(kwargs) if k in names})
    return cls(backbone=backbone, **kwargs)


def _vocab(languages: tuple[str, ...] = ("en", "de", "fr")) -> VocabInfo:
    return VocabInfo(vocab_size=50, special_ids=frozenset({0, 1, 2, 3, 4}), languages=languages)


def _text_encoder(**cfg_kwargs) -> TextEncoder:
    torch.manual_seed(0)
    cfg = TextEncoder.Config(**{"max_positions": 16, "dropout": 0.1, **cfg_kwargs})
    enc = TextEncoder(cfg, width=WIDTH, vocab=_vocab())
    with torch.no_grad():  # a non-zero type embedding, so it is part of the reference
        enc.type_embedding.normal_()
    return enc.eval()


def _text_batch(g: torch.Generator, B: int = 2, L: int = 6) -> dict[str, torch.Tensor]:
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, 4:] = False
    return {
        "input_ids": torch.randint(5, 50, (B, L), generator=g),
        "attention_mask": mask,
        "position_ids": torch.randint(0, 16, (B, L), generator=g),
        "segment_ids": torch.randint(0, 2, (B, L), generator=g),
        "lang_ids": torch.randint(0, 3, (B, L), generator=g),
    }


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * weight + bias


def test_text_encoder_matches_explicit_sum_of_embeddings() -> None:
    enc = _text_encoder(language_embeddings=True)
    batch = _text_batch(torch.Generator().manual_seed(0))
    with torch.no_grad():
        tokens, mask, _ = enc(batch)
    assert tokens.shape == (2, 6, WIDTH)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, batch["attention_mask"])
    W = {n: getattr(enc, n).weight.detach().double() for n in ("word", "position", "segment")}
    lang = enc.language.weight.detach().double()
    want = torch.zeros(2, 6, WIDTH, dtype=torch.float64)
    for b in range(2):
        for i in range(6):
            want[b, i] = (
                W["word"][batch["input_ids"][b, i]]
                + W["position"][batch["position_ids"][b, i]]
                + W["segment"][batch["segment_ids"][b, i]]
                + lang[batch["lang_ids"][b, i]]
                + enc.type_embedding.detach().double()
            )
    want = _layer_norm(
        want, enc.norm.weight.double(), enc.norm.bias.double(), enc.cfg.layer_norm_eps
    )
    torch.testing.assert_close(tokens.double(), want.detach(), rtol=1e-5, atol=1e-5)


def test_text_encoder_defaults_without_optional_keys() -> None:
    enc = _text_encoder()
    ids = torch.randint(5, 50, (3, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tokens, mask, _ = enc({"input_ids": ids})
        explicit, _, _ = enc(
            {
                "input_ids": ids,
                "attention_mask": torch.ones(3, 5),
                "position_ids": torch.arange(5).expand(3, 5),
                "segment_ids": torch.zeros(3, 5, dtype=torch.long),
            }
        )
    assert tokens.shape == (3, 5, WIDTH)
    assert mask.dtype == torch.bool and bool(mask.all())
    torch.testing.assert_close(tokens, explicit, rtol=0, atol=0)


@pytest.mark.parametrize("key", ["position_ids", "segment_ids", "lang_ids"])
def test_text_encoder_optional_ids_change_output(key: str) -> None:
    enc = _text_encoder(language_embeddings=True)
    batch = _text_batch(torch.Generator().manual_seed(2))
    other = dict(batch)
    limit = {"position_ids": 16, "segment_ids": 2, "lang_ids": 3}[key]
    other[key] = (batch[key] + 1) % limit  # every position gets a different id
    with torch.no_grad():
        a, _, _ = enc(batch)
        b, _, _ = enc(other)
    changed = (a - b).abs().amax(-1) > 1e-4  # [B,L]
    assert bool(changed.all()), f"changing {key} left some positions unchanged"


def test_text_encoder_prefixed_keys_for_second_view() -> None:
    torch.manual_seed(0)
    enc = TextEncoder(TextEncoder.Config(), width=WIDTH, vocab=_vocab(), name="text2").eval()
    ids = torch.randint(5, 50, (2, 4))
    assert enc.input_key == "text2_input_ids"
    assert enc.has_input({"text2_input_ids": ids}) and not enc.has_input({"input_ids": ids})
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    _, got_mask, _ = enc({"text2_input_ids": ids, "text2_attention_mask": mask, "input_ids": ids})
    assert torch.equal(got_mask, mask.bool())


def test_language_embeddings_need_languages() -> None:
    cfg = TextEncoder.Config(language_embeddings=True)
    with pytest.raises(ValueError, match="languages"):
        TextEncoder(cfg, width=WIDTH, vocab=_vocab(languages=()))


def test_segment_id_past_the_segment_embeddings_raises() -> None:
    enc = _text_encoder(segments=1)
    ids = torch.randint(5, 50, (2, 6))
    enc({"input_ids": ids, "segment_ids": torch.zeros_like(ids)})  # one segment: fine
    with pytest.raises(ValueError, match="segment id 1 but the text encoder has 1 segment"):
        enc({"input_ids": ids, "segment_ids": torch.ones_like(ids)})


def test_text_longer_than_max_positions_raises() -> None:
    enc = _text_encoder()
    ids = torch.randint(5, 50, (1, 17))
    with pytest.raises(ValueError, match="max_positions=16"):
        enc({"input_ids": ids})
    enc({"input_ids": ids[:, :16]})  # exactly max_positions is fine


# ---------------------------------------------------------------------------------------------
# timm image encoder


def _resnet(**cfg_kwargs) -> TimmImageEncoder:
    cfg = _config(
        TimmImageEncoder.Config, **{"model_name": "test_resnet", "image_size": 64, **cfg_kwargs}
    )
    return TimmImageEncoder(cfg, width=WIDTH)


def _vit(**cfg_kwargs) -> TimmImageEncoder:
    cfg = _config(
        TimmImageEncoder.Config,
        **{
            "model_name": "vit_tiny_patch16_224",
            "model_kwargs": dict(VIT_KWARGS),
            "image_size": 32,
            **cfg_kwargs,
        },
    )
    return TimmImageEncoder(cfg, width=WIDTH)


def test_cnn_backbone_gives_grid_tokens() -> None:
    torch.manual_seed(0)
    enc = _resnet().eval()
    pixels = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        fmap = enc.backbone.forward_features(pixels)
        tokens, mask, _ = enc({"pixels": pixels})
    assert fmap.ndim == 4
    n = fmap.shape[2] * fmap.shape[3]
    assert enc.n_tokens == n
    assert tokens.shape == (2, n, WIDTH)
    assert mask.shape == (2, n) and mask.dtype == torch.bool and bool(mask.all())
    # token t is grid cell (t // w, t % w), projected + normalised + position + type
    with torch.no_grad():
        cells = fmap.flatten(2).transpose(1, 2)
        want = enc.norm(enc.proj(cells)) + enc.pos + enc.type_embedding
    torch.testing.assert_close(tokens, want, rtol=1e-5, atol=1e-5)


def test_vit_backbone_gives_patch_tokens() -> None:
    torch.manual_seed(0)
    enc = _vit().eval()
    with torch.no_grad():
        tokens, mask, _ = enc({"pixels": torch.randn(3, 3, 32, 32)})
    assert enc.n_tokens == 17  # (32/8)^2 patches + CLS
    assert tokens.shape == (3, 17, WIDTH)
    assert mask.shape == (3, 17) and bool(mask.all())


def test_wrong_image_size_raises() -> None:
    torch.manual_seed(0)
    enc = _vit()
    with pytest.raises(ValueError, match="image_size=32"):
        enc({"pixels": torch.randn(1, 3, 48, 48)})


def test_unknown_timm_model_raises_value_error() -> None:
    with pytest.raises(ValueError, match="no_such_backbone_xyz"):
        TimmImageEncoder(_config(TimmImageEncoder.Config, model_name="no_such_backbone_xyz"),
                         width=WIDTH)  # fmt: skip


def _scrambled_state_dict(enc: TimmImageEncoder) -> dict[str, torch.Tensor]:
    """The backbone's state dict with every float tensor (BN stats included) randomised."""
    g = torch.Generator().manual_seed(123)
    sd = {}
    for k, v in enc.backbone.state_dict().items():
        if v.is_floating_point():
            v = (
                torch.rand(v.shape, generator=g) + 0.5
                if "running_var" in k
                else torch.randn(v.shape, generator=g) * 0.1
            )
        sd[k] = v.clone().contiguous()
    return sd


def _save(sd: dict[str, torch.Tensor], path) -> None:
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(path))
    else:
        torch.save(sd, path)


@pytest.mark.parametrize(
    ("make", "suffix"),
    [(_resnet, ".safetensors"), (_vit, ".pt"), (_vit, ".safetensors")],
    ids=["resnet-safetensors", "vit-pt", "vit-safetensors"],
)
def test_local_backbone_weights_are_loaded(tmp_path, make, suffix: str) -> None:
    torch.manual_seed(0)
    source = make()
    sd = _scrambled_state_dict(source)
    path = tmp_path / f"backbone{suffix}"
    _save(sd, path)
    torch.manual_seed(1)  # a different random init, so equality can only come from the file
    plain = make()
    torch.manual_seed(1)
    loaded = make(weights=str(path))
    state = loaded.backbone.state_dict()
    assert set(state) == set(sd)
    for k, v in sd.items():
        assert torch.equal(state[k], v), k
    assert any(not torch.equal(plain.backbone.state_dict()[k], v) for k, v in sd.items()), (
        "the reference init happens to equal the saved weights"
    )
    size = loaded.cfg.backbone.image_size
    pixels = torch.randn(2, 3, size, size)
    source.backbone.load_state_dict(sd)
    source.eval()
    loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.backbone.forward_features(pixels),
            source.backbone.forward_features(pixels),
            rtol=0,
            atol=0,
        )


def test_weights_nested_and_module_prefixed_are_unwrapped(tmp_path) -> None:
    torch.manual_seed(0)
    sd = _scrambled_state_dict(_vit())
    path = tmp_path / "ckpt.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}}, path)
    loaded = _vit(weights=str(path))
    for k, v in sd.items():
        assert torch.equal(loaded.backbone.state_dict()[k], v), k


def test_weights_of_another_architecture_raise(tmp_path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "vit_weights.pt"
    torch.save(_vit().backbone.state_dict(), path)
    with pytest.raises(ValueError, match="vit_weights.pt") as info:
        _resnet(weights=str(path))
    assert "test_resnet" in str(info.value)


def test_weights_of_same_family_other_size_raise_value_error(tmp_path) -> None:
    torch.manual_seed(0)
    wider = _vit(model_kwargs={**VIT_KWARGS, "embed_dim": 32})
    path = tmp_path / "vit_narrow.safetensors"
    _save(_scrambled_state_dict(wider), path)
    with pytest.raises(ValueError, match="vit_narrow.safetensors"):
        _vit(weights=str(path))


def test_missing_weights_file_raises(tmp_path) -> None:
    path = tmp_path / "nowhere" / "weights.safetensors"
    with pytest.raises(FileNotFoundError, match="weights.safetensors"):
        _resnet(weights=str(path))


def test_text_encoder_without_norm_or_segments_is_word_plus_position() -> None:
    """CLIP's text embedding: the plain sum (the modality-type embedding, zero in an import,
    is still added)."""
    enc = _text_encoder(norm=False, segments=0)
    batch = _text_batch(torch.Generator().manual_seed(1))
    with torch.no_grad():
        tokens, _, _ = enc(batch)
        want = (
            enc.word.weight[batch["input_ids"]]
            + enc.position.weight[batch["position_ids"]]
            + enc.type_embedding
        )
    torch.testing.assert_close(tokens, want, rtol=0, atol=1e-6)
    assert enc.segment is None and not any(isinstance(m, torch.nn.LayerNorm) for m in enc.modules())


def test_padding_row_only_for_a_special_pad_id() -> None:
    special = TextEncoder(TextEncoder.Config(), width=WIDTH, vocab=_vocab())
    assert special.word.padding_idx == 0 and not special.word.weight[0].any()
    text_pad = VocabInfo(vocab_size=50, pad_is_text=True)  # CLIP: id 0 is the piece "!"
    clip = TextEncoder(TextEncoder.Config(), width=WIDTH, vocab=text_pad)
    assert clip.word.padding_idx is None and clip.word.weight[0].any()


def test_pooled_output_is_one_token_of_the_backbones_pooled_features() -> None:
    """``output: pooled``: test_resnet's head pools by the mean over the grid."""
    torch.manual_seed(0)
    enc = _resnet(output="pooled", position_embedding=False).eval()
    pixels = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        tokens, mask, _ = enc({"pixels": pixels})
        grid_mean = enc.backbone.forward_features(pixels).mean(dim=(2, 3))
        want = enc.norm(enc.proj(grid_mean))[:, None] + enc.type_embedding
    assert enc.n_tokens == 1 and tokens.shape == (2, 1, WIDTH) and bool(mask.all())
    torch.testing.assert_close(tokens, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="output 'grid'"):
        _resnet(output="grid")


def test_no_projection_and_no_norm_pass_the_backbone_tokens() -> None:
    torch.manual_seed(0)
    cfg = _config(
        TimmImageEncoder.Config,
        model_name="vit_tiny_patch16_224", model_kwargs=dict(VIT_KWARGS), image_size=32,
        projection=False, norm=False, position_embedding=False, resize_mode="shortest",
    )  # fmt: skip
    enc = TimmImageEncoder(cfg, width=64).eval()  # the ViT's own width
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens, _, _ = enc({"pixels": pixels})
        want = enc.backbone.forward_features(pixels)
    torch.testing.assert_close(tokens, want, rtol=0, atol=0)
    assert enc.data_needs()["image"].facts["resize_mode"] == "shortest"
    assert "resize_mode" not in _vit().data_needs()["image"].facts
    with pytest.raises(ValueError, match="projection=false needs the backbone's 64 channels"):
        TimmImageEncoder(cfg, width=WIDTH)
