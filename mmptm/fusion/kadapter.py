"""K-Adapter: knowledge adapters beside a frozen pre-trained Transformer (Wang et al., 2021).

The base is ``single_stream``'s stack, under the same parameter names (``stack.*``,
``pooler.*``), so a text run's weights load into it (``init_mode: encoders`` loads every
tensor of the same name and shape) and, with ``freeze_base``, never change. Each adapter (one
per kind of knowledge: ``adapters: {name: {...}}``) is a chain of adapter layers; layer j reads
the base's hidden state at ``layers[j]`` (0: the stack's input, k: layer k's output, as
Hugging Face's ``hidden_states``; K-Adapter on RoBERTa-large: 0, 11, 22) plus the previous
adapter layer's output, and is x + up(Transformer(down(x))) with ``depth`` layers of width
``width`` inside. The base's last state and every adapter's last output are concatenated
and projected back to the model width (``combine``, K-Adapter's ``com_dense``), which is what
the heads read. Adapters trained one at a time (each run adds one and freezes the others,
their names kept) combine in a last run that reads them all.
Legend: B batch, N tokens, D width, d adapter width, A adapters.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import ModalityTokens, init_weights
from mmptm.fusion.base import FusionOutput, join_tokens, split_joint
from mmptm.fusion.single_stream import SingleStreamFusion
from mmptm.layers import TransformerConfig, TransformerStack
from mmptm.registry import FUSIONS

#: std of the down- and up-projections (K-Adapter's adapter_initializer_range): an adapter
#: starts close to the identity
ADAPTER_INIT = 2e-4


@dataclass
class AdapterConfig:
    """One adapter: which base states it reads and its own size."""

    #: the base's hidden states its layers read, increasing: 0 the stack's input, k the
    #: output of layer k (K-Adapter on RoBERTa-large: [0, 11, 22])
    layers: list[int] = field(default_factory=lambda: [0])
    #: width of the Transformer inside each adapter layer (K-Adapter: 768)
    width: int = 64
    #: Transformer layers inside each adapter layer (K-Adapter: 2)
    depth: int = 2
    heads: int = 4


class AdapterLayer(nn.Module):
    """x + up(Transformer(down(x))): one K-Adapter layer."""

    def __init__(self, width: int, cfg: AdapterConfig, base: TransformerConfig) -> None:
        super().__init__()
        self.down = nn.Linear(width, cfg.width)
        self.stack = TransformerStack(cfg.width, replace(base, layers=cfg.depth, heads=cfg.heads))
        self.up = nn.Linear(cfg.width, width)

    def forward(self, x_BND: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        return x_BND + self.up(self.stack(self.down(x_BND), attn))


class Adapter(nn.Module):
    """A chain of adapter layers over chosen base states; returns the last one's output."""

    def __init__(self, width: int, cfg: AdapterConfig, base: TransformerConfig) -> None:
        super().__init__()
        self.at = list(cfg.layers)
        self.layers = nn.ModuleList(AdapterLayer(width, cfg, base) for _ in cfg.layers)

    def forward(self, states: list[torch.Tensor], attn: torch.Tensor) -> torch.Tensor:
        h_BND = torch.zeros_like(states[0])
        for i, layer in zip(self.at, self.layers):
            h_BND = layer(states[i] + h_BND, attn)
        return h_BND


@FUSIONS.register("kadapter")
class KAdapterFusion(SingleStreamFusion):
    """A (frozen) single-stream base plus knowledge adapters, concatenated and projected."""

    @dataclass
    class Config(SingleStreamFusion.Config):
        type: str = "kadapter"
        #: name → adapter; a name is kept across runs so each run's adapters load by name
        adapters: dict[str, AdapterConfig] = field(default_factory=dict)
        #: the base stack and pooler are not trained (freeze the encoders with
        #: ``train.freeze: ["encoders.*"]``)
        freeze_base: bool = True

    def __init__(
        self, cfg: Config, *, width: int, modalities: list[str] | None = None, **kw: object
    ) -> None:
        _check(cfg)
        super().__init__(cfg, width=width, modalities=modalities, **kw)
        if cfg.freeze_base:
            for p in self.parameters():
                p.requires_grad_(False)
        self.adapters = nn.ModuleDict(
            {n: Adapter(width, a, cfg.transformer) for n, a in cfg.adapters.items()}
        )
        self.combine = nn.Linear(width * (1 + len(cfg.adapters)), width)
        init_weights(self.adapters)
        init_weights(self.combine)
        for adapter in self.adapters.values():
            for layer in adapter.layers:
                init_weights(layer.down, std=ADAPTER_INIT)
                init_weights(layer.up, std=ADAPTER_INIT)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """A base loaded in part is an error: with ``init_mode: encoders`` tensors of another
        shape or number are skipped, and a frozen base would keep fresh weights."""
        got = {k[len(prefix) :] for k in state_dict if k.startswith(f"{prefix}stack.")}
        own = {k for k in self.state_dict() if k.startswith("stack.")}
        if got and got != own:
            raise ValueError(
                f"kadapter: the checkpoint's base has {len(got)} stack tensors, this fusion "
                f"{len(own)} (e.g. {sorted(got ^ own)[:2]}): give model.fusion.transformer "
                "the shape of the run it starts from"
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None = None
    ) -> FusionOutput:
        x_BND, mask_BN, sizes = join_tokens(tokens)
        visible_BNN = self.visibility(tokens, batch)
        attn = mask_BN if visible_BNN is None else visible_BNN
        states = [x_BND]  # the base's hidden states: its input, then each layer's output
        for block in self.stack.blocks:
            states.append(block(states[-1], attn))
        base_BND = self.stack.norm(states[-1])
        outs = [adapter(states, attn) for adapter in self.adapters.values()]
        h_BND = self.combine(torch.cat([base_BND, *outs], dim=-1))  # [B,N,(1+A)D] -> [B,N,D]
        return split_joint(h_BND, tokens, sizes, self.cfg.modality_pooling, self.pooler)


def _check(cfg: KAdapterFusion.Config) -> None:
    """One-line errors for the adapters' settings."""
    if not cfg.adapters:
        raise ValueError(
            "kadapter.adapters: name at least one adapter, e.g. {facts: {layers: [0]}}"
        )
    if cfg.unimodal_layers:
        raise ValueError("kadapter: unimodal_layers are not supported (the base is one stack)")
    n = cfg.transformer.layers
    for name, a in cfg.adapters.items():
        where = f"kadapter.adapters.{name}"
        ok = a.layers and all(0 <= i <= n for i in a.layers)
        if not ok or sorted(set(a.layers)) != list(a.layers):
            raise ValueError(
                f"{where}.layers must be increasing base states in 0..{n} (0 the input, k "
                f"layer k's output), got {a.layers}"
            )
        if a.width < 1 or a.depth < 0 or a.heads < 1 or a.width % a.heads:
            raise ValueError(
                f"{where}: width ({a.width}) must be a positive multiple of heads ({a.heads}), "
                f"depth >= 0 (got {a.depth})"
            )
