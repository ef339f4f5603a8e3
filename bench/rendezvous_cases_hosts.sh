#!/usr/bin/env bash
# The two-host cases of docs/troubleshooting.md's side-by-side table, torchrun beside the
# agent, on ../shared/netns/hosts.sh hosts (root; under the machine's netns lock):
#
#   bash bench/rendezvous_cases_hosts.sh [SECONDS]    (default 30)
#
# Each case starts node A on h0 (it hosts the c10d rendezvous, h0:29541) and node B on h1 one
# second later, `--nnodes 2 --nproc-per-node 1`, a gloo all_reduce, and prints the last lines each node said
# within SECONDS (torch's C++ frames left out), its exit code (124: still running) and when.
set -u
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
HOSTS=../shared/netns/hosts.sh
PY=${PYTHON:-$PWD/.venv/bin/python}
WORK=$(mktemp -d)
cat > "$WORK/ok.py" <<'PY'
import time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
time.sleep(6)  # the peers' checks of a published address take a few seconds
print("trained")
PY
export TORCHX_ELASTIC_RDZV_SECRET=table

node() {  # host log launcher env-assignments... -- flags...
  local host=$1 log=$2 launcher=$3; shift 3
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local started=$EPOCHREALTIME
  (cd "$WORK" && timeout "$SECONDS_EACH" bash "$OLDPWD/$HOSTS" exec "$host" env "${envs[@]}" \
    "$PY" -m "$launcher" --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
    --rdzv-endpoint h0:29541 --rdzv-id j "$@" ok.py >"$log" 2>&1
    awk -v c=$? -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "exit %s after %.1f s\n", c, b - a }' >>"$log")
}

run_case() {  # name launcher A-env B-env B-flags
  local name=$1 launcher=$2 a_env=$3 b_env=$4 b_flags=$5
  node h0 "$WORK/a.log" "$launcher" $a_env -- &
  sleep 1
  # shellcheck disable=SC2086
  node h1 "$WORK/b.log" "$launcher" $b_env -- $b_flags &
  wait
  for n in a b; do
    echo "## $name, $launcher, node ${n^^}:"
    grep "torchx-elastic: warning" "$WORK/$n.log"  # said early: not among the last lines
    grep -v -e "frame #" -e "Exception raised from" -e "omitting python frames" \
      -e "OMP_NUM_THREADS" -e '^\*\+$' -e "NOT authenticated" "$WORK/$n.log" | tail -n 3
  done
}

exec 9>/tmp/netns.lock
flock 9
bash "$HOSTS" down >/dev/null 2>&1
bash "$HOSTS" up 3 >/dev/null
trap 'bash "$HOSTS" down >/dev/null 2>&1; rm -rf "$WORK"' EXIT
for launcher in torch.distributed.run torchx_elastic.agent; do
  run_case "GLOO_SOCKET_IFNAME=lo on both nodes" "$launcher" \
    GLOO_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo ""
  run_case "node B publishes --local-addr nowhere.invalid" "$launcher" \
    GLOO_SOCKET_IFNAME=veth-h0 GLOO_SOCKET_IFNAME=veth-h1 "--local-addr nowhere.invalid"
done
