"""``--rdzv-conf KEY=VALUE,...``: torchrun's acceptance, with the mistakes said out loud.

torchrun hands every setting to the rendezvous backend (``RendezvousParameters(**configs)``)
and each backend reads the keys it knows: a key it does not read is ignored, whatever its
value. torch's own launcher test passes ``--rdzv-conf='join_timeout=5,last_call_timeout=1,
timeout=5'`` with the quotes as part of the text: the keys are ``'join_timeout`` and
``timeout`` (value ``5'``), neither read by the c10d backend, so torchrun runs with the
default join timeout. The agent takes the same settings, and names the ignored keys in one
warning line; the values of the keys that are read are checked before the rendezvous.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

# keys this agent reads itself, whatever the backend: the wait for the rank-0 host and the
# waiting line (join_timeout), the lost-peer watch (keep_alive_*), the closed rendezvous kept
# for late nodes (finished_grace_s)
AGENT_KEYS = frozenset(
    {"join_timeout", "keep_alive_interval", "keep_alive_max_attempt", "finished_grace_s"}
)
# torch's dynamic rendezvous (c10d, etcd-v2); cas_backoff_max_seconds: torch 2.15+
_DYNAMIC = frozenset(
    {"last_call_timeout", "close_timeout", "heartbeat_timeout", "cas_backoff_max_seconds"}
)
# keys torch's rendezvous backends read (RendezvousParameters.get* in
# torch/distributed/elastic/rendezvous/*); a backend not named here may read anything
BACKEND_KEYS: dict[str, frozenset[str]] = {
    # liveness, handler: the agent's, on c10d only (rendezvous/keyed_liveness.py,
    # rendezvous/parameters.py)
    "c10d": _DYNAMIC | {"read_timeout", "is_host", "store_type", "liveness", "handler"},
    "static": frozenset({"rank", "timeout"}),
    "etcd": frozenset(
        {"timeout", "last_call_timeout", "protocol", "cert", "key", "cacert", "etcd_prefix"}
    ),
    "etcd-v2": _DYNAMIC | {"read_timeout", "protocol", "ssl_cert", "ssl_cert_key", "ca_cert"},
}

# what torch's rendezvous handlers accept for the settings they read
_WHOLE_SECONDS = (
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "read_timeout",
    "keep_alive_interval",
    "timeout",
)
_BOOLEANS = ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n")
# liveness: torch's heartbeats in its state, or a key per node (rendezvous/keyed_liveness.py);
# handler: the agent's own rendezvous, or torch's untouched (rendezvous/parameters.py)
_CHOICES = {
    "store_type": ("tcp", "file"),
    "liveness": ("state", "keys"),
    "handler": ("agent", "torch"),
}


def value_problem(key: str, value: str) -> str | None:
    """What is wrong with one setting a backend reads; None when torch accepts it."""
    if key in _WHOLE_SECONDS and not (value.isdigit() and int(value) > 0):
        return f"a whole number of seconds > 0 (e.g. {key}=600)"
    if key == "keep_alive_max_attempt" and not (value.isdigit() and int(value) > 0):
        return "a whole number > 0 (e.g. keep_alive_max_attempt=3)"
    if key == "rank" and not value.isdigit():
        return "a whole number >= 0 (this node's rank, static rendezvous)"
    if key == "is_host" and value.lower() not in _BOOLEANS:
        return "true or false"
    if key in _CHOICES and value.lower() not in _CHOICES[key]:
        return " or ".join(_CHOICES[key])
    return None


def parse(text: str) -> dict[str, str]:
    """The settings as torch's ``_parse_rendezvous_config`` splits them: ``ValueError`` for an
    item that is not KEY=VALUE or has no value."""
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--rdzv-conf item {item!r} is not KEY=VALUE (e.g. join_timeout=600)")
        if not value.strip():
            raise ValueError(
                f"--rdzv-conf item {item!r} has no value after '=' (e.g. join_timeout=600)"
            )
        conf[key.strip()] = value.strip()
    return conf


def read_keys(backend: str) -> frozenset[str] | None:
    """The keys ``backend`` (and this agent) read; None for a backend of another package."""
    keys = BACKEND_KEYS.get(backend)
    return None if keys is None else keys | AGENT_KEYS


def check(backend: str, conf: dict[str, str]) -> None:
    """Every bad value of a key ``backend`` reads: one line each of the ``ValueError``. The
    keys it does not read: one warning line (torchrun ignores them without a word)."""
    keys = read_keys(backend)
    problems = []
    for key, value in conf.items():
        accepted = None if keys is not None and key not in keys else value_problem(key, value)
        if accepted is not None:
            problems.append(f"--rdzv-conf {key}={value!r}: {key} must be {accepted}")
    if problems:
        raise ValueError("\n".join(problems))
    ignored = [key for key in conf if keys is not None and key not in keys]
    if ignored and keys is not None:
        log.warning(
            "--rdzv-conf %s: the %s rendezvous does not read %s, so %s ignored (as torchrun"
            " ignores %s); it reads %s",
            ", ".join(repr(key) for key in ignored),
            backend,
            "this setting" if len(ignored) == 1 else "these settings",
            "it is" if len(ignored) == 1 else "they are",
            "it" if len(ignored) == 1 else "them",
            ", ".join(sorted(keys)),
        )
