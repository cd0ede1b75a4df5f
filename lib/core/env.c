/* The one table of environment variables: read once, validated, logged at INFO. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/env_internal.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log_internal.h"

typedef enum env_kind {
    ENV_INT,
    ENV_SECONDS,
    ENV_BYTES,
    ENV_ENUM,
    ENV_LIST,
    ENV_PATH,
    ENV_SECRET
} env_kind_t;

typedef struct env_var {
    const char *name;
    env_kind_t kind;
    const char *def;
    const char *accepted;
    const char *help;
} env_var_t;

static const env_var_t env_table[FSDP2_ENV_COUNT] = {
#define FSDP2_ENV_ROW_(id, var, kind, def, accepted, help) {var, ENV_##kind, def, accepted, help},
    FSDP2_ENV_MAP(FSDP2_ENV_ROW_)
#undef FSDP2_ENV_ROW_
};

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static pthread_once_t env_log_once = PTHREAD_ONCE_INIT;
static int64_t env_values[FSDP2_ENV_COUNT];
static int env_from_user[FSDP2_ENV_COUNT];
/* Each variable's text as read (NULL when unset), so that the log, fsdp2_env_describe
 * and fsdp2_env_text see what was parsed even if the process changes its environment. */
static char *env_texts[FSDP2_ENV_COUNT];
/* Parsing runs inside pthread_once, where logging or fsdp2_error (which logs) would
 * re-enter it; the failure is kept here and reported by fsdp2_env_init. */
static fsdp2_status_t env_status;
static char env_message[512];

/* Index of word [s, s+len) in "a|b|c", or -1. */
static int word_index(const char *accepted, const char *s, size_t len)
{
    int index = 0;
    const char *p = accepted;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t wlen = bar ? (size_t)(bar - p) : strlen(p);
        if (wlen == len && strncmp(p, s, len) == 0)
            return index;
        index++;
        if (!bar)
            break;
        p = bar + 1;
    }
    return -1;
}

/* "min..max" into *lo, *hi. (sscanf's "%lf.." would read "4." as the number.) */
static int parse_range(const char *accepted, double *lo, double *hi)
{
    const char *dots = strstr(accepted, "..");
    if (!dots)
        return 0;
    *lo = strtod(accepted, NULL);
    *hi = strtod(dots + 2, NULL);
    return 1;
}

/* strtoll alone would take leading spaces, '+' and "0x". */
int fsdp2_env_decimal(const char *text, int64_t lo, int64_t hi, int64_t *out)
{
    int negative = text[0] == '-' && lo < 0;
    const char *p = text + negative;
    size_t digits = strspn(p, "0123456789");
    if (digits == 0 || p[digits] != '\0' || digits > 18)
        return 0;
    int64_t v = strtoll(p, NULL, 10); /* at most 18 digits: no overflow */
    if (negative)
        v = -v;
    if (v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

fsdp2_status_t fsdp2_env_parse_int(const char *var, const char *text, int64_t lo, int64_t hi,
                                   int64_t *out)
{
    if (text && fsdp2_env_decimal(text, lo, hi, out))
        return FSDP2_SUCCESS;
    /* Digits (after a '-' where one may be) that did not parse are out of range. */
    const char *digits = text && text[0] == '-' && lo < 0 ? text + 1 : text;
    const char *why = !text || !text[0]                  ? "empty"
                      : digits[strspn(digits, "0123456789")] == '\0' && digits[0]
                          ? "out of range"
                          : "not a decimal integer";
    return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s='%s' is %s: expected a decimal integer in "
                       "%lld..%lld", var, text ? text : "", why, (long long)lo, (long long)hi);
}

/* Parses text for var into *value; on failure writes the reason into env_message. */
static fsdp2_status_t parse_value(const env_var_t *var, const char *text, int64_t *value)
{
    char *end = NULL;
    double lo = 0, hi = 0;
    char reason[sizeof(env_message)];
    switch (var->kind) {
    case ENV_INT:
        parse_range(var->accepted, &lo, &hi);
        if (!fsdp2_env_decimal(text, (int64_t)lo, (int64_t)hi, value))
            goto bad;
        return FSDP2_SUCCESS;
    case ENV_PATH:
    case ENV_SECRET:
        *value = text[0] != '\0';
        return FSDP2_SUCCESS;
    case ENV_BYTES: {
        /* Decimal digits and an optional binary suffix ("512M", "24G"). */
        size_t digits = strspn(text, "0123456789");
        const char *suffixes = "KMGT", *at = text[digits] ? strchr(suffixes, text[digits]) : NULL;
        if (digits == 0 || digits > 16 || (text[digits] && (!at || text[digits + 1])))
            goto bad;
        uint64_t v = strtoull(text, NULL, 10);
        int shift = at ? 10 * (int)(at - suffixes + 1) : 0;
        parse_range(var->accepted, &lo, &hi);
        if (v > (uint64_t)hi >> shift || (double)(v << shift) < lo)
            goto bad;
        *value = (int64_t)(v << shift);
        return FSDP2_SUCCESS;
    }
    case ENV_SECONDS: {
        /* Decimal only ("30", "2.5"): strtod would also take "0x10", "1e3" and "inf". */
        size_t digits = strspn(text, "0123456789");
        if (text[digits] == '.')
            digits += 1 + strspn(text + digits + 1, "0123456789");
        if (text[digits] != '\0' || strspn(text, "0123456789") + (text[0] == '.') == 0)
            goto bad;
        errno = 0;
        double v = strtod(text, &end);
        parse_range(var->accepted, &lo, &hi);
        if (errno || end == text || *end != '\0' || !(v >= lo && v <= hi))
            goto bad;
        *value = (int64_t)(v * 1000.0 + 0.5);
        return FSDP2_SUCCESS;
    }
    case ENV_ENUM: {
        int index = word_index(var->accepted, text, strlen(text));
        if (index < 0)
            goto bad;
        *value = index;
        return FSDP2_SUCCESS;
    }
    case ENV_LIST: {
        if (strcmp(text, "all") == 0) {
            *value = -1; /* every bit */
            return FSDP2_SUCCESS;
        }
        int64_t mask = 0;
        const char *p = text;
        for (;;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            int index = word_index(var->accepted, p, len);
            if (index < 0)
                goto bad;
            mask |= (int64_t)1 << index;
            if (!comma)
                break;
            p = comma + 1;
        }
        *value = mask;
        return FSDP2_SUCCESS;
    }
    }
bad:
    snprintf(reason, sizeof(reason), "%s='%s' is not valid: expected %s%s (%s)",
             var->name, text,
             var->kind == ENV_LIST  ? "'all' or a comma list of "
             : var->kind == ENV_INT ? "a decimal integer in "
                                    : "",
             var->accepted, var->help);
    if (env_message[0] == '\0') /* keep the first failure's message */
        snprintf(env_message, sizeof(env_message), "%s", reason);
    return FSDP2_ERR_INVALID_CONFIG;
}

static void env_parse_all(void)
{
    env_status = FSDP2_SUCCESS;
    env_message[0] = '\0';
    for (int i = 0; i < FSDP2_ENV_COUNT; i++) {
        const env_var_t *var = &env_table[i];
        int64_t def = 0;
        /* A default that does not parse is a bug in the table: report it like a bad value
         * (a test sets every default explicitly and expects success). */
        if (parse_value(var, var->def, &def) != FSDP2_SUCCESS) {
            env_status = FSDP2_ERR_INTERNAL;
            def = 0;
        }
        env_values[i] = def;
        env_from_user[i] = 0;
        free(env_texts[i]);
        env_texts[i] = NULL;
        const char *text = getenv(var->name);
        if (!text)
            continue;
        /* malloc, not fsdp2_malloc: reading the table is no allocation point of
         * FSDP2_FAULT_KIND=alloc. Without memory the variable reads as unset. */
        env_texts[i] = strdup(text);
        if (!env_texts[i])
            continue;
        int64_t v;
        if (parse_value(var, text, &v) != FSDP2_SUCCESS) {
            if (env_status == FSDP2_SUCCESS)
                env_status = FSDP2_ERR_INVALID_CONFIG;
            continue; /* keep the default; the first error's message stays */
        }
        env_values[i] = v;
        env_from_user[i] = 1;
    }
    if (env_status == FSDP2_SUCCESS) /* the fault-injection test aid */
        fsdp2_fault_configure((fault_kind_t)env_values[FSDP2_ENV_FAULT_KIND],
                              (uint64_t)env_values[FSDP2_ENV_FAULT_AT],
                              env_values[FSDP2_ENV_FAULT_RANK]);
}

/* What the log and fsdp2_env_describe show for variable i: a secret's length, never its
 * bytes. */
static const char *shown_text(int i, char *buf, size_t len)
{
    const char *text = env_texts[i] ? env_texts[i] : env_table[i].def;
    if (env_table[i].kind == ENV_SECRET && env_texts[i]) {
        snprintf(buf, len, "(%zu bytes, not shown)", strlen(env_texts[i]));
        return buf;
    }
    return text;
}

static void env_log_all(void)
{
    char secret[64];
    for (int i = 0; i < FSDP2_ENV_COUNT; i++)
        FSDP2_LOG(INFO, INIT, "%s=%s%s", env_table[i].name,
                  env_from_user[i] ? shown_text(i, secret, sizeof(secret)) : env_table[i].def,
                  env_from_user[i] ? "" : " (default)");
}

int64_t fsdp2_env_int(fsdp2_env_id_t id)
{
    pthread_once(&env_once, env_parse_all);
    return env_values[id];
}

const char *fsdp2_env_text(fsdp2_env_id_t id)
{
    pthread_once(&env_once, env_parse_all);
    return env_values[id] && env_from_user[id] ? env_texts[id] : NULL;
}

fsdp2_status_t fsdp2_env_init(void)
{
    pthread_once(&env_once, env_parse_all);
    if (env_status != FSDP2_SUCCESS)
        return fsdp2_error(env_status, "%s", env_message);
    pthread_once(&env_log_once, env_log_all);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_env_reload(void)
{
    pthread_once(&env_once, env_parse_all);
    env_parse_all();
    return fsdp2_env_init();
}

fsdp2_status_t fsdp2_env_describe(char *buf, size_t len, size_t *needed)
{
    FSDP2_ARG_CHECK(buf || len == 0, "buf is NULL with len=%zu", len);
    pthread_once(&env_once, env_parse_all);
    size_t used = 0;
    char secret[64];
    for (int i = 0; i < FSDP2_ENV_COUNT; i++) {
        const env_var_t *var = &env_table[i];
        const char *text = env_texts[i] ? shown_text(i, secret, sizeof(secret)) : NULL;
        int n = snprintf(used < len ? buf + used : NULL, used < len ? len - used : 0,
                         "%s=%s%s  accepted: %s%s  %s\n", var->name, text ? text : var->def,
                         text ? "" : " (default)", var->kind == ENV_LIST ? "all or " : "",
                         var->accepted, var->help);
        if (n > 0)
            used += (size_t)n;
    }
    if (needed)
        *needed = used + 1;
    return FSDP2_SUCCESS;
}
