/* Fashion-MNIST for the example: the IDX files (plain or gzipped, read through zlib),
 * validated, and a distributed sampler that splits each epoch's shuffled order across
 * ranks as torch.utils.data.DistributedSampler does. */
#ifndef FMNIST_DATA_H
#define FMNIST_DATA_H

#include <stddef.h>
#include <stdint.h>

#define FMNIST_MEAN 0.2860f
#define FMNIST_STD 0.3530f
#define FMNIST_CLASSES 10

typedef struct fm_set {
    int n, rows, cols;
    uint8_t *images; /* n x rows x cols */
    uint8_t *labels; /* n, each < FMNIST_CLASSES */
} fm_set_t;

/* Reads <dir>/<prefix>-images-idx3-ubyte[.gz] and -labels-idx1-ubyte[.gz] (prefix
 * "train" or "t10k"). Returns 0, or -1 with a message naming the file and what is wrong
 * (missing, bad magic, wrong sizes, truncated, labels out of range) in err. */
int fm_load(const char *dir, const char *prefix, fm_set_t *set, char *err, size_t errlen);
/* Reads one IDX file: magic 0x00000800 | ndim, big-endian dims, then u8 data. */
int fm_read_idx(const char *path, int want_ndim, int *dims, uint8_t **data, char *err,
                size_t errlen);
void fm_free(fm_set_t *set);

/* Normalised pixels of samples idx[0..count) into x (count x rows*cols floats). */
void fm_batch(const fm_set_t *set, const int *idx, int count, float *x, int *labels);

/* This rank's sample order for an epoch: the epoch's permutation of 0..n-1 (from seed
 * and epoch; no shuffle when shuffle is 0), padded by wrapping to a multiple of ws, and
 * every ws-th entry from rank. *count = ceil(n / ws). Returns a malloc'ed array. */
int *fm_sampler(int n, int ws, int rank, uint64_t seed, int epoch, int shuffle, int *count);

#endif
