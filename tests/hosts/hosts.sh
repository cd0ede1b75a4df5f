#!/usr/bin/env bash
# "Hosts" made of namespaces on this machine, for the tests and benchmarks that need
# several hosts: each host a network namespace joined to the others through a bridge (a
# namespace of its own), with an address of 10.213.0.0/24 on its eth0, its egress rate
# limited by an htb qdisc when asked; a command run on a host also gets its own UTS
# (hostname fsdp2-hK), IPC, mount (a private /dev/shm) and pid namespaces, so that
# neither libfsdp2's shared-memory transport nor UCX's can cross hosts.
#
# Source it, then:
#   hosts_up N [RATE]      make N hosts (RATE: 1gbit, 10gbit, 25gbit ... or unlimited)
#   hosts_run K CMD...     run CMD on host K (blocks; its exit status); HOSTS_HOSTNAME
#                          gives every host that one hostname (as containers on one
#                          machine may have); HOSTS_SHARE_PID keeps this machine's pid
#                          namespace (as containers run with the host's pids)
#   hosts_addr K           host K's address
#   hosts_down             remove everything hosts_up made (also on EXIT, INT, TERM)
#   hosts_can || skip      whether namespaces can be made here (root, ip, unshare)
# Names: namespaces fsdp2-<PID>-hK and fsdp2-<PID>-br, so that concurrent jobs do not
# collide; a job killed with SIGKILL leaves them for `ip netns list | grep fsdp2-`.

HOSTS_PREFIX="fsdp2-$$"
HOSTS_N=0

hosts_can() {
    [ "$(id -u)" = 0 ] || { echo "hosts: not root: network namespaces cannot be made"; return 1; }
    command -v ip >/dev/null && command -v unshare >/dev/null && command -v nsenter >/dev/null ||
        { echo "hosts: ip, unshare or nsenter missing (iproute2, util-linux)"; return 1; }
    ip netns add "$HOSTS_PREFIX-probe" 2>/dev/null ||
        { echo "hosts: 'ip netns add' fails here (no CAP_SYS_ADMIN?)"; return 1; }
    ip netns del "$HOSTS_PREFIX-probe"
    unshare --uts --ipc --mount --pid --fork true 2>/dev/null ||
        { echo "hosts: unshare of UTS, IPC, mount and pid namespaces fails here"; return 1; }
}

hosts_addr() {
    echo "10.213.0.$(($1 + 1))"
}

hosts_down() {
    local k
    for ((k = 0; k < HOSTS_N; k++)); do
        ip netns del "$HOSTS_PREFIX-h$k" 2>/dev/null || true
    done
    ip netns del "$HOSTS_PREFIX-br" 2>/dev/null || true
    HOSTS_N=0
}

hosts_up() { # N [RATE]
    local n=$1 rate=${2:-unlimited} k br="$HOSTS_PREFIX-br"
    trap 'hosts_down' EXIT
    trap 'hosts_down; exit 130' INT
    trap 'hosts_down; exit 143' TERM
    ip netns add "$br" || return 1
    ip -n "$br" link add br0 type bridge || return 1
    ip -n "$br" link set br0 up || return 1
    for ((k = 0; k < n; k++)); do
        local h="$HOSTS_PREFIX-h$k"
        ip netns add "$h" || return 1
        HOSTS_N=$((k + 1))
        ip link add "fh$$x$k" type veth peer name "fb$$x$k" || return 1
        ip link set "fh$$x$k" netns "$h" || return 1
        ip link set "fb$$x$k" netns "$br" || return 1
        ip -n "$h" link set "fh$$x$k" name eth0 || return 1
        ip -n "$h" addr add "$(hosts_addr "$k")/24" dev eth0 || return 1
        ip -n "$h" link set eth0 up || return 1
        ip -n "$h" link set lo up || return 1
        ip -n "$br" link set "fb$$x$k" master br0 || return 1
        ip -n "$br" link set "fb$$x$k" up || return 1
        if [ "$rate" != unlimited ]; then
            ip netns exec "$h" tc qdisc add dev eth0 root handle 1: htb default 10 || return 1
            ip netns exec "$h" tc class add dev eth0 parent 1: classid 1:10 htb rate "$rate" \
                ceil "$rate" quantum 60000 || return 1
        fi
    done
}

hosts_run() { # K CMD...
    local k=$1
    shift
    local pid=(--pid --fork --mount-proc)
    [ -z "${HOSTS_SHARE_PID:-}" ] || pid=(--fork)
    ip netns exec "$HOSTS_PREFIX-h$k" unshare --uts --ipc --mount "${pid[@]}" \
        bash -c 'hostname "$1"; mount -t tmpfs -o size=50% tmpfs /dev/shm || exit 97; shift;
                 exec "$@"' hosts "${HOSTS_HOSTNAME:-fsdp2-h$k}" "$@"
}
