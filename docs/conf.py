"""Sphinx configuration of the documentation site (``make docs``).

The pages are the Markdown files under ``docs/`` (MyST), the tutorials are sphinx-gallery
scripts under ``docs/tutorials/`` executed by the build, and the API and CLI references are
generated from ``pipeline.__all__`` and ``flows.cli.app.build_parser``
(``docs/_ext/dpmm_docs.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# the checkout's packages, not an installed copy, and the site's own directives
sys.path[:0] = [str(ROOT), str(HERE / "_ext")]
# the tutorials start Prefect flows: no telemetry (no network here), no window for matplotlib
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
# the tutorials' dataset stores stay with the build (reused by the next one), not in ~/.cache
os.environ.setdefault("DPMM_DATA_DIR", str(HERE / "_build" / "datasets"))

project = "dpmm-pipeline"
author = "the dpmm-pipeline authors"
copyright = "2026, the dpmm-pipeline authors"
# "--out" stays two hyphens and quotes stay straight: the pages quote commands and help text
smartquotes = False
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "sphinxarg.ext",
    "dpmm_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "tutorials/GALLERY_HEADER.rst"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
# a Markdown page may link another page's file (``[usage](usage.md)``), as on GitHub
suppress_warnings = ["myst.header"]

autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"members": True, "inherited-members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
# numpydoc's own checks are the reviewers'; the build fails only on what Sphinx cannot render
numpydoc_validation_checks: set[str] = set()

sphinx_gallery_conf = {
    "examples_dirs": ["tutorials"],
    "gallery_dirs": ["auto_tutorials"],
    "filename_pattern": r"/plot_",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "show_memory": False,
    "min_reported_time": 0,
    # a tutorial that raises fails the build (never a page showing a traceback)
    "abort_on_example_error": True,
    "reset_modules": ("matplotlib",),
}

html_theme = "pydata_sphinx_theme"
html_title = "dpmm-pipeline"
html_static_path: list[str] = []
html_show_sourcelink = False
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_align": "left",
    "footer_start": ["copyright"],
    "footer_end": [],
    "secondary_sidebar_items": ["page-toc"],
}
