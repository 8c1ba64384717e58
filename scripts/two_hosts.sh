#!/usr/bin/env bash
# Two "hosts" on one machine, for a workshop on scaling out: a network namespace with its own
# address, joined to this one by a veth pair (needs root). This host is 10.99.0.1, the other
# 10.99.0.2; traffic between them crosses the pair, not loopback.
#
#   sudo bash scripts/two_hosts.sh up
#   uv run minivllm serve -dp 2 -dpl 1 --data-parallel-address 10.99.0.1      # host 1
#   sudo ip netns exec minivllm-host2 .venv/bin/minivllm serve --headless \
#       --data-parallel-address 10.99.0.1 --data-parallel-start-rank 1        # host 2
#   (or pipeline stages on both: see README.md, "Scale out")
#   sudo bash scripts/two_hosts.sh down
set -euo pipefail
NS=${MINIVLLM_NETNS:-minivllm-host2}
case "${1:-}" in
  up)
    ip netns add "$NS"
    ip link add mvh1 type veth peer name mvh2
    ip link set mvh2 netns "$NS"
    ip addr add 10.99.0.1/24 dev mvh1
    ip link set mvh1 up
    ip netns exec "$NS" ip addr add 10.99.0.2/24 dev mvh2
    ip netns exec "$NS" ip link set mvh2 up
    ip netns exec "$NS" ip link set lo up
    echo "host 1: 10.99.0.1 (here); host 2: 10.99.0.2 (ip netns exec $NS ...)";;
  down)
    ip link del mvh1 2>/dev/null || true          # removes its peer too
    ip netns del "$NS" 2>/dev/null || true;;
  *)
    echo "usage: $0 up|down" >&2; exit 2;;
esac
