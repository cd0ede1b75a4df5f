#!/usr/bin/env bash
# Open MPI's remote launcher for the namespace hosts of hosts.sh: mpirun, run on host 0
# with `--mca plm_rsh_agent tests/hosts/mpi_agent.sh --host ADDR0:N,ADDR1:N`, calls it as
# ssh would be called, `mpi_agent.sh [OPTIONS] ADDR COMMAND...`, to start its daemon on
# the host of address ADDR (10.213.0.K+1 is host K), which then starts that host's ranks.
# The daemon gets what hosts_run gives a command: the host's network namespace and its
# own hostname, IPC, mount (/dev/shm) and pid namespaces. HOSTS_PREFIX comes from the
# environment of the hosts.sh that made the hosts. ADDR must be a host's dotted address,
# and OPTIONS options without values (mpirun passes none).
set -euo pipefail
while [[ $1 == -* ]]; do shift; done
addr=$1
shift
k=$((${addr##*.} - 1))
exec ip netns exec "$HOSTS_PREFIX-h$k" unshare --uts --ipc --mount --pid --fork --mount-proc \
    bash -c 'hostname "fsdp2-h$1"; mount -t tmpfs -o size=50% tmpfs /dev/shm || exit 97; shift;
             eval "$*"' mpi_agent "$k" "$@"
