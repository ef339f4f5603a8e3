"""``python -m torchx_elastic.agent.doctor [torchrun flags] [SCRIPT ...]``: what would fail.

Run on each host before a long job, with the job's own command line (the script is not
run): it resolves and connects to the rendezvous endpoint (or, on the host that serves it,
checks that the port is free), checks the address this node publishes to its peers and the
network interfaces gloo and NCCL would use (gloo's own choice too, where
``GLOO_SOCKET_IFNAME`` is unset: rendezvous/network_checks.py, whose warnings the agent
also says before its rendezvous), and prints one line per check, in one screen.
Exit status 0 when nothing would fail, 1 otherwise.
"""

from __future__ import annotations

import socket
import sys

from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.launch import AgentConfig
from torchx_elastic.agent.rendezvous import diagnosis, listen
from torchx_elastic.agent.rendezvous.network_checks import Check, interface_checks
from torchx_elastic.agent.rendezvous.parameters import hosts_rendezvous

STORE_ANSWER_S = 5.0


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


def run_checks(config: AgentConfig) -> list[Check]:
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
