"""Initialise mmptm's text model from a local HF-format XLM-R (or RoBERTa) checkpoint, offline.

XLM-R is a post-LN BERT over fairseq token ids, so it maps onto one ``text`` encoder
(``position_offset = pad + 1``, zero modality-type embedding), ``single_stream`` fusion with
``prenorm=False`` and, when the checkpoint has an LM head, the ``mlm`` objective, whose output
layer is tied to the word embeddings as in XLM-R. Task heads (:data:`HEADS`: a sequence- or
token-classification, multiple-choice or question-answering checkpoint's) are left behind,
and said so in the log. ``import_xlmr`` writes an mmptm run directory that
``mmptm.models.load.load_pretrained`` reads back; its ``data.modalities.text`` holds
XLM-R's pair layout (``<s> a </s></s> b </s>``, one segment, positions running on), which
every run started from it with ``init=`` takes over.

Only right-padded inputs match HF at every real position: HF numbers positions by counting
non-pad tokens, mmptm by index. Padding positions themselves differ and carry no meaning.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from mmptm.config import from_dict, save_config, to_dict
from mmptm.encoders.base import VocabInfo
from mmptm.modalities.text import TextData
from mmptm.models import checkpoint
from mmptm.models.pretrain import PretrainModel
from mmptm.recipe import DataConfig, ModelConfig, RunConfig
from mmptm.tokenizers.sentencepiece import Tokenizer

__all__ = [
    "HEADS",
    "HF_TO_MMPTM",
    "PAIR_LAYOUT",
    "drop_heads",
    "fit_state",
    "import_xlmr",
    "load_hf_state_dict",
    "xlmr_state_dict_to_mmptm",
]

log = logging.getLogger(__name__)

MODEL_TYPES = ("xlm-roberta", "roberta")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
SPM_FILE = "sentencepiece.bpe.model"
#: task heads of HF's XLM-R / RoBERTa classes (...ForSequenceClassification,
#: ...ForTokenClassification, ...ForMultipleChoice, ...ForQuestionAnswering): left behind
HEADS = ("classifier.", "qa_outputs.")

#: HF name (after the ``roberta.`` prefix is stripped) -> mmptm name; ``{i}`` is a layer index
HF_TO_MMPTM: dict[str, str] = {
    "embeddings.word_embeddings.weight": "encoders.text.word.weight",
    "embeddings.position_embeddings.weight": "encoders.text.position.weight",
    "embeddings.token_type_embeddings.weight": "encoders.text.segment.weight",
    "embeddings.LayerNorm.weight": "encoders.text.norm.weight",
    "embeddings.LayerNorm.bias": "encoders.text.norm.bias",
    "encoder.layer.{i}.attention.self.query.weight": "fusion.stack.blocks.{i}.attn.q.weight",
    "encoder.layer.{i}.attention.self.query.bias": "fusion.stack.blocks.{i}.attn.q.bias",
    "encoder.layer.{i}.attention.self.key.weight": "fusion.stack.blocks.{i}.attn.k.weight",
    "encoder.layer.{i}.attention.self.key.bias": "fusion.stack.blocks.{i}.attn.k.bias",
    "encoder.layer.{i}.attention.self.value.weight": "fusion.stack.blocks.{i}.attn.v.weight",
    "encoder.layer.{i}.attention.self.value.bias": "fusion.stack.blocks.{i}.attn.v.bias",
    "encoder.layer.{i}.attention.output.dense.weight": "fusion.stack.blocks.{i}.attn.out.weight",
    "encoder.layer.{i}.attention.output.dense.bias": "fusion.stack.blocks.{i}.attn.out.bias",
    "encoder.layer.{i}.attention.output.LayerNorm.weight": "fusion.stack.blocks.{i}.norm1.weight",
    "encoder.layer.{i}.attention.output.LayerNorm.bias": "fusion.stack.blocks.{i}.norm1.bias",
    "encoder.layer.{i}.intermediate.dense.weight": "fusion.stack.blocks.{i}.mlp.0.weight",
    "encoder.layer.{i}.intermediate.dense.bias": "fusion.stack.blocks.{i}.mlp.0.bias",
    "encoder.layer.{i}.output.dense.weight": "fusion.stack.blocks.{i}.mlp.2.weight",
    "encoder.layer.{i}.output.dense.bias": "fusion.stack.blocks.{i}.mlp.2.bias",
    "encoder.layer.{i}.output.LayerNorm.weight": "fusion.stack.blocks.{i}.norm2.weight",
    "encoder.layer.{i}.output.LayerNorm.bias": "fusion.stack.blocks.{i}.norm2.bias",
    "pooler.dense.weight": "fusion.pooler.0.weight",
    "pooler.dense.bias": "fusion.pooler.0.bias",
    "lm_head.dense.weight": "objectives.mlm.transform.0.weight",
    "lm_head.dense.bias": "objectives.mlm.transform.0.bias",
    "lm_head.layer_norm.weight": "objectives.mlm.transform.2.weight",
    "lm_head.layer_norm.bias": "objectives.mlm.transform.2.bias",
    "lm_head.bias": "objectives.mlm.bias",
}
# Checked against the tensors they duplicate rather than mapped: mmptm ties the MLM output
# layer to the word embeddings, and HF's decoder bias is the same tensor as lm_head.bias.
_TIED = {
    "lm_head.decoder.weight": "embeddings.word_embeddings.weight",
    "lm_head.decoder.bias": "lm_head.bias",
}
#: how XLM-R and RoBERTa join a sentence pair (``data.modalities.text``): ``<s> a </s></s> b
#: </s>``, every segment id 0 (HF's tokenizer writes no other), positions running on
PAIR_LAYOUT = {"segments": 1, "separators": 2, "restart_positions": False}
# Buffers some HF versions save; mmptm derives them from the input.
_UNUSED = ("embeddings.position_ids", "embeddings.token_type_ids")
_PREFIX = "roberta."
# The one post-LN LayerNorm eps mmptm's MLM head uses (nn.LayerNorm default).


def read_json_object(path: Path) -> dict[str, Any]:
    """A json file holding an object (a model's config), with a one-line error naming it."""
    try:
        tree = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid json ({e})") from None
    if not isinstance(tree, dict):
        raise ValueError(f"{path}: expected a json object")
    return tree


def compile_names(table: Mapping[str, str]) -> list[tuple[re.Pattern[str], str]]:
    """A name table (HF → mmptm, ``{i}`` a layer index) as (regex, mmptm name) pairs."""
    out = []
    for hf, ours in table.items():
        rx = re.escape(hf).replace(re.escape("{i}"), r"(?P<i>\d+)")
        out.append((re.compile(rx + "$"), ours))
    return out


def map_name(patterns: list[tuple[re.Pattern[str], str]], hf_name: str) -> str | None:
    """The mmptm name of ``hf_name`` by the first matching pattern, or None."""
    for rx, ours in patterns:
        m = rx.match(hf_name)
        if m:
            return ours.replace("{i}", m.group("i")) if "i" in rx.groupindex else ours
    return None


_PATTERNS = compile_names(HF_TO_MMPTM)


def _mmptm_name(hf_name: str) -> str | None:
    return map_name(_PATTERNS, hf_name)


def drop_heads(state: Mapping[str, torch.Tensor], heads: Iterable[str]) -> dict[str, torch.Tensor]:
    """``state`` without the tensors under the prefixes ``heads`` (an HF checkpoint's task
    heads, which no mmptm part takes), logging the names it leaves behind."""
    heads = tuple(heads)
    dropped = sorted(k for k in state if k.startswith(heads))
    if dropped:
        log.info("leaving behind %d head tensors: %s", len(dropped), dropped)
    return {k: v for k, v in state.items() if not k.startswith(heads)}


def _strip_prefix(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # ForMaskedLM / ForSequenceClassification nest the encoder under "roberta."; a bare
    # XLMRobertaModel does not. Heads (lm_head., classifier.) are never prefixed.
    return {k.removeprefix(_PREFIX): v for k, v in state.items()}


def require(cfg: Mapping[str, Any], key: str) -> Any:
    """``cfg[key]``, or one error naming the missing HF config key."""
    if key not in cfg:
        raise ValueError(f"HF config lacks {key!r}")
    return cfg[key]


def _check_config(hf_config: Mapping[str, Any]) -> None:
    model_type = hf_config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"HF config model_type is {model_type!r}; expected one of {MODEL_TYPES}")
    act = hf_config.get("hidden_act", "gelu")
    if act != "gelu":
        # mmptm's MLP is nn.GELU() (exact erf form), which is what "gelu" means in HF.
        raise ValueError(f"hidden_act={act!r} is not supported: mmptm's MLP uses exact 'gelu'")
    pos = hf_config.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ValueError(f"position_embedding_type={pos!r} is not supported (only 'absolute')")
    if hf_config.get("is_decoder") or hf_config.get("add_cross_attention"):
        raise ValueError("decoder / cross-attention XLM-R configs are not supported")


def xlmr_model_config(hf_config: Mapping[str, Any], *, pooler: bool, mlm: bool) -> ModelConfig:
    """The mmptm ``ModelConfig`` equivalent to an HF XLM-R ``config.json`` dict."""
    _check_config(hf_config)
    width = int(require(hf_config, "hidden_size"))
    inter = int(require(hf_config, "intermediate_size"))
    mlp_ratio = inter / width
    if int(width * mlp_ratio) != inter:
        raise ValueError(f"intermediate_size {inter} is not reachable as width * mlp_ratio")
    eps = float(hf_config.get("layer_norm_eps", 1e-12))
    hidden_drop = float(hf_config.get("hidden_dropout_prob", 0.1))
    text = {
        "type": "text",
        "max_positions": int(require(hf_config, "max_position_embeddings")),
        "segments": int(hf_config.get("type_vocab_size", 1)),
        "language_embeddings": False,
        "dropout": hidden_drop,
        "layer_norm_eps": eps,
        "position_offset": int(hf_config.get("pad_token_id", 1)) + 1,
    }
    transformer = {
        "layers": int(require(hf_config, "num_hidden_layers")),
        "heads": int(require(hf_config, "num_attention_heads")),
        "mlp_ratio": mlp_ratio,
        "dropout": hidden_drop,
        "attn_dropout": float(hf_config.get("attention_probs_dropout_prob", 0.1)),
        "prenorm": False,
        "layer_norm_eps": eps,
    }
    tree = {
        "width": width,
        "encoders": {"text": text},
        "fusion": {"type": "single_stream", "transformer": transformer, "pooler": pooler},
        "objectives": (
            {"mlm": {"type": "mlm", "modality": "text", "layer_norm_eps": eps}} if mlm else {}
        ),
    }
    return from_dict(ModelConfig, tree, where="model")


def _vocab_info(hf_config: Mapping[str, Any]) -> VocabInfo:
    # The fairseq scheme's fixed specials; mask is the last id.
    vocab = int(require(hf_config, "vocab_size"))
    return VocabInfo(
        vocab_size=vocab,
        pad_id=int(hf_config.get("pad_token_id", 1)),
        mask_id=vocab - 1,
        cls_id=int(hf_config.get("bos_token_id", 0)),
        sep_id=int(hf_config.get("eos_token_id", 2)),
    )


def xlmr_state_dict_to_mmptm(
    hf_state_dict: Mapping[str, torch.Tensor],
    hf_config: Mapping[str, Any],
    *,
    drop_prefixes: Iterable[str] = (),
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Map an HF XLM-R state dict (either prefix layout) onto mmptm; returns (config, state).

    Task heads (:data:`HEADS`) and tensors under ``drop_prefixes`` are left behind. Raises
    ``ValueError`` naming every other checkpoint tensor with no mmptm counterpart (except
    ``position_ids``-style buffers), a tied tensor that is not actually equal to what mmptm
    ties it to, and every mmptm parameter the checkpoint leaves uninitialised.
    """
    hf = drop_heads(_strip_prefix(hf_state_dict), (*HEADS, *drop_prefixes))
    pooler = any(k.startswith("pooler.") for k in hf)
    mlm = any(k.startswith("lm_head.") for k in hf)
    cfg = xlmr_model_config(hf_config, pooler=pooler, mlm=mlm)

    out: dict[str, torch.Tensor] = {}
    unmapped: list[str] = []
    for name, tensor in hf.items():
        if name in _UNUSED:
            continue
        if name in _TIED:
            continue  # checked below, once everything is mapped
        ours = _mmptm_name(name)
        if ours is None:
            unmapped.append(name)
            continue
        out[ours] = tensor.detach().to(torch.float32).clone()
    if unmapped:
        raise ValueError(
            f"checkpoint tensors with no mmptm counterpart: {sorted(unmapped)} "
            "(pass drop_prefixes to leave task heads behind)"
        )
    if "lm_head.decoder.bias" in hf and "lm_head.bias" not in hf:
        out["objectives.mlm.bias"] = hf["lm_head.decoder.bias"].detach().float().clone()
    for name, source in _TIED.items():
        if name in hf and source in hf and not torch.equal(hf[name], hf[source]):
            raise ValueError(
                f"checkpoint tensor {name!r} differs from {source!r}, but mmptm ties them"
            )
    # mmptm's modality-type embedding has no XLM-R counterpart: zero keeps the sum unchanged.
    out["encoders.text.type_embedding"] = torch.zeros(cfg.width)

    return cfg, fit_state(out, PretrainModel(cfg, _vocab_info(hf_config)).state_dict())


def fit_state(
    out: dict[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``out`` in the order of ``expected`` (a fresh model's state dict), once it holds
    exactly its tensors with their shapes; else one error naming what differs."""
    missing = sorted(set(expected) - set(out))
    if missing:
        raise ValueError(f"mmptm parameters the checkpoint does not initialise: {missing}")
    extra = sorted(set(out) - set(expected))
    if extra:  # e.g. more layers in the weights than num_hidden_layers says
        raise ValueError(f"checkpoint tensors beyond the config's model: {extra}")
    bad = [
        f"{k}: checkpoint {tuple(out[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if out[k].shape != v.shape
    ]
    if bad:
        raise ValueError("shape mismatch: " + "; ".join(bad))
    return {k: out[k] for k in expected}


def load_hf_state_dict(hf_dir: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of ``model.safetensors`` or else ``pytorch_model.bin`` in ``hf_dir``."""
    hf_dir = Path(hf_dir)
    st, pt = (hf_dir / f for f in WEIGHT_FILES)
    if st.is_file():
        try:
            from safetensors.torch import load_file
        except ImportError as e:  # pragma: no cover - a dev dependency
            raise ImportError(f"reading {st} needs the safetensors package") from e
        return load_file(str(st))
    if pt.is_file():
        # weights_only: a downloaded pickle must not run code.
        return torch.load(pt, map_location="cpu", weights_only=True)
    sharded = sorted(p.name for p in hf_dir.glob("*.index.json"))
    hint = f" (sharded checkpoints {sharded} are not supported)" if sharded else ""
    raise FileNotFoundError(
        f"no weights in {hf_dir}: expected {WEIGHT_FILES[0]} or {WEIGHT_FILES[1]}{hint}"
    )


def import_xlmr(
    hf_dir: str | Path, out_dir: str | Path, *, drop_prefixes: Iterable[str] = ()
) -> Path:
    """Turn a local HF XLM-R directory into an mmptm run directory; returns the checkpoint.

    Reads ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``) and
    ``sentencepiece.bpe.model``. Writes ``out_dir/checkpoints/step_00000000.pt``,
    ``out_dir/tokenizer.model`` + ``tokenizer.json`` (fairseq id scheme) and
    ``out_dir/config.yaml``; ``data.tokenizer`` points at the copied tokenizer and
    ``data.modalities.text`` holds XLM-R's pair layout (:data:`PAIR_LAYOUT`).
    """
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    config_path, spm_path = hf_dir / "config.json", hf_dir / SPM_FILE
    missing = [p.name for p in (config_path, spm_path) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{hf_dir} lacks {', '.join(missing)}")
    hf_config = read_json_object(config_path)
    if not isinstance(hf_config, dict):
        raise ValueError(f"{config_path}: expected a json object")
    _check_config(hf_config)  # before reading gigabytes of weights
    tokenizer = Tokenizer.from_xlmr(spm_path)
    vocab = VocabInfo.from_tokenizer(tokenizer)
    if vocab.vocab_size != require(hf_config, "vocab_size"):
        raise ValueError(
            f"{spm_path.name} gives {vocab.vocab_size} ids but config.json has vocab_size "
            f"{hf_config['vocab_size']}"
        )
    if vocab.pad_id != hf_config.get("pad_token_id", 1):
        raise ValueError(
            f"config.json has pad_token_id={hf_config.get('pad_token_id')} but the fairseq "
            f"tokenizer's pad id is {vocab.pad_id}"
        )
    state = load_hf_state_dict(hf_dir)
    cfg, mapped = xlmr_state_dict_to_mmptm(state, hf_config, drop_prefixes=drop_prefixes)

    tok_path = tokenizer.save(out_dir / "tokenizer.model").resolve()
    text_cfg = cfg.encoders["text"]
    max_len = text_cfg.max_positions - text_cfg.position_offset
    text_data = TextData.Config(max_len=max_len, **PAIR_LAYOUT)
    data = DataConfig(tokenizer=str(tok_path), modalities={"text": text_data})
    run = RunConfig(output_dir=str(out_dir.resolve()), data=data, model=cfg)
    model = PretrainModel(cfg, vocab)
    model.load_state_dict(mapped)  # strict: proves the checkpoint loads before writing it
    save_config(run, out_dir / "config.yaml")
    return checkpoint.write(
        out_dir / checkpoint.CKPT_DIR,
        0,
        model=model.state_dict(),
        config=to_dict(run),
        extra={"source": {"hf_dir": str(hf_dir.resolve()), "model_type": hf_config["model_type"]}},
    )
