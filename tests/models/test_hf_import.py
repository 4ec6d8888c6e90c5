"""Importing a local HF XLM-R checkpoint: exact parity with transformers, and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from mmptm.config import load_config
from mmptm.models import checkpoint
from mmptm.models.hf_import import import_xlmr, xlmr_state_dict_to_mmptm
from mmptm.models.load import load_pretrained
from mmptm.recipe import RunConfig

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

SENTENCES = [
    "the quick brown fox jumps over",
    "лиса прыгает через собаку",
    "der Hund schläft",
    "le renard brun saute",
    "η αλεπού",
    "лиса and the dog 漢字",
]
CORPUS = [
    "the quick brown fox jumps over the lazy dog while birds sing in spring",
    "быстрая коричневая лиса прыгает через ленивую собаку пока птицы поют весной",
    "der schnelle braune Fuchs springt über den faulen Hund und Vögel singen",
    "le renard brun rapide saute par-dessus le chien paresseux",
    "η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο",
]
TOL = 1e-5


def hf_tokenizer(spm_path: Path):
    """HF's XLMRobertaTokenizer over the pieces of ``spm_path`` (see test_tokenizer.py)."""
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(sp.id_to_piece(i), sp.get_score(i)) for i in range(3, sp.get_piece_size())]
    vocab.append(("<mask>", 0.0))
    return transformers.XLMRobertaTokenizer(vocab=vocab)


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("spm") / "sentencepiece.bpe"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 10),
        model_prefix=str(out),
        vocab_size=150,
        hard_vocab_limit=False,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    return Path(f"{out}.model")


def tiny_config(spm_path: Path, eps: float = 1e-5):
    n = spm.SentencePieceProcessor(model_file=str(spm_path)).get_piece_size()
    return transformers.XLMRobertaConfig(
        vocab_size=n + 2,  # fairseq: + <pad> ... + <mask>
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        type_vocab_size=1,
        layer_norm_eps=eps,  # XLM-R's is 1e-5; BERT-style configs use 1e-12
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )


def randomise(model: torch.nn.Module) -> torch.nn.Module:
    # HF initialises LayerNorms to 1/0 and biases to 0: perturb everything so that a
    # swapped weight/bias or a wrong eps cannot hide.
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "LayerNorm" in name or "layer_norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
    return model.eval()


def make_hf_dir(
    root: Path, spm_path: Path, kind: str, fmt: str, eps: float = 1e-5
) -> tuple[Path, torch.nn.Module]:
    """An HF-format directory with a random tiny model: ``kind`` mlm | bare, ``fmt`` st | bin."""
    torch.manual_seed(0)
    cfg = tiny_config(spm_path, eps)
    cls = transformers.XLMRobertaForMaskedLM if kind == "mlm" else transformers.XLMRobertaModel
    model = randomise(cls(cfg))
    hf_dir = root / f"hf_{kind}_{fmt}"
    if fmt == "st":
        model.save_pretrained(hf_dir)
        assert (hf_dir / "model.safetensors").is_file()
    else:
        # transformers 5 writes safetensors even with safe_serialization=False, so write the
        # legacy pickle by hand: the full state dict, tied decoder weights and buffers included.
        cfg.save_pretrained(hf_dir)
        state = dict(model.state_dict())
        state[
            "embeddings.position_ids" if kind == "bare" else "roberta.embeddings.position_ids"
        ] = torch.arange(cfg.max_position_embeddings)[None]
        torch.save(state, hf_dir / "pytorch_model.bin")
    shutil.copy(spm_path, hf_dir / "sentencepiece.bpe.model")
    return hf_dir, model


def batch_of(tok, texts: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded mmptm inputs (what the data pipeline builds)."""
    rows = [tok.build_inputs(tok.encode(t), max_len=38)[0] for t in texts]
    L = max(map(len, rows))
    ids = torch.full((len(rows), L), tok.pad_id)
    mask = torch.zeros(len(rows), L, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize(
    ("kind", "fmt", "eps"),
    [("mlm", "st", 1e-5), ("mlm", "bin", 1e-5), ("bare", "bin", 1e-5), ("mlm", "st", 1e-12)],
)
@torch.no_grad()
def test_import_matches_transformers(
    spm_path: Path, tmp_path: Path, kind: str, fmt: str, eps: float
):
    hf_dir, hf_model = make_hf_dir(tmp_path, spm_path, kind, fmt, eps)
    import_xlmr(hf_dir, tmp_path / "run")
    model, tok, _ = load_pretrained(str(tmp_path / "run"))
    assert not model.training

    batch = batch_of(tok, SENTENCES)
    enc = hf_tokenizer(spm_path)(SENTENCES, padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"], enc["input_ids"])
    assert torch.equal(batch["attention_mask"].long(), enc["attention_mask"])
    assert (batch["input_ids"] == tok.unk_id).any()  # 漢字 is outside the alphabet
    assert len({int(n) for n in batch["attention_mask"].sum(1)}) > 2  # real padding

    hf_out = hf_model(**enc, output_hidden_states=True)
    out = model.fuse(batch)
    real = batch["attention_mask"]
    h_hf, h_ours = hf_out.hidden_states[-1][real], out.hidden["text"][real]
    assert (h_hf - h_ours).abs().max().item() < TOL
    # The embedding output too: a mismatch there would be an encoder problem, not fusion.
    emb = model.encoders["text"](batch).tokens[real]
    assert (hf_out.hidden_states[0][real] - emb).abs().max().item() < TOL
    if kind == "mlm":
        assert list(model.objectives) == ["mlm"]
        assert model.fusion.pooler is None  # XLMRobertaForMaskedLM has no pooler
        logits = model.objectives["mlm"].logits(h_ours)
        assert (hf_out.logits[real] - logits).abs().max().item() < TOL
    else:
        assert not model.objectives
        pooled = hf_out.pooler_output - out.pooled["joint"]
        assert pooled.abs().max().item() < TOL


def test_checkpoint_round_trip(spm_path: Path, tmp_path: Path):
    hf_dir, hf_model = make_hf_dir(tmp_path, spm_path, "mlm", "st")
    out = tmp_path / "run"
    path = import_xlmr(hf_dir, out)
    assert path == out / "checkpoints" / "step_00000000.pt"
    ck = checkpoint.read(path)
    assert ck.step == 0 and ck.world_size == 1 and ck.ranks == [] and ck.optimizer is None
    assert ck.extra["source"]["model_type"] == "xlm-roberta"
    model, tok, cfg = load_pretrained(str(out))
    assert cfg.data.tokenizer == str((out / "tokenizer.model").resolve())
    assert tok.id_scheme == "fairseq" and tok.vocab_size == hf_model.config.vocab_size
    assert load_config(str(out / "config.yaml"), schema=RunConfig) == cfg
    text, fusion = cfg.model.encoders["text"], cfg.model.fusion
    assert (text.max_positions, text.segments, text.position_offset) == (40, 1, 2)
    assert (text.layer_norm_eps, text.dropout) == (1e-5, 0.1)
    t = fusion.transformer
    assert (t.layers, t.heads, t.mlp_ratio, t.prenorm, t.layer_norm_eps) == (2, 4, 2.0, False, 1e-5)
    assert not fusion.pooler
    assert torch.count_nonzero(model.encoders["text"].type_embedding) == 0
    hf = {k.removeprefix("roberta."): v for k, v in hf_model.state_dict().items()}
    ours = model.state_dict()
    assert torch.equal(ours["encoders.text.word.weight"], hf["embeddings.word_embeddings.weight"])
    assert torch.equal(
        ours["fusion.stack.blocks.1.mlp.2.weight"], hf["encoder.layer.1.output.dense.weight"]
    )
    assert torch.equal(ours["objectives.mlm.bias"], hf["lm_head.bias"])


def test_lower_level_mapping_handles_both_prefix_layouts(spm_path: Path):
    torch.manual_seed(0)
    hf_cfg = tiny_config(spm_path)
    mlm = randomise(transformers.XLMRobertaForMaskedLM(hf_cfg))
    prefixed = mlm.state_dict()
    bare = {k.removeprefix("roberta."): v for k, v in prefixed.items()}
    cfg_a, state_a = xlmr_state_dict_to_mmptm(prefixed, hf_cfg.to_dict())
    cfg_b, state_b = xlmr_state_dict_to_mmptm(bare, hf_cfg.to_dict())
    assert cfg_a == cfg_b
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


# -- errors ---------------------------------------------------------------------------------------


def test_missing_files_are_named(spm_path: Path, tmp_path: Path):
    hf_dir, _ = make_hf_dir(tmp_path, spm_path, "mlm", "st")
    (hf_dir / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors or pytorch_model\.bin"):
        import_xlmr(hf_dir, tmp_path / "run")
    (hf_dir / "sentencepiece.bpe.model").unlink()
    with pytest.raises(FileNotFoundError, match=r"sentencepiece\.bpe\.model"):
        import_xlmr(hf_dir, tmp_path / "run")
    (hf_dir / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        import_xlmr(hf_dir, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_config_errors(spm_path: Path, tmp_path: Path):
    hf_dir, _ = make_hf_dir(tmp_path, spm_path, "mlm", "st")
    original = json.loads((hf_dir / "config.json").read_text())
    for change, match in [
        ({"model_type": "bert"}, "model_type is 'bert'"),
        ({"hidden_act": "gelu_new"}, "hidden_act='gelu_new'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"vocab_size": original["vocab_size"] + 5}, "config.json has vocab_size"),
        ({"pad_token_id": 0}, "pad_token_id=0"),
    ]:
        (hf_dir / "config.json").write_text(json.dumps({**original, **change}))
        with pytest.raises(ValueError, match=match):
            import_xlmr(hf_dir, tmp_path / "run")


def test_unmapped_missing_and_untied_tensors_are_named(spm_path: Path):
    hf_cfg = tiny_config(spm_path)
    state = dict(randomise(transformers.XLMRobertaForMaskedLM(hf_cfg)).state_dict())
    cfg = hf_cfg.to_dict()

    extra = {**state, "roberta.encoder.layer.0.attention.self.rotary.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"encoder\.layer\.0\.attention\.self\.rotary\.weight"):
        xlmr_state_dict_to_mmptm(extra, cfg)

    head = {**state, "adapter_head.weight": torch.zeros(2, 32)}  # classifier.: left by itself
    with pytest.raises(ValueError, match=r"adapter_head\.weight.*drop_prefixes"):
        xlmr_state_dict_to_mmptm(head, cfg)
    xlmr_state_dict_to_mmptm(head, cfg, drop_prefixes=["adapter_head."])

    lacking = {k: v for k, v in state.items() if k != "roberta.embeddings.LayerNorm.bias"}
    with pytest.raises(ValueError, match=r"encoders\.text\.norm\.bias"):
        xlmr_state_dict_to_mmptm(lacking, cfg)

    untied = {**state, "lm_head.decoder.weight": state["lm_head.decoder.weight"] + 1}
    with pytest.raises(ValueError, match=r"lm_head\.decoder\.weight.*ties"):
        xlmr_state_dict_to_mmptm(untied, cfg)

    deeper = {**state, "roberta.encoder.layer.2.output.dense.bias": torch.zeros(32)}
    with pytest.raises(ValueError, match=r"fusion\.stack\.blocks\.2\.mlp\.2\.bias"):
        xlmr_state_dict_to_mmptm(deeper, cfg)
