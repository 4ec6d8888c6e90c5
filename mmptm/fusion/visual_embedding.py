"""Visual features fused into the text tokens before the Transformer: VL-BERT's visual feature
embedding and B2T2's early fusion.

``single_stream`` with one addition at the embedding level: a vector of the whole image, the
mean of the visual view's real tokens, goes through a linear layer (``activation``: none, or
B2T2's tanh) and is added to the text tokens, every one of them (VL-BERT: each word carries
the appearance of the whole image) or the first ([CLS]; B2T2 adds its global ResNet vector at
an [IMAGE] token after [CLS], which mmptm's tokenizers do not have). ``joint: false`` keeps the
visual tokens out of the stack (B2T2: the Transformer reads text only, the image enters through
the embeddings); their ``hidden`` are then the encoder's tokens, not contextualised.

B2T2's references: with ``boxes`` naming a region view, a batch key ``refs`` [B,L] gives the
region each text token refers to (-1: none; VCR's ``[1]`` tags), whose token is added to that
text token's visual input before the same layer. No converter writes references yet (toyworld's
captions carry none), so the recipes fuse the whole image only, as B2T2's pre-training on
Conceptual Captions.

The whole-image vector is a stand-in where the papers run their CNN on the whole image (VL-BERT:
Fast R-CNN on a box that covers it; B2T2: ResNet-152): over regions, the mean of the region
tokens; over ``timm_image`` grid tokens, their mean is the backbone's global average pool.

Legend: B batch, L text tokens, N visual tokens, D width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import ModalityTokens, init_weights
from mmptm.fusion.base import FusionOutput, pool
from mmptm.fusion.single_stream import SingleStreamFusion
from mmptm.registry import FUSIONS


@FUSIONS.register("visual_embedding")
class VisualEmbeddingFusion(SingleStreamFusion):
    """``single_stream`` whose text tokens first get a projection of the whole image added."""

    @dataclass
    class Config(SingleStreamFusion.Config):
        type: str = "visual_embedding"
        #: the view that gets the visual embedding, and the view whose tokens give it
        text: str = "text"
        visual: str = "regions"
        #: which text tokens get it: all (VL-BERT) or first, the [CLS] (B2T2)
        add_to: Literal["all", "first"] = "all"
        #: on the projection: none (VL-BERT's linear embedding) or tanh (B2T2's dense layer)
        activation: Literal["none", "tanh"] = "none"
        #: whether the visual tokens enter the Transformer too (VL-BERT) or not (B2T2)
        joint: bool = True
        #: B2T2's references: the region view the text's references point at ("" = none)
        boxes: str = ""
        #: the batch key [B,L] of each text token's region (-1 = none), read with ``boxes``
        refs: str = "region_refs"

    cfg: Config

    def __init__(
        self, cfg: Config, *, width: int, modalities: list[str] | None = None, **kw: object
    ) -> None:
        super().__init__(cfg, width=width, modalities=modalities, **kw)
        names = list(modalities or [])
        for key in ("text", "visual", "boxes"):
            view = getattr(cfg, key)
            if modalities is not None and view and view not in names:
                raise ValueError(
                    f"fusion.{key}={view!r} is not an encoder of this model (encoders: {names})"
                )
        if cfg.text == cfg.visual:
            raise ValueError(f"fusion.text and fusion.visual must differ, both are {cfg.text!r}")
        if not cfg.joint and cfg.unimodal_layers:
            raise ValueError("fusion.unimodal_layers need the visual tokens in the stack (joint)")
        self.visual_proj = nn.Linear(width, width)
        init_weights(self.visual_proj)

    def embed_visual(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None
    ) -> dict[str, ModalityTokens]:
        """``tokens`` with the visual embedding added to the text view's (unchanged when the
        batch has no text or no visual view)."""
        c = self.cfg
        if c.text not in tokens or c.visual not in tokens:
            return tokens
        text, visual = tokens[c.text], tokens[c.visual]
        image_BD = pool(visual.tokens, visual.mask, "mean")
        v_BLD = torch.zeros_like(text.tokens)
        if c.add_to == "all":
            v_BLD = v_BLD + image_BD[:, None, :]
        else:
            v_BLD[:, 0] = image_BD
        refs_BL = batch.get(c.refs) if batch is not None and c.boxes else None
        if refs_BL is not None and c.boxes in tokens:
            boxes_BND = tokens[c.boxes].tokens
            refs_BL = refs_BL.to(boxes_BND.device)
            index_BLD = refs_BL.clamp_min(0)[:, :, None].expand(-1, -1, boxes_BND.shape[-1])
            v_BLD = v_BLD + boxes_BND.gather(1, index_BLD) * (refs_BL >= 0)[:, :, None]
        add_BLD = self.visual_proj(v_BLD)
        if c.activation == "tanh":
            add_BLD = torch.tanh(add_BLD)
        return {**tokens, c.text: ModalityTokens(text.tokens + add_BLD, text.mask)}

    def forward(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None = None
    ) -> FusionOutput:
        tokens = self.embed_visual(tokens, batch)
        if self.cfg.joint or self.cfg.text not in tokens:
            return super().forward(tokens, batch)
        outside = {m: t for m, t in tokens.items() if m != self.cfg.text}
        out = super().forward({m: t for m, t in tokens.items() if m not in outside}, batch)
        for m, t in outside.items():  # B2T2: the image reached the text through its embeddings
            out.hidden[m], out.mask[m] = t.tokens, t.mask
            out.pooled[m] = pool(t.tokens, t.mask, self.cfg.modality_pooling)
        return out
