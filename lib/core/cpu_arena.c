/* The shareable cpu arena: one memfd per process, as large as the machine's memory but
 * sparse (pages exist once touched), mapped once, and cut into page-aligned allocations
 * by first fit. Each allocation is followed by a guard page that is never touched, so
 * that two buffers of a power-of-two size never sit exactly that far apart: addresses a
 * large power of two apart fall into the same cache sets, so reading two such buffers
 * at the same offsets evicts each other's lines (the measured cost: docs/collectives.md,
 * "Where the peers' arenas are mapped").
 *
 * The arena's first page holds its magic and nonce (fsdp2_cpu_arena_id_t).
 *
 * A free punches the allocation's pages out of the memfd, which also unmaps them from
 * every peer that mapped the arena: a peer's mapping costs address space, never memory.
 *
 * fork: the child must not keep allocating from the parent's memfd (both would hand out
 * the same pages), nor write into the buffers it inherited where the parent would see
 * it. In the child each live allocation's touched pages are copied onto private pages
 * put in its place by mremap (a fork costs a copy of the live blocks' touched bytes,
 * where malloc'ed memory would be copied on write: fork early, or spawn), the rest of
 * the parent's arena is unmapped, and the child makes its own arena when it next needs
 * one. posix_spawn and system() run no fork handlers and copy nothing.
 *
 * The arena is one process-wide object (like malloc's heap), behind one mutex. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/cpu_arena.h"
#include "core/env_internal.h"
#include "core/log_internal.h"

typedef struct range {
    uint64_t off, len; /* live: len is the caller's size; free: the span */
} range_t;

typedef struct ranges {
    range_t *v;
    size_t n, cap;
} ranges_t;

typedef enum arena_state {
    ARENA_UNMADE,      /* made by the first allocation it may take */
    ARENA_READY,
    ARENA_UNAVAILABLE, /* switched off, or the memfd could not be made */
} arena_state_t;

typedef struct arena {
    pthread_mutex_t lock;
    arena_state_t state;
    int fd;
    char *base;
    uint64_t bytes;
    uint64_t nonce;
    ranges_t free; /* sorted by offset, never adjacent (merged) */
    ranges_t live; /* sorted by offset */
    ranges_t orphans; /* inherited over fork: private pages at base-less addresses */
} arena_t;

static arena_t arena = {.lock = PTHREAD_MUTEX_INITIALIZER, .state = ARENA_UNMADE, .fd = -1};
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static uint64_t page_bytes(void) { return (uint64_t)sysconf(_SC_PAGESIZE); }

/* An allocation's pages and its guard page. */
static uint64_t span_of(uint64_t len)
{
    uint64_t page = page_bytes();
    return (len + page - 1) / page * page + page;
}

static int ranges_insert(ranges_t *r, size_t at, range_t x)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        range_t *v = realloc(r->v, cap * sizeof(*v));
        if (!v)
            return 0;
        r->v = v;
        r->cap = cap;
    }
    memmove(r->v + at + 1, r->v + at, (r->n - at) * sizeof(*r->v));
    r->v[at] = x;
    r->n++;
    return 1;
}

static void ranges_remove(ranges_t *r, size_t at)
{
    memmove(r->v + at, r->v + at + 1, (r->n - at - 1) * sizeof(*r->v));
    r->n--;
}

/* The index of the last range starting at or before off, or -1. */
static long ranges_find(const ranges_t *r, uint64_t off)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->v[mid].off <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (long)lo - 1;
}

static void child_after_fork(void);

static void arena_make(void)
{
    arena.state = ARENA_UNAVAILABLE;
    if (fsdp2_env_int(FSDP2_ENV_CPU_SHARED_ALLOC) != 0) /* "on" is index 0 */
        return;
    long pages = sysconf(_SC_PHYS_PAGES);
    uint64_t page = page_bytes(), gib = 1ull << 30;
    uint64_t bytes = ((uint64_t)(pages > 0 ? pages : 1) * page + gib - 1) / gib * gib;
    int fd = memfd_create("fsdp2-cpu-arena", MFD_CLOEXEC);
    if (fd < 0) {
        FSDP2_LOG(DEBUG, CORE, "no shareable cpu arena: memfd_create: %s", strerror(errno));
        return;
    }
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0)
        base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (base == MAP_FAILED || !ranges_insert(&arena.free, 0, (range_t){page, bytes - page})) {
        FSDP2_LOG(DEBUG, CORE, "no shareable cpu arena: %s of %llu bytes: %s",
                  base == MAP_FAILED ? "ftruncate/mmap" : "bookkeeping",
                  (unsigned long long)bytes, strerror(errno));
        if (base != MAP_FAILED)
            munmap(base, bytes);
        close(fd);
        return;
    }
    arena.fd = fd;
    arena.base = base;
    arena.bytes = bytes;
    arena.nonce = ((uint64_t)getpid() << 40) ^ (uint64_t)fsdp2_now_ns();
    uint64_t *head = base;
    head[0] = FSDP2_CPU_ARENA_MAGIC;
    head[1] = arena.nonce;
    arena.state = ARENA_READY;
    FSDP2_LOG(DEBUG, CORE, "shareable cpu arena: memfd %d, %llu bytes at %p", fd,
              (unsigned long long)bytes, base);
}

/* Room for every live block in the orphan list, so that the child need not allocate. */
static void before_fork(void)
{
    pthread_mutex_lock(&arena.lock);
    size_t need = arena.orphans.n + arena.live.n;
    if (need > arena.orphans.cap) {
        range_t *v = realloc(arena.orphans.v, need * sizeof(*v));
        if (v) {
            arena.orphans.v = v;
            arena.orphans.cap = need;
        }
    }
}
static void parent_after_fork(void) { pthread_mutex_unlock(&arena.lock); }

static void register_atfork(void)
{
    pthread_atfork(before_fork, parent_after_fork, child_after_fork);
}

void *fsdp2_cpu_arena_alloc(size_t bytes)
{
    void *ptr = NULL;
    if (bytes < FSDP2_CPU_ARENA_MIN)
        return NULL;
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&arena.lock);
    if (arena.state == ARENA_UNMADE)
        arena_make();
    if (arena.state == ARENA_READY && bytes < arena.bytes) {
        uint64_t span = span_of(bytes);
        for (size_t i = 0; i < arena.free.n; i++) {
            range_t *f = &arena.free.v[i];
            if (f->len < span)
                continue;
            range_t a = {f->off, bytes};
            long at = ranges_find(&arena.live, a.off) + 1;
            if (!ranges_insert(&arena.live, (size_t)at, a))
                break;
            f->off += span;
            f->len -= span;
            if (!f->len)
                ranges_remove(&arena.free, i);
            ptr = arena.base + a.off;
            break;
        }
    }
    pthread_mutex_unlock(&arena.lock);
    return ptr;
}

/* Returns the span [off, off + len) to the free list, merging with its neighbours. */
static int give_back(uint64_t off, uint64_t len)
{
    long i = ranges_find(&arena.free, off); /* the free range before, if any */
    int merge_prev = i >= 0 && arena.free.v[i].off + arena.free.v[i].len == off;
    size_t next = (size_t)(i + 1);
    int merge_next = next < arena.free.n && off + len == arena.free.v[next].off;
    if (merge_prev && merge_next) {
        arena.free.v[i].len += len + arena.free.v[next].len;
        ranges_remove(&arena.free, next);
    } else if (merge_prev) {
        arena.free.v[i].len += len;
    } else if (merge_next) {
        arena.free.v[next].off = off;
        arena.free.v[next].len += len;
    } else {
        return ranges_insert(&arena.free, next, (range_t){off, len});
    }
    return 1;
}

/* fsdp2_device_free has checked ptr against its table of live allocations: ptr is the
 * start of a block of ours, an orphan, or neither. */
int fsdp2_cpu_arena_free(void *ptr)
{
    int ours = 0;
    pthread_mutex_lock(&arena.lock);
    long i = -1;
    if (arena.state == ARENA_READY && (char *)ptr >= arena.base &&
        (char *)ptr < arena.base + arena.bytes)
        i = ranges_find(&arena.live, (uint64_t)((char *)ptr - arena.base));
    if (i >= 0 && arena.base + arena.live.v[i].off == (char *)ptr) {
        range_t a = arena.live.v[i];
        uint64_t span = span_of(a.len);
        int fd = arena.fd;
        ranges_remove(&arena.live, (size_t)i);
        /* Punching gigabytes takes a while: not under the lock. The span is neither live
         * nor free meanwhile, so nobody can be handed it before its pages are gone. */
        pthread_mutex_unlock(&arena.lock);
        if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a.off,
                      (off_t)span) != 0)
            FSDP2_LOG(WARN, CORE, "shareable cpu arena: punching %llu bytes out: %s",
                      (unsigned long long)span, strerror(errno));
        pthread_mutex_lock(&arena.lock);
        if (arena.state == ARENA_READY && !give_back(a.off, span))
            /* no room to say so: the span stays out of use */
            FSDP2_LOG(WARN, CORE, "shareable cpu arena: %llu bytes lost to bookkeeping",
                      (unsigned long long)span);
        ours = 1;
    } else {
        uint64_t addr = (uint64_t)(uintptr_t)ptr;
        long k = ranges_find(&arena.orphans, addr);
        if (k >= 0 && arena.orphans.v[k].off == addr) {
            munmap(ptr, arena.orphans.v[k].len);
            ranges_remove(&arena.orphans, (size_t)k);
            ours = 1;
        }
    }
    pthread_mutex_unlock(&arena.lock);
    return ours;
}

int fsdp2_cpu_arena_locate(const void *p, size_t len, uint64_t *offset)
{
    int found = 0;
    pthread_mutex_lock(&arena.lock);
    const char *c = p;
    if (arena.state == ARENA_READY && c >= arena.base && c < arena.base + arena.bytes &&
        len <= arena.bytes) {
        uint64_t off = (uint64_t)(c - arena.base);
        long i = ranges_find(&arena.live, off);
        if (i >= 0) {
            range_t a = arena.live.v[i];
            uint64_t end = off + (len ? len : 1);
            found = end <= a.off + a.len;
        }
        if (found)
            *offset = off;
    }
    pthread_mutex_unlock(&arena.lock);
    return found;
}

int fsdp2_cpu_arena_identity(fsdp2_cpu_arena_id_t *id)
{
    pthread_mutex_lock(&arena.lock);
    int ready = arena.state == ARENA_READY;
    if (ready)
        *id = (fsdp2_cpu_arena_id_t){.pid = (int32_t)getpid(), .fd = arena.fd,
                                     .bytes = arena.bytes, .nonce = arena.nonce};
    pthread_mutex_unlock(&arena.lock);
    return ready;
}

/* Copies the pages of [off, off + len) that hold data (others read as zeros anyway,
 * and reading them would allocate them in the parent's memfd) to `to`. */
static uint64_t copy_data(char *to, uint64_t off, uint64_t len)
{
    uint64_t end = off + len, at = off, copied = 0;
    while (at < end) {
        off_t data = lseek(arena.fd, (off_t)at, SEEK_DATA);
        if (data < 0 && errno != ENXIO) { /* no SEEK_DATA: all of it */
            memcpy(to + (at - off), arena.base + at, end - at);
            return copied + (end - at);
        }
        if (data < 0 || (uint64_t)data >= end)
            break;
        off_t hole = lseek(arena.fd, data, SEEK_HOLE);
        uint64_t stop = hole < 0 || (uint64_t)hole > end ? end : (uint64_t)hole;
        memcpy(to + ((uint64_t)data - off), arena.base + data, stop - (uint64_t)data);
        copied += stop - (uint64_t)data;
        at = stop;
    }
    return copied;
}

/* In the child (one thread, the lock held since before_fork): see the top. glibc's
 * malloc may be used in the child of a threaded process (it resets its locks at fork);
 * before_fork made the orphan list large enough anyway. A block that cannot be copied
 * becomes a private mapping of the memfd instead: the child's writes stay its own,
 * though it may still see the parent's later writes to pages it has not written. */
static void child_after_fork(void)
{
    if (arena.state == ARENA_READY) {
        uint64_t copied = 0;
        for (size_t i = 0; i < arena.live.n; i++) {
            range_t a = arena.live.v[i];
            uint64_t span = span_of(a.len);
            char *at = arena.base + a.off;
            char *copy = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                              -1, 0);
            int moved = 0;
            if (copy != MAP_FAILED) {
                copied += copy_data(copy, a.off, a.len);
                moved = mremap(copy, span, span, MREMAP_MAYMOVE | MREMAP_FIXED, at) != MAP_FAILED;
                if (!moved)
                    munmap(copy, span);
            }
            if (!moved)
                mmap(at, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, arena.fd,
                     (off_t)a.off);
            uint64_t addr = (uint64_t)(uintptr_t)at;
            long k = ranges_find(&arena.orphans, addr) + 1;
            ranges_insert(&arena.orphans, (size_t)k, (range_t){addr, span});
        }
        munmap(arena.base, page_bytes()); /* the header */
        for (size_t i = 0; i < arena.free.n; i++)
            munmap(arena.base + arena.free.v[i].off, arena.free.v[i].len);
        if (arena.live.n)
            FSDP2_LOG(INFO, CORE, "fork: %zu shareable cpu blocks moved onto private pages "
                      "(%llu bytes copied)", arena.live.n, (unsigned long long)copied);
        close(arena.fd);
        free(arena.free.v);
        free(arena.live.v);
        arena.live = (ranges_t){0};
        arena.free = (ranges_t){0};
        arena.fd = -1;
        arena.base = NULL;
        arena.bytes = 0;
        arena.state = ARENA_UNMADE;
    }
    pthread_mutex_unlock(&arena.lock);
}
