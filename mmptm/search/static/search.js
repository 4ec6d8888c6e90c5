// The search page of `mmptm serve`: talks to the JSON API of the same app (relative URLs, so
// it also works behind a proxy under a sub-path). The URL holds the search (?q=..&lang=.. or
// ?like=KEY), so a search can be shared, reloaded and driven by the back button.
"use strict";

const $ = (id) => document.getElementById(id);
const els = {
  form: $("search-form"), q: $("q"), lang: $("lang"), side: $("side"), file: $("file"),
  status: $("status"), error: $("error"), results: $("results"), empty: $("empty"),
  chip: $("query-chip"), chipImage: $("query-image"), chipText: $("query-text"),
  clear: $("clear"), info: $("info"), drop: $("drop"), caption: $("caption"),
};
const state = { k: 24, maxUploadMb: 20, seq: 0, preview: null, canDescribe: false };
// uploaded files by history entry, so that back and forward can search by them again
const uploads = new Map();

// ------------------------------------------------------------------------------ rendering

function showError(message) {
  els.error.textContent = message;
  els.error.hidden = !message;
}

function setStatus(text) { els.status.textContent = text; }

function detailOf(body, response) {
  // {"detail": "..."} from the app; FastAPI's own validation gives a list of {loc, msg}
  const d = body && body.detail;
  if (typeof d === "string") return d;
  if (Array.isArray(d)) return d.map((e) => `${(e.loc || []).slice(1).join(".")}: ${e.msg}`).join("; ");
  return `${response.status} ${response.statusText || "error"}`;
}

function showQuery(text, imageUrl) {
  els.caption.hidden = true;
  els.chip.hidden = false;
  els.chipText.textContent = text;
  els.chipImage.hidden = !imageUrl;
  if (imageUrl) els.chipImage.src = imageUrl;
  else els.chipImage.removeAttribute("src");
}

function card(hit) {
  const el = document.createElement("button");
  el.type = "button";
  el.className = "card";
  el.dataset.key = hit.key;
  el.title = `More like ${hit.key}`;
  const figure = document.createElement("div");
  figure.className = "thumb";
  if (hit.thumbnail) {
    const img = document.createElement("img");
    img.loading = "lazy";
    img.decoding = "async";
    img.alt = hit.caption || hit.key;
    img.src = hit.thumbnail;
    // small synthetic images (toyworld) stay crisp when scaled up
    img.addEventListener("load", () => img.classList.toggle("pixelated", img.naturalWidth < 128));
    figure.append(img);
  } else {
    figure.classList.add("text-only");
    figure.textContent = "“" + (hit.caption || hit.key) + "”";
  }
  const meta = document.createElement("div");
  meta.className = "meta";
  const rank = document.createElement("span");
  rank.className = "rank";
  rank.textContent = `#${hit.rank}`;
  const score = document.createElement("span");
  score.className = "score";
  score.title = "cosine similarity";
  score.textContent = hit.score.toFixed(3);
  const bar = document.createElement("span");
  bar.className = "bar";
  const fill = document.createElement("span");
  fill.style.width = `${Math.max(0, Math.min(1, hit.score)) * 100}%`;
  bar.append(fill);
  meta.append(rank, bar, score);
  const caption = document.createElement("p");
  caption.className = "caption";
  caption.textContent = hit.caption;
  if (hit.language) caption.lang = hit.language;
  const key = document.createElement("p");
  key.className = "key";
  key.textContent = hit.key;
  el.append(figure, meta, caption, key);
  el.addEventListener("click", () => go({ like: hit.key }));
  return el;
}

function render(result, roundTripMs) {
  els.results.replaceChildren(...result.hits.map(card));
  els.results.classList.remove("loading");
  els.empty.hidden = true;
  const n = result.hits.length;
  const what = result.side ? ` ${result.side}${n === 1 ? "" : "s"}` : "";
  if (!n) return setStatus("No results.");
  setStatus(`${n}${what} · query ${result.latency_ms.toFixed(1)} ms` +
            ` · round trip ${roundTripMs.toFixed(0)} ms`);
}

// ------------------------------------------------------------------------------ requests

async function request(url, init) {
  const seq = ++state.seq;
  showError("");
  els.results.classList.add("loading");
  setStatus("Searching…");
  const t0 = performance.now();
  let response, body;
  try {
    response = await fetch(url, init);
    body = await response.json().catch(() => null);
  } catch (err) {
    if (seq === state.seq) fail(`The server did not answer (${err.message}).`);
    return;
  }
  if (seq !== state.seq) return;  // a newer search started meanwhile
  if (!response.ok) return fail(detailOf(body, response));
  render(body, performance.now() - t0);
}

function fail(message) {
  els.results.classList.remove("loading");
  els.results.replaceChildren();
  els.empty.hidden = true;
  setStatus("");
  showError(message);
}

function params(extra) {
  const p = new URLSearchParams(extra);
  if (els.lang.value) p.set("lang", els.lang.value);
  if (els.side.value) p.set("side", els.side.value);
  p.set("k", String(state.k));
  return p;
}

function searchText(q) {
  els.q.value = q;
  showQuery(`“${q}”`, null);
  return request(`api/search?${params({ q })}`);
}

function searchKey(key) {
  showQuery(`More like ${key}`, `api/thumb/${encodeURIComponent(key)}`);
  els.chipImage.onerror = () => { els.chipImage.hidden = true; };
  return request(`api/similar/${encodeURIComponent(key)}?${params({})}`);
}

function searchImage(file, fromHistory = false) {
  if (file.size > state.maxUploadMb * 1024 * 1024) {
    return fail(`${file.name} is ${(file.size / 1048576).toFixed(1)} MB: ` +
                `the limit is ${state.maxUploadMb} MB.`);
  }
  if (state.preview) URL.revokeObjectURL(state.preview);
  state.preview = URL.createObjectURL(file);
  showQuery(file.name, state.preview);
  els.q.value = "";
  if (!fromHistory) {
    const id = `${Date.now()}-${uploads.size}`;
    uploads.set(id, file);
    if (uploads.size > 20) uploads.delete(uploads.keys().next().value);
    history.pushState({ upload: id }, "", urlFor({}));
  }
  const form = new FormData();
  form.append("file", file);
  if (state.canDescribe) describeImage(file, state.seq + 1);
  return request(`api/search/image?${params({})}`, { method: "POST", body: form });
}

// "Describe this image": the server's run writes a caption for the upload (api/describe)
async function describeImage(file, seq) {
  els.caption.hidden = false;
  els.caption.textContent = "Describing…";
  const form = new FormData();
  form.append("file", file);
  const p = new URLSearchParams();
  if (els.lang.value) p.set("lang", els.lang.value);
  try {
    const response = await fetch(`api/describe?${p}`, { method: "POST", body: form });
    const body = await response.json().catch(() => null);
    if (seq !== state.seq) return;  // another search started meanwhile
    els.caption.textContent = response.ok ? `Described as “${body.text}”`
      : `Could not describe it: ${detailOf(body, response)}`;
  } catch (err) {
    if (seq === state.seq) els.caption.textContent = `Could not describe it (${err.message}).`;
  }
}

// ------------------------------------------------------------------------------ URL state

function urlFor(search) {
  const p = new URLSearchParams(search);
  if (els.lang.value) p.set("lang", els.lang.value);
  if (els.side.value) p.set("side", els.side.value);
  const qs = p.toString();
  return qs ? `?${qs}` : location.pathname;
}

function go(search) {  // a new search: into the history, then run it
  history.pushState(null, "", urlFor(search));
  window.scrollTo({ top: 0 });
  runFromUrl();
}

function runFromUrl() {
  const p = new URLSearchParams(location.search);
  for (const [name, el] of [["lang", els.lang], ["side", els.side]]) {
    const v = p.get(name) || "";
    el.value = [...el.options].some((o) => o.value === v) ? v : "";
  }
  const k = parseInt(p.get("k") || "", 10);
  if (k > 0) state.k = k;
  if (p.get("q")) return searchText(p.get("q"));
  if (p.get("like")) return searchKey(p.get("like"));
  const upload = history.state && uploads.get(history.state.upload);
  if (upload) return searchImage(upload, true);
  reset();
}

function reset() {
  state.seq++;
  els.q.value = "";
  els.chip.hidden = true;
  els.caption.hidden = true;
  els.results.replaceChildren();
  els.results.classList.remove("loading");
  els.empty.hidden = false;
  setStatus("");
  showError("");
}

// ------------------------------------------------------------------------------ setup

function fill(select, values, labels) {
  select.replaceChildren(...values.map((v, i) => new Option(labels[i], v)));
}

function describe(info) {
  // SearchIndex.info: index.json plus per side its vector count and languages
  const parts = [];
  if (info.items !== undefined) parts.push(`${info.items} items`);
  for (const [name, side] of Object.entries(info.sides || {})) {
    if (side.n !== undefined) parts.push(`${side.n} ${name} vectors`);
  }
  if (info.languages && info.languages.length) parts.push(`languages ${info.languages.join(", ")}`);
  if (info.checkpoint) parts.push(`model ${info.checkpoint}`);
  if (info.options && info.options.type) parts.push(`FAISS ${info.options.type}`);
  if (info.dim) parts.push(`${info.dim}-d`);
  return parts.join(" · ");
}

async function init() {
  try {
    const response = await fetch("api/health");
    const health = await response.json();
    const info = health.index || {};
    state.maxUploadMb = health.max_upload_mb || state.maxUploadMb;
    state.canDescribe = Boolean(health.can_describe);
    state.k = Math.min(state.k, health.max_k || state.k);
    // no language: the model's own for captions shown, every language on a text side
    const langs = info.languages || [];
    fill(els.lang, ["", ...langs], ["all languages", ...langs]);
    els.lang.hidden = langs.length === 0;
    const sides = Object.keys(info.sides || {});
    if (sides.length > 1) {
      fill(els.side, ["", ...sides], ["any side", ...sides.map((s) => `find ${s}s`)]);
      els.side.hidden = false;
    }
    els.info.textContent = describe(info);
  } catch (err) {
    showError(`Could not read the index's description (${err.message}).`);
  }
  runFromUrl();
}

els.form.addEventListener("submit", (event) => {
  event.preventDefault();
  const q = els.q.value.trim();
  if (!q) return showError("Type something to search for, or upload an image.");
  go({ q });
});
for (const el of [els.lang, els.side]) {
  // a new language or side re-runs the current search
  el.addEventListener("change", () => {
    const p = new URLSearchParams(location.search);
    const upload = history.state && uploads.get(history.state.upload);
    if (p.get("q")) go({ q: p.get("q") });
    else if (p.get("like")) go({ like: p.get("like") });
    else if (upload) {
      history.replaceState(history.state, "", urlFor({}));
      searchImage(upload, true);
    }
  });
}
els.file.addEventListener("change", () => {
  if (els.file.files.length) searchImage(els.file.files[0]);
  els.file.value = "";  // choosing the same file again searches again
});
els.clear.addEventListener("click", () => go({}));
window.addEventListener("popstate", runFromUrl);

// drag and drop anywhere on the page
let dragDepth = 0;
window.addEventListener("dragenter", (e) => {
  if (![...e.dataTransfer.types].includes("Files")) return;
  dragDepth++;
  els.drop.hidden = false;
});
window.addEventListener("dragleave", () => {
  if (--dragDepth <= 0) { dragDepth = 0; els.drop.hidden = true; }
});
window.addEventListener("dragover", (e) => e.preventDefault());
window.addEventListener("drop", (e) => {
  e.preventDefault();
  dragDepth = 0;
  els.drop.hidden = true;
  const file = e.dataTransfer.files[0];
  if (file) searchImage(file);
});

init();
