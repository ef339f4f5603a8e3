"""This host's network interfaces against the rendezvous traffic's: what the doctor checks
(agent/doctor.py) and what the agent warns about before its rendezvous.

The interface the rendezvous traffic leaves through, gloo's own choice where
``GLOO_SOCKET_IFNAME`` is unset (the first address of this host's name), and the interfaces
``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` name: one :class:`Check` each.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass

from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous import listen
from torchx_elastic.agent.rendezvous.diagnosis import say

_SIOCGIFADDR = 0x8915
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class Check:
    """One check's verdict and what it found, as the doctor prints it."""

    ok: bool
    text: str

    def line(self) -> str:
        return f"  {'ok  ' if self.ok else 'FAIL'} {self.text}"


def interface_addresses() -> dict[str, str]:
    """Interface name -> its IPv4 address (interfaces without one are left out)."""
    found: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue
            found[name] = socket.inet_ntoa(reply[20:24])
    return found


def route_address(host: str, port: int) -> str | None:
    """This host's address that traffic to ``host`` leaves from (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, port))
            return str(sock.getsockname()[0])
    except OSError:
        return None


def interface_checks(config: AgentConfig) -> list[Check]:
    """The interfaces of this host, the one the rendezvous traffic leaves through, and
    whether gloo's and NCCL's choice of interface matches it."""
    interfaces = interface_addresses()
    endpoint = config.rdzv_endpoint
    route = route_address(endpoint.host, endpoint.port)
    used = next((name for name, addr in interfaces.items() if addr == route), None)
    listing = ", ".join(f"{name} {addr}" for name, addr in sorted(interfaces.items()))
    checks = [Check(True, f"interfaces: {listing or 'none with IPv4'}")]
    if used is not None:
        checks.append(Check(True, f"rendezvous traffic to {endpoint.host} leaves through {used}"))
    gloo_default = gloo_default_check(config, interfaces, used)
    if gloo_default is not None:
        checks.append(gloo_default)
    for variable in IFNAME_VARIABLES:
        wanted = os.environ.get(variable)
        if wanted is not None:
            checks.append(ifname_check(variable, wanted, interfaces, used, endpoint.host))
    return checks


def ifname_check(
    variable: str, wanted: str, interfaces: dict[str, str], used: str | None, host: str
) -> Check:
    """``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` set to ``wanted``: interfaces this host
    has, and the one the rendezvous traffic to ``host`` leaves through (``used``)."""
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    missing = [n for n in names if n not in interfaces]
    if missing:
        return Check(
            False,
            f"{variable}={wanted}: no interface {', '.join(missing)} on this"
            f" host (it has {', '.join(sorted(interfaces))})",
        )
    if used is not None and used not in names and not used.startswith("lo"):
        return Check(
            False,
            f"{variable}={wanted}, but the rendezvous traffic to {host} leaves"
            f" through {used}: the workers may not reach their peers; set"
            f" {variable}={used}",
        )
    return Check(True, f"{variable}={wanted}")


def hostname_addresses(name: str) -> list[str]:
    """The addresses ``name`` resolves to, in the resolver's order ([] when it does not)."""
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def gloo_default_check(
    config: AgentConfig, interfaces: dict[str, str], used: str | None
) -> Check | None:
    """Where gloo binds the workers when ``GLOO_SOCKET_IFNAME`` is unset: the first address
    of this host's name (the loopback address when the name does not resolve), which
    Debian's ``/etc/hosts`` maps to 127.0.1.1. None for a job on this host alone."""
    if "GLOO_SOCKET_IFNAME" in os.environ or listen.is_loopback_host(config.rdzv_endpoint.host):
        return None
    name = socket.gethostname()
    addrs = hostname_addresses(name)
    host = config.rdzv_endpoint.host
    fix = (
        f"set GLOO_SOCKET_IFNAME={used}"
        if used
        else "set GLOO_SOCKET_IFNAME to the interface that reaches the other hosts"
    )
    first = addrs[0] if addrs else "127.0.0.1"
    if first.startswith("127.") or first == "::1":
        resolves = f"resolves to {', '.join(addrs)}" if addrs else "does not resolve"
        return Check(
            False,
            f"GLOO_SOCKET_IFNAME is unset and this host's name {name!r} {resolves}: gloo"
            f" binds the workers to {first}, a loopback address the other hosts cannot reach;"
            f" {fix}",
        )
    iface = next((n for n, a in interfaces.items() if a == first), None)
    if used is not None and iface is not None and iface != used:
        return Check(
            False,
            f"GLOO_SOCKET_IFNAME is unset: gloo binds the workers to {name!r} = {first} on"
            f" {iface}, but the rendezvous traffic to {host} leaves through {used}: the"
            f" workers may not reach their peers; {fix}",
        )
    on = f" on {iface}" if iface else ""
    return Check(
        True, f"GLOO_SOCKET_IFNAME is unset: gloo binds the workers to {name!r} = {first}{on}"
    )


def say_interface_problems(config: AgentConfig) -> None:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME that name a missing interface, or another
    than the one the rendezvous traffic leaves through (the doctor's checks), said once."""
    for check in interface_checks(config):
        if not check.ok:
            say(f"warning: {check.text}")
