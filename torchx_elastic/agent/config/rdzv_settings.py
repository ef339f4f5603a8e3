"""``--rdzv-conf``, parsed once into what the agent reads of it.

``rdzv_conf.py`` checked every key a backend reads and its value first (a bad one is a usage
error); this is the typed result the agent's layers read: the heartbeats, the last call, the
timeouts, which c10d handler runs, whether this node hosts the store, a static node's rank.
torch's handlers still take the raw settings (``RendezvousParameters(**conf)``):
:meth:`RendezvousSettings.torch_conf`, with the agent's keep-alive defaults.

Defaults where ``--rdzv-conf`` gives none (torch's are 5 s x 3 and a 30 s last call): a
heartbeat every 2 s, a node dead after 5 missed ones (10 s), a 30 s last call for the first
round and 3 s for the rounds after it, when the nodes that re-form are already there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

KEEP_ALIVE_DEFAULTS = {"keep_alive_interval": "2", "keep_alive_max_attempt": "5"}
LAST_CALL_KEY = "last_call_timeout"
FIRST_LAST_CALL_S = 30.0  # torch's default last call (DynamicRendezvousHandler)
REFORM_LAST_CALL_S = 3.0
DEFAULT_JOIN_TIMEOUT_S = 600.0
DEFAULT_READ_TIMEOUT_S = 60.0
RDZV_TIMEOUT_S = 900  # torch's LaunchConfig.rdzv_configs["timeout"] default (static)
# how long the agent hosting the rendezvous keeps it up, closed, after an elastic job that
# ran with fewer than its maximum of nodes succeeded: a node that arrives meanwhile learns
# that the job has finished (--rdzv-conf finished_grace_s=SECONDS)
FINISHED_GRACE_KEY = "finished_grace_s"
DEFAULT_FINISHED_GRACE_S = 12.0
# --rdzv-conf handler=torch: torch's own c10d rendezvous, untouched, instead of the agent's
# (rounds/handler.py); so does liveness=state (torch's heartbeats are in its state)
HANDLER_KEY = "handler"
TORCH_HANDLER = "torch"
LIVENESS_KEY = "liveness"
_TRUE = ("1", "true", "t", "yes", "y")


@dataclasses.dataclass(frozen=True)
class RendezvousSettings:
    """See the module's docstring. ``conf``: the settings as given."""

    conf: Mapping[str, Any]
    keep_alive_interval_s: float
    keep_alive_max_attempt: int
    first_last_call_s: float
    """How long a first round that has its minimum waits for more nodes."""
    reform_last_call_s: float
    """The same for the rounds after the first (a re-form, a new member)."""
    join_timeout_s: float
    read_timeout_s: float
    store_type: str
    torch_handler: bool
    """``handler=torch`` or ``liveness=state``: torch's own c10d handler, untouched."""
    is_host: bool | None
    """Given: whether this node hosts the store; None: the endpoint decides."""
    static_rank: int | None
    static_timeout_s: float
    finished_grace_s: float

    @classmethod
    def parse(cls, conf: Mapping[str, Any]) -> RendezvousSettings:
        def seconds(key: str, default: float) -> float:
            try:  # a key the backend does not read is not checked: its default stands
                return float(conf[key]) if key in conf else default
            except (TypeError, ValueError):
                return default

        given = {**KEEP_ALIVE_DEFAULTS, **conf}
        is_host = conf.get("is_host")
        handler = str(conf.get(HANDLER_KEY, "")).strip().lower()
        liveness = str(conf.get(LIVENESS_KEY, "keys")).strip().lower()
        return cls(
            conf=dict(conf),
            keep_alive_interval_s=float(given["keep_alive_interval"]),
            keep_alive_max_attempt=int(given["keep_alive_max_attempt"]),
            first_last_call_s=seconds(LAST_CALL_KEY, FIRST_LAST_CALL_S),
            reform_last_call_s=seconds(LAST_CALL_KEY, REFORM_LAST_CALL_S),
            join_timeout_s=seconds("join_timeout", DEFAULT_JOIN_TIMEOUT_S),
            read_timeout_s=seconds("read_timeout", DEFAULT_READ_TIMEOUT_S),
            store_type=str(conf.get("store_type", "tcp")).strip().lower(),
            torch_handler=handler == TORCH_HANDLER or liveness == "state",
            is_host=None if is_host is None else str(is_host).strip().lower() in _TRUE,
            static_rank=int(conf["rank"]) if "rank" in conf else None,
            static_timeout_s=seconds("timeout", RDZV_TIMEOUT_S),
            finished_grace_s=seconds(FINISHED_GRACE_KEY, DEFAULT_FINISHED_GRACE_S),
        )

    @property
    def dead_after_s(self) -> float:
        """How long a node may miss heartbeats before its watchers say it dead."""
        return self.keep_alive_interval_s * self.keep_alive_max_attempt

    def liveness_mode(self, backend: str) -> str:
        """``keys`` or ``state``: who keeps a node's heartbeats (the keyed liveness of the
        agent's own rendezvous on c10d; torch's, in its state, under ``handler=torch``).
        Every node says it in the roll call, so that nodes of both kinds are named at once."""
        return "keys" if backend == "c10d" and not self.torch_handler else "state"

    def torch_conf(self) -> dict[str, Any]:
        """The settings for torch's ``RendezvousParameters``: as given, with the agent's
        keep-alive defaults where none is given."""
        return {**KEEP_ALIVE_DEFAULTS, **self.conf}
