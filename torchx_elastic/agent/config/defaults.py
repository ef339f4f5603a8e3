"""torch's defaults that the agent's configuration takes and that must be read before torch
is imported: the agent installs its stop-signal handlers first thing (a node stopped while it
imports torch exits in one line), so this module imports nothing.
"""

from __future__ import annotations

DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torch's TORCHELASTIC_SIGNALS_TO_HANDLE
