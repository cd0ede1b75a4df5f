/* UTF-8 checking and repair, and GPT-2's byte-to-unicode alphabet.
 *
 * Repair follows the "maximal subpart" rule of Unicode (chapter 3, U+FFFD substitution),
 * which is what Python's bytes.decode("utf-8", errors="replace") does: a lead byte and
 * the continuation bytes that are valid after it, up to the first that is not, become
 * one U+FFFD; a byte that can never start a sequence becomes one U+FFFD by itself. */
#include <string.h>

#include "text/text_internal.h"

/* The length of the valid sequence at s[0..len) (len > 0), or the negated length of its
 * maximal invalid subpart (at least 1). */
static long utf8_sequence(const unsigned char *s, size_t len)
{
    unsigned b = s[0];
    if (b < 0x80)
        return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b == 0xE0) {
        need = 2, lo = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
        need = 2;
    } else if (b == 0xED) {
        need = 2, hi = 0x9F; /* no surrogates */
    } else if (b == 0xF0) {
        need = 3, lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
        need = 3;
    } else if (b == 0xF4) {
        need = 3, hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        return -1;
    }
    size_t k = 0;
    while (k < need && 1 + k < len) {
        unsigned c = s[1 + k];
        if (k == 0 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF))
            break;
        k++;
    }
    return k == need ? (long)(1 + k) : -(long)(1 + k);
}

size_t utf8_valid_prefix(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        /* ASCII eight bytes at a time: most text is mostly ASCII */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= len)
            break;
        long n = utf8_sequence(p + i, len - i);
        if (n < 0)
            return i;
        i += (size_t)n;
    }
    return len;
}

size_t utf8_repair(const char *s, size_t len, char *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < len) {
        long n = utf8_sequence(p + i, len - i);
        if (n > 0) {
            memcpy(out + o, s + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += (size_t)-n;
        }
    }
    return o;
}

size_t utf8_next(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned b = s[0];
    if (b < 0x80 || len < 2) {
        *cp = b;
        return 1;
    }
    if (b < 0xE0) {
        *cp = (b & 0x1Fu) << 6 | (s[1] & 0x3Fu);
        return 2;
    }
    if (b < 0xF0 || len < 4) {
        *cp = len < 3 ? b : ((b & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu));
        return len < 3 ? 1 : 3;
    }
    *cp = (b & 0x07u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu);
    return 4;
}

/* The bytes GPT-2 shows as themselves: '!'..'~', 0xA1..0xAC, 0xAE..0xFF. The others
 * (0x00..0x20, 0x7F..0xA0, 0xAD: 68 bytes) become U+0100.. in byte order. */
uint32_t byte_level_char(unsigned b)
{
    if (b <= 0x20)
        return 256 + b;
    if (b >= 0x7F && b <= 0xA0)
        return 256 + 33 + (b - 0x7F);
    if (b == 0xAD)
        return 256 + 33 + 34;
    return b;
}

int byte_level_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 256 && cp < 256 + 33)
        return (int)(cp - 256);
    if (cp >= 256 + 33 && cp < 256 + 67)
        return (int)(0x7F + (cp - 256 - 33));
    if (cp == 256 + 67)
        return 0xAD;
    return -1;
}
