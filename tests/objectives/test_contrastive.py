"""Contrastive: InfoNCE against numpy, the local-loss identity, temperature, and a real
2-process gloo run checking that gathered-with-gradient losses give the global gradient."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from mmptm.fusion.base import FusionOutput
from mmptm.objectives.contrastive import Contrastive, gather_features, info_nce
from mmptm.train.trainer import leave_process_group


def _np_info_nce(a: np.ndarray, b: np.ndarray, scale: float) -> float:
    """Mean of row-wise and column-wise cross-entropy of scale·A·Bᵀ with diagonal targets."""
    logits = scale * (a.astype(np.float64) @ b.astype(np.float64).T)

    def row_ce(lg: np.ndarray) -> float:
        m = lg.max(axis=1, keepdims=True)
        lse = np.log(np.exp(lg - m).sum(axis=1)) + m[:, 0]
        return float(np.mean(lse - np.diag(lg)))

    return 0.5 * (row_ce(logits) + row_ce(logits.T))


def _unit_rows(g: torch.Generator, n: int, e: int) -> torch.Tensor:
    return F.normalize(torch.randn(n, e, generator=g), dim=-1)


def test_info_nce_matches_numpy() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = _unit_rows(g, 10, 6), _unit_rows(g, 10, 6)
    b[:5] = F.normalize(a[:5] + 0.3 * b[:5], dim=-1)  # some rows actually match
    scale = torch.tensor(7.5)
    got = info_nce(a, b, scale)
    want = _np_info_nce(a.numpy(), b.numpy(), 7.5)
    assert got.item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    # it is not symmetric in a trivial way: swapping which columns match changes it
    assert info_nce(a, b.flip(0), scale).item() != pytest.approx(want, rel=1e-3)


@pytest.mark.parametrize("world", [2, 4])
def test_local_losses_average_to_the_global_loss(world: int) -> None:
    g = torch.Generator().manual_seed(1)
    N, E = 12, 5
    a, b = _unit_rows(g, N, E), _unit_rows(g, N, E)
    scale = torch.tensor(10.0)
    B = N // world
    local = [
        info_nce(
            a[r * B : (r + 1) * B],
            b[r * B : (r + 1) * B],
            scale,
            za_all_NE=a,
            zb_all_NE=b,
            offset=r * B,
        ).item()
        for r in range(world)
    ]
    want = _np_info_nce(a.numpy(), b.numpy(), 10.0)
    assert sum(local) / world == pytest.approx(want, rel=1e-5)
    assert len({round(x, 6) for x in local}) > 1  # the ranks really see different losses


def test_gather_features_is_identity_without_distributed() -> None:
    z = torch.randn(3, 4)
    assert gather_features(z) is z
    assert gather_features(z, with_grad=False) is z


def _pooled(g: torch.Generator, n: int, width: int) -> dict[str, torch.Tensor]:
    return {"image": torch.randn(n, width, generator=g), "text": torch.randn(n, width, generator=g)}


def _np_contrastive_loss(obj: Contrastive, pooled: dict[str, torch.Tensor], scale: float):
    a, b = obj.cfg.modalities
    z = {}
    for m in (a, b):
        x = pooled[m].double().numpy() @ obj.proj[m].weight.detach().double().numpy().T
        z[m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return _np_info_nce(z[a], z[b], scale)


def test_contrastive_initial_scale_and_loss() -> None:
    torch.manual_seed(0)
    obj = Contrastive(Contrastive.Config(embed_dim=6), width=8)
    assert obj.proj["image"].weight.shape == (6, 8)
    assert obj.logit_scale.requires_grad
    assert obj.logit_scale.exp().item() == pytest.approx(1 / 0.07, rel=1e-6)
    pooled = _pooled(torch.Generator().manual_seed(1), 7, 8)
    res = obj(FusionOutput({}, {}, pooled), {})
    assert res["logit_scale"].item() == pytest.approx(1 / 0.07, rel=1e-5)
    want = _np_contrastive_loss(obj, pooled, 1 / 0.07)
    assert res["loss"].item() == pytest.approx(want, rel=1e-5)
    emb = obj.embed(FusionOutput({}, {}, pooled), "text")
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(7))
    # acc: row i's best column is i
    z_a, z_b = obj.embed(FusionOutput({}, {}, pooled), "image"), emb
    acc = sum(int((z_a[i] @ z_b.T).argmax() == i) for i in range(7)) / 7
    assert res["acc"].item() == pytest.approx(acc)


def test_logit_scale_above_the_bound_still_learns_and_is_clamped_after_the_step() -> None:
    """open_clip's rule: the parameter itself is clamped to [0, ln max] after each optimiser
    step. Clamping inside the forward pass gave it no gradient above the bound, so it stuck."""
    torch.manual_seed(0)
    obj = Contrastive(Contrastive.Config(max_logit_scale=50.0), width=8)
    with torch.no_grad():
        obj.logit_scale.fill_(math.log(1000.0))  # above the bound, e.g. an imported weight
    pooled = _pooled(torch.Generator().manual_seed(2), 5, 8)
    res = obj(FusionOutput({}, {}, pooled), {})
    assert res["logit_scale"].item() == pytest.approx(1000.0, rel=1e-5)  # used as it is
    assert res["loss"].item() == pytest.approx(_np_contrastive_loss(obj, pooled, 1000.0), rel=1e-5)
    res["loss"].backward()
    assert obj.logit_scale.grad is not None and obj.logit_scale.grad.abs().item() > 0
    obj.after_step()
    assert obj.logit_scale.item() == pytest.approx(math.log(50.0))
    with torch.no_grad():
        obj.logit_scale.fill_(-2.0)  # a temperature above 1: no lower bound before
    obj.after_step()
    assert obj.logit_scale.item() == 0.0


def test_temperature_frozen_when_not_learned() -> None:
    torch.manual_seed(0)
    obj = Contrastive(Contrastive.Config(learn_temperature=False, init_temperature=0.1), width=8)
    assert not obj.logit_scale.requires_grad
    assert obj.logit_scale.exp().item() == pytest.approx(10.0, rel=1e-6)
    pooled = {k: v.requires_grad_(True) for k, v in _pooled(torch.Generator(), 4, 8).items()}
    obj(FusionOutput({}, {}, pooled), {})["loss"].backward()
    assert obj.logit_scale.grad is None
    assert obj.proj["image"].weight.grad is not None


@pytest.mark.parametrize("modalities", [["image"], ["a", "b", "c"]])
def test_contrastive_needs_two_modalities(modalities: list[str]) -> None:
    with pytest.raises(ValueError, match="two names"):
        Contrastive(Contrastive.Config(modalities=modalities), width=8)


def test_same_modality_twice_aligns_the_halves_of_stacked_pairs() -> None:
    torch.manual_seed(0)
    obj = Contrastive(Contrastive.Config(modalities=["text", "text"]), width=8)
    rows = torch.randn(10, 8, generator=torch.Generator().manual_seed(3))
    batch = {"__pairs__": "stacked", "__source__": "xlco"}
    res = obj(FusionOutput({}, {}, {"text": rows}), batch)
    # Independent: rows 0..4 are the first sentences, rows 5..9 their translations, one
    # shared projection.
    z = rows.double().numpy() @ obj.proj["text"].weight.detach().double().numpy().T
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    assert res["loss"].item() == pytest.approx(_np_info_nce(z[:5], z[5:], 1 / 0.07), rel=1e-5)
    assert res["loss"].item() != pytest.approx(_np_info_nce(z[:5], z[5:][::-1], 1 / 0.07))
    with pytest.raises(ValueError, match=r"\[text, text\] aligns stacked pairs.*'mono/en'"):
        obj(FusionOutput({}, {}, {"text": rows}), {"__source__": "mono/en"})


# ---------------------------------------------------------------------------------------------
# two real processes over gloo

N, WIDTH, EMBED, WORLD = 8, 6, 5, 2


def _global_reference(data: dict) -> dict[str, torch.Tensor]:
    """Single-process float64 autograd of the global loss, written out by hand."""
    leaf = {k: data[k].double().clone().requires_grad_(True) for k in ("fa", "fb", "pa", "pb")}
    W = {m: data["state"][f"proj.{m}.weight"].double().clone().requires_grad_(True) for m in "ab"}
    log_scale = data["state"]["logit_scale"].double().clone().requires_grad_(True)

    def sym_ce(za: torch.Tensor, zb: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        logits = scale * za @ zb.T
        n = len(za)
        rows = (torch.logsumexp(logits, 1) - logits[range(n), range(n)]).mean()
        cols = (torch.logsumexp(logits, 0) - logits[range(n), range(n)]).mean()
        return 0.5 * (rows + cols)

    feat_scale = torch.tensor(data["scale"], dtype=torch.float64)
    feat_loss = sym_ce(leaf["fa"], leaf["fb"], feat_scale)
    feat_loss.backward()

    # the gradient each rank's rows get from its own local loss alone, other ranks' rows
    # held constant (what a gather without gradient gives)
    B = N // WORLD
    own = {"fa": [], "fb": []}
    for r in range(WORLD):
        sl = slice(r * B, (r + 1) * B)
        fa, fb = (data[k].double().clone() for k in ("fa", "fb"))
        fa_r = fa[sl].clone().requires_grad_(True)
        fb_r = fb[sl].clone().requires_grad_(True)
        fa_all = torch.cat([fa[: r * B], fa_r, fa[(r + 1) * B :]])
        fb_all = torch.cat([fb[: r * B], fb_r, fb[(r + 1) * B :]])
        ab = feat_scale * fa_r @ fb_all.T
        ba = feat_scale * fb_r @ fa_all.T
        target = torch.arange(B) + r * B
        rows = [(torch.logsumexp(lg, 1) - lg[range(B), target]).mean() for lg in (ab, ba)]
        (0.5 * (rows[0] + rows[1])).backward()
        own["fa"].append(fa_r.grad)
        own["fb"].append(fb_r.grad)
    za = leaf["pa"] @ W["a"].T
    zb = leaf["pb"] @ W["b"].T
    za = za / za.norm(dim=1, keepdim=True)
    zb = zb / zb.norm(dim=1, keepdim=True)
    model_loss = sym_ce(za, zb, log_scale.exp())
    model_loss.backward()
    return {
        "feat_loss": feat_loss.detach(),
        "fa": leaf["fa"].grad,
        "fb": leaf["fb"].grad,
        "own_fa": torch.cat(own["fa"]),
        "own_fb": torch.cat(own["fb"]),
        "model_loss": model_loss.detach(),
        "pa": leaf["pa"].grad,
        "pb": leaf["pb"].grad,
        "Wa": W["a"].grad,
        "Wb": W["b"].grad,
        "logit_scale": log_scale.grad,
    }


def _rank_worker(rank: int, world: int, init_file: str, data: dict, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ok = False
    try:
        B = N // world
        rows = slice(rank * B, (rank + 1) * B)
        res: dict[str, torch.Tensor] = {}

        # 1. raw features: gather with gradient + the local form of info_nce
        fa = data["fa"][rows].clone().requires_grad_(True)
        fb = data["fb"][rows].clone().requires_grad_(True)
        fa_all = gather_features(fa, with_grad=True)
        fb_all = gather_features(fb, with_grad=True)
        scale = torch.tensor(data["scale"])
        loss = info_nce(fa, fb, scale, za_all_NE=fa_all, zb_all_NE=fb_all, offset=rank * B)
        loss.backward()
        res.update(feat_loss=loss.detach(), fa=fa.grad, fb=fb.grad)
        res["fa_all"] = fa_all.detach()
        # 1b. gathered without gradient: only the own local loss reaches the own rows
        fa = data["fa"][rows].clone().requires_grad_(True)
        fb = data["fb"][rows].clone().requires_grad_(True)
        fa_all = gather_features(fa, with_grad=False)
        fb_all = gather_features(fb, with_grad=False)
        loss = info_nce(fa, fb, scale, za_all_NE=fa_all, zb_all_NE=fb_all, offset=rank * B)
        loss.backward()
        res.update(nograd_feat_loss=loss.detach(), nograd_fa=fa.grad, nograd_fb=fb.grad)

        # 2. the Contrastive module itself (projection, normalisation, scale, gather, offset)
        def module(**cfg) -> Contrastive:
            obj = Contrastive(
                Contrastive.Config(modalities=["a", "b"], embed_dim=EMBED, **cfg), width=WIDTH
            )
            obj.load_state_dict(data["state"])
            return obj

        obj = module()
        pa = data["pa"][rows].clone().requires_grad_(True)
        pb = data["pb"][rows].clone().requires_grad_(True)
        out = obj(FusionOutput({}, {}, {"a": pa, "b": pb}), {})
        out["loss"].backward()
        res.update(
            model_loss=out["loss"].detach(),
            pa=pa.grad,
            pb=pb.grad,
            Wa=obj.proj["a"].weight.grad,
            Wb=obj.proj["b"].weight.grad,
            logit_scale=obj.logit_scale.grad,
        )
        # 3. same loss value when gathering without gradient
        with torch.no_grad():
            pooled = {"a": data["pa"][rows], "b": data["pb"][rows]}
            res["nograd_loss"] = module(gather_with_grad=False)(FusionOutput({}, {}, pooled), {})[
                "loss"
            ]
            # 4. local_loss=False: every rank computes the whole global loss
            res["global_form_loss"] = module(local_loss=False)(FusionOutput({}, {}, pooled), {})[
                "loss"
            ]
        torch.save(res, Path(out_dir) / f"rank{rank}.pt")
        ok = True
    finally:
        leave_process_group(wait=ok)


@pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed gloo"
)
def test_two_process_gather_with_grad_gives_global_gradient(tmp_path, monkeypatch) -> None:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    template = Contrastive(Contrastive.Config(modalities=["a", "b"], embed_dim=EMBED), width=WIDTH)
    with torch.no_grad():
        template.logit_scale.fill_(math.log(5.0))  # not at the bound: its gradient flows
    data = {
        "fa": _unit_rows(g, N, EMBED),
        "fb": _unit_rows(g, N, EMBED),
        "scale": 4.0,
        "pa": torch.randn(N, WIDTH, generator=g),
        "pb": torch.randn(N, WIDTH, generator=g),
        "state": {k: v.detach().clone() for k, v in template.state_dict().items()},
    }
    # The spawned children import this module by its name; make its root importable.
    root = Path(__file__).resolve().parents[__name__.count(".")]
    if str(root) not in sys.path:
        monkeypatch.syspath_prepend(str(root))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    ctx = mp.spawn(
        _rank_worker,
        args=(WORLD, str(tmp_path / "rendezvous"), data, str(out_dir)),
        nprocs=WORLD,
        join=False,
    )
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            pytest.fail("the 2-process gloo run did not finish within 120 s")
    ranks = [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]
    ref = _global_reference(data)
    tol = {"rtol": 1e-5, "atol": 1e-5}

    def rows(key: str) -> torch.Tensor:
        return torch.cat([ranks[r][key] for r in range(WORLD)]).double()

    # the gather puts every rank's rows in rank order
    for r in range(WORLD):
        torch.testing.assert_close(ranks[r]["fa_all"], data["fa"])

    # raw features: the mean of the local losses is the global loss, and each rank's
    # gradient (the sum over ranks' losses, via the all_gather backward) / world is the
    # gradient of that mean
    losses = [ranks[r]["feat_loss"].item() for r in range(WORLD)]
    assert abs(losses[0] - losses[1]) > 1e-4  # the local losses really differ
    assert sum(losses) / WORLD == pytest.approx(ref["feat_loss"].item(), rel=1e-5)
    torch.testing.assert_close(rows("fa") / WORLD, ref["fa"], **tol)
    torch.testing.assert_close(rows("fb") / WORLD, ref["fb"], **tol)

    # gathering without gradient: same loss values, but each rank's rows only get the
    # gradient of its own local loss (so the DDP average is not the global gradient)
    for r in range(WORLD):
        assert ranks[r]["nograd_feat_loss"].item() == pytest.approx(losses[r], rel=1e-6)
    torch.testing.assert_close(rows("nograd_fa"), ref["own_fa"], **tol)
    torch.testing.assert_close(rows("nograd_fb"), ref["own_fb"], **tol)
    assert not torch.allclose(rows("nograd_fa") / WORLD, ref["fa"], atol=1e-4)

    # the Contrastive module: same identities for inputs, and DDP-averaged parameter grads
    model_losses = [ranks[r]["model_loss"].item() for r in range(WORLD)]
    assert sum(model_losses) / WORLD == pytest.approx(ref["model_loss"].item(), rel=1e-5)
    torch.testing.assert_close(rows("pa") / WORLD, ref["pa"], **tol)
    torch.testing.assert_close(rows("pb") / WORLD, ref["pb"], **tol)
    for key in ("Wa", "Wb", "logit_scale"):
        mean = sum(ranks[r][key].double() for r in range(WORLD)) / WORLD
        torch.testing.assert_close(mean, ref[key], **tol)

    for r in range(WORLD):
        # gathering without gradient changes the gradient, not the loss value
        assert ranks[r]["nograd_loss"].item() == pytest.approx(model_losses[r], rel=1e-6)
        # local_loss=False: each rank computes the global loss itself
        assert ranks[r]["global_form_loss"].item() == pytest.approx(
            ref["model_loss"].item(), rel=1e-5
        )


def test_time_reversed_copies_reverse_the_real_steps_only() -> None:
    from mmptm.objectives.contrastive import REVERSED_ROWS, TimeReversed

    lengths = [3, 1, 4]
    mask = torch.tensor([[t < n for t in range(4)] for n in lengths])
    steps = torch.tensor([[10 * b + t if t < n else -1 for t in range(4)]
                          for b, n in enumerate(lengths)])  # fmt: skip
    frames = steps[:, :, None, None].float().expand(3, 4, 2, 5).clone()  # [B,T,2,5]
    batch = {"frames": frames, "frames_mask": mask, "ids": steps}
    out = TimeReversed(["frames", "frames_mask", "ids"], 1.0)(batch, torch.Generator())
    # clip 1 has one real step: nothing to reverse; clips 0 and 2 are copied backwards
    assert out[REVERSED_ROWS].tolist() == [0, 2]
    assert out["ids"].tolist() == [
        [0, 1, 2, -1], [10, -1, -1, -1], [20, 21, 22, 23], [2, 1, 0, -1], [23, 22, 21, 20]
    ]  # fmt: skip
    assert out["frames_mask"][3:].tolist() == [[True, True, True, False], [True] * 4]
    assert torch.equal(out["frames"][3:, :, 0, 0], out["ids"][3:].float())
    with pytest.raises(ValueError, match="exactly one"):
        TimeReversed(["frames"], 1.0)({"frames": frames}, torch.Generator())


def test_time_reversed_copies_are_extra_negatives_for_the_captions() -> None:
    torch.manual_seed(0)
    obj = Contrastive(Contrastive.Config(modalities=["video", "text"]), width=6)
    g = torch.Generator().manual_seed(3)
    video = torch.randn(6, 6, generator=g)  # 4 clips + reversed copies of clips 1 and 3
    text = torch.randn(4, 6, generator=g)
    batch = {"time_reversed_rows": torch.tensor([1, 3])}
    res = obj(FusionOutput({}, {}, {"video": video, "text": text}), batch)
    z = {m: F.normalize(x @ obj.proj[m].weight.detach().T, dim=-1)
         for m, x in (("video", video), ("text", text))}  # fmt: skip
    scale = 1 / 0.07
    v, rev, t = z["video"][:4], z["video"][4:], z["text"]
    target = torch.arange(4)
    v2t = F.cross_entropy(scale * v @ t.T, target)  # clips rank the 4 captions
    t2v = F.cross_entropy(scale * t @ torch.cat([v, rev]).T, target)  # captions rank 6 clips
    assert res["loss"].item() == pytest.approx(0.5 * (v2t + t2v).item(), rel=1e-5)
    own, back = (t[[1, 3]] * v[[1, 3]]).sum(-1), (t[[1, 3]] * rev).sum(-1)
    assert res["reversal_acc"].item() == pytest.approx((own > back).float().mean().item())
    # the two-way order loss: -log(e^own / (e^own + e^back)) at the same scale, averaged
    two = -torch.log(torch.sigmoid(scale * (own - back))).mean()
    assert res["reversal_loss"].item() == pytest.approx(two.item(), rel=1e-5)
