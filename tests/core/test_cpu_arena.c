/* Tests for the shareable cpu arena (lib/core/cpu_arena.c) behind fsdp2_device_alloc.
 *
 * References: another process's view is a real one (a forked child maps the parent's
 * memfd through /proc/<pid>/fd and writes a pattern the parent reads back, and the other
 * way); memory handed back is read from the memfd's own block count (fstat), not from
 * the allocator's bookkeeping; fork semantics are checked against what malloc gives
 * (the child's writes never reach the parent, and only pages that hold data are
 * copied). Each test runs in its own forked process,
 * which starts without an arena. */
#include <check.h>

#include "check_main.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fsdp2/device.h>
#include <fsdp2/status.h>

#include "core/cpu_arena.h"
#include "core/env_internal.h"

#define TEST_TIMEOUT_S 60
#define MIB (1u << 20)

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;

#define ASSERT_OK(call)                                                                   \
    do {                                                                                  \
        fsdp2_status_t s_ = (call);                                                       \
        ck_assert_msg(s_ == FSDP2_SUCCESS, "%s = %s (%s)", #call, fsdp2_status_name(s_), \
                      fsdp2_last_error());                                                \
    } while (0)

static void *alloc(size_t bytes)
{
    void *p = NULL;
    ASSERT_OK(fsdp2_device_alloc(CPU, bytes, &p));
    ck_assert_ptr_nonnull(p);
    return p;
}

/* The arena's memfd as this process sees it, and the bytes it holds now. */
static uint64_t arena_blocks_bytes(const fsdp2_cpu_arena_id_t *id)
{
    struct stat st;
    ck_assert_int_eq(fstat(id->fd, &st), 0);
    return (uint64_t)st.st_blocks * 512;
}

static void *map_peer(const fsdp2_cpu_arena_id_t *id)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)id->pid, (int)id->fd);
    int fd = open(path, O_RDWR);
    ck_assert_msg(fd >= 0, "open %s", path);
    void *map = mmap(NULL, id->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    close(fd);
    ck_assert_msg(map != MAP_FAILED, "mmap %s", path);
    return map;
}

START_TEST(large_allocations_come_from_the_arena_and_small_ones_do_not)
{
    char *big = alloc(FSDP2_CPU_ARENA_MIN), *small = alloc(FSDP2_CPU_ARENA_MIN - 1);
    fsdp2_cpu_arena_id_t id;
    ck_assert(fsdp2_cpu_arena_identity(&id));
    ck_assert_int_eq(id.pid, getpid());
    uint64_t off = 1, off2 = 1;
    ck_assert(fsdp2_cpu_arena_locate(big, FSDP2_CPU_ARENA_MIN, &off));
    ck_assert(fsdp2_cpu_arena_locate(big + 100, 28, &off2));
    ck_assert_uint_eq(off2, off + 100);
    ck_assert(!fsdp2_cpu_arena_locate(big, FSDP2_CPU_ARENA_MIN + 1, &off)); /* past its end */
    ck_assert(!fsdp2_cpu_arena_locate(small, 1, &off));
    ck_assert_uint_eq((uintptr_t)big % (uintptr_t)sysconf(_SC_PAGESIZE), 0);
    memset(big, 1, FSDP2_CPU_ARENA_MIN);
    ASSERT_OK(fsdp2_device_free(CPU, big));
    ck_assert(!fsdp2_cpu_arena_locate(big, 1, &off)); /* freed */
    ASSERT_OK(fsdp2_device_free(CPU, small));
    /* allocation stats count arena memory like any other */
    fsdp2_memory_stats_t stats;
    ASSERT_OK(fsdp2_memory_stats_get(CPU, &stats));
    ck_assert_uint_eq(stats.allocated_bytes, 0);
    ck_assert_uint_eq(stats.peak_allocated_bytes, 2 * FSDP2_CPU_ARENA_MIN - 1);
}
END_TEST

START_TEST(buffers_sit_a_guard_page_apart_and_freed_room_is_reused)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *a = alloc(4 * MIB), *b = alloc(4 * MIB), *c = alloc(4 * MIB + 1);
    ck_assert_ptr_eq(b, a + 4 * MIB + page);
    ck_assert_ptr_eq(c, b + 4 * MIB + page);
    ASSERT_OK(fsdp2_device_free(CPU, b));
    char *d = alloc(MIB); /* first fit: b's room */
    ck_assert_ptr_eq(d, b);
    ASSERT_OK(fsdp2_device_free(CPU, a));
    ASSERT_OK(fsdp2_device_free(CPU, d));
    char *e = alloc(8 * MIB + page); /* a and b merged back into one room */
    ck_assert_ptr_eq(e, a);
    ASSERT_OK(fsdp2_device_free(CPU, e));
    ASSERT_OK(fsdp2_device_free(CPU, c));
}
END_TEST

START_TEST(a_free_hands_the_pages_back_to_the_kernel)
{
    char *a = alloc(8 * MIB);
    fsdp2_cpu_arena_id_t id;
    ck_assert(fsdp2_cpu_arena_identity(&id));
    uint64_t before = arena_blocks_bytes(&id);
    memset(a, 3, 8 * MIB);
    uint64_t touched = arena_blocks_bytes(&id);
    ck_assert_msg(touched >= before + 8 * MIB, "memfd holds %llu bytes after touching 8 MiB "
                  "(%llu before)", (unsigned long long)touched, (unsigned long long)before);
    /* a peer's mapping does not keep them */
    char *view = map_peer(&id);
    const uint64_t *head = (const uint64_t *)view;
    ck_assert_uint_eq(head[0], FSDP2_CPU_ARENA_MAGIC);
    ck_assert_uint_eq(head[1], id.nonce);
    uint64_t off = 0;
    ck_assert(fsdp2_cpu_arena_locate(a, 8 * MIB, &off));
    ck_assert_int_eq(view[off + 5], 3);
    ASSERT_OK(fsdp2_device_free(CPU, a));
    uint64_t after = arena_blocks_bytes(&id);
    ck_assert_msg(after <= before, "memfd holds %llu bytes after the free (%llu before)",
                  (unsigned long long)after, (unsigned long long)before);
    ck_assert_int_eq(view[off + 5], 0); /* punched out: reads as a fresh page */
    munmap(view, id.bytes);
}
END_TEST

/* The parent writes, a child maps the parent's arena and checks and answers; the parent
 * maps the child's arena and reads the child's answer. */
START_TEST(another_process_reads_and_writes_an_allocation_in_place)
{
    size_t n = 3 * MIB / sizeof(float);
    float *mine = alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        mine[i] = (float)i;
    fsdp2_cpu_arena_id_t id;
    ck_assert(fsdp2_cpu_arena_identity(&id));
    uint64_t off = 0;
    ck_assert(fsdp2_cpu_arena_locate(mine, n * sizeof(float), &off));
    int to_parent[2];
    ck_assert_int_eq(pipe(to_parent), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        float *theirs = (float *)((char *)map_peer(&id) + off);
        int bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += theirs[i] != (float)i;
        for (size_t i = 0; i < n; i++)
            theirs[i] = -(float)i; /* lands in the parent's buffer */
        float *answer = NULL;
        fsdp2_device_alloc(CPU, MIB, (void **)&answer);
        fsdp2_cpu_arena_id_t cid = {0};
        uint64_t coff = 0;
        int ok = answer && fsdp2_cpu_arena_identity(&cid) &&
                 fsdp2_cpu_arena_locate(answer, MIB, &coff);
        if (ok)
            answer[7] = (float)bad + 0.5f;
        uint64_t msg[4] = {(uint64_t)ok, (uint64_t)cid.pid, (uint64_t)cid.fd, coff};
        ssize_t w = write(to_parent[1], msg, sizeof(msg));
        pause(); /* keeps its arena alive until the parent has read it, then is killed */
        _exit(w == (ssize_t)sizeof(msg) ? 0 : 1);
    }
    uint64_t msg[4];
    ck_assert_int_eq(read(to_parent[0], msg, sizeof(msg)), (ssize_t)sizeof(msg));
    ck_assert_msg(msg[0] == 1, "the child got no arena allocation");
    fsdp2_cpu_arena_id_t cid = {.pid = (int32_t)msg[1], .fd = (int32_t)msg[2], .bytes = id.bytes};
    /* the child's arena has the same size (same machine) */
    float *answer = (float *)((char *)map_peer(&cid) + msg[3]);
    float child_says = answer[7];
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ck_assert_msg(child_says == 0.5f, "the child saw %.0f wrong values", (double)child_says);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(mine[i] == -(float)i, "mine[%zu] = %g, want %g", i, (double)mine[i],
                      -(double)i);
    ASSERT_OK(fsdp2_device_free(CPU, mine));
}
END_TEST

START_TEST(a_forked_child_gets_private_copies_and_its_own_arena)
{
    char *a = alloc(2 * MIB);
    memset(a, 'p', 2 * MIB);
    fsdp2_cpu_arena_id_t parent_id;
    ck_assert(fsdp2_cpu_arena_identity(&parent_id));
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int bad = a[0] != 'p' || a[2 * MIB - 1] != 'p';
        memset(a, 'c', 2 * MIB); /* private now: the parent must not see it */
        uint64_t off;
        bad |= fsdp2_cpu_arena_locate(a, 1, &off) << 1; /* no longer shareable */
        char *b = NULL;
        fsdp2_cpu_arena_id_t id = {0};
        bad |= (fsdp2_device_alloc(CPU, MIB, (void **)&b) != FSDP2_SUCCESS || !b) << 2;
        bad |= (!fsdp2_cpu_arena_identity(&id) || id.pid != getpid()) << 3;
        bad |= (b && !fsdp2_cpu_arena_locate(b, MIB, &off)) << 4;
        bad |= (fsdp2_device_free(CPU, a) != FSDP2_SUCCESS) << 5;
        bad |= (fsdp2_device_free(CPU, b) != FSDP2_SUCCESS) << 6;
        _exit(bad);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed checks 0x%x",
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    for (size_t i = 0; i < 2 * MIB; i += 4096)
        ck_assert_msg(a[i] == 'p', "a[%zu] = '%c' after the child wrote its copy", i, a[i]);
    uint64_t off;
    ck_assert(fsdp2_cpu_arena_locate(a, 2 * MIB, &off)); /* still the parent's, shareable */
    ASSERT_OK(fsdp2_device_free(CPU, a));
}
END_TEST

/* Only the pages that hold data are copied into the child: reading the untouched rest
 * of a block would make the parent's memfd allocate it. */
START_TEST(a_fork_copies_only_the_touched_pages)
{
    char *a = alloc(8 * MIB);
    memset(a, 'p', MIB);
    fsdp2_cpu_arena_id_t id;
    ck_assert(fsdp2_cpu_arena_identity(&id));
    uint64_t before = arena_blocks_bytes(&id);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int bad = 0;
        for (size_t i = 0; i < 8 * MIB; i += 4096)
            bad += a[i] != (i < MIB ? 'p' : 0);
        _exit(bad ? 1 : 0);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child saw wrong bytes");
    uint64_t after = arena_blocks_bytes(&id);
    ck_assert_msg(after == before, "the parent's memfd went from %llu to %llu bytes",
                  (unsigned long long)before, (unsigned long long)after);
    ASSERT_OK(fsdp2_device_free(CPU, a));
}
END_TEST

START_TEST(switched_off_allocations_are_private)
{
    setenv("FSDP2_CPU_SHARED_ALLOC", "off", 1);
    ASSERT_OK(fsdp2_env_reload());
    char *a = alloc(4 * MIB);
    uint64_t off;
    fsdp2_cpu_arena_id_t id;
    ck_assert(!fsdp2_cpu_arena_locate(a, 1, &off));
    ck_assert(!fsdp2_cpu_arena_identity(&id));
    memset(a, 1, 4 * MIB);
    ASSERT_OK(fsdp2_device_free(CPU, a));
}
END_TEST

static Suite *cpu_arena_suite(void)
{
    Suite *s = suite_create("cpu_arena");
    TCase *tc = tcase_create("arena");
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    tcase_add_test(tc, large_allocations_come_from_the_arena_and_small_ones_do_not);
    tcase_add_test(tc, buffers_sit_a_guard_page_apart_and_freed_room_is_reused);
    tcase_add_test(tc, a_free_hands_the_pages_back_to_the_kernel);
    tcase_add_test(tc, another_process_reads_and_writes_an_allocation_in_place);
    tcase_add_test(tc, a_forked_child_gets_private_copies_and_its_own_arena);
    tcase_add_test(tc, a_fork_copies_only_the_touched_pages);
    tcase_add_test(tc, switched_off_allocations_are_private);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(cpu_arena_suite)
