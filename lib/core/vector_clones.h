/* FSDP2_VECTOR_CLONES: a hot loop compiled for AVX-512 and AVX2 as well as the baseline
 * and picked at load time from the CPU's flags: the installed library must run on any
 * x86-64, so no -march=native. No clone contracts a multiply and an add into an FMA (the
 * library builds with -ffp-contract=off), so every clone gives the baseline's bits. Not
 * under ThreadSanitizer: the ifunc resolvers run before its runtime is up and crash. */
#ifndef FSDP2_CORE_VECTOR_CLONES_H
#define FSDP2_CORE_VECTOR_CLONES_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define FSDP2_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FSDP2_VECTOR_CLONES
#endif

#endif
