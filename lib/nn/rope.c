/* Rotary position embeddings as Llama's: feature i of a head and feature i + half turn
 * together by the angle pos * inv_freq[i]. The table is computed in f32 in transformers'
 * order of operations (inv_freq, Llama 3's rescaling of it, the angle), so that the same
 * configuration gives the same rounded angles; the rotations then read it. */
#include <math.h>

#include "nn_common.h"

#define ROPE_TWO_PI 6.283185307179586

static int positive(double v)
{
    return isfinite(v) && v > 0;
}

static fsdp2_status_t check_config(const fsdp2_nn_rope_config_t *cfg)
{
    FSDP2_ARG_CHECK(cfg, "the rope config is NULL");
    FSDP2_ARG_CHECK(positive(cfg->theta), "rope theta = %g: must be finite and > 0", cfg->theta);
    if (cfg->scaling == FSDP2_NN_ROPE_DEFAULT)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(cfg->scaling == FSDP2_NN_ROPE_LLAMA3,
                    "rope scaling = %d: neither FSDP2_NN_ROPE_DEFAULT nor FSDP2_NN_ROPE_LLAMA3",
                    (int)cfg->scaling);
    FSDP2_ARG_CHECK(positive(cfg->factor), "rope_scaling factor = %g: must be finite and > 0",
                    cfg->factor);
    FSDP2_ARG_CHECK(positive(cfg->low_freq_factor),
                    "rope_scaling low_freq_factor = %g: must be finite and > 0",
                    cfg->low_freq_factor);
    FSDP2_ARG_CHECK(positive(cfg->high_freq_factor) &&
                        cfg->high_freq_factor > cfg->low_freq_factor,
                    "rope_scaling high_freq_factor = %g: must be finite and above "
                    "low_freq_factor = %g",
                    cfg->high_freq_factor, cfg->low_freq_factor);
    FSDP2_ARG_CHECK(cfg->original_max_positions > 0,
                    "rope_scaling original_max_position_embeddings = %lld: must be > 0",
                    (long long)cfg->original_max_positions);
    return FSDP2_SUCCESS;
}

/* Llama 3: long wavelengths slowed by factor, short ones kept, a blend between. */
static float llama3_inv_freq(const fsdp2_nn_rope_config_t *cfg, float inv_freq)
{
    float old_len = (float)cfg->original_max_positions, factor = (float)cfg->factor;
    float low = (float)cfg->low_freq_factor, high = (float)cfg->high_freq_factor;
    float low_wavelen = old_len / low, high_wavelen = old_len / high;
    float wavelen = (float)ROPE_TWO_PI / inv_freq;
    if (wavelen > low_wavelen)
        return inv_freq / factor;
    if (wavelen < high_wavelen)
        return inv_freq;
    float smooth = (old_len / wavelen - low) / (high - low);
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq;
}

fsdp2_status_t fsdp2_nn_rope_table(const fsdp2_nn_rope_config_t *config, int64_t head_dim,
                                   int64_t positions, float *table)
{
    FSDP2_CHECK(check_config(config));
    FSDP2_ARG_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= INT_MAX,
                    "head_dim = %lld: rotary embeddings need an even head_dim > 0",
                    (long long)head_dim);
    FSDP2_CHECK(nn_check_dim(positions, "positions"));
    FSDP2_ARG_CHECK(table || positions == 0, "table is NULL");
    int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)head_dim;
        float inv_freq = 1.0f / powf((float)config->theta, e);
        if (config->scaling == FSDP2_NN_ROPE_LLAMA3)
            inv_freq = llama3_inv_freq(config, inv_freq);
        for (int64_t t = 0; t < positions; t++) {
            float angle = (float)t * inv_freq;
            table[t * head_dim + i] = cosf(angle);
            table[t * head_dim + half + i] = sinf(angle);
        }
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_rope(const void *in, const void *out, int64_t batch, int64_t seq,
                                 int64_t heads, int64_t head_dim, const float *table,
                                 int64_t positions)
{
    FSDP2_CHECK(nn_check_dim(batch, "batch"));
    FSDP2_CHECK(nn_check_dim(seq, "seq"));
    FSDP2_CHECK(nn_check_dim(heads, "heads"));
    FSDP2_ARG_CHECK(head_dim > 0 && head_dim % 2 == 0,
                    "head_dim = %lld: rotary embeddings need an even head_dim > 0",
                    (long long)head_dim);
    FSDP2_ARG_CHECK(seq <= positions,
                    "seq = %lld is longer than the rope table's %lld positions", (long long)seq,
                    (long long)positions);
    if (batch == 0 || seq == 0 || heads == 0)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(in, "the rotation's input is NULL");
    FSDP2_ARG_CHECK(out, "the rotation's output is NULL");
    FSDP2_ARG_CHECK(table, "the rope table is NULL");
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_rope_forward(const float *x, const float *table, int64_t batch,
                                     int64_t seq, int64_t heads, int64_t head_dim,
                                     int64_t positions, float *y)
{
    FSDP2_CHECK(check_rope(x, y, batch, seq, heads, head_dim, table, positions));
    int64_t half = head_dim / 2;
    int64_t elements = batch * seq * heads * head_dim;
    (void)elements; /* read by the directive alone, which a build without OpenMP drops */
    FSDP2_OMP("omp parallel for schedule(static) if(elements > FSDP2_PAR_CHUNK)")
    for (int64_t r = 0; r < batch * seq; r++) {
        const float *cs = table + (r % seq) * head_dim, *sn = cs + half;
        for (int64_t h = 0; h < heads; h++) {
            const float *a = x + (r * heads + h) * head_dim;
            float *o = y + (r * heads + h) * head_dim;
            for (int64_t i = 0; i < half; i++) {
                float lo = a[i], hi = a[i + half];
                o[i] = lo * cs[i] - hi * sn[i];
                o[i + half] = hi * cs[i] + lo * sn[i];
            }
        }
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_rope_backward(const float *dy, const float *table, int64_t batch,
                                      int64_t seq, int64_t heads, int64_t head_dim,
                                      int64_t positions, float *dx)
{
    FSDP2_CHECK(check_rope(dy, dx, batch, seq, heads, head_dim, table, positions));
    int64_t half = head_dim / 2;
    int in_place = dx == dy; /* then written, not added */
    int64_t elements = batch * seq * heads * head_dim;
    (void)elements; /* read by the directive alone, which a build without OpenMP drops */
    FSDP2_OMP("omp parallel for schedule(static) if(elements > FSDP2_PAR_CHUNK)")
    for (int64_t r = 0; r < batch * seq; r++) {
        const float *cs = table + (r % seq) * head_dim, *sn = cs + half;
        for (int64_t h = 0; h < heads; h++) {
            const float *g = dy + (r * heads + h) * head_dim;
            float *o = dx + (r * heads + h) * head_dim;
            for (int64_t i = 0; i < half; i++) {
                float lo = g[i], hi = g[i + half];
                float dlo = lo * cs[i] + hi * sn[i], dhi = hi * cs[i] - lo * sn[i];
                o[i] = in_place ? dlo : o[i] + dlo;
                o[i + half] = in_place ? dhi : o[i + half] + dhi;
            }
        }
    }
    return FSDP2_SUCCESS;
}
