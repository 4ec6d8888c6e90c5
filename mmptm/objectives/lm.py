"""Generative objectives: a decoder writing a text view (``lm``) and next-token prediction
over a single-stream fusion's text (``clm``).

``lm``: a Transformer decoder (causal self-attention, cross-attention to the states of the
other views, input and output embeddings shared with a text encoder) trained with teacher
forcing on a text view: BLIP's captioning LM beside ALBEF's objectives (the caption written
from the image), an encoder–decoder translating the first sentence of a parallel pair into the
second (``target: text2``, with the target language's tag as its first token), mBART's
denoising (``noise: bart``: the encoder reads the text with spans infilled by one [MASK] and
its sentences permuted, the decoder writes it back).

``clm``: the fused text predicts its next token under causal attention (XLM's CLM), or under
the seq2seq pattern with the other modalities as the prefix (SimVLM's PrefixLM). The
attention pattern travels in the batch (:mod:`mmptm.objectives.modes`).

A target sequence is the text view's own ``[CLS] y1 … yn [SEP]``: [CLS] starts it (or the
language tag), [SEP] ends it. Legend: B batch, T target tokens, M context tokens, D width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.layers import TransformerConfig
from mmptm.layers.decoder import DecoderCache, TransformerDecoder
from mmptm.modalities.base import Need, view_prefix
from mmptm.objectives.base import Objective
from mmptm.objectives.heads import TiedHead, token_loss
from mmptm.objectives.modes import AttentionModes, check_fusion, mode_weights
from mmptm.registry import OBJECTIVES

IGNORE = -100
NOISES = ("none", "bart")


def text_encoder(encoders: nn.ModuleDict, name: str, where: str) -> nn.Module:
    """The text encoder ``name`` (one that owns word embeddings), else a one-line error."""
    if name not in encoders or not hasattr(encoders[name], "word"):
        raise ValueError(
            f"{where}={name!r} is not a text encoder of this model (encoders: {list(encoders)})"
        )
    return encoders[name]


def foreign_rows(batch: Batch) -> torch.Tensor | None:
    """[B] rows whose views ITM's negatives mismatched: no text is learnt from them."""
    labels = batch.get("itm_labels")
    return None if labels is None else labels == 0


@dataclass
class BartNoise:
    """mBART's noise on a text view (priority 20): the sentences of each row permuted, then
    spans of Poisson(λ) lengths covering ``mask_ratio`` of the pieces each replaced by one
    [MASK] (a length-0 span inserts one). The clean row is kept as ``<p>lm_target_ids`` /
    ``<p>lm_target_mask``; the noised rows are re-padded, their positions counted afresh
    (per-token annotations of the view, such as entity spans, do not follow the noise)."""

    data_priority: ClassVar[int] = 20

    prefix: str
    mask_id: int
    pad_id: int
    mask_ratio: float
    poisson_lambda: float
    permute_sentences: bool
    sentence_ends: frozenset[int] = frozenset()

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        p = self.prefix
        ids_BL, mask_BL = batch[f"{p}input_ids"], batch[f"{p}attention_mask"].bool()
        batch[f"{p}lm_target_ids"], batch[f"{p}lm_target_mask"] = ids_BL.clone(), mask_BL.clone()
        rows = []
        for b in range(ids_BL.shape[0]):
            toks = ids_BL[b, mask_BL[b]].tolist()
            body = toks[1:-1]  # between [CLS] and [SEP]
            if self.permute_sentences:
                body = permute_sentences(body, self.sentence_ends, g)
            rows.append(toks[:1] + infill(body, self.mask_ratio, self.poisson_lambda,
                                          self.mask_id, g) + toks[-1:])  # fmt: skip
        L = max(len(r) for r in rows)
        out_BL = torch.full((len(rows), L), self.pad_id, dtype=ids_BL.dtype)
        new_mask_BL = torch.zeros(len(rows), L, dtype=torch.bool)
        for b, r in enumerate(rows):
            out_BL[b, : len(r)], new_mask_BL[b, : len(r)] = torch.tensor(r), True
        lang_B = batch[f"{p}lang_ids"][:, 0] if f"{p}lang_ids" in batch else None
        batch[f"{p}input_ids"], batch[f"{p}attention_mask"] = out_BL, new_mask_BL
        batch[f"{p}segment_ids"] = torch.zeros_like(out_BL)
        if lang_B is not None:
            batch[f"{p}lang_ids"] = lang_B[:, None].expand(-1, L).contiguous()
        batch.pop(f"{p}position_ids", None)
        return batch


def permute_sentences(body: list[int], ends: frozenset[int], g: torch.Generator) -> list[int]:
    """The pieces with their sentences (each up to and including an end piece) reordered."""
    sentences, current = [], []
    for tok in body:
        current.append(tok)
        if tok in ends:
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    if len(sentences) < 2:
        return body
    order = torch.randperm(len(sentences), generator=g).tolist()
    return [tok for i in order for tok in sentences[i]]


def infill(
    body: list[int], ratio: float, lam: float, mask_id: int, g: torch.Generator
) -> list[int]:
    """BART's text infilling: non-overlapping spans of Poisson(``lam``) lengths, about
    ``ratio`` of the pieces in all, each replaced by one ``mask_id``."""
    n = len(body)
    budget = round(n * ratio)
    if budget == 0:
        return list(body)
    lengths = []
    while sum(lengths) < budget:
        k = int(torch.poisson(torch.tensor([lam]), generator=g))
        lengths.append(min(k, budget - sum(lengths)))
    taken = [False] * (n + 1)
    span_at: dict[int, int] = {}
    for k in lengths:  # each span at the first free place in a random order of starts
        for start in torch.randperm(n + 1 - k, generator=g).tolist():
            if not any(taken[start : start + max(k, 1)]):
                span_at[start] = k
                for i in range(start, start + max(k, 1)):
                    taken[i] = True
                break  # a span with no room left is dropped
    out, i = [], 0
    while i <= n:
        if i in span_at:
            out.append(mask_id)
            if span_at[i]:
                i += span_at[i]
                continue
        if i < n:
            out.append(body[i])
        i += 1
    return out


@OBJECTIVES.register("lm")
class DecoderLM(Objective):
    """A decoder writing the ``target`` text view from the ``context`` views' states."""

    @dataclass
    class Config:
        type: str = "lm"
        weight: float = 1.0
        #: the text view the decoder writes: ``text`` (a caption), ``text2`` (the second
        #: sentence of a parallel pair: translation)
        target: str = "text"
        #: the views whose states it attends to; [] = every view of the batch but the target
        #: (with noise: every view, the noised text included)
        context: list[str] = field(default_factory=list)
        #: fused: the fusion's states of the context views alone (run again without the
        #: target when the batch holds it: the caption must not see itself); encoded: the
        #: encoders' tokens (BLIP's decoder reads the image encoder's output)
        context_states: str = "fused"
        #: the text encoder whose embeddings the decoder shares (input and tied output)
        embeddings: str = "text"
        decoder: TransformerConfig = field(default_factory=TransformerConfig)
        #: start each target with its language's tag (the language to write, as mBART)
        lang_token: bool = False
        #: none | bart (span infilling and sentence permutation of the target view)
        noise: str = "none"
        mask_ratio: float = 0.35
        poisson_lambda: float = 3.5
        permute_sentences: bool = True
        label_smoothing: float = 0.0
        layer_norm_eps: float = 1e-12

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> BartNoise | None:
        if cfg.noise not in NOISES:
            raise ValueError(f"lm.noise must be one of {list(NOISES)}, got {cfg.noise!r}")
        if cfg.noise == "none":
            return None
        if not 0.0 <= cfg.mask_ratio < 1.0 or cfg.poisson_lambda <= 0:
            raise ValueError("lm.mask_ratio must be in [0, 1) and lm.poisson_lambda positive")
        if vocab.mask_id < 0:
            raise ValueError("lm.noise=bart needs a tokenizer with a mask token")
        return BartNoise(
            prefix=view_prefix("text", cfg.target),
            mask_id=vocab.mask_id,
            pad_id=vocab.pad_id,
            mask_ratio=cfg.mask_ratio,
            poisson_lambda=cfg.poisson_lambda,
            permute_sentences=cfg.permute_sentences,
            sentence_ends=vocab.sentence_ends,
        )

    def __init__(
        self,
        cfg: Config,
        *,
        width: int,
        encoders: nn.ModuleDict,
        fusion: nn.Module,
        vocab: VocabInfo,
        **_: object,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        if cfg.context_states not in ("fused", "encoded"):
            raise ValueError(
                f"lm.context_states must be fused or encoded, got {cfg.context_states!r}"
            )
        if cfg.lang_token and not vocab.lang_tags:
            raise ValueError("lm.lang_token needs a tokenizer with language tags ([de] ...)")
        unknown = sorted(set(cfg.context) - set(encoders))
        if unknown:
            raise ValueError(f"lm.context names {unknown}, not encoders ({list(encoders)})")
        enc = text_encoder(encoders, cfg.embeddings, "lm.embeddings")
        # Lists keep the shared modules out of this objective's state dict.
        self._embedder, self._fusion = [enc], [fusion]
        self._views = list(encoders)
        self.decoder = TransformerDecoder(width, cfg.decoder, cross_width=width)
        self.head = TiedHead(width, enc.word, cfg.layer_norm_eps)
        self.prefix = view_prefix("text", cfg.target)
        self.register_buffer("lang_tags", torch.tensor(vocab.lang_tags or [0]), persistent=False)
        self.start_id, self.eos_id = vocab.cls_id, vocab.sep_id

    def data_needs(self) -> dict[str, Need]:
        if self.cfg.target in self._views:
            return {}  # its encoder reads it
        return {self.cfg.target: Need("text")}

    # -- teacher forcing ------------------------------------------------------------------

    def sequence(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The clean target rows ``[start y1 … yn [SEP]]`` [B,T], their mask and language [B]
        (an MLM-masked view is restored from its labels)."""
        p = self.prefix
        if f"{p}lm_target_ids" in batch:
            ids_BT, mask_BT = batch[f"{p}lm_target_ids"], batch[f"{p}lm_target_mask"]
        elif f"{p}input_ids" not in batch:
            raise KeyError(f"lm.target={self.cfg.target!r}: the batch has no {p}input_ids")
        else:
            ids_BT, mask_BT = batch[f"{p}input_ids"], batch[f"{p}attention_mask"]
            labels_BT = batch.get(f"{p}mlm_labels")
            if labels_BT is not None:
                ids_BT = torch.where(labels_BT != IGNORE, labels_BT, ids_BT)
        lang_B = batch.get(f"{p}lang_ids")
        lang_B = torch.zeros_like(ids_BT[:, 0]) if lang_B is None else lang_B[:, 0]
        if self.cfg.lang_token:
            ids_BT = ids_BT.clone()
            ids_BT[:, 0] = self.lang_tags[lang_B]
        return ids_BT, mask_BT.bool(), lang_B

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        seq_BT, mask_BT, lang_B = self.sequence(batch)
        keep_BT = mask_BT[:, 1:].clone()
        foreign_B = foreign_rows(batch)
        if foreign_B is not None:
            keep_BT &= ~foreign_B[:, None]
        ctx_BMD, ctx_mask_BM = self.context(out)
        x_BTD = self.embed(seq_BT[:, :-1], lang_B)
        h_BTD = self.decoder(x_BTD, mask_BT[:, :-1], ctx_BMD, ctx_mask_BM)
        logits_MV = self.head(h_BTD[keep_BT])
        return token_loss(logits_MV, seq_BT[:, 1:][keep_BT], self.cfg.label_smoothing)

    # -- the parts generation uses --------------------------------------------------------

    def context_views(self, out: FusionOutput) -> list[str]:
        """The views the decoder attends to in this output."""
        if self.cfg.context:
            missing = [m for m in self.cfg.context if m not in out.hidden]
            if missing:
                raise KeyError(f"lm.context: the batch has no {missing} (has {list(out.hidden)})")
            return list(self.cfg.context)
        keep_target = self.cfg.noise != "none"
        views = [m for m in out.hidden if keep_target or m != self.cfg.target]
        if not views:
            raise ValueError(
                f"lm: nothing to write {self.cfg.target!r} from: the batch holds only it"
            )
        return views

    def context(self, out: FusionOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """The states [B,M,D] the decoder cross-attends to and their mask [B,M]."""
        views = self.context_views(out)
        if self.cfg.context_states == "encoded":
            hidden = {m: out.encoded[m].tokens for m in views}
            mask = {m: out.encoded[m].mask for m in views}
        elif set(out.hidden) - set(views):  # fused with the target: fuse the context alone
            alone = self._fusion[0]({m: out.encoded[m] for m in views})
            hidden, mask = alone.hidden, alone.mask
        else:
            hidden, mask = out.hidden, out.mask
        return (
            torch.cat([hidden[m] for m in views], dim=1),
            torch.cat([mask[m].bool() for m in views], dim=1),
        )

    def embed(self, ids_BT: torch.Tensor, lang_B: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The shared text embeddings of target pieces at positions ``start``…"""
        enc = self._embedder[0]
        B, T = ids_BT.shape
        p = enc.prefix
        pos_BT = torch.arange(start, start + T, device=ids_BT.device).expand(B, T)
        view: dict[str, Any] = {f"{p}input_ids": ids_BT, f"{p}position_ids": pos_BT}
        if getattr(enc, "language", None) is not None:
            view[f"{p}lang_ids"] = lang_B[:, None].expand(B, T)
        return enc(view).tokens

    def start_ids(self, lang_B: torch.Tensor) -> torch.Tensor:
        """[B,1]: what every target starts with (its language's tag, or [CLS])."""
        if self.cfg.lang_token:
            return self.lang_tags[lang_B][:, None]
        return torch.full_like(lang_B, self.start_id)[:, None]

    def next_logits(
        self,
        ids_BT: torch.Tensor,
        ctx_BMD: torch.Tensor,
        ctx_mask_BM: torch.Tensor,
        lang_B: torch.Tensor,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """Logits [B,V] of the piece after ``ids_BT``; with a cache, only the pieces it has
        not seen are run."""
        start = cache.length if cache is not None else 0
        x_BTD = self.embed(ids_BT[:, start:], lang_B, start)
        h_BTD = self.decoder(x_BTD, None, ctx_BMD, ctx_mask_BM, cache=cache)
        return self.head(h_BTD[:, -1])


@OBJECTIVES.register("clm")
class CausalLM(Objective):
    """Next-token prediction over a single-stream fusion's text, causal or seq2seq."""

    token_level: ClassVar[bool] = True

    @dataclass
    class Config:
        type: str = "clm"
        weight: float = 1.0
        #: the text encoder (and hidden-state stream) it predicts
        modality: str = "text"
        #: causal: each token sees the ones before it (XLM's CLM); seq2seq: the other
        #: modalities are a prefix every text token sees (SimVLM's PrefixLM)
        attention: str = "causal"
        layer_norm_eps: float = 1e-12

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> AttentionModes:
        if cfg.attention not in ("causal", "seq2seq"):
            raise ValueError(f"clm.attention must be causal or seq2seq, got {cfg.attention!r}")
        return AttentionModes(mode_weights({cfg.attention: 1.0}, "clm.attention"), cfg.modality)

    def __init__(
        self,
        cfg: Config,
        *,
        width: int,
        encoders: nn.ModuleDict,
        fusion: nn.Module,
        vocab: VocabInfo,
        **_: object,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        check_fusion(fusion, "clm")
        enc = text_encoder(encoders, cfg.modality, "clm.modality")
        self.head = TiedHead(width, enc.word, cfg.layer_norm_eps)
        self.prefix = view_prefix("text", cfg.modality)
        self.start_id, self.eos_id = vocab.cls_id, vocab.sep_id

    def logits(self, h_MD: torch.Tensor) -> torch.Tensor:
        """Next-piece logits [M,V] of states [M,D] (what decoding reads, as MLM's ``logits``)."""
        return self.head(h_MD)

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        p = self.prefix
        ids_BL, mask_BL = batch[f"{p}input_ids"], batch[f"{p}attention_mask"].bool()
        target_BL = ids_BL[:, 1:]
        # a packed row's next sample starts with [CLS]: not predicted from the one before
        keep_BL = mask_BL[:, 1:] & (target_BL != self.start_id)
        foreign_B = foreign_rows(batch)
        if foreign_B is not None:
            keep_BL &= ~foreign_B[:, None]
        h_BLD = out.hidden[self.cfg.modality][:, :-1]
        return token_loss(self.head(h_BLD[keep_BL]), target_BL[keep_BL])
