"""Masked frames (CBT): masking statistics, the frame NCE on constructed batches, the heads."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mmptm.encoders.base import ModalityTokens, VocabInfo
from mmptm.encoders.features import VideoFeaturesEncoder
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.masked_frames import MaskedFrames, frame_nce

VOCAB = VocabInfo(vocab_size=20, special_ids=frozenset({0, 1, 2, 3, 4}))


def _transform(**cfg):
    return MaskedFrames.data_transform(MaskedFrames.Config(**cfg), VOCAB)


def test_masking_statistics_at_least_one_per_clip_of_two_or_more() -> None:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 33, (512,), generator=g)
    real = torch.arange(32)[None] < lengths[:, None]
    feats = torch.randn(512, 32, 6, generator=g)
    batch = {"features": feats.clone(), "features_mask": real}
    out = _transform()(batch, torch.Generator().manual_seed(1))
    masked = out["features_masked"]
    assert masked.dtype == torch.bool and not bool((masked & ~real).any())
    assert torch.equal(out["features"], feats)  # the originals stay: they are the targets
    per_clip = masked.sum(1)
    assert bool((per_clip[lengths >= 2] >= 1).all())
    assert bool((per_clip[lengths == 1] == 0).all())
    assert bool((lengths == 1).any())
    frac = masked[lengths >= 8].sum().item() / real[lengths >= 8].sum().item()
    assert 0.14 < frac < 0.18, frac  # 15%, plus the forced ones of unlucky clips
    other = {"input_ids": torch.ones(2, 2, dtype=torch.long)}
    assert _transform()(dict(other), g) == other
    view = _transform(modality="clip")({"clip_features": feats[:4]}, g)
    assert view["clip_features_masked"].shape == (4, 32)


def test_frame_nce_against_an_explicit_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(3, 5, generator=g), torch.randn(7, 5, generator=g)
    own = torch.tensor([4, 0, 6])
    loss, acc = frame_nce(pred, target, own, temperature=0.2)
    want, hits = 0.0, 0
    for m in range(3):
        p = pred[m] / pred[m].norm()
        sims = [float(p @ (t / t.norm())) / 0.2 for t in target]
        want += -sims[own[m]] + math.log(sum(math.exp(s) for s in sims))
        hits += max(range(7), key=lambda j: sims[j]) == own[m]
    assert loss.item() == pytest.approx(want / 3, rel=1e-5)
    assert acc.item() == pytest.approx(hits / 3)
    zero, _ = frame_nce(pred[:0], target, own[:0], 0.1)
    assert zero.item() == 0.0


def _objective(F: int = 8, width: int = 8) -> MaskedFrames:
    torch.manual_seed(0)
    encoders = nn.ModuleDict(
        {"features": VideoFeaturesEncoder(VideoFeaturesEncoder.Config(feature_dim=F), width=width)}
    )
    return MaskedFrames(MaskedFrames.Config(temperature=0.05), width=width, encoders=encoders)


def test_masked_step_picks_its_own_frame_among_all_frames_of_the_batch() -> None:
    """Identity heads and hidden = the original features: every masked step's nearest target
    is itself, so acc = 1 and the loss is the softmax over all real steps of the batch."""
    head = _objective()
    head.predict, head.target = nn.Identity(), nn.Identity()
    feats = torch.eye(8)[torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [3, 6, 0, 0]])]  # [3,4,8]
    feats[2, 1] = 0.9 * torch.eye(8)[6] + 0.1 * torch.eye(8)[5]  # near, not equal, to step (1,2)
    real = torch.tensor([[True] * 4, [True] * 4, [True, True, False, False]])
    masked = torch.tensor([[False, True, False, False], [False] * 4, [False, True, False, False]])
    batch = {"features": feats, "features_mask": real, "features_masked": masked}
    out = head(FusionOutput({"features": feats.clone()}, {}, {}), batch)
    assert out["acc"].item() == 1.0
    # real steps in [B,T] order: clip 0 → rows 0-3, clip 1 → 4-7, clip 2 → 8-9
    targets = [feats[b, t] for b in range(3) for t in range(4) if real[b, t]]
    want = 0.0
    for own, (b, t) in [(1, (0, 1)), (9, (2, 1))]:
        p = feats[b, t] / feats[b, t].norm()
        sims = [float(p @ (x / x.norm())) / 0.05 for x in targets]
        want += -sims[own] + math.log(sum(math.exp(s) for s in sims))
    assert out["loss"].item() == pytest.approx(want / 2, rel=1e-5)
    # a shuffled hidden state (step (0,1) reads clip 1's step 3) picks the wrong frame
    wrong = feats.clone()
    wrong[0, 1] = feats[1, 3]
    assert head(FusionOutput({"features": wrong}, {}, {}), batch)["acc"].item() == 0.5
    # ITM negatives are not predicted: only clip 0's masked step counts
    batch["itm_labels"] = torch.tensor([1, 1, 0])
    neg = head(FusionOutput({"features": wrong}, {}, {}), batch)
    assert neg["acc"].item() == 0.0


def test_learned_heads_train_and_inactive_batches_give_nothing() -> None:
    head = _objective()
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(4, 6, 8, generator=g)
    batch = {"features": feats, "features_masked": torch.rand(4, 6, generator=g) < 0.3}
    out = head(FusionOutput({"features": torch.randn(4, 6, 8, generator=g)}, {}, {}), batch)
    out["loss"].backward()
    for name, p in head.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert head(FusionOutput({"features": feats}, {}, {}), {"features": feats}) == {}


def test_needs_a_features_encoder() -> None:
    with pytest.raises(ValueError, match="not a video_features encoder"):
        MaskedFrames(MaskedFrames.Config(modality="video"), width=8, encoders=nn.ModuleDict())


# --------------------------------------------------------------------------------------------
# Generalised: the encoder's own targets, audio views (SpeechBERT-style masked frames)


class _AudioFrames(nn.Module):
    """Stands for an audio_spectrogram encoder: an audio view whose targets are F wide."""

    modality = "audio"

    def __init__(self, target_dim: int) -> None:
        super().__init__()
        self.target_dim = target_dim


def test_audio_plugin_masks_the_audio_steps_of_its_view() -> None:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([1, 2, 7, 30, 30])
    steps = torch.arange(30)[None] < lengths[:, None]
    side = _transform(plugin="audio", modality="speech")
    out = side({"speech_audio_steps_mask": steps}, g)
    masked = out["speech_audio_masked"]
    assert not bool((masked & ~steps).any()) and "speech_features_masked" not in out
    assert bool((masked.sum(1)[lengths >= 2] >= 1).all()) and masked[0].sum() == 0
    other = {"features": torch.ones(2, 3, 4)}
    assert set(_transform(plugin="audio")(dict(other), g)) == {"features"}  # no audio: as is
    spans = _transform(plugin="audio", modality="audio", mask_length=4)(
        {"audio_steps_mask": steps[3:]}, g
    )
    for row in spans["audio_masked"]:  # spans of 4 whole steps
        runs = "".join("1" if x else "0" for x in row.tolist()).split("0")
        assert all(len(r) >= 4 for r in runs if r), runs
    with pytest.raises(ValueError, match="plugin must be one of"):
        _transform(plugin="video")


def test_encoder_targets_replace_the_batch_features() -> None:
    """hidden = the encoder's targets with identity heads: every masked step finds itself; the
    batch's features (unrelated noise here) would not."""
    g = torch.Generator().manual_seed(0)
    targets = torch.randn(3, 6, 8, generator=g)
    steps = torch.ones(3, 6, dtype=torch.bool)
    steps[2, 4:] = False
    masked = torch.zeros(3, 6, dtype=torch.bool)
    masked[:, 1] = masked[0, 4] = True
    enc = nn.ModuleDict({"audio": _AudioFrames(8)})
    head = MaskedFrames(
        MaskedFrames.Config(plugin="audio", modality="audio"), width=8, encoders=enc
    )
    head.predict, head.target = nn.Identity(), nn.Identity()
    encoded = {"audio": ModalityTokens(targets, steps, targets)}
    batch = {"audio_steps_mask": steps, "audio_masked": masked}
    out = head(FusionOutput({"audio": targets.clone()}, {}, {}, encoded=encoded), batch)
    assert out["acc"].item() == 1.0
    # the features view: given targets win over the batch's features
    feats_head = _objective()
    feats_head.predict, feats_head.target = nn.Identity(), nn.Identity()
    noise = torch.randn(3, 6, 8, generator=g)
    fbatch = {"features": noise, "features_mask": steps, "features_masked": masked}
    fout = FusionOutput({"features": targets.clone()}, {}, {},
                        encoded={"features": ModalityTokens(targets, steps, targets)})  # fmt: skip
    assert feats_head(fout, fbatch)["acc"].item() == 1.0
    fout.encoded = {"features": ModalityTokens(targets, steps)}  # no targets: the batch's
    assert feats_head(fout, fbatch)["acc"].item() < 0.5
    with pytest.raises(ValueError, match="gives no ModalityTokens.targets"):
        no_targets = {"audio": ModalityTokens(targets, steps)}
        head(FusionOutput({"audio": targets}, {}, {}, encoded=no_targets), batch)
    with pytest.raises(ValueError, match="not an audio encoder"):
        MaskedFrames(MaskedFrames.Config(plugin="audio"), width=8, encoders=nn.ModuleDict())
    with pytest.raises(ValueError, match="set target_dim"):
        MaskedFrames(MaskedFrames.Config(plugin="audio", modality="a"), width=8,
                     encoders=nn.ModuleDict({"a": _AudioFrames(0)}))  # fmt: skip
