"""Sphinx configuration of the documentation site (``make docs``).

The pages are Markdown (MyST), the same files GitHub shows; the reference pages are
generated from the code by ``_ext/generated.py`` (the agent's flags, the environment
variables, the files and events a job writes, the benchmarks' figures) and by autodoc (the
components' parameters, from their docstrings). Warnings fail the build (``-W``).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))

import torchx_elastic  # noqa: E402

project = "torchx-elastic"
author = "the torchx-elastic authors"
copyright = "the torchx-elastic authors"  # noqa: A001
version = release = torchx_elastic.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "generated",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
highlight_language = "none"
smartquotes = False  # flags keep their two hyphens
html_theme = "alabaster"
html_theme_options = {"page_width": "1240px", "sidebar_width": "240px"}
html_title = f"torchx-elastic {release}"
html_static_path: list[str] = []

# the components' docstrings (Google style, as torchx's): parameters from "Args:"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"

# every reference must resolve (-n), except to classes of other projects, whose inventories
# are not fetched (the build reads nothing from the network)
nitpicky = True
nitpick_ignore_regex = [
    ("py:class", r"(torchx|torch|typing|collections)\..*"),
    ("py:class", r"(AppDef|Optional|Dict|List|str|int|float|bool)"),
]
