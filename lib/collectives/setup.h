/* A set-up that several processes do together through the rendezvous store: a group's
 * creation, a mesh's. Its keys start with its name. A member whose part fails writes its
 * report under "<name>/setup/failed" (the first report stays), and every wait of the
 * set-up on every other member ends at once on it, with FSDP2_ERR_PEER_FAILED naming
 * that member and its error: nobody waits for a member that will not come. */
#ifndef FSDP2_COLLECTIVES_SETUP_H
#define FSDP2_COLLECTIVES_SETUP_H

#include <stddef.h>

#include <fsdp2/status.h>
#include <fsdp2/store.h>

/* The longest name, and the longest key: the name, "/", a step and a member's rank. */
#define FSDP2_SETUP_NAME_MAX 128
#define FSDP2_SETUP_KEY_MAX (FSDP2_SETUP_NAME_MAX + 64)

typedef struct fsdp2_setup {
    const char *kind; /* "group", "mesh": for messages */
    const char *name; /* the owner's (shorter than FSDP2_SETUP_NAME_MAX) */
    int rank, size; /* this member, and how many take part */
    long timeout_ms;
    /* Nothing more to report: this member reported, learnt of another's report, timed
     * out in a wait of the set-up (every member waiting there finds its own timeout), or
     * failed in a barrier's wait after arriving. */
    int failed;
    /* The set-up this one is a step of (a mesh's, for its dims' groups), or NULL: a report
     * goes there too, and what ends this set-up's reporting ends the parent's. */
    struct fsdp2_setup *parent;
} fsdp2_setup_t;

/* Member r's key for `what`: "<name>/<what>/<r>". key holds FSDP2_SETUP_KEY_MAX. */
void fsdp2_setup_key(const fsdp2_setup_t *s, const char *what, int r, char *key);

/* Waits for keys[0..n) (n >= 1) for the set-up's timeout, unless a member reports a
 * failure first; a timeout says the set-up waited to `verb`. */
fsdp2_status_t fsdp2_setup_wait_keys(fsdp2_setup_t *s, fsdp2_store_t *store,
                                     const char *const *keys, size_t n, const char *verb);

/* Waits until every member r has set its key for `what`; a timeout names the members
 * that have not: "members 2,3 did not <verb> within 300.0 s". */
fsdp2_status_t fsdp2_setup_wait_members(fsdp2_setup_t *s, fsdp2_store_t *store,
                                        const char *what, const char *verb);

/* This member sets its key for `what`, then waits for every member's. A failure of that
 * wait is not reported: the others may be past the barrier already, in steps that do not
 * watch the store, and a report would stop only some of them. */
fsdp2_status_t fsdp2_setup_barrier(fsdp2_setup_t *s, fsdp2_store_t *store, const char *what);

/* Reports that this member's part failed with status and this thread's last error, to
 * the set-up and its parents: the others' waits end at once. Returns the error to give:
 * status with that message, or, when status is a failure to reach a peer
 * (FSDP2_ERR_BACKEND, _PEER_FAILED), FSDP2_ERR_PEER_FAILED naming a member that reported
 * first (most likely the cause: a member that left takes its endpoints with it). Nothing
 * is reported once `failed` is set, or with one member. Best effort: a store that fails
 * here leaves the others to their timeout. */
fsdp2_status_t fsdp2_setup_failed(fsdp2_setup_t *s, fsdp2_store_t *store, fsdp2_status_t status);

#endif
