"""KnowBERT's entity linking loss (Peters et al., 2019), trained beside MLM.

Each KAR of the ``knowbert`` fusion scores every candidate entity of every candidate span
(``KnowBertOutput.link[layer]`` [B,M,C]); the loss is the linker's cross entropy against the
gold candidate (``candidate_gold`` of the ``candidates`` plug-in), over the spans whose gold
entity is among their candidates, summed over the KARs (KnowBERT sums one linker loss per
knowledge base). Metrics: ``acc``, the last KAR's linking accuracy on those spans, and
``prior_acc``, the accuracy of the prior alone (argmax p(e | alias)) on the same spans: the
baseline a linker has to beat. No data side: the spans come from the plug-in. The fusion's
``knowledge: false`` switches it off (no span reaches KAR).

Legend: B batch, M candidate spans, C candidates per span.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mmptm.batch import Batch
from mmptm.fusion.base import FusionOutput
from mmptm.layers.kar import linking_loss
from mmptm.objectives.base import Objective
from mmptm.registry import OBJECTIVES


def prior_accuracy(
    prior_BMC: torch.Tensor, cand_BMC: torch.Tensor, gold_BM: torch.Tensor
) -> tuple[int, int]:
    """(correct, spans) of argmax prior over the spans whose gold is a candidate (padding
    candidates never win)."""
    on_BM = gold_BM >= 0
    scores_BMC = prior_BMC.float().masked_fill(cand_BMC < 0, float("-inf"))
    right = (scores_BMC.argmax(-1) == gold_BM) & on_BM
    return int(right.sum()), int(on_BM.sum())


@OBJECTIVES.register("linking")
class EntityLinking(Objective):
    """The KAR linkers' cross entropy against the gold candidates (module docstring)."""

    @dataclass
    class Config:
        type: str = "linking"
        weight: float = 1.0

    def __init__(self, cfg: Config, *, fusion: nn.Module, **_: object) -> None:
        super().__init__()
        self.cfg = cfg
        if not hasattr(fusion, "kar"):
            raise ValueError(
                f"linking trains the linkers of KnowBERT's KAR; fusion {type(fusion).__name__} "
                "has none (use fusion: knowbert)"
            )
        # A tuple keeps the fusion's modules out of this one (they are the fusion's).
        self._fusion = (fusion,)

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        links = getattr(out, "link", None) or {}
        gold_BM = batch.get("candidate_gold")
        if not links or gold_BM is None or not self._fusion[0].cfg.knowledge:
            return {}
        gold_BM = gold_BM.to(next(iter(links.values())).device)
        total, acc = None, None
        for link_BMC in links.values():
            loss, acc = linking_loss(link_BMC, gold_BM)
            total = loss if total is None else total + loss
        right, n = prior_accuracy(batch["candidate_priors"], batch["candidate_ids"], gold_BM.cpu())
        prior = torch.tensor(right / n if n else 0.0)
        return {"loss": total, "acc": acc, "prior_acc": prior, "spans": torch.tensor(float(n))}
