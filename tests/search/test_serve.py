"""The HTTP layer of ``mmptm serve`` (mmptm.search.serve) over a fake index.

The fake (tests/fake_index.py) implements SearchIndex's interface with its refusals, so these
tests check what the app adds: routes, validation, status codes and messages, the upload
limits, caching headers, the page's files, and that a slow search does not block the server.
The same app over a real index, and a browser, are in test_browser.py.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time

import httpx
import pytest
from fake_index import LOCAL, FakeIndex, jpeg, png_claiming
from fastapi.testclient import TestClient
from PIL import Image

from mmptm.search.serve import MAX_K, STATIC, create_app, running


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(FakeIndex()), base_url=LOCAL)


def test_health_describes_the_index_and_the_limits(client):
    body = client.get("/api/health").json()
    assert body["status"] == "ok"
    assert body["index"]["languages"] == ["de", "en"]
    assert body["index"]["counts"] == {"items": 3, "image": 3, "text": 6}
    assert body["max_k"] == MAX_K and body["max_upload_mb"] > 0


def test_text_search_returns_ranked_hits_with_thumbnails(client):
    r = client.get("/api/search", params={"q": "a blue square", "k": 2, "lang": "de"})
    assert r.status_code == 200
    body = r.json()
    assert body["query"] == "text" and body["value"] == "a blue square" and body["k"] == 2
    assert body["side"] == "image" and body["latency_ms"] >= 0
    assert [h["rank"] for h in body["hits"]] == [1, 2]
    first = body["hits"][0]
    assert first["key"] == "blue" and first["caption"] == "ein blaues Quadrat"
    assert first["language"] == "de" and first["score"] == pytest.approx(1.0)
    thumb = client.get(first["thumbnail"])  # a URL relative to the app's root
    assert thumb.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(thumb.content)).getpixel((12, 12))[2] > 150  # blue


def test_similar_excludes_the_item_and_image_search_finds_the_colour(client):
    body = client.get("/api/similar/red", params={"k": 5}).json()
    assert "red" not in [h["key"] for h in body["hits"]] and len(body["hits"]) == 2
    up = client.post("/api/search/image", files={"file": ("g.png", jpeg((40, 190, 40), fmt="PNG"))})
    assert up.status_code == 200, up.text
    body = up.json()
    assert body["query"] == "image" and body["value"] == "g.png" and body["side"] == "text"
    assert body["hits"][0]["key"] == "green"


def test_item_and_thumbnail_caching(client):
    assert client.get("/api/item/red").json()["captions"]["de"] == "ein rotes Quadrat"
    r = client.get("/api/thumb/green")
    assert r.status_code == 200 and "max-age" in r.headers["cache-control"]
    again = client.get("/api/thumb/green", headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and not again.content
    other = client.get("/api/thumb/red", headers={"If-None-Match": r.headers["etag"]})
    assert other.status_code == 200


BAD_REQUESTS = [
    # (method, url, params, status, words the message must contain)
    ("GET", "/api/search", {"q": ""}, 400, "empty query"),
    ("GET", "/api/search", {"q": "   "}, 400, "empty query"),
    ("GET", "/api/search", {"q": "x" * 10_000}, 400, "query too long"),
    ("GET", "/api/search", {"q": "red", "k": 0}, 400, "k must be between 1 and 100, got 0"),
    ("GET", "/api/search", {"q": "red", "k": 101}, 400, "k must be between 1 and 100"),
    ("GET", "/api/search", {"q": "red", "k": "ten"}, 422, "integer"),
    ("GET", "/api/search", {}, 422, "Field required"),
    ("GET", "/api/search", {"q": "red", "lang": "xx"}, 400, "unknown language 'xx'"),
    ("GET", "/api/search", {"q": "red", "side": "audio"}, 400, "unknown side 'audio'"),
    ("GET", "/api/search", {"q": "red", "rerank_k": 5}, 400, "no itm head"),
    ("GET", "/api/search", {"q": "red", "rerank_k": -1}, 400, "rerank_k must be between"),
    ("GET", "/api/similar/nope", {}, 404, "no item 'nope' in the index"),
    ("GET", "/api/similar/red", {"k": 1000}, 400, "k must be between"),
    ("GET", "/api/thumb/nope", {}, 404, "no item 'nope' in the index"),
    ("GET", "/api/item/nope", {}, 404, "no item 'nope' in the index"),
    ("POST", "/api/search/image", {}, 400, "multipart/form-data"),
]


@pytest.mark.parametrize("method,url,params,status,words", BAD_REQUESTS)
def test_bad_requests_get_a_clear_4xx_and_the_server_answers_after(
    client, method, url, params, status, words
):
    r = client.request(method, url, params=params)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert words in (detail if isinstance(detail, str) else json.dumps(detail))
    assert client.get("/api/search", params={"q": "red"}).status_code == 200


def _upload(client, name: str, data: bytes, **kw) -> httpx.Response:
    return client.post("/api/search/image", files={"file": (name, data)}, **kw)


def test_bad_uploads(client, tmp_path):
    r = _upload(client, "notes.txt", b"just some text, not an image")
    assert r.status_code == 415 and "'notes.txt' is not an image" in r.json()["detail"]
    r = _upload(client, "cut.png", jpeg((1, 2, 3), fmt="PNG")[:60])  # header, no pixels
    assert r.status_code == 400 and "not a decodable image" in r.json()["detail"]
    # decompression bombs: 70 bytes of PNG that would decode to 100 (or 400) million pixels
    r = _upload(client, "bomb.png", png_claiming(10_000, 10_000))
    assert r.status_code == 413 and "'bomb.png' is 10000×10000 pixels" in r.json()["detail"]
    r = _upload(client, "huge.png", png_claiming(20_000, 20_000))  # PIL refuses it outright
    assert r.status_code == 413 and "'huge.png' is too many pixels" in r.json()["detail"]
    r = client.post("/api/search/image", data={"other": "x"}, files={"x": ("a.png", b"1")})
    assert r.status_code == 400 and "form field 'file'" in r.json()["detail"]
    # over the size limit: refused on the declared length ...
    r = _upload(client, "big.jpg", b"\xff" * (21 * 1024 * 1024))
    assert r.status_code == 413 and "upload too large: the limit is 20 MB" in r.json()["detail"]
    assert client.get("/api/health").status_code == 200


def test_uploads_without_a_length_are_counted_as_they_are_read():
    small = TestClient(create_app(FakeIndex(), max_upload_mb=1), base_url=LOCAL)
    boundary = "xyzzy"
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="b.jpg"\r\n'
            "Content-Type: image/jpeg\r\n\r\n").encode()  # fmt: skip

    def body(n_chunks: int):  # a generator: sent chunked, with no Content-Length
        yield head
        for _ in range(n_chunks):
            yield b"\0" * 65536
        yield f"\r\n--{boundary}--\r\n".encode()

    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    r = small.post("/api/search/image", content=body(32), headers=headers)  # 2 MB
    assert "content-length" not in r.request.headers
    assert r.status_code == 413 and "limit is 1 MB" in r.json()["detail"]
    r = small.post("/api/search/image", content=body(8), headers=headers)  # 0.5 MB, zeros
    assert r.status_code == 415


def test_openapi_schema_and_no_cdn_pages(client):
    schema = client.get("/openapi.json").json()
    assert {"/api/search", "/api/search/image", "/api/similar/{key}", "/api/thumb/{key}",
            "/api/item/{key}", "/api/health"} <= set(schema["paths"])  # fmt: skip
    upload = schema["paths"]["/api/search/image"]["post"]
    assert "multipart/form-data" in upload["requestBody"]["content"]
    assert client.get("/docs").status_code == 404  # Swagger UI would load from a CDN

    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for ref in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        if not ref.startswith(("data:", "./")):
            assert client.get(ref).status_code == 200, ref
    for path in STATIC.iterdir():  # nothing is fetched from another host
        text = path.read_text().replace("http://www.w3.org/2000/svg", "")
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|@import|@font-face", text), path


def test_answers_over_a_socket_do_not_wait_for_delayed_acks():
    # with Nagle on, each small answer waited for the client's delayed ACK (~40 ms)
    with running(create_app(FakeIndex())) as url, httpx.Client(base_url=url) as http:
        times = []
        for _ in range(21):
            t0 = time.perf_counter()
            assert http.get("api/health").status_code == 200
            times.append(time.perf_counter() - t0)
    assert sorted(times)[10] < 0.02, times


def test_a_slow_search_does_not_block_the_server():
    with running(create_app(FakeIndex(delay=1.5))) as url:
        slow = threading.Thread(target=httpx.get, args=(f"{url}api/search?q=red",),
                                kwargs={"timeout": 30})  # fmt: skip
        slow.start()
        time.sleep(0.2)
        t0 = time.perf_counter()
        assert httpx.get(f"{url}api/health", timeout=30).status_code == 200
        assert httpx.get(f"{url}api/thumb/red", timeout=30).status_code == 200
        assert time.perf_counter() - t0 < 1.0
        assert slow.is_alive()  # neither waited for the search (nor for its lock)
        slow.join()


def test_a_50_mb_upload_over_a_socket_is_refused_without_a_hang():
    with running(create_app(FakeIndex())) as url:
        t0 = time.perf_counter()
        r = httpx.post(f"{url}api/search/image", files={"file": ("x.jpg", b"\0" * (50 << 20))},
                       timeout=30)  # fmt: skip
        assert r.status_code == 413 and "limit is 20 MB" in r.json()["detail"]
        assert time.perf_counter() - t0 < 20
        assert httpx.get(f"{url}api/search?q=red", timeout=30).json()["hits"][0]["key"] == "red"
