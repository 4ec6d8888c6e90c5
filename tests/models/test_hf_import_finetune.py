"""An imported XLM-R fine-tunes with a task recipe (XNLI) in XLM-R's own pair layout, and the
importers leave task heads behind by themselves."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from conftest import read_shard_samples

from mmptm.config import load_config
from mmptm.data.pipeline import Loader
from mmptm.eval.classification import evaluate_classification
from mmptm.models.hf_import import import_xlmr, xlmr_state_dict_to_mmptm
from mmptm.recipe import RunConfig, load_run_config
from mmptm.train.trainer import Trainer

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

XNLI = "xnli"
LANGS = ("en", "de", "fr", "ru", "es")
#: per-sentence tokens in xnli.yaml; a joined pair takes up to twice that, + XLM-R's offset 2
MAX_LEN = 48
TOL = 1e-5


def _nli(world: Path) -> dict[str, dict]:
    """Sample key → json member of the English NLI training shards."""
    shards = sorted(map(str, (world / "nli").glob("train-en-*.tar")))
    return {key: json.loads(m["json"]) for key, m in read_shard_samples(shards)}


def hf_tokenizer(spm_path: Path):
    """HF's XLMRobertaTokenizer over the pieces of ``spm_path`` (fairseq ids)."""
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(sp.id_to_piece(i), sp.get_score(i)) for i in range(3, sp.get_piece_size())]
    vocab.append(("<mask>", 0.0))
    return transformers.XLMRobertaTokenizer(vocab=vocab)


def hf_pairs(tok, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """What XLM-R's own tokenizer makes of the pairs (its pair template: ``<s> a </s></s> b
    </s>``), each sentence cut to the recipe's max_len as mmptm cuts it, right-padded."""
    backend, rows = tok.backend_tokenizer, []
    for a, b in pairs:
        parts = [backend.encode(t, add_special_tokens=False) for t in (a, b)]
        for part in parts:
            part.truncate(MAX_LEN - 2)
        rows.append(backend.post_process(*parts, add_special_tokens=True).ids)
    L = max(map(len, rows))
    ids = torch.full((len(rows), L), tok.pad_token_id)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def spm_path(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentencepiece model trained on a few lines of the NLI pairs, as XLM-R ships one."""
    lines = [
        t for m in list(_nli(tiny_world).values())[:40] for t in (m["premise"], m["hypothesis"])
    ]
    out = tmp_path_factory.mktemp("spm") / "sentencepiece.bpe"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(out),
        vocab_size=120,
        hard_vocab_limit=False,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    return Path(f"{out}.model")


def _randomise(model: torch.nn.Module) -> torch.nn.Module:
    # perturb LayerNorms and biases too, so that nothing matches by its initial value
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.1 * torch.randn(p.shape, generator=g)
            is_norm = "LayerNorm" in name or "layer_norm" in name
            p.copy_(noise + (1.0 if is_norm and name.endswith("weight") else 0.0))
    return model.eval()


def make_hf_dir(root: Path, spm_path: Path, kind: str) -> tuple[Path, torch.nn.Module]:
    """An HF directory (save_pretrained + sentencepiece.bpe.model) of a random tiny XLM-R:
    ``kind`` mlm (XLMRobertaForMaskedLM) | seqcls (...ForSequenceClassification, 3 labels)."""
    torch.manual_seed(0)
    n = spm.SentencePieceProcessor(model_file=str(spm_path)).get_piece_size()
    cfg = transformers.XLMRobertaConfig(
        vocab_size=n + 2,  # fairseq: + <pad> ... + <mask>
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=2 * MAX_LEN + 2,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        num_labels=3,
    )
    cls = {
        "mlm": transformers.XLMRobertaForMaskedLM,
        "seqcls": transformers.XLMRobertaForSequenceClassification,
    }[kind]
    model = _randomise(cls(cfg))
    hf_dir = root / f"hf_{kind}"
    model.save_pretrained(hf_dir)
    shutil.copy(spm_path, hf_dir / "sentencepiece.bpe.model")
    return hf_dir, model


def _xnli(world: Path, out: Path, init: Path) -> RunConfig:
    return load_run_config(
        XNLI,
        [
            f"init={init}",
            f"output_dir={out}",
            f"data.train={world}/nli/train-en-*.tar",
            *[f"data.eval.{lang}={world}/nli/test-{lang}-*.tar" for lang in LANGS],
            "data.batch_size=8",
            "data.num_workers=0",
            "train.max_steps=3",
            "train.progress=false",
        ],
    )


@pytest.mark.parametrize("kind", ["mlm", "seqcls"])
def test_imported_xlmr_fine_tunes_on_xnli_in_its_own_pair_layout(
    tiny_world: Path, spm_path: Path, tmp_path: Path, kind: str, caplog
):
    hf_dir, hf_model = make_hf_dir(tmp_path, spm_path, kind)
    with caplog.at_level(logging.INFO, logger="mmptm.models.hf_import"):
        import_xlmr(hf_dir, tmp_path / "xlmr")  # no drop_prefixes: heads are left by themselves
    if kind == "seqcls":
        assert "leaving behind 4 head tensors" in caplog.text
        assert "classifier.out_proj.weight" in caplog.text

    cfg = _xnli(tiny_world, tmp_path / "ft", tmp_path / "xlmr")
    trainer = Trainer(cfg)
    text = cfg.data.modalities["text"]
    assert (text.segments, text.separators, text.restart_positions) == (1, 2, False)
    assert text.max_len == MAX_LEN  # the recipe's own

    batch = next(iter(Loader(trainer.stream, 0)))
    meta = _nli(tiny_world)
    pairs = [(meta[k]["premise"], meta[k]["hypothesis"]) for k in batch["__key__"]]
    enc = hf_pairs(hf_tokenizer(spm_path), pairs)
    assert torch.equal(batch["input_ids"], enc["input_ids"])
    real = batch["attention_mask"]
    assert torch.equal(real.long(), enc["attention_mask"])
    assert batch["segment_ids"].eq(0).all()
    assert torch.equal(
        batch["position_ids"][real], torch.arange(real.shape[1]).expand_as(real)[real]
    )
    assert len({int(n) for n in real.sum(1)}) > 1  # real padding in the batch

    model = trainer.model.eval()
    with torch.no_grad():
        ours = model.fuse(batch).hidden["text"][real]
        hf = hf_model.roberta(**enc).last_hidden_state[real]
    assert (ours - hf).abs().max().item() < TOL

    model.train()
    trainer.fit()
    assert trainer.step == 3
    saved = load_config(str(tmp_path / "ft" / "config.yaml"), schema=RunConfig)
    assert saved.data.modalities["text"].separators == 2  # so its evaluation joins alike
    if kind == "mlm":
        result = evaluate_classification(str(tmp_path / "ft"))
        assert all(0.0 <= v <= 1.0 for v in result.values())


def test_task_heads_are_left_behind_and_unknown_tensors_still_named(spm_path: Path, tmp_path):
    _, hf_model = make_hf_dir(tmp_path, spm_path, "seqcls")
    state, hf_cfg = hf_model.state_dict(), hf_model.config.to_dict()
    cfg, mapped = xlmr_state_dict_to_mmptm(state, hf_cfg)
    assert not any(k.startswith("objectives.") for k in mapped) and not cfg.objectives
    token = {**state, "qa_outputs.weight": torch.zeros(2, 32), "qa_outputs.bias": torch.zeros(2)}
    assert xlmr_state_dict_to_mmptm(token, hf_cfg)[1].keys() == mapped.keys()
    odd = {**state, "adapter_head.weight": torch.zeros(2, 32)}
    with pytest.raises(ValueError, match=r"adapter_head\.weight.*drop_prefixes"):
        xlmr_state_dict_to_mmptm(odd, hf_cfg)
    xlmr_state_dict_to_mmptm(odd, hf_cfg, drop_prefixes=["adapter_head."])
