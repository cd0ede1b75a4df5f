/* Tests for the pure layout math of fsdp2/dtensor.h: fsdp2_chunk_range,
 * fsdp2_shard_layout and fsdp2_placements_format. No mesh, no processes.
 *
 * The references are deliberately literal rather than clever: torch.chunk is mimicked
 * by slicing [0, n) in steps of ceil(n / k) and padding the list of pieces with empty
 * ones, and a rank's piece of a sharded dim is found by carrying the dim's global
 * indices as an explicit list and cutting it, mesh dim by mesh dim, with that model. */
#include <check.h>

#include "check_main.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/dtensor.h>
#include <fsdp2/status.h>

#define TEST_TIMEOUT_S 120

/* ---------------------------------------------------------------------------------- */
/* Reference: torch.chunk                                                              */

#define REF_MAX_CHUNKS 64

/* torch.chunk(range(n), k): each piece has ceil(n / k) rows until the rows run out, so
 * there may be fewer than k pieces; DTensor pads the list with empty pieces, placed at
 * the end (offset n). */
static void ref_chunks(int64_t n, int k, int64_t *offsets, int64_t *lengths)
{
    int64_t chunk = (n + k - 1) / k;
    int pieces = 0;
    if (chunk > 0) {
        for (int64_t start = 0; start < n; start += chunk) {
            if (pieces >= k)
                ck_abort_msg("reference: torch.chunk(%lld, %d) made more than %d pieces",
                             (long long)n, k, k);
            offsets[pieces] = start;
            lengths[pieces] = n - start < chunk ? n - start : chunk;
            pieces++;
        }
    }
    for (; pieces < k; pieces++) {
        offsets[pieces] = n;
        lengths[pieces] = 0;
    }
}

static void expect_chunks(int64_t n, int k, const int64_t *want_offsets,
                          const int64_t *want_lengths)
{
    for (int i = 0; i < k; i++) {
        int64_t offset = -7, length = -7;
        fsdp2_status_t status = fsdp2_chunk_range(n, k, i, &offset, &length);
        if (status != FSDP2_SUCCESS)
            ck_abort_msg("chunk_range(%lld, %d, %d): %s (%s)", (long long)n, k, i,
                         fsdp2_status_name(status), fsdp2_last_error());
        if (offset != want_offsets[i] || length != want_lengths[i])
            ck_abort_msg("chunk_range(%lld, %d, %d): got [%lld, +%lld), want [%lld, +%lld)",
                         (long long)n, k, i, (long long)offset, (long long)length,
                         (long long)want_offsets[i], (long long)want_lengths[i]);
    }
}

/* ---------------------------------------------------------------------------------- */
/* 1. fsdp2_chunk_range                                                                 */

START_TEST(chunk_range_matches_torch_chunk_for_n_0_to_40_and_k_1_to_9)
{
    int64_t offsets[REF_MAX_CHUNKS], lengths[REF_MAX_CHUNKS];
    for (int64_t n = 0; n <= 40; n++) {
        for (int k = 1; k <= 9; k++) {
            ref_chunks(n, k, offsets, lengths);
            expect_chunks(n, k, offsets, lengths);
        }
    }
}
END_TEST

START_TEST(chunk_range_matches_torch_chunk_for_sizes_past_2_pow_32)
{
    int64_t offsets[REF_MAX_CHUNKS], lengths[REF_MAX_CHUNKS];
    const int64_t sizes[] = {(1ll << 32) - 1, 1ll << 32, (1ll << 32) + 1, (1ll << 40) + 3,
                             (1ll << 62) + 5};
    const int ks[] = {1, 2, 3, 7, 8, 64};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
            ref_chunks(sizes[s], ks[j], offsets, lengths);
            expect_chunks(sizes[s], ks[j], offsets, lengths);
        }
    }
}
END_TEST

START_TEST(chunk_range_gives_the_documented_uneven_splits)
{
    expect_chunks(5, 4, (const int64_t[]){0, 2, 4, 5}, (const int64_t[]){2, 2, 1, 0});
    expect_chunks(2, 4, (const int64_t[]){0, 1, 2, 2}, (const int64_t[]){1, 1, 0, 0});
    expect_chunks(6, 4, (const int64_t[]){0, 2, 4, 6}, (const int64_t[]){2, 2, 2, 0});
    expect_chunks(0, 3, (const int64_t[]){0, 0, 0}, (const int64_t[]){0, 0, 0});
    expect_chunks(8, 4, (const int64_t[]){0, 2, 4, 6}, (const int64_t[]){2, 2, 2, 2});
    expect_chunks(1, 1, (const int64_t[]){0}, (const int64_t[]){1});
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Reference: a rank's piece, by cutting explicit index lists                           */

#define REF_MAX_ROWS 64

typedef struct ref_dim {
    int64_t rows[REF_MAX_ROWS]; /* the global indices this rank holds along the dim */
    int64_t count;
    int64_t offset; /* where the piece starts, also when it is empty */
} ref_dim_t;

/* For each mesh dim in order that shards tensor dim d, the list is replaced by its
 * torch.chunk piece for the coordinate. An empty piece's offset is the previous level's
 * offset plus the sizes of the pieces before it at this level. */
static void ref_layout(int mesh_ndim, const int *mesh_shape, const int *coords,
                       const fsdp2_placement_t *placements, int ndim, const int64_t *shape,
                       int64_t *local_shape, int64_t *offset)
{
    for (int d = 0; d < ndim; d++) {
        if (shape[d] > REF_MAX_ROWS)
            ck_abort_msg("reference: dim of %lld rows is too large", (long long)shape[d]);
        ref_dim_t dim = {.count = shape[d], .offset = 0};
        for (int64_t r = 0; r < shape[d]; r++)
            dim.rows[r] = r;
        for (int i = 0; i < mesh_ndim; i++) {
            if (placements[i].type != FSDP2_PLACEMENT_SHARD || placements[i].dim != d)
                continue;
            int64_t starts[REF_MAX_CHUNKS], lengths[REF_MAX_CHUNKS];
            ref_chunks(dim.count, mesh_shape[i], starts, lengths);
            int64_t before = 0;
            for (int c = 0; c < coords[i]; c++)
                before += lengths[c];
            ref_dim_t piece = {.count = lengths[coords[i]]};
            for (int64_t r = 0; r < piece.count; r++)
                piece.rows[r] = dim.rows[starts[coords[i]] + r];
            piece.offset = piece.count > 0 ? piece.rows[0] : dim.offset + before;
            dim = piece;
        }
        /* A piece must be a contiguous run of rows, or it could not be stored as one
         * dense local tensor. */
        for (int64_t r = 1; r < dim.count; r++)
            if (dim.rows[r] != dim.rows[r - 1] + 1)
                ck_abort_msg("reference: dim %d's piece is not contiguous", d);
        local_shape[d] = dim.count;
        offset[d] = dim.offset;
    }
}

static void placements_text(int mesh_ndim, const fsdp2_placement_t *placements, char *buf,
                            size_t len)
{
    if (fsdp2_placements_format(mesh_ndim, placements, buf, len) != FSDP2_SUCCESS)
        snprintf(buf, len, "(unformattable)");
}

static void coords_text(int n, const int *values, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%d", i ? "," : "", values[i]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
}

/* Compares the library with the reference at every coordinate of the mesh, and checks
 * that the pieces tile the global tensor: each element is held by as many coordinates as
 * the product of the mesh dims that do not shard (Replicate and Partial copy). */
static void check_layout_case(int mesh_ndim, const int *mesh_shape,
                              const fsdp2_placement_t *placements, const int64_t shape[2])
{
    enum { NDIM = 2 };
    static int coverage[REF_MAX_ROWS][REF_MAX_ROWS];
    memset(coverage, 0, sizeof coverage);
    char ptext[96], mtext[32];
    placements_text(mesh_ndim, placements, ptext, sizeof ptext);
    coords_text(mesh_ndim, mesh_shape, mtext, sizeof mtext);

    int copies = 1, ranks = 1;
    for (int i = 0; i < mesh_ndim; i++) {
        ranks *= mesh_shape[i];
        if (placements[i].type != FSDP2_PLACEMENT_SHARD)
            copies *= mesh_shape[i];
    }
    for (int rank = 0; rank < ranks; rank++) {
        int coords[FSDP2_MESH_MAX_DIMS];
        for (int i = mesh_ndim - 1, rest = rank; i >= 0; i--) {
            coords[i] = rest % mesh_shape[i];
            rest /= mesh_shape[i];
        }
        int64_t got_shape[NDIM] = {-9, -9}, got_offset[NDIM] = {-9, -9};
        int64_t want_shape[NDIM], want_offset[NDIM];
        fsdp2_status_t status = fsdp2_shard_layout(mesh_ndim, mesh_shape, coords, placements,
                                                   NDIM, shape, got_shape, got_offset);
        char ctext[32];
        coords_text(mesh_ndim, coords, ctext, sizeof ctext);
        if (status != FSDP2_SUCCESS)
            ck_abort_msg("mesh %s %s coords %s shape [%lld,%lld]: %s (%s)", mtext, ptext, ctext,
                         (long long)shape[0], (long long)shape[1], fsdp2_status_name(status),
                         fsdp2_last_error());
        ref_layout(mesh_ndim, mesh_shape, coords, placements, NDIM, shape, want_shape,
                   want_offset);
        for (int d = 0; d < NDIM; d++) {
            if (got_shape[d] != want_shape[d] || got_offset[d] != want_offset[d])
                ck_abort_msg("mesh %s %s coords %s shape [%lld,%lld] dim %d: got %lld rows at "
                             "%lld, want %lld rows at %lld",
                             mtext, ptext, ctext, (long long)shape[0], (long long)shape[1], d,
                             (long long)got_shape[d], (long long)got_offset[d],
                             (long long)want_shape[d], (long long)want_offset[d]);
            if (got_offset[d] < 0 || got_offset[d] + got_shape[d] > shape[d])
                ck_abort_msg("mesh %s %s coords %s dim %d: piece [%lld, +%lld) leaves [0, %lld)",
                             mtext, ptext, ctext, d, (long long)got_offset[d],
                             (long long)got_shape[d], (long long)shape[d]);
        }
        for (int64_t r = 0; r < got_shape[0]; r++)
            for (int64_t c = 0; c < got_shape[1]; c++)
                coverage[got_offset[0] + r][got_offset[1] + c]++;
    }
    for (int64_t r = 0; r < shape[0]; r++)
        for (int64_t c = 0; c < shape[1]; c++)
            if (coverage[r][c] != copies)
                ck_abort_msg("mesh %s %s shape [%lld,%lld]: element (%lld,%lld) is held by %d "
                             "coordinates, want %d",
                             mtext, ptext, (long long)shape[0], (long long)shape[1],
                             (long long)r, (long long)c, coverage[r][c], copies);
}

static const fsdp2_placement_t PLACEMENT_CHOICES[] = {
    FSDP2_REPLICATE_INIT, FSDP2_SHARD_INIT(0), FSDP2_SHARD_INIT(1), FSDP2_PARTIAL_SUM_INIT,
    FSDP2_PARTIAL_AVG_INIT,
};
#define N_PLACEMENT_CHOICES ((int)(sizeof PLACEMENT_CHOICES / sizeof PLACEMENT_CHOICES[0]))

/* Every global shape up to 11 x 9, including 0-row and 0-column tensors. */
static void check_all_shapes(int mesh_ndim, const int *mesh_shape,
                             const fsdp2_placement_t *placements)
{
    for (int64_t rows = 0; rows <= 11; rows++)
        for (int64_t cols = 0; cols <= 9; cols++)
            check_layout_case(mesh_ndim, mesh_shape, placements, (const int64_t[2]){rows, cols});
}

START_TEST(shard_layout_on_1d_meshes_matches_index_list_reference_and_tiles_tensor)
{
    for (int size = 1; size <= 6; size++)
        for (int p = 0; p < N_PLACEMENT_CHOICES; p++)
            check_all_shapes(1, &size, &PLACEMENT_CHOICES[p]);
}
END_TEST

START_TEST(shard_layout_on_2d_meshes_matches_index_list_reference_and_tiles_tensor)
{
    const int meshes[][2] = {{2, 2}, {1, 4}, {4, 1}, {2, 3}, {3, 2}, {3, 3}};
    for (size_t m = 0; m < sizeof meshes / sizeof meshes[0]; m++)
        for (int p0 = 0; p0 < N_PLACEMENT_CHOICES; p0++)
            for (int p1 = 0; p1 < N_PLACEMENT_CHOICES; p1++) {
                const fsdp2_placement_t placements[2] = {PLACEMENT_CHOICES[p0],
                                                         PLACEMENT_CHOICES[p1]};
                check_all_shapes(2, meshes[m], placements);
            }
}
END_TEST

/* Nested sharding spelled out by hand, so a reference that agreed with a wrong library
 * would still be caught: 5 rows over [Shard(0), Shard(0)] on a 2x2 mesh are first
 * 3 + 2, then 3 -> 2 + 1 and 2 -> 1 + 1. */
START_TEST(nested_shard_0_shard_0_on_2x2_mesh_splits_5_rows_as_2_1_1_1)
{
    const int mesh[2] = {2, 2};
    const fsdp2_placement_t placements[2] = {FSDP2_SHARD_INIT(0), FSDP2_SHARD_INIT(0)};
    const int64_t shape[2] = {5, 3};
    const int64_t want_rows[4] = {2, 1, 1, 1}, want_offsets[4] = {0, 2, 3, 4};
    for (int rank = 0; rank < 4; rank++) {
        const int coords[2] = {rank / 2, rank % 2};
        int64_t local[2], offset[2];
        ck_assert_int_eq(
            fsdp2_shard_layout(2, mesh, coords, placements, 2, shape, local, offset),
            FSDP2_SUCCESS);
        ck_assert_msg(local[0] == want_rows[rank] && offset[0] == want_offsets[rank] &&
                          local[1] == 3 && offset[1] == 0,
                      "coords [%d,%d]: got [%lld,%lld] at [%lld,%lld], want [%lld,3] at "
                      "[%lld,0]",
                      coords[0], coords[1], (long long)local[0], (long long)local[1],
                      (long long)offset[0], (long long)offset[1], (long long)want_rows[rank],
                      (long long)want_offsets[rank]);
    }
}
END_TEST

/* 2 rows over [Shard(0), Shard(0)] on a 2x2 mesh: 1 + 1, then 1 -> 1 + 0 twice. The
 * empty pieces sit where their rows would start: right after the non-empty one. */
START_TEST(nested_empty_piece_offset_is_end_of_the_piece_before_it)
{
    const int mesh[2] = {2, 2};
    const fsdp2_placement_t placements[2] = {FSDP2_SHARD_INIT(0), FSDP2_SHARD_INIT(0)};
    const int64_t shape[1] = {2};
    const int64_t want_rows[4] = {1, 0, 1, 0}, want_offsets[4] = {0, 1, 1, 2};
    for (int rank = 0; rank < 4; rank++) {
        const int coords[2] = {rank / 2, rank % 2};
        int64_t local[1], offset[1];
        ck_assert_int_eq(
            fsdp2_shard_layout(2, mesh, coords, placements, 1, shape, local, offset),
            FSDP2_SUCCESS);
        ck_assert_msg(local[0] == want_rows[rank] && offset[0] == want_offsets[rank],
                      "coords [%d,%d]: got %lld rows at %lld, want %lld rows at %lld", coords[0],
                      coords[1], (long long)local[0], (long long)offset[0],
                      (long long)want_rows[rank], (long long)want_offsets[rank]);
    }
}
END_TEST

START_TEST(shard_layout_of_scalar_under_replicate_and_partial_is_the_scalar)
{
    const int mesh[2] = {2, 3};
    const fsdp2_placement_t placements[2] = {FSDP2_REPLICATE_INIT, FSDP2_PARTIAL_AVG_INIT};
    for (int rank = 0; rank < 6; rank++) {
        const int coords[2] = {rank / 3, rank % 3};
        int64_t unused = -1;
        ck_assert_int_eq(fsdp2_shard_layout(2, mesh, coords, placements, 0, NULL, &unused, &unused),
                         FSDP2_SUCCESS);
        ck_assert_msg(unused == -1, "a 0-dim layout wrote %lld into the outputs",
                      (long long)unused);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 2. fsdp2_placements_format                                                           */

static void expect_format(int mesh_ndim, const fsdp2_placement_t *placements, const char *want)
{
    char buf[128];
    memset(buf, 'x', sizeof buf);
    ck_assert_int_eq(fsdp2_placements_format(mesh_ndim, placements, buf, sizeof buf),
                     FSDP2_SUCCESS);
    ck_assert_msg(strcmp(buf, want) == 0, "got \"%s\", want \"%s\"", buf, want);
}

START_TEST(placements_format_prints_as_pytorch_does)
{
    expect_format(2, (const fsdp2_placement_t[]){FSDP2_REPLICATE_INIT, FSDP2_SHARD_INIT(0)},
                  "[Replicate(), Shard(dim=0)]");
    expect_format(1, (const fsdp2_placement_t[]){FSDP2_PARTIAL_SUM_INIT}, "[Partial(sum)]");
    expect_format(2, (const fsdp2_placement_t[]){FSDP2_PARTIAL_AVG_INIT, FSDP2_SHARD_INIT(1)},
                  "[Partial(avg), Shard(dim=1)]");
    expect_format(1, (const fsdp2_placement_t[]){FSDP2_REPLICATE_INIT}, "[Replicate()]");
    expect_format(2, (const fsdp2_placement_t[]){FSDP2_SHARD_INIT(1), FSDP2_SHARD_INIT(0)},
                  "[Shard(dim=1), Shard(dim=0)]");
}
END_TEST

/* Every buffer length from 1 to one past the full text gives the longest prefix that
 * fits, NUL-terminated, and writes nothing past len. */
START_TEST(placements_format_truncates_to_a_terminated_prefix_without_overrun)
{
    const fsdp2_placement_t placements[2] = {FSDP2_PARTIAL_AVG_INIT, FSDP2_SHARD_INIT(1)};
    const char *full = "[Partial(avg), Shard(dim=1)]";
    size_t full_len = strlen(full);
    for (size_t len = 1; len <= full_len + 1; len++) {
        char buf[64];
        memset(buf, '#', sizeof buf);
        ck_assert_int_eq(fsdp2_placements_format(2, placements, buf, len), FSDP2_SUCCESS);
        ck_assert_msg(strlen(buf) == len - 1 && strncmp(buf, full, len - 1) == 0,
                      "len %zu: got \"%s\", want the first %zu characters of \"%s\"", len, buf,
                      len - 1, full);
        for (size_t i = len; i < sizeof buf; i++)
            ck_assert_msg(buf[i] == '#', "len %zu: byte %zu past the buffer was written (0x%02x)",
                          len, i, (unsigned char)buf[i]);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* 3. Errors                                                                            */

static void expect_invalid(fsdp2_status_t status, const char *call, const char *needle)
{
    const char *message = fsdp2_last_error();
    ck_assert_msg(status == FSDP2_ERR_INVALID_ARGUMENT, "%s: got %s, want ERR_INVALID_ARGUMENT",
                  call, fsdp2_status_name(status));
    ck_assert_msg(strstr(message, needle) != NULL, "%s: last error \"%s\" does not mention \"%s\"",
                  call, message, needle);
}

START_TEST(chunk_range_rejects_bad_chunks_index_and_size_naming_them)
{
    int64_t offset, length;
    expect_invalid(fsdp2_chunk_range(10, 0, 0, &offset, &length), "chunk_range(10, 0, 0)",
                   "0");
    expect_invalid(fsdp2_chunk_range(10, -2, 0, &offset, &length), "chunk_range(10, -2, 0)",
                   "-2");
    expect_invalid(fsdp2_chunk_range(10, 4, 4, &offset, &length), "chunk_range(10, 4, 4)",
                   "4");
    expect_invalid(fsdp2_chunk_range(10, 4, 9, &offset, &length), "chunk_range(10, 4, 9)",
                   "9");
    expect_invalid(fsdp2_chunk_range(10, 4, -1, &offset, &length), "chunk_range(10, 4, -1)",
                   "-1");
    expect_invalid(fsdp2_chunk_range(-5, 4, 0, &offset, &length), "chunk_range(-5, 4, 0)",
                   "-5");
    expect_invalid(fsdp2_chunk_range(10, 4, 0, NULL, &length), "chunk_range(NULL offset)",
                   "NULL");
    expect_invalid(fsdp2_chunk_range(10, 4, 0, &offset, NULL), "chunk_range(NULL length)",
                   "NULL");
}
END_TEST

START_TEST(shard_layout_rejects_shard_dim_not_below_ndim_naming_it)
{
    const int mesh[1] = {2}, coords[1] = {0};
    const int64_t shape[2] = {4, 4};
    int64_t local[2], offset[2];
    const fsdp2_placement_t s2[1] = {FSDP2_SHARD_INIT(2)};
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, s2, 2, shape, local, offset),
                   "Shard(2) of a 2-dim tensor", "dim=2");
    const fsdp2_placement_t s7[1] = {FSDP2_SHARD_INIT(7)};
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, s7, 2, shape, local, offset),
                   "Shard(7) of a 2-dim tensor", "7");
    const fsdp2_placement_t sneg[1] = {FSDP2_SHARD_INIT(-1)};
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, sneg, 2, shape, local, offset),
                   "Shard(-1)", "-1");
    const fsdp2_placement_t s0[1] = {FSDP2_SHARD_INIT(0)};
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, s0, 0, NULL, local, offset),
                   "Shard(0) of a scalar", "dim=0");
}
END_TEST

START_TEST(shard_layout_rejects_negative_size_naming_it)
{
    const int mesh[1] = {2}, coords[1] = {1};
    const fsdp2_placement_t placements[1] = {FSDP2_SHARD_INIT(1)};
    int64_t local[2], offset[2];
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, placements, 2, (const int64_t[]){-3, 4},
                                      local, offset),
                   "shape [-3,4]", "-3");
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, placements, 2, (const int64_t[]){3, -17},
                                      local, offset),
                   "shape [3,-17]", "-17");
}
END_TEST

START_TEST(shard_layout_rejects_coordinate_out_of_range_naming_it)
{
    const int mesh[2] = {2, 3};
    const fsdp2_placement_t placements[2] = {FSDP2_SHARD_INIT(0), FSDP2_REPLICATE_INIT};
    const int64_t shape[1] = {8};
    int64_t local[1], offset[1];
    const struct {
        int coords[2];
        const char *needle;
    } cases[] = {
        {{2, 0}, "2"},   /* == mesh dim 0's size */
        {{0, 7}, "7"},   /* past mesh dim 1, which does not shard: still an error */
        {{-1, 0}, "-1"},
        {{0, -4}, "-4"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char call[64];
        snprintf(call, sizeof call, "coords [%d,%d] of mesh [2,3]", cases[i].coords[0],
                 cases[i].coords[1]);
        expect_invalid(
            fsdp2_shard_layout(2, mesh, cases[i].coords, placements, 1, shape, local, offset),
            call, cases[i].needle);
    }
    const int bad_mesh[1] = {0}, zero[1] = {0};
    expect_invalid(fsdp2_shard_layout(1, bad_mesh, zero, placements, 1, shape, local, offset),
                   "mesh dim of size 0", "0");
}
END_TEST

START_TEST(shard_layout_rejects_bad_placement_type_or_partial_op_naming_it)
{
    const int mesh[1] = {2}, coords[1] = {0};
    const int64_t shape[1] = {8};
    int64_t local[1], offset[1];
    fsdp2_placement_t bad_type[1] = {FSDP2_REPLICATE_INIT};
    bad_type[0].type = (fsdp2_placement_type_t)9;
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, bad_type, 1, shape, local, offset),
                   "placement type 9", "9");
    bad_type[0].type = (fsdp2_placement_type_t)-6;
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, bad_type, 1, shape, local, offset),
                   "placement type -6", "-6");
    fsdp2_placement_t bad_op[1] = {FSDP2_PARTIAL_SUM_INIT};
    bad_op[0].op = (fsdp2_reduce_op_t)77;
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, bad_op, 1, shape, local, offset),
                   "Partial op 77", "77");
}
END_TEST

START_TEST(shard_layout_rejects_mesh_ndim_outside_1_to_max_and_null_arguments)
{
    const int mesh[3] = {2, 2, 2}, coords[3] = {0, 0, 0};
    const fsdp2_placement_t placements[3] = {FSDP2_REPLICATE_INIT, FSDP2_REPLICATE_INIT,
                                             FSDP2_REPLICATE_INIT};
    const int64_t shape[1] = {8};
    int64_t local[1], offset[1];
    expect_invalid(fsdp2_shard_layout(0, mesh, coords, placements, 1, shape, local, offset),
                   "mesh_ndim 0", "0");
    expect_invalid(fsdp2_shard_layout(FSDP2_MESH_MAX_DIMS + 1, mesh, coords, placements, 1,
                                      shape, local, offset),
                   "mesh_ndim max + 1", "3");
    expect_invalid(fsdp2_shard_layout(1, NULL, coords, placements, 1, shape, local, offset),
                   "NULL mesh_shape", "NULL");
    expect_invalid(fsdp2_shard_layout(1, mesh, NULL, placements, 1, shape, local, offset),
                   "NULL coords", "NULL");
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, NULL, 1, shape, local, offset),
                   "NULL placements", "NULL");
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, placements, 1, NULL, local, offset),
                   "NULL shape", "NULL");
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, placements, 1, shape, NULL, offset),
                   "NULL local_shape", "NULL");
    expect_invalid(fsdp2_shard_layout(1, mesh, coords, placements, 1, shape, local, NULL),
                   "NULL offset", "NULL");
}
END_TEST

START_TEST(placements_format_rejects_null_buffer_or_zero_length)
{
    const fsdp2_placement_t placements[1] = {FSDP2_REPLICATE_INIT};
    char buf[8];
    ck_assert_int_eq(fsdp2_placements_format(1, placements, NULL, 8), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_placements_format(1, placements, buf, 0), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_placements_format(1, NULL, buf, sizeof buf),
                     FSDP2_ERR_INVALID_ARGUMENT);
}
END_TEST

/* ---------------------------------------------------------------------------------- */

static TCase *tcase_new(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    return tc;
}

static Suite *layout_suite(void)
{
    Suite *s = suite_create("dtensor_layout");

    TCase *chunk = tcase_new("chunk_range");
    tcase_add_test(chunk, chunk_range_matches_torch_chunk_for_n_0_to_40_and_k_1_to_9);
    tcase_add_test(chunk, chunk_range_matches_torch_chunk_for_sizes_past_2_pow_32);
    tcase_add_test(chunk, chunk_range_gives_the_documented_uneven_splits);
    suite_add_tcase(s, chunk);

    TCase *layout = tcase_new("shard_layout");
    tcase_add_test(layout, shard_layout_on_1d_meshes_matches_index_list_reference_and_tiles_tensor);
    tcase_add_test(layout, shard_layout_on_2d_meshes_matches_index_list_reference_and_tiles_tensor);
    tcase_add_test(layout, nested_shard_0_shard_0_on_2x2_mesh_splits_5_rows_as_2_1_1_1);
    tcase_add_test(layout, nested_empty_piece_offset_is_end_of_the_piece_before_it);
    tcase_add_test(layout, shard_layout_of_scalar_under_replicate_and_partial_is_the_scalar);
    suite_add_tcase(s, layout);

    TCase *format = tcase_new("format");
    tcase_add_test(format, placements_format_prints_as_pytorch_does);
    tcase_add_test(format, placements_format_truncates_to_a_terminated_prefix_without_overrun);
    suite_add_tcase(s, format);

    TCase *errors = tcase_new("errors");
    tcase_add_test(errors, chunk_range_rejects_bad_chunks_index_and_size_naming_them);
    tcase_add_test(errors, shard_layout_rejects_shard_dim_not_below_ndim_naming_it);
    tcase_add_test(errors, shard_layout_rejects_negative_size_naming_it);
    tcase_add_test(errors, shard_layout_rejects_coordinate_out_of_range_naming_it);
    tcase_add_test(errors, shard_layout_rejects_bad_placement_type_or_partial_op_naming_it);
    tcase_add_test(errors, shard_layout_rejects_mesh_ndim_outside_1_to_max_and_null_arguments);
    tcase_add_test(errors, placements_format_rejects_null_buffer_or_zero_length);
    suite_add_tcase(s, errors);

    return s;
}

FSDP2_CHECK_MAIN(layout_suite)
