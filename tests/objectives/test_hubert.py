"""HuBERT: MFCC frames aligned with the conv feature encoder's steps, unit targets against an
independent nearest-centroid computation, the loss against explicit logits, a frozen teacher
run (a ``.pt`` or a sharded ``.dcp`` checkpoint, loaded by ``mmptm.models``), and ``mmptm units
fit --audio-features`` over audio shards."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from mmptm.cli import main
from mmptm.data.shards import ShardWriter
from mmptm.encoders.base import Encoder, ModalityTokens
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.audio_io import conv_steps, encode_audio
from mmptm.modalities.base import Need
from mmptm.models import checkpoint
from mmptm.models.resources import build_objective
from mmptm.objectives.audio_units import (
    WAV2VEC2_STEPS,
    MfccFeaturizer,
    mfcc_features,
    normalize_wave,
)
from mmptm.objectives.hubert import Hubert
from mmptm.objectives.masking import select_spans
from mmptm.registry import ENCODERS

SR = 16000


class AudioStub(Encoder):
    modality = "audio"
    main_key = "audio"


@ENCODERS.register("test_hubert_teacher")
class TeacherStub(Encoder):
    """A two-layer stand-in for an audio encoder with the wav2vec 2.0 steps; it zeroes its
    [MASK] steps, so a teacher that saw ``audio_masked`` would give other units."""

    modality = "audio"
    main_key = "audio"

    @dataclass
    class Config:
        type: str = "test_hubert_teacher"
        hidden: int = 6

    def __init__(self, cfg: Config, *, width: int, name: str = "", **_: object) -> None:
        super().__init__(width, name)
        self.conv = nn.Conv1d(1, cfg.hidden, 400, stride=320)
        self.layers = nn.ModuleList([nn.Linear(cfg.hidden, cfg.hidden) for _ in range(2)])

    def data_needs(self) -> dict[str, Need]:
        facts = {"sample_rate": SR, "features": "waveform", "normalize": True}
        return {self.view: Need("audio", facts)}

    def layer_features(self, batch: dict, layer: int) -> torch.Tensor:
        h = self.conv(batch[f"{self.prefix}audio"][:, None]).transpose(1, 2)  # [B,T,H]
        if f"{self.prefix}audio_masked" in batch:
            h = h.masked_fill(batch[f"{self.prefix}audio_masked"][..., None], 0.0)
        for lin in self.layers[:layer]:
            h = torch.tanh(lin(h))
        return h


def _nearest64(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    d = ((x[:, None, :].astype(np.float64) - c[None].astype(np.float64)) ** 2).sum(-1)
    return d.argmin(1)


def _waves(lengths, seed=0):
    """A padded batch of noisy chirps: (wave [B,S], mask [B,S], steps [B,T])."""
    rng = np.random.default_rng(seed)
    S = max(lengths)
    wave = np.zeros((len(lengths), S), np.float32)
    for b, n in enumerate(lengths):
        t = np.arange(n) / SR
        f = rng.uniform(200, 3000) + rng.uniform(-1000, 1000) * t
        wave[b, :n] = 0.3 * np.sin(2 * np.pi * f * t) + 0.05 * rng.standard_normal(n)
    lengths_t = torch.tensor(lengths)
    mask = torch.arange(S)[None] < lengths_t[:, None]
    steps_n = torch.tensor([conv_steps(n, WAV2VEC2_STEPS) for n in lengths])
    steps = torch.arange(conv_steps(S, WAV2VEC2_STEPS))[None] < steps_n[:, None]
    return torch.from_numpy(wave), mask, steps


# --------------------------------------------------------------------------------------------
# MFCC features


def test_mfcc_frames_are_the_conv_steps_and_cover_their_windows() -> None:
    from torchaudio.compliance import kaldi

    for S in (0, 399, 400, 401, 719, 720, 1039, 16000, 16001, 33333):
        T = len(mfcc_features(torch.randn(S)))
        assert T == conv_steps(S, WAV2VEC2_STEPS) == (0 if S < 400 else (S - 400) // 320 + 1)
    wave = torch.randn(8123)
    feats = mfcc_features(wave)
    assert feats.shape == (25, 39) and feats.dtype == torch.float32
    norm = normalize_wave(wave)
    for i in (0, 7, 24):  # frame i is the MFCC of samples [320 i, 320 i + 400) alone
        alone = kaldi.mfcc(norm[None, 320 * i : 320 * i + 400], use_energy=False)
        torch.testing.assert_close(feats[i, :13], alone[0], atol=1e-4, rtol=1e-4)
    # the level and offset of the recording do not matter (per-utterance normalisation)
    torch.testing.assert_close(mfcc_features(0.1 * wave + 0.02), feats, atol=2e-3, rtol=1e-3)


def test_mfcc_targets_match_an_independent_nearest_centroid() -> None:
    wave, mask, steps = _waves([16000, 11000, 7001])
    per_utt = [mfcc_features(wave[b, : int(mask[b].sum())]).numpy() for b in range(3)]
    rng = np.random.default_rng(0)
    pool = np.concatenate(per_utt)
    codebook = pool[rng.choice(len(pool), 12, replace=False)] + rng.normal(0, 0.1, (12, 39))
    obj = _hubert(codebook.astype(np.float32))
    labels = obj.targets({"audio": wave, "audio_mask": mask}, steps)
    assert labels.shape == steps.shape
    assert bool((labels[~steps] == -100).all())
    for b in range(3):
        n = int(steps[b].sum())
        assert n == len(per_utt[b])
        np.testing.assert_array_equal(labels[b, :n].numpy(), _nearest64(per_utt[b], codebook))
    assert len(set(labels[steps].tolist())) > 3  # the check is not vacuous
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the trainer's bf16 changes no id
        assert torch.equal(obj.targets({"audio": wave, "audio_mask": mask}, steps), labels)
    with pytest.raises(ValueError, match="not the wav2vec 2.0 layout"):
        MfccFeaturizer().batch({"audio": wave, "audio_mask": mask}, "", steps[:, :-5])


# --------------------------------------------------------------------------------------------
# The objective


def _hubert(codebook: np.ndarray, tmp_path=None, width: int = 8, **cfg) -> Hubert:
    import tempfile
    from pathlib import Path

    folder = Path(tmp_path or tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "codebook.npy"
    np.save(path, codebook)
    encoders = nn.ModuleDict({"audio": AudioStub(width)})
    return build_objective(Hubert.Config(codebook=str(path), **cfg), width=width, encoders=encoders)


def test_loss_is_cosine_cross_entropy_on_masked_steps(tmp_path) -> None:
    torch.manual_seed(0)
    wave, mask, steps = _waves([16000, 12000])
    codebook = np.random.default_rng(0).normal(0, 5, (7, 39)).astype(np.float32)
    obj = _hubert(codebook, tmp_path, final_dim=5)
    masked = select_spans(steps, 0.08, 10, 2, torch.Generator().manual_seed(0))
    h = torch.randn(*steps.shape, 8, requires_grad=True)
    batch = {"audio": wave, "audio_mask": mask, "audio_steps_mask": steps, "audio_masked": masked}
    enc = {"audio": ModalityTokens(h, steps)}
    terms = obj(FusionOutput({"audio": h}, {}, {}, encoded=enc), batch)
    assert set(terms) == {"loss", "acc_masked"}
    labels = obj.targets(batch, steps)
    sel = masked & steps
    p = torch.nn.functional.normalize(obj.final_proj(h[sel]), dim=-1)
    e = torch.nn.functional.normalize(obj.unit_embeddings, dim=-1)
    want = 0.0
    for m in range(int(sel.sum())):
        logits = torch.stack([p[m] @ e[k] / 0.1 for k in range(7)])
        want += (torch.logsumexp(logits, 0) - logits[labels[sel][m]]).item()
    assert terms["loss"].item() == pytest.approx(want / int(sel.sum()), rel=1e-5)
    terms["loss"].backward()
    assert bool((h.grad.abs().sum(-1) > 0)[sel].all())
    assert not bool((h.grad.abs().sum(-1) > 0)[~sel].any())  # unmasked steps: no loss
    both = _hubert(codebook, tmp_path, final_dim=5, pred_nomask_weight=0.5)
    terms = both(FusionOutput({"audio": h}, {}, {}, encoded=enc), batch)
    assert set(terms) == {"loss", "acc_masked", "unmasked_loss", "acc_unmasked"}
    assert terms["unmasked_loss"].item() > 0
    assert obj(FusionOutput({"text": h}, {}, {}), {"input_ids": h}) == {}


def test_a_model_that_sees_the_units_learns_to_predict_them(tmp_path) -> None:
    torch.manual_seed(0)
    wave, mask, steps = _waves([16000, 9000])
    pool = mfcc_features(wave[0]).numpy()
    obj = _hubert(pool[::6][:8].copy(), tmp_path, final_dim=8)
    batch = {"audio": wave, "audio_mask": mask, "audio_steps_mask": steps}
    labels = obj.targets(batch, steps).clamp_min(0)
    context = nn.Embedding(8, 8)  # a context network that recovered each step's unit
    opt = torch.optim.Adam([*obj.parameters(), *context.parameters()], lr=3e-2)
    accs = []
    for s in range(30):
        batch["audio_masked"] = select_spans(steps, 0.08, 10, 2, torch.Generator().manual_seed(s))
        h = context(labels)
        terms = obj(FusionOutput({"audio": h}, {}, {}, encoded={"audio": ModalityTokens(h, steps)}),
                    batch)  # fmt: skip
        opt.zero_grad()
        terms["loss"].backward()
        opt.step()
        accs.append(terms["acc_masked"].item())
    assert accs[0] < 0.5 and np.mean(accs[-5:]) > 0.95, (accs[0], accs[-5:])


def test_config_errors_and_codebook_checks(tmp_path) -> None:
    with pytest.raises(ValueError, match="codebook is unset"):
        Hubert(Hubert.Config(), width=8, encoders=nn.ModuleDict({"audio": AudioStub(8)}))
    with pytest.raises(ValueError, match="width 5, mfcc features 39"):
        _hubert(np.zeros((4, 5), np.float32), tmp_path)
    with pytest.raises(ValueError, match="mfcc or teacher"):
        _hubert(np.zeros((4, 39), np.float32), tmp_path, features="fbank")
    (tmp_path / "codebook.json").write_text(
        json.dumps({"features": {"kind": "teacher", "layer": 6}})
    )
    with pytest.raises(ValueError, match="was fitted on"):
        _hubert(np.zeros((4, 39), np.float32), tmp_path)
    obj = _hubert(np.zeros((4, 39), np.float32), tmp_path / "x")
    assert obj.data_needs() == {"audio": Need("audio", {"sample_rate": SR, "features": "waveform"})}
    assert "codebook" not in obj.state_dict()  # data named by the config, not a weight


# --------------------------------------------------------------------------------------------
# Iteration 2: a teacher run


def _teacher_run(tmp_path, hidden: int = 6, sharded: bool = False):
    """A run dir with two checkpoints of a TeacherStub model (the later one is the teacher);
    ``sharded``: the later one is a ``.dcp`` folder, as a ``train.parallel=fsdp`` run writes."""
    run = tmp_path / "run1"
    config = {"model": {"width": 8, "encoders": {"speech": {"type": "test_hubert_teacher",
                                                            "hidden": hidden}}}}  # fmt: skip
    stubs = []
    for step in (3, 7):
        torch.manual_seed(step)
        stub = TeacherStub(TeacherStub.Config(hidden=hidden), width=8, name="speech")
        model = {f"encoders.speech.{k}": v for k, v in stub.state_dict().items()}
        model["fusion.x"] = torch.zeros(1)
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        ranks = [{"rng": np.random.get_state()}]  # as real checkpoints: not weights only
        if sharded and step == 7:
            checkpoint.write_sharded(run / "checkpoints", step, state={"model": model},
                                     config=config, ranks=ranks)  # fmt: skip
        else:
            state = {"step": step, "model": model, "config": config, "ranks": ranks}
            torch.save(state, run / "checkpoints" / f"step_{step:08d}.pt")
        stubs.append(stub)
    return run, stubs[-1].eval()


@pytest.mark.parametrize("sharded", [False, True], ids=["pt", "dcp"])
def test_teacher_targets_come_from_the_latest_checkpoint_without_masks(tmp_path, sharded) -> None:
    run, stub = _teacher_run(tmp_path, sharded=sharded)
    newest = checkpoint.resolve(run)
    assert newest.name == ("step_00000007.dcp" if sharded else "step_00000007.pt")
    wave, mask, steps = _waves([16000, 10000])
    wave = torch.stack([normalize_wave(w) for w in wave]) * mask  # what the plug-in would give
    with torch.no_grad():
        feats = stub.layer_features({"speech_audio": wave}, 2)  # the teacher run's view
    rng = np.random.default_rng(0)
    pool = feats[steps].numpy()
    codebook = pool[rng.choice(len(pool), 5, replace=False)]
    obj = _hubert(codebook, tmp_path, features="teacher", teacher=str(run), teacher_layer=2)
    assert not any("conv" in k or "layers" in k for k in obj.state_dict())  # frozen, not saved
    assert not any(p is q for p in obj.parameters() for q in stub.parameters())
    facts = {"sample_rate": SR, "features": "waveform", "normalize": True}
    assert obj.data_needs() == {"audio": Need("audio", facts)}
    masked = select_spans(steps, 0.2, 5, 2, torch.Generator().manual_seed(0))
    batch = {"audio": wave, "audio_mask": mask, "audio_steps_mask": steps, "audio_masked": masked}
    labels = obj.targets(batch, steps)
    want = _nearest64(pool, codebook)
    np.testing.assert_array_equal(labels[steps].numpy(), want)
    assert len(set(want.tolist())) >= 3
    with pytest.raises(ValueError, match="teacher_layer"):
        _hubert(codebook, tmp_path, features="teacher", teacher=str(run))
    with pytest.raises(ValueError, match="width 6 but codebook"):
        _hubert(codebook[:, :4].copy(), tmp_path, features="teacher", teacher=str(run),
                teacher_layer=1).targets(batch, steps)  # fmt: skip


# --------------------------------------------------------------------------------------------
# mmptm units fit --audio-features


def _tone(kind: int, n: int, rate: int, rng) -> np.ndarray:
    t = np.arange(n) / rate
    if kind == 0:
        x = np.sin(2 * np.pi * 300 * t)
    elif kind == 1:
        x = np.sin(2 * np.pi * 2500 * t)
    else:
        x = rng.standard_normal(n)
    return (0.3 * x / np.abs(x).max()).astype(np.float32)


def _audio_shards(tmp_path) -> tuple[str, list[tuple[int, np.ndarray]]]:
    rng = np.random.default_rng(0)
    kept = []
    with ShardWriter(str(tmp_path / "audio-%06d.tar"), 4) as w:
        for i in range(9):
            kind, n = i % 3, int(rng.integers(5000, 12000))
            wave = _tone(kind, n, SR, rng)
            w.write({"__key__": f"a{i:03d}", "flac": encode_audio(wave, SR), "json": b"{}"})
            kept.append((kind, wave))
        w.write({"__key__": "rate8k", "wav": encode_audio(_tone(0, 4000, 8000, rng), 8000, "wav")})
        w.write({"__key__": "junk", "flac": b"not audio"})
        w.write({"__key__": "short", "flac": encode_audio(_tone(1, 200, SR, rng), SR)})
        w.write({"__key__": "silent", "txt": b"no audio member"})
    return str(tmp_path / "audio-*.tar"), kept


def test_units_fit_on_mfcc_of_audio_shards(tmp_path, capsys) -> None:
    spec, kept = _audio_shards(tmp_path)
    out = tmp_path / "cb" / "mfcc.npy"
    argv = ["units", "fit", "--shards", spec, "--k", "3", "--audio-features", "mfcc",
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    codebook = np.load(out)
    record = json.loads(out.with_suffix(".json").read_text())
    assert codebook.shape == (3, 39)
    assert record["features"] == {"kind": "mfcc"} and record["member"] == "audio"
    assert record["samples"] == 10 and record["skipped"] == 3  # junk, too short, no audio
    # every frame of the good samples; the 8 kHz one is 8000 samples once resampled
    frames = sum(conv_steps(len(w), WAV2VEC2_STEPS) for _, w in kept)
    assert record["vectors"] == frames + conv_steps(8000, WAV2VEC2_STEPS)
    # each kind of sound is one unit, and the three kinds are three units
    units = {}
    for kind, wave in kept:
        ids = _nearest64(mfcc_features(torch.from_numpy(wave)).numpy(), codebook)
        top = np.bincount(ids, minlength=3).argmax()
        assert (ids == top).mean() > 0.9, (kind, np.bincount(ids))
        units.setdefault(kind, set()).add(int(top))
    assert all(len(u) == 1 for u in units.values()) and len(set.union(*units.values())) == 3
    # the objective accepts the codebook (its sidecar names mfcc)
    encoders = nn.ModuleDict({"audio": AudioStub(8)})
    Hubert(Hubert.Config(codebook=str(out)), width=8, encoders=encoders)


@pytest.mark.parametrize("sharded", [False, True], ids=["pt", "dcp"])
def test_units_fit_on_a_teacher_run(tmp_path, sharded) -> None:
    run, stub = _teacher_run(tmp_path, sharded=sharded)
    spec, kept = _audio_shards(tmp_path)
    out = tmp_path / "teacher.npy"
    argv = ["units", "fit", "--shards", spec, "--k", "3", "--audio-features", str(run),
            "--layer", "1", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["features"] == {"kind": "teacher", "run": str(run), "layer": 1}
    assert np.load(out).shape == (3, 6)
    # the fitted vectors are the teacher's layer-1 states of the normalised waveform
    wave = kept[0][1]
    with torch.no_grad():
        x = normalize_wave(torch.from_numpy(wave))[None]
        want = stub.layer_features({"speech_audio": x}, 1)[0]
    from mmptm.train.units import build_featurizer

    got = build_featurizer(str(run), 1).utterance(torch.from_numpy(wave))
    torch.testing.assert_close(got, want)
    assert main(["units", "fit", "--shards", spec, "--k", "3", "--audio-features", str(run),
                 "--out", str(out)]) == 2  # fmt: skip


# --------------------------------------------------------------------------------------------
# Through the model: data sides, needs, both objectives' terms summed


@ENCODERS.register("test_hubert_student")
class StudentStub(Encoder):
    """A waveform encoder with the wav2vec 2.0 steps: one 400/320 conv (the targets), [MASK]
    at ``audio_masked``, a Linear to the width."""

    modality = "audio"
    main_key = "audio"

    @dataclass
    class Config:
        type: str = "test_hubert_student"
        target_dim: int = 12

    def __init__(self, cfg: Config, *, width: int, name: str = "", **_: object) -> None:
        super().__init__(width, name)
        self.target_dim = cfg.target_dim
        self.conv = nn.Conv1d(1, cfg.target_dim, 400, stride=320)
        self.proj = nn.Linear(cfg.target_dim, width)
        self.mask_embedding = nn.Parameter(torch.randn(width))

    def data_needs(self) -> dict[str, Need]:
        return {self.view: Need("audio", {"sample_rate": SR, "features": "waveform"})}

    def forward(self, batch: dict) -> ModalityTokens:
        p = self.prefix
        y = self.conv(batch[f"{p}audio"][:, None]).transpose(1, 2)  # [B,T,F]
        x = self.proj(y)
        if f"{p}audio_masked" in batch:
            x = torch.where(batch[f"{p}audio_masked"][..., None], self.mask_embedding, x)
        return ModalityTokens(self.add_type(x), batch[f"{p}audio_steps_mask"], y)


def test_wav2vec2_and_hubert_train_one_model(tmp_path) -> None:
    from mmptm.config import from_dict
    from mmptm.encoders.base import VocabInfo
    from mmptm.models.pretrain import PretrainModel, data_transforms
    from mmptm.recipe import ModelConfig

    wave, mask, steps = _waves([16000, 12000, 9000])
    np.save(tmp_path / "cb.npy", mfcc_features(wave[0]).numpy()[::7][:6].copy())
    cfg = from_dict(ModelConfig, {
        "width": 16,
        "encoders": {"audio": {"type": "test_hubert_student"}},
        "fusion": {"type": "dual", "transformer": {"layers": 1, "heads": 2}},
        "objectives": {
            "w2v": {"type": "wav2vec2", "entries": 8, "codevector_dim": 8, "final_dim": 8,
                    "negatives": 5},
            "hubert": {"type": "hubert", "codebook": str(tmp_path / "cb.npy"), "weight": 0.5},
        },
    })  # fmt: skip
    vocab = VocabInfo(vocab_size=8)
    model = PretrainModel(cfg, vocab)
    assert model.data_needs()["audio"].facts == {"sample_rate": SR, "features": "waveform"}
    batch = {"audio": wave, "audio_mask": mask, "audio_steps_mask": steps}
    for t in data_transforms(cfg, vocab):
        batch = t(batch, torch.Generator().manual_seed(0))
    assert batch["audio_masked"].any()
    out = model(batch)
    names = {"w2v_loss", "w2v_diversity_loss", "w2v_acc", "w2v_code_ppl", "w2v_prob_ppl",
             "w2v_temperature", "hubert_loss", "hubert_acc_masked"}  # fmt: skip
    assert set(out.terms) == names
    t = out.terms
    want = t["w2v_loss"] + t["w2v_diversity_loss"] + 0.5 * t["hubert_loss"]
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-5)
    out.loss.backward()
    assert model.encoders["audio"].conv.weight.grad.abs().sum() > 0  # through the quantiser
