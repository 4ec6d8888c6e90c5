"""The real image–text benchmark's data side (CLDR names, emoji pictures, the split) and its
baselines' parts, on a few emoji."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import real_vl_data as rv
from real_vl import BagOfWords, clip_tokens, colour_histogram, ridge

from mmptm.eval.retrieval import recall_at_k

ANNOTATIONS = """<?xml version="1.0" encoding="UTF-8" ?>
<ldml><annotations>
<annotation cp="😀">face | grin</annotation>
<annotation cp="😀" type="tts">grinning face</annotation>
<annotation cp="🐈">cat | pet</annotation>
<annotation cp="🐈" type="tts">cat</annotation>
<annotation cp="{">bracket</annotation>
<annotation cp="{" type="tts">open curly bracket</annotation>
<annotation cp="🐱" type="tts">↑↑↑</annotation>
</annotations></ldml>
"""
DERIVED = """<?xml version="1.0" encoding="UTF-8" ?>
<ldml><annotations>
<annotation cp="👍🏽">thumbs up | +1 | medium skin tone</annotation>
<annotation cp="👍🏽" type="tts">thumbs up: medium skin tone</annotation>
<annotation cp="🇩🇪">flag</annotation>
<annotation cp="🇩🇪" type="tts">flag: Germany</annotation>
</annotations></ldml>
"""


@pytest.fixture
def cldr(tmp_path):
    for sub, text in (("annotations", ANNOTATIONS), ("annotationsDerived", DERIVED)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "en.xml").write_text(text, encoding="utf-8")
        de = text.replace("grinning face", "grinsendes Gesicht").replace("cat", "Katze")
        (tmp_path / sub / "de.xml").write_text(de, encoding="utf-8")
    return tmp_path


def test_names_and_keywords_from_both_files_skip_inherited(cldr):
    table = rv.read_annotations(cldr, "en")
    assert table["😀"] == {"name": "grinning face", "keywords": ["face", "grin"]}
    assert table["🇩🇪"]["name"] == "flag: Germany"
    assert "🐱" not in table  # "↑↑↑": inherited, no name of its own
    with pytest.raises(FileNotFoundError, match="xx.xml"):
        rv.read_annotations(cldr, "xx")


def test_items_captions_per_language_and_skin_tones_grouped(cldr):
    items = {it["emoji"]: it for it in rv.collect_items(["en", "de"], cldr=cldr)}
    assert "👍🏽" not in items  # skin-tone variants only when asked
    # the keyword the name already holds ("flag") is not repeated
    assert items["🇩🇪"]["captions"]["en"] == ["flag: Germany", "flag: Germany"]
    assert items["😀"]["captions"]["de"] == ["grinsendes Gesicht", "grinsendes Gesicht: face, grin"]
    with_tones = {it["emoji"]: it for it in rv.collect_items(["en"], skin_tones=True, cldr=cldr)}
    assert with_tones["👍🏽"]["group"] == "👍"


def test_split_shares_no_group_and_no_name():
    def item(i, group, name):
        return {"emoji": str(i), "group": group, "captions": {"en": [name, name]}}

    items = [item(i, f"g{i // 2}", f"name {i}") for i in range(400)]
    items += [item(1000 + i, f"h{i}", "same name") for i in range(20)]
    parts, moved = rv.split_items(items, 0.1, 0.2, seed=3)
    assert sum(len(p) for p in parts.values()) == len(items)
    groups = {k: {it["group"] for it in p} for k, p in parts.items()}
    assert not groups["train"] & groups["test"] and not groups["val"] & groups["test"]
    assert not groups["train"] & groups["val"]
    names = {k: {it["captions"]["en"][0] for it in p} for k, p in parts.items()}
    assert not names["train"] & names["test"] and not names["val"] & names["test"]
    assert names["train"] >= {"same name"} and moved > 0
    assert 0.1 < len(parts["test"]) / len(items) < 0.3  # about the fraction asked
    again, _ = rv.split_items(list(reversed(items)), 0.1, 0.2, seed=3)
    assert {it["emoji"] for it in again["test"]} == {it["emoji"] for it in parts["test"]}


@pytest.mark.skipif(
    bool(rv.missing_packages()),
    reason=f"Debian packages absent: apt-get install {' '.join(rv.missing_packages())}",
)
def test_renderer_draws_colour_emoji_and_refuses_what_the_font_lacks():
    render = rv.Renderer(size=48)
    face = render("😀")
    assert face.size == (48, 48) and face.mode == "RGB"
    r, _, b = torch.tensor(list(face.tobytes())).view(-1, 3).float().mean(0).tolist()
    assert r > b + 40  # a yellow face on white, not a grey outline
    assert render("🇩🇪") is not None  # a flag: two regional indicators, one glyph
    assert render("👩\u200d🚒") is not None  # a ZWJ sequence the font joins
    assert render("{") is None  # not in the emoji font
    assert render("😀😀") is None  # two glyphs


def test_colour_histogram_counts_pixels():
    x = torch.zeros(1, 3, 4, 4)
    x[0, 0, :2, :] = 1.0  # top half red, bottom black
    h = colour_histogram(x, bins=2)
    whole = h[0, :8] ** 2  # un-square-rooted: fractions of the picture
    assert whole[0b100].item() == pytest.approx(0.5) and whole[0].item() == pytest.approx(0.5)
    top_left = h[0, 8:16] ** 2
    assert top_left[0b100].item() == pytest.approx(1.0)


def test_ridge_matches_the_closed_form_and_bag_of_words_retrieves():
    torch.manual_seed(0)
    x, y = torch.randn(50, 4), torch.randn(50, 3)
    w = ridge(x, y, 2.0)
    expected = torch.linalg.lstsq(
        torch.cat([x, 2.0**0.5 * torch.eye(4)]), torch.cat([y, torch.zeros(4, 3)])
    ).solution
    torch.testing.assert_close(w, expected, atol=1e-4, rtol=1e-4)
    bow = BagOfWords(["red apple", "green pear", "blue car"])
    v = bow(["red apple", "a green pear", "blue car", "unseen words"])
    r = recall_at_k(v[:3] @ v[:3].T, (1,))
    assert r["i2t_R@1"] == 1.0 and v[3].abs().sum() == 0


def test_clip_tokens_put_the_end_token_after_the_last_real_one():
    batch = {
        "input_ids": torch.tensor([[5, 6, 7], [5, 9, 1]]),
        "attention_mask": torch.tensor([[True, True, True], [True, True, False]]),
    }
    assert clip_tokens(batch, 100, 5).tolist() == [[5, 6, 7, 100, 0], [5, 9, 100, 0, 0]]
