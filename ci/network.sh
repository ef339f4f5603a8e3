#!/usr/bin/env bash
# Run a lane of local jobs whose rendezvous port may clash with another lane's (multi-node
# `dist.ddp` jobs and torchrun's forms take port 29500 unless told another):
#   ci/network.sh own COMMAND [ARGS...]     in a network namespace of its own: loopback up,
#                                            this machine's addresses on it (its name resolves
#                                            to them), nothing outside reachable
#   ci/network.sh shared COMMAND [ARGS...]  in this machine's network
# Where no namespace can be made (not root, no `unshare`), both forms take one lock instead,
# so such lanes run one after the other, never side by side on one port.
set -euo pipefail
mode=${1:?usage: $0 own|shared COMMAND [ARGS...]}
shift
lock="${TMPDIR:-/tmp}/torchx-elastic-network-lanes.lock"
isolated() { [ "$(id -u)" = 0 ] && command -v ip >/dev/null && unshare -n true 2>/dev/null; }

case $mode in
own)
    isolated || exec flock "$lock" "$@"
    # hostname -I: the addresses of this machine's interfaces, which its name may resolve to
    addresses=$(hostname -I 2>/dev/null || true)
    exec unshare -n bash -c '
        ip link set lo up
        for address in $0; do ip addr add "$address" dev lo 2>/dev/null || true; done
        exec "$@"' "$addresses" "$@"
    ;;
shared)
    isolated || exec flock "$lock" "$@"
    exec "$@"
    ;;
*)
    echo "ci/network.sh: unknown mode '$mode'; accepted: own, shared" >&2
    exit 2
    ;;
esac
