/* A rank for fsdp2run's tests that fails in a collective: run with fault injection so
 * that rank 1's first collective cannot start (FSDP2_FAULT_RANK=1, FSDP2_FAULT_KIND=
 * collective, FSDP2_FAULT_AT=1). The others (echoes of its failure) exit 1 at once; rank
 * 1 (the origin) exits 2 only once fsdp2run's SIGTERM arrived, which fsdp2run sends after
 * the first failing exit: so an echo exits first. No rank finalizes: a failed job's ranks
 * leave as a crashing application's would (_exit, so that a leak checker does not turn
 * the exit status into its own). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <fsdp2/fsdp2.h>

static volatile sig_atomic_t terminated;

static void on_term(int sig)
{
    (void)sig;
    terminated = 1;
}

int main(void)
{
    fsdp2_context_t *ctx;
    fsdp2_process_info_t info;
    fsdp2_group_t *world;
    fsdp2_stream_t *stream;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    if (fsdp2_init(NULL, &ctx) != FSDP2_SUCCESS ||
        fsdp2_context_info(ctx, &info) != FSDP2_SUCCESS ||
        fsdp2_context_world(ctx, &world) != FSDP2_SUCCESS ||
        fsdp2_stream_current(cpu, &stream) != FSDP2_SUCCESS) {
        fprintf(stderr, "fail_rank: set-up: %s\n", fsdp2_last_error());
        return 9;
    }
    if (info.rank == 1) /* (the library's threads exist: a mask would not cover them) */
        signal(SIGTERM, on_term);
    float x = 1.0f;
    fsdp2_status_t s = fsdp2_all_reduce_async(world, &x, 1, FSDP2_F32, NULL, stream);
    if (s == FSDP2_SUCCESS)
        s = fsdp2_stream_synchronize(stream);
    fprintf(stderr, "fail_rank %d: %s: %s\n", info.rank, fsdp2_status_name(s), fsdp2_last_error());
    fflush(NULL);
    if (s == FSDP2_SUCCESS)
        _exit(0);
    if (info.rank == 1) {
        struct timespec nap = {0, 1000 * 1000};
        for (int i = 0; i < 30000 && !terminated; i++) /* 30 s at most */
            nanosleep(&nap, NULL);
        _exit(2);
    }
    _exit(1);
}
