/* The cpu backend's kernels, run synchronously on the calling thread (a stream worker or
 * the application thread for the current stream). Arguments already validated. */
#ifndef FSDP2_CORE_CPU_KERNELS_H
#define FSDP2_CORE_CPU_KERNELS_H

#include <stddef.h>

#include <fsdp2/kernels.h>

void fsdp2_cpu_fill(void *dst, fsdp2_dtype_t dtype, size_t n, double value);
void fsdp2_cpu_accumulate(void *y, fsdp2_dtype_t y_dtype, const void *x, fsdp2_dtype_t x_dtype,
                          size_t n, double alpha);
void fsdp2_cpu_chunk_copy(const fsdp2_chunk_copy_t *copy);

#endif
