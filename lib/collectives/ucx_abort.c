/* Failing together over UCX messages (the path across hosts): the abort message a rank
 * sends every peer when its group fails, received through a receive each group posts
 * when it is created, and the stamp (kind, bytes, dtype, reduce op, root) each
 * collective's first round carries to every peer, compared as it arrives (ucx.c's
 * wait_all). Shared memory does both through its segment (shm.c). */
#include <stdio.h>
#include <string.h>

#include "collectives/ucx_internal.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log_internal.h"

/* ---- the abort message ---- */

static void abort_arrived(void *req, ucs_status_t status, const ucp_tag_recv_info_t *info,
                          void *arg)
{
    (void)req;
    ucx_group_t *ug = arg;
    if (status == UCS_ERR_CANCELED)
        return; /* at destroy */
    if (status != UCS_OK) {
        FSDP2_LOG(WARN, COLL, "group '%s': a peer's abort message could not be received: %s",
                  ug->g->name, ucs_status_string(status));
        return;
    }
    int from = (int)((info->sender_tag >> 16) & 0xfff); /* the tag's source (make_tag) */
    ug->abort_in.reason[sizeof(ug->abort_in.reason) - 1] = '\0';
    int expected = 0;
    atomic_compare_exchange_strong(&ug->abort_from, &expected, from + 1);
}

fsdp2_status_t fsdp2_ucx_listen_aborts(ucx_group_t *ug)
{
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                 UCP_OP_ATTR_FIELD_USER_DATA |
                                                 UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                                 .cb.recv = abort_arrived,
                                 .user_data = ug};
    void *req = ucp_tag_recv_nbx(ug->worker, &ug->abort_in, sizeof(ug->abort_in),
                                 make_tag(0, PHASE_ABORT, 0, 0), PHASE_MASK, &param);
    if (UCS_PTR_IS_ERR(req))
        return fsdp2_error(FSDP2_ERR_BACKEND, "group '%s': receive for abort messages: %s",
                           ug->g->name, ucs_status_string(UCS_PTR_STATUS(req)));
    ug->abort_req = req;
    return FSDP2_SUCCESS;
}

void fsdp2_ucx_stop_listening(ucx_group_t *ug)
{
    if (!ug->abort_req)
        return;
    ucp_request_cancel(ug->worker, ug->abort_req);
    ucp_request_free(ug->abort_req);
    ug->abort_req = NULL;
}

void fsdp2_ucx_send_abort(ucx_group_t *ug, const char *reason)
{
    fsdp2_group_t *g = ug->g;
    if (!ug->worker || !ug->abort_reqs || atomic_exchange(&ug->abort_sent, 1))
        return;
    snprintf(ug->abort_out.reason, sizeof(ug->abort_out.reason), "%s", reason);
    ucp_request_param_t param = {.op_attr_mask = 0};
    int n = 0;
    for (int r = 0; r < g->size; r++) {
        if (r == g->rank || !ug->eps[r] || atomic_load(&ug->peer_errors[r].failed))
            continue;
        void *req = ucp_tag_send_nbx(ug->eps[r], &ug->abort_out, sizeof(ug->abort_out),
                                     make_tag(0, PHASE_ABORT, g->rank, 0), &param);
        if (req && !UCS_PTR_IS_ERR(req))
            ug->abort_reqs[n++] = req;
    }
    /* A short while for them to leave: the peers may be dead or stuck, and this rank is
     * failing anyway. What is still in flight is released by UCX when it completes. */
    int64_t deadline = fsdp2_now_ms() + 500;
    for (int i = 0; i < n; i++) {
        while (ucp_request_check_status(ug->abort_reqs[i]) == UCS_INPROGRESS &&
               fsdp2_now_ms() < deadline)
            ucp_worker_progress(ug->worker);
        ucp_request_free(ug->abort_reqs[i]);
    }
    FSDP2_LOG(INFO, COLL, "group '%s': told %d peer%s this rank failed", g->name, n,
              n == 1 ? "" : "s");
}

/* ---- stamps ---- */

/* This rank's call goes to every peer with a collective's first round, and each peer's
 * is received beside its data; wait_all compares them as they arrive, so two different
 * calls under one sequence number fail at once on both sides, naming both, even where
 * their data messages would never match. */
void fsdp2_ucx_add_stamps(ucx_group_t *ug, req_list_t *rl, const coll_op_t *op)
{
    fsdp2_group_t *g = ug->g;
    fsdp2_coll_stamp(op, &rl->stamps[g->rank]);
    rl->seq = op->seq;
    for (int k = 1; k < g->size; k++) {
        int r = (g->rank + g->size - k) % g->size;
        fsdp2_ucx_add_recv(ug, rl, r, &rl->stamps[r], sizeof(coll_stamp_t),
                           make_tag(op->seq, PHASE_STAMP, r, 0));
        rl->stamp_from[rl->n - 1] = r;
    }
    for (int k = 1; k < g->size; k++) {
        int p = (g->rank + k) % g->size;
        fsdp2_ucx_add_send(ug, rl, p, &rl->stamps[g->rank], sizeof(coll_stamp_t),
                           make_tag(op->seq, PHASE_STAMP, g->rank, 0));
    }
}

fsdp2_status_t fsdp2_ucx_check_stamp(ucx_group_t *ug, const req_list_t *rl, int peer)
{
    fsdp2_group_t *g = ug->g;
    if (fsdp2_coll_stamp_equal(&rl->stamps[peer], &rl->stamps[g->rank]))
        return FSDP2_SUCCESS;
    char a[160], b[160];
    fsdp2_coll_stamp_text(&rl->stamps[g->rank], rl->seq, a, sizeof(a));
    fsdp2_coll_stamp_text(&rl->stamps[peer], rl->seq, b, sizeof(b));
    return fsdp2_group_fail(g, FSDP2_ERR_INVALID_STATE,
                            "rank %d called %s where rank %d called %s: the ranks of a group "
                            "must call the same collectives in the same order",
                            peer, b, g->rank, a);
}
