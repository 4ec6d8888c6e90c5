"""Packed rows (``data.sources.<name>.pack``): several samples per row, each seeing only itself."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_overrides

from mmptm.config import from_dict
from mmptm.encoders.base import VocabInfo
from mmptm.modalities import DataContext
from mmptm.modalities.text import PackPairs, PackRows, TextData
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.mlm import IGNORE, MaskedLM
from mmptm.recipe import DataConfig, ModelConfig, SourceConfig, check_packing, packed_sources


class _Tok:
    pad_id = 0
    languages = ("en", "de", "fr")


def _stages(pack: dict[str, int], **cfg) -> list:
    context = DataContext(tokenizer=_Tok(), pack=pack)
    return TextData(TextData.Config(**cfg), views=["text"], context=context).transforms()


def _mono(rows: list[list[int]], langs: list[str], source: str = "mono/en") -> dict:
    text = TextData(TextData.Config(), views=["text"], context=DataContext(tokenizer=_Tok()))
    samples = [{"input_ids": r, "lang": la} for r, la in zip(rows, langs)]
    return {"__key__": [str(i) for i in range(len(rows))], "__source__": source,
            **text.collate(samples)}  # fmt: skip


# [CLS]=2 [SEP]=3, words >= 10; lengths 4, 3, 6, 2
ROWS = [[2, 10, 11, 3], [2, 12, 3], [2, 13, 14, 15, 16, 3], [2, 3]]
LANGS = ["en", "de", "fr", "en"]


def test_rows_pack_first_fit_keep_their_positions_and_see_only_themselves():
    (pairs, pack) = _stages({"mono": 8})
    assert isinstance(pairs, PackPairs) and isinstance(pack, PackRows)
    out = pack(_mono(ROWS, LANGS), torch.Generator())
    # first fit into rows of 8: [s0 s1] (4 + 3), s2 (6) does not fit there, s3 (2) joins s2
    assert out["input_ids"].tolist() == [
        [2, 10, 11, 3, 2, 12, 3, 0],
        [2, 13, 14, 15, 16, 3, 2, 3],
    ]
    assert out["attention_mask"].tolist() == [[True] * 7 + [False], [True] * 8]
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5, 0, 1]]
    assert out["lang_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 0], [2, 2, 2, 2, 2, 2, 0, 0]]
    assert out["__key__"] == ["0", "1", "2", "3"]  # still one key per sample
    vis = out["visible_mask"]
    owner = [[0, 0, 0, 0, 1, 1, 1, -1], [2, 2, 2, 2, 2, 2, 3, 3]]
    for r in range(2):
        for i in range(8):
            for j in range(8):
                want = owner[r][i] == owner[r][j] and owner[r][j] >= 0
                assert bool(vis[r, i, j]) == want, (r, i, j)


def test_other_sources_and_joined_pairs():
    (_, pack) = _stages({"tlm": 12})
    batch = _mono(ROWS, LANGS)  # a mono batch: not packed
    assert pack(dict(batch), torch.Generator())["input_ids"].shape == (4, 6)
    # a TLM batch is joined first (15), then packed (18): the pair is one sample
    pairs = [([2, 10, 11, 3], "en", [2, 20, 21, 3], "de"), ([2, 12, 3], "fr", [2, 22, 3], "en")]
    text = TextData(TextData.Config(), views=["text"], context=DataContext(tokenizer=_Tok()))
    samples = [{"input_ids": a, "lang": la, "text2_input_ids": b, "text2_lang": lb}
               for a, la, b, lb in pairs]  # fmt: skip
    batch = {"__key__": ["a", "b"], "__source__": "tlm", **text.collate(samples)}
    for stage in _stages({"tlm": 12}):
        batch = stage(batch, torch.Generator())
    assert batch["input_ids"].tolist() == [[2, 10, 11, 3, 20, 21, 3, 2, 12, 3, 22, 3]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 1, 2, 3, 0, 1, 2, 1, 2]]
    assert batch["segment_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1]]
    vis = batch["visible_mask"][0]
    assert vis[:7, :7].all() and vis[7:, 7:].all() and not vis[:7, 7:].any()


def test_a_packed_batch_gives_every_token_its_unpacked_output():
    """The independent check: the model run on the samples one by one (no packing, no
    padding) against the same samples packed."""
    cfg = from_dict(ModelConfig, {
        "width": 16,
        "encoders": {"text": {"type": "text", "max_positions": 32}},
        "fusion": {"type": "single_stream", "transformer": {"layers": 2, "heads": 2}},
        "objectives": {"mlm": {"type": "mlm"}},
    })  # fmt: skip
    vocab = VocabInfo(vocab_size=30, special_ids=frozenset({0, 1, 2, 3, 4}))
    model = PretrainModel(cfg, vocab).eval()
    (_, pack) = _stages({"mono": 8})
    packed = pack(_mono(ROWS, LANGS), torch.Generator())
    with torch.no_grad():
        out = model.fuse(packed).hidden["text"]
        owner = [(0, 0), (0, 4), (1, 0), (1, 6)]  # (packed row, start) of each sample
        for s, (row, start) in enumerate(owner):
            alone = _mono([ROWS[s]], [LANGS[s]])
            want = model.fuse(alone).hidden["text"][0]
            got = out[row, start : start + len(ROWS[s])]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # MLM after packing: labels only at real tokens, the loss is finite
    mask = MaskedLM.data_transform(MaskedLM.Config(mask_prob=0.5), vocab)
    masked = mask(packed, torch.Generator().manual_seed(0))
    assert (masked["mlm_labels"][~masked["attention_mask"]] == IGNORE).all()
    assert torch.isfinite(model(masked).loss)


def test_pack_errors_name_the_setting():
    (_, pack) = _stages({"mono": 5})
    with pytest.raises(ValueError, match=r"data.sources.mono.pack=5 is shorter than a row of 6"):
        pack(_mono(ROWS, LANGS), torch.Generator())
    (_, pack) = _stages({"": 8})
    batch = {**_mono(ROWS, LANGS), "pixels": torch.zeros(4, 3, 2, 2)}
    del batch["__source__"]
    with pytest.raises(ValueError, match=r"per-row \['pixels'\]"):
        pack(batch, torch.Generator())
    two = DataContext(tokenizer=_Tok(), pack={"mono": 8})
    with pytest.raises(ValueError, match="reads two text views"):
        TextData(TextData.Config(), views=["text", "text2"], context=two).transforms()
    with pytest.raises(ValueError, match="data.pack packs the batches of data.train"):
        packed_sources(DataConfig(pack=8, sources={"mono": SourceConfig(shards="x")}))
    assert packed_sources(DataConfig(pack=8)) == {"": 8}
    assert packed_sources(DataConfig(sources={"a": SourceConfig("x", pack=9),
                                              "b": SourceConfig("y")})) == {"a": 9}  # fmt: skip


def test_packing_refuses_row_objectives_and_fusions_without_visible_masks():
    tree = {
        "width": 16,
        "encoders": {"text": {"type": "text"}},
        "objectives": {"mlm": {"type": "mlm"}, "xlco": {"type": "contrastive",
                                                        "modalities": ["text", "text"]}},
        "routes": {"mono": ["mlm"], "xlco": ["xlco"]},
    }  # fmt: skip
    cfg = from_dict(ModelConfig, tree)
    check_packing(cfg, ["mono"])  # MLM alone: fine
    with pytest.raises(ValueError, match=r"data.sources.xlco.pack: objectives \['xlco'\]"):
        check_packing(cfg, ["xlco"])
    with pytest.raises(ValueError, match=r"data.pack: objectives \['xlco'\]"):
        check_packing(cfg, [""])
    cfg = from_dict(ModelConfig, {**tree, "fusion": {"type": "two_stream"}})
    with pytest.raises(ValueError, match="fusion 'two_stream' cannot keep packed samples apart"):
        check_packing(cfg, ["mono"])


@pytest.mark.slow
def test_pretrain_with_packed_mono_and_tlm_batches(tiny_world, tmp_path):
    from mmptm.data.pipeline import ShardStream
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import Trainer, pretrain

    recipe = "xlm_tlm_tiny"
    over = tiny_overrides(tiny_world, tmp_path / "run", recipe)
    over += ["data.sources.mono.pack=128", "data.sources.tlm.pack=192", "train.log_every=1"]
    cfg = load_run_config(recipe, over)
    trainer = Trainer(cfg)
    batches = [b for _, b in zip(range(6), ShardStream(trainer.stream, epoch=0))]
    assert {b["__source__"].split("/")[0] for b in batches} == {"mono", "tlm"}
    for b in batches:  # 8 samples per batch, in fewer rows, MLM labels on real tokens only
        rows, width = b["input_ids"].shape
        assert rows < 8 and b["visible_mask"].shape == (rows, width, width)
        assert len(b["__key__"]) == 8
        assert (b["mlm_labels"][~b["attention_mask"]] == IGNORE).all()
    del trainer
    last = pretrain(cfg)
    assert last["step"] == 6 and torch.isfinite(torch.tensor(last["loss"]))
    # the recipe's cross-section checks run when it is loaded, before any trainer exists
    bad = [*tiny_overrides(tiny_world, tmp_path / "xlco", "xlm_xlco_tiny"),
           "data.sources.xlco.pack=96"]  # fmt: skip
    with pytest.raises(ValueError, match=r"data.sources.xlco.pack: objectives \['xlco'\]"):
        load_run_config("xlm_xlco_tiny", bad)
