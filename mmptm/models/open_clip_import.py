"""Turn an OpenCLIP checkpoint (ViT or ResNet image tower, the built-in text tower) into an mmptm
CLIP run, offline and with numerical parity.

The open_clip model maps onto mmptm's parts, each configured by general options:

- text: the ``text`` encoder with word + position embeddings only (``segments: 0``,
  ``norm: false``, zero modality-type embedding), then the ``dual`` fusion's text tower:
  pre-LN blocks with causal self-attention, GELU or QuickGELU, LayerNorm eps 1e-5, its
  closing LayerNorm being ``ln_final``; pooled at the last real token (``pooling: last``),
  which is open_clip's end-of-text token (``argmax`` pooling) for every input mmptm's
  :class:`~mmptm.tokenizers.clip.ClipTokenizer` gives;
- image: a ``timm_image`` encoder over the timm model that timm itself built to load CLIP
  weights (``vit_*_clip_*``: conv patch embedding, class token, ln_pre, blocks, ln_post;
  ``resnet*_clip``: OpenAI's modified ResNet with its attention pool), whose weights timm's
  own ``checkpoint_filter_fn`` converts; a ViT's tokens are used as they are and pooled at
  the class token, a ResNet gives one token, its attention pool's output;
- ``contrastive``: ``text_projection`` and a ViT's ``proj`` are its bias-free projections
  (a ResNet's attention pool already projects to the embedding: its projection is the
  identity), ``logit_scale`` its temperature. The image tower keeps its own width
  (``model.widths``), so ViT tokens and RN50's 1024-d embedding need no bottleneck.

The run declares open_clip's preprocessing (OpenAI mean/std, bicubic resize of the shorter
side then a centre crop) through the image encoder, and copies the BPE merges file, so it is
self-contained: ``mmptm eval retrieval RUN``, ``mmptm finetune ... init=RUN``, ``mmptm index
RUN`` read it like any run. open_clip itself is only needed to find a model's config json and
the merges file by name; ``--config`` / ``--vocab`` give them without it.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import timm
import torch

from mmptm.config import from_dict, save_config, to_dict
from mmptm.encoders.backbone import load_state_dict_file
from mmptm.encoders.base import VocabInfo
from mmptm.modalities.image import RESIZE_MODES, ImageData
from mmptm.modalities.pixels import RESAMPLE
from mmptm.modalities.text import TextData
from mmptm.models import checkpoint
from mmptm.models.hf_import import compile_names, fit_state, map_name, read_json_object
from mmptm.models.pretrain import PretrainModel
from mmptm.recipe import DataConfig, ModelConfig, RunConfig
from mmptm.tokenizers.clip import ClipTokenizer

__all__ = [
    "OPENAI_MEAN",
    "OPENAI_STD",
    "import_open_clip",
    "open_clip_model_config",
    "open_clip_state_dict_to_mmptm",
    "read_model_config",
]

log = logging.getLogger(__name__)

#: open_clip's OPENAI_DATASET_MEAN / STD, what every CLIP-BPE model is normalised with
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
VOCAB_FILE = "bpe_simple_vocab_16e6.txt.gz"
#: timm's CLIP ResNets by stage depths (open_clip's vision_cfg.layers); widths via width_factor
RESNETS = {
    (3, 4, 6, 3): "resnet50_clip",
    (3, 4, 23, 3): "resnet101_clip",
    (4, 6, 10, 6): "resnet50x4_clip",
    (6, 8, 18, 8): "resnet50x16_clip",
    (3, 15, 36, 10): "resnet50x64_clip",
}
#: timm's names of ViT sizes by width, for a readable model_name (shapes are given anyway)
VIT_SIZES = {384: "small", 512: "medium", 768: "base", 1024: "large", 1280: "huge"}
VIT_SIZES |= {1408: "giant", 1664: "gigantic"}
#: options mmptm reproduces only at these values (open_clip's defaults): anything else is
#: refused by name. Keys not listed here and not in _SHAPES are refused too.
_TOP = {"custom_text": None, "quick_gelu": None, "init_logit_bias": None, "multimodal_cfg": None}
_VISION = {
    "ls_init_value": None,
    "patch_dropout": 0.0,
    "attentional_pool": False,
    "no_ln_pre": False,
    "pos_embed_type": "learnable",
    "final_ln_after_pool": False,
    "pool_type": "tok",
    "output_tokens": False,
    "act_kwargs": None,
    "norm_kwargs": None,
    "block_type": None,
    "qk_norm": False,
    "scaled_cosine_attn": False,
    "scale_heads": False,
    "scale_attn_inner": False,
    "scale_attn": False,
    "scale_fc": False,
    "timm_model_name": None,
}
_TEXT = {
    "hf_tokenizer_name": None,
    "tokenizer_mode": None,
    "tokenizer_kwargs": None,
    "hf_model_name": None,
    "ls_init_value": None,
    "embed_cls": False,
    "pad_id": 0,
    "no_causal_mask": False,
    "final_ln_after_pool": False,
    "proj_bias": False,
    "proj_type": "linear",
    "output_tokens": False,
    "act_kwargs": None,
    "norm_kwargs": None,
    "block_type": None,
    "qk_norm": False,
    "scaled_cosine_attn": False,
    "scale_heads": False,
    "scale_attn_inner": False,
    "scale_attn": False,
    "scale_fc": False,
}
#: shape keys, read below; eos_id only matters to pool_type "eos", which is refused
_SHAPES = {
    "vision_cfg": {"image_size", "layers", "width", "head_width", "mlp_ratio", "patch_size"},
    "text_cfg": {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"},
}
#: open_clip text pooling → mmptm's (argmax = the end token = the last real token)
_TEXT_POOLING = {"argmax": "last", "first": "first"}

_T = "fusion.towers.text."
#: open_clip text-tower name (``text.`` prefix of CustomTextCLIP stripped) → mmptm name
TEXT_TO_MMPTM: dict[str, str] = {
    "token_embedding.weight": "encoders.text.word.weight",
    "positional_embedding": "encoders.text.position.weight",
    "transformer.resblocks.{i}.ln_1.weight": _T + "blocks.{i}.norm1.weight",
    "transformer.resblocks.{i}.ln_1.bias": _T + "blocks.{i}.norm1.bias",
    # split into attn.q / attn.k / attn.v below
    "transformer.resblocks.{i}.attn.in_proj_weight": _T + "blocks.{i}.attn.qkv.weight",
    "transformer.resblocks.{i}.attn.in_proj_bias": _T + "blocks.{i}.attn.qkv.bias",
    "transformer.resblocks.{i}.attn.out_proj.weight": _T + "blocks.{i}.attn.out.weight",
    "transformer.resblocks.{i}.attn.out_proj.bias": _T + "blocks.{i}.attn.out.bias",
    "transformer.resblocks.{i}.ln_2.weight": _T + "blocks.{i}.norm2.weight",
    "transformer.resblocks.{i}.ln_2.bias": _T + "blocks.{i}.norm2.bias",
    "transformer.resblocks.{i}.mlp.c_fc.weight": _T + "blocks.{i}.mlp.0.weight",
    "transformer.resblocks.{i}.mlp.c_fc.bias": _T + "blocks.{i}.mlp.0.bias",
    "transformer.resblocks.{i}.mlp.c_proj.weight": _T + "blocks.{i}.mlp.2.weight",
    "transformer.resblocks.{i}.mlp.c_proj.bias": _T + "blocks.{i}.mlp.2.bias",
    "ln_final.weight": _T + "norm.weight",
    "ln_final.bias": _T + "norm.bias",
    # [width, embed] in open_clip (x @ P); an nn.Linear weight is its transpose
    "text_projection": "objectives.contrastive.proj.text.weight",
    "logit_scale": "objectives.contrastive.logit_scale",
}
_PATTERNS = compile_names(TEXT_TO_MMPTM)
#: tensors some checkpoints carry that are not weights (OpenAI's metadata, old buffers)
_NOT_WEIGHTS = ("attn_mask", "input_resolution", "context_length", "vocab_size")
_IMAGE = "encoders.image."


# -- the model config -------------------------------------------------------------------------


def _open_clip_dir() -> Path | None:
    """The installed open_clip package's folder, found without importing it."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def read_model_config(
    name: str, config: str | Path | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """open_clip's model config of ``name`` and its preprocessing config ({} if none).

    ``config``: a model config json (open_clip's ``model_configs/NAME.json``, or an HF hub
    ``open_clip_config.json`` with ``model_cfg`` / ``preprocess_cfg``); otherwise
    ``NAME.json`` of the installed open_clip package. An unknown name lists the names mmptm
    can import.
    """
    if config is not None:
        tree = read_json_object(Path(config))
    else:
        pkg = _open_clip_dir()
        if pkg is None:
            raise ValueError(
                f"open_clip is not installed, so model {name!r} cannot be looked up: pass "
                "--config with its model config json (open_clip's model_configs/NAME.json)"
            )
        path = pkg / "model_configs" / f"{name}.json"
        if not path.is_file():
            known = sorted((pkg / "model_configs").glob("*.json"))
            importable = [p.stem for p in known if _is_supported(read_json_object(p))]
            raise ValueError(
                f"unknown open_clip model {name!r}; models mmptm imports: {', '.join(importable)}"
            )
        tree = read_json_object(path)
    if "model_cfg" in tree:  # HF hub layout
        return dict(tree["model_cfg"]), dict(tree.get("preprocess_cfg") or {})
    return tree, {}


def _is_supported(model_cfg: Mapping[str, Any]) -> bool:
    try:
        check_model_config(model_cfg)
    except ValueError:
        return False
    return True


def check_model_config(model_cfg: Mapping[str, Any], where: str = "model config") -> None:
    """Refuse, naming the option, any open_clip setting mmptm does not reproduce exactly."""
    for key in ("embed_dim", "vision_cfg", "text_cfg"):
        if key not in model_cfg:
            raise ValueError(f"open_clip {where} lacks {key!r}")
    unknown = set(model_cfg) - {"embed_dim", "vision_cfg", "text_cfg", *_TOP}
    if unknown:
        raise ValueError(f"open_clip {where}: unsupported option(s) {sorted(unknown)}")
    if model_cfg.get("init_logit_bias") is not None:
        raise ValueError(
            f"open_clip {where}: init_logit_bias (SigLIP's sigmoid loss) is unsupported"
        )
    if model_cfg.get("multimodal_cfg") is not None:
        raise ValueError(f"open_clip {where}: multimodal_cfg (CoCa's decoder) is unsupported")
    for part, defaults in (("vision_cfg", _VISION), ("text_cfg", _TEXT)):
        sub = model_cfg[part]
        if not isinstance(sub, Mapping):
            raise ValueError(f"open_clip {where}: {part} must be an object")
        for key, value in sub.items():
            if key in _SHAPES[part] or (part == "text_cfg" and key in ("pool_type", "eos_id")):
                continue
            if key not in defaults:
                raise ValueError(f"open_clip {where}: {part}.{key} is unsupported")
            if value != defaults[key]:
                raise ValueError(
                    f"open_clip {where}: {part}.{key}={value!r} is unsupported (only "
                    f"{defaults[key]!r})"
                )
    pool = model_cfg["text_cfg"].get("pool_type", "argmax")
    if pool not in _TEXT_POOLING:
        raise ValueError(
            f"open_clip {where}: text_cfg.pool_type={pool!r} is unsupported "
            f"(only {sorted(_TEXT_POOLING)})"
        )
    vision = model_cfg["vision_cfg"]
    size = vision.get("image_size", 224)
    if not isinstance(size, int) and len(set(size)) != 1:
        raise ValueError(f"open_clip {where}: non-square vision_cfg.image_size {size}")
    layers = vision.get("layers", 12)
    if isinstance(layers, (list, tuple)):
        if tuple(layers) not in RESNETS:
            raise ValueError(
                f"open_clip {where}: ResNet stage depths {list(layers)} have no timm CLIP "
                f"ResNet (known: {[list(k) for k in RESNETS]})"
            )
        if vision.get("head_width", 64) != 64:
            raise ValueError(
                f"open_clip {where}: vision_cfg.head_width={vision['head_width']} (timm's "
                "CLIP ResNet attention pool has 64-wide heads)"
            )


def _image_encoder(model_cfg: Mapping[str, Any], preprocess: Mapping[str, Any]) -> tuple:
    """The ``timm_image`` encoder config of the vision tower, and the tower's width."""
    vision = model_cfg["vision_cfg"]
    size = vision.get("image_size", 224)
    size = int(size if isinstance(size, int) else size[0])
    width = int(vision.get("width", 768))
    layers = vision.get("layers", 12)
    quick = bool(model_cfg.get("quick_gelu", False))
    mode = preprocess.get("resize_mode", "shortest")
    if mode not in RESIZE_MODES:
        raise ValueError(
            f"open_clip preprocess_cfg.resize_mode={mode!r} is unsupported (only {RESIZE_MODES})"
        )
    common = {"type": "timm_image", "position_embedding": False, "norm": False, "resize_mode": mode}
    facts = {
        "image_size": size,
        "mean": [float(v) for v in preprocess.get("mean", OPENAI_MEAN)],
        "std": [float(v) for v in preprocess.get("std", OPENAI_STD)],
    }
    if isinstance(layers, (list, tuple)):  # ModifiedResNet: the attention pool's output
        embed = int(model_cfg["embed_dim"])
        kwargs = {"img_size": size, "width_factor": width / 64}
        backbone = {"model_name": RESNETS[tuple(layers)], "model_kwargs": kwargs, **facts}
        # projection = attnpool.c_proj
        return {**common, "backbone": backbone, "output": "pooled", "projection": True}, embed
    patch = int(vision["patch_size"])
    heads = width // int(vision.get("head_width", 64))
    kwargs = {
        "img_size": size,
        "patch_size": patch,
        "embed_dim": width,
        "depth": int(layers),
        "num_heads": heads,
        "mlp_ratio": float(vision.get("mlp_ratio", 4.0)),
        "act_layer": "quick_gelu" if quick else "gelu",
    }
    act = "_quickgelu" if quick else ""
    name = f"vit_{VIT_SIZES.get(width, 'base')}_patch{patch}_clip{act}_{size}"
    if not timm.is_model(name):  # the shapes are in model_kwargs either way
        name = f"vit_base_patch16_clip{act}_224"
    backbone = {"model_name": name, "model_kwargs": kwargs, **facts}
    return {**common, "backbone": backbone, "output": "tokens", "projection": False}, width


def open_clip_model_config(
    model_cfg: Mapping[str, Any], preprocess: Mapping[str, Any] | None = None
) -> ModelConfig:
    """The mmptm ``ModelConfig`` equivalent to an open_clip model config (module docstring)."""
    check_model_config(model_cfg)
    text = model_cfg["text_cfg"]
    t_width = int(text.get("width", 512))
    image, i_width = _image_encoder(model_cfg, preprocess or {})
    transformer = {
        "layers": int(text.get("layers", 12)),
        "heads": int(text.get("heads", 8)),
        "mlp_ratio": float(text.get("mlp_ratio", 4.0)),
        "dropout": 0.0,
        "attn_dropout": 0.0,
        "prenorm": True,
        "layer_norm_eps": 1e-5,
        "causal": True,
        "activation": "quick_gelu" if model_cfg.get("quick_gelu") else "gelu",
    }
    tree = {
        "width": t_width,
        "widths": {"image": i_width} if i_width != t_width else {},
        "encoders": {
            "text": {
                "type": "text",
                "max_positions": int(text.get("context_length", 77)),
                "segments": 0,
                "language_embeddings": False,
                "dropout": 0.0,
                "norm": False,
            },
            "image": image,
        },
        "fusion": {
            "type": "dual",
            "transformer": transformer,
            "layers": {"image": 0},
            "pooling": {"text": _TEXT_POOLING[text.get("pool_type", "argmax")], "image": "first"},
        },
        "objectives": {
            "contrastive": {
                "type": "contrastive",
                "modalities": ["image", "text"],
                "embed_dim": int(model_cfg["embed_dim"]),
            }
        },
    }
    return from_dict(ModelConfig, tree, where="model")


# -- the weights ------------------------------------------------------------------------------


def _split_qkv(out: dict[str, torch.Tensor]) -> None:
    """``...attn.qkv.*`` (MultiheadAttention's packed in_proj) → ``attn.q`` / ``k`` / ``v``."""
    for name in [n for n in out if n.startswith(_T) and ".attn.qkv." in n]:
        q, k, v = out.pop(name).chunk(3, dim=0)
        for part, tensor in zip("qkv", (q, k, v)):
            out[name.replace(".attn.qkv.", f".attn.{part}.")] = tensor.contiguous()


def _image_weights(
    visual: dict[str, torch.Tensor], model: PretrainModel, resnet: bool
) -> dict[str, torch.Tensor]:
    """The ``visual.*`` tensors as mmptm's image encoder and image projection, converted by
    timm's own CLIP converters (``checkpoint_filter_fn`` of vision_transformer / byobnet)."""
    backbone = model.encoders["image"].backbone
    if resnet:
        from timm.models.byobnet import checkpoint_filter_fn

        if "visual.conv1.weight" not in visual:
            raise ValueError("checkpoint has no visual.conv1.weight: not an open_clip ResNet")
        timm_sd = checkpoint_filter_fn(visual, backbone)
        # the attention pool's output projection: the encoder's projection (it has a bias)
        out = {_IMAGE + "proj." + k.removeprefix("head.proj."): timm_sd.pop(k)
               for k in [k for k in timm_sd if k.startswith("head.proj.")]}  # fmt: skip
        dim = int(model.cfg.objectives["contrastive"].embed_dim)
        out["objectives.contrastive.proj.image.weight"] = torch.eye(dim)
    else:
        from timm.models.vision_transformer import checkpoint_filter_fn

        if "visual.class_embedding" not in visual:
            raise ValueError("checkpoint has no visual.class_embedding: not an open_clip ViT")
        if "visual.proj" not in visual:
            raise ValueError("checkpoint lacks visual.proj (the image projection)")
        timm_sd = checkpoint_filter_fn(visual, backbone)
        timm_sd.pop("head.weight", None)  # visual.proj, taken as it is below
        timm_sd.pop("head.bias", None)  # zeros the converter adds
        out = {"objectives.contrastive.proj.image.weight": visual["visual.proj"].T}
    out.update({_IMAGE + "backbone." + k: v for k, v in timm_sd.items()})
    return out


def open_clip_state_dict_to_mmptm(
    state: Mapping[str, torch.Tensor],
    model_cfg: Mapping[str, Any],
    preprocess: Mapping[str, Any] | None = None,
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Map an open_clip CLIP state dict onto mmptm; returns (config, state in the model's order).

    Reads the ``CLIP`` layout (text tower at the top level) and ``CustomTextCLIP``'s
    (under ``text.``). Raises ``ValueError`` naming tensors with no mmptm counterpart,
    mmptm parameters the checkpoint leaves uninitialised, and shape mismatches.
    """
    cfg = open_clip_model_config(model_cfg, preprocess)
    state = {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] not in _NOT_WEIGHTS}
    if "logit_bias" in state:
        raise ValueError("checkpoint has logit_bias (a SigLIP-style model): unsupported")
    visual = {k: v for k, v in state.items() if k.startswith("visual.")}
    text = {k.removeprefix("text."): v for k, v in state.items() if not k.startswith("visual.")}
    # Only the vocabulary's size shapes the state dict; the run reads ClipTokenizer's ids.
    vocab = VocabInfo(vocab_size=int(model_cfg["text_cfg"].get("vocab_size", 49408)))
    model = PretrainModel(cfg, vocab)
    resnet = isinstance(model_cfg["vision_cfg"].get("layers", 12), (list, tuple))
    out = _image_weights(visual, model, resnet)
    unmapped = []
    for name, tensor in text.items():
        ours = map_name(_PATTERNS, name)
        if ours is None:
            unmapped.append(name)
            continue
        out[ours] = tensor
    if unmapped:
        raise ValueError(f"checkpoint tensors with no mmptm counterpart: {sorted(unmapped)}")
    if "text_projection" in text:
        out[TEXT_TO_MMPTM["text_projection"]] = text["text_projection"].T
    if "logit_scale" in text:
        out[TEXT_TO_MMPTM["logit_scale"]] = text["logit_scale"].reshape(())
    _split_qkv(out)
    # open_clip has no modality-type embeddings: zero keeps the sums unchanged
    for name in cfg.encoders:
        out[f"encoders.{name}.type_embedding"] = torch.zeros(model.encoders[name].width)
    out = {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}
    return cfg, fit_state(out, model.state_dict())


# -- the run ----------------------------------------------------------------------------------


def load_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict of an open_clip checkpoint file (``.safetensors``, ``.bin`` / ``.pt``
    state dicts, open_clip training checkpoints with ``state_dict``)."""
    try:
        return load_state_dict_file(path)
    except RuntimeError as e:  # TorchScript archives, pickles with code
        raise ValueError(
            f"{path}: not a state dict torch.load reads safely ({' '.join(str(e).split())[:200]}); "
            "for OpenAI's TorchScript .pt files, save open_clip's model.state_dict() instead"
        ) from None


def import_open_clip(
    ckpt: str | Path,
    model: str,
    out_dir: str | Path,
    *,
    config: str | Path | None = None,
    vocab: str | Path | None = None,
) -> Path:
    """Turn an open_clip checkpoint into an mmptm run directory; returns the checkpoint.

    ``model`` names the open_clip model config (``ViT-B-32``, ``RN50``, ...), read from
    ``config`` or the installed open_clip package; ``vocab`` is CLIP's BPE merges file
    (default: the one open_clip ships). Writes ``out_dir/config.yaml``,
    ``out_dir/bpe_simple_vocab_16e6.txt.gz`` (``data.tokenizer``) and
    ``out_dir/checkpoints/step_00000000.pt``.
    """
    ckpt, out_dir = Path(ckpt), Path(out_dir)
    model_cfg, preprocess = read_model_config(model, config)
    check_model_config(model_cfg, f"model config {model!r}")  # before reading the weights
    if vocab is None:
        pkg = _open_clip_dir()
        if pkg is None or not (pkg / VOCAB_FILE).is_file():
            raise ValueError(f"open_clip is not installed: pass --vocab {VOCAB_FILE}")
        vocab = pkg / VOCAB_FILE
    tokenizer = ClipTokenizer.load(vocab)
    n_vocab = int(model_cfg["text_cfg"].get("vocab_size", 49408))
    if tokenizer.vocab_size != n_vocab:
        raise ValueError(
            f"{vocab} gives {tokenizer.vocab_size} ids but the model's text_cfg.vocab_size is "
            f"{n_vocab}"
        )
    cfg, mapped = open_clip_state_dict_to_mmptm(load_checkpoint(ckpt), model_cfg, preprocess)

    tok_path = tokenizer.save(out_dir / VOCAB_FILE).resolve()
    modalities: dict[str, Any] = {
        "text": TextData.Config(max_len=cfg.encoders["text"].max_positions)
    }
    if "interpolation" in preprocess:
        if preprocess["interpolation"] not in RESAMPLE:
            raise ValueError(
                f"open_clip preprocess_cfg.interpolation={preprocess['interpolation']!r} is "
                f"unsupported (only {sorted(RESAMPLE)})"
            )
        modalities["image"] = ImageData.Config(interpolation=preprocess["interpolation"])
    data = DataConfig(tokenizer=str(tok_path), modalities=modalities)
    run = RunConfig(output_dir=str(out_dir.resolve()), data=data, model=cfg)
    save_config(run, out_dir / "config.yaml")
    source = {"checkpoint": str(ckpt.resolve()), "open_clip_model": model, "model_cfg": model_cfg}
    # fit_state made ``mapped`` exactly a fresh model's keys and shapes: it loads strictly
    return checkpoint.write(
        out_dir / checkpoint.CKPT_DIR,
        0,
        model=mapped,
        config=to_dict(run),
        extra={"source": source},
    )
