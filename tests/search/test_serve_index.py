"""``mmptm serve`` over a real index (conftest's ``tiny_index``, a tiny trained CLIP): the API
answers what SearchIndex answers, refuses bad input with the index's own messages, and the
command starts, serves and stops."""

from __future__ import annotations

import io
import os
import queue
import signal
import socket
import subprocess
import sys
import threading

import httpx
import pytest
from conftest import ROOT, cli_error
from fastapi.testclient import TestClient
from PIL import Image

from mmptm.search.index import SearchIndex
from mmptm.search.serve import create_app


@pytest.fixture(scope="module")
def index(tiny_index) -> SearchIndex:
    return SearchIndex.open(tiny_index)


@pytest.fixture(scope="module")
def client(index) -> TestClient:
    return TestClient(create_app(index), base_url="http://localhost")


def _pairs(hits) -> list[tuple]:
    return [(h["key"], h["caption"], h["language"], h["side"], h["rank"]) for h in hits]


def test_the_api_answers_what_the_index_answers(client, index):
    body = client.get("/api/search", params={"q": "a large red circle", "k": 7, "lang": "de"})
    assert body.status_code == 200
    body = body.json()
    want = index.search_text("a large red circle", 7, lang="de")
    assert _pairs(body["hits"]) == [(h.key, h.caption, h.language, h.side, h.rank) for h in want]
    assert [h["score"] for h in body["hits"]] == pytest.approx([h.score for h in want], abs=1e-5)
    assert body["side"] == "image" and all(h["language"] == "de" for h in body["hits"])

    key = want[0].key
    similar = client.get(f"/api/similar/{key}", params={"k": 5}).json()["hits"]
    assert [h["key"] for h in similar] == [h.key for h in index.search_key(key, 5)]
    assert key not in [h["key"] for h in similar]

    thumb = client.get(body["hits"][0]["thumbnail"])
    assert thumb.content == index.thumbnail(key)
    assert Image.open(io.BytesIO(thumb.content)).format == "JPEG"
    up = client.post("/api/search/image", files={"file": ("q.jpg", thumb.content)}, params={"k": 3})
    assert up.status_code == 200, up.text
    want = index.search_image(thumb.content, 3)
    assert [h["key"] for h in up.json()["hits"]] == [h.key for h in want]
    assert up.json()["side"] == "text"

    item = client.get(f"/api/item/{key}").json()
    assert item["key"] == key and set(item["texts"]) == {"de", "en", "es", "fr", "ru"}
    health = client.get("/api/health").json()["index"]
    assert health["items"] == 32 and health["languages"] == ["de", "en", "es", "fr", "ru"]
    assert set(health["sides"]) == {"image", "text"}


@pytest.mark.parametrize(
    "url,params,status,words",
    [
        ("/api/search", {"q": ""}, 400, "the query is empty"),
        ("/api/search", {"q": "red " * 2500}, 400, "characters; at most 1000"),
        ("/api/search", {"q": "red", "k": 0}, 400, "k must be between 1 and 100"),
        ("/api/search", {"q": "red", "lang": "xx"}, 400, "unknown language 'xx'"),
        ("/api/search", {"q": "red", "side": "audio"}, 400, "unknown side 'audio'"),
        ("/api/search", {"q": "red", "rerank_k": 5}, 400, "needs an ITM head"),
        ("/api/similar/nope", {}, 404, "no item 'nope' in the index"),
        ("/api/thumb/nope", {}, 404, "no item 'nope' in the index"),
        ("/api/item/nope", {}, 404, "no item 'nope' in the index"),
    ],
)
def test_bad_input_gets_the_index_message(client, url, params, status, words):
    r = client.get(url, params=params)
    assert r.status_code == status and words in r.json()["detail"], r.text
    assert client.get("/api/search", params={"q": "a red circle"}).status_code == 200


def test_bad_uploads_on_a_real_index(client):
    r = client.post("/api/search/image", files={"file": ("a.txt", b"hello")})
    assert r.status_code == 415
    r = client.post("/api/search/image", files={"file": ("big.jpg", bytes(50 << 20))})
    assert r.status_code == 413
    assert client.get("/api/search", params={"q": "a red circle"}).status_code == 200


def test_cli_errors(capsys, tmp_path, tiny_index):
    line = cli_error(capsys, ["serve", str(tmp_path / "none")])
    assert "does not exist" in line
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = cli_error(capsys, ["serve", str(tiny_index), "--port", str(port)])
    assert f"cannot listen on 127.0.0.1:{port}" in line


def test_cli_serves_until_interrupted(tiny_index):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "mmptm.cli", "serve", str(tiny_index), "--port", "0",
           "--allow-host", "search.example"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(s) for s in proc.stdout], daemon=True).start()
    try:
        while True:  # the model loads, then the URL is printed
            line = lines.get(timeout=120)
            if line.startswith("serving "):
                break
        url = line.split(" at ", 1)[1].split(" ", 1)[0]
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{url}api/health", timeout=30).json()["status"] == "ok"
        hits = httpx.get(f"{url}api/search", params={"q": "a blue star"}, timeout=30).json()
        assert len(hits["hits"]) == 10
        assert "<title>mmptm search</title>" in httpx.get(url, timeout=30).text
        # a name it was not started with (DNS rebinding) is refused; one it was, answered
        as_name = {"Host": "search.example:80"}
        assert httpx.get(f"{url}api/health", headers=as_name, timeout=30).status_code == 200
        other = httpx.get(f"{url}api/health", headers={"Host": "evil.example"}, timeout=30)
        assert other.status_code == 400 and "--allow-host" in other.json()["detail"]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
