"""Decoding over a step function: greedy, nucleus / top-k sampling and beam search.

Pure algorithms: a ``Stepper`` turns every row's prefix into next-token logits, so the same
code decodes a captioner, a translator or a causal LM, cached or not. Legend: B input rows,
K beams, R rows the stepper sees (B, or B·K in beam search), P start-prefix length, L prefix
length so far, V vocabulary.

Scores: the sum of the model's log-probabilities (``log_softmax`` of its logits, before any
ban) of the new tokens, eos included, divided by ``n ** length_penalty`` where ``n`` counts
the new tokens, eos included, and not the start prefix (fairseq's and HF's convention). A
sequence that reaches ``max_len`` without eos ends there, its ``n`` is ``max_len``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

NEG_INF = float("-inf")


@dataclass
class DecodeConfig:
    """How to decode; every field is checked when the config is made."""

    #: new tokens at most (not counting the start prefix)
    max_len: int = 32
    #: eos is banned while fewer new tokens than this have been generated
    min_len: int = 1
    #: 1 = greedy (or sampling); more = beam search
    beam: int = 1
    #: beam score = sum of log-probs / n ** length_penalty (n: new tokens, eos included)
    length_penalty: float = 1.0
    sample: bool = False
    #: nucleus: sample from the smallest set of tokens whose probability reaches top_p
    top_p: float = 1.0
    #: sample from the k likeliest tokens only (0 = all)
    top_k: int = 0
    temperature: float = 1.0
    #: no n-gram of this size occurs twice in a row's tokens, start prefix included (0 = off)
    no_repeat_ngram: int = 0
    seed: int = 0
    #: beam search stops a row once it has ``beam`` finished hypotheses (fairseq); False:
    #: only once no live beam can still beat the worst of them at any length ≤ max_len
    early_stopping: bool = False

    def __post_init__(self) -> None:
        checks = [
            ("max_len", self.max_len >= 1, "at least 1"),
            ("min_len", 0 <= self.min_len <= self.max_len, f"between 0 and max_len={self.max_len}"),
            ("beam", self.beam >= 1, "at least 1"),
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("top_k", self.top_k >= 0, "at least 0"),
            ("temperature", self.temperature > 0.0, "positive"),
            ("no_repeat_ngram", self.no_repeat_ngram >= 0, "at least 0"),
            ("sample", not (self.sample and self.beam > 1), "used with beam 1 only"),
        ]
        for name, ok, want in checks:
            if not ok:
                raise ValueError(f"decoding: {name} must be {want}, got {getattr(self, name)!r}")


class Stepper(Protocol):
    """A model seen as a next-token function of the prefix, with state it carries along."""

    def step(self, ids_BT: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """Logits [B,V] of the next token after ids_BT (every row's whole prefix so far, start
        prefix included); ``state`` is what the previous call returned (None on the first
        call). A cached stepper reads only the last position(s) it has not seen."""
        ...

    def reorder(self, state: Any, index_B: torch.Tensor) -> Any:
        """State with rows taken at index_B (expanding B rows to B*beam rows, beam
        reordering)."""
        ...


@dataclass
class Decoded:
    """Per input row, the best sequence found."""

    #: the new tokens, eos and what follows it stripped
    ids: list[list[int]]
    #: [B] the length-penalised log-probability of each
    scores: torch.Tensor


def decode(
    stepper: Stepper,
    start_BP: torch.Tensor,
    cfg: DecodeConfig,
    *,
    eos_id: int,
    ban_ids: Sequence[int] = (),
    state: Any = None,
    pad_id: int | None = None,
) -> Decoded:
    """Decode every row of ``start_BP`` (the forced start of each row: [BOS], or [BOS, a
    language token] for translation; one length for all rows), batched.

    ``state`` is the stepper's initial state for the B rows (an encoder's context, say);
    beam search expands it to B·K rows through ``stepper.reorder``. ``ban_ids`` are never
    generated (pad, mask, cls...). Rows finish independently: a finished row's later tokens
    are ``pad_id`` (eos when None) and count nothing.
    """
    if start_BP.dim() != 2 or start_BP.shape[1] < 1:
        raise ValueError(f"decoding: start_BP must be [B,P] with P ≥ 1, got {list(start_BP.shape)}")
    if eos_id in set(ban_ids):
        raise ValueError(f"decoding: eos_id {eos_id} is among ban_ids")
    pad = eos_id if pad_id is None else pad_id
    run = _greedy if cfg.beam == 1 else _beam_search
    return run(stepper, start_BP.long(), cfg, eos_id, list(ban_ids), state, pad)


def _token_logprobs(logits_RV, ids_RL, new: int, cfg: DecodeConfig, eos_id: int, ban_ids):
    """log_softmax of the logits [R,V] with banned tokens at -inf: ``ban_ids``, eos before
    ``min_len`` new tokens, tokens that would repeat an n-gram."""
    logp_RV = torch.log_softmax(logits_RV.float(), dim=-1)
    if ban_ids:
        logp_RV[:, ban_ids] = NEG_INF
    if new < cfg.min_len:
        logp_RV[:, eos_id] = NEG_INF
    if cfg.no_repeat_ngram:
        ban_RV = repeated_ngram_bans(ids_RL, cfg.no_repeat_ngram, logp_RV.shape[1])
        if ban_RV is not None:
            logp_RV = logp_RV.masked_fill(ban_RV, NEG_INF)
    return logp_RV


def repeated_ngram_bans(ids_RL: torch.Tensor, n: int, V: int) -> torch.Tensor | None:
    """[R,V] True where the token would complete an n-gram already in the row (None if the
    rows are shorter than n)."""
    R, L = ids_RL.shape
    if L < n:
        return None
    win_RWN = ids_RL.unfold(1, n, 1)  # every n-gram of the row: [R, L-n+1, n]
    last_R1N = ids_RL[:, L - n + 1 :].unsqueeze(1)  # the n-1 tokens a next token extends
    hit_RW = (win_RWN[:, :, :-1] == last_R1N).all(-1)
    count_RV = torch.zeros(R, V, device=ids_RL.device)
    count_RV.scatter_add_(1, win_RWN[:, :, -1], hit_RW.float())
    return count_RV > 0


def _filter_for_sampling(logp_RV: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """Logits to sample from: temperature, then top-k, then the nucleus (top-p); the likeliest
    token always stays."""
    x_RV = logp_RV / cfg.temperature
    if cfg.top_k:
        kth_R1 = x_RV.topk(min(cfg.top_k, x_RV.shape[1]), dim=1).values[:, -1:]
        x_RV = x_RV.masked_fill(x_RV < kth_R1, NEG_INF)
    if cfg.top_p < 1.0:
        sorted_RV, order_RV = x_RV.sort(dim=1, descending=True)
        p_RV = sorted_RV.softmax(dim=1)
        # Drop a token when the tokens before it already reach top_p.
        drop_RV = (p_RV.cumsum(dim=1) - p_RV) >= cfg.top_p
        drop_RV[:, 0] = False
        x_RV = x_RV.masked_fill(torch.zeros_like(drop_RV).scatter(1, order_RV, drop_RV), NEG_INF)
    return x_RV


def _greedy(stepper, start_BP, cfg: DecodeConfig, eos_id, ban_ids, state, pad) -> Decoded:
    """Greedy decoding, or sampling with ``cfg.sample``; one row per input row."""
    B, P = start_BP.shape
    dev = start_BP.device
    gen = torch.Generator(device=dev).manual_seed(cfg.seed) if cfg.sample else None
    ids_BL = start_BP
    done_B = torch.zeros(B, dtype=torch.bool, device=dev)
    sum_B = torch.zeros(B, device=dev)
    len_B = torch.zeros(B, device=dev)
    for t in range(cfg.max_len):
        logits_BV, state = stepper.step(ids_BL, state)
        logp_BV = _token_logprobs(logits_BV, ids_BL, t, cfg, eos_id, ban_ids)
        if cfg.sample:
            probs_BV = _filter_for_sampling(logp_BV, cfg).softmax(dim=1)
            tok_B = torch.multinomial(probs_BV, 1, generator=gen)[:, 0]
        else:
            tok_B = logp_BV.argmax(dim=1)
        tok_B = tok_B.masked_fill(done_B, pad)
        sum_B += logp_BV.gather(1, tok_B[:, None])[:, 0].masked_fill(done_B, 0.0)
        len_B += (~done_B).float()
        ids_BL = torch.cat([ids_BL, tok_B[:, None]], dim=1)
        done_B |= tok_B == eos_id
        if bool(done_B.all()):
            break
    scores_B = sum_B / len_B.clamp(min=1) ** cfg.length_penalty
    return Decoded(_strip(ids_BL[:, P:], eos_id), scores_B)


def _strip(tokens_BN: torch.Tensor, eos_id: int) -> list[list[int]]:
    """Each row's tokens before its first eos."""
    out = []
    for row in tokens_BN.tolist():
        out.append(row[: row.index(eos_id)] if eos_id in row else row)
    return out


class _Hypotheses:
    """The K best finished hypotheses of every row: scores [B,K] (-inf = none yet), best
    first, and their new tokens [B,K,max_len] (eos, then padding, after the end)."""

    def __init__(self, B: int, K: int, max_len: int, pad: int, device) -> None:
        self.scores_BK = torch.full((B, K), NEG_INF, device=device)
        self.tokens_BKN = torch.full((B, K, max_len), pad, dtype=torch.long, device=device)
        self.pad = pad

    def add(self, scores_BC: torch.Tensor, tokens_BCn: torch.Tensor) -> None:
        """Merge C candidates per row (-inf = none); on ties the older hypothesis stays."""
        n = tokens_BCn.shape[2]
        N = self.tokens_BKN.shape[2]
        tokens_BCN = torch.nn.functional.pad(tokens_BCn, (0, N - n), value=self.pad)
        all_scores = torch.cat([self.scores_BK, scores_BC], dim=1)  # [B, K+C]
        all_tokens = torch.cat([self.tokens_BKN, tokens_BCN], dim=1)
        order = all_scores.sort(dim=1, descending=True, stable=True).indices[:, : self.K]
        self.scores_BK = all_scores.gather(1, order)
        self.tokens_BKN = all_tokens.gather(1, order[..., None].expand(-1, -1, N))

    @property
    def K(self) -> int:
        return self.scores_BK.shape[1]

    def done(self, beam_BK: torch.Tensor, n: int, cfg: DecodeConfig) -> torch.Tensor:
        """[B] rows whose search is over, the running beams' sums ``beam_BK`` being at ``n``
        new tokens (see ``DecodeConfig.early_stopping``)."""
        worst_B = self.scores_BK[:, -1]
        full_B = worst_B > NEG_INF
        if cfg.early_stopping:
            return full_B
        # The best a live beam can still reach: its sum only falls (log-probs ≤ 0), divided
        # by the most favourable final length in n+1..max_len (max_len once it is reached).
        lp = cfg.length_penalty
        best_B = beam_BK.max(dim=1).values
        length = cfg.max_len if lp > 0 or n >= cfg.max_len else n + 1
        return full_B & (best_B / float(length) ** lp <= worst_B)


def _beam_search(stepper, start_BP, cfg: DecodeConfig, eos_id, ban_ids, state, pad) -> Decoded:
    """Beam search of width K = ``cfg.beam`` per row (fairseq/HF style, 2K candidates)."""
    B, P = start_BP.shape
    K, dev = cfg.beam, start_BP.device
    expand_R = torch.arange(B, device=dev).repeat_interleave(K)  # row b → rows b·K..b·K+K-1
    ids_RL = start_BP[expand_R]
    if state is not None:
        state = stepper.reorder(state, expand_R)
    beam_BK = torch.full((B, K), NEG_INF, device=dev)
    beam_BK[:, 0] = 0.0  # the K copies of a row start as one beam
    hyps = _Hypotheses(B, K, cfg.max_len, pad, dev)
    done_B = torch.zeros(B, dtype=torch.bool, device=dev)
    for t in range(cfg.max_len):
        logits_RV, state = stepper.step(ids_RL, state)
        logp_RV = _token_logprobs(logits_RV, ids_RL, t, cfg, eos_id, ban_ids)
        V = logp_RV.shape[1]
        cand_BKV = beam_BK[..., None] + logp_RV.view(B, K, V)
        cand_BC, idx_BC = cand_BKV.view(B, K * V).topk(min(2 * K, K * V), dim=1)
        src_BC, tok_BC = idx_BC // V, idx_BC % V
        eos_BC = tok_BC == eos_id
        rank_C = torch.arange(cand_BC.shape[1], device=dev)
        # An eos among the K best candidates ends a hypothesis (HF, fairseq).
        fin_BC = eos_BC & (rank_C < K) & ~done_B[:, None] & (cand_BC > NEG_INF)
        if bool(fin_BC.any()):
            gen_BKt = ids_RL[:, P:].view(B, K, t)
            gen_BCt = gen_BKt.gather(1, src_BC[..., None].expand(-1, -1, t))
            tokens_BCn = torch.cat([gen_BCt, tok_BC[..., None]], dim=2)
            hyps.add(
                cand_BC.masked_fill(~fin_BC, NEG_INF) / (t + 1) ** cfg.length_penalty, tokens_BCn
            )
        # The K best candidates that are not eos go on.
        keep_BK = (eos_BC.long() * cand_BC.shape[1] + rank_C).argsort(dim=1)[:, :K]
        beam_BK = cand_BC.gather(1, keep_BK).masked_fill(eos_BC.gather(1, keep_BK), NEG_INF)
        rows_R = (torch.arange(B, device=dev)[:, None] * K + src_BC.gather(1, keep_BK)).view(-1)
        ids_RL = torch.cat([ids_RL[rows_R], tok_BC.gather(1, keep_BK).view(-1, 1)], dim=1)
        if state is not None:
            state = stepper.reorder(state, rows_R)
        done_B |= hyps.done(beam_BK, t + 1, cfg)
        if bool(done_B.all()):
            break
    else:  # max_len reached: the live beams of unfinished rows end without eos
        live_BK = beam_BK.masked_fill(done_B[:, None], NEG_INF)
        hyps.add(live_BK / cfg.max_len**cfg.length_penalty, ids_RL[:, P:].view(B, K, -1))
    return Decoded(_strip(hyps.tokens_BKN[:, 0], eos_id), hyps.scores_BK[:, 0])
