/* An application outside the tree, built only with `pkg-config --cflags --libs fsdp2`
 * against an installed libfsdp2: proves the headers, the pkg-config file and the
 * exported symbols are enough to use the library. */
#include <stdio.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        fsdp2_status_t s_ = (call);                                                  \
        if (s_ != FSDP2_SUCCESS) {                                                   \
            fprintf(stderr, "%s: %s (%s)\n", #call, fsdp2_strerror(s_), fsdp2_last_error()); \
            return 1;                                                                \
        }                                                                            \
    } while (0)

int main(void)
{
    fsdp2_device_t cpu;
    CHECK(fsdp2_device_parse("cpu", &cpu));
    const int64_t shape[2] = {3, 5};
    fsdp2_tensor_t *x, *y;
    CHECK(fsdp2_tensor_zeros(cpu, FSDP2_F32, 2, shape, &x));
    CHECK(fsdp2_tensor_empty(cpu, FSDP2_BF16, 2, shape, &y));
    fsdp2_stream_t *side;
    fsdp2_event_t *done;
    CHECK(fsdp2_stream_create(cpu, "app", &side));
    CHECK(fsdp2_event_create(cpu, &done));
    CHECK(fsdp2_fill_async(x->data, FSDP2_F32, (size_t)x->numel, 1.0 / 3.0, side));
    CHECK(fsdp2_cast_async(y->data, FSDP2_BF16, x->data, FSDP2_F32, (size_t)x->numel, side));
    CHECK(fsdp2_event_record(done, side));
    CHECK(fsdp2_event_synchronize(done));
    const unsigned short *bits = y->data;
    /* 1/3 in bf16 is 0x3eab (0.333984375) */
    for (int64_t i = 0; i < y->numel; i++) {
        if (bits[i] != 0x3eab) {
            fprintf(stderr, "element %lld: 0x%04x, want 0x3eab\n", (long long)i, bits[i]);
            return 1;
        }
    }
    fsdp2_status_t bad = fsdp2_tensor_check(x, "fc1.weight", FSDP2_F32, 2, (int64_t[]){3, 6});
    if (bad != FSDP2_ERR_SHAPE_MISMATCH ||
        strcmp(fsdp2_last_error(), "tensor 'fc1.weight': shape [3,5] does not match [3,6]") != 0) {
        fprintf(stderr, "unexpected check result %d: %s\n", (int)bad, fsdp2_last_error());
        return 1;
    }
    CHECK(fsdp2_event_destroy(done));
    CHECK(fsdp2_stream_destroy(side));
    CHECK(fsdp2_tensor_release(x));
    CHECK(fsdp2_tensor_release(y));
    printf("outside app OK against libfsdp2 %s (cuda %s)\n", FSDP2_VERSION_STRING,
           FSDP2_BUILT_WITH_CUDA ? "built" : "not built");
    /* Whether cuda:0 can be had, and if not why (the CUDA module, the driver, a GPU). */
    fsdp2_device_t cuda0;
    CHECK(fsdp2_device_parse("cuda:0", &cuda0));
    if (fsdp2_device_check(cuda0) == FSDP2_SUCCESS)
        printf("cuda:0: available\n");
    else
        printf("cuda:0: %s\n", fsdp2_last_error());
    return 0;
}
