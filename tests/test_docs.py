"""The documentation: the README stays a front page, the site names files that exist, and the
site builds strictly (a broken link or anchor, or a page outside the nav, fails)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
#: a file of the repository named in the docs (not a link between pages): `mmptm/...py`, ...
NAMED_FILE = re.compile(r"(?<![\w/.(-])((?:mmptm|tests|benchmarks)/[\w/.-]*\w\.(?:py|md|yaml))")


def test_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/"
    text = "\n".join(lines)
    assert "make demo" in text and "make test" in text


def test_named_files_exist() -> None:
    missing = [
        f"{page.relative_to(ROOT)}: {name}"
        for page in PAGES
        for name in sorted(set(NAMED_FILE.findall(page.read_text(encoding="utf-8"))))
        if not (ROOT / name).exists()
    ]
    assert not missing, "the docs name files that do not exist:\n" + "\n".join(missing)


def test_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        mkdocs = Path(shutil.which("mkdocs") or "mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    site = tmp_path / "site"
    # generated pages are there and filled in: no marker is left unexpanded
    for page in ("parts/index.html", "recipes/index.html", "benchmarks/results/index.html"):
        assert (site / page).is_file(), page
    for html in site.rglob("*.html"):
        assert "<!-- results:" not in html.read_text(encoding="utf-8"), html
