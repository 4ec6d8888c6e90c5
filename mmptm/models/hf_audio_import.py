"""Initialise mmptm's ``audio_waveform`` encoder from a local HF wav2vec 2.0 / HuBERT checkpoint.

An HF ``Wav2Vec2Model`` or ``HubertModel`` (or the ``wav2vec2.`` / ``hubert.`` part of a
``...ForPreTraining`` / ``...ForCTC`` / ``...ForSequenceClassification`` checkpoint, whose
heads are left behind) is parameter for parameter one ``audio_waveform`` encoder; the model
around it is a ``dual`` fusion of 0 layers (the encoder's tokens pass through) and no
objectives, so a recipe adds its own heads with ``init:``. The modality-type embedding is
zero, so the encoder's tokens are HF's ``last_hidden_state`` and its ``targets`` HF's
``extract_features``.

Parity is exact (up to float rounding) on unpadded input. On padded input the
``feat_extract_norm: layer`` models match HF given ``attention_mask``; the ``group`` ones
(wav2vec2-base, HuBERT-base) do not, by design: HF's GroupNorm also normalises over padding
(those models are documented to be run without ``attention_mask``), mmptm's only over the
real steps, so a padded clip encodes as it does alone.

The position convolution's weight norm is stored as ``weight_g`` / ``weight_v`` (older
transformers, fairseq conversions) or ``parametrizations.weight.original0`` / ``original1``
(newer): both are read. ``preprocessor_config.json``, when present, gives the waveform
normalisation (``do_normalize``) and the sample rate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from mmptm.config import from_dict, save_config, to_dict
from mmptm.models import checkpoint
from mmptm.models.hf_import import (
    compile_names,
    drop_heads,
    fit_state,
    load_hf_state_dict,
    map_name,
    read_json_object,
    require,
)
from mmptm.models.load import NO_TEXT
from mmptm.models.pretrain import PretrainModel
from mmptm.recipe import DataConfig, ModelConfig, RunConfig

__all__ = [
    "HF_AUDIO_TO_MMPTM",
    "import_wav2vec2",
    "wav2vec2_model_config",
    "wav2vec2_state_dict_to_mmptm",
]

log = logging.getLogger(__name__)

MODEL_TYPES = ("wav2vec2", "hubert")
#: where ``...For*`` checkpoints nest the bare model
PREFIXES = ("wav2vec2.", "hubert.")
#: task heads of HF's wav2vec 2.0 / HuBERT classes: left behind (logged), never mapped
HEADS = (
    "quantizer.",
    "project_hid.",
    "project_q.",
    "lm_head.",
    "projector.",
    "classifier.",
    "layer_weights",
)
PREPROCESSOR = "preprocessor_config.json"
#: the encoder's name in the imported model
VIEW = "audio"

_E = f"encoders.{VIEW}."
_POS = "encoder.pos_conv_embed.conv."
_WN = _E + "pos_conv.conv.parametrizations.weight."
#: HF name (prefix stripped) -> mmptm name; ``{i}`` is a layer index
HF_AUDIO_TO_MMPTM: dict[str, str] = {
    "feature_extractor.conv_layers.{i}.conv.weight": _E + "conv.layers.{i}.conv.weight",
    "feature_extractor.conv_layers.{i}.conv.bias": _E + "conv.layers.{i}.conv.bias",
    "feature_extractor.conv_layers.{i}.layer_norm.weight": _E + "conv.layers.{i}.norm.weight",
    "feature_extractor.conv_layers.{i}.layer_norm.bias": _E + "conv.layers.{i}.norm.bias",
    "feature_projection.layer_norm.weight": _E + "conv_norm.weight",
    "feature_projection.layer_norm.bias": _E + "conv_norm.bias",
    "feature_projection.projection.weight": _E + "proj.weight",
    "feature_projection.projection.bias": _E + "proj.bias",
    "masked_spec_embed": _E + "mask_embedding",
    _POS + "weight_g": _WN + "original0",
    _POS + "weight_v": _WN + "original1",
    _POS + "parametrizations.weight.original0": _WN + "original0",
    _POS + "parametrizations.weight.original1": _WN + "original1",
    _POS + "bias": _E + "pos_conv.conv.bias",
    # encoder.layer_norm: pos_norm (post-LN) or stack.norm (pre-LN), see _layer_norm_name
    "encoder.layers.{i}.attention.q_proj.weight": _E + "stack.blocks.{i}.attn.q.weight",
    "encoder.layers.{i}.attention.q_proj.bias": _E + "stack.blocks.{i}.attn.q.bias",
    "encoder.layers.{i}.attention.k_proj.weight": _E + "stack.blocks.{i}.attn.k.weight",
    "encoder.layers.{i}.attention.k_proj.bias": _E + "stack.blocks.{i}.attn.k.bias",
    "encoder.layers.{i}.attention.v_proj.weight": _E + "stack.blocks.{i}.attn.v.weight",
    "encoder.layers.{i}.attention.v_proj.bias": _E + "stack.blocks.{i}.attn.v.bias",
    "encoder.layers.{i}.attention.out_proj.weight": _E + "stack.blocks.{i}.attn.out.weight",
    "encoder.layers.{i}.attention.out_proj.bias": _E + "stack.blocks.{i}.attn.out.bias",
    "encoder.layers.{i}.layer_norm.weight": _E + "stack.blocks.{i}.norm1.weight",
    "encoder.layers.{i}.layer_norm.bias": _E + "stack.blocks.{i}.norm1.bias",
    "encoder.layers.{i}.feed_forward.intermediate_dense.weight": _E
    + "stack.blocks.{i}.mlp.0.weight",
    "encoder.layers.{i}.feed_forward.intermediate_dense.bias": _E + "stack.blocks.{i}.mlp.0.bias",
    "encoder.layers.{i}.feed_forward.output_dense.weight": _E + "stack.blocks.{i}.mlp.2.weight",
    "encoder.layers.{i}.feed_forward.output_dense.bias": _E + "stack.blocks.{i}.mlp.2.bias",
    "encoder.layers.{i}.final_layer_norm.weight": _E + "stack.blocks.{i}.norm2.weight",
    "encoder.layers.{i}.final_layer_norm.bias": _E + "stack.blocks.{i}.norm2.bias",
}


_PATTERNS = compile_names(HF_AUDIO_TO_MMPTM)


def _mmptm_name(hf_name: str, prenorm: bool) -> str | None:
    if hf_name.startswith("encoder.layer_norm."):
        where = "stack.norm." if prenorm else "pos_norm."
        return _E + where + hf_name.removeprefix("encoder.layer_norm.")
    return map_name(_PATTERNS, hf_name)


def _check_config(hf_config: Mapping[str, Any]) -> None:
    """Refuse what ``audio_waveform`` cannot express, before any weights are read."""
    model_type = hf_config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"HF config model_type is {model_type!r}; expected one of {MODEL_TYPES}")
    for key in ("hidden_act", "feat_extract_activation"):
        if hf_config.get(key, "gelu") != "gelu":
            raise ValueError(f"{key}={hf_config[key]!r} is not supported: mmptm uses exact 'gelu'")
    if hf_config.get("feat_extract_norm", "group") not in ("group", "layer"):
        raise ValueError(
            f"feat_extract_norm={hf_config['feat_extract_norm']!r}: expected group or layer"
        )
    unsupported = {
        "add_adapter": "adapter layers after the encoder",
        "adapter_attn_dim": "attention adapters (MMS)",
        "conv_pos_batch_norm": "a BatchNorm position convolution",
    }
    for key, what in unsupported.items():
        if hf_config.get(key):
            raise ValueError(f"{key}={hf_config[key]!r} ({what}) is not supported")
    dims = list(require(hf_config, "conv_dim"))
    if len(set(dims)) != 1:
        raise ValueError(
            f"conv_dim {dims} is not uniform: the audio_waveform encoder has one conv_dim for "
            "all its conv layers"
        )
    kernels, strides = (
        list(require(hf_config, "conv_kernel")),
        list(require(hf_config, "conv_stride")),
    )
    if not len(dims) == len(kernels) == len(strides):
        raise ValueError(
            f"conv_dim, conv_kernel and conv_stride differ in length: {dims}, {kernels}, {strides}"
        )


def wav2vec2_model_config(
    hf_config: Mapping[str, Any],
    *,
    mask_embedding: bool,
    projection_norm: bool = True,
    normalize: bool = True,
    sample_rate: int = 16000,
) -> ModelConfig:
    """The mmptm ``ModelConfig`` equivalent to an HF wav2vec 2.0 / HuBERT ``config.json``."""
    _check_config(hf_config)
    width = int(require(hf_config, "hidden_size"))
    inter = int(require(hf_config, "intermediate_size"))
    mlp_ratio = inter / width
    if int(width * mlp_ratio) != inter:
        raise ValueError(f"intermediate_size {inter} is not reachable as width * mlp_ratio")
    layout = [[int(k), int(s)] for k, s in zip(hf_config["conv_kernel"], hf_config["conv_stride"])]
    audio = {
        "type": "audio_waveform",
        "sample_rate": int(sample_rate),
        "normalize": bool(normalize),
        "conv_dim": int(hf_config["conv_dim"][0]),
        "conv_layout": layout,
        "conv_bias": bool(hf_config.get("conv_bias", False)),
        "feature_norm": hf_config.get("feat_extract_norm", "group"),
        "projection_norm": projection_norm,
        "layers": int(require(hf_config, "num_hidden_layers")),
        "heads": int(require(hf_config, "num_attention_heads")),
        "mlp_ratio": mlp_ratio,
        "prenorm": bool(hf_config.get("do_stable_layer_norm", False)),
        "layer_norm_eps": float(hf_config.get("layer_norm_eps", 1e-5)),
        "pos_conv_kernel": int(hf_config.get("num_conv_pos_embeddings", 128)),
        "pos_conv_groups": int(hf_config.get("num_conv_pos_embedding_groups", 16)),
        "dropout": float(hf_config.get("hidden_dropout", 0.1)),
        "attn_dropout": float(hf_config.get("attention_dropout", 0.1)),
        "feature_dropout": float(hf_config.get("feat_proj_dropout", 0.0)),
        # HF's layerdrop is a training setting; with DDP it needs find_unused_parameters,
        # so it is left to the recipe (model.encoders.audio.layer_drop).
        "layer_drop": 0.0,
        "mask_embedding": mask_embedding,
    }
    tree = {
        "width": width,
        "encoders": {VIEW: audio},
        "fusion": {"type": "dual", "transformer": {"layers": 0}},
        "objectives": {},
    }
    return from_dict(ModelConfig, tree, where="model")


def _strip_prefix(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # A bare Wav2Vec2Model / HubertModel has no prefix; the For* classes nest it. Heads
    # (lm_head., quantizer., ...) are never prefixed.
    out = {}
    for k, v in state.items():
        for p in PREFIXES:
            if k.startswith(p):
                k = k.removeprefix(p)
                break
        out[k] = v
    return out


def wav2vec2_state_dict_to_mmptm(
    hf_state_dict: Mapping[str, torch.Tensor],
    hf_config: Mapping[str, Any],
    *,
    drop_prefixes: Iterable[str] = (),
    normalize: bool = True,
    sample_rate: int = 16000,
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Map an HF wav2vec 2.0 / HuBERT state dict onto mmptm; returns (config, state).

    Heads of the HF task classes (:data:`HEADS`) and tensors under ``drop_prefixes`` are
    left behind. Raises ``ValueError`` naming every other checkpoint tensor with no mmptm
    counterpart, every mmptm parameter the checkpoint leaves uninitialised, and shape
    mismatches.
    """
    _check_config(hf_config)
    hf = drop_heads(_strip_prefix(hf_state_dict), (*HEADS, *drop_prefixes))
    cfg = wav2vec2_model_config(
        hf_config,
        mask_embedding="masked_spec_embed" in hf,
        projection_norm="feature_projection.layer_norm.weight" in hf,
        normalize=normalize,
        sample_rate=sample_rate,
    )
    prenorm = cfg.encoders[VIEW].prenorm

    out: dict[str, torch.Tensor] = {}
    unmapped: list[str] = []
    for name, tensor in hf.items():
        ours = _mmptm_name(name, prenorm)
        if ours is None:
            unmapped.append(name)
            continue
        out[ours] = tensor.detach().to(torch.float32).clone()
    if unmapped:
        raise ValueError(
            f"checkpoint tensors with no mmptm counterpart: {sorted(unmapped)} "
            "(pass drop_prefixes to leave task heads behind)"
        )
    # mmptm's modality-type embedding has no HF counterpart: zero keeps the tokens HF's.
    out[_E + "type_embedding"] = torch.zeros(cfg.width)

    return cfg, fit_state(out, PretrainModel(cfg, NO_TEXT).state_dict())


def import_wav2vec2(
    hf_dir: str | Path, out_dir: str | Path, *, drop_prefixes: Iterable[str] = ()
) -> Path:
    """Turn a local HF wav2vec 2.0 / HuBERT directory into an mmptm run directory.

    Reads ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``) and, if present,
    ``preprocessor_config.json``. Writes ``out_dir/config.yaml`` and
    ``out_dir/checkpoints/step_00000000.pt``; returns the checkpoint. The run has no
    tokenizer: the model reads no text.
    """
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    config_path = hf_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{hf_dir} lacks config.json")
    hf_config = read_json_object(config_path)
    _check_config(hf_config)  # before reading gigabytes of weights
    normalize, rate = True, 16000
    pre_path = hf_dir / PREPROCESSOR
    if pre_path.is_file():
        pre = read_json_object(pre_path)
        normalize = bool(pre.get("do_normalize", normalize))
        rate = int(pre.get("sampling_rate", rate))
    else:
        log.info("%s has no %s: waveforms normalised, 16 kHz (HF's defaults)", hf_dir, PREPROCESSOR)
    state = load_hf_state_dict(hf_dir)
    cfg, mapped = wav2vec2_state_dict_to_mmptm(
        state, hf_config, drop_prefixes=drop_prefixes, normalize=normalize, sample_rate=rate
    )
    run = RunConfig(output_dir=str(out_dir.resolve()), data=DataConfig(), model=cfg)
    model = PretrainModel(cfg, NO_TEXT)
    model.load_state_dict(mapped)  # strict: proves the checkpoint loads before writing it
    save_config(run, out_dir / "config.yaml")
    source = {"hf_dir": str(hf_dir.resolve()), "model_type": hf_config["model_type"]}
    if hf_config.get("layerdrop"):
        source["layerdrop"] = hf_config["layerdrop"]
    return checkpoint.write(
        out_dir / checkpoint.CKPT_DIR,
        0,
        model=model.state_dict(),
        config=to_dict(run),
        extra={"source": source},
    )
