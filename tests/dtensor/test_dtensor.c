/* DTensors with real processes: 1, 2, 3 and 4 ranks on 1D meshes and 4 ranks on a 2x2
 * mesh. Every placement (Replicate, Shard(0), Shard(1), Partial sum/avg, and their pairs
 * on the 2D mesh) is built (distribute, or from_local of known contributions), turned
 * into every other placement with redistribute, and checked element by element against
 * the global reference G(i) through an independent torch.chunk model of where each
 * rank's piece lies. Shapes include uneven and empty shards (5 rows over 4 ranks, 2 over
 * 4, a 0-row tensor). Partial contributions are chosen so that every sum is exact, so
 * the checks are bitwise. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../collectives/ranks.h"
#include "../core/check_main.h"
#include "core/fault.h"

#define OK(ctx, call) RANK_CHECK(ctx, (call) == FSDP2_SUCCESS, "%s: %s", #call, fsdp2_last_error())

typedef struct mesh_case {
    int ndim;
    int shape[2];
} mesh_case_t;

typedef struct world {
    rank_ctx_t *c;
    fsdp2_mesh_t *mesh;
    int mesh_ndim, mesh_shape[2], coords[2];
} world_t;

/* The global reference: small multiples of 0.5, exact in bf16 too. */
static double global_value(int64_t i)
{
    return (double)(i % 61) - 30.0 + 0.5 * (double)(i % 2);
}

/* Rows [off, off+len) of dim d that the rank at coords holds: torch.chunk applied in
 * mesh-dim order, written out independently of the library. */
static void ref_piece(const world_t *w, const fsdp2_placement_t *pl, int64_t n, int d,
                      int64_t *off, int64_t *len)
{
    int64_t lo = 0, hi = n;
    for (int i = 0; i < w->mesh_ndim; i++) {
        if (pl[i].type != FSDP2_PLACEMENT_SHARD || pl[i].dim != d)
            continue;
        int64_t size = hi - lo, k = w->mesh_shape[i], c = w->coords[i];
        int64_t chunk = (size + k - 1) / k;
        int64_t s = c * chunk < size ? c * chunk : size;
        int64_t e = (c + 1) * chunk < size ? (c + 1) * chunk : size;
        hi = lo + e;
        lo = lo + s;
    }
    *off = lo;
    *len = hi - lo;
}

/* The contribution of this rank to element i under the Partial dims of pl: sums carried
 * by coordinate 0, plus a term that cancels over each Partial dim (eps(0) = k - 1,
 * eps(c > 0) = -1), so reducing gives G exactly and the pieces are not trivially equal. */
static double contribution(const world_t *w, const fsdp2_placement_t *pl, int64_t i)
{
    double g = global_value(i), extra = 0;
    for (int m = 0; m < w->mesh_ndim; m++) {
        if (pl[m].type != FSDP2_PLACEMENT_PARTIAL)
            continue;
        if (pl[m].op == FSDP2_REDUCE_SUM && w->coords[m] != 0)
            g = 0;
        double eps = w->coords[m] == 0 ? w->mesh_shape[m] - 1 : -1;
        extra += eps * (double)(i % 5);
    }
    return g + extra;
}

static void put(void *data, fsdp2_dtype_t dtype, int64_t k, double v)
{
    switch (dtype) {
    case FSDP2_F32: ((float *)data)[k] = (float)v; break;
    case FSDP2_F64: ((double *)data)[k] = v; break;
    case FSDP2_BF16: ((uint16_t *)data)[k] = fsdp2_f64_to_bf16(v); break;
    case FSDP2_I64: ((int64_t *)data)[k] = (int64_t)v; break;
    default: break;
    }
}

static double get(const void *data, fsdp2_dtype_t dtype, int64_t k)
{
    switch (dtype) {
    case FSDP2_F32: return ((const float *)data)[k];
    case FSDP2_F64: return ((const double *)data)[k];
    case FSDP2_BF16: return fsdp2_bf16_to_f32(((const uint16_t *)data)[k]);
    case FSDP2_I64: return (double)((const int64_t *)data)[k];
    default: return NAN;
    }
}

typedef enum expect { EXPECT_GLOBAL, EXPECT_CONTRIBUTION } expect_t;

/* Walks the local block of a tensor of global shape at this rank's pieces under pl and
 * either fills t (fill = 1) or counts the elements that differ from what is expected. */
static int walk(const world_t *w, fsdp2_tensor_t *t, const fsdp2_placement_t *pl, int ndim,
                const int64_t *shape, expect_t what, int fill, const char *label)
{
    int64_t off[FSDP2_MAX_DIMS], len[FSDP2_MAX_DIMS], stride[FSDP2_MAX_DIMS];
    int64_t numel = 1, s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        ref_piece(w, pl, shape[d], d, &off[d], &len[d]);
        stride[d] = s;
        s *= shape[d];
    }
    for (int d = 0; d < ndim; d++)
        numel *= len[d];
    int bad = 0;
    bad += RANK_CHECK(w->c, t->numel == numel && t->ndim == ndim,
                      "%s: local numel %lld, want %lld", label, (long long)t->numel,
                      (long long)numel);
    for (int d = 0; d < ndim && !bad; d++)
        bad += RANK_CHECK(w->c, t->shape[d] == len[d], "%s: local dim %d is %lld, want %lld",
                          label, d, (long long)t->shape[d], (long long)len[d]);
    if (bad)
        return bad;
    for (int64_t k = 0; k < numel; k++) {
        int64_t rest = k, g = 0;
        for (int d = ndim - 1; d >= 0; d--) {
            g += (off[d] + rest % len[d]) * stride[d];
            rest /= len[d];
        }
        double want = what == EXPECT_GLOBAL ? global_value(g) : contribution(w, pl, g);
        if (t->dtype == FSDP2_I64)
            want = (double)(int64_t)want; /* as put() stores it */
        if (fill) {
            put(t->data, t->dtype, k, want);
        } else if (get(t->data, t->dtype, k) != want) {
            if (bad++ < 3)
                RANK_CHECK(w->c, 0, "%s: element %lld (global %lld) is %g, want %g", label,
                           (long long)k, (long long)g, get(t->data, t->dtype, k), want);
        }
    }
    return bad ? 1 : 0;
}

static int has_partial(const world_t *w, const fsdp2_placement_t *pl)
{
    for (int i = 0; i < w->mesh_ndim; i++) {
        if (pl[i].type == FSDP2_PLACEMENT_PARTIAL)
            return 1;
    }
    return 0;
}

static int valid_for(const world_t *w, const fsdp2_placement_t *pl, int ndim)
{
    for (int i = 0; i < w->mesh_ndim; i++) {
        if (pl[i].type == FSDP2_PLACEMENT_SHARD && pl[i].dim >= ndim)
            return 0;
    }
    return 1;
}

static int check_full(world_t *w, const fsdp2_dtensor_t *dt, int ndim, const int64_t *shape,
                      const char *label)
{
    fsdp2_tensor_t *full = NULL;
    int fails = OK(w->c, fsdp2_dtensor_full_tensor(dt, w->c->stream, &full));
    if (fails)
        return fails;
    fsdp2_placement_t rep[2] = {FSDP2_REPLICATE_INIT, FSDP2_REPLICATE_INIT};
    fails += walk(w, full, rep, ndim, shape, EXPECT_GLOBAL, 0, label);
    fsdp2_tensor_release(full);
    return fails;
}

/* The source DTensor for placements pl: distribute when nothing is partial (from the
 * last rank), else from_local of this rank's contributions (checked across ranks). */
static int make_source(world_t *w, const fsdp2_placement_t *pl, fsdp2_dtype_t dtype, int ndim,
                       const int64_t *shape, fsdp2_dtensor_t **out)
{
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    int fails = 0;
    if (!has_partial(w, pl)) {
        fsdp2_tensor_t *full;
        fsdp2_placement_t rep[2] = {FSDP2_REPLICATE_INIT, FSDP2_REPLICATE_INIT};
        fsdp2_device_t where = cpu;
        int src = w->c->size - 1;
        if (w->c->rank != src)
            where.type = FSDP2_DEVICE_META; /* values come from src: no memory needed here */
        fails += OK(w->c, fsdp2_tensor_empty(where, dtype, ndim, shape, &full));
        if (fails)
            return fails;
        if (w->c->rank == src)
            walk(w, full, rep, ndim, shape, EXPECT_GLOBAL, 1, "fill");
        fails += OK(w->c, fsdp2_dtensor_distribute(full, w->mesh, pl, src, w->c->stream, out));
        fsdp2_tensor_release(full);
        return fails;
    }
    int64_t off[FSDP2_MAX_DIMS], len[FSDP2_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        ref_piece(w, pl, shape[d], d, &off[d], &len[d]);
    fsdp2_tensor_t *local;
    fails += OK(w->c, fsdp2_tensor_empty(cpu, dtype, ndim, len, &local));
    if (fails)
        return fails;
    walk(w, local, pl, ndim, shape, EXPECT_CONTRIBUTION, 1, "fill");
    fails += OK(w->c, fsdp2_dtensor_from_local(local, w->mesh, pl, ndim, shape, 1, w->c->stream, out));
    fsdp2_tensor_release(local);
    return fails;
}

static void label_of(char *buf, size_t n, const char *what, const world_t *w,
                     const fsdp2_placement_t *a, const fsdp2_placement_t *b, int ndim,
                     const int64_t *shape, fsdp2_dtype_t dtype)
{
    char pa[96], pb[96] = "", sh[64];
    fsdp2_placements_format(w->mesh_ndim, a, pa, sizeof(pa));
    if (b)
        fsdp2_placements_format(w->mesh_ndim, b, pb, sizeof(pb));
    fsdp2_shape_format(ndim, shape, sh, sizeof(sh));
    snprintf(buf, n, "%s %s %s%s%s %s", what, sh, pa, b ? " -> " : "", pb, fsdp2_dtype_name(dtype));
}

/* The placements tried on this mesh. */
static int placement_set(const world_t *w, fsdp2_placement_t (*set)[2])
{
    const fsdp2_placement_t one[] = {FSDP2_REPLICATE_INIT, FSDP2_SHARD_INIT(0), FSDP2_SHARD_INIT(1),
                                     FSDP2_PARTIAL_SUM_INIT, FSDP2_PARTIAL_AVG_INIT};
    int n = 0;
    if (w->mesh_ndim == 1) {
        for (int a = 0; a < 5; a++) {
            set[n][0] = one[a];
            set[n++][1] = one[0];
        }
        return n;
    }
    for (int a = 0; a < 4; a++) {
        for (int b = 0; b < 4; b++) {
            set[n][0] = one[a];
            set[n++][1] = one[b];
        }
    }
    set[n][0] = one[4]; /* [Partial(avg), Shard(0)] */
    set[n++][1] = one[1];
    set[n][0] = one[1]; /* [Shard(0), Partial(avg)] */
    set[n++][1] = one[4];
    return n;
}

static int every_pair(world_t *w, int ndim, const int64_t *shape, fsdp2_dtype_t dtype)
{
    fsdp2_placement_t set[24][2];
    int n = placement_set(w, set);
    int fails = 0;
    char label[256];
    for (int a = 0; a < n && !fails; a++) {
        if (!valid_for(w, set[a], ndim))
            continue;
        fsdp2_dtensor_t *src = NULL;
        label_of(label, sizeof(label), "source", w, set[a], NULL, ndim, shape, dtype);
        fails += make_source(w, set[a], dtype, ndim, shape, &src);
        if (fails) {
            RANK_CHECK(w->c, 0, "%s could not be made", label);
            break;
        }
        fails += check_full(w, src, ndim, shape, label);
        for (int b = 0; b < n && !fails; b++) {
            if (!valid_for(w, set[b], ndim))
                continue;
            label_of(label, sizeof(label), "redistribute", w, set[a], set[b], ndim, shape, dtype);
            fsdp2_dtensor_t *dst = NULL;
            fails += OK(w->c, fsdp2_dtensor_redistribute(src, set[b], w->c->stream, &dst));
            if (fails)
                break;
            fsdp2_tensor_t *local;
            fsdp2_dtensor_to_local(dst, &local);
            if (has_partial(w, set[b]))
                fails += check_full(w, dst, ndim, shape, label);
            else
                fails += walk(w, local, set[b], ndim, shape, EXPECT_GLOBAL, 0, label);
            fsdp2_dtensor_info_t info;
            fsdp2_dtensor_info(dst, &info);
            for (int d = 0; d < ndim; d++) {
                int64_t off, len;
                ref_piece(w, set[b], shape[d], d, &off, &len);
                fails += RANK_CHECK(w->c, info.offset[d] == off && info.local_shape[d] == len &&
                                              info.shape[d] == shape[d] && info.empty == (local->numel == 0),
                                    "%s: info dim %d offset %lld len %lld, want %lld %lld", label,
                                    d, (long long)info.offset[d], (long long)info.local_shape[d],
                                    (long long)off, (long long)len);
            }
            fsdp2_tensor_release(local);
            fsdp2_dtensor_release(dst);
        }
        fsdp2_dtensor_release(src);
    }
    return fails;
}

/* Seeded init fills the same global values whatever the mesh and placements: compared
 * with one process filling the whole tensor. */
static int init_is_invariant(world_t *w)
{
    const int64_t shape[2] = {7, 13};
    fsdp2_placement_t set[24][2];
    int n = placement_set(w, set);
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    const fsdp2_random_init_t inits[2] = {FSDP2_RANDOM_NORMAL_INIT(1234, 0.0, 0.02),
                                          FSDP2_RANDOM_UNIFORM_INIT(99, -1.0, 1.0)};
    int fails = 0;
    for (int r = 0; r < 2; r++) {
        fsdp2_tensor_t *whole;
        fails += OK(w->c, fsdp2_tensor_empty(cpu, FSDP2_BF16, 2, shape, &whole));
        fails += OK(w->c, fsdp2_random_fill(whole, &inits[r], NULL, NULL));
        for (int a = 0; a < n && !fails; a++) {
            fsdp2_dtensor_t *dt = NULL;
            fsdp2_tensor_t *full = NULL;
            fails += OK(w->c, fsdp2_dtensor_empty(w->mesh, set[a], cpu, FSDP2_BF16, 2, shape, &dt));
            fails += OK(w->c, fsdp2_dtensor_init_random(dt, &inits[r]));
            fails += OK(w->c, fsdp2_dtensor_full_tensor(dt, w->c->stream, &full));
            if (!fails) {
                char pl[96];
                fsdp2_placements_format(w->mesh_ndim, set[a], pl, sizeof(pl));
                fails += RANK_CHECK(w->c, !memcmp(full->data, whole->data, whole->nbytes),
                                    "init %d on %s differs from the whole tensor's", r, pl);
            }
            fsdp2_tensor_release(full);
            fsdp2_dtensor_release(dt);
        }
        fsdp2_tensor_release(whole);
    }
    return fails;
}

/* distribute with every rank holding the values, and from rank 0. */
static int distribute_variants(world_t *w)
{
    const int64_t shape[2] = {5, 3};
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_placement_t rep[2] = {FSDP2_REPLICATE_INIT, FSDP2_REPLICATE_INIT};
    fsdp2_placement_t pl[2] = {FSDP2_SHARD_INIT(0), FSDP2_SHARD_INIT(1)};
    fsdp2_tensor_t *full;
    int fails = OK(w->c, fsdp2_tensor_empty(cpu, FSDP2_F32, 2, shape, &full));
    if (fails)
        return fails;
    walk(w, full, rep, 2, shape, EXPECT_GLOBAL, 1, "fill");
    const int sources[2] = {FSDP2_DISTRIBUTE_ALL, 0};
    for (int s = 0; s < 2; s++) {
        fsdp2_dtensor_t *dt = NULL;
        fails += OK(w->c, fsdp2_dtensor_distribute(full, w->mesh, pl, sources[s], NULL, &dt));
        if (fails)
            break;
        fsdp2_tensor_t *local;
        fsdp2_dtensor_to_local(dt, &local);
        fails += walk(w, local, pl, 2, shape, EXPECT_GLOBAL, 0, "distribute variant");
        fsdp2_tensor_release(local);
        fsdp2_dtensor_release(dt);
    }
    /* Integers move (gathers and slices only). */
    fsdp2_tensor_t *ints;
    fails += OK(w->c, fsdp2_tensor_empty(cpu, FSDP2_I64, 2, shape, &ints));
    if (!fails) {
        walk(w, ints, rep, 2, shape, EXPECT_GLOBAL, 1, "fill");
        fsdp2_dtensor_t *dt = NULL;
        fails += OK(w->c, fsdp2_dtensor_distribute(ints, w->mesh, pl, 0, NULL, &dt));
        if (dt)
            fails += check_full(w, dt, 2, shape, "i64 round trip");
        fsdp2_dtensor_release(dt);
        fsdp2_tensor_release(ints);
    }
    /* Replicated result: new storage, never the caller's. */
    fsdp2_dtensor_t *dt = NULL;
    fails += OK(w->c, fsdp2_dtensor_distribute(full, w->mesh, rep, FSDP2_DISTRIBUTE_ALL, NULL, &dt));
    if (dt) {
        fsdp2_tensor_t *local;
        fsdp2_dtensor_to_local(dt, &local);
        fails += RANK_CHECK(w->c, local->data != full->data, "replicated distribute aliases the input");
        fsdp2_tensor_release(local);
        fsdp2_dtensor_release(dt);
    }
    fsdp2_tensor_release(full);
    return fails;
}

/* Meta DTensors: shapes move, no memory, no communication. */
static int meta_moves_shapes(world_t *w)
{
    const int64_t shape[2] = {5, 3};
    fsdp2_device_t meta = FSDP2_DEVICE_META_INIT;
    fsdp2_placement_t s0[2] = {FSDP2_SHARD_INIT(0), FSDP2_SHARD_INIT(0)};
    fsdp2_placement_t rep[2] = {FSDP2_REPLICATE_INIT, FSDP2_REPLICATE_INIT};
    fsdp2_dtensor_t *dt = NULL, *r = NULL;
    int fails = OK(w->c, fsdp2_dtensor_empty(w->mesh, s0, meta, FSDP2_F32, 2, shape, &dt));
    fails += OK(w->c, fsdp2_dtensor_redistribute(dt, rep, NULL, &r));
    if (!fails) {
        fsdp2_dtensor_info_t a, b;
        fsdp2_dtensor_info(dt, &a);
        fsdp2_dtensor_info(r, &b);
        int64_t off, len;
        ref_piece(w, s0, 5, 0, &off, &len);
        fails += RANK_CHECK(w->c, a.local_shape[0] == len && a.offset[0] == off &&
                                      b.local_shape[0] == 5 && a.device.type == FSDP2_DEVICE_META,
                            "meta shard %lld@%lld, replicated %lld", (long long)a.local_shape[0],
                            (long long)a.offset[0], (long long)b.local_shape[0]);
        fsdp2_tensor_t *local;
        fsdp2_dtensor_to_local(r, &local);
        fails += RANK_CHECK(w->c, local->data == NULL, "meta local has data");
        fsdp2_tensor_release(local);
    }
    fsdp2_dtensor_release(r);
    fsdp2_dtensor_release(dt);
    return fails;
}

static int is_error(world_t *w, fsdp2_status_t s, const char *needle, const char *what)
{
    int wanted = s == FSDP2_ERR_INVALID_ARGUMENT || s == FSDP2_ERR_SHAPE_MISMATCH;
    return RANK_CHECK(w->c, wanted && strstr(fsdp2_last_error(), needle),
                      "%s: status %s, message '%s' should name '%s'", what, fsdp2_status_name(s),
                      fsdp2_last_error(), needle);
}

/* Mistakes are errors naming the values; collective ones fail on every rank. */
static int mistakes_are_errors(world_t *w)
{
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_placement_t s0[2] = {FSDP2_SHARD_INIT(0), FSDP2_REPLICATE_INIT};
    fsdp2_placement_t s5[2] = {FSDP2_SHARD_INIT(5), FSDP2_REPLICATE_INIT};
    fsdp2_placement_t part[2] = {FSDP2_PARTIAL_SUM_INIT, FSDP2_PARTIAL_SUM_INIT};
    fsdp2_placement_t rep[2] = {FSDP2_REPLICATE_INIT, FSDP2_REPLICATE_INIT};
    const int64_t shape[2] = {6, 2};
    int fails = 0;
    fsdp2_dtensor_t *dt = NULL;

    fails += is_error(w, fsdp2_dtensor_empty(w->mesh, s5, cpu, FSDP2_F32, 2, shape, &dt),
                      "Shard(dim=5)", "shard dim out of range");

    /* A wrong local shape: refused locally (no communication without verify). */
    int64_t off, len;
    ref_piece(w, s0, 6, 0, &off, &len);
    int64_t wrong[2] = {len + 1, 2};
    fsdp2_tensor_t *local;
    fails += OK(w->c, fsdp2_tensor_zeros(cpu, FSDP2_F32, 2, wrong, &local));
    fails += is_error(w, fsdp2_dtensor_from_local(local, w->mesh, s0, 2, shape, 0, NULL, &dt),
                      "does not match", "from_local with a wrong local shape");
    fsdp2_tensor_release(local);

    /* The last rank declares another global shape: with verify every rank fails. */
    int last = w->c->rank == w->c->size - 1;
    int64_t declared[2] = {last && w->c->size > 1 ? 7 : 6, 2};
    ref_piece(w, s0, declared[0], 0, &off, &len);
    int64_t mine[2] = {len, 2};
    fails += OK(w->c, fsdp2_tensor_zeros(cpu, FSDP2_F32, 2, mine, &local));
    fsdp2_status_t s = fsdp2_dtensor_from_local(local, w->mesh, s0, 2, declared, 1, NULL, &dt);
    if (w->c->size > 1)
        fails += is_error(w, s, last ? "[7,2]" : "disagree",
                          "from_local verify with a disagreeing rank");
    else
        fails += OK(w->c, s) + OK(w->c, fsdp2_dtensor_release(dt));
    dt = NULL;
    fsdp2_tensor_release(local);

    /* distribute with a mismatched shape on one rank: all fail, nobody hangs. */
    fsdp2_tensor_t *full;
    int64_t fshape[2] = {last ? 9 : 6, 2};
    fails += OK(w->c, fsdp2_tensor_zeros(cpu, FSDP2_F32, 2, fshape, &full));
    s = fsdp2_dtensor_distribute(full, w->mesh, s0, 0, NULL, &dt);
    if (w->c->size > 1)
        fails += is_error(w, s, last ? "[9,2]" : "disagree", "distribute with a mismatched shape");
    else
        fails += OK(w->c, s) + OK(w->c, fsdp2_dtensor_release(dt));
    dt = NULL;
    fsdp2_tensor_release(full);

    /* Integers move but do not reduce. */
    fsdp2_dtensor_t *ints = NULL, *out = NULL;
    fails += OK(w->c, fsdp2_dtensor_zeros(w->mesh, part, cpu, FSDP2_I64, 2, shape, &ints));
    fails += is_error(w, fsdp2_dtensor_redistribute(ints, rep, NULL, &out), "floating",
                      "reducing integers");
    fsdp2_dtensor_release(ints);

    /* fsdp2_dtensor_check names what differs. */
    fails += OK(w->c, fsdp2_dtensor_zeros(w->mesh, s0, cpu, FSDP2_F32, 2, shape, &dt));
    fails += OK(w->c, fsdp2_dtensor_check(dt, "w", w->mesh, s0, FSDP2_F32, 2, shape));
    fails += is_error(w, fsdp2_dtensor_check(dt, "w", w->mesh, rep, FSDP2_F32, 2, shape),
                      "[Shard(dim=0)", "placement mismatch");
    fails += is_error(w, fsdp2_dtensor_check(dt, "w", w->mesh, s0, FSDP2_BF16, 2, shape), "bf16",
                      "dtype mismatch");
    int stranger; /* only compared, never used as a mesh */
    fails += is_error(w, fsdp2_dtensor_check(dt, "w", (const fsdp2_mesh_t *)(void *)&stranger, s0,
                                             FSDP2_F32, 2, shape),
                      "mesh", "mesh mismatch");
    int64_t other[2] = {6, 3};
    fails += is_error(w, fsdp2_dtensor_check(dt, "w", w->mesh, s0, FSDP2_F32, 2, other), "[6,3]",
                      "shape mismatch");
    fsdp2_dtensor_release(dt);
    return fails;
}

static int body_dtensor(rank_ctx_t *c)
{
    const mesh_case_t *mc = c->arg;
    world_t w = {.c = c, .mesh_ndim = mc->ndim};
    char name[32];
    snprintf(name, sizeof(name), "dt-%dx%d", mc->shape[0], mc->ndim == 2 ? mc->shape[1] : 1);
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = 20000; /* a rank that fails early must not leave the others waiting */
    int fails = OK(c, fsdp2_mesh_create(c->store, name, c->rank, c->size, mc->ndim, mc->shape,
                                        NULL, &go, &w.mesh));
    if (fails)
        return fails;
    for (int i = 0; i < mc->ndim; i++) {
        w.mesh_shape[i] = mc->shape[i];
        fsdp2_mesh_coordinate(w.mesh, i, &w.coords[i]);
    }
    const int64_t shapes[][2] = {{5, 3}, {2, 7}, {0, 4}, {7, 13}, {9, 0}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]) && !fails; s++) {
        fails += every_pair(&w, 2, shapes[s], FSDP2_F32);
        if (s < 2)
            fails += every_pair(&w, 2, shapes[s], FSDP2_BF16);
    }
    const int64_t vec[1] = {3}, cube[3] = {3, 5, 2};
    if (!fails)
        fails += every_pair(&w, 1, vec, FSDP2_F64);
    if (!fails) /* Shard(1) with rows before and elements after the split dim */
        fails += every_pair(&w, 3, cube, FSDP2_F32);
    if (!fails)
        fails += init_is_invariant(&w);
    if (!fails)
        fails += distribute_variants(&w);
    if (!fails)
        fails += meta_moves_shapes(&w);
    if (!fails)
        fails += mistakes_are_errors(&w);
    fsdp2_mesh_destroy(w.mesh);
    return fails;
}

static void run_case(int ndim, int d0, int d1)
{
    mesh_case_t mc = {ndim, {d0, d1}};
    int size = ndim == 2 ? d0 * d1 : d0;
    ranks_result_t res;
    ck_assert_msg(run_ranks(size, body_dtensor, &mc, 20000, 240, &res) == 0,
                  "mesh %dx%d: a rank failed (see stderr)", d0, ndim == 2 ? d1 : 1);
}

START_TEST(every_placement_pair_on_1d_meshes_of_1_to_4_ranks)
{
    run_case(1, _i, 0);
}
END_TEST

START_TEST(every_placement_pair_on_a_2x2_mesh)
{
    run_case(2, 2, 2);
}
END_TEST

START_TEST(every_placement_pair_on_a_1x3_mesh)
{
    run_case(2, 1, 3);
}
END_TEST

/* A redistribution allocates everything it needs before its first collective: with its
 * Nth allocation failing (fault injection, the same N on every rank, so no rank waits for
 * another), it fails having started no collective, for every N; and without a fault it
 * starts some. [Shard(0), Shard(1)] -> [Replicate, Replicate] of a 5 x 7 tensor on a
 * 2 x 2 mesh: two uneven all-gathers, each with its padded temporaries. */
static int body_all_or_nothing(rank_ctx_t *c)
{
    int fails = 0;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_placement_t from[2] = {FSDP2_SHARD_INIT(0), FSDP2_SHARD_INIT(1)};
    fsdp2_placement_t to[2] = {FSDP2_REPLICATE_INIT, FSDP2_REPLICATE_INIT};
    int64_t shape[2] = {5, 7};
    int mesh_shape[2] = {2, 2};
    uint64_t allocs = 0, collectives = 0;
    for (uint64_t n = 0; !fails && (n == 0 || n <= allocs); n++) {
        char name[32];
        snprintf(name, sizeof(name), "aon%llu", (unsigned long long)n);
        fsdp2_mesh_t *mesh = NULL;
        fsdp2_dtensor_t *dt = NULL, *out = NULL;
        fails += OK(c, fsdp2_mesh_create(c->store, name, c->rank, c->size, 2, mesh_shape, NULL,
                                         NULL, &mesh));
        fails += OK(c, fsdp2_dtensor_zeros(mesh, from, cpu, FSDP2_F32, 2, shape, &dt));
        if (fails)
            break;
        fsdp2_fault_arm(n ? FAULT_ALLOC : FAULT_NONE, n);
        fsdp2_status_t s = fsdp2_dtensor_redistribute(dt, to, NULL, &out);
        uint64_t started = fsdp2_fault_count(FAULT_COLLECTIVE);
        if (n == 0) {
            allocs = fsdp2_fault_count(FAULT_ALLOC);
            collectives = started;
            fails += RANK_CHECK(c, s == FSDP2_SUCCESS && allocs > 0 && collectives >= 2,
                                "without a fault: %s, %llu allocations, %llu collectives",
                                fsdp2_status_name(s), (unsigned long long)allocs,
                                (unsigned long long)collectives);
        } else {
            fails += RANK_CHECK(c, s == FSDP2_ERR_OUT_OF_MEMORY && started == 0,
                                "allocation %llu of %llu failing: %s after %llu collectives",
                                (unsigned long long)n, (unsigned long long)allocs,
                                fsdp2_status_name(s), (unsigned long long)started);
        }
        fsdp2_fault_disarm();
        fsdp2_dtensor_release(out);
        fsdp2_dtensor_release(dt);
        fsdp2_mesh_destroy(mesh);
    }
    return fails;
}

START_TEST(a_redistribution_allocates_all_it_needs_before_its_first_collective)
{
    ranks_result_t res;
    ck_assert_msg(run_ranks(4, body_all_or_nothing, NULL, 20000, 120, &res) == 0,
                  "rank exit codes %d %d %d %d", res.status[0], res.status[1], res.status[2],
                  res.status[3]);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("dtensor");
    TCase *tc = tcase_create("1d");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, every_placement_pair_on_1d_meshes_of_1_to_4_ranks, 1, 5);
    suite_add_tcase(s, tc);
    tc = tcase_create("2d");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, every_placement_pair_on_a_2x2_mesh);
    tcase_add_test(tc, every_placement_pair_on_a_1x3_mesh);
    tcase_add_test(tc, a_redistribution_allocates_all_it_needs_before_its_first_collective);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
