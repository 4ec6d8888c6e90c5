"""Audio encoders: the wav2vec 2.0 waveform encoder and the spectrogram encoder."""

from __future__ import annotations

import pytest
import torch

from mmptm.encoders.audio import (
    WAV2VEC2_LAYOUT,
    AudioSpectrogramEncoder,
    AudioWaveformEncoder,
    conv_lengths,
    receptive_field,
)
from mmptm.modalities.audio_io import conv_steps

WIDTH = 32
TINY = {"conv_dim": 16, "layers": 2, "heads": 4, "pos_conv_kernel": 16, "pos_conv_groups": 4}


def _waveform(**cfg) -> AudioWaveformEncoder:
    torch.manual_seed(0)
    enc = AudioWaveformEncoder(AudioWaveformEncoder.Config(**{**TINY, **cfg}), width=WIDTH)
    with torch.no_grad():
        enc.type_embedding.normal_()
    return enc.eval()


def _spectrogram(**cfg) -> AudioSpectrogramEncoder:
    torch.manual_seed(0)
    base = {"n_mels": 32, "patch_size": 8, "dropout": 0.0}
    enc = AudioSpectrogramEncoder(AudioSpectrogramEncoder.Config(**{**base, **cfg}), width=WIDTH)
    with torch.no_grad():
        if enc.temporal is not None:
            enc.temporal.pos.normal_()  # zero-initialised: make positions visible
    return enc.eval()


def _wave(B: int, S: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(B, S, generator=torch.Generator().manual_seed(seed))


def _right_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    S = max(len(r) for r in rows)
    x = torch.zeros(len(rows), S, *rows[0].shape[1:])
    mask = torch.zeros(len(rows), S, dtype=torch.bool)
    for i, r in enumerate(rows):
        x[i, : len(r)] = r
        mask[i, : len(r)] = True
    return x, mask


# -- audio_waveform ---------------------------------------------------------------------------


def test_conv_lengths_is_conv_steps_on_tensors() -> None:
    lengths = torch.arange(0, 3000)
    got = conv_lengths(lengths, WAV2VEC2_LAYOUT).tolist()
    assert got == [conv_steps(n, WAV2VEC2_LAYOUT) for n in range(3000)]
    assert receptive_field(WAV2VEC2_LAYOUT) == 400 and conv_steps(399, WAV2VEC2_LAYOUT) == 0
    assert conv_steps(400, WAV2VEC2_LAYOUT) == 1


@pytest.mark.parametrize("S", [400, 16000, 16080])
def test_waveform_shapes_and_steps(S: int) -> None:
    enc = _waveform()
    with torch.no_grad():
        out = enc({"audio": _wave(2, S)})
    T = (S - 400) // 320 + 1  # 400-sample receptive field, 320-sample hop
    assert T == {400: 1, 16000: 49, 16080: 50}[S]
    assert out.tokens.shape == (2, T, WIDTH) and out.mask.shape == (2, T) and out.mask.all()
    assert out.targets.shape == (2, T, enc.target_dim) and enc.target_dim == 16
    assert torch.isfinite(out.tokens).all()


def test_waveform_declares_its_data() -> None:
    need = _waveform(normalize=False).data_needs()["audio"]
    assert need.modality == "audio"
    assert need.facts == {
        "sample_rate": 16000,
        "features": "waveform",
        "steps": [[10, 5], [3, 2], [3, 2], [3, 2], [3, 2], [2, 2], [2, 2]],
        "normalize": False,
    }
    enc = AudioWaveformEncoder(AudioWaveformEncoder.Config(**TINY), width=WIDTH, name="speech")
    assert list(enc.data_needs()) == ["speech"] and enc.input_key == "speech_audio"


@pytest.mark.parametrize(
    "cfg",
    [
        {"feature_norm": "layer"},
        {"feature_norm": "group"},
        {"feature_norm": "layer", "prenorm": True},
    ],
    ids=["layer-postLN", "group-postLN", "layer-preLN"],
)
def test_padding_does_not_change_real_steps(cfg: dict) -> None:
    # Group norm too: its statistics are taken over the real steps only (HF's are not).
    enc = _waveform(**cfg)
    rows = [_wave(1, 9000, seed=1)[0], _wave(1, 5123, seed=2)[0], _wave(1, 7000, seed=3)[0]]
    wave, mask = _right_padded(rows)
    with torch.no_grad():
        out = enc({"audio": wave, "audio_mask": mask})
        for i, row in enumerate(rows):
            alone = enc({"audio": row[None]})
            n = conv_steps(len(row), WAV2VEC2_LAYOUT)
            assert out.mask[i].sum() == n and out.mask[i, :n].all()
            torch.testing.assert_close(out.tokens[i, :n], alone.tokens[0], atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(out.targets[i, :n], alone.targets[0], atol=2e-5, rtol=1e-4)


def test_group_norm_over_padding_would_change_real_steps() -> None:
    """Why the masked GroupNorm exists: plain GroupNorm over a zero-padded row differs."""
    enc = _waveform(feature_norm="group")
    row = _wave(1, 5000, seed=4)
    padded = torch.cat([row, torch.zeros(1, 3000)], dim=1)
    with torch.no_grad():
        alone = enc({"audio": row}).tokens
        unmasked = enc({"audio": padded}).tokens[:, : alone.shape[1]]  # no audio_mask
    assert (alone - unmasked).abs().max() > 1e-2


def test_masked_steps_get_the_mask_embedding_before_the_position_conv() -> None:
    enc = _waveform()
    wave, mask = _right_padded([_wave(1, 6000, seed=5)[0], _wave(1, 3000, seed=6)[0]])
    T = conv_steps(6000, WAV2VEC2_LAYOUT)
    masked = torch.zeros(2, T, dtype=torch.bool)
    masked[0, 3:7] = True
    masked[1, T - 2 :] = True  # padding steps of row 1: stay padding (zero)
    seen: list[torch.Tensor] = []
    enc.pos_conv.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        plain = enc({"audio": wave, "audio_mask": mask})
        out = enc({"audio": wave, "audio_mask": mask, "audio_masked": masked})
    before, after = seen
    assert torch.equal(after[0, 3:7], enc.mask_embedding.expand(4, -1))
    keep = ~masked
    assert torch.equal(after[keep], before[keep])
    assert (after[1, ~out.mask[1]] == 0).all()  # padding stays zero, masked or not
    assert torch.equal(out.targets, plain.targets)  # targets are taken before masking
    assert not torch.allclose(out.tokens[0, :2], plain.tokens[0, :2])  # context changed


def test_masking_errors_name_the_key() -> None:
    enc = _waveform(mask_embedding=False)
    wave = _wave(1, 4000)
    with pytest.raises(ValueError, match=r"audio_masked.*mask_embedding: true"):
        enc({"audio": wave, "audio_masked": torch.ones(1, 12, dtype=torch.bool)})
    enc = _waveform()
    with pytest.raises(ValueError, match=r"audio_masked is \(1, 5\).*\(1, 12\)"):
        enc({"audio": wave, "audio_masked": torch.ones(1, 5, dtype=torch.bool)})
    with pytest.raises(ValueError, match="at least 400"):
        enc({"audio": _wave(1, 399)})
    with pytest.raises(ValueError, match=r"waveform \[B,S\].*audio_spectrogram"):
        enc({"audio": torch.zeros(1, 100, 80)})
    with pytest.raises(ValueError, match="pos_conv_groups"):
        _waveform(pos_conv_groups=5)


def test_gradients_reach_every_parameter() -> None:
    enc = _waveform(feature_norm="layer", conv_bias=True).train()
    wave, mask = _right_padded([_wave(1, 6000)[0], _wave(1, 4000, seed=1)[0]])
    masked = torch.zeros(2, conv_steps(6000, WAV2VEC2_LAYOUT), dtype=torch.bool)
    masked[:, 2:5] = True
    out = enc({"audio": wave, "audio_mask": mask, "audio_masked": masked})
    (out.tokens[out.mask].square().sum() + out.targets[out.mask].sum()).backward()
    none = [n for n, p in enc.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert not none
    assert enc.conv.layers[0].conv.weight.grad.abs().sum() > 0


def test_intermediate_layers_and_layer_drop() -> None:
    enc = _waveform(layer_drop=0.5)
    batch = {"audio": _wave(2, 4000)}
    with torch.no_grad():
        full = enc(batch)
        last = enc.encode(batch, layer=2)
        first = enc.encode(batch, layer=1)
        zero = enc.encode(batch, layer=0)
        assert torch.equal(full.tokens, last.tokens + enc.type_embedding)
        assert torch.equal(enc.layer_features(batch, 1), first.tokens)  # HuBERT's teacher
        torch.testing.assert_close(enc.stack.blocks[1](first.tokens), last.tokens)
        torch.testing.assert_close(enc.stack.blocks[0](zero.tokens), first.tokens)
        enc.train()
        torch.manual_seed(0)  # with p = 0.5 over 2 layers, some call of 20 skips one
        assert any(not torch.equal(enc(batch).tokens, full.tokens) for _ in range(20))
    with pytest.raises(ValueError, match="has 2 layers; asked for 3"):
        enc.encode(batch, layer=3)


# -- audio_spectrogram ------------------------------------------------------------------------


def _spec(B: int, T: int, M: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(B, T, M, generator=torch.Generator().manual_seed(seed))


def test_frame_tokens_stack_frames() -> None:
    enc = _spectrogram(tokens="frame", stack=4, layers=1)
    spec, mask = _right_padded([_spec(1, 50)[0], _spec(1, 21, seed=1)[0]])
    with torch.no_grad():
        out = enc({"audio": spec, "audio_mask": mask})
    assert out.tokens.shape == (2, 12, WIDTH)
    assert out.mask.sum(1).tolist() == [12, conv_steps(21, [[4, 4]])]
    assert out.targets.shape == (2, 12, 4 * 32) and enc.target_dim == 4 * 32
    assert torch.equal(out.targets[0, 1], spec[0, 4:8].reshape(-1))
    need = enc.data_needs()["audio"].facts
    assert need == {"sample_rate": 16000, "features": "fbank", "n_mels": 32, "steps": [[4, 4]]}
    with torch.no_grad():  # padding invariance
        alone = enc({"audio": spec[1:, :21]})
    torch.testing.assert_close(out.tokens[1, :5], alone.tokens[0], atol=1e-5, rtol=1e-4)


def test_patch_tokens_are_time_major_and_masked_per_time_step() -> None:
    enc = _spectrogram(tokens="patch", patch_size=8)  # 32 mel bins → 4 frequency patches
    spec, mask = _right_padded([_spec(1, 40)[0], _spec(1, 20, seed=1)[0]])
    masked = torch.zeros(2, 5, dtype=torch.bool)
    masked[0, 2] = True
    with torch.no_grad():
        plain = enc({"audio": spec, "audio_mask": mask})
        out = enc({"audio": spec, "audio_mask": mask, "audio_masked": masked})
    assert out.tokens.shape == (2, 5 * 4, WIDTH)
    assert out.mask.view(2, 5, 4)[:, :, 0].sum(1).tolist() == [5, 2]
    assert out.targets.shape == (2, 20, 64) and enc.target_dim == 64
    assert torch.equal(out.targets[0, 4 + 1], spec[0, 8:16, 8:16].reshape(-1))  # step 1, patch 1
    changed = (out.tokens != plain.tokens).any(-1).view(2, 5, 4)
    assert changed[0, 2].all() and changed.sum() == 4  # every frequency patch of step 2
    tok = out.tokens.view(2, 5, 4, WIDTH)[0, 2] - enc.type_embedding
    # masked patches differ only by their frequency position
    torch.testing.assert_close(tok - enc.freq_pos, (tok - enc.freq_pos)[:1].expand(4, -1))
    assert enc.data_needs()["audio"].facts["steps"] == [[8, 8]]


def test_overlapping_patches() -> None:
    enc = _spectrogram(tokens="patch", patch_size=8, patch_stride=4)
    with torch.no_grad():
        out = enc({"audio": _spec(1, 40)})
    assert out.tokens.shape == (1, 9 * 7, WIDTH)  # time (40-8)/4+1, frequency (32-8)/4+1


@pytest.mark.parametrize(
    ("backbone", "kwargs", "tokens", "n"),
    [
        ("test_resnet", {}, "pool", 1),
        ("test_resnet", {}, "patch", 2 * 1),
        (
            "vit_tiny_patch16_224",
            {"img_size": [64, 32], "patch_size": 16, "embed_dim": 16, "depth": 1, "num_heads": 2},
            "patch",
            1 + 4 * 2,
        ),
    ],
    ids=["resnet-pool", "resnet-patch", "vit-patch"],
)
def test_backbone_tokens(backbone: str, kwargs: dict, tokens: str, n: int) -> None:
    enc = _spectrogram(backbone=backbone, model_kwargs=kwargs, tokens=tokens)
    out = enc({"audio": _spec(2, 64)})
    assert out.tokens.shape == (2, n, WIDTH) and out.mask.all() and out.targets is None
    assert enc.target_dim == 0
    out.tokens.sum().backward()
    assert next(enc.backbone.parameters()).grad is not None
    assert "steps" not in enc.data_needs()["audio"].facts
    with pytest.raises(ValueError, match="backbone, which has no"):
        enc({"audio": _spec(2, 64), "audio_masked": torch.zeros(2, 4, dtype=torch.bool)})


def test_spectrogram_config_and_input_errors() -> None:
    with pytest.raises(ValueError, match="tokens: pool needs a backbone"):
        _spectrogram(tokens="pool")
    with pytest.raises(ValueError, match="not frame"):
        _spectrogram(backbone="test_resnet", tokens="frame")
    with pytest.raises(ValueError, match="fit n_mels"):
        _spectrogram(tokens="patch", patch_size=64)
    enc = _spectrogram()
    with pytest.raises(ValueError, match=r"\[B,T,32\]"):
        enc({"audio": _spec(1, 20, M=80)})
    with pytest.raises(ValueError, match="needs at least 4"):
        enc({"audio": _spec(1, 3)})
    with pytest.raises(ValueError, match="gives 5 steps.*max_steps=4"):
        _spectrogram(max_steps=4)({"audio": _spec(1, 20)})
