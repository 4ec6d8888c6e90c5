"""Cross-lingual sentence retrieval, Tatoeba protocol.

Each sentence is embedded alone; for every language X paired with the pivot, the nearest
pivot sentence (cosine) of each X sentence must be its translation, and vice versa.
Accuracy per language (both directions averaged; ``direction="to-pivot"``: X → pivot alone,
XTREME's Tatoeba protocol, ``"from-pivot"``: pivot → X alone).

Which vector stands for a sentence (:class:`SentenceVector`):

- an **aligned vector**: the name of a contrastive objective over text views (InfoXLM's
  XLCO, ``xtext_clip_tiny``'s contrast): its own pooling and projection, the vector the
  recipe trained to align (``Contrastive.embed``). With two different views ``[a, b]`` the
  pivot is encoded as view ``a`` and the other language as ``b``, as the pairs were in
  training (parallel shards list the pivot first);
- ``mean`` / ``first`` (the [CLS] token) of one layer's hidden states: layer 0 is the
  encoder's output (the input embeddings), layer k the k-th Transformer block's output,
  the last layer the fusion's output (after the closing LayerNorm of a pre-LN stack);
  negative layers count from the top (-1 = the last). XTREME's Tatoeba protocol reads a
  middle layer of MLM models.

``auto`` is the aligned vector when the model has one, else the mean of the last layer.

``center`` (Libovický et al. 2020, "language-neutral" representations): before the
cosine, each language's mean vector (over the sentences compared) is subtracted from its
sentences' vectors, removing what all sentences of a language share (a language embedding,
a frequency direction) and keeping what tells them apart.
Legend: N sentences per language, D width, E embedding width.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mmptm.batch import move_to
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.fusion.base import pool
from mmptm.layers.transformer import TransformerBlock
from mmptm.modalities.base import DataContext
from mmptm.modalities.text import TextData
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.recipe import RunConfig

#: token poolings of one layer's hidden states
POOLINGS = ("mean", "first")
#: which way a retrieval goes: both averaged, X → pivot (XTREME's Tatoeba), pivot → X
DIRECTIONS = ("both", "to-pivot", "from-pivot")


def read_pairs(shards: str, pivot: str, max_per_language: int) -> dict[str, list[tuple[str, str]]]:
    """(pivot sentence, translation) pairs per language from parallel-text shards, at most
    ``max_per_language`` each (0: all)."""
    pairs: dict[str, list[tuple[str, str]]] = defaultdict(list)
    handler = SkipCounter()
    for sample in tar_samples(expand_shards(shards), handler):
        meta = json.loads(sample["json"])
        langs, texts = meta["languages"], meta["texts"]
        if pivot not in langs:
            continue
        i = langs.index(pivot)
        other = langs[1 - i]
        if max_per_language <= 0 or len(pairs[other]) < max_per_language:
            pairs[other].append((texts[i], texts[1 - i]))
    if not pairs:
        raise ValueError(f"{shards}: no parallel pairs with pivot language {pivot!r}")
    return dict(pairs)


def text_plugin(cfg: RunConfig, tokenizer: Any, view: str = "text") -> TextData:
    """The run's text plug-in (its ``data.modalities.text`` settings) for one view."""
    settings = cfg.data.modalities.get("text") or TextData.Config()
    return TextData(settings, views=[view], context=DataContext(tokenizer=tokenizer))


def encode_texts(plugin: TextData, texts: Sequence[str], lang: str) -> dict[str, Any]:
    """A collated batch of single sentences in the plug-in's (first) view."""
    prefix = plugin.prefixes[0]
    return plugin.collate(
        [{prefix + k: v for k, v in plugin.encode(t, lang).items()} for t in texts]
    )


def aligned_objectives(model: PretrainModel) -> list[str]:
    """Objectives that align sentence vectors of the model's text views (``embed``)."""
    text_views = {n for n, e in model.encoders.items() if getattr(e, "modality", "") == "text"}
    return [
        name
        for name, o in model.objectives.items()
        if hasattr(o, "embed") and set(getattr(o.cfg, "modalities", ())) <= text_views
    ]


@dataclass(frozen=True)
class SentenceVector:
    """Which vector stands for a sentence: ``pooling`` mean | first | an aligned objective's
    name; ``layer`` (mean / first only) None = the last, negative counts from the top."""

    pooling: str = "mean"
    layer: int | None = None

    @classmethod
    def resolve(cls, model: PretrainModel, pooling: str, layer: int | None) -> SentenceVector:
        """``auto`` (the aligned vector if any, else mean) or a name, checked against the model."""
        aligned = aligned_objectives(model)
        if pooling == "auto":
            pooling = aligned[0] if aligned and layer is None else "mean"
        if pooling in POOLINGS:
            return cls(pooling, layer)
        if pooling not in aligned:
            raise ValueError(
                f"unknown pooling {pooling!r}; choices: auto, {', '.join(POOLINGS)}"
                + (f", or an aligned objective: {', '.join(aligned)}" if aligned else "")
            )
        if layer is not None:
            raise ValueError(
                f"pooling {pooling!r} is its objective's vector, at the last layer: "
                "--layer applies to mean or first pooling"
            )
        return cls(pooling, None)

    def describe(self, model: PretrainModel, layers: int) -> str:
        """A short label, e.g. ``xlco (first + projection)`` or ``mean, layer 2 of 4``
        (``layers``: how many the model has, :attr:`SentenceEncoder.layers`)."""
        if self.pooling not in POOLINGS:
            fusion_cfg = model.fusion.cfg
            how = getattr(fusion_cfg, "modality_pooling", None)
            if how is None:  # dual towers: per-view pooling
                how = getattr(fusion_cfg, "pooling", {}).get("text", "mean")
            return f"{self.pooling} ({how} + projection)"
        return f"{self.pooling}, layer {layer_index(self.layer, layers)} of {layers}"


def layer_index(layer: int | None, layers: int) -> int:
    """``layer`` (None = the last, negative from the top) as 0..``layers``."""
    k = layers if layer is None else (layer + layers + 1 if layer < 0 else layer)
    if not 0 <= k <= layers:
        raise ValueError(f"--layer {layer} is out of range: the model has layers 0..{layers}")
    return k


class SentenceEncoder:
    """Embeds sentences one at a time (batched, no cross-sentence attention) as one vector."""

    def __init__(
        self, model: PretrainModel, cfg: RunConfig, tokenizer: Any, vector: SentenceVector
    ) -> None:
        self.model = model.eval()
        self.vector = vector
        self.device = next(model.parameters()).device
        views = ("text", "text")
        if vector.pooling not in POOLINGS:
            a, b = model.objectives[vector.pooling].cfg.modalities
            views = (a, b)
        self.plugins = {v: text_plugin(cfg, tokenizer, v) for v in set(views)}
        self.views = {"pivot": views[0], "other": views[1]}
        #: Transformer blocks a sentence passes through (known after the first call)
        self.layers = 0

    def _layer_states(self, batch: dict, view: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states [N,L,D] of the chosen layer and their mask [N,L]."""
        outputs: list[torch.Tensor] = []
        hooks = [
            m.register_forward_hook(lambda _m, _a, o: outputs.append(o))
            for m in self.model.fusion.modules()
            if isinstance(m, TransformerBlock)
        ]
        try:
            out = self.model.fuse(batch)
        finally:
            for h in hooks:
                h.remove()
        n = self.layers = len(outputs)
        k = layer_index(self.vector.layer, n)
        states = {0: out.encoded[view].tokens, n: out.hidden[view]}.get(k)
        return (outputs[k - 1] if states is None else states), out.mask[view]

    @torch.no_grad()
    def __call__(
        self, texts: Sequence[str], lang: str, side: str = "pivot", batch_size: int = 128
    ) -> torch.Tensor:
        """L2-normalised vectors [N,E] of ``texts`` in ``lang``; ``side`` pivot | other."""
        view = self.views[side]
        plugin = self.plugins[view]
        out = []
        for s in range(0, len(texts), batch_size):
            batch = move_to(encode_texts(plugin, texts[s : s + batch_size], lang), self.device)
            if self.vector.pooling in POOLINGS:
                states_NLD, mask_NL = self._layer_states(batch, view)
                v_ND = pool(states_NLD, mask_NL, self.vector.pooling)
            else:
                v_ND = self.model.objectives[self.vector.pooling].embed(
                    self.model.fuse(batch), view
                )
            out.append(v_ND.float().cpu())
        return F.normalize(torch.cat(out), dim=-1)


def centered(v_NE: torch.Tensor) -> torch.Tensor:
    """One language's vectors less their mean, L2-normalised again (module doc: ``center``)."""
    return F.normalize(v_NE - v_NE.mean(0, keepdim=True), dim=-1)


def retrieval_accuracy(
    src_NE: torch.Tensor, tgt_NE: torch.Tensor, direction: str = "both"
) -> float:
    """Tatoeba accuracy of row i matching row i: ``src`` → ``tgt`` (``to-pivot``, the pivot
    being ``tgt``), ``tgt`` → ``src`` (``from-pivot``) or both averaged."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; choices: {', '.join(DIRECTIONS)}")
    sim_NN = src_NE @ tgt_NE.T
    gold_N = torch.arange(len(sim_NN))
    x2p = (sim_NN.argmax(1) == gold_N).float().mean().item()
    p2x = (sim_NN.argmax(0) == gold_N).float().mean().item()
    return {"both": (x2p + p2x) / 2, "to-pivot": x2p, "from-pivot": p2x}[direction]


def xlingual_retrieval(
    encode: SentenceEncoder,
    pairs: dict[str, list[tuple[str, str]]],
    pivot: str,
    center: bool = False,
    direction: str = "both",
) -> dict[str, float]:
    """Accuracy per language and their mean (``avg``) with one sentence encoder; ``center``:
    each language's vectors less their mean (module doc)."""
    return xlingual_retrievals(encode, pairs, pivot, (center,), direction)[center]


def xlingual_retrievals(
    encode: SentenceEncoder,
    pairs: dict[str, list[tuple[str, str]]],
    pivot: str,
    centers: Sequence[bool] = (False, True),
    direction: str = "both",
) -> dict[bool, dict[str, float]]:
    """:func:`xlingual_retrieval` plain and centred from one encoding of the sentences."""
    result: dict[bool, dict[str, float]] = {c: {} for c in centers}
    for lang, pp in sorted(pairs.items()):
        src = encode([p[1] for p in pp], lang, "other")
        tgt = encode([p[0] for p in pp], pivot, "pivot")
        for c in centers:
            a, b = (centered(src), centered(tgt)) if c else (src, tgt)
            result[c][lang] = retrieval_accuracy(a, b, direction)
    for r in result.values():
        r["avg"] = sum(r.values()) / len(r)
    return result


def evaluate_xlingual_vectors(
    path: str,
    shards: str,
    *,
    poolings: Sequence[str] = ("auto",),
    layer: int | None = None,
    pivot: str = "en",
    max_per_language: int = 500,
    overrides: Sequence[str] = (),
    center: bool = False,
    direction: str = "both",
) -> dict[str, dict[str, float]]:
    """Accuracies per language for each pooling (see the module doc), keyed by its label
    (", centered" appended with ``center``).

    The model is loaded once; the same pooling named twice (``auto`` resolving to ``mean``
    beside ``mean``) is evaluated once.
    """
    if direction not in DIRECTIONS:  # before the model loads
        raise ValueError(f"unknown direction {direction!r}; choices: {', '.join(DIRECTIONS)}")
    model, tokenizer, cfg = load_pretrained(path, overrides)
    pairs = read_pairs(shards, pivot, max_per_language)
    results = {}
    for vector in dict.fromkeys(SentenceVector.resolve(model, p, layer) for p in poolings):
        encode = SentenceEncoder(model, cfg, tokenizer, vector)
        result = xlingual_retrieval(encode, pairs, pivot, center, direction)
        label = vector.describe(model, encode.layers)
        results[label + (", centered" if center else "")] = result
    return results


def evaluate_xlingual(
    path: str,
    shards: str,
    *,
    pivot: str = "en",
    max_per_language: int = 500,
    overrides: Sequence[str] = (),
    pooling: str = "auto",
    layer: int | None = None,
) -> dict[str, float]:
    """Retrieval accuracy per language (both directions averaged) and their mean, with one
    sentence vector (default ``auto``: the one the recipe aligned, else the last layer's mean)."""
    (result,) = evaluate_xlingual_vectors(
        path, shards, poolings=[pooling], layer=layer, pivot=pivot,
        max_per_language=max_per_language, overrides=overrides,
    ).values()  # fmt: skip
    return result
