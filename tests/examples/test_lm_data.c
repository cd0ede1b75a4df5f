/* examples/lm's text loader: a byte corpus is read as bytes, NULs and long lines
 * included, split 90/10; a directory's "%" lines (fortune's separators) are dropped. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

START_TEST(a_byte_corpus_keeps_its_nul_bytes_and_long_lines)
{
    char dir[] = "/tmp/lm_data_XXXXXX", path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/corpus", dir);
    enum { N = 10000 };
    unsigned char *bytes = malloc(N);
    for (int i = 0; i < N; i++) /* every byte value, NUL included, a newline now and then */
        bytes[i] = (unsigned char)(i % 97 == 96 ? '\n' : (i * 7) % 256);
    write_file(path, bytes, N);
    lm_text_t text;
    char err[256];
    ck_assert_msg(lm_text_load(path, NULL, NULL, &text, err, sizeof(err)) == 0, "%s", err);
    ck_assert_msg(text.n == N, "%zu tokens from %d bytes", text.n, N);
    for (int i = 0; i < N; i++)
        ck_assert_msg(text.tokens[i] == bytes[i], "token %d is %d, byte %d", i, text.tokens[i],
                      bytes[i]);
    ck_assert_uint_eq(text.train_n, N * 9 / 10);
    lm_text_free(&text);
    unlink(path);
    rmdir(dir);
    free(bytes);
}
END_TEST

START_TEST(a_directory_drops_fortune_separators_only)
{
    char dir[] = "/tmp/lm_data_XXXXXX", path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    static const char a[] = "one\n%\ntwo\0x\n%x\n", b[] = "%";
    snprintf(path, sizeof(path), "%s/a", dir);
    write_file(path, a, sizeof(a) - 1);
    snprintf(path, sizeof(path), "%s/b", dir);
    write_file(path, b, sizeof(b) - 1);
    lm_text_t text;
    char err[256];
    ck_assert_msg(lm_text_load(dir, NULL, NULL, &text, err, sizeof(err)) == 0, "%s", err);
    static const char want[] = "one\ntwo\0x\n%x\n";
    ck_assert_uint_eq(text.n, sizeof(want) - 1);
    for (size_t i = 0; i < text.n; i++)
        ck_assert_int_eq(text.tokens[i], (unsigned char)want[i]);
    lm_text_free(&text);
    unlink(path);
    snprintf(path, sizeof(path), "%s/a", dir);
    unlink(path);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("lm_data");
    TCase *tc = tcase_create("loader");
    tcase_add_test(tc, a_byte_corpus_keeps_its_nul_bytes_and_long_lines);
    tcase_add_test(tc, a_directory_drops_fortune_separators_only);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
