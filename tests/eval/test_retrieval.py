"""Retrieval metrics against hand-worked examples, and both scoring paths on real checkpoints."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_overrides

from mmptm.data.pipeline import single_pass, stream_config
from mmptm.eval.retrieval import (
    Sides,
    evaluate_retrieval,
    evaluate_reversal,
    recall_at_k,
    recall_multi,
    retrieval_sides,
    similarity,
)
from mmptm.models.load import load_pretrained
from mmptm.objectives.contrastive import Contrastive
from mmptm.objectives.itm import ImageTextMatching
from mmptm.recipe import load_run_config
from mmptm.train.trainer import pretrain


def test_recall_at_k_hand_worked():
    # image 0: true text ranks 1st; image 1: 3rd (texts 0 and 2 score higher); image 2: 2nd.
    sim = torch.tensor([[0.9, 0.1, 0.2], [0.8, 0.3, 0.5], [0.1, 0.7, 0.6]])
    r = recall_at_k(sim, ks=(1, 2, 3))
    assert r["i2t_R@1"] == pytest.approx(1 / 3)
    assert r["i2t_R@2"] == pytest.approx(2 / 3)
    assert r["i2t_R@3"] == pytest.approx(1.0)
    # text 0 (column 0): image 0 is best -> rank 1; text 1: image 2 (0.7) beats 0.3 -> rank 2;
    # text 2: image 2 is 0.6 but image 1 has 0.5, image 0 0.2 -> rank 1
    assert r["t2i_R@1"] == pytest.approx(2 / 3)
    assert r["t2i_R@2"] == pytest.approx(1.0)
    # median ranks (1 = first): images 1, 3, 2 -> 2; texts 1, 2, 1 -> 1
    assert r["i2t_MdR"] == 2.0 and r["t2i_MdR"] == 1.0


def test_recall_needs_a_square_matrix():
    with pytest.raises(ValueError, match="square"):
        recall_at_k(torch.zeros(2, 3))


# dot product / ITM scoring every pair / ITC first stage over regions + ITM re-ranking
@pytest.mark.parametrize(
    ("recipe", "rerank_k", "itm_all"),
    [("clip_tiny", 0, False), ("vilt_tiny", 0, False), ("albef_tiny", 3, False),
     ("albef_tiny", 0, True)],
)  # fmt: skip
def test_retrieval_on_a_trained_checkpoint(recipe, rerank_k, itm_all, tiny_world, tmp_path):
    cfg = load_run_config(
        recipe,
        [*tiny_overrides(tiny_world, tmp_path, recipe), "train.max_steps=2"],
    )
    pretrain(cfg)
    r = evaluate_retrieval(
        str(tmp_path), split="val", max_items=12, batch_size=5, rerank_k=rerank_k,
        itm_all=itm_all,
    )  # fmt: skip
    assert r["n"] == 12 and r["chance_R@1"] == pytest.approx(1 / 12)
    # what ranking cost: every pair (ITM alone), 2 x 12 x k re-scored, none for a dual encoder
    want = {"vilt_tiny": 144, "albef_tiny": 144 if itm_all else 2 * 12 * 3}.get(recipe, 0)
    assert r["fused_pairs"] == want and r["seconds"] >= 0
    for d in ("i2t", "t2i"):
        assert 0 <= r[f"{d}_R@1"] <= r[f"{d}_R@5"] <= r[f"{d}_R@10"] <= 1


class _FirstStage(Contrastive):
    """Embeddings whose dot products rank every true pair second (a known bad first stage)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.cfg = Contrastive.Config(modalities=["image", "text"])

    def scale(self):
        return torch.tensor(3.0)

    def embed(self, out, modality):
        idx = out.pooled["idx"]
        n = 6
        if modality == "image":
            return torch.nn.functional.one_hot(idx, n).float()
        # text j looks most like image j+1, then like image j
        return (
            2.0 * torch.nn.functional.one_hot((idx + 1) % n, n).float()
            + torch.nn.functional.one_hot(idx, n).float()
        )


class _Oracle(ImageTextMatching):
    """ITM that knows the truth: high score iff the pair's indices agree."""

    def __init__(self):
        torch.nn.Module.__init__(self)

    def score(self, out):
        return (out.pooled["img"] == out.pooled["txt"]).float() * 10.0


class _Undecided(ImageTextMatching):
    """ITM that scores every pair alike."""

    def __init__(self):
        torch.nn.Module.__init__(self)

    def score(self, out):
        return torch.zeros(len(out.pooled["img"]))


class _Stub(torch.nn.Module):
    def __init__(self, itm=None):
        super().__init__()
        self.objectives = torch.nn.ModuleDict({"c": _FirstStage(), "i": itm or _Oracle()})

    def fuse(self, batch):
        from mmptm.fusion.base import FusionOutput

        pooled, hidden = {}, {}
        if "pixels" in batch:
            pooled["img"] = pooled["idx"] = batch["pixels"][:, 0, 0, 0].long()
            hidden["image"] = batch["pixels"]
        if "input_ids" in batch:
            pooled["txt"] = pooled["idx"] = batch["input_ids"][:, 0]
            hidden["text"] = batch["input_ids"]
        return FusionOutput(hidden, {}, pooled)


def _six_pairs() -> tuple[dict, Sides]:
    """Six image-text pairs whose image i and text i both carry the index i."""
    n = 6
    data = {
        "__key__": [str(i) for i in range(n)],
        "pixels": torch.arange(n).float().view(n, 1, 1, 1).expand(n, 3, 2, 2).clone(),
        "input_ids": torch.arange(n).view(n, 1),
    }
    return data, Sides(("pixels",), ("input_ids",), "image", "text")


def test_itm_reranking_of_a_first_stage():
    data, sides = _six_pairs()
    first_i2t, first_t2i = similarity(_Stub(), data, sides, torch.device("cpu"), batch_size=4)
    plain = recall_at_k(first_i2t, sim_t2i_IT=first_t2i)
    assert plain["i2t_R@1"] == 0.0 and plain["t2i_R@1"] == 0.0  # true pairs rank 2nd
    assert plain["i2t_R@5"] == 1.0
    i2t, t2i = similarity(_Stub(), data, sides, torch.device("cpu"), batch_size=4, rerank_k=2)
    reranked = recall_at_k(i2t, sim_t2i_IT=t2i)
    assert reranked["i2t_R@1"] == 1.0 and reranked["t2i_R@1"] == 1.0
    i2t, t2i = similarity(_Stub(), data, sides, torch.device("cpu"), batch_size=4, rerank_k=1)
    assert recall_at_k(i2t, sim_t2i_IT=t2i)["i2t_R@1"] == 0.0  # the truth was not in the top 1
    # ALBEF's rule: ITM + the contrastive logit (scale 3 x the dot product), so an ITM that
    # cannot tell the top k apart leaves the first stage's order (ITM alone left ties)
    i2t, _ = similarity(_Stub(_Undecided()), data, sides, torch.device("cpu"), batch_size=4,
                        rerank_k=3)  # fmt: skip
    top3 = first_i2t.topk(3, dim=1).indices
    assert torch.equal(i2t.topk(3, dim=1).indices, top3)
    picked = i2t.gather(1, top3)
    torch.testing.assert_close(
        picked - picked[:, :1], 3.0 * (first_i2t.gather(1, top3) - first_i2t.gather(1, top3[:, :1]))
    )


def test_itm_all_scores_every_pair_with_itm_alone():
    data, sides = _six_pairs()
    i2t, t2i = similarity(_Stub(), data, sides, torch.device("cpu"), batch_size=4, itm_all=True)
    # the oracle's scores, every pair: 10 on the diagonal, 0 elsewhere (no first stage)
    assert torch.equal(i2t, 10.0 * torch.eye(6)) and torch.equal(t2i, i2t)
    stub = _Stub()
    del stub.objectives["i"]
    stub.cfg = SimpleNamespace(objectives={"c": SimpleNamespace(type="contrastive")})
    with pytest.raises(ValueError, match=r"ITM head; this model's objectives are c \(contrastive"):
        similarity(stub, data, sides, torch.device("cpu"), itm_all=True)


def _with_reversed(src, dst, partner) -> None:
    """Copy image-text shards, giving sample i ``reversed_captions`` = sample partner(i)'s."""
    import json

    from mmptm.data.shards import ShardWriter, SkipCounter, tar_samples

    urls = [str(u) for u in sorted(src.glob("val-*.tar"))]
    samples = list(tar_samples(urls, SkipCounter()))
    metas = [json.loads(s["json"]) for s in samples]
    with ShardWriter(dst / "val-%06d.tar", 100) as w:
        for i, (s, meta) in enumerate(zip(samples, metas)):
            meta["reversed_captions"] = metas[partner(i, len(samples))]["captions"]
            w.write({"__key__": s["__key__"], "jpg": s["jpg"], "json": json.dumps(meta)})


def test_reversal_test_scores_own_caption_against_the_reversed_one(tiny_world, tmp_path):
    cfg = load_run_config(
        "clip_tiny",
        [*tiny_overrides(tiny_world, tmp_path / "run", "clip_tiny"), "train.max_steps=4"],
    )
    pretrain(cfg)
    run = str(tmp_path / "run")
    # The same caption on both sides: every pair ties, which counts one half.
    same = tmp_path / "same"
    same.mkdir()
    _with_reversed(tiny_world / "image_text", same, lambda i, n: i)
    r = evaluate_reversal(run, shards=str(same / "*.tar"), max_items=16, batch_size=5)
    assert r == {"n": 16.0, "reversal_acc": 0.5, "chance": 0.5}
    # The next sample's caption as the "reversed" one: the wins are read off the full
    # similarity matrix that retrieval computes (another code path).
    nxt = tmp_path / "next"
    nxt.mkdir()
    _with_reversed(tiny_world / "image_text", nxt, lambda i, n: (i + 1) % n)
    r = evaluate_reversal(run, shards=str(nxt / "*.tar"), max_items=16, batch_size=5)
    model, tokenizer, saved = load_pretrained(run)
    stream = stream_config(saved.data, tokenizer, split="val", needs=model.data_needs(),
                           shards=str(nxt / "*.tar"))  # fmt: skip
    stream.batch_size = 16
    data = next(iter(single_pass(stream)))
    sim, _ = similarity(model, data, retrieval_sides(model, stream), torch.device("cpu"), 5)
    wins = [float(sim[i, i] > sim[i, (i + 1) % 16]) for i in range(16)]
    assert r["reversal_acc"] == pytest.approx(sum(wins) / 16, abs=1e-6)


def test_recall_multi_hand_worked():
    # 2 items, 4 captions: captions 0, 1 describe item 0; captions 2, 3 item 1
    sim = torch.tensor([[0.9, 0.1, 0.5, 0.2], [0.3, 0.8, 0.7, 0.6]])
    r = recall_multi(sim, torch.tensor([0, 0, 1, 1]), ks=(1, 2))
    # text→item: caption ranks 1, 2, 1, 1 → R@1 3/4, AP@10 = (1 + 1/2 + 1 + 1) / 4
    assert r["t2i_R@1"] == pytest.approx(0.75) and r["t2i_R@2"] == 1.0
    assert r["t2i_mAP@10"] == pytest.approx(3.5 / 4)
    # item→text: item 0's captions at ranks 1 and 4 → AP (1/1 + 2/4) / 2; item 1's at 2, 3
    # (caption 1 of item 0 scores 0.8 above them) → AP (1/2 + 2/3) / 2
    assert r["i2t_R@1"] == pytest.approx(0.5) and r["i2t_R@2"] == 1.0
    assert r["i2t_mAP@10"] == pytest.approx(((1 + 2 / 4) / 2 + (1 / 2 + 2 / 3) / 2) / 2)
    with pytest.raises(ValueError, match="item_of_Q"):
        recall_multi(sim, torch.tensor([0, 0, 2, 1]))


def test_several_captions_protocol_matches_single_caption_ranks(tiny_world, tmp_path):
    """Each caption listed three times: every copy ranks the items as the single caption does,
    so text→item recall equals the one-caption evaluation's; a sample without a third caption
    is left out of that round only."""
    import json

    from mmptm.data.shards import ShardWriter, SkipCounter, expand_shards, tar_samples

    cfg = load_run_config(
        "clip_tiny",
        [*tiny_overrides(tiny_world, tmp_path / "run", "clip_tiny"), "train.max_steps=2"],
    )
    pretrain(cfg)
    out = tmp_path / "multi"
    out.mkdir()
    with ShardWriter(out / "val-%03d.tar", 100) as w:
        for i, s in enumerate(tar_samples(expand_shards(cfg.data.val), SkipCounter())):
            meta = json.loads(s["json"])
            en = meta["captions"]["en"]
            meta["captions"] = {"en": [en, en] if i == 0 else [en, en, en]}
            w.write({"__key__": s["__key__"], "jpg": s["jpg"], "json": json.dumps(meta)})
    shards = str(out / "val-000.tar")
    one = evaluate_retrieval(str(tmp_path / "run"), shards=shards, max_items=20)
    three = evaluate_retrieval(str(tmp_path / "run"), shards=shards, max_items=20, captions=3)
    assert three["n"] == 20 and three["captions"] == 3 * 20 - 1
    for k in (1, 5, 10):
        assert three[f"t2i_R@{k}"] == pytest.approx(one[f"t2i_R@{k}"], abs=0.02)
    assert 0 < three["t2i_mAP@10"] <= 1 and 0 < three["i2t_mAP@10"] <= 1


def test_rerank_without_an_itm_head_is_an_error(tiny_world, tmp_path):
    cfg = load_run_config(
        "clip_tiny",
        [*tiny_overrides(tiny_world, tmp_path, "clip_tiny"), "train.max_steps=1"],
    )
    pretrain(cfg)
    with pytest.raises(ValueError, match=r"ITM head.*contrastive \(contrastive\)"):
        evaluate_retrieval(str(tmp_path), split="val", max_items=8, rerank_k=4)


def _regions_of(src, dst, partner) -> int:
    """Copy regions shards, giving sample i the ``regions.npz`` (features, boxes, detector
    labels: its object tags) of sample partner(i); returns the number of samples."""
    from mmptm.data.shards import ShardWriter, SkipCounter, tar_samples
    from mmptm.modalities.regions import MEMBER

    urls = [str(u) for u in sorted(src.glob("val-*.tar"))]
    samples = list(tar_samples(urls, SkipCounter()))
    with ShardWriter(dst / "val-%06d.tar", 100) as w:
        for i, s in enumerate(samples):
            w.write({**s, MEMBER: samples[partner(i, len(samples))][MEMBER]})
    return len(samples)


def test_oscar_scores_an_image_with_its_tags_against_a_caption(tiny_world, tmp_path):
    """Oscar's matching head judges tags against caption and regions; an image is its
    regions with their tags, so a pair (image i, caption j) must carry image i's tags,
    packed after caption j as in training. Oracle: a shard whose sample j holds caption j
    with sample i's regions, read by the ordinary pipeline (the plug-in names the tags)."""
    from mmptm.eval.retrieval import _batch_and_sides, retrieval_heads

    run = tmp_path / "run"
    cfg = load_run_config(
        "oscar_tiny",
        [*tiny_overrides(tiny_world, run, "oscar_tiny"), "train.max_steps=4"],
    )
    pretrain(cfg)
    model, tokenizer, saved = load_pretrained(str(run))
    n = 10
    shards = str(tiny_world / "regions" / "val-*.tar")
    r = evaluate_retrieval(str(run), shards=shards, max_items=n, itm_all=True)
    assert r["n"] == n and r["fused_pairs"] == n * n
    # the sides: the tags (second text segment) travel with the regions
    stream = stream_config(saved.data, tokenizer, split="val", needs=model.data_needs())
    keys = ["input_ids", "text2_input_ids", "region_feats"]
    sides = retrieval_sides(model, stream, keys, stream.transforms)
    assert "text2_input_ids" in sides.item_keys and "region_feats" in sides.item_keys
    assert "input_ids" in sides.query_keys and "text2_input_ids" not in sides.query_keys
    assert sides.pair_stages

    swapped = tmp_path / "swapped"
    swapped.mkdir()
    total = _regions_of(tiny_world / "regions", swapped, lambda j, m: (j + 3) % m)
    assert total >= n + 3
    stream = stream_config(saved.data, tokenizer, split="val", needs=model.data_needs(),
                           shards=str(swapped / "*.tar"))  # fmt: skip
    stream.batch_size = n
    batch = next(iter(single_pass(stream)))
    itm = retrieval_heads(model)[1]
    torch.manual_seed(0)
    with torch.no_grad():  # a head whose scores vary with the pair (4 steps leave it flat)
        for p in itm.parameters():
            p.normal_(std=1.0)
        want_J = itm.score(model.fuse(batch))  # caption j with the image (and tags) of j+3
    # the same pairs from the retrieval matrix: item j+3, text j (the first n items only)
    data, sides = _batch_and_sides(model, tokenizer, saved, "val", shards, n + 3)
    sim, _ = similarity(model, data, sides, torch.device("cpu"), 7, itm_all=True)
    got_J = torch.stack([sim[j + 3, j] for j in range(n)])
    torch.testing.assert_close(got_J, want_J, atol=1e-4, rtol=1e-4)
    # and they differ from pairing caption j with its own tags (what packing first would do)
    own_J = torch.stack([sim[j, j] for j in range(n)])
    assert not torch.allclose(got_J, own_J, atol=1e-3)
