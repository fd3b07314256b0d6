"""The documentation site's configuration (mkdocs.yml) covers every page and notebook.

CI builds the site with ``mkdocs build --strict`` (.ci/run), which also checks every link
and anchor; these checks run without MkDocs installed, so a page left out of the nav
shows up in the test suite first.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"


def _nav_targets(items) -> list[str]:
    targets = []
    for item in items:
        if isinstance(item, str):
            targets.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                targets.extend(_nav_targets(value) if isinstance(value, list) else [value])
    return targets


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def test_nav_lists_every_page_and_notebook_once(config):
    nav = _nav_targets(config["nav"])
    assert len(nav) == len(set(nav)), sorted(t for t in nav if nav.count(t) > 1)
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    notebooks = {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert set(nav) == pages | notebooks
    assert nav[0] == "index.md"  # the home page


def test_the_api_reference_covers_the_public_api():
    text = " ".join(p.read_text(encoding="utf-8") for p in (DOCS / "reference").glob("*.md"))
    for name in ("llmsim.load_scenario", "llmsim.simulate", "llmsim.Result",
                 "llmsim.search.search", "llmsim.specs.scenario", "llmsim.UserError"):
        assert f"::: {name}\n" in text, name


def test_the_hook_adds_every_notebook_as_a_page_source(tmp_path):
    pytest.importorskip("mkdocs")
    from mkdocs.structure.files import Files

    spec = importlib.util.spec_from_file_location("notebooks_hook", DOCS / "hooks/notebooks.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    files = hook.on_files(Files([]), {"site_dir": str(tmp_path), "use_directory_urls": True})
    by_uri = {f.src_uri: f for f in files}
    assert set(by_uri) == {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    quickstart = by_uri["notebooks/quickstart.ipynb"]
    assert Path(quickstart.abs_src_path) == ROOT / "notebooks" / "quickstart.ipynb"
    assert quickstart.dest_uri == "notebooks/quickstart.ipynb"


def test_docstrings_read_as_markdown_in_the_reference():
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("docstrings_hook", DOCS / "hooks/docstrings.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    text = ("See :func:`llmsim.plots.plot_timeline` and :mod:`.store`.\n\n"
            ">>> import llmsim\n>>> for x in y:\n...     pass\nafter")
    assert hook.markdown_docstring(text) == (
        "See `llmsim.plots.plot_timeline` and `.store`.\n\n"
        "```pycon\n>>> import llmsim\n>>> for x in y:\n...     pass\n```\nafter")
    assert hook.markdown_docstring(">>> a") == "```pycon\n>>> a\n```"
    assert hook.markdown_docstring("no roles, ``code``") == "no roles, ``code``"
