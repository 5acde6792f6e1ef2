"""The documentation site (docs/, mkdocs.yml) builds with ``mkdocs build --strict``, and the README stays short."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mkdocs() -> list[str]:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as e:
        pytest.skip(f"the docs extra is not installed ({e.name}): pip install -e '.[docs]'")
    return [sys.executable, "-m", "mkdocs"]


def test_the_docs_site_builds_strictly(tmp_path):
    """Every page in the nav, every link and anchor resolves and every API reference entry renders: a warning fails
    the build (``strict: true`` in mkdocs.yml, and ``--strict`` here)."""
    site = tmp_path / "site"
    done = subprocess.run([*_mkdocs(), "build", "--strict", "--site-dir", str(site)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin",
                                                       "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-4000:]
    reference = (site / "reference" / "index.html").read_text()
    for name in ("models.load.load_model", "inspect.capture.attention_maps", "inspect.distance.mean_attention_distance",
                 "probe.linear.few_shot_accuracy"):
        assert f'id="vitlab.{name}"' in reference, name
    shutil.rmtree(site)


def test_every_docs_page_is_in_the_nav():
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = {page for entry in nav for page in entry.values()}
    assert listed == {p.name for p in (ROOT / "docs").glob("*.md")}


def test_the_readme_is_short_and_links_pages_that_exist():
    """The README is a first page (about 150 lines, no paragraph over 1,000 characters); the rest is in docs/."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if not p.lstrip().startswith(("```", "-", "|"))]
    assert max(len(p) for p in paragraphs) <= 1000
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link
