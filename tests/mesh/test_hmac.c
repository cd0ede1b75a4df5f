/* SHA-256 and HMAC-SHA-256 (lib/mesh/hmac_sha256.c) against digests computed by
 * Python's hashlib and hmac: empty input, one block, the padding boundaries (55, 56 and
 * 64 bytes), many blocks, RFC 4231's cases 1, 2 and 6 (a key longer than a block), an
 * empty key, a key of exactly one block, and a message given in two parts. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "mesh/hmac_sha256.h"

/* Expected digests computed by Python's hashlib and hmac. data "A": len bytes of 'a';
 * data NULL: bytes 0..255 repeated to len; key NULL: key_len bytes of 0xaa. */
static const struct { const char *data; size_t len; const char *hex; } SHA_CASES[] = {
    {"", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"\x61\x62\x63", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"A", 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
    {"A", 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
    {"A", 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
    {"A", 1000, "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"},
    {NULL, 768, "f3a25aa93aa2fbba28d79260535bbd6a5eb0fc1c24a8b0f04e12b484c1dfe363"},
};
static const struct { const char *key; size_t key_len; const char *parts[2]; const char *hex; } HMAC_CASES[] = {
    {"\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b\x0b", 20, {"\x48\x69\x20\x54\x68\x65\x72\x65", NULL}, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
    {"\x4a\x65\x66\x65", 4, {"\x77\x68\x61\x74\x20\x64\x6f\x20\x79\x61\x20\x77\x61\x6e\x74\x20", "\x66\x6f\x72\x20\x6e\x6f\x74\x68\x69\x6e\x67\x3f"}, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
    {NULL, 131, {"\x54\x65\x73\x74\x20\x55\x73\x69\x6e\x67\x20\x4c\x61\x72\x67\x65\x72\x20\x54\x68\x61\x6e\x20\x42\x6c\x6f\x63\x6b\x2d\x53\x69\x7a\x65\x20\x4b\x65\x79\x20\x2d\x20\x48\x61\x73\x68\x20\x4b\x65\x79\x20\x46\x69\x72\x73\x74", NULL}, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
    {"", 0, {"", NULL}, "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad"},
    {"\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b\x6b", 64, {"\x65\x78\x61\x63\x74\x6c\x79\x20\x6f\x6e\x65\x20\x62\x6c\x6f\x63\x6b\x20\x6f\x66\x20\x6b\x65\x79", NULL}, "baa93ea4ccc7062ed6870c5e7937dbd35ad7791df4e29df9addeb429ff491acf"},
};

static void hex_of(const uint8_t *d, char *out)
{
    for (int i = 0; i < FSDP2_SHA256_BYTES; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static char *input_of(const char *data, size_t len)
{
    char *buf = malloc(len + 1);
    for (size_t i = 0; i < len; i++)
        buf[i] = !data ? (char)(i % 256) : !strcmp(data, "A") && len > 3 ? 'a' : data[i];
    return buf;
}

START_TEST(sha256_matches_hashlib)
{
    for (size_t i = 0; i < sizeof SHA_CASES / sizeof SHA_CASES[0]; i++) {
        char *in = input_of(SHA_CASES[i].data, SHA_CASES[i].len);
        uint8_t d[FSDP2_SHA256_BYTES];
        char hex[2 * FSDP2_SHA256_BYTES + 1];
        fsdp2_sha256(in, SHA_CASES[i].len, d);
        hex_of(d, hex);
        ck_assert_msg(!strcmp(hex, SHA_CASES[i].hex), "case %zu (%zu bytes): %s, want %s", i,
                      SHA_CASES[i].len, hex, SHA_CASES[i].hex);
        free(in);
    }
}
END_TEST

START_TEST(hmac_sha256_matches_python_hmac)
{
    for (size_t i = 0; i < sizeof HMAC_CASES / sizeof HMAC_CASES[0]; i++) {
        char *key = HMAC_CASES[i].key ? NULL : malloc(HMAC_CASES[i].key_len);
        if (key)
            memset(key, 0xaa, HMAC_CASES[i].key_len);
        const void *parts[2] = {HMAC_CASES[i].parts[0], HMAC_CASES[i].parts[1]};
        size_t lens[2] = {strlen(HMAC_CASES[i].parts[0]),
                          HMAC_CASES[i].parts[1] ? strlen(HMAC_CASES[i].parts[1]) : 0};
        uint8_t d[FSDP2_SHA256_BYTES];
        char hex[2 * FSDP2_SHA256_BYTES + 1];
        fsdp2_hmac_sha256(key ? key : HMAC_CASES[i].key, HMAC_CASES[i].key_len, parts, lens,
                          HMAC_CASES[i].parts[1] ? 2 : 1, d);
        hex_of(d, hex);
        ck_assert_msg(!strcmp(hex, HMAC_CASES[i].hex), "case %zu: %s, want %s", i, hex,
                      HMAC_CASES[i].hex);
        free(key);
    }
    uint8_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
    ck_assert(fsdp2_digest_equal(a, a, 4) && !fsdp2_digest_equal(a, b, 4));
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("hmac");
    TCase *tc = tcase_create("hmac");
    tcase_add_test(tc, sha256_matches_hashlib);
    tcase_add_test(tc, hmac_sha256_matches_python_hmac);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
