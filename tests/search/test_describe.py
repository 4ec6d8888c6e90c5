"""``POST /api/describe`` and the page's "Described as": a tiny coca_tiny run (CLIP plus a
caption decoder) that both searches and writes, over HTTP and in Chromium."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import read_shard_samples, tiny_overrides
from fake_index import LOCAL, FakeIndex, jpeg
from fastapi.testclient import TestClient

from mmptm.generate.generator import Generator
from mmptm.recipe import load_run_config
from mmptm.search.describe import DESCRIBE, describer_for
from mmptm.search.index import SearchIndex, build_index
from mmptm.search.serve import CHROMIUM as DEBIAN_CHROMIUM
from mmptm.search.serve import chromium, create_app, running
from mmptm.train.trainer import pretrain

CHROMIUM = os.environ.get("MMPTM_CHROMIUM", DEBIAN_CHROMIUM)


@pytest.fixture(scope="module")
def coca_index(tiny_world: Path, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("coca_run")
    over = [*tiny_overrides(tiny_world, run, "coca_tiny"), "train.max_steps=20",
            "train.ckpt_every=20"]  # fmt: skip
    pretrain(load_run_config("coca_tiny", over))
    out = tmp_path_factory.mktemp("coca_index") / "index"
    build_index(str(run), f"{tiny_world}/image_text/test-*.tar", out)
    return out


@pytest.fixture(scope="module")
def scene(tiny_world: Path) -> bytes:
    _, members = read_shard_samples(
        sorted(map(str, (tiny_world / "image_text").glob("test-*.tar")))
    )[0]
    return members["jpg"]


@pytest.fixture(scope="module")
def app(coca_index: Path):
    index = SearchIndex.open(coca_index)
    return create_app(index, describer=describer_for(index))


def test_describe_writes_what_the_run_writes_for_the_picture(app, coca_index, scene):
    client = TestClient(app, base_url=LOCAL)
    assert client.get("/api/health").json()["can_describe"] is True
    r = client.post("/api/describe", files={"file": ("scene.jpg", scene, "image/jpeg")})
    assert r.status_code == 200, r.text
    body = r.json()
    # the same run, loaded apart and given the same bytes, writes the same words
    gen = Generator.load(str(SearchIndex.open(coca_index).enc.cfg.output_dir))
    want = gen.generate([{"__key__": "x", "jpg": scene}], DESCRIBE)[0].text
    assert body["text"] == want and body["lang"] == "en" and body["latency_ms"] > 0
    r = client.post("/api/describe", params={"lang": "xx"},
                    files={"file": ("scene.jpg", scene, "image/jpeg")})  # fmt: skip
    assert r.status_code == 400 and "unknown language 'xx'" in r.json()["detail"]
    r = client.post("/api/describe", files={"file": ("notes.txt", b"hello", "text/plain")})
    assert r.status_code == 415


def test_a_server_whose_run_does_not_write_says_so():
    client = TestClient(create_app(FakeIndex()), base_url=LOCAL)
    assert client.get("/api/health").json()["can_describe"] is False
    r = client.post("/api/describe", files={"file": ("a.jpg", jpeg((200, 0, 0)), "image/jpeg")})
    assert r.status_code == 404 and "--captioner" in r.json()["detail"]


def test_describe_in_the_page(app, scene, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM} (`make test` installs it)")
    client = TestClient(app, base_url=LOCAL)
    want = client.post("/api/describe", files={"file": ("s.jpg", scene, "image/jpeg")}).json()
    upload = tmp_path / "scene.jpg"
    upload.write_bytes(scene)
    with running(app) as url, chromium(tmp_path / "profile", CHROMIUM) as browser:
        page = browser.new_page()
        page.goto(url)
        page.wait_for_function("() => document.querySelectorAll('#lang option').length > 1")
        assert page.locator("#caption").is_hidden()
        page.set_input_files("#file", str(upload))
        page.wait_for_function(
            "() => document.querySelector('#caption').textContent.startsWith('Described as')"
        )
        assert page.inner_text("#caption") == f"Described as “{want['text']}”"
        page.fill("#q", "a red circle")  # a text search hides it again
        page.press("#q", "Enter")
        page.wait_for_function("() => document.querySelector('#caption').hidden")
