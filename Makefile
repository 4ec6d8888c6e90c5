# The two commands of the README: `make demo` and `make test`. Both create .venv and install
# mmptm (with its pinned PyTorch stack) on first use, so they work on a fresh machine.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install browser emoji-packages demo test test-slow lint format bench docs docs-build clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mmptm demo

# The search page's browser test drives Debian's Chromium (Playwright's own download does not
# work offline): install it when it is missing and this machine can (root, apt-get). Elsewhere
# the test fails and says how to install it or where to point MMPTM_CHROMIUM.
browser:
	@command -v chromium >/dev/null || test -n "$$MMPTM_CHROMIUM" || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium for the browser test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			chromium chromium-driver >/dev/null; \
	else \
		echo "no chromium: the browser test will fail (apt-get install chromium, or set MMPTM_CHROMIUM)"; \
	fi

# The real image–text benchmark's data test renders emoji from two Debian packages
# (benchmarks/real_vl_data.py): install them when missing and this machine can (else the test
# is skipped and says so).
emoji-packages:
	@test -e /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf && \
		test -d /usr/share/unicode/cldr/common/annotations || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's fonts-noto-color-emoji unicode-cldr-core for the emoji test"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			fonts-noto-color-emoji unicode-cldr-core >/dev/null) || \
		echo "could not install them: the emoji rendering test is skipped"; \
	fi

test: $(STAMP) browser emoji-packages
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(MAKE) --no-print-directory docs-build
	$(VENV)/bin/pytest -q -m "not slow"

# The end-to-end runs marked slow (studies at toy size, the wheel, torchrun, the GPU check's
# smoke run): minutes more; CI runs them after `make test` (.ci/run).
test-slow: $(STAMP) browser emoji-packages
	$(VENV)/bin/pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff check --fix . && $(VENV)/bin/ruff format .

bench: $(STAMP)
	$(PY) benchmarks/bench_pretrain.py

# The documentation site (mkdocs.yml, docs/): `docs` builds it and serves it with live reload at
# http://127.0.0.1:8000; `docs-build` builds it strictly into site/ (a warning, e.g. a broken
# link or a page missing from the nav, is an error), offline. The two variables silence the
# banners MkDocs plug-ins print about a future MkDocs 2.
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true

docs: $(STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve

docs-build: $(STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict --clean --site-dir site

clean:
	rm -rf runs site .pytest_cache .ruff_cache
