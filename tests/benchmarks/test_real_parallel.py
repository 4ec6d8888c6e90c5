"""The real-parallel-text benchmark's data side (gettext catalogs → filtered, split pairs)
and its tf-idf baseline, on small catalogs written here."""

from __future__ import annotations

import itertools
import math
import struct
import sys
from collections import Counter

import pytest
import torch
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import real_parallel_data as rp
from real_parallel import recipe_overrides, tfidf_retrieval

from mmptm.recipe import load_run_config


def write_mo(path, entries: dict[str, str]) -> None:
    """A GNU .mo file (format revision 0, no hash table) of msgid → msgstr."""
    keys = sorted(entries)
    ids = [k.encode() for k in keys]
    strs = [entries[k].encode() for k in keys]
    n = len(keys)
    start = 28 + 16 * n
    table_ids, table_strs, blob = [], [], b""
    for s in ids:
        table_ids.append((len(s), start + len(blob)))
        blob += s + b"\0"
    for s in strs:
        table_strs.append((len(s), start + len(blob)))
        blob += s + b"\0"
    head = struct.pack("<7I", 0x950412DE, 0, n, 28, 28 + 8 * n, 0, start)
    body = b"".join(struct.pack("<2I", *e) for e in table_ids + table_strs)
    path.write_bytes(head + body + blob)


def test_a_catalog_gives_english_and_translation_without_context_plurals_or_header(tmp_path):
    mo = tmp_path / "x.mo"
    write_mo(mo, {
        "": "Content-Type: text/plain; charset=UTF-8\n",
        "dialog|tip\x04Inserts a new row above the selection.": "Fügt eine neue Zeile ein.",
        "Deletes the file.\n": "Löscht die Datei.\n",
        "one file\x00%d files": "eine Datei\x00%d Dateien",
        "Starts %PRODUCTNAME now.": "Startet %PRODUCTNAME jetzt.",
        "Not translated here": "",
    })  # fmt: skip
    assert sorted(rp.read_catalog(mo)) == [
        ("Deletes the file.", "Löscht die Datei."),
        ("Inserts a new row above the selection.", "Fügt eine neue Zeile ein."),
        ("Starts LibreOffice now.", "Startet LibreOffice jetzt."),
    ]


@pytest.mark.parametrize(
    "text",
    ["Inserts a new row above the selection.", "Shows non-matching input paths only",
     "Floating-point divide by zero occurred", "Don't ask me again, please"],
)  # fmt: skip
def test_sentences_are_kept(text):
    assert rp.is_sentence(text)


@pytest.mark.parametrize(
    "text",
    ["Sort Keys", "cannot open %s for writing", "invalid %(name)s argument here",
     "Search _backwards in the file", "Save ~All documents at once", "use -r to recurse here",
     "run it with --verbose for details", "see /usr/share/doc for details",
     "<b>Bold</b> text is here", "Open the {file} in a new window",
     "git merge [<options>] [<commit>...]", "cache_set victim alloc failed",
     "line one\nline two and three"],
)  # fmt: skip
def test_strings_with_format_markup_accelerators_options_or_paths_are_not(text):
    assert not rp.is_sentence(text)


def test_scripts():
    assert rp.script_ok("Удаляет текущую копию.", "ru")
    assert not rp.script_ok("Deletes the copy.", "ru")
    assert rp.script_ok("Löscht die Kopie.", "de") and not rp.script_ok("Удаляет", "de")


def _jaccard(a: str, b: str) -> float:
    x, y = set(rp.normalise(a).split()), set(rp.normalise(b).split())
    return len(x & y) / len(x | y)


SENTENCES = [
    "Inserts a new row above the current row.",
    "Inserts a new row below the current row.",
    "Inserts a new column left of the current column.",
    "Deletes the selected sheet from the document.",
    "Deletes the selected sheets from the document.",
    "Shows the print preview of the page.",
    "Opens a dialog to choose a printer.",
    "The file could not be saved.",
    "The file could not be opened.",
    "Enter the password to unlock the key.",
]


def test_near_duplicate_clusters_are_the_connected_components_of_jaccard_pairs():
    got = rp.near_duplicate_clusters(SENTENCES)
    parent = list(range(len(SENTENCES)))  # brute force over all pairs, independently

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i, j in itertools.combinations(range(len(SENTENCES)), 2):
        if _jaccard(SENTENCES[i], SENTENCES[j]) >= rp.NEAR:
            parent[max(root(i), root(j))] = min(root(i), root(j))
    expect = [root(i) for i in range(len(SENTENCES))]
    same = {(i, j) for i, j in itertools.combinations(range(len(SENTENCES)), 2)}
    assert {p for p in same if got[p[0]] == got[p[1]]} == {
        p for p in same if expect[p[0]] == expect[p[1]]
    }
    assert got[0] == got[1] and got[3] == got[4] and got[7] == got[8] and got[5] != got[6]


def test_split_has_no_near_duplicate_or_translation_across_it():
    langs = ("de", "ru")
    pairs = {en: {"de": f"DE {i} {en}", "ru": f"Ру {i} {en}"} for i, en in enumerate(SENTENCES)}
    pairs["Opens a dialog to choose a printer."]["de"] = (
        "DE 0 Inserts a new row above the current row."
    )
    del pairs["Enter the password to unlock the key."]["ru"]  # not in every language
    s = rp.split(pairs, langs, n_test=3, seed=1)
    test_en = [en for en, _ in s.test["de"]]
    assert [en for en, _ in s.test["ru"]] == test_en and len(test_en) == 3
    assert "Enter the password to unlock the key." not in test_en
    for lang in langs:
        assert s.test[lang] == [(en, pairs[en][lang]) for en in test_en]
        for en, tr in s.train[lang]:
            assert all(_jaccard(en, t) < rp.NEAR for t in test_en), (en, test_en)
            assert tr not in {t for _, t in s.test[lang]}
    # test sentences are no near duplicates of each other either
    assert all(_jaccard(a, b) < rp.NEAR for a, b in itertools.combinations(test_en, 2))
    with pytest.raises(ValueError, match="only .* test sentences in every language, need 9"):
        rp.split(pairs, langs, n_test=9)


def test_tfidf_baseline_matches_a_direct_count(tiny_tokenizer):
    tok = tiny_tokenizer
    pairs = {
        "de": [("a red circle", "ein roter Kreis"), ("a blue square", "ein blaues Quadrat"),
               ("two green triangles", "zwei grüne Dreiecke"),
               ("a red square", "ein rotes Quadrat")],
    }  # fmt: skip
    got = tfidf_retrieval(tok, pairs)
    en, de = [p[0] for p in pairs["de"]], [p[1] for p in pairs["de"]]
    docs = [Counter(tok.encode(t)) for t in en + de]
    df = Counter(p for d in docs for p in d)
    idf = {p: math.log((1 + len(docs)) / (1 + n)) + 1 for p, n in df.items()}

    def vec(c):
        v = {p: n * idf[p] for p, n in c.items()}
        norm = math.sqrt(sum(x * x for x in v.values()))
        return {p: x / norm for p, x in v.items()}

    ve, vd = [vec(d) for d in docs[:4]], [vec(d) for d in docs[4:]]
    sim = torch.tensor([[sum(x * b.get(p, 0.0) for p, x in a.items()) for b in ve] for a in vd])
    hits = (sim.argmax(1) == torch.arange(4)).float().mean() + (
        sim.argmax(0) == torch.arange(4)
    ).float().mean()
    assert got["de"] == pytest.approx(hits.item() / 2) and got["avg"] == got["de"]


#: what the one-hour runs on this benchmark measured with (README, "Real data"), now the
#: recipes' own settings: lr, warm-up, language embeddings, XLCO pooling and source shares
TUNED_ON_REAL_TEXT = {
    "mbert_tiny": {"train.lr": 2e-3, "train.warmup_steps": 500},
    "xlm_tlm_tiny": {"train.lr": 2e-3, "train.warmup_steps": 500,
                     "model.encoders.text.language_embeddings": False},
    "xlm_xlco_tiny": {"train.lr": 1e-3, "train.warmup_steps": 500,
                      "model.encoders.text.language_embeddings": False,
                      "model.fusion.modality_pooling": "mean", "data.sources.mono.weight": 0.2,
                      "data.sources.tlm.weight": 0.2, "data.sources.xlco.weight": 0.6},
}  # fmt: skip


@pytest.mark.parametrize("recipe", sorted(TUNED_ON_REAL_TEXT))
def test_recipes_carry_the_settings_tuned_on_real_text(recipe, tmp_path):
    cfg = load_run_config(recipe, recipe_overrides(recipe, tmp_path))
    for key, expected in TUNED_ON_REAL_TEXT[recipe].items():
        node = cfg
        for part in key.split("."):
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        assert node == expected and type(node) is type(expected), key
