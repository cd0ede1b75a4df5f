/* Module trees (fsdp2/module.h) in one process, without sharding.
 *
 * References: expected FQNs and the named_parameters order are written out by hand as
 * PyTorch would print them for the same tree; ownership is checked with the cpu
 * allocator's counters (fsdp2_memory_stats) against a snapshot taken before the tree was
 * built, so "destroy releases every tensor" is a number, not a hope (and a premature
 * free shows as a use-after-free under AddressSanitizer). Every error case checks the
 * status, that fsdp2_last_error() names the offending value, and that the tree is
 * unchanged afterwards. */
#include <check.h>

#include "../core/check_main.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/device.h>
#include <fsdp2/dtype.h>
#include <fsdp2/module.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

#define TEST_TIMEOUT_S 60

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;
static const fsdp2_device_t META = FSDP2_DEVICE_META_INIT;

#define ASSERT_OK(call)                                                                  \
    do {                                                                                 \
        fsdp2_status_t assert_ok_s_ = (call);                                            \
        ck_assert_msg(assert_ok_s_ == FSDP2_SUCCESS, "%s = %s (%s)", #call,               \
                      fsdp2_status_name(assert_ok_s_), fsdp2_last_error());             \
    } while (0)

#define ASSERT_STATUS(call, expected)                                                    \
    do {                                                                                 \
        fsdp2_status_t assert_status_s_ = (call);                                        \
        ck_assert_msg(assert_status_s_ == (expected), "%s = %s, expected %s (%s)", #call, \
                      fsdp2_status_name(assert_status_s_), fsdp2_status_name(expected),  \
                      fsdp2_last_error());                                               \
    } while (0)

/* The header promises a refusal, not which code: any error, named in the failure. */
#define ASSERT_FAILS(call)                                                               \
    do {                                                                                 \
        fsdp2_status_t assert_fails_s_ = (call);                                         \
        ck_assert_msg(assert_fails_s_ != FSDP2_SUCCESS, "%s succeeded; it must be refused", \
                      #call);                                                            \
    } while (0)

#define ASSERT_MESSAGE_HAS(needle)                                                       \
    ck_assert_msg(strstr(fsdp2_last_error(), (needle)) != NULL,                          \
                  "message '%s' does not contain '%s'", fsdp2_last_error(), (needle))

static uint64_t cpu_allocated(void)
{
    fsdp2_memory_stats_t stats;
    ASSERT_OK(fsdp2_memory_stats_get(CPU, &stats));
    return stats.allocated_bytes;
}

static fsdp2_module_t *module_new(const char *name)
{
    fsdp2_module_t *m = NULL;
    ASSERT_OK(fsdp2_module_create(name, &m));
    ck_assert_ptr_nonnull(m);
    return m;
}

static fsdp2_module_t *child_new(fsdp2_module_t *parent, const char *name)
{
    fsdp2_module_t *m = module_new(name);
    ASSERT_OK(fsdp2_module_add_child(parent, m));
    return m;
}

/* A cpu f32 tensor of shape [rows, cols] (cols 0: 1D) holding base + k. */
static fsdp2_tensor_t *cpu_f32(int64_t rows, int64_t cols, float base)
{
    int64_t shape[2] = {rows, cols};
    fsdp2_tensor_t *t = NULL;
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_F32, cols ? 2 : 1, shape, &t));
    for (int64_t k = 0; k < t->numel; k++)
        ((float *)t->data)[k] = base + (float)k;
    return t;
}

static fsdp2_tensor_t *meta_f32(int64_t rows, int64_t cols)
{
    int64_t shape[2] = {rows, cols};
    fsdp2_tensor_t *t = NULL;
    ASSERT_OK(fsdp2_tensor_empty(META, FSDP2_F32, cols ? 2 : 1, shape, &t));
    return t;
}

/* Adds a parameter and drops the caller's handle: the module's reference keeps it. */
static fsdp2_param_t *param_add(fsdp2_module_t *m, const char *name, fsdp2_tensor_t *value,
                                int requires_grad)
{
    fsdp2_param_t *p = NULL;
    ASSERT_OK(fsdp2_module_add_param(m, name, value, requires_grad, &p));
    ck_assert_ptr_nonnull(p);
    ASSERT_OK(fsdp2_tensor_release(value));
    return p;
}

static void assert_fqn(const fsdp2_param_t *p, const char *want)
{
    fsdp2_param_info_t info;
    ASSERT_OK(fsdp2_param_info(p, &info));
    ck_assert_str_eq(info.fqn, want);
}

static void assert_module_fqn(const fsdp2_module_t *m, const char *want)
{
    char buf[FSDP2_FQN_MAX];
    memset(buf, 'Z', sizeof(buf));
    ASSERT_OK(fsdp2_module_fqn(m, buf, sizeof(buf)));
    ck_assert_str_eq(buf, want);
}

static size_t child_count(const fsdp2_module_t *m)
{
    size_t n = 999;
    ASSERT_OK(fsdp2_module_child_count(m, &n));
    return n;
}

static size_t param_count(const fsdp2_module_t *m)
{
    size_t n = 999;
    ASSERT_OK(fsdp2_module_params(m, NULL, 0, &n));
    return n;
}

/* ---------------------------------------------------------------------------------- */
/* Names                                                                               */

START_TEST(fqn_joins_names_from_the_root_down_without_the_roots_name)
{
    fsdp2_module_t *root = module_new("transformer");
    fsdp2_module_t *layers = child_new(root, "layers");
    fsdp2_module_t *l0 = child_new(layers, "0");
    fsdp2_module_t *attn = child_new(l0, "attn");
    fsdp2_module_t *wq = child_new(attn, "wq");
    fsdp2_param_t *w = param_add(wq, "weight", cpu_f32(4, 3, 0), 1);
    fsdp2_param_t *emb = param_add(root, "embedding", meta_f32(10, 4), 1);

    assert_fqn(w, "layers.0.attn.wq.weight");
    assert_fqn(emb, "embedding");
    assert_module_fqn(root, "");
    assert_module_fqn(layers, "layers");
    assert_module_fqn(wq, "layers.0.attn.wq");

    /* A short buffer is truncated safely, never overrun. */
    char small[8];
    memset(small, 'Z', sizeof(small));
    if (fsdp2_module_fqn(wq, small, 6) == FSDP2_SUCCESS)
        ck_assert_msg(memchr(small, '\0', 6) != NULL, "fqn into 6 bytes is not NUL-terminated");
    ck_assert_msg(small[6] == 'Z' && small[7] == 'Z', "fqn wrote past the 6 bytes it was given");

    /* The owner of a parameter and the parent links. */
    fsdp2_module_t *owner = NULL, *parent = (fsdp2_module_t *)1;
    ASSERT_OK(fsdp2_param_module(w, &owner));
    ck_assert_ptr_eq(owner, wq);
    ASSERT_OK(fsdp2_module_parent(wq, &parent));
    ck_assert_ptr_eq(parent, attn);
    ASSERT_OK(fsdp2_module_parent(root, &parent));
    ck_assert_ptr_null(parent);
    ASSERT_OK(fsdp2_module_destroy(root));
}
END_TEST

START_TEST(children_are_listed_in_insertion_order_and_an_index_past_the_end_is_an_error)
{
    fsdp2_module_t *root = module_new("");
    const char *names[] = {"zeta", "alpha", "10", "2"};
    fsdp2_module_t *kids[4];
    for (int i = 0; i < 4; i++)
        kids[i] = child_new(root, names[i]);
    ck_assert_uint_eq(child_count(root), 4);
    ck_assert_uint_eq(child_count(kids[0]), 0);
    for (size_t i = 0; i < 4; i++) {
        fsdp2_module_t *c = NULL;
        ASSERT_OK(fsdp2_module_child(root, i, &c));
        ck_assert_msg(c == kids[i], "child %zu is %p, want %p ('%s')", i, (void *)c,
                      (void *)kids[i], names[i]);
    }
    fsdp2_module_t *c = NULL;
    ASSERT_FAILS(fsdp2_module_child(root, 4, &c));
    ASSERT_OK(fsdp2_module_destroy(root));
}
END_TEST

START_TEST(params_come_in_named_parameters_order_own_first_then_children_depth_first)
{
    /* Own parameters are added after the children on purpose: the order is by kind
     * (own, then each child's subtree), not by the time of the call. */
    fsdp2_module_t *root = module_new("");
    fsdp2_module_t *enc = child_new(root, "enc");
    fsdp2_module_t *enc_l0 = child_new(enc, "l0");
    fsdp2_module_t *enc_l1 = child_new(enc, "l1");
    fsdp2_module_t *head = child_new(root, "head");
    param_add(enc_l1, "weight", cpu_f32(2, 2, 0), 1);
    param_add(enc_l0, "weight", meta_f32(3, 2), 1);
    param_add(enc_l0, "bias", meta_f32(3, 0), 0);
    param_add(head, "proj", cpu_f32(1, 3, 0), 1);
    param_add(enc, "norm", cpu_f32(2, 0, 0), 1);
    param_add(root, "scale", cpu_f32(1, 0, 0), 1);
    param_add(root, "bias", cpu_f32(1, 0, 0), 1);

    const char *want[] = {"scale",          "bias",       "enc.norm", "enc.l0.weight",
                          "enc.l0.bias",    "enc.l1.weight", "head.proj"};
    const size_t n = sizeof(want) / sizeof(want[0]);
    ck_assert_uint_eq(param_count(root), n);

    fsdp2_param_t *all[16];
    size_t count = 0;
    ASSERT_OK(fsdp2_module_params(root, all, 16, &count));
    ck_assert_uint_eq(count, n);
    for (size_t i = 0; i < n; i++) {
        fsdp2_param_info_t info;
        ASSERT_OK(fsdp2_param_info(all[i], &info));
        ck_assert_msg(!strcmp(info.fqn, want[i]), "parameter %zu is '%s', want '%s'", i,
                      info.fqn, want[i]);
    }

    /* Capacity below the count: the true count, and only the first ones written. */
    fsdp2_param_t *some[4] = {NULL, NULL, NULL, NULL};
    ASSERT_OK(fsdp2_module_params(root, some, 2, &count));
    ck_assert_uint_eq(count, n);
    ck_assert_ptr_eq(some[0], all[0]);
    ck_assert_ptr_eq(some[1], all[1]);
    ck_assert_ptr_null(some[2]);

    /* A subtree lists its own parameters only, in the same order. */
    fsdp2_param_t *sub[8];
    ASSERT_OK(fsdp2_module_params(enc, sub, 8, &count));
    ck_assert_uint_eq(count, 4);
    for (size_t i = 0; i < 4; i++)
        ck_assert_ptr_eq(sub[i], all[2 + i]);
    ck_assert_uint_eq(param_count(head), 1);
    ASSERT_OK(fsdp2_module_destroy(root));
}
END_TEST

START_TEST(find_param_and_find_buffer_resolve_fqns_and_a_missing_one_is_not_found_naming_it)
{
    fsdp2_module_t *root = module_new("net");
    fsdp2_module_t *blk = child_new(root, "blocks");
    fsdp2_module_t *b3 = child_new(blk, "3");
    fsdp2_module_t *bn = child_new(b3, "bn");
    fsdp2_param_t *w = param_add(b3, "weight", cpu_f32(4, 4, 1), 1);
    fsdp2_param_t *g = param_add(bn, "weight", meta_f32(4, 0), 1);
    fsdp2_tensor_t *mean = cpu_f32(4, 0, 7);
    ASSERT_OK(fsdp2_module_add_buffer(bn, "running_mean", mean));

    fsdp2_param_t *p = NULL;
    ASSERT_OK(fsdp2_module_find_param(root, "blocks.3.weight", &p));
    ck_assert_ptr_eq(p, w);
    ASSERT_OK(fsdp2_module_find_param(root, "blocks.3.bn.weight", &p));
    ck_assert_ptr_eq(p, g);

    fsdp2_tensor_t *buf = NULL;
    ASSERT_OK(fsdp2_module_find_buffer(root, "blocks.3.bn.running_mean", &buf));
    ck_assert_ptr_nonnull(buf);
    ck_assert_msg(buf->data == mean->data && buf->numel == 4 && buf->ndim == 1,
                  "buffer data %p numel %lld ndim %d, want %p 4 1", buf->data,
                  (long long)buf->numel, buf->ndim, mean->data);
    ck_assert_float_eq(((float *)buf->data)[3], 10.0f);

    /* Buffers are not parameters. */
    ck_assert_uint_eq(param_count(root), 2);

    const char *missing[] = {"blocks.3.bias", "blocks.4.weight", "blocks.3.bn.running_mean",
                             "weight", "blocks.3"};
    for (size_t i = 0; i < sizeof(missing) / sizeof(missing[0]); i++) {
        p = (fsdp2_param_t *)1;
        ASSERT_STATUS(fsdp2_module_find_param(root, missing[i], &p), FSDP2_ERR_NOT_FOUND);
        ASSERT_MESSAGE_HAS(missing[i]);
    }
    ASSERT_STATUS(fsdp2_module_find_buffer(root, "blocks.3.bn.running_var", &buf),
                  FSDP2_ERR_NOT_FOUND);
    ASSERT_MESSAGE_HAS("blocks.3.bn.running_var");
    ASSERT_STATUS(fsdp2_module_find_buffer(root, "blocks.3.weight", &buf), FSDP2_ERR_NOT_FOUND);
    ASSERT_MESSAGE_HAS("blocks.3.weight");

    ASSERT_OK(fsdp2_module_destroy(root));
    ASSERT_OK(fsdp2_tensor_release(mean));
}
END_TEST

START_TEST(param_info_reports_shape_dtype_grad_flag_and_whether_values_exist)
{
    fsdp2_module_t *root = module_new("");
    int64_t shape3[3] = {2, 3, 5};
    fsdp2_tensor_t *bf = NULL;
    ASSERT_OK(fsdp2_tensor_empty(META, FSDP2_BF16, 3, shape3, &bf));
    fsdp2_param_t *a = param_add(root, "a", bf, 0);
    fsdp2_param_t *b = param_add(root, "b", cpu_f32(7, 13, 0), 1);
    int64_t scalar_shape[1] = {0};
    fsdp2_tensor_t *sc = NULL;
    ASSERT_OK(fsdp2_tensor_empty(CPU, FSDP2_F64, 0, scalar_shape, &sc));
    fsdp2_param_t *c = param_add(root, "c", sc, 1);

    fsdp2_param_info_t info;
    memset(&info, 0x5a, sizeof(info));
    ASSERT_OK(fsdp2_param_info(a, &info));
    ck_assert_str_eq(info.fqn, "a");
    ck_assert_int_eq(info.ndim, 3);
    for (int d = 0; d < 3; d++)
        ck_assert_int_eq(info.shape[d], shape3[d]);
    ck_assert_int_eq(info.dtype, FSDP2_BF16);
    ck_assert_int_eq(info.requires_grad, 0);
    ck_assert_int_eq(info.sharded, 0);
    ck_assert_int_eq(info.materialized, 0); /* meta */

    ASSERT_OK(fsdp2_param_info(b, &info));
    ck_assert_int_eq(info.ndim, 2);
    ck_assert_int_eq(info.shape[0], 7);
    ck_assert_int_eq(info.shape[1], 13);
    ck_assert_int_eq(info.dtype, FSDP2_F32);
    ck_assert_int_eq(info.requires_grad, 1);
    ck_assert_int_eq(info.sharded, 0);
    ck_assert_int_eq(info.materialized, 1); /* cpu */

    ASSERT_OK(fsdp2_param_info(c, &info));
    ck_assert_int_eq(info.ndim, 0);
    ck_assert_int_eq(info.dtype, FSDP2_F64);
    ck_assert_int_eq(info.materialized, 1);
    ASSERT_OK(fsdp2_module_destroy(root));
}
END_TEST

START_TEST(every_float_dtype_is_accepted_and_integer_dtypes_are_refused_naming_the_dtype)
{
    fsdp2_module_t *root = module_new("");
    const fsdp2_dtype_t ok[] = {FSDP2_F32, FSDP2_F64, FSDP2_BF16, FSDP2_F16};
    const fsdp2_dtype_t bad[] = {FSDP2_I32, FSDP2_I64, FSDP2_U8};
    int64_t shape[1] = {3};
    char name[16];
    for (int i = 0; i < 4; i++) {
        fsdp2_tensor_t *t = NULL;
        ASSERT_OK(fsdp2_tensor_empty(META, ok[i], 1, shape, &t));
        snprintf(name, sizeof(name), "f%d", i);
        param_add(root, name, t, 1);
    }
    for (int i = 0; i < 3; i++) {
        fsdp2_tensor_t *t = NULL;
        ASSERT_OK(fsdp2_tensor_empty(CPU, bad[i], 1, shape, &t));
        snprintf(name, sizeof(name), "int%d", i);
        fsdp2_param_t *p = (fsdp2_param_t *)1;
        ASSERT_FAILS(fsdp2_module_add_param(root, name, t, 0, &p));
        ASSERT_MESSAGE_HAS(fsdp2_dtype_name(bad[i]));
        ASSERT_OK(fsdp2_tensor_release(t));
    }
    ck_assert_uint_eq(param_count(root), 4);
    ASSERT_OK(fsdp2_module_destroy(root));
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Refusals                                                                            */

START_TEST(a_name_used_by_a_child_or_a_parameter_cannot_be_used_again_in_that_module)
{
    fsdp2_module_t *root = module_new("");
    fsdp2_module_t *enc = child_new(root, "encoder");
    param_add(root, "gamma", cpu_f32(2, 0, 0), 1);

    /* child vs child */
    fsdp2_module_t *enc2 = module_new("encoder");
    ASSERT_FAILS(fsdp2_module_add_child(root, enc2));
    ASSERT_MESSAGE_HAS("encoder");
    /* child vs parameter */
    fsdp2_module_t *gamma2 = module_new("gamma");
    ASSERT_FAILS(fsdp2_module_add_child(root, gamma2));
    ASSERT_MESSAGE_HAS("gamma");
    /* parameter vs child, parameter vs parameter */
    fsdp2_tensor_t *t = cpu_f32(2, 0, 0);
    ASSERT_FAILS(fsdp2_module_add_param(root, "encoder", t, 1, NULL));
    ASSERT_MESSAGE_HAS("encoder");
    ASSERT_FAILS(fsdp2_module_add_param(root, "gamma", t, 1, NULL));
    ASSERT_MESSAGE_HAS("gamma");

    /* Nothing changed, and the refused modules are still the caller's (roots). */
    ck_assert_uint_eq(child_count(root), 1);
    ck_assert_uint_eq(param_count(root), 1);
    fsdp2_module_t *parent = (fsdp2_module_t *)1;
    ASSERT_OK(fsdp2_module_parent(enc2, &parent));
    ck_assert_ptr_null(parent);

    /* The same name in different modules is fine (that is what FQNs are for). */
    param_add(enc, "gamma", t, 1);
    fsdp2_param_t *p = NULL;
    ASSERT_OK(fsdp2_module_find_param(root, "encoder.gamma", &p));
    ASSERT_OK(fsdp2_module_destroy(enc2));
    ASSERT_OK(fsdp2_module_destroy(gamma2));
    ASSERT_OK(fsdp2_module_destroy(root));
}
END_TEST

START_TEST(names_with_a_dot_or_longer_than_63_characters_are_refused_naming_them)
{
    fsdp2_module_t *m = (fsdp2_module_t *)1;
    ASSERT_FAILS(fsdp2_module_create("a.b", &m));
    ASSERT_MESSAGE_HAS("a.b");

    char longest[FSDP2_NAME_MAX], too_long[FSDP2_NAME_MAX + 1];
    memset(longest, 'x', sizeof(longest) - 1);
    longest[FSDP2_NAME_MAX - 1] = '\0'; /* 63 characters: allowed */
    memset(too_long, 'y', sizeof(too_long) - 1);
    too_long[FSDP2_NAME_MAX] = '\0'; /* 64 characters */

    fsdp2_module_t *root = module_new("");
    fsdp2_module_t *ok = child_new(root, longest);
    ASSERT_FAILS(fsdp2_module_create(too_long, &m));
    ASSERT_MESSAGE_HAS("yyyyyyyyyyyyyyyy");

    fsdp2_tensor_t *t = cpu_f32(2, 0, 0);
    ASSERT_FAILS(fsdp2_module_add_param(ok, "weight.T", t, 1, NULL));
    ASSERT_MESSAGE_HAS("weight.T");
    ASSERT_FAILS(fsdp2_module_add_param(ok, too_long, t, 1, NULL));
    ASSERT_MESSAGE_HAS("yyyyyyyyyyyyyyyy");
    ASSERT_FAILS(fsdp2_module_add_buffer(ok, "stats.mean", t));
    ASSERT_MESSAGE_HAS("stats.mean");
    ASSERT_FAILS(fsdp2_module_add_buffer(ok, too_long, t));
    ASSERT_MESSAGE_HAS("yyyyyyyyyyyyyyyy");
    param_add(ok, longest, t, 1);

    char want[2 * FSDP2_NAME_MAX + 1];
    snprintf(want, sizeof(want), "%s.%s", longest, longest);
    fsdp2_param_t *p = NULL;
    ASSERT_OK(fsdp2_module_find_param(root, want, &p));
    assert_fqn(p, want);

    /* Only a root may be nameless. */
    fsdp2_module_t *anon = module_new("");
    ASSERT_FAILS(fsdp2_module_add_child(root, anon));
    ck_assert_uint_eq(child_count(root), 1);
    ASSERT_OK(fsdp2_module_destroy(anon));
    ASSERT_OK(fsdp2_module_destroy(root));
}
END_TEST

START_TEST(a_child_that_already_has_a_parent_or_would_close_a_cycle_is_refused)
{
    fsdp2_module_t *r1 = module_new("first");
    fsdp2_module_t *r2 = module_new("second");
    fsdp2_module_t *trunk = child_new(r1, "trunk");
    fsdp2_module_t *leaf = child_new(trunk, "leaf");

    ASSERT_FAILS(fsdp2_module_add_child(r2, trunk));
    ASSERT_MESSAGE_HAS("trunk");
    ASSERT_FAILS(fsdp2_module_add_child(trunk, leaf)); /* twice under the same parent */
    ASSERT_FAILS(fsdp2_module_add_child(leaf, r1));    /* a root under its own grandchild */
    ASSERT_FAILS(fsdp2_module_add_child(trunk, trunk));

    fsdp2_module_t *parent = NULL;
    ASSERT_OK(fsdp2_module_parent(trunk, &parent));
    ck_assert_ptr_eq(parent, r1);
    ASSERT_OK(fsdp2_module_parent(r1, &parent));
    ck_assert_ptr_null(parent);
    ck_assert_uint_eq(child_count(r2), 0);
    ck_assert_uint_eq(child_count(trunk), 1);
    ck_assert_uint_eq(child_count(leaf), 0);
    ASSERT_OK(fsdp2_module_destroy(r2));
    ASSERT_OK(fsdp2_module_destroy(r1));
}
END_TEST

START_TEST(destroying_a_module_that_has_a_parent_is_refused_and_the_tree_survives)
{
    uint64_t before = cpu_allocated();
    fsdp2_module_t *root = module_new("");
    fsdp2_module_t *stage = child_new(root, "stage");
    fsdp2_module_t *block = child_new(stage, "block");
    fsdp2_param_t *w = param_add(block, "w", cpu_f32(3, 3, 2), 1);

    ASSERT_FAILS(fsdp2_module_destroy(block));
    ASSERT_MESSAGE_HAS("block");
    ASSERT_FAILS(fsdp2_module_destroy(stage));
    ASSERT_MESSAGE_HAS("stage");
    ASSERT_OK(fsdp2_module_destroy(NULL));

    /* Still whole: the parameter is found and its values are there. */
    fsdp2_param_t *p = NULL;
    ASSERT_OK(fsdp2_module_find_param(root, "stage.block.w", &p));
    ck_assert_ptr_eq(p, w);
    fsdp2_param_info_t info;
    ASSERT_OK(fsdp2_param_info(p, &info));
    ck_assert_int_eq(info.materialized, 1);
    ck_assert_uint_eq(child_count(stage), 1);
    ASSERT_OK(fsdp2_module_destroy(root));
    ck_assert_uint_eq(cpu_allocated(), before);
}
END_TEST

START_TEST(add_param_without_a_value_or_name_is_an_error_not_a_crash)
{
    fsdp2_module_t *root = module_new("");
    fsdp2_tensor_t *t = cpu_f32(2, 0, 0);
    ASSERT_FAILS(fsdp2_module_add_param(root, "w", NULL, 1, NULL));
    ASSERT_FAILS(fsdp2_module_add_param(root, NULL, t, 1, NULL));
    ASSERT_FAILS(fsdp2_module_add_param(NULL, "w", t, 1, NULL));
    ASSERT_FAILS(fsdp2_module_add_buffer(root, "buf", NULL));
    ASSERT_FAILS(fsdp2_module_add_child(root, NULL));
    ASSERT_FAILS(fsdp2_module_create(NULL, NULL));
    ck_assert_uint_eq(param_count(root), 0);
    ASSERT_OK(fsdp2_tensor_release(t));
    ASSERT_OK(fsdp2_module_destroy(root));
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Ownership                                                                           */

START_TEST(destroying_a_large_tree_releases_every_tensor_it_holds)
{
    uint64_t before = cpu_allocated();
    uint64_t declared = 0;
    fsdp2_module_t *root = module_new("model");
    char name[16];
    for (int l = 0; l < 24; l++) {
        snprintf(name, sizeof(name), "%d", l);
        fsdp2_module_t *layer = child_new(root, name);
        fsdp2_module_t *attn = child_new(layer, "attn");
        fsdp2_module_t *mlp = child_new(layer, "mlp");
        const char *proj[] = {"wq", "wk", "wv", "wo"};
        for (int k = 0; k < 4; k++) {
            fsdp2_module_t *lin = child_new(attn, proj[k]);
            param_add(lin, "weight", cpu_f32(8, 8, (float)l), 1);
            param_add(lin, "bias", meta_f32(8, 0), 1);
            declared += 8 * 8 * sizeof(float);
        }
        fsdp2_module_t *up = child_new(mlp, "up");
        param_add(up, "weight", cpu_f32(16, 8, 0), 1);
        declared += 16 * 8 * sizeof(float);
        fsdp2_tensor_t *stat = cpu_f32(16, 0, 0);
        ASSERT_OK(fsdp2_module_add_buffer(mlp, "count", stat));
        ASSERT_OK(fsdp2_tensor_release(stat));
        declared += 16 * sizeof(float);
    }
    ck_assert_uint_eq(param_count(root), 24 * 9);
    /* The tree holds the values alive after the caller dropped its handles. */
    ck_assert_uint_eq(cpu_allocated(), before + declared);
    fsdp2_param_t *p = NULL;
    ASSERT_OK(fsdp2_module_find_param(root, "23.attn.wo.weight", &p));
    assert_fqn(p, "23.attn.wo.weight");
    ASSERT_OK(fsdp2_module_destroy(root));
    ck_assert_uint_eq(cpu_allocated(), before);
}
END_TEST

START_TEST(destroy_drops_only_the_trees_reference_and_the_callers_handle_stays_valid)
{
    uint64_t before = cpu_allocated();
    fsdp2_module_t *root = module_new("");
    fsdp2_tensor_t *w = cpu_f32(5, 4, 0.5f);
    fsdp2_tensor_t *buf = cpu_f32(3, 0, 9);
    ASSERT_OK(fsdp2_module_add_param(root, "w", w, 1, NULL));
    ASSERT_OK(fsdp2_module_add_buffer(root, "buf", buf));
    ASSERT_OK(fsdp2_module_destroy(root));
    /* Read through the caller's handles: a premature free is a use-after-free here. */
    for (int64_t k = 0; k < w->numel; k++)
        ck_assert_float_eq(((float *)w->data)[k], 0.5f + (float)k);
    ck_assert_float_eq(((float *)buf->data)[2], 11.0f);
    ck_assert_uint_eq(cpu_allocated(), before + w->nbytes + buf->nbytes);
    ASSERT_OK(fsdp2_tensor_release(w));
    ASSERT_OK(fsdp2_tensor_release(buf));
    ck_assert_uint_eq(cpu_allocated(), before);
}
END_TEST

static TCase *tcase_new(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    return tc;
}

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_module");
    TCase *tc = tcase_new("tree");
    tcase_add_test(tc, fqn_joins_names_from_the_root_down_without_the_roots_name);
    tcase_add_test(tc, children_are_listed_in_insertion_order_and_an_index_past_the_end_is_an_error);
    tcase_add_test(tc, params_come_in_named_parameters_order_own_first_then_children_depth_first);
    tcase_add_test(tc, find_param_and_find_buffer_resolve_fqns_and_a_missing_one_is_not_found_naming_it);
    tcase_add_test(tc, param_info_reports_shape_dtype_grad_flag_and_whether_values_exist);
    tcase_add_test(tc, every_float_dtype_is_accepted_and_integer_dtypes_are_refused_naming_the_dtype);
    suite_add_tcase(s, tc);

    tc = tcase_new("refusals");
    tcase_add_test(tc, a_name_used_by_a_child_or_a_parameter_cannot_be_used_again_in_that_module);
    tcase_add_test(tc, names_with_a_dot_or_longer_than_63_characters_are_refused_naming_them);
    tcase_add_test(tc, a_child_that_already_has_a_parent_or_would_close_a_cycle_is_refused);
    tcase_add_test(tc, destroying_a_module_that_has_a_parent_is_refused_and_the_tree_survives);
    tcase_add_test(tc, add_param_without_a_value_or_name_is_an_error_not_a_crash);
    suite_add_tcase(s, tc);

    tc = tcase_new("ownership");
    tcase_add_test(tc, destroying_a_large_tree_releases_every_tensor_it_holds);
    tcase_add_test(tc, destroy_drops_only_the_trees_reference_and_the_callers_handle_stays_valid);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
