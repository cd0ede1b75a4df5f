/* A buffer of any dtype read as doubles, a chunk at a time: the collective tests check
 * buffers of millions of elements one by one, and one fsdp2_convert call per element
 * costs more than the collectives themselves (ten times more under the sanitizers).
 * FILL_CHUNKED writes values the same way. */
#ifndef FSDP2_TESTS_ELEMENTS_H
#define FSDP2_TESTS_ELEMENTS_H

#include <stddef.h>

#include <fsdp2/fsdp2.h>

#define ELEMENTS_CHUNK 4096

typedef struct elements {
    const char *data;
    fsdp2_dtype_t dtype;
    size_t esize, count;
    size_t first, have; /* v holds elements first .. first + have - 1 */
    double v[ELEMENTS_CHUNK];
} elements_t;

/* Reads `count` elements of dtype t at data; the buffer must not change while e is used. */
static inline void elements_init(elements_t *e, const void *data, fsdp2_dtype_t t, size_t count)
{
    e->data = data;
    e->dtype = t;
    e->esize = 0;
    fsdp2_dtype_size(t, &e->esize);
    e->count = count;
    e->first = 0;
    e->have = 0;
}

/* Element i (< count) as a double. */
static inline double element(elements_t *e, size_t i)
{
    if (i - e->first >= e->have) { /* (wraps when i < first) */
        e->first = i - i % ELEMENTS_CHUNK;
        e->have = e->count - e->first < ELEMENTS_CHUNK ? e->count - e->first : ELEMENTS_CHUNK;
        fsdp2_convert(e->v, FSDP2_F64, e->data + e->first * e->esize, e->dtype, e->have);
    }
    return e->v[i - e->first];
}

/* Element i of n at p (dtype t) becomes value(rank, base + i). */
#define FILL_CHUNKED(p, t, n, value, rank, base)                                            \
    do {                                                                                    \
        double fill_v_[ELEMENTS_CHUNK];                                                     \
        size_t fill_es_ = 0, fill_n_ = (n);                                                 \
        fsdp2_dtype_size((t), &fill_es_);                                                   \
        for (size_t fill_at_ = 0; fill_at_ < fill_n_; fill_at_ += ELEMENTS_CHUNK) {         \
            size_t fill_m_ = fill_n_ - fill_at_ < ELEMENTS_CHUNK ? fill_n_ - fill_at_       \
                                                                 : ELEMENTS_CHUNK;          \
            for (size_t fill_i_ = 0; fill_i_ < fill_m_; fill_i_++)                          \
                fill_v_[fill_i_] = value((rank), (base) + fill_at_ + fill_i_);              \
            fsdp2_convert((char *)(p) + fill_at_ * fill_es_, (t), fill_v_, FSDP2_F64,       \
                          fill_m_);                                                         \
        }                                                                                   \
    } while (0)

#endif
