"""MkDocs hook: the notebooks in ``notebooks/`` become pages of the site.

The notebooks live at the top of the repository (the tests execute them there), outside
``docs/``; this hook adds each ``notebooks/*.ipynb`` to the site's files as
``notebooks/NAME.ipynb`` before mkdocs-jupyter turns notebooks into pages, so the nav
names them like any other page. mkdocs.yml lists this file under ``hooks:``.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


@event_priority(100)  # before mkdocs-jupyter's own on_files (priority 0)
def on_files(files, config):
    """Add every notebook, keyed ``notebooks/NAME.ipynb`` with its source in the repository."""
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        files.append(File(f"notebooks/{path.name}", src_dir=str(ROOT),
                          dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files
