"""The search page in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright against a real server (uvicorn on a free 127.0.0.1 port) over a real index of a
tiny trained CLIP (conftest's ``tiny_index``).

What the page shows is checked against a brute-force oracle that shares no code with
mmptm.search: the run's contrastive embeddings of every test image and English caption,
computed by the evaluation path (mmptm.eval.retrieval's sides, the model's fuse and embed)
and compared with numpy. This test never skips: without Chromium it fails and says how to
install it (``make test`` does, as root: ``apt-get install -y chromium chromium-driver``).
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest
import torch
from conftest import read_shard_samples

from mmptm.batch import KEY
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.eval.retrieval import retrieval_sides
from mmptm.models.load import load_pretrained
from mmptm.objectives.contrastive import Contrastive
from mmptm.search.index import SearchIndex
from mmptm.search.serve import CHROMIUM as DEBIAN_CHROMIUM
from mmptm.search.serve import chromium, create_app, running

CHROMIUM = os.environ.get("MMPTM_CHROMIUM", DEBIAN_CHROMIUM)
#: the page's results are complete: not loading, and the status line names the query time
DONE = (
    "() => !document.querySelector('#results').classList.contains('loading')"
    " && document.querySelector('#status').textContent.includes('ms')"
)


@dataclass
class Oracle:
    keys: list[str]
    captions: list[str]  # English, as in the shards
    images: list[bytes]  # the shards' JPEG members
    img_NE: np.ndarray
    txt_NE: np.ndarray

    def best(self, sim_N: np.ndarray, exclude: int = -1) -> tuple[int, float]:
        """(index of the best score, its margin over the second)."""
        sim_N = np.where(np.arange(len(sim_N)) == exclude, -np.inf, sim_N)
        top2 = np.sort(sim_N)[-2:]
        return int(np.argmax(sim_N)), float(top2[1] - top2[0])


@pytest.fixture(scope="module")
def oracle(tiny_clip_run: Path, tiny_world: Path) -> Oracle:
    model, tokenizer, cfg = load_pretrained(
        str(tiny_clip_run), ["data.modalities.text.caption_languages=[en]"]
    )
    shards = f"{tiny_world}/image_text/test-*.tar"
    stream = stream_config(cfg.data, tokenizer, split="test", needs=model.data_needs(),
                           shards=shards, seed=0)  # fmt: skip
    stream.batch_size = 1000
    data = next(iter(single_pass(stream)))
    sides = retrieval_sides(model, stream)
    head = next(o for o in model.objectives.values() if isinstance(o, Contrastive))
    with torch.no_grad():
        img, txt = (
            head.embed(model.fuse({k: data[k] for k in keys if k in data}), side).numpy()
            for keys, side in ((sides.item_keys, sides.items), (sides.query_keys, sides.queries))
        )
    raw = dict(read_shard_samples(sorted(str(p) for p in tiny_world.glob("image_text/test-*"))))
    keys = list(data[KEY])
    captions = [json.loads(raw[k]["json"])["captions"]["en"] for k in keys]
    return Oracle(keys, captions, [raw[k]["jpg"] for k in keys], img, txt)


@pytest.fixture(scope="module")
def server(tiny_index: Path):
    with running(create_app(SearchIndex.open(tiny_index))) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not Path(CHROMIUM).exists():  # `make test` installs it: never skip
        pytest.fail(
            f"no Chromium at {CHROMIUM}: install Debian's (apt-get install -y chromium "
            "chromium-driver; `make test` does as root) or point MMPTM_CHROMIUM at one"
        )
    profile = tmp_path_factory.mktemp("chromium-profile")  # a fresh one
    with chromium(profile, CHROMIUM, viewport={"width": 1280, "height": 860}) as context:
        yield context


def _shown(page) -> list[tuple[str, float]]:
    """(key, score) of each result card, in page order."""
    keys = page.locator(".card").evaluate_all("cards => cards.map(c => c.dataset.key)")
    scores = page.locator(".card .score").all_inner_texts()
    return [(k, float(s)) for k, s in zip(keys, scores)]


def _check_top(shown, sim_N: np.ndarray, keys: list[str], exclude: str | None = None) -> None:
    """The first result is the oracle's best (up to float error: ties may come in either
    order) and every score shown is the oracle's, to the 3 decimals shown."""
    assert shown, "no results on the page"
    assert exclude not in [k for k, _ in shown]
    pool = [i for i, k in enumerate(keys) if k != exclude]
    best = max(sim_N[i] for i in pool)
    first = keys.index(shown[0][0])
    assert sim_N[first] >= best - 1e-4, (shown[0], keys[int(np.argmax(sim_N))], best)
    for key, score in shown:
        assert abs(score - sim_N[keys.index(key)]) < 2e-3, (key, score)


def test_search_page_in_chromium(browser, server, oracle, tmp_path):
    page = browser.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    # the language picker is filled from /api/health
    page.goto(server)
    page.wait_for_function("() => document.querySelectorAll('#lang option').length > 1")
    langs = page.locator("#lang option").evaluate_all("os => os.map(o => o.value)")
    assert langs == ["", "de", "en", "es", "fr", "ru"]
    assert page.locator("#empty").is_visible()

    # type an item's caption: the image the oracle ranks first must come first
    i = max(range(len(oracle.keys)), key=lambda i: oracle.best(oracle.img_NE @ oracle.txt_NE[i])[1])
    text_N = oracle.img_NE @ oracle.txt_NE[i]
    assert oracle.best(text_N)[1] > 1e-3  # a clear winner: the check below can fail
    page.select_option("#lang", "en")
    page.fill("#q", oracle.captions[i])
    page.press("#q", "Enter")
    page.wait_for_function(DONE)
    _check_top(_shown(page), text_N, oracle.keys)
    assert len(_shown(page)) == 24  # the page's k
    query = parse_qs(urlparse(page.url).query)
    assert query == {"q": [oracle.captions[i]], "lang": ["en"]}  # shareable
    assert re.search(r"24 images · query \d+\.\d ms", page.inner_text("#status"))
    loaded = "() => [...document.querySelectorAll('.card img')].every(i => i.naturalWidth > 0)"
    page.wait_for_function(loaded)  # every thumbnail, before the screenshot
    page.screenshot(path=tmp_path / "search-page.png", full_page=True)

    # upload an image (a test scene's own JPEG): captions come back, the oracle's best first
    j = max(range(len(oracle.keys)), key=lambda j: oracle.best(oracle.txt_NE @ oracle.img_NE[j])[1])
    assert oracle.best(oracle.txt_NE @ oracle.img_NE[j])[1] > 1e-3
    upload = tmp_path / f"{oracle.keys[j]}.jpg"
    upload.write_bytes(oracle.images[j])
    page.set_input_files("#file", str(upload))
    page.wait_for_function(DONE)
    assert page.inner_text("#query-text") == upload.name
    shown = _shown(page)
    _check_top(shown, oracle.txt_NE @ oracle.img_NE[j], oracle.keys)
    assert (
        page.locator(".card .caption").first.inner_text()
        == oracle.captions[oracle.keys.index(shown[0][0])]
    )
    page.screenshot(path=tmp_path / "search-by-image.png", full_page=True)

    # or drop it on the page: an overlay shows while dragging, the drop searches
    drag = page.evaluate_handle(
        """b64 => {
            const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
            const data = new DataTransfer();
            data.items.add(new File([bytes], "dropped.jpg", {type: "image/jpeg"}));
            return data;
        }""",
        base64.b64encode(oracle.images[j]).decode(),
    )
    page.dispatch_event("body", "dragenter", {"dataTransfer": drag})
    assert page.locator("#drop").is_visible()
    page.dispatch_event("body", "drop", {"dataTransfer": drag})
    page.wait_for_function(DONE)
    assert page.inner_text("#query-text") == "dropped.jpg"
    assert not page.locator("#drop").is_visible()
    assert _shown(page) == shown

    # click the first result: more like it (its image's neighbours, itself left out)
    clicked = shown[0][0]
    page.locator(".card").first.click()
    page.wait_for_function(DONE)
    assert parse_qs(urlparse(page.url).query)["like"] == [clicked]
    c = oracle.keys.index(clicked)
    _check_top(_shown(page), oracle.img_NE @ oracle.img_NE[c], oracle.keys, exclude=clicked)

    # the back button goes through the searches again: the dropped image, the uploaded
    # one, the text query (its URL holds it)
    for name in ("dropped.jpg", upload.name):
        page.go_back()
        page.wait_for_function(DONE)
        assert page.inner_text("#query-text") == name
        assert _shown(page) == shown
    page.go_back()
    page.wait_for_function(DONE)
    assert page.input_value("#q") == oracle.captions[i]
    _check_top(_shown(page), text_N, oracle.keys)

    # another language re-runs the search: the same images, German captions
    page.select_option("#lang", "de")
    page.wait_for_function(DONE)
    assert parse_qs(urlparse(page.url).query)["lang"] == ["de"]
    assert set(page.locator(".card .caption").evaluate_all("cs => cs.map(c => c.lang)")) == {"de"}
    _check_top(_shown(page), text_N, oracle.keys)  # clip_tiny has no language embeddings

    # errors are shown on the page, not in an alert, and the page keeps working
    page.on("dialog", lambda d: errors.append(f"dialog: {d.message}"))
    page.fill("#q", "x" * 1001)
    page.press("#q", "Enter")
    page.wait_for_selector("#error:not([hidden])")
    assert "characters" in page.inner_text("#error")
    page.goto(f"{server}?like=no-such-key")
    page.wait_for_selector("#error:not([hidden])")
    assert "no-such-key" in page.inner_text("#error")

    assert not errors, errors
    origin = server.rstrip("/")
    foreign = [u for u in requests if not u.startswith((origin, "data:", "blob:"))]
    assert not foreign, f"the page fetched from elsewhere: {foreign}"
