"""Knowledge-graph readers: each format, malformed lines named by file:line, unknown ids."""

import json

import numpy as np
import pytest
import torch

from mmptm.kg.graph import (
    Embeddings,
    Vocabulary,
    load_embeddings,
    load_graph,
    read_aliases,
    read_descriptions,
    read_triples,
    save_embeddings,
)


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_tsv_folder_vocab_from_training_and_unknown_ids_counted(tmp_path):
    write(tmp_path / "train.txt", "/m/a\t/r/x\t/m/b\n/m/b\t/r/y\t/m/c\n\n/m/c\t/r/x\t/m/a\n")
    # valid: one triple with an entity absent from training, one with an unknown relation
    write(tmp_path / "valid.txt", "/m/a\t/r/y\t/m/c\n/m/z\t/r/x\t/m/a\n/m/a\t/r/q\t/m/b\n")
    write(tmp_path / "test.txt", "/m/c\t/r/y\t/m/b\n")
    g = load_graph(tmp_path)
    assert g.entities.names == ["/m/a", "/m/b", "/m/c"]  # first appearance in train
    assert g.relations.names == ["/r/x", "/r/y"]
    np.testing.assert_array_equal(g.splits["train"], [[0, 0, 1], [1, 1, 2], [2, 0, 0]])
    np.testing.assert_array_equal(g.splits["valid"], [[0, 1, 2]])
    np.testing.assert_array_equal(g.splits["test"], [[2, 1, 1]])
    assert g.unknown == {"train": 0, "valid": 2, "test": 0}
    assert g.summary()["valid_unknown"] == 2
    assert len(g.all_true()) == 5


def test_single_file_and_wikidata5m_names(tmp_path):
    f = write(tmp_path / "kg.tsv", "Q1\tP31\tQ2\nQ2\tP31\tQ3\n")
    g = load_graph(f)
    assert set(g.splits) == {"train"} and len(g.entities) == 3
    d = tmp_path / "w5m"
    d.mkdir()
    write(d / "wikidata5m_transductive_train.txt", "Q1\tP31\tQ2\n")
    write(d / "wikidata5m_transductive_test.txt", "Q2\tP31\tQ1\n")
    assert set(load_graph(d).splits) == {"train", "test"}


@pytest.mark.parametrize(
    "line",
    ["a\tb\n", "a\tb\tc\td\n", "a\t\tc\n", "a b c\n"],
)
def test_malformed_triple_line_names_file_and_line(tmp_path, line):
    f = write(tmp_path / "train.txt", "x\ty\tz\n" + line)
    with pytest.raises(ValueError, match=r"train.txt:2: expected 'head<TAB>relation<TAB>tail'"):
        read_triples(f)


def test_missing_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt: no such file"):
        load_graph(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="no train.txt"):
        load_graph(tmp_path)


def openke_folder(tmp_path):
    d = tmp_path / "openke"
    d.mkdir()
    # delta: in entity2id but in no training triple
    write(d / "entity2id.txt", "4\nalpha\t0\nbeta\t1\ngamma\t2\ndelta\t3\n")
    write(d / "relation2id.txt", "2\nlikes\t0\nhates\t1\n")
    # OpenKE's order: head tail relation
    write(d / "train2id.txt", "2\n0 1 0\n1 2 1\n")
    write(d / "test2id.txt", "3\n2 0 1\n2 7 0\n3 0 0\n")  # 7: not in entity2id; 3: untrained
    return d


def test_openke_folder_tail_before_relation(tmp_path):
    g = load_graph(openke_folder(tmp_path))
    assert g.entities.names == ["alpha", "beta", "gamma", "delta"]
    assert g.relations.names == ["likes", "hates"]
    np.testing.assert_array_equal(g.splits["train"], [[0, 0, 1], [1, 1, 2]])  # (h, r, t)
    np.testing.assert_array_equal(g.splits["test"], [[2, 1, 0]])
    assert g.unknown["test"] == 2 and "valid" not in g.splits


def test_openke_errors(tmp_path):
    d = openke_folder(tmp_path)
    write(d / "train2id.txt", "3\n0 1 0\n1 2 1\n")
    with pytest.raises(ValueError, match="train2id.txt: count line says 3 triples, the file has 2"):
        load_graph(d)
    write(d / "train2id.txt", "2\n0 1 0\n1 two 1\n")
    with pytest.raises(ValueError, match="train2id.txt:3: expected 'head tail relation'"):
        load_graph(d)
    write(d / "train2id.txt", "two\n0 1 0\n")
    with pytest.raises(ValueError, match="train2id.txt:1: expected OpenKE's count line"):
        load_graph(d)
    write(d / "train2id.txt", "1\n0 9 0\n")
    with pytest.raises(ValueError, match="train2id.txt: triple 1 has an id beyond"):
        load_graph(d)
    write(d / "train2id.txt", "1\n0 1 0\n")
    write(d / "entity2id.txt", "3\nalpha\t0\nbeta\t1\ngamma 2 x\n")
    with pytest.raises(ValueError, match="entity2id.txt:4: expected 'name<TAB>id'"):
        load_graph(d)


def test_aliases_and_descriptions(tmp_path):
    a = write(tmp_path / "wikidata5m_entity.txt", "Q1\tBimo\tbimo the bear\nQ2\tTako\n")
    assert read_aliases(a) == {"Q1": ["Bimo", "bimo the bear"], "Q2": ["Tako"]}
    write(a, "Q1\tBimo\nQ2\n")
    with pytest.raises(ValueError, match="wikidata5m_entity.txt:2: expected 'id<TAB>alias"):
        read_aliases(a)
    t = write(tmp_path / "wikidata5m_text.txt", "Q1\tA toy bear.\tWith tabs.\nQ2\tAn octopus.\n")
    assert read_descriptions(t) == {"Q1": "A toy bear.\tWith tabs.", "Q2": "An octopus."}
    write(t, "Q1\tA toy bear.\nQ2 no tab\n")
    with pytest.raises(ValueError, match=r"wikidata5m_text.txt:2: expected 'id<TAB>text'"):
        read_descriptions(t)


def test_embeddings_npy_roundtrip_and_mmap(tmp_path):
    vocab = Vocabulary(["Q1", "Q2", "Q3"])
    vec = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_embeddings(tmp_path, "entities", Embeddings(vocab, vec))
    assert (tmp_path / "entities.txt").read_text() == "Q1\nQ2\nQ3\n"
    for mmap in (False, True):
        e = load_embeddings(tmp_path, mmap=mmap)
        assert isinstance(e.vectors, np.memmap) == mmap
        np.testing.assert_array_equal(e.lookup(["Q3", "Q1"]), vec[[2, 0]])
    e = load_embeddings(tmp_path / "entities.npy", tmp_path / "entities.txt")
    assert e.vocab.names == vocab.names
    with pytest.raises(KeyError, match="Q9"):
        e.lookup(["Q9"])
    write(tmp_path / "entities.txt", "Q1\nQ2\n")
    with pytest.raises(ValueError, match=r"entities.npy: embeddings: \(3, 4\) rows for 2 ids"):
        load_embeddings(tmp_path)
    with pytest.raises(ValueError, match="occurs twice"):
        Vocabulary(["a", "b", "a"])


def test_openke_embedding_files(tmp_path):
    d = openke_folder(tmp_path)
    vec = np.array([[0.5, -1.0], [2.0, 0.25], [1.5, 3.0], [0.0, 4.0]], dtype=np.float32)
    # OpenKE-TF / Fast-TransX: tab-separated floats, trailing tab, row = id
    write(d / "entity2vec.vec", "".join("\t".join(map(str, r)) + "\t\n" for r in vec))
    e = load_embeddings(d / "entity2vec.vec")
    assert e.vocab.names == ["alpha", "beta", "gamma", "delta"]
    np.testing.assert_array_equal(e.vectors, vec)
    # OpenKE-PyTorch save_parameters: a JSON of the state dict as lists
    params = {"zero_const": [0.0], "ent_embeddings.weight": vec.tolist(),
              "rel_embeddings.weight": vec[:2].tolist()}  # fmt: skip
    write(d / "transe.json", json.dumps(params))
    np.testing.assert_array_equal(load_embeddings(d / "transe.json").vectors, vec)
    r = load_embeddings(d / "transe.json", kind="relations")
    assert r.vocab.names == ["likes", "hates"] and r.vectors.shape == (2, 2)
    # OpenKE-PyTorch save_checkpoint: a torch state dict
    torch.save({"ent_embeddings.weight": torch.tensor(vec)}, d / "transe.ckpt")
    np.testing.assert_array_equal(load_embeddings(d / "transe.ckpt").vectors, vec)
    with pytest.raises(ValueError, match=r"transe.ckpt: no 'rel_embeddings.weight'"):
        load_embeddings(d / "transe.ckpt", kind="relations")
    write(d / "broken.ckpt", "not a checkpoint")
    with pytest.raises(ValueError, match="broken.ckpt: not a PyTorch state dict"):
        load_embeddings(d / "broken.ckpt")
    write(d / "entity2vec.vec", "0.5\t1.0\n0.5\tx\n")
    with pytest.raises(ValueError, match="entity2vec.vec:2: expected numbers"):
        load_embeddings(d / "entity2vec.vec")
