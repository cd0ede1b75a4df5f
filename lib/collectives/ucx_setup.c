/* The ucx backend's set-up: the process's UCP context, where each rank runs (so that
 * peers on this host get shared memory and liveness by pid), worker addresses through
 * the rendezvous store, endpoints connected at creation, and destroy. The protocol is
 * lib/collectives/ucx.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collectives/ucx_internal.h"
#include "core/clock.h"
#include "core/env_internal.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log_internal.h"

#define UCX_ADDRESS_MAX 65536

/* What a rank publishes besides its worker address: where it runs. */
typedef struct ucx_identity {
    char host[64];
    char boot_id[40];
    char pid_ns[32]; /* "pid:[inode]": pids mean something only within one namespace */
    /* "ipc:[inode] shm:dev:inode": shared memory is shared only within one IPC namespace
     * and one /dev/shm (two containers, or namespaces, on one kernel share hostname and
     * boot id, sometimes even pids, but not these) */
    char shm_ns[96];
    int32_t pid;
    int32_t shm;      /* FSDP2_SHM is on */
    uint64_t segment; /* FSDP2_UCX_SEGMENT_BYTES: every member must have the same */
} ucx_identity_t;

static pthread_mutex_t context_lock = PTHREAD_MUTEX_INITIALIZER;
static ucp_context_h context;
static int context_refs;

static fsdp2_status_t ucx_status(ucs_status_t s, const char *what)
{
    return fsdp2_error(FSDP2_ERR_BACKEND, "%s: %s", what, ucs_status_string(s));
}

/* Scratch for the reductions of a group that runs over UCX messages, allocated at
 * creation so that no step allocates: (size - 1) segments per set. A group on shared
 * memory never runs them and takes none (it would be 4 (size - 1) MiB a rank). */
static fsdp2_status_t alloc_scratch(ucx_group_t *ug)
{
    fsdp2_group_t *g = ug->g;
    for (int i = 0; i < UCX_SCRATCH_SETS; i++) {
        ug->sources[i] = fsdp2_calloc((size_t)g->size, sizeof(void *));
        if (ug->sources[i] && g->size > 1)
            ug->scratch[i] = fsdp2_malloc((size_t)(g->size - 1) * ug->segment);
        if (!ug->sources[i] || (g->size > 1 && !ug->scratch[i]))
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "group '%s': reduction scratch for "
                               "%d ranks (%zu bytes a set)", g->name, g->size,
                               (size_t)(g->size - 1) * ug->segment);
    }
    return FSDP2_SUCCESS;
}

/* The process-wide context, created by the first group. When that group's peers are all
 * on this host, UCX's rendezvous threshold is raised to 1 MiB (unless UCX_RNDV_THRESH is
 * set): below it, on shared memory, eager copies cost less than the rendezvous handshake
 * plus a CMA copy; far above it eager's double copy through shared-memory FIFOs costs
 * more than the handshake saves (figures: docs/collectives.md). UCX 1.13 has no separate
 * threshold within and across hosts, so a process whose first group spans hosts keeps
 * the default. */
static fsdp2_status_t context_acquire(int all_local)
{
    fsdp2_status_t status = FSDP2_SUCCESS;
    pthread_mutex_lock(&context_lock);
    if (context_refs == 0) {
        ucp_config_t *config = NULL;
        ucs_status_t s = ucp_config_read(NULL, NULL, &config);
        if (s == UCS_OK && all_local && !getenv("UCX_RNDV_THRESH"))
            s = ucp_config_modify(config, "RNDV_THRESH", "1mb");
        if (s == UCS_OK) {
            ucp_params_t params = {
                .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
                .mt_workers_shared = 1,
            };
            s = ucp_init(&params, config, &context);
            ucp_config_release(config);
        }
        if (s != UCS_OK)
            status = ucx_status(s, "ucp_init");
    }
    if (status == FSDP2_SUCCESS)
        context_refs++;
    pthread_mutex_unlock(&context_lock);
    return status;
}

static void context_release(void)
{
    pthread_mutex_lock(&context_lock);
    if (--context_refs == 0) {
        ucp_cleanup(context);
        context = NULL;
    }
    pthread_mutex_unlock(&context_lock);
}

static void peer_failed(void *arg, ucp_ep_h ep, ucs_status_t s)
{
    (void)ep;
    ucx_peer_error_t *pe = arg;
    atomic_store(&pe->failed, 1);
    int expected = -1;
    atomic_compare_exchange_strong(&pe->ug->failed_peer, &expected, pe->peer);
    FSDP2_LOG(WARN, COLL, "group '%s': peer %d failed: %s", pe->ug->g->name, pe->peer,
              ucs_status_string(s));
}

static void ucx_group_free(ucx_group_t *ug)
{
    fsdp2_shm_destroy(ug->shm);
    if (ug->worker)
        fsdp2_ucx_stop_listening(ug);
    for (int r = 0; ug->eps && ug->worker && r < ug->g->size; r++)
        fsdp2_ucx_close_endpoint(ug, r);
    free(ug->eps);
    if (ug->worker)
        ucp_worker_destroy(ug->worker);
    for (int i = 0; i < UCX_SLOTS; i++) {
        if (ug->slots[i].list) {
            free(ug->slots[i].list->req);
            free(ug->slots[i].list->peer);
            free(ug->slots[i].list->want);
            free(ug->slots[i].list->stamp_from);
            free(ug->slots[i].list->stamps);
            free(ug->slots[i].list);
        }
    }
    for (int i = 0; i < UCX_SCRATCH_SETS; i++) {
        free(ug->scratch[i]);
        free((void *)ug->sources[i]);
    }
    free(ug->peer_errors);
    free(ug->abort_reqs);
    pthread_mutex_destroy(&ug->lock);
    pthread_cond_destroy(&ug->changed);
    free(ug);
}

static void identity_of_self(ucx_identity_t *id)
{
    memset(id, 0, sizeof(*id));
    gethostname(id->host, sizeof(id->host) - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(id->boot_id, sizeof(id->boot_id), f))
            id->boot_id[0] = '\0';
        fclose(f);
    }
    ssize_t n = readlink("/proc/self/ns/pid", id->pid_ns, sizeof(id->pid_ns) - 1);
    id->pid_ns[n > 0 ? n : 0] = '\0';
    char ipc[40] = "";
    n = readlink("/proc/self/ns/ipc", ipc, sizeof(ipc) - 1);
    ipc[n > 0 ? n : 0] = '\0';
    struct stat st;
    if (stat("/dev/shm", &st) == 0 && ipc[0])
        snprintf(id->shm_ns, sizeof(id->shm_ns), "%s shm:%llu:%llu", ipc,
                 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    id->pid = (int32_t)getpid();
    id->shm = fsdp2_env_int(FSDP2_ENV_SHM) == 0;
    id->segment = (uint64_t)fsdp2_env_int(FSDP2_ENV_UCX_SEGMENT_BYTES);
}

/* Connects every endpoint now, with a zero-byte exchange, rather than lazily inside the
 * first collective: group creation is where a user expects connection errors. */
static fsdp2_status_t wire_up(ucx_group_t *ug)
{
    fsdp2_group_t *g = ug->g;
    req_list_t *rl = ug->slots[0].list;
    rl->n = 0;
    uint64_t seq = UINT64_MAX; /* a tag no collective uses */
    for (int k = 1; k < g->size; k++) {
        int r = (g->rank + g->size - k) % g->size;
        fsdp2_ucx_add_recv(ug, rl, r, NULL, 0, make_tag(seq, PHASE_BARRIER, r, 0));
    }
    for (int k = 1; k < g->size; k++) {
        int p = (g->rank + k) % g->size;
        fsdp2_ucx_add_send(ug, rl, p, NULL, 0, make_tag(seq, PHASE_BARRIER, g->rank, 0));
    }
    return fsdp2_ucx_wait_list(ug, rl, "connecting");
}

/* Publishes where this rank runs and reads where its peers run (before any UCX object
 * exists: the context's configuration depends on it). *all_local says whether every peer
 * is on this host (identity_of_self's fields all equal). */
static fsdp2_status_t exchange_identities(ucx_group_t *ug, fsdp2_store_t *store, int *all_local,
                                          int *all_shm)
{
    fsdp2_group_t *g = ug->g;
    char key[FSDP2_GROUP_KEY_MAX];
    ucx_identity_t me, peer;
    identity_of_self(&me);
    fsdp2_group_member_key(g, "ucx/identity", g->rank, key);
    FSDP2_CHECK(fsdp2_store_set(store, key, &me, sizeof(me)));
    /* All at once first, so that a timeout names every member that never came. */
    FSDP2_CHECK(fsdp2_setup_wait_members(&g->setup, store, "ucx/identity", "join"));
    *all_local = 1;
    *all_shm = me.shm;
    for (int k = 1; k < g->size; k++) {
        int r = (g->rank + k) % g->size;
        size_t len = 0;
        fsdp2_group_member_key(g, "ucx/identity", r, key);
        FSDP2_CHECK(fsdp2_store_get(store, key, &peer, sizeof(peer), &len));
        if (len != sizeof(peer))
            return fsdp2_error(FSDP2_ERR_CORRUPT, "group '%s': rank %d's identity is %zu bytes, "
                               "not %zu (another libfsdp2 version?)", g->name, r, len,
                               sizeof(peer));
        peer.host[sizeof(peer.host) - 1] = '\0';
        peer.boot_id[sizeof(peer.boot_id) - 1] = '\0';
        peer.pid_ns[sizeof(peer.pid_ns) - 1] = '\0';
        peer.shm_ns[sizeof(peer.shm_ns) - 1] = '\0';
        ucx_peer_error_t *pe = &ug->peer_errors[r];
        pe->ug = ug;
        pe->peer = r;
        atomic_init(&pe->failed, 0);
        /* Same host: the same kernel (hostname and boot id), a pid namespace we can check
         * liveness in, and shared memory we can both see (the IPC namespace and /dev/shm);
         * otherwise UCX's failure handling, and no shared-memory transport. */
        pe->local = strcmp(peer.host, me.host) == 0 && strcmp(peer.boot_id, me.boot_id) == 0 &&
                    strcmp(peer.pid_ns, me.pid_ns) == 0 && me.pid_ns[0] &&
                    strcmp(peer.shm_ns, me.shm_ns) == 0 && me.shm_ns[0];
        pe->pid = (pid_t)peer.pid;
        *all_local &= pe->local;
        *all_shm &= peer.shm;
        if (peer.segment != me.segment) /* every member sees it: all fail alike */
            return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                               "group '%s': FSDP2_UCX_SEGMENT_BYTES is %llu on rank %d but "
                               "%llu on rank %d: UCX reductions need it alike on every rank",
                               g->name, (unsigned long long)peer.segment, r,
                               (unsigned long long)me.segment, g->rank);
    }
    ug->segment = (size_t)me.segment;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t connect_peers(ucx_group_t *ug, fsdp2_store_t *store)
{
    fsdp2_group_t *g = ug->g;
    ucp_address_t *address = NULL;
    size_t address_len = 0;
    ucs_status_t s = ucp_worker_get_address(ug->worker, &address, &address_len);
    if (s != UCS_OK)
        return ucx_status(s, "ucp_worker_get_address");
    char key[FSDP2_GROUP_KEY_MAX];
    fsdp2_group_member_key(g, "ucx/address", g->rank, key);
    fsdp2_status_t status = fsdp2_store_set(store, key, address, address_len);
    ucp_worker_release_address(ug->worker, address);
    FSDP2_CHECK(status);
    FSDP2_CHECK(fsdp2_setup_wait_members(&g->setup, store, "ucx/address", "publish its address"));
    int mode = (int)fsdp2_env_int(FSDP2_ENV_UCX_ERROR_MODE); /* 0 auto, 1 peer, 2 none */
    void *remote = fsdp2_malloc(UCX_ADDRESS_MAX);
    if (!remote)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "group '%s': address buffer", g->name);
    for (int k = 1; k < g->size && status == FSDP2_SUCCESS; k++) {
        int r = (g->rank + k) % g->size;
        size_t len = 0;
        fsdp2_group_member_key(g, "ucx/address", r, key);
        status = fsdp2_store_get(store, key, remote, UCX_ADDRESS_MAX, &len);
        if (status != FSDP2_SUCCESS)
            break;
        ucx_peer_error_t *pe = &ug->peer_errors[r];
        /* PEER mode makes UCX 1.13 use TCP even within a host: only across hosts, unless
         * FSDP2_UCX_ERROR_MODE says otherwise. */
        int use_peer_mode = mode == 1 || (mode == 0 && !pe->local);
        if (use_peer_mode)
            pe->local = 0; /* UCX reports failures; no pid checks */
        ucp_ep_params_t params = {
            .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER,
            .address = remote,
            .err_mode = use_peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE,
            .err_handler = {peer_failed, pe},
        };
        FSDP2_LOG(DEBUG, COLL, "group '%s': rank %d (pid %d) %s", g->name, r, (int)pe->pid,
                  use_peer_mode ? "with UCX peer-failure handling" : "on this host");
        s = ucp_ep_create(ug->worker, &params, &ug->eps[r]);
        if (s != UCS_OK)
            status = fsdp2_error(FSDP2_ERR_BACKEND, "group '%s': endpoint to rank %d: %s", g->name,
                                 r, ucs_status_string(s));
    }
    free(remote);
    FSDP2_CHECK(status);
    return fsdp2_setup_barrier(&g->setup, store, "ucx/connected");
}

/* The shared-memory transport's liveness check: same-host peers by pid. */
static int shm_peer_gone(void *arg, int peer)
{
    ucx_group_t *ug = arg;
    fsdp2_ucx_check_one(ug, peer);
    return atomic_load(&ug->peer_errors[peer].failed);
}

static fsdp2_status_t ucx_create(fsdp2_group_t *g, fsdp2_store_t *store)
{
    ucx_group_t *ug = fsdp2_calloc(1, sizeof(*ug));
    if (!ug)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "group '%s'", g->name);
    ug->g = g;
    ug->spin = (int)fsdp2_env_int(FSDP2_ENV_UCX_SPIN);
    atomic_init(&ug->failed_peer, -1);
    pthread_mutex_init(&ug->lock, NULL);
    pthread_cond_init(&ug->changed, NULL);
    fsdp2_status_t status = FSDP2_SUCCESS;
    ug->eps = fsdp2_calloc((size_t)g->size, sizeof(*ug->eps));
    ug->peer_errors = fsdp2_calloc((size_t)g->size, sizeof(*ug->peer_errors));
    ug->abort_reqs = fsdp2_calloc((size_t)g->size, sizeof(void *));
    atomic_init(&ug->abort_from, 0);
    atomic_init(&ug->abort_sent, 0);
    int ok = ug->eps && ug->peer_errors && ug->abort_reqs;
    /* A round's requests: a send and a receive per peer for the data and as many for
     * the stamps. */
    size_t most = 4 * (size_t)g->size + 2;
    for (int i = 0; i < UCX_SLOTS && ok; i++) {
        ug->slots[i].ug = ug;
        req_list_t *rl = fsdp2_calloc(1, sizeof(*rl));
        ug->slots[i].list = rl;
        if (rl) {
            rl->req = fsdp2_calloc(most, sizeof(void *));
            rl->peer = fsdp2_calloc(most, sizeof(int));
            rl->want = fsdp2_calloc(most, sizeof(size_t));
            rl->stamp_from = fsdp2_calloc(most, sizeof(int));
            rl->stamps = fsdp2_calloc((size_t)g->size, sizeof(coll_stamp_t));
            rl->short_peer = -1;
        }
        ok = rl && rl->req && rl->peer && rl->want && rl->stamp_from && rl->stamps;
    }
    if (!ok) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "group '%s': buffers for %d ranks", g->name,
                             g->size);
        goto cleanup;
    }
    int all_local = 1, all_shm = 0;
    FSDP2_CHECK_GOTO(exchange_identities(ug, store, &all_local, &all_shm), status, cleanup);
    FSDP2_CHECK_GOTO(context_acquire(all_local), status, cleanup);
    ug->has_context = 1;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_MULTI};
    ucs_status_t s = ucp_worker_create(context, &wp, &ug->worker);
    if (s == UCS_OK)
        s = ucp_worker_get_efd(ug->worker, &ug->efd);
    if (s != UCS_OK) {
        status = fsdp2_error(FSDP2_ERR_BACKEND, "group '%s': ucp worker: %s", g->name,
                             ucs_status_string(s));
        goto cleanup;
    }
    g->backend = ug;
    status = connect_peers(ug, store);
    if (status == FSDP2_SUCCESS)
        status = wire_up(ug);
    /* (connect_peers clears `local` for peers the user put on UCX failure handling) */
    for (int r = 0; r < g->size; r++)
        all_local &= r == g->rank || ug->peer_errors[r].local;
    if (status == FSDP2_SUCCESS && all_local && all_shm && g->size > 1 &&
        g->size <= FSDP2_SHM_MAX_RANKS)
        status = fsdp2_shm_create(g, store, shm_peer_gone, ug, &ug->shm);
    if (status == FSDP2_SUCCESS && !ug->shm)
        status = alloc_scratch(ug);
    if (status == FSDP2_SUCCESS && !ug->shm && g->size > 1)
        status = fsdp2_ucx_listen_aborts(ug);
    /* The connections' first messages, the shared-memory transport, the scratch and the
     * abort listener are each member's own: a member that failed one of them tells the
     * others (below), so the group is made on every member or on none. */
    if (status == FSDP2_SUCCESS && g->size > 1)
        status = fsdp2_setup_barrier(&g->setup, store, "ucx/ready");
    if (status == FSDP2_SUCCESS && g->size > 1) {
        int remote = 0;
        for (int r = 0; r < g->size; r++)
            remote += r != g->rank && !ug->peer_errors[r].local;
        FSDP2_LOG(INFO, COLL, "group '%s': %s (%d of %d peers on other hosts)", g->name,
                  ug->shm ? "shared memory" : "UCX messages", remote, g->size - 1);
    }
cleanup:
    if (status != FSDP2_SUCCESS) {
        /* before the teardown, which need not be quick: the others' waits end now */
        status = fsdp2_setup_failed(&g->setup, store, status);
        int had_context = ug->has_context;
        g->backend = NULL;
        ucx_group_free(ug);
        if (had_context)
            context_release();
    }
    return status;
}

static void ucx_destroy(fsdp2_group_t *g)
{
    ucx_group_free(g->backend);
    context_release();
}

static int ucx_in_flight(fsdp2_group_t *g)
{
    ucx_group_t *ug = g->backend;
    int busy = 0;
    pthread_mutex_lock(&ug->lock);
    for (int i = 0; i < UCX_SLOTS; i++)
        busy += ug->slots[i].busy;
    pthread_mutex_unlock(&ug->lock);
    return busy;
}

static void ucx_abort(fsdp2_group_t *g, const char *reason)
{
    ucx_group_t *ug = g->backend;
    if (ug->shm)
        fsdp2_shm_abort(ug->shm, reason);
    else if (!atomic_load(&ug->abort_from)) /* the peer that failed told everyone */
        fsdp2_ucx_send_abort(ug, reason);
}

const fsdp2_group_ops_t fsdp2_ucx_group_ops = {
    .name = "ucx",
    .create = ucx_create,
    .destroy = ucx_destroy,
    .enqueue = fsdp2_ucx_enqueue,
    .abort = ucx_abort,
    .in_flight = ucx_in_flight,
};
