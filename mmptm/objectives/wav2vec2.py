"""wav2vec 2.0's objective: pick the quantised local feature of a masked step among distractors.

Data side: span masking (:class:`~mmptm.objectives.masking.MaskSpans`) over
``<prefix>audio_steps_mask``; the audio encoder puts its [MASK] embedding at the written
``<prefix>audio_masked`` steps before its context network.

Loss side, at the masked real steps only (as fairseq and HF):

- the encoder's ``targets`` [B,T,F] (its layer-normed conv features before masking) go
  through a Gumbel-softmax product quantiser (:class:`GumbelQuantizer`: G groups of V
  codevectors of width C/G; Linear F → G·V logits; hard one-hot Gumbel samples with the
  straight-through gradient when training, the argmax when evaluating; the chosen vectors
  concatenated to C) and ``project_q`` (C → E): the true targets q;
- the context vectors ``hidden[view]`` [B,T,D] go through ``final_proj`` (D → E): c;
- for each masked step, K distractors are drawn uniformly, with replacement, from the *other*
  masked steps of the same utterance (:func:`sample_negatives`; fairseq's
  ``sample_negatives``); a distractor whose codes equal the positive's gets logit -inf (fairseq
  compares the vectors); logits = cosine(c, ·) / ``logit_temperature`` over [positive,
  distractors]; loss = cross-entropy with the positive as class 0, averaged over masked steps;
- diversity loss ``diversity_weight`` · (G·V − perplexity) / (G·V), perplexity of the
  softmax over each group's entries averaged over the masked steps of the batch, summed over
  groups (``prob_ppl``; ``code_ppl`` is the same for the hard codes);
- optional feature penalty ``feature_penalty`` · mean(targets²). fairseq puts weight 10 on
  the mean square of the conv features *before* their layer norm, to keep the feature
  encoder's activations from growing; the encoder's ``targets`` are *after* the layer norm,
  where the penalty would only shrink the norm's gain, so it is off (0) by default.

The Gumbel temperature is annealed as ``max(max_t · decay^n, min_t)``, n = the buffer
``updates``: the number of forward calls in training mode (saved with the model, so a resumed
run continues the schedule). n equals the optimiser step when ``train.grad_accum`` is 1; with
accumulation it counts micro-batches, so take ``decay ** (1 / grad_accum)``.

Metrics: ``acc`` (the positive scores above every distractor), ``code_ppl``, ``prob_ppl``,
``temperature``. Negatives and Gumbel noise use the default torch generator of the device
(whose state checkpoints save), not the data side's.

Legend: B batch, T steps, F target width, D width, M masked steps, K distractors, G groups,
V entries per group, C codevector width, E compared width (``final_dim``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.base import Objective, encoder_target_dim
from mmptm.objectives.masking import MaskSpans, SpanMaskConfig, audio_encoder
from mmptm.registry import OBJECTIVES


@dataclass
class Quantized:
    """A quantiser's output for M rows."""

    vectors_MC: torch.Tensor  # chosen codevectors, concatenated over groups
    codes_MG: torch.Tensor  # chosen entry per group (argmax of the logits)
    code_ppl: torch.Tensor  # perplexity of the hard codes' batch average, summed over groups
    prob_ppl: torch.Tensor  # perplexity of the softmax's batch average, summed over groups


def perplexity(probs_MGV: torch.Tensor) -> torch.Tensor:
    """exp(entropy) of the batch-averaged distribution of each group, summed over groups."""
    avg_GV = probs_MGV.float().mean(dim=0)
    return torch.exp(-(avg_GV * torch.log(avg_GV + 1e-7)).sum(dim=-1)).sum()


class GumbelQuantizer(nn.Module):
    """Product quantiser with Gumbel-softmax choice (wav2vec 2.0, section 2)."""

    def __init__(self, in_dim: int, groups: int, entries: int, dim: int) -> None:
        super().__init__()
        if dim % groups:
            raise ValueError(f"codevector_dim {dim} is not divisible by groups {groups}")
        self.groups, self.entries = groups, entries
        self.weight_proj = nn.Linear(in_dim, groups * entries)
        self.codevectors = nn.Parameter(torch.empty(groups * entries, dim // groups))
        # fairseq and HF: N(0, 1) logit weights (peaked choices from the start), U(0, 1) codes
        nn.init.normal_(self.weight_proj.weight, std=1.0)
        nn.init.zeros_(self.weight_proj.bias)
        nn.init.uniform_(self.codevectors)

    def forward(self, x_MF: torch.Tensor, temperature: float | torch.Tensor) -> Quantized:
        M, G, V = len(x_MF), self.groups, self.entries
        logits_MGV = self.weight_proj(x_MF).float().view(M, G, V)
        codes_MG = logits_MGV.argmax(dim=-1)
        hard_MGV = F.one_hot(codes_MG, V).to(logits_MGV.dtype)
        if self.training:  # one-hot forward, softmax(·/τ) gradient
            onehot_MGV = F.gumbel_softmax(logits_MGV, tau=temperature, hard=True)
        else:
            onehot_MGV = hard_MGV
        code_GVC = self.codevectors.view(G, V, -1).to(onehot_MGV.dtype)
        vectors_MGC = torch.einsum("mgv,gvc->mgc", onehot_MGV, code_GVC)
        return Quantized(
            vectors_MC=vectors_MGC.reshape(M, -1),
            codes_MG=codes_MG,
            code_ppl=perplexity(hard_MGV).detach(),
            prob_ppl=perplexity(logits_MGV.softmax(dim=-1)),
        )


def sample_negatives(
    masked_BT: torch.Tensor, k: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(index [M,K] into the M masked steps in [B,T] order, valid [M,K]): for each masked
    step, ``k`` draws with replacement from the other masked steps of its row.

    A row with one masked step has nothing to draw: its entries are invalid (and point at the
    step itself)."""
    masked_BT = masked_BT.bool()
    count_B = masked_BT.sum(dim=1)
    offset_B = count_B.cumsum(0) - count_B
    local_BT = masked_BT.long().cumsum(dim=1) - 1  # rank of a masked step in its row
    row_M = masked_BT.nonzero()[:, 0]
    own_M = local_BT[masked_BT]
    n_M = count_B[row_M]
    draw_MK = torch.rand(len(row_M), k, device=masked_BT.device, generator=generator)
    other_MK = (draw_MK * (n_M - 1).clamp_min(0)[:, None]).long()
    other_MK = torch.minimum(other_MK, (n_M - 2).clamp_min(0)[:, None])
    other_MK = other_MK + (other_MK >= own_M[:, None]).long()  # skip the step itself
    valid_MK = (n_M >= 2)[:, None].expand(-1, k)
    own_global_M = offset_B[row_M] + own_M
    index_MK = torch.where(valid_MK, offset_B[row_M][:, None] + other_MK, own_global_M[:, None])
    return index_MK, valid_MK


def contrastive_logits(
    c_ME: torch.Tensor,
    q_ME: torch.Tensor,
    index_MK: torch.Tensor,
    keep_MK: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """[M,1+K]: cosine(c_m, q_m) and cosine(c_m, q_index[m,k]) over ``temperature``; entries
    not kept are -inf.

    All pairs are scored as one [M,M] product and gathered (M² rather than the M·K·E of
    gathering the distractor vectors: smaller for the masked steps of a batch). In float32
    even under autocast, as fairseq's cosine similarity."""
    with torch.autocast(c_ME.device.type, enabled=False):
        sim_MM = F.normalize(c_ME.float(), dim=-1) @ F.normalize(q_ME.float(), dim=-1).T
    pos_M1 = sim_MM.diagonal().unsqueeze(1)
    neg_MK = sim_MM.gather(1, index_MK).masked_fill(~keep_MK, float("-inf"))
    return torch.cat([pos_M1, neg_MK], dim=1) / temperature


@OBJECTIVES.register("wav2vec2")
class Wav2Vec2(Objective):
    """Masked contrastive prediction of quantised local features, plus codebook diversity."""

    @dataclass
    class Config(SpanMaskConfig):
        type: str = "wav2vec2"
        #: quantiser: groups G, entries per group V, codevector width C (concatenated)
        groups: int = 2
        entries: int = 320
        codevector_dim: int = 256
        #: compared width E (project_q and final_proj)
        final_dim: int = 256
        #: width F of the encoder's targets (0 = the encoder's target_dim)
        target_dim: int = 0
        negatives: int = 100
        logit_temperature: float = 0.1
        #: Gumbel temperature: max(max · decay^n, min), n = training forward calls
        max_temperature: float = 2.0
        min_temperature: float = 0.5
        temperature_decay: float = 0.999995
        diversity_weight: float = 0.1
        feature_penalty: float = 0.0

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> MaskSpans:
        return cfg.span_masking()

    def __init__(self, cfg: Config, *, width: int, encoders: nn.ModuleDict, **_: object) -> None:
        super().__init__()
        enc = audio_encoder(encoders, cfg.modality, "wav2vec2.modality")
        if cfg.negatives < 1 or cfg.logit_temperature <= 0:
            raise ValueError("wav2vec2: negatives must be >= 1 and logit_temperature > 0")
        if not 0 < cfg.min_temperature <= cfg.max_temperature or not 0 < cfg.temperature_decay <= 1:
            raise ValueError(
                "wav2vec2: need 0 < min_temperature <= max_temperature, 0 < temperature_decay <= 1"
            )
        self.cfg = cfg
        self.prefix = cfg.prefix
        feat = encoder_target_dim(enc, cfg.target_dim, f"wav2vec2.modality={cfg.modality!r}")
        self.quantizer = GumbelQuantizer(feat, cfg.groups, cfg.entries, cfg.codevector_dim)
        self.project_q = nn.Linear(cfg.codevector_dim, cfg.final_dim)
        self.final_proj = nn.Linear(width, cfg.final_dim)
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))

    def temperature(self) -> torch.Tensor:
        """The Gumbel temperature now, a 0-d tensor on the buffer's device (no host sync)."""
        c = self.cfg
        log_decay = math.log(c.temperature_decay)
        return (c.max_temperature * torch.exp(self.updates.float() * log_decay)).clamp_min(
            c.min_temperature
        )

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        v, key = self.cfg.modality, f"{self.prefix}audio_masked"
        if key not in batch or v not in out.hidden:
            return {}  # a batch without this view (another source of a mixture)
        if v not in out.encoded or out.encoded[v].targets is None:
            raise ValueError(f"wav2vec2: encoder {v!r} gives no targets (ModalityTokens.targets)")
        h_BTD, y_BTF = out.hidden[v], out.encoded[v].targets
        masked_BT = batch[key].bool() & out.encoded[v].mask.bool()
        if h_BTD.shape[:2] != masked_BT.shape or y_BTF.shape[:2] != masked_BT.shape:
            raise ValueError(
                f"wav2vec2: hidden[{v!r}] {tuple(h_BTD.shape)}, targets {tuple(y_BTF.shape)} "
                f"and {key} {tuple(masked_BT.shape)} disagree on [B,T]"
            )
        temperature = self.temperature()
        if self.training:
            self.updates += 1
        quant = self.quantizer(y_BTF[masked_BT], temperature)
        q_ME = self.project_q(quant.vectors_MC)
        c_ME = self.final_proj(h_BTD[masked_BT])
        index_MK, valid_MK = sample_negatives(masked_BT, self.cfg.negatives)
        same_MK = (quant.codes_MG[index_MK] == quant.codes_MG[:, None, :]).all(dim=-1)
        logits_MJ = contrastive_logits(
            c_ME, q_ME, index_MK, valid_MK & ~same_MK, self.cfg.logit_temperature
        )
        n = len(logits_MJ)  # sum / count: nothing masked gives 0, not NaN
        target_M = torch.zeros(n, dtype=torch.long, device=logits_MJ.device)
        loss = F.cross_entropy(logits_MJ, target_M, reduction="sum") / max(n, 1)
        acc = (logits_MJ[:, 0] > logits_MJ[:, 1:].amax(dim=1)).float().sum() / max(n, 1)
        GV = self.cfg.groups * self.cfg.entries
        diversity = (GV - quant.prob_ppl) / GV if n else loss * 0.0
        terms = {
            "loss": loss,
            "diversity_loss": self.cfg.diversity_weight * diversity,
            "acc": acc.detach(),
            "code_ppl": quant.code_ppl if n else loss.new_zeros(()),
            "prob_ppl": quant.prob_ppl.detach() if n else loss.new_zeros(()),
            "temperature": temperature.detach(),
        }
        if self.cfg.feature_penalty:
            real_BT = out.encoded[v].mask.bool()
            terms["feature_loss"] = self.cfg.feature_penalty * y_BTF[real_BT].float().pow(2).mean()
        return terms
