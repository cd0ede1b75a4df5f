/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): slice-by-8 tables, and the SSE4.2
 * crc32 instruction where the CPU has it. Both compute the same function; the tests
 * check each against a bit-at-a-time reference. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "checkpoint/safetensors.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ST_CRC32C_HAVE_SSE42 1
#include <nmmintrin.h>
#endif

#define CRC32C_POLY 0x82F63B78u

/* table[k][b]: the CRC of byte b followed by k zero bytes, so that eight bytes are
 * folded with eight lookups. */
static uint32_t crc_table[8][256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t crc = b;
        for (int bit = 0; bit < 8; bit++)
            crc = (crc >> 1) ^ (CRC32C_POLY & (0u - (crc & 1u)));
        crc_table[0][b] = crc;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int k = 1; k < 8; k++)
            crc_table[k][b] = (crc_table[k - 1][b] >> 8) ^ crc_table[0][crc_table[k - 1][b] & 0xFFu];
}

/* Works on the inverted register (crc ^ ~0), like the SSE4.2 instruction. */
static uint32_t crc_update_table(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len > 0 && ((uintptr_t)p & 7u) != 0) {
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFFu];
        len--;
    }
    while (len >= 8) {
        /* Byte-wise loads: correct on either endianness, and compilers merge them. */
        uint32_t lo = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                      (uint32_t)p[3] << 24;
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        lo ^= crc;
        crc = crc_table[7][lo & 0xFFu] ^ crc_table[6][(lo >> 8) & 0xFFu] ^
              crc_table[5][(lo >> 16) & 0xFFu] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xFFu] ^ crc_table[2][(hi >> 8) & 0xFFu] ^
              crc_table[1][(hi >> 16) & 0xFFu] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len-- > 0)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFFu];
    return crc;
}

/* The portable path on its own, whatever the CPU; not in the header: the tests declare it
 * to check it against the dispatching st_crc32c. */
uint32_t st_crc32c_portable(uint32_t crc, const void *data, size_t len);

uint32_t st_crc32c_portable(uint32_t crc, const void *data, size_t len)
{
    if (len == 0)
        return crc;
    pthread_once(&crc_table_once, crc_table_init);
    return ~crc_update_table(~crc, data, len);
}

#ifdef ST_CRC32C_HAVE_SSE42
__attribute__((target("sse4.2"))) static uint32_t crc_update_sse42(uint32_t crc,
                                                                  const unsigned char *p,
                                                                  size_t len)
{
    while (len > 0 && ((uintptr_t)p & 7u) != 0) {
        crc = _mm_crc32_u8(crc, *p++);
        len--;
    }
    uint64_t crc64 = crc;
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, sizeof word);
        crc64 = _mm_crc32_u64(crc64, word);
        p += 8;
        len -= 8;
    }
    crc = (uint32_t)crc64;
    while (len-- > 0)
        crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
#endif

uint32_t st_crc32c(uint32_t crc, const void *data, size_t len)
{
    if (len == 0)
        return crc;
#ifdef ST_CRC32C_HAVE_SSE42
    if (__builtin_cpu_supports("sse4.2"))
        return ~crc_update_sse42(~crc, data, len);
#endif
    return st_crc32c_portable(crc, data, len);
}
