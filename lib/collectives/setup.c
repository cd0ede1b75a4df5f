/* Set-ups done together through the store, and how a member's failure reaches the
 * others at once (collectives/setup.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/setup.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log_internal.h"
#include "mesh/store_internal.h"

void fsdp2_setup_key(const fsdp2_setup_t *s, const char *what, int r, char *key)
{
    snprintf(key, FSDP2_SETUP_KEY_MAX, "%s/%s/%d", s->name, what, r);
}

/* Every member's key for `what`: list[r] points into one block. */
static fsdp2_status_t member_keys(const fsdp2_setup_t *s, const char *what, char **block,
                                  const char ***list)
{
    size_t key_len = FSDP2_SETUP_KEY_MAX;
    *block = fsdp2_malloc((size_t)s->size * key_len);
    *list = fsdp2_malloc((size_t)s->size * sizeof(**list));
    if (!*block || !*list) {
        free(*block);
        free((void *)*list);
        *block = NULL;
        *list = NULL;
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "%s '%s': %d keys '%s'", s->kind, s->name,
                           s->size, what);
    }
    for (int r = 0; r < s->size; r++) {
        (*list)[r] = *block + (size_t)r * key_len;
        fsdp2_setup_key(s, what, r, *block + (size_t)r * key_len);
    }
    return FSDP2_SUCCESS;
}

/* A failed member's report, kept under "<name>/setup/failed" (the first to fail). */
typedef struct setup_outcome {
    int32_t status, rank;
    char message[240];
} setup_outcome_t;

static void failed_key(const fsdp2_setup_t *s, char *key)
{
    snprintf(key, FSDP2_SETUP_KEY_MAX, "%s/setup/failed", s->name);
}

/* Ends the reporting of s and of its parents. */
static void mark_failed(fsdp2_setup_t *s)
{
    for (; s; s = s->parent)
        s->failed = 1;
}

/* The error of a member whose set-up ended because of another's report, read from
 * `key` into *peer (len bytes); `mine`, if any, is how this member's own step failed. */
static fsdp2_status_t peer_error(fsdp2_setup_t *s, const char *key, setup_outcome_t *peer,
                                 size_t len, const char *mine)
{
    mark_failed(s); /* this member's failure is that one's */
    if (len != sizeof(*peer))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "%s '%s': '%s' is %zu bytes, not %zu (another "
                           "libfsdp2 version?)", s->kind, s->name, key, len, sizeof(*peer));
    peer->message[sizeof(peer->message) - 1] = '\0';
    return fsdp2_error(FSDP2_ERR_PEER_FAILED, "%s '%s': rank %d could not do its part of the "
                       "set-up (%s): %s%s%s", s->kind, s->name, (int)peer->rank,
                       fsdp2_status_name((fsdp2_status_t)peer->status), peer->message,
                       mine ? "; then on this member: " : "", mine ? mine : "");
}

/* Writes this member's report under s's key, unless one is there: then, for a failure
 * to reach a peer, the error names that report's member. Returns the error to give. */
static fsdp2_status_t report(fsdp2_setup_t *s, fsdp2_store_t *store, fsdp2_status_t status,
                             const char *own)
{
    s->failed = 1;
    setup_outcome_t out;
    memset(&out, 0, sizeof(out));
    out.status = (int32_t)status;
    out.rank = s->rank;
    memcpy(out.message, own, strnlen(own, sizeof(out.message) - 1)); /* cut to fit */
    char key[FSDP2_SETUP_KEY_MAX];
    failed_key(s, key);
    int swapped = 0;
    if (fsdp2_store_compare_set(store, key, "", 0, &out, sizeof(out), &swapped) != FSDP2_SUCCESS) {
        FSDP2_LOG(WARN, COLL, "%s '%s': could not tell the other members of this failure "
                  "(they wait for their timeout): %s", s->kind, s->name, fsdp2_last_error());
    } else if (!swapped && (status == FSDP2_ERR_BACKEND || status == FSDP2_ERR_PEER_FAILED)) {
        /* A failure to reach a peer, after another member reported its own: most likely
         * that one's consequence (a member that left takes its endpoints with it). A
         * timeout, a setting that differs or this member's memory are its own. */
        setup_outcome_t peer;
        size_t len = 0;
        if (fsdp2_store_get(store, key, &peer, sizeof(peer), &len) == FSDP2_SUCCESS)
            return peer_error(s, key, &peer, len, own);
    }
    return fsdp2_error(status, "%s", own);
}

fsdp2_status_t fsdp2_setup_failed(fsdp2_setup_t *s, fsdp2_store_t *store, fsdp2_status_t status)
{
    if (s->failed || s->size == 1)
        return status;
    char own[FSDP2_ERROR_MESSAGE_MAX]; /* whole: the store calls below may set another */
    snprintf(own, sizeof(own), "%s", fsdp2_last_error());
    fsdp2_status_t result = report(s, store, status, own);
    char given[FSDP2_ERROR_MESSAGE_MAX];
    snprintf(given, sizeof(given), "%s", fsdp2_last_error());
    for (fsdp2_setup_t *p = s->parent; p && !p->failed; p = p->parent)
        if (p->size > 1)
            (void)report(p, store, status, own);
    return fsdp2_error(result, "%s", given);
}

/* Waits for keys[0..n) unless a member reports its failure first: then
 * FSDP2_ERR_PEER_FAILED, naming it. A timeout is every waiting member's own: it ends
 * the reporting. */
static fsdp2_status_t wait_unless_failed(fsdp2_setup_t *s, fsdp2_store_t *store,
                                         const char *const *keys, size_t n)
{
    char failed[FSDP2_SETUP_KEY_MAX];
    failed_key(s, failed);
    setup_outcome_t peer;
    size_t len = 0;
    fsdp2_status_t status = fsdp2_store_wait_unless(store, keys, n, failed, s->timeout_ms, &peer,
                                                    sizeof(peer), &len);
    if (status == FSDP2_ERR_TIMEOUT)
        mark_failed(s);
    if (status != FSDP2_ERR_ABORTED)
        return status;
    return peer_error(s, failed, &peer, len, NULL);
}

fsdp2_status_t fsdp2_setup_wait_keys(fsdp2_setup_t *s, fsdp2_store_t *store,
                                     const char *const *keys, size_t n, const char *verb)
{
    fsdp2_status_t status = wait_unless_failed(s, store, keys, n);
    if (status == FSDP2_ERR_TIMEOUT) {
        char waited[512];
        snprintf(waited, sizeof(waited), "%s", fsdp2_last_error());
        status = fsdp2_error(FSDP2_ERR_TIMEOUT, "%s '%s': %s: %s", s->kind, s->name, verb,
                             waited);
    }
    return status;
}

/* Waits for keys[r], member r's key for one step, naming the members missing at a
 * timeout. */
static fsdp2_status_t wait_member_keys(fsdp2_setup_t *s, fsdp2_store_t *store,
                                       const char *const *keys, const char *verb)
{
    fsdp2_status_t status = wait_unless_failed(s, store, keys, (size_t)s->size);
    if (status != FSDP2_ERR_TIMEOUT)
        return status;
    char waited[512];
    snprintf(waited, sizeof(waited), "%s", fsdp2_last_error());
    char list[256];
    int count = 0;
    uint8_t *missing = malloc((size_t)s->size);
    if (missing && fsdp2_store_missing(store, keys, (size_t)s->size, missing) == FSDP2_SUCCESS)
        count = fsdp2_store_format_ranks(missing, s->size, list, sizeof(list));
    free(missing);
    if (count == 0) /* unknown, or all arrived just after the deadline */
        return fsdp2_error(FSDP2_ERR_TIMEOUT, "%s '%s': %s: %s", s->kind, s->name, verb,
                           waited);
    return fsdp2_error(FSDP2_ERR_TIMEOUT, "%s '%s' of %d: member%s %s did not %s within %.1f s "
                       "(the %s's timeout: options, or FSDP2_TIMEOUT)", s->kind, s->name,
                       s->size, count == 1 ? "" : "s", list, verb,
                       (double)s->timeout_ms / 1e3, s->kind);
}

fsdp2_status_t fsdp2_setup_wait_members(fsdp2_setup_t *s, fsdp2_store_t *store,
                                        const char *what, const char *verb)
{
    char *block;
    const char **keys;
    FSDP2_CHECK(member_keys(s, what, &block, &keys));
    fsdp2_status_t status = wait_member_keys(s, store, keys, verb);
    free(block);
    free((void *)keys);
    return status;
}

fsdp2_status_t fsdp2_setup_barrier(fsdp2_setup_t *s, fsdp2_store_t *store, const char *what)
{
    char *block;
    const char **keys;
    FSDP2_CHECK(member_keys(s, what, &block, &keys));
    char verb[FSDP2_SETUP_NAME_MAX + 32];
    snprintf(verb, sizeof(verb), "reach '%s'", what);
    fsdp2_status_t status = fsdp2_store_set(store, keys[s->rank], "1", 1);
    if (status == FSDP2_SUCCESS) {
        status = wait_member_keys(s, store, keys, verb);
        if (status != FSDP2_SUCCESS)
            mark_failed(s);
    }
    free(block);
    free((void *)keys);
    return status;
}
