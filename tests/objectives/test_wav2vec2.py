"""wav2vec 2.0: span masking statistics, distractor sampling, the quantiser, the logits against
an explicit loop, the temperature schedule, and a tiny optimisation that must learn the task."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mmptm.encoders.base import Encoder, ModalityTokens, VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.masking import select_spans
from mmptm.objectives.wav2vec2 import (
    GumbelQuantizer,
    Wav2Vec2,
    contrastive_logits,
    perplexity,
    sample_negatives,
)

VOCAB = VocabInfo(vocab_size=8)


class AudioStub(Encoder):
    """Stands for an audio encoder: only its modality and target width matter here."""

    modality = "audio"
    main_key = "audio"

    def __init__(self, width: int, target_dim: int, name: str = "") -> None:
        super().__init__(width, name)
        self.target_dim = target_dim


def _objective(F: int = 8, width: int = 16, name: str = "audio", **cfg) -> Wav2Vec2:
    encoders = nn.ModuleDict({name: AudioStub(width, F, name)})
    return Wav2Vec2(Wav2Vec2.Config(modality=name, **cfg), width=width, encoders=encoders)


def _runs(row: torch.Tensor) -> list[int]:
    """Lengths of the maximal runs of True in a 1-D bool tensor."""
    runs, n = [], 0
    for x in [*row.tolist(), False]:
        if x:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


# --------------------------------------------------------------------------------------------
# Span masking


def test_long_utterances_mask_about_one_minus_one_minus_p_to_the_l() -> None:
    real = torch.ones(64, 2000, dtype=torch.bool)
    for p in (0.065, 0.08):
        frac = select_spans(real, p, 10, 2, torch.Generator().manual_seed(0)).float().mean()
        assert frac.item() == pytest.approx(1 - (1 - p) ** 10, abs=0.01), (p, frac)


def test_spans_are_whole_inside_real_steps_and_at_least_min_masks() -> None:
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([0, 1, 5, 9, 10, 11, 25, 60, 300, 300])
    real = torch.arange(300)[None] < lengths[:, None]
    # p so small that almost every row gets only its min_masks = 2 spans
    masked = select_spans(real, 1e-4, 10, 2, g)
    assert not bool((masked & ~real).any())
    for n, row in zip(lengths.tolist(), masked):
        count = int(row.sum())
        if n <= 11:  # too short for two distinct whole spans: every real step masked
            assert count == n
        else:  # two distinct starts: more than one span's worth, at most two
            assert 11 <= count <= 20, (n, count)
            assert all(r >= 10 for r in _runs(row)), (n, _runs(row))  # spans are whole
    # real p: every run is a whole span (or several), never cut short inside a row
    many = select_spans(torch.ones(32, 400, dtype=torch.bool), 0.065, 10, 2, g)
    assert all(r >= 10 for row in many for r in _runs(row))


def test_number_of_spans_follows_prob_times_length() -> None:
    """With length 1 spans never merge unseen: the count is floor(p n + u), mean p n."""
    real = torch.arange(500)[None] < torch.tensor([[500], [123]])
    counts = torch.stack(
        [select_spans(real, 0.1, 1, 0, torch.Generator().manual_seed(s)).sum(1) for s in range(200)]
    ).float()
    assert set(counts[:, 0].tolist()) == {50.0}
    assert set(counts[:, 1].tolist()) <= {12.0, 13.0}
    assert counts[:, 1].mean().item() == pytest.approx(12.3, abs=0.15)


def test_data_side_is_seeded_prefixed_and_skips_other_batches() -> None:
    side = Wav2Vec2.data_transform(Wav2Vec2.Config(), VOCAB)
    steps = torch.arange(120)[None] < torch.tensor([[120], [80], [30]])
    a = side({"audio_steps_mask": steps}, torch.Generator().manual_seed(3))["audio_masked"]
    b = side({"audio_steps_mask": steps}, torch.Generator().manual_seed(3))["audio_masked"]
    c = side({"audio_steps_mask": steps}, torch.Generator().manual_seed(4))["audio_masked"]
    assert a.dtype == torch.bool and a.shape == (3, 120)
    assert torch.equal(a, b) and not torch.equal(a, c)
    other = {"input_ids": torch.ones(2, 3)}
    assert side(dict(other), torch.Generator()) == other
    speech = Wav2Vec2.data_transform(Wav2Vec2.Config(modality="speech"), VOCAB)
    out = speech({"speech_audio_steps_mask": steps}, torch.Generator().manual_seed(3))
    assert torch.equal(out["speech_audio_masked"], a)
    with pytest.raises(ValueError, match="wav2vec2.mask_prob"):
        Wav2Vec2.data_transform(Wav2Vec2.Config(mask_prob=0.0), VOCAB)


# --------------------------------------------------------------------------------------------
# Distractors


def test_distractors_are_other_masked_steps_of_the_same_utterance() -> None:
    g = torch.Generator().manual_seed(0)
    masked = torch.rand(5, 40, generator=g) < 0.4
    masked[3] = False
    masked[3, 7] = True  # an utterance with one masked step: nothing to draw
    where = masked.nonzero()  # [M,2]: (utterance, step) of each masked step, in [B,T] order
    index, valid = sample_negatives(masked, 200, generator=g)
    assert index.shape == valid.shape == (len(where), 200)
    lonely = (where[:, 0] == 3).nonzero().item()
    assert not bool(valid[lonely].any()) and bool(valid[torch.arange(len(where)) != lonely].all())
    for m in range(len(where)):
        if m == lonely:
            continue
        picked = where[index[m]]
        assert bool((picked[:, 0] == where[m, 0]).all())  # same utterance
        assert not bool((index[m] == m).any())  # never the step itself
        others = int(masked[where[m, 0]].sum()) - 1
        assert len(set(index[m].tolist())) > min(others, 200) * 0.6  # spread over the others


def test_distractors_are_uniform_over_the_others() -> None:
    masked = torch.zeros(1, 10, dtype=torch.bool)
    masked[0, [1, 3, 4, 8]] = True
    index, _ = sample_negatives(masked, 30000, generator=torch.Generator().manual_seed(0))
    for m in range(4):
        counts = torch.bincount(index[m], minlength=4).float() / 30000
        assert counts[m] == 0
        assert torch.allclose(counts[torch.arange(4) != m], torch.tensor(1 / 3), atol=0.015)


def test_logits_use_only_same_utterance_others_through_the_objective_vectors() -> None:
    """c_m and q_j encode (utterance, step): cosine 1 for the own step, 1/2 for another step of
    the same utterance, 0 across utterances; every distractor logit must be exactly 1/2/τ."""
    masked = torch.tensor([[1, 1, 0, 1, 1], [0, 1, 1, 1, 0], [1, 0, 0, 0, 1]], dtype=torch.bool)
    where = masked.nonzero()
    M, B = len(where), 3
    q = torch.zeros(M, B + M)
    q[torch.arange(M), where[:, 0]] = 1.0
    q[torch.arange(M), B + torch.arange(M)] = 1.0
    index, valid = sample_negatives(masked, 50, generator=torch.Generator().manual_seed(0))
    logits = contrastive_logits(q.clone(), q, index, valid, temperature=0.1)
    assert torch.allclose(logits[:, 0], torch.full((M,), 10.0))
    assert torch.allclose(logits[:, 1:], torch.full((M, 50), 5.0))


def test_contrastive_logits_against_an_explicit_loop() -> None:
    g = torch.Generator().manual_seed(0)
    c, q = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    index = torch.randint(0, 6, (6, 3), generator=g)
    keep = torch.rand(6, 3, generator=g) < 0.7
    logits = contrastive_logits(c, q, index, keep, temperature=0.2)
    for m in range(6):
        cos = torch.nn.functional.cosine_similarity
        assert logits[m, 0].item() == pytest.approx(cos(c[m], q[m], dim=0).item() / 0.2, rel=1e-5)
        for k in range(3):
            want = cos(c[m], q[index[m, k]], dim=0).item() / 0.2 if keep[m, k] else -math.inf
            assert logits[m, 1 + k].item() == pytest.approx(want, rel=1e-5)


# --------------------------------------------------------------------------------------------
# The quantiser


def test_quantiser_outputs_concatenated_codevectors_and_straight_through_gradients() -> None:
    torch.manual_seed(0)
    quant = GumbelQuantizer(in_dim=6, groups=2, entries=5, dim=8)
    x = torch.randn(30, 6)
    for training in (True, False):
        quant.train(training)
        out = quant(x, temperature=0.01)
        book = quant.codevectors.view(2, 5, 4)
        for g in range(2):
            chunk = out.vectors_MC[:, 4 * g : 4 * g + 4]
            hit = (chunk[:, None, :] - book[g][None]).abs().amax(-1) < 1e-6  # [M,V]
            assert bool((hit.sum(1) == 1).all())  # exactly one codevector per group
            if not training:  # evaluation: the argmax
                logits = quant.weight_proj(x).view(30, 2, 5)[:, g]
                assert torch.equal(hit.float().argmax(1), logits.argmax(1))
    quant.train()
    out = quant(x, temperature=1.0)
    out.vectors_MC.pow(2).sum().backward()
    assert quant.weight_proj.weight.grad.abs().sum() > 0  # through the soft sample
    assert quant.codevectors.grad.abs().sum() > 0


def test_perplexity_is_g_times_v_for_a_uniform_batch_average() -> None:
    G, V = 2, 320
    peaked = torch.full((V, G, V), 0.1 / (V - 1))  # row i puts 0.9 on entry i
    peaked[torch.arange(V), :, torch.arange(V)] = 0.9
    assert perplexity(peaked).item() == pytest.approx(G * V, rel=1e-3)
    collapsed = torch.zeros(V, G, V)
    collapsed[:, :, 7] = 1.0
    assert perplexity(collapsed).item() == pytest.approx(G, rel=1e-4)
    # through the quantiser: input i → logits peaked at entry i in both groups
    quant = GumbelQuantizer(in_dim=V, groups=G, entries=V, dim=4).eval()
    with torch.no_grad():
        quant.weight_proj.weight.copy_(10 * torch.eye(V).repeat(G, 1))
    out = quant(torch.eye(V), temperature=2.0)
    assert out.code_ppl.item() == pytest.approx(G * V, rel=1e-3)
    assert out.prob_ppl.item() == pytest.approx(G * V, rel=1e-3)
    assert torch.equal(out.codes_MG, torch.arange(V)[:, None].expand(V, G))


# --------------------------------------------------------------------------------------------
# The objective


def _batch(B: int = 4, T: int = 40, F: int = 8, width: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, T - 5, T - 12, T][:B])
    steps = torch.arange(T)[None] < lengths[:, None]
    masked = select_spans(steps, 0.065, 10, 2, g)
    y = torch.randn(B, T, F, generator=g)
    h = torch.randn(B, T, width, generator=g)
    return steps, masked, y, h


def _out(h, steps, y, name="audio") -> FusionOutput:
    return FusionOutput({name: h}, {}, {}, encoded={name: ModalityTokens(h, steps, y)})


def test_temperature_anneals_per_training_forward_and_resumes() -> None:
    obj = _objective(entries=16, max_temperature=2.0, min_temperature=0.5, temperature_decay=0.9)
    steps, masked, y, h = _batch()
    batch = {"audio_steps_mask": steps, "audio_masked": masked}
    temps = [obj(_out(h, steps, y), batch)["temperature"].item() for _ in range(20)]
    want = [max(2.0 * 0.9**n, 0.5) for n in range(20)]
    assert temps == pytest.approx(want, rel=1e-5)
    obj.eval()
    assert obj(_out(h, steps, y), batch)["temperature"].item() == pytest.approx(0.5)
    assert int(obj.updates) == 20  # evaluation does not count
    again = _objective(entries=16, temperature_decay=0.9)
    again.load_state_dict(obj.state_dict())
    assert int(again.updates) == 20


def test_terms_masked_steps_only_and_gradients() -> None:
    torch.manual_seed(0)
    obj = _objective(negatives=5)
    steps, masked, y, h = _batch()
    h.requires_grad_(True)
    batch = {"audio_steps_mask": steps, "audio_masked": masked}
    terms = obj(_out(h, steps, y), batch)
    assert set(terms) == {"loss", "diversity_loss", "acc", "code_ppl", "prob_ppl", "temperature"}
    assert 0.0 <= terms["diversity_loss"].item() <= 0.1
    (terms["loss"] + terms["diversity_loss"]).backward()
    for name, p in obj.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    real_masked = masked & steps
    assert bool((h.grad.abs().sum(-1) > 0)[real_masked].all())
    assert not bool((h.grad.abs().sum(-1) > 0)[~real_masked].any())  # unmasked: no loss
    # the loss is the cross-entropy of the positive (class 0), as an explicit softmax gives
    obj.eval()
    torch.manual_seed(1)
    terms = obj(_out(h.detach(), steps, y), batch)
    torch.manual_seed(1)
    quant = obj.quantizer(y[real_masked], 0.5)
    q = obj.project_q(quant.vectors_MC)
    c = obj.final_proj(h.detach()[real_masked])
    index, valid = sample_negatives(real_masked, 5)
    same = (quant.codes_MG[index] == quant.codes_MG[:, None]).all(-1)
    logits = contrastive_logits(c, q, index, valid & ~same, 0.1)
    want = (torch.logsumexp(logits, 1) - logits[:, 0]).mean()
    assert terms["loss"].item() == pytest.approx(want.item(), rel=1e-5)


def test_feature_penalty_batches_without_the_view_and_errors() -> None:
    obj = _objective(feature_penalty=10.0)
    steps, masked, y, h = _batch()
    batch = {"audio_steps_mask": steps, "audio_masked": masked}
    terms = obj(_out(h, steps, y), batch)
    assert terms["feature_loss"].item() == pytest.approx(10 * y[steps].pow(2).mean().item())
    assert obj(FusionOutput({"text": h}, {}, {}), {"input_ids": h}) == {}
    no_targets = FusionOutput({"audio": h}, {}, {}, encoded={"audio": ModalityTokens(h, steps)})
    with pytest.raises(ValueError, match="gives no targets"):
        obj(no_targets, batch)
    with pytest.raises(ValueError, match="not an audio encoder"):
        Wav2Vec2(Wav2Vec2.Config(), width=8, encoders=nn.ModuleDict())
    speech = _objective(name="speech")
    terms = speech(_out(h, steps, y, "speech"), {"speech_audio_masked": masked})
    assert terms["loss"].item() > 0


def test_a_model_that_can_solve_the_task_learns_it() -> None:
    """hidden = a learnable map of the targets (a context network that recovered them): the
    positive must come to outrank its distractors. Chance is about 1 / (masked steps of an
    utterance): 0.08 here, which the same loop with hidden from unrelated noise stays at."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only contend
    try:
        torch.manual_seed(0)
        F, width, B, T = 8, 16, 4, 40
        obj = _objective(F=F, width=width, groups=2, entries=16, codevector_dim=16,
                         final_dim=16, negatives=20, temperature_decay=0.98)  # fmt: skip
        context = nn.Linear(F, width)
        opt = torch.optim.Adam([*obj.parameters(), *context.parameters()], lr=1e-2)
        g = torch.Generator().manual_seed(0)
        accs = []
        for _ in range(150):
            steps = torch.ones(B, T, dtype=torch.bool)
            masked = select_spans(steps, 0.065, 10, 2, g)
            y = torch.randn(B, T, F, generator=g)
            terms = obj(_out(context(y), steps, y), {"audio_masked": masked})
            opt.zero_grad()
            (terms["loss"] + terms["diversity_loss"]).backward()
            opt.step()
            accs.append(terms["acc"].item())
    finally:
        torch.set_num_threads(threads)
    first, last = sum(accs[:5]) / 5, sum(accs[-30:]) / 30
    assert first < 0.3, first
    assert last > 0.55, (first, last)
