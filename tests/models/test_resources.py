"""What objectives' configs name on disk, loaded by models/: an earlier run's encoder from a
``.pt`` or a sharded ``.dcp`` checkpoint (its weights, frozen, under the name it is built as),
the errors that name the run, and a loader for every kind of resource."""

from __future__ import annotations

import pytest
import torch

from mmptm.encoders.base import VocabInfo
from mmptm.models import checkpoint
from mmptm.models.resources import LOADERS, build_objective, load_encoder
from mmptm.objectives.base import Lines, Resource
from mmptm.objectives.vqa import VQAHead
from mmptm.registry import ENCODERS

AUDIO = {"type": "audio_waveform", "conv_dim": 8, "layers": 1, "heads": 2,
         "pos_conv_kernel": 4, "pos_conv_groups": 2}  # fmt: skip


def _run(tmp_path, encoders: dict, sharded: bool, width: int = 8):
    """A run dir whose one checkpoint holds freshly initialised ``encoders``."""
    from mmptm.config import from_dict
    from mmptm.recipe import ModelConfig

    model_cfg = from_dict(ModelConfig, {"width": width, "encoders": encoders})
    torch.manual_seed(0)
    state = {}
    for name, c in model_cfg.encoders.items():
        enc = ENCODERS.build(c, width=width, vocab=VocabInfo(vocab_size=1), name=name, built={})
        state.update({f"encoders.{name}.{k}": v for k, v in enc.state_dict().items()})
    config = {"model": {"width": width, "encoders": encoders}}
    ckpt_dir = tmp_path / "run" / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    if sharded:
        checkpoint.write_sharded(ckpt_dir, 4, state={"model": state}, config=config)
    else:
        checkpoint.write(ckpt_dir, 4, model=state, config=config)
    return tmp_path / "run", state


@pytest.mark.parametrize("sharded", [False, True], ids=["pt", "dcp"])
def test_an_earlier_runs_encoder_comes_frozen_with_its_weights(tmp_path, sharded) -> None:
    run, state = _run(tmp_path, {"speech": AUDIO}, sharded)
    enc = load_encoder(run, modality="audio", name="audio")  # the run's only audio encoder
    assert enc.view == "audio" and enc.prefix == ""  # built under the name given
    assert not enc.training and not any(p.requires_grad for p in enc.parameters())
    for k, v in enc.state_dict().items():
        torch.testing.assert_close(v, state[f"encoders.speech.{k}"])
    named = load_encoder(run, modality="audio", view="speech")
    assert named.view == "speech"


def test_load_encoder_errors_name_the_run(tmp_path) -> None:
    run, _ = _run(tmp_path, {"a": AUDIO, "b": AUDIO}, sharded=False)
    with pytest.raises(ValueError, match="cannot tell the audio encoder among"):
        load_encoder(run, modality="audio")
    with pytest.raises(ValueError, match="model.encoders has no 'c'"):
        load_encoder(run, modality="audio", view="c")
    for i, bad in enumerate(["shape", "missing"]):  # weights that do not fit the config
        folder = tmp_path / bad
        folder.mkdir()
        run, state = _run(folder, {"a": AUDIO}, sharded=False)
        if bad == "shape":
            cfg = {"model": {"width": 8, "encoders": {"a": {**AUDIO, "conv_dim": 4}}}}
        else:
            cfg = {"model": {"width": 8, "encoders": {"a": AUDIO}}}
            state.pop(sorted(state)[0])
        checkpoint.write(run / "checkpoints", 5 + i, model=state, config=cfg)
        with pytest.raises(ValueError, match="encoders.a weights do not fit its config"):
            load_encoder(run, modality="audio")
    with pytest.raises(FileNotFoundError):
        load_encoder(tmp_path / "nowhere", modality="audio")


def test_every_kind_of_resource_has_a_loader() -> None:
    kinds = set(Resource.__subclasses__())
    assert kinds and kinds <= set(LOADERS)


def test_a_resource_may_not_shadow_the_models_arguments(tmp_path, monkeypatch) -> None:
    (tmp_path / "answers.txt").write_text("yes\nno\n")
    shadow = {"fusion": Lines("vqa.answers", str(tmp_path / "answers.txt"))}
    monkeypatch.setattr(VQAHead, "resources", classmethod(lambda cls, cfg: shadow))
    with pytest.raises(TypeError, match="shadow"):
        build_objective(VQAHead.Config(num_answers=2), width=8, fusion=None)
