"""Where the agent's stores listen: only on the address their peers use.

torch's ``TCPStore`` listens on every interface whatever host name it is given, unless it is
handed a socket the caller bound (``master_listen_fd``). A job whose nodes reach the rank-0
node through a loopback address (local_cwd, ``--standalone``, every agent on one host) has
its stores on that loopback address; a multi-host job on the local address its peers reach
(the rendezvous host's, else this host's name's), and on every interface only when no local
address can be found (said in the agent's log). The workers of a single-host job get gloo's
``GLOO_SOCKET_IFNAME`` set to the loopback interface (unless it is set already), so their
process groups listen there too.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket

from torchx_elastic.agent import compat

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def _addresses(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    found = [str(info[4][0]) for info in infos]
    return sorted(set(found), key=lambda addr: (":" in addr, found.index(addr)))  # IPv4 first


def _is_loopback(addr: str) -> bool:
    return ipaddress.ip_address(addr.split("%")[0]).is_loopback


def is_loopback_host(host: str) -> bool:
    """Every address of ``host`` is a loopback one (so every node runs on this host)."""
    addrs = _addresses(host)
    return bool(addrs) and all(_is_loopback(addr) for addr in addrs)


def loopback_worker_env() -> dict[str, str]:
    """What the workers of a single-host job need to listen on loopback only."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return {}
    names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
    return {"GLOO_SOCKET_IFNAME": names[0]} if names else {}


def _bindable(addr: str) -> bool:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((addr, 0))
        except OSError:
            return False
    return True


def local_address(host: str) -> str | None:
    """The address of this host that peers reaching it as ``host`` use; None: unknown."""
    addrs = _addresses(host)
    if addrs and all(_is_loopback(addr) for addr in addrs):
        return addrs[0]
    for addr in addrs:
        if _bindable(addr):
            return addr
    for addr in _addresses(socket.gethostname()):
        if not _is_loopback(addr) and _bindable(addr):
            return addr
    return None


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on ``port`` at ``host``'s local address (``OSError`` when taken)."""
    addr = local_address(host)
    if addr is None:
        log.warning("no local address of %r found: the store listens on every interface", host)
        addr = "::" if socket.has_ipv6 else "0.0.0.0"  # noqa: S104 (the documented fallback)
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore's own
        sock.bind((addr, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def hosted_store(host: str, port: int, timeout_s: float, multi_tenant: bool = False) -> object:
    """A ``TCPStore`` server for peers that reach it at ``host:port`` (port 0: a free one),
    listening there only."""
    sock = listening_socket(host, port)
    addr, bound_port = sock.getsockname()[:2]
    return compat.tcp_store_on_socket(
        sock,
        str(addr),
        int(bound_port),
        timeout=datetime.timedelta(seconds=timeout_s),
        multi_tenant=multi_tenant,
    )
