"""Decoding: beam search against exhaustive search, greedy, sampling, bans, the KV cache.

The reference scorer here computes each sequence's log-probability one prefix at a time from
the stepper (one row, no cache), independently of the decoder's bookkeeping.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mmptm.generate.decoding import DecodeConfig, decode, repeated_ngram_bans
from mmptm.layers import TransformerConfig, TransformerDecoder

PAD, EOS, V = 0, 1, 6  # tokens 2..5 are content; pad is banned


class TableStepper:
    """Logits from a fixed random table of (context id, last token, token before it): a
    second-order Markov model per context. State: the rows' context ids [R]."""

    def __init__(self, contexts: int = 3, seed: int = 0, scale: float = 1.5) -> None:
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(contexts, V, V, V, generator=g) * scale

    def step(self, ids_BT, state):
        prev = ids_BT[:, -2] if ids_BT.shape[1] > 1 else torch.zeros_like(ids_BT[:, -1])
        return self.table[state, ids_BT[:, -1], prev], state

    def reorder(self, state, index_B):
        return state.index_select(0, index_B)


class TinyDecoderModel(nn.Module):
    """Embeddings + TransformerDecoder (cross to a context) + tied output projection."""

    def __init__(self, width: int = 16, ctx_width: int = 12, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        cfg = TransformerConfig(layers=2, heads=4, dropout=0.0, attn_dropout=0.0)
        self.embed = nn.Embedding(V, width)
        self.pos = nn.Embedding(32, width)
        self.decoder = TransformerDecoder(width, cfg, cross_width=ctx_width)
        self.bias = torch.zeros(V)
        self.bias[EOS] = 2.0  # so that rows end at different lengths
        self.eval()

    def logits(self, ids_BT, ctx, ctx_mask, cache=None, start=0):
        pos_T = torch.arange(start, start + ids_BT.shape[1])
        h = self.decoder(self.embed(ids_BT) + self.pos(pos_T), None, ctx, ctx_mask, cache=cache)
        return (h[:, -1] @ self.embed.weight.T) * 3.0 + self.bias  # sharper than at init


class TransformerStepper:
    """Steps ``TinyDecoderModel``: state = (ctx, ctx_mask, cache or None)."""

    def __init__(self, model: TinyDecoderModel, use_cache: bool) -> None:
        self.model, self.use_cache = model, use_cache

    def initial(self, ctx, ctx_mask):
        return (ctx, ctx_mask, self.model.decoder.new_cache() if self.use_cache else None)

    @torch.no_grad()
    def step(self, ids_BT, state):
        ctx, ctx_mask, cache = state
        if cache is None:
            return self.model.logits(ids_BT, ctx, ctx_mask), state
        start = cache.length
        return self.model.logits(ids_BT[:, start:], ctx, ctx_mask, cache, start), state

    def reorder(self, state, index_B):
        ctx, ctx_mask, cache = state
        if cache is not None:
            cache.reorder(index_B)
        return (ctx[index_B], ctx_mask[index_B], cache)


def _contexts(B: int = 3, M: int = 5, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randn(B, M, 12, generator=g)
    mask = torch.ones(B, M, dtype=torch.bool)
    for b in range(B):
        mask[b, M - b :] = False  # row b has M - b real context tokens
    return ctx, mask


def _row_state(stepper, row: int):
    """The initial state of input row ``row`` alone (context cut to its real length)."""
    if isinstance(stepper, TableStepper):
        return torch.tensor([row])
    ctx, mask = _contexts()
    n = int(mask[row].sum())
    return stepper.initial(ctx[row : row + 1, :n], mask[row : row + 1, :n])


def _batch_state(stepper):
    if isinstance(stepper, TableStepper):
        return torch.arange(3)
    return stepper.initial(*_contexts())


def _next_logprobs(stepper, row: int, prefix: list[int]) -> list[float]:
    """log p(· | prefix) of row ``row``, one prefix alone."""
    logits, _ = stepper.step(torch.tensor([prefix]), _row_state(stepper, row))
    return torch.log_softmax(logits.double(), -1)[0].tolist()


def _repeats(seq: list[int], n: int) -> bool:
    grams = [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]
    return len(grams) != len(set(grams))


def exhaustive(stepper, row, start, cfg: DecodeConfig, ban=(PAD,)):
    """(best score, its new tokens) over every allowed sequence, by enumeration."""
    best = (-math.inf, None)
    memo: dict[tuple, list[float]] = {}

    def consider(seq, score):
        nonlocal best
        if score > best[0]:
            best = (score, seq)

    def visit(seq, total):
        n = len(seq)
        if n == cfg.max_len:
            consider(seq, total / n**cfg.length_penalty)
            return
        key = tuple(seq)
        if key not in memo:
            memo[key] = _next_logprobs(stepper, row, start + seq)
        for v in range(V):
            grown = start + seq + [v]
            if v in ban or (cfg.no_repeat_ngram and _repeats(grown, cfg.no_repeat_ngram)):
                continue
            if v == EOS:
                if n >= cfg.min_len:
                    consider(seq, (total + memo[key][v]) / (n + 1) ** cfg.length_penalty)
            else:
                visit([*seq, v], total + memo[key][v])

    visit([], 0.0)
    return best


def _score_of(stepper, row, start, seq, cfg: DecodeConfig) -> float:
    """The length-penalised log-probability of one decoded sequence (eos added if short)."""
    full = seq + ([EOS] if len(seq) < cfg.max_len else [])
    total = sum(_next_logprobs(stepper, row, start + full[:i])[v] for i, v in enumerate(full))
    return total / len(full) ** cfg.length_penalty


STEPPERS = {
    "table": lambda: TableStepper(),
    "transformer": lambda: TransformerStepper(TinyDecoderModel(), use_cache=True),
}
START = [2]


def _decode(stepper, cfg, start=START, **kw):
    start_BP = torch.tensor([start] * 3)
    return decode(
        stepper, start_BP, cfg, eos_id=EOS, ban_ids=[PAD], state=_batch_state(stepper), **kw
    )


@pytest.mark.parametrize("kind", list(STEPPERS))
@pytest.mark.parametrize("lp,min_len", [(0.0, 1), (1.0, 1), (2.0, 0), (1.0, 2)])
def test_wide_beam_equals_exhaustive_search(kind: str, lp: float, min_len: int) -> None:
    """A beam holding every live prefix (4 content tokens, max_len 4: 4³·6 candidates) is
    exhaustive search."""
    stepper = STEPPERS[kind]()
    cfg = DecodeConfig(max_len=4, min_len=min_len, beam=4**3 * V, length_penalty=lp)
    got = _decode(stepper, cfg)
    for row in range(3):
        score, seq = exhaustive(stepper, row, START, cfg)
        assert got.ids[row] == seq, (row, got.ids[row], seq)
        assert got.scores[row].item() == pytest.approx(score, abs=1e-5)


def test_length_penalty_changes_the_optimum() -> None:
    """The exhaustive cases above exercise the length penalty: optima differ with it."""
    stepper = STEPPERS["table"]()
    best = [
        [
            exhaustive(stepper, r, START, DecodeConfig(max_len=4, length_penalty=lp))[1]
            for r in range(3)
        ]
        for lp in (0.0, 2.0)
    ]
    assert best[0] != best[1]


@pytest.mark.parametrize("kind", list(STEPPERS))
@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("lp", [0.0, 1.0])
def test_narrow_beam_never_beats_the_optimum_and_scores_its_sequence(kind, early, lp) -> None:
    stepper = STEPPERS[kind]()
    for beam in (1, 2, 3):
        cfg = DecodeConfig(max_len=4, beam=beam, length_penalty=lp, early_stopping=early)
        got = _decode(stepper, cfg)
        for row in range(3):
            opt, _ = exhaustive(stepper, row, START, cfg)
            assert got.scores[row].item() <= opt + 1e-6
            want = _score_of(stepper, row, START, got.ids[row], cfg)
            assert got.scores[row].item() == pytest.approx(want, abs=1e-5)


def reference_beam_search(stepper, row, start, cfg: DecodeConfig):
    """(score, new tokens) of a plain one-row beam search: 2K candidates, an eos among the K
    best ends a hypothesis, the K best others go on; it never stops before max_len unless
    ``early_stopping`` (K hypotheses ended), so it checks that stopping loses nothing."""
    K, lp = cfg.beam, cfg.length_penalty
    beams: list[tuple[float, list[int]]] = [(0.0, [])]
    ended: list[tuple[float, list[int]]] = []
    for t in range(cfg.max_len):
        cands = []
        for total, seq in beams:
            logp = _next_logprobs(stepper, row, start + seq)
            for v in range(V):
                if v == PAD or (v == EOS and t < cfg.min_len):
                    continue
                if cfg.no_repeat_ngram and _repeats(start + seq + [v], cfg.no_repeat_ngram):
                    continue
                cands.append((total + logp[v], seq, v))
        cands.sort(key=lambda c: -c[0])
        beams = []
        for rank, (total, seq, v) in enumerate(cands[: 2 * K]):
            if v == EOS and rank < K:
                ended.append((total / (t + 1) ** lp, seq))
            elif v != EOS and len(beams) < K:
                beams.append((total, [*seq, v]))
        if cfg.early_stopping and len(ended) >= K:
            return max(ended, key=lambda e: e[0])
    ended += [(total / cfg.max_len**lp, seq) for total, seq in beams]
    return max(ended, key=lambda e: e[0])


#: steppers where stopping once no live beam can win matters (a longer hypothesis ends
#: better than the finished ones after the beams' running averages looked worse)
REFERENCE_STEPPERS = {
    "table2": lambda: TableStepper(seed=2),
    "table3": lambda: TableStepper(seed=3, scale=3.0),
    "transformer": STEPPERS["transformer"],
}


@pytest.mark.parametrize("kind", list(REFERENCE_STEPPERS))
@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("lp", [0.0, 1.0, 2.0, -0.5])
def test_narrow_beams_equal_a_plain_reference_beam_search(kind, early, lp) -> None:
    stepper = REFERENCE_STEPPERS[kind]()
    for beam, ngram in ((2, 0), (3, 0), (5, 3)):
        cfg = DecodeConfig(
            max_len=8, beam=beam, length_penalty=lp, early_stopping=early, no_repeat_ngram=ngram
        )
        got = _decode(stepper, cfg)
        for row in range(3):
            score, seq = reference_beam_search(stepper, row, START, cfg)
            assert got.ids[row] == seq, (beam, row)
            assert got.scores[row].item() == pytest.approx(score, abs=1e-5)


@pytest.mark.parametrize("kind", list(STEPPERS))
@pytest.mark.parametrize("lp,early", [(0.0, False), (1.0, True), (0.0, True)])
def test_greedy_equals_beam_one_and_a_plain_argmax_loop(kind, lp, early) -> None:
    from mmptm.generate import decoding

    stepper = STEPPERS[kind]()
    cfg = DecodeConfig(max_len=6, length_penalty=lp, early_stopping=early)
    greedy = _decode(stepper, cfg)
    state = _batch_state(stepper)
    beam1 = decoding._beam_search(stepper, torch.tensor([START] * 3), cfg, EOS, [PAD], state, EOS)
    assert greedy.ids == beam1.ids
    torch.testing.assert_close(greedy.scores, beam1.scores)
    for row in range(3):  # the reference: argmax of each prefix alone
        seq: list[int] = []
        while len(seq) < cfg.max_len:
            logp = _next_logprobs(stepper, row, START + seq)
            logp[PAD] = -math.inf
            if len(seq) < cfg.min_len:
                logp[EOS] = -math.inf
            v = max(range(V), key=logp.__getitem__)
            if v == EOS:
                break
            seq.append(v)
        assert greedy.ids[row] == seq


@pytest.mark.parametrize("beam", [1, 4])
def test_cached_and_uncached_decoder_give_identical_tokens(beam: int) -> None:
    model = TinyDecoderModel(seed=3)
    cfg = DecodeConfig(max_len=10, min_len=2, beam=beam, length_penalty=1.0)
    outs = []
    for use_cache in (True, False):
        stepper = TransformerStepper(model, use_cache)
        outs.append(_decode(stepper, cfg, start=[2, 4]))
    assert outs[0].ids == outs[1].ids
    assert any(len(s) > 2 for s in outs[0].ids)
    torch.testing.assert_close(outs[0].scores, outs[1].scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", list(STEPPERS))
@pytest.mark.parametrize("beam,sample", [(1, False), (3, False), (1, True)])
def test_batch_equals_each_row_alone(kind: str, beam: int, sample: bool) -> None:
    """Rows of different contexts (and context padding) finish independently; sampling is
    compared with top_p tiny, where it is deterministic."""
    stepper = STEPPERS[kind]()
    top_p = 1e-6 if sample else 1.0
    cfg = DecodeConfig(max_len=7, beam=beam, sample=sample, top_p=top_p, length_penalty=0.0)
    batch = _decode(stepper, cfg, pad_id=PAD)
    lengths = set()
    for row in range(3):
        alone = decode(
            stepper,
            torch.tensor([START]),
            cfg,
            eos_id=EOS,
            ban_ids=[PAD],
            state=_row_state(stepper, row),
        )
        assert batch.ids[row] == alone.ids[0]
        assert batch.scores[row].item() == pytest.approx(alone.scores[0].item(), abs=1e-5)
        lengths.add(len(alone.ids[0]))
    assert len(lengths) > 1  # rows of different lengths: some finish before others


class FixedStepper:
    """The same next-token logits whatever the prefix (state unused)."""

    def __init__(self, logits_V: torch.Tensor) -> None:
        self.logits_V = logits_V

    def step(self, ids_BT, state):
        return self.logits_V.expand(ids_BT.shape[0], -1).clone(), state

    def reorder(self, state, index_B):
        return state


@pytest.mark.parametrize("beam", [1, 3])
def test_min_len_and_ban_ids(beam: int) -> None:
    # eos is the likeliest token, then pad, then token 3.
    stepper = FixedStepper(torch.tensor([5.0, 9.0, 0.0, 2.0, 0.0, 0.0]))
    for min_len in (0, 1, 3):
        cfg = DecodeConfig(max_len=6, min_len=min_len, beam=beam, length_penalty=0.0)
        got = decode(stepper, torch.tensor([[2], [2]]), cfg, eos_id=EOS, ban_ids=[PAD])
        assert got.ids == [[3] * min_len] * 2
    cfg = DecodeConfig(max_len=3, min_len=3, beam=beam)
    got = decode(stepper, torch.tensor([[2]]), cfg, eos_id=EOS, ban_ids=[PAD, 3])
    assert PAD not in got.ids[0] and 3 not in got.ids[0] and len(got.ids[0]) == 3
    with pytest.raises(ValueError, match="eos_id"):
        decode(stepper, torch.tensor([[2]]), cfg, eos_id=EOS, ban_ids=[EOS])


class CycleStepper:
    """Prefers token (last + 1), cycling through 2, 3, 4; eos unlikely."""

    def step(self, ids_BT, state):
        nxt = (ids_BT[:, -1] - 2 + 1) % 3 + 2
        logits = torch.zeros(ids_BT.shape[0], V)
        logits[:, EOS] = -3.0
        logits[torch.arange(len(nxt)), nxt] = 4.0
        return logits, state

    def reorder(self, state, index_B):
        return state


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram(beam: int, n: int) -> None:
    cfg = DecodeConfig(max_len=8, beam=beam, length_penalty=0.0)
    start = torch.tensor([[2], [3]])
    plain = decode(CycleStepper(), start, cfg, eos_id=EOS, ban_ids=[PAD])
    assert all(_repeats([s, *ids], n) for s, ids in zip([2, 3], plain.ids))
    cfg.no_repeat_ngram = n
    got = decode(CycleStepper(), start, cfg, eos_id=EOS, ban_ids=[PAD])
    for s, ids in zip([2, 3], got.ids):
        assert not _repeats([s, *ids], n)
        assert ids  # the ban leaves other tokens to go on with


def test_repeated_ngram_bans_by_hand() -> None:
    ids = torch.tensor([[2, 3, 2, 4, 2], [5, 5, 5, 5, 5]])
    ban = repeated_ngram_bans(ids, 2, V)
    assert ban[0].nonzero().flatten().tolist() == [3, 4]  # "2 3" and "2 4" seen after a 2
    assert ban[1].nonzero().flatten().tolist() == [5]
    assert repeated_ngram_bans(ids, 6, V) is None
    assert repeated_ngram_bans(ids, 1, V)[0].nonzero().flatten().tolist() == [2, 3, 4]


def _frequencies(cfg: DecodeConfig, logits_V: torch.Tensor, rows: int = 6000) -> torch.Tensor:
    got = decode(FixedStepper(logits_V), torch.full((rows, 1), 2), cfg, eos_id=EOS, ban_ids=[PAD])
    first = torch.tensor([ids[0] for ids in got.ids])
    return torch.bincount(first, minlength=V).double() / rows


def _close(freq: torch.Tensor, p: torch.Tensor, rows: int = 6000) -> None:
    """Within 4.5 standard errors of a multinomial proportion, and exactly 0 where p is."""
    sd = (p * (1 - p) / rows).sqrt()
    assert bool(((freq - p).abs() <= 4.5 * sd + 1e-12).all()), (freq, p)


def test_sampling_frequencies_match_the_distribution() -> None:
    logits = torch.tensor([3.0, 0.0, 1.0, 0.5, -0.5, 0.2])  # pad (banned) would be likeliest
    allowed = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 1.0])  # eos banned by min_len=1
    base = torch.softmax(logits.double().masked_fill(allowed == 0, -math.inf), 0)
    cfg = DecodeConfig(max_len=1, sample=True, seed=0)
    _close(_frequencies(cfg, logits), base)
    # Temperature 2: probabilities ∝ p^(1/2).
    cfg = DecodeConfig(max_len=1, sample=True, temperature=2.0, seed=1)
    _close(_frequencies(cfg, logits), base.sqrt() / base.sqrt().sum())
    # Nucleus 0.6: tokens sorted 2 (.44), 3 (.27), 5 (.20), 4 (.10); 2 and 3 reach 0.6.
    cfg = DecodeConfig(max_len=1, sample=True, top_p=0.6, seed=2)
    nucleus = base * torch.tensor([0, 0, 1, 1, 0, 0.0])
    _close(_frequencies(cfg, logits), nucleus / nucleus.sum())
    # Top-k 3: tokens 2, 3, 5.
    cfg = DecodeConfig(max_len=1, sample=True, top_k=3, seed=3)
    top3 = base * torch.tensor([0, 0, 1, 1, 0, 1.0])
    _close(_frequencies(cfg, logits), top3 / top3.sum())


def test_sampling_is_seeded_and_tiny_top_p_is_greedy() -> None:
    stepper = STEPPERS["transformer"]()
    cfg = DecodeConfig(max_len=6, sample=True, seed=5)
    a, b = _decode(stepper, cfg), _decode(stepper, cfg)
    assert a.ids == b.ids
    others = [
        _decode(stepper, DecodeConfig(max_len=6, sample=True, seed=s)).ids for s in range(6, 12)
    ]
    assert any(o != a.ids for o in others)
    greedy = _decode(stepper, DecodeConfig(max_len=6))
    for tiny in (
        DecodeConfig(max_len=6, sample=True, top_p=1e-6),
        DecodeConfig(max_len=6, sample=True, top_k=1),
    ):
        assert _decode(stepper, tiny).ids == greedy.ids


@pytest.mark.parametrize(
    "kw,name",
    [
        ({"beam": 0}, "beam"),
        ({"max_len": 0}, "max_len"),
        ({"min_len": 9, "max_len": 4}, "min_len"),
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": 0.0}, "temperature"),
        ({"sample": True, "beam": 2}, "sample"),
    ],
)
def test_bad_config_names_the_field(kw, name) -> None:
    with pytest.raises(ValueError, match=f"decoding: {name} must be"):
        DecodeConfig(**kw)


def test_finished_rows_are_fed_padding_and_score_nothing() -> None:
    """Row 0 ends at its second token, row 1 runs to max_len; later steps feed row 0 pad and
    its score stays the mean log-probability of its two tokens (length penalty 1)."""
    logits_RV = torch.tensor([[0.0, 8.0, 0.0, 3.0, 0.0, 0.0], [0.0, -9.0, 0.0, 0.0, 4.0, 0.0]])
    seen: list[torch.Tensor] = []

    class RowStepper:
        def step(self, ids_BT, state):
            seen.append(ids_BT.clone())
            return logits_RV[state], state

        def reorder(self, state, index_B):
            return state[index_B]

    cfg = DecodeConfig(max_len=4, min_len=1)
    got = decode(
        RowStepper(),
        torch.tensor([[2], [2]]),
        cfg,
        eos_id=EOS,
        ban_ids=[PAD],
        state=torch.tensor([0, 1]),
        pad_id=PAD,
    )
    assert got.ids == [[3], [4, 4, 4, 4]]
    assert seen[-1].tolist() == [[2, 3, EOS, PAD], [2, 4, 4, 4]]
    logp = torch.log_softmax(logits_RV.double(), 1)
    assert got.scores[0].item() == pytest.approx((logp[0, 3] + logp[0, EOS]).item() / 2, abs=1e-6)
    assert got.scores[1].item() == pytest.approx(logp[1, 4].item(), abs=1e-6)
