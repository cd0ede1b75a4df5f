/* docs/environment.md against the env table (lib/core/env_internal.h, env_tuning.h): each
 * variable of the table has exactly one row in the doc, in the section of its part
 * (settings, set by tools, tuning constants), with the table's default; every row and
 * every FSDP2_ name the doc mentions (but status codes and the prefix alone) is a variable of the table. So neither can change
 * without the other. ENV_DOC_PATH is set by meson. */
#include <check.h>

#include "check_main.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/env_internal.h"

enum part { PART_SETTINGS, PART_TOOLS, PART_TUNING, PART_NONE };

static const char *const part_headings[] = {"## Settings", "## Set by fsdp2run and tests",
                                            "## Tuning constants"};

struct table_row {
    const char *name;
    const char *def;
    enum part part;
    int rows_seen;
};

static struct table_row table[] = {
#define ROW_SETTINGS_(id, var, kind, def, accepted, help) {var, def, PART_SETTINGS, 0},
#define ROW_TOOLS_(id, var, kind, def, accepted, help) {var, def, PART_TOOLS, 0},
#define ROW_TUNING_(id, var, kind, def, accepted, help) {var, def, PART_TUNING, 0},
    FSDP2_ENV_SETTINGS(ROW_SETTINGS_) FSDP2_ENV_TOOLS(ROW_TOOLS_) FSDP2_ENV_TUNING(ROW_TUNING_)
#undef ROW_SETTINGS_
#undef ROW_TOOLS_
#undef ROW_TUNING_
};

#define TABLE_COUNT ((int)(sizeof(table) / sizeof(table[0])))

static struct table_row *find(const char *name, size_t len)
{
    for (int i = 0; i < TABLE_COUNT; i++)
        if (strlen(table[i].name) == len && strncmp(table[i].name, name, len) == 0)
            return &table[i];
    return NULL;
}

/* The text of column col (0 = the variable) of a "| a | b | ..." row, without spaces and
 * backticks, into out. */
static void column(const char *line, int col, char *out, size_t len)
{
    const char *start = strchr(line, '|');
    for (int i = 0; i < col && start; i++)
        start = strchr(start + 1, '|');
    const char *end = start ? strchr(start + 1, '|') : NULL;
    out[0] = '\0';
    if (!end)
        return;
    start++;
    while (start < end && (*start == ' ' || *start == '`'))
        start++;
    while (end > start && (end[-1] == ' ' || end[-1] == '`'))
        end--;
    size_t n = (size_t)(end - start) < len - 1 ? (size_t)(end - start) : len - 1;
    memcpy(out, start, n);
    out[n] = '\0';
}

START_TEST(the_table_has_as_many_rows_as_the_env_map)
{
    ck_assert_int_eq(TABLE_COUNT, FSDP2_ENV_COUNT);
}
END_TEST

START_TEST(every_variable_has_one_row_in_its_section_with_its_default)
{
    FILE *doc = fopen(ENV_DOC_PATH, "r");
    ck_assert_msg(doc != NULL, "cannot open %s", ENV_DOC_PATH);
    char line[8192];
    enum part part = PART_NONE;
    int line_no = 0;
    while (fgets(line, sizeof(line), doc)) {
        line_no++;
        if (strncmp(line, "## ", 3) == 0) {
            part = PART_NONE;
            for (int i = 0; i < PART_NONE; i++)
                if (strncmp(line, part_headings[i], strlen(part_headings[i])) == 0)
                    part = (enum part)i;
        }
        /* Every FSDP2_ name in the doc that is not a status code is a variable of the
         * table (FSDP2_ENV_MAP is the table's own name). */
        for (const char *p = strstr(line, "FSDP2_"); p; p = strstr(p + 1, "FSDP2_")) {
            size_t n = strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
            if (n == 6 || strncmp(p, "FSDP2_ERR_", 10) == 0 || strncmp(p, "FSDP2_ENV_", 10) == 0)
                continue;
            ck_assert_msg(find(p, n) != NULL, "%s:%d names %.*s, which is not in the env table",
                          ENV_DOC_PATH, line_no, (int)n, p);
        }
        if (strncmp(line, "| `FSDP2_", 9) != 0)
            continue;
        char name[128], def[128];
        column(line, 0, name, sizeof(name));
        column(line, 1, def, sizeof(def));
        struct table_row *row = find(name, strlen(name));
        ck_assert_msg(row != NULL, "%s:%d has a row for %s, which is not in the env table",
                      ENV_DOC_PATH, line_no, name);
        row->rows_seen++;
        ck_assert_msg(row->part == part, "%s:%d: %s is under the wrong heading (want '%s')",
                      ENV_DOC_PATH, line_no, name, part_headings[row->part]);
        const char *want = row->def[0] ? row->def : "unset";
        ck_assert_msg(strcmp(def, want) == 0, "%s:%d: %s's default is '%s', the table's '%s'",
                      ENV_DOC_PATH, line_no, name, def, want);
    }
    fclose(doc);
    for (int i = 0; i < TABLE_COUNT; i++)
        ck_assert_msg(table[i].rows_seen == 1, "%s has %d rows in %s under '%s' (want 1)",
                      table[i].name, table[i].rows_seen, ENV_DOC_PATH,
                      part_headings[table[i].part]);
}
END_TEST

static Suite *env_doc_suite(void)
{
    Suite *s = suite_create("env_doc");
    TCase *tc = tcase_create("doc");
    tcase_add_test(tc, the_table_has_as_many_rows_as_the_env_map);
    tcase_add_test(tc, every_variable_has_one_row_in_its_section_with_its_default);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(env_doc_suite)
