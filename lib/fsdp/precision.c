/* Mixed precision: a group's dtypes from its policy, and the casts at a module's forward
 * boundary (cast_forward_inputs, output_dtype).
 *
 * FSDP2 casts the floating tensors among forward's arguments and results itself; a C
 * library never sees the application's activations, so it answers which dtype they
 * should have and casts into tensors the application owns, on the current stream. */
#include <stdio.h>
#include <string.h>

#include <fsdp2/kernels.h>

#include "core/error.h"
#include "fsdp/fsdp_internal.h"

static fsdp2_status_t check_mp_dtype(fsdp2_dtype_t d, const char *what, const char *fqn)
{
    int is_float = 0;
    if (d == FSDP2_DTYPE_COUNT)
        return FSDP2_SUCCESS;
    fsdp2_dtype_is_float(d, &is_float);
    FSDP2_ARG_CHECK(is_float,
                    "fully_shard '%s': mixed precision %s %d (%s) is not a floating dtype", fqn,
                    what, (int)d, fsdp2_dtype_name(d));
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp_group_set_precision(fsdp_group_t *g, const fsdp2_mp_policy_t *mp,
                                        const char *fqn)
{
    FSDP2_CHECK(check_mp_dtype(mp->param_dtype, "param_dtype", fqn));
    FSDP2_CHECK(check_mp_dtype(mp->reduce_dtype, "reduce_dtype", fqn));
    FSDP2_CHECK(check_mp_dtype(mp->output_dtype, "output_dtype", fqn));
    FSDP2_ARG_CHECK(mp->cast_forward_inputs == 0 || mp->cast_forward_inputs == 1,
                    "fully_shard '%s': mixed precision cast_forward_inputs %d is not 0 or 1", fqn,
                    mp->cast_forward_inputs);
    g->mp.pdtype = mp->param_dtype == FSDP2_DTYPE_COUNT ? g->layout.dtype : mp->param_dtype;
    g->mp.rdtype = mp->reduce_dtype == FSDP2_DTYPE_COUNT ? g->mp.pdtype : mp->reduce_dtype;
    g->mp.cast = g->mp.pdtype != g->layout.dtype;
    /* As FSDP2: inputs are cast only to a param_dtype the policy names. */
    g->mp.input_dtype = mp->cast_forward_inputs ? mp->param_dtype : FSDP2_DTYPE_COUNT;
    g->mp.output_dtype = mp->output_dtype;
    FSDP2_CHECK(fsdp2_dtype_size(g->mp.pdtype, &g->mp.pe));
    FSDP2_CHECK(fsdp2_dtype_size(g->mp.rdtype, &g->mp.re));
    return FSDP2_SUCCESS;
}

/* target (COUNT: none) for a floating `dtype`, else dtype itself. */
static fsdp2_status_t boundary_dtype(fsdp2_dtype_t target, fsdp2_dtype_t dtype,
                                     fsdp2_dtype_t *out, const char *what)
{
    size_t bytes;
    FSDP2_ARG_CHECK(fsdp2_dtype_size(dtype, &bytes) == FSDP2_SUCCESS,
                    "%s: dtype %d is not a dtype", what, (int)dtype);
    int is_float = 0;
    FSDP2_CHECK(fsdp2_dtype_is_float(dtype, &is_float));
    *out = is_float && target != FSDP2_DTYPE_COUNT ? target : dtype;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_forward_input_dtype(const fsdp2_module_t *m, fsdp2_dtype_t dtype,
                                         fsdp2_dtype_t *input)
{
    FSDP2_ARG_CHECK(m && input, "forward_input_dtype: module or result pointer is NULL");
    return boundary_dtype(m->group ? m->group->mp.input_dtype : FSDP2_DTYPE_COUNT, dtype, input,
                          "forward_input_dtype");
}

fsdp2_status_t fsdp2_forward_output_dtype(const fsdp2_module_t *m, fsdp2_dtype_t dtype,
                                          fsdp2_dtype_t *output)
{
    FSDP2_ARG_CHECK(m && output, "forward_output_dtype: module or result pointer is NULL");
    return boundary_dtype(m->group ? m->group->mp.output_dtype : FSDP2_DTYPE_COUNT, dtype, output,
                          "forward_output_dtype");
}

static fsdp2_status_t cast_boundary(const fsdp2_module_t *m, fsdp2_dtype_t target,
                                    const fsdp2_tensor_t *src, fsdp2_tensor_t *dst,
                                    const char *what)
{
    FSDP2_ARG_CHECK(m && src && dst, "%s: module, source or destination is NULL", what);
    char fqn[FSDP2_FQN_MAX];
    fsdp_module_fqn(m, fqn, sizeof(fqn));
    if (!fqn[0]) /* a root: its fqn is "", its own name says more */
        snprintf(fqn, sizeof(fqn), "%s", m->name);
    fsdp2_dtype_t want;
    FSDP2_CHECK(boundary_dtype(target, src->dtype, &want, what));
    if (dst->dtype != want)
        return fsdp2_error(FSDP2_ERR_DTYPE_MISMATCH,
                           "%s '%s': the destination is %s, but a %s tensor becomes %s here",
                           what, fqn, fsdp2_dtype_name(dst->dtype), fsdp2_dtype_name(src->dtype),
                           fsdp2_dtype_name(want));
    FSDP2_CHECK(fsdp2_tensor_check(dst, what, want, src->ndim, src->shape));
    if (src->device.type != dst->device.type || src->device.index != dst->device.index)
        return fsdp2_error(FSDP2_ERR_DEVICE_MISMATCH,
                           "%s '%s': the source is on device type %d index %d, the destination "
                           "on device type %d index %d",
                           what, fqn, (int)src->device.type, src->device.index,
                           (int)dst->device.type, dst->device.index);
    if (src->numel == 0)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(src->data && dst->data, "%s '%s': a meta tensor has no values to cast", what,
                    fqn);
    fsdp2_stream_t *stream;
    FSDP2_CHECK(fsdp2_stream_current(src->device, &stream));
    return fsdp2_cast_async(dst->data, dst->dtype, src->data, src->dtype, (size_t)src->numel,
                            stream);
}

fsdp2_status_t fsdp2_cast_forward_input(const fsdp2_module_t *m, const fsdp2_tensor_t *src,
                                        fsdp2_tensor_t *dst)
{
    return cast_boundary(m, m && m->group ? m->group->mp.input_dtype : FSDP2_DTYPE_COUNT, src, dst,
                         "cast_forward_input");
}

fsdp2_status_t fsdp2_cast_forward_output(const fsdp2_module_t *m, const fsdp2_tensor_t *src,
                                         fsdp2_tensor_t *dst)
{
    return cast_boundary(m, m && m->group ? m->group->mp.output_dtype : FSDP2_DTYPE_COUNT, src, dst,
                         "cast_forward_output");
}
