# shellcheck shell=bash
# Open MPI as the benchmarks' peer, in the fastest configuration we measured for it
# (docs/performance-collectives.md); sourced by bench/collectives.sh and
# bench/hosts_collectives.sh.
# mpi_base: root allowed, more ranks than CPUs allowed and left unbound (a script that
# binds does so itself), and glibc malloc told not to give pages back between calls
# (without that Open MPI's large reduce-scatter is several times slower, which would
# flatter us).
# mpi_pml_ucx: its UCX pml, which Debian's build leaves off by default, on every
# transport and device UCX finds.
# shellcheck disable=SC2034 # used by the scripts that source this file
mpi_base=(--allow-run-as-root --oversubscribe --bind-to none
    -x MALLOC_MMAP_THRESHOLD_=2147483647 -x MALLOC_TRIM_THRESHOLD_=4294967295
    -x MALLOC_TOP_PAD_=536870912)
# shellcheck disable=SC2034
mpi_pml_ucx=(--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any)
