"""Build-time metadata: the dependencies and entry points of the torchx line an install is for.

``TORCHX_ELASTIC_TORCHX_LINE`` (``0.7``, the default, or ``dev`` for torchx's development line,
the ``torchx-nightly`` package) picks one of ``[tool.hatch.metadata.hooks.custom.torchx-lines]``
in pyproject.toml: its torchx requirement joins the common dependencies, and its entry points
are the package's. Both lines ship the same code; only what torchx reads to find it differs.
"""

from __future__ import annotations

import os
from typing import Any, Dict

from hatchling.metadata.plugin.interface import MetadataHookInterface

LINE_ENV = "TORCHX_ELASTIC_TORCHX_LINE"
DEFAULT_LINE = "0.7"


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: Dict[str, Any]) -> None:
        lines: Dict[str, Any] = self.config["torchx-lines"]
        line = os.environ.get(LINE_ENV, DEFAULT_LINE)
        if line not in lines:
            raise ValueError(
                f"{LINE_ENV}={line!r} is not a torchx line this package is built for;"
                f" accepted: {', '.join(lines)} (default: {DEFAULT_LINE})"
            )
        chosen = lines[line]
        metadata["dependencies"] = [*self.config["dependencies"], chosen["requirement"]]
        metadata["entry-points"] = chosen.get("entry-points", {})
