"""``python -m torchx_elastic.agent.doctor [torchrun flags] [SCRIPT ...]``: what would fail.

Run on each host before a long job, with the job's own command line (the script is not
run): it resolves and connects to the rendezvous endpoint (or, on the host that serves it,
checks that the port is free), checks the address this node publishes to its peers and the
network interfaces gloo and NCCL would use (gloo's own choice too, where
``GLOO_SOCKET_IFNAME`` is unset), and prints one line per check, in one screen.
Exit status 0 when nothing would fail, 1 otherwise.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys
from dataclasses import dataclass

from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous import diagnosis, listen

STORE_ANSWER_S = 5.0
_SIOCGIFADDR = 0x8915
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class Check:
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


def endpoint_checks(config: AgentConfig, hosting: bool) -> list[Check]:
    endpoint = config.rdzv_endpoint
    try:
        addrs = sorted({str(i[4][0]) for i in socket.getaddrinfo(endpoint.host, endpoint.port)})
    except (socket.gaierror, UnicodeError) as err:
        return [Check(False, diagnosis.unresolvable(endpoint, err).line())]
    checks = [Check(True, f"{endpoint.host} resolves to {', '.join(addrs)}")]
    if hosting:
        try:
            listen.listening_socket(endpoint.host, endpoint.port).close()
        except OSError:
            return [*checks, Check(False, diagnosis.port_taken(endpoint).line())]
        return [
            *checks,
            Check(True, f"this host serves the rendezvous: port {endpoint.port} is free"),
        ]
    problem = diagnosis.probe(endpoint)
    if problem is not None:
        return [*checks, Check(False, problem.line())]
    return [*checks, store_check(endpoint)]


def store_check(endpoint: Endpoint) -> Check:
    import datetime

    from torch.distributed import TCPStore  # type: ignore[attr-defined]
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError

    try:
        diagnosis.store_client(
            lambda: TCPStore(
                endpoint.host,
                endpoint.port,
                is_master=False,
                timeout=datetime.timedelta(seconds=2 * STORE_ANSWER_S),  # the answer decides
            ),
            endpoint,
            STORE_ANSWER_S,
            report=lambda _: None,  # the check's FAIL line says it
        )
    except diagnosis.RendezvousDiagnosis as err:
        return Check(False, err.problem.line())
    except (RuntimeError, OSError, RendezvousConnectionError) as err:
        return Check(False, f"{endpoint} does not answer as a store: {err}")
    return Check(True, f"{endpoint} answers as a rendezvous store")


def published_address_check(config: AgentConfig) -> Check:
    addr = config.local_addr or socket.getfqdn()
    source = "--local-addr" if config.local_addr else "socket.getfqdn(), torch's default"
    fix = "; set --local-addr to an address the other nodes reach"
    try:
        resolved = sorted({str(i[4][0]) for i in socket.getaddrinfo(addr, None)})
    except (socket.gaierror, UnicodeError):
        return Check(False, f"this node publishes {addr!r} ({source}), which does not resolve{fix}")
    remote = not listen.is_loopback_host(config.rdzv_endpoint.host)
    if remote and all(a.startswith("127.") or a == "::1" for a in resolved):
        return Check(
            False,
            f"this node publishes {addr!r} ({source}), a loopback address ({', '.join(resolved)})"
            f" that other hosts cannot reach{fix}",
        )
    return Check(True, f"this node publishes {addr!r} ({source}) = {', '.join(resolved)}")


def interface_checks(config: AgentConfig) -> list[Check]:
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
        if wanted is None:
            continue
        names = [n.strip() for n in wanted.split(",") if n.strip()]
        missing = [n for n in names if n not in interfaces]
        if missing:
            checks.append(
                Check(
                    False,
                    f"{variable}={wanted}: no interface {', '.join(missing)} on this"
                    f" host (it has {', '.join(sorted(interfaces))})",
                )
            )
        elif used is not None and used not in names and not used.startswith("lo"):
            checks.append(
                Check(
                    False,
                    f"{variable}={wanted}, but the rendezvous traffic to {endpoint.host} leaves"
                    f" through {used}: the workers may not reach their peers; set"
                    f" {variable}={used}",
                )
            )
        else:
            checks.append(Check(True, f"{variable}={wanted}"))
    return checks


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


def run_checks(config: AgentConfig) -> list[Check]:
    from torchx_elastic.agent.rendezvous.handler import hosts_rendezvous

    hosting = config.rdzv_backend == "c10d" and hosts_rendezvous(config)
    return [
        *endpoint_checks(config, hosting),
        published_address_check(config),
        *interface_checks(config),
    ]


def main(argv: list[str] | None = None) -> int:
    from torchx_elastic.agent.config.cli import build_parser
    from torchx_elastic.agent.config.launch import UsageError, config_from_args

    parser = build_parser()
    parser.prog = "python -m torchx_elastic.agent.doctor"
    # the job's own command line; its script is never run (a placeholder where it has none)
    args, _ = parser.parse_known_args([*(sys.argv[1:] if argv is None else argv), "-"])
    try:
        config = config_from_args(args)
    except UsageError as err:
        print(f"torchx-elastic doctor: error: {err}", file=sys.stderr)
        return 1
    print(
        f"torchx-elastic doctor on {socket.gethostname()}: rendezvous {config.rdzv_backend} at"
        f" {config.rdzv_endpoint}, run id {config.run_id!r}, --nnodes {config.nnodes}"
    )
    checks = run_checks(config)
    for check in checks:
        print(check.line())
    failed = sum(not check.ok for check in checks)
    print(f"{failed} problem(s)" if failed else "nothing would fail")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
