/* The best rate oneDNN's matmul reaches on this machine at given shapes: the ceiling a
 * training step's GEMMs can approach. f32, and bf16 operands with f32 results where the
 * CPU has bf16 matrix instructions (oneDNN reports "unimplemented" elsewhere: printed as
 * such). Each shape runs repeats times after a warm-up; the best run counts. Prints one
 * JSON object.
 *
 *   bench_matmul_peak [--threads N] [--repeats R] MxNxK [MxNxK ...]
 *
 * (B is taken transposed, [N, K], as a linear layer's weight is stored.) */
#include <dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The best GFLOPS of C[m, n] = A[m, k] B[n, k]^T in dtype dt, or -1 when oneDNN has no
 * kernel for it here; impl gets the kernel's name. */
static double best_rate(dnnl_engine_t eng, dnnl_stream_t st, dnnl_data_type_t dt, long m, long n,
                        long k, int repeats, char *impl, size_t impl_size)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
    dnnl_dims_t as = {k, 1}, bs = {1, k}, cs = {n, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_memory_desc_init_by_strides(&a, 2, ad, dt, as) ||
        dnnl_memory_desc_init_by_strides(&b, 2, bd, dt, bs) ||
        dnnl_memory_desc_init_by_strides(&c, 2, cd, dnnl_f32, cs) ||
        dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) ||
        dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL)) {
        snprintf(impl, impl_size, "unimplemented");
        return -1;
    }
    const char *name = "?";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
    snprintf(impl, impl_size, "%s", name);
    dnnl_primitive_t p;
    if (dnnl_primitive_create(&p, pd)) {
        dnnl_primitive_desc_destroy(pd);
        return -1;
    }
    size_t es = dt == dnnl_f32 ? 4 : 2;
    void *ha = calloc((size_t)(m * k), es), *hb = calloc((size_t)(k * n), es);
    void *hc = calloc((size_t)(m * n), 4);
    dnnl_memory_t ma, mb, mc;
    dnnl_memory_create(&ma, &a, eng, ha);
    dnnl_memory_create(&mb, &b, eng, hb);
    dnnl_memory_create(&mc, &c, eng, hc);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    dnnl_primitive_execute(p, st, 3, args);
    dnnl_stream_wait(st);
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double t = now();
        dnnl_primitive_execute(p, st, 3, args);
        dnnl_stream_wait(st);
        t = now() - t;
        best = t < best ? t : best;
    }
    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    free(ha);
    free(hb);
    free(hc);
    return 2.0 * (double)m * (double)n * (double)k / best * 1e-9;
}

int main(int argc, char **argv)
{
    int threads = 0, repeats = 10, first = 1;
    while (first < argc && strncmp(argv[first], "--", 2) == 0 && first + 1 < argc) {
        if (strcmp(argv[first], "--threads") == 0)
            threads = atoi(argv[first + 1]);
        else if (strcmp(argv[first], "--repeats") == 0)
            repeats = atoi(argv[first + 1]);
        else
            break;
        first += 2;
    }
    if (first >= argc || repeats < 1 || threads < 0) {
        fprintf(stderr, "usage: %s [--threads N] [--repeats R] MxNxK [MxNxK ...]\n", argv[0]);
        return 2;
    }
    if (threads)
        omp_set_num_threads(threads);
    dnnl_engine_t eng;
    dnnl_stream_t st;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) ||
        dnnl_stream_create(&st, eng, dnnl_stream_default_flags)) {
        fprintf(stderr, "error: no oneDNN cpu engine\n");
        return 1;
    }
    printf("{\"threads\": %d, \"shapes\": [", omp_get_max_threads());
    for (int i = first; i < argc; i++) {
        long m, n, k;
        if (sscanf(argv[i], "%ldx%ldx%ld", &m, &n, &k) != 3 || m < 1 || n < 1 || k < 1) {
            fprintf(stderr, "error: shape '%s' is not MxNxK with positive sizes\n", argv[i]);
            return 2;
        }
        char f32_impl[128], bf16_impl[128];
        double f32 = best_rate(eng, st, dnnl_f32, m, n, k, repeats, f32_impl, sizeof(f32_impl));
        double bf16 = best_rate(eng, st, dnnl_bf16, m, n, k, repeats, bf16_impl,
                                sizeof(bf16_impl));
        printf("%s\n {\"m\": %ld, \"n\": %ld, \"k\": %ld, \"f32_gflops\": %.1f, \"f32_kernel\": "
               "\"%s\", \"bf16_gflops\": %.1f, \"bf16_kernel\": \"%s\"}",
               i > first ? "," : "", m, n, k, f32, f32_impl, bf16, bf16_impl);
    }
    printf("\n]}\n");
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return 0;
}
