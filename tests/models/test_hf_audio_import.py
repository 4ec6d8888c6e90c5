"""Importing local HF wav2vec 2.0 / HuBERT checkpoints: parity with transformers, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmptm.cli import main
from mmptm.config import load_config
from mmptm.models import checkpoint
from mmptm.models.hf_audio_import import import_wav2vec2, wav2vec2_state_dict_to_mmptm
from mmptm.models.load import build_model, init_from, load_init, load_pretrained
from mmptm.recipe import RunConfig

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

TOL = 1e-5
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "conv_dim": [16] * 7,
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
}
#: name -> (HF model class, config class, config changes)
KINDS = {
    "wav2vec2": ("Wav2Vec2Model", "Wav2Vec2Config", {}),
    "hubert": ("HubertModel", "HubertConfig", {}),
    # the large "stable layer norm" layout: LayerNorm convs, pre-LN Transformer
    "stable": (
        "Wav2Vec2Model",
        "Wav2Vec2Config",
        {"feat_extract_norm": "layer", "do_stable_layer_norm": True, "conv_bias": True},
    ),
    # HuBERT without the LayerNorm before the projection (DistilHuBERT-style)
    "hubert_noproj": ("HubertModel", "HubertConfig", {"feat_proj_layer_norm": False}),
}


def randomise(model: torch.nn.Module) -> torch.nn.Module:
    # HF initialises norms to 1/0 and biases to 0: perturb everything so that a swapped
    # weight/bias, a wrong eps or a misplaced LayerNorm cannot hide.
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "layer_norm" in name or name.endswith("original0"):  # weight-norm gains too
                p.copy_((1.0 if not name.endswith("bias") else 0.0) + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
    return model.eval()


def hf_model(kind: str, **changes):
    model_cls, cfg_cls, extra = KINDS[kind]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(**{**TINY, **extra, **changes})
    return randomise(getattr(transformers, model_cls)(cfg))


def legacy_state(model: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The state dict as older transformers and fairseq conversions store it (weight_g/v)."""
    names = {"parametrizations.weight.original0": "weight_g"}
    names["parametrizations.weight.original1"] = "weight_v"
    out = {}
    for k, v in model.state_dict().items():
        for new, old in names.items():
            k = k.replace(new, old)
        out[prefix + k] = v
    return out


def write_hf_dir(root: Path, kind: str, fmt: str = "st", **changes) -> tuple[Path, torch.nn.Module]:
    """``fmt`` st: save_pretrained; bin: a ``...ForCTC``-style pickle with legacy names."""
    model = hf_model(kind, **changes)
    hf_dir = root / f"hf_{kind}_{fmt}"
    if fmt == "st":
        model.save_pretrained(hf_dir)
        assert (hf_dir / "model.safetensors").is_file()
    else:
        model.config.save_pretrained(hf_dir)
        prefix = "hubert." if kind.startswith("hubert") else "wav2vec2."
        state = legacy_state(model, prefix)
        state["lm_head.weight"] = torch.zeros(5, 32)  # a CTC head: left behind
        state["lm_head.bias"] = torch.zeros(5)
        torch.save(state, hf_dir / "pytorch_model.bin")
    return hf_dir, model


def waveforms(B: int = 2, S: int = 8000) -> torch.Tensor:
    return torch.randn(B, S, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    ("kind", "fmt"),
    [
        ("wav2vec2", "st"),
        ("hubert", "st"),
        ("stable", "st"),
        ("hubert_noproj", "st"),
        ("wav2vec2", "bin"),
    ],
)
@torch.no_grad()
def test_import_matches_transformers(tmp_path: Path, kind: str, fmt: str) -> None:
    hf_dir, hf = write_hf_dir(tmp_path, kind, fmt)
    import_wav2vec2(hf_dir, tmp_path / "run")
    model, tokenizer, cfg = load_pretrained(str(tmp_path / "run"))
    assert tokenizer is None and not model.training
    enc = model.encoders["audio"]
    wave = waveforms()
    want = hf(wave, output_hidden_states=True)
    out = enc({"audio": wave})
    tokens = out.tokens - enc.type_embedding
    assert (want.last_hidden_state - tokens).abs().max().item() < TOL
    assert (want.hidden_states[1] - enc.encode({"audio": wave}, layer=1).tokens).abs().max() < TOL
    if getattr(want, "extract_features", None) is not None:  # Wav2Vec2Model gives them
        assert (want.extract_features - out.targets).abs().max().item() < TOL
    fused = model.fuse({"audio": wave})  # dual fusion of 0 layers: the encoder's tokens
    assert (want.last_hidden_state - fused.hidden["audio"]).abs().max().item() < TOL
    audio = cfg.model.encoders["audio"]
    assert audio.prenorm == (kind == "stable") and audio.projection_norm == (
        kind != "hubert_noproj"
    )


@torch.no_grad()
def test_padded_input(tmp_path: Path) -> None:
    """layer norm models match HF given attention_mask; group norm ones match themselves."""
    wave = waveforms(2, 8000)
    mask = torch.ones(2, 8000, dtype=torch.bool)
    mask[1, 5000:] = False
    wave[1, 5000:] = 0
    for kind in ("stable", "wav2vec2"):
        hf_dir, hf = write_hf_dir(tmp_path, kind)
        import_wav2vec2(hf_dir, tmp_path / kind)
        enc = load_pretrained(str(tmp_path / kind))[0].encoders["audio"]
        out = enc({"audio": wave, "audio_mask": mask})
        alone = enc({"audio": wave[1:, :5000]})
        n = alone.tokens.shape[1]
        assert out.mask.sum(1).tolist() == [24, n]
        assert (out.tokens[1, :n] - alone.tokens[0]).abs().max().item() < 1e-5
        want = hf(wave, attention_mask=mask.long()).last_hidden_state
        diff = (want[out.mask] - out.tokens[out.mask]).abs().max().item()
        assert diff < TOL if kind == "stable" else diff > 1e-2  # HF: GroupNorm over padding


def test_run_directory_and_init(tmp_path: Path) -> None:
    hf_dir, hf = write_hf_dir(tmp_path, "wav2vec2")
    (hf_dir / "preprocessor_config.json").write_text(
        json.dumps({"do_normalize": False, "sampling_rate": 16000})
    )
    out = tmp_path / "run"
    assert main(["import", "wav2vec2", str(hf_dir), "--out", str(out)]) == 0
    path = out / "checkpoints" / "step_00000000.pt"
    ck = checkpoint.read(path)
    assert ck.step == 0 and ck.optimizer is None and ck.extra["source"]["model_type"] == "wav2vec2"
    cfg = load_config(str(out / "config.yaml"), schema=RunConfig)
    assert cfg == ck.run_config() and cfg.data.tokenizer == ""
    audio = cfg.model.encoders["audio"]
    assert (audio.conv_dim, audio.layers, audio.heads, audio.mlp_ratio) == (16, 2, 4, 2.0)
    assert (audio.feature_norm, audio.prenorm, audio.normalize, audio.mask_embedding) == (
        "group", False, False, True,
    )  # fmt: skip
    assert (audio.pos_conv_kernel, audio.pos_conv_groups, audio.layer_norm_eps) == (16, 4, 1e-5)
    assert torch.equal(ck.model["encoders.audio.mask_embedding"], hf.masked_spec_embed)
    assert not ck.model["encoders.audio.type_embedding"].any()

    # `init:` from the import: the architecture and weights come along, heads stay the recipe's
    recipe = RunConfig(output_dir=str(tmp_path / "ft"), init=str(out))
    init = init_from(recipe)
    model, tokenizer = build_model(recipe)
    assert tokenizer is None and recipe.model.encoders["audio"] == audio
    load_init(model, init.model, recipe.init)
    own = model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in ck.model.items())


def test_heads_of_task_checkpoints_are_left_behind() -> None:
    pre = transformers.Wav2Vec2ForPreTraining(transformers.Wav2Vec2Config(**TINY)).eval()
    state = pre.state_dict()
    assert any(k.startswith("quantizer.") for k in state)
    cfg, mapped = wav2vec2_state_dict_to_mmptm(state, pre.config.to_dict())
    assert cfg.encoders["audio"].mask_embedding
    bare = {k.removeprefix("wav2vec2."): v for k, v in state.items() if k.startswith("wav2vec2.")}
    _, again = wav2vec2_state_dict_to_mmptm(bare, pre.config.to_dict())
    assert mapped.keys() == again.keys() and all(torch.equal(mapped[k], again[k]) for k in mapped)


# -- errors ---------------------------------------------------------------------------------------


def test_unmapped_and_missing_tensors_are_named() -> None:
    hf = hf_model("wav2vec2")
    state, cfg = dict(hf.state_dict()), hf.config.to_dict()
    extra = {**state, "encoder.layers.0.attention.rotary.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"no mmptm counterpart: \['encoder\.layers\.0\.attention"):
        wav2vec2_state_dict_to_mmptm(extra, cfg)
    head = {**state, "adapter_head.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"adapter_head\.weight.*drop_prefixes"):
        wav2vec2_state_dict_to_mmptm(head, cfg)
    wav2vec2_state_dict_to_mmptm(head, cfg, drop_prefixes=["adapter_head."])
    lacking = {k: v for k, v in state.items() if k != "encoder.layers.1.final_layer_norm.bias"}
    with pytest.raises(ValueError, match=r"does not initialise: \[.*stack\.blocks\.1\.norm2\.bias"):
        wav2vec2_state_dict_to_mmptm(lacking, cfg)
    deeper = {**state, "encoder.layers.2.final_layer_norm.bias": torch.zeros(32)}
    with pytest.raises(ValueError, match=r"beyond the config's model.*blocks\.2\.norm2\.bias"):
        wav2vec2_state_dict_to_mmptm(deeper, cfg)


def test_config_errors(tmp_path: Path) -> None:
    hf_dir, _ = write_hf_dir(tmp_path, "wav2vec2")
    original = json.loads((hf_dir / "config.json").read_text())
    for change, match in [
        ({"conv_dim": [16, 16, 16, 16, 16, 16, 8]}, r"conv_dim \[16, .*8\] is not uniform"),
        ({"model_type": "wavlm"}, "model_type is 'wavlm'"),
        ({"hidden_act": "relu"}, "hidden_act='relu'"),
        ({"feat_extract_activation": "relu"}, "feat_extract_activation='relu'"),
        ({"add_adapter": True}, "add_adapter"),
        ({"conv_pos_batch_norm": True}, "conv_pos_batch_norm"),
        ({"num_conv_pos_embedding_groups": 5}, "divisible by pos_conv_groups 5"),
    ]:
        (hf_dir / "config.json").write_text(json.dumps({**original, **change}))
        with pytest.raises(ValueError, match=match) as info:
            import_wav2vec2(hf_dir, tmp_path / "run")
        assert "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()
    (hf_dir / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        import_wav2vec2(hf_dir, tmp_path / "run")
    (hf_dir / "config.json").write_text(json.dumps(original))
    (hf_dir / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors or pytorch_model\.bin"):
        import_wav2vec2(hf_dir, tmp_path / "run")
