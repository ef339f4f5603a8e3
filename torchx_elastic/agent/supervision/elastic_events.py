"""torchrun's ``--event-log-handler``: the agent's end as a ``torch.distributed.elastic``
event, sent to the named handler.

As torch's launcher (``launcher/api.py``): when the agent's run returns, whatever the workers
did, ``torchelastic.worker.status.SUCCEEDED``; when it ends by a signal or a rendezvous
error, ``torchelastic.worker.status.FAILED`` with the error. The handler is one registered
in ``torch.distributed.elastic.events.handlers`` (``null``, the default: dropped; ``console``:
logged to stderr); :func:`check_handler` refuses any other name before the job starts
(torchrun finds out only at the end, with a ``KeyError``).
"""

from __future__ import annotations

import json
import socket

from torch.distributed.elastic.events import record
from torch.distributed.elastic.events.api import Event, EventSource
from torch.distributed.elastic.events.handlers import get_logging_handler

from torchx_elastic.agent import compat
from torchx_elastic.agent.config.launch import AgentConfig, UsageError

KNOWN_HANDLERS = ("null", "console")  # torch's, for the message: the registry may hold more


def check_handler(name: str) -> str:
    """``name`` if torch knows a handler of that name; :class:`UsageError` otherwise."""
    try:
        get_logging_handler(name)
    except KeyError:
        raise UsageError(
            f"--event-log-handler {name!r} is not a handler registered in"
            f" torch.distributed.elastic.events.handlers (e.g. {', '.join(KNOWN_HANDLERS)})"
        ) from None
    return name


def agent_end_event(
    config: AgentConfig,
    last_round: compat.Round | None,
    restarts: int,
    run_time_s: float,
    error: str | None,
) -> Event:
    """The event torch's agent builds (``_construct_event``) at its end, from our facts."""
    state = "SUCCEEDED" if error is None else "FAILED"
    metadata: dict[str, str | int | float | bool | None] = {
        "run_id": config.run_id,
        "global_rank": None,
        "group_rank": None if last_round is None else last_round.rank,
        "worker_id": None,
        "role": config.role,
        "hostname": socket.getfqdn(socket.gethostname()),
        "state": state,
        "total_run_time": int(run_time_s),
        "rdzv_backend": config.rdzv_backend,
        "raw_error": error,
        "metadata": json.dumps(
            {
                "group_world_size": None if last_round is None else last_round.world_size,
                "entry_point": config.worker.entrypoint,
            }
        ),
        "agent_restarts": restarts,
        "duration_ms": None,
    }
    return Event(f"torchelastic.worker.status.{state}", EventSource.AGENT, metadata=metadata)


def record_agent_end(
    config: AgentConfig,
    last_round: compat.Round | None,
    restarts: int,
    run_time_s: float,
    error: str | None,
) -> None:
    """Send the agent's end to ``config.event_log_handler``."""
    event = agent_end_event(config, last_round, restarts, run_time_s, error)
    record(event, config.event_log_handler)
