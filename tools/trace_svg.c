/* fsdp2-trace svg: one step's timeline as a standalone SVG 1.1 picture.
 *
 * The window is the union of the chosen step's windows on the ranks drawn (their clocks
 * need not agree to the microsecond). Each rank gets a header, one lane per track that
 * has a slice in the window (in thread_sort_index order, nested slices one row lower
 * per level) and a memory lane: the total bytes in use as a step line, one scale for
 * every rank, the peak marked. Flow arrows go last so they stay visible. Text is
 * measured with a fixed width per character; a label that does not fit is shortened
 * or left out. No scripts, no external references: it renders the same everywhere. */
#include "trace_model.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define WIDTH 1600
#define PLOT_X0 290.0
#define PLOT_X1 1580.0
#define ROW_H 16.0
#define LANE_PAD 3.0
#define RANK_HEADER_H 24.0
#define MEMORY_H 72.0
#define SLICE_CHAR_W 6.2 /* font-size 10 */
#define LABEL_CHAR_W 6.6 /* font-size 11 */

typedef struct colour {
    const char *cat, *fill, *text;
} colour_t;

static const colour_t palette[] = {
    {"forward", "#4e79a7", "#ffffff"},     {"backward", "#f28e2b", "#000000"},
    {"optimizer", "#59a14f", "#ffffff"},   {"user", "#bab0ac", "#000000"},
    {"all_gather", "#e15759", "#ffffff"},  {"reduce_scatter", "#76b7b2", "#000000"},
    {"all_reduce", "#edc948", "#000000"},  {"broadcast", "#b07aa1", "#ffffff"},
    {"barrier", "#ff9da7", "#000000"},     {"copy_in", "#9c755f", "#ffffff"},
    {"copy_out", "#d4a6c8", "#000000"},    {"accumulate", "#86bcb6", "#000000"},
    {"step", "#d9d9d9", "#000000"},        {"memory", "#a0cbe8", "#000000"},
    {"wait", "#f1ce63", "#000000"},
    {"other", "#8c8c8c", "#ffffff"},
};
#define N_COLOURS (sizeof(palette) / sizeof(palette[0]))

static size_t colour_of(const char *cat)
{
    for (size_t i = 0; i + 1 < N_COLOURS; i++)
        if (!strcmp(palette[i].cat, cat))
            return i;
    return N_COLOURS - 1;
}

/* A lane: a track of a rank (track != SIZE_MAX) or the rank's memory. */
typedef struct lane {
    const trace_rank_t *rank;
    size_t track;
    double y, h;
    int header; /* the rank's first lane: a header goes above it */
} lane_t;

typedef struct picture {
    const trace_model_t *m;
    FILE *out;
    const trace_rank_t **ranks;
    size_t n_ranks;
    int64_t step;
    double ws, we; /* the window, us */
    lane_t *lanes;
    size_t n_lanes;
    size_t *lane_of_track; /* SIZE_MAX: not drawn */
    int used[N_COLOURS];
    double max_bytes; /* of any memory lane in the window */
    double top, axis_y, height;
} picture_t;


/* ---- text -------------------------------------------------------------------------- */

static size_t text_chars(const char *s)
{
    size_t n = 0;
    while (*s) {
        size_t k = trace_utf8_length(s);
        s += k ? k : 1;
        n++;
    }
    return n;
}

/* s as XML character data, at most max characters (the last one "…" when cut);
 * control characters and bytes that are not UTF-8 become '?'. */
static void put_text(FILE *out, const char *s, size_t max)
{
    size_t total = text_chars(s), n = 0;
    size_t keep = total <= max ? total : max > 0 ? max - 1 : 0;
    for (; *s && n < keep; n++) {
        size_t k = trace_utf8_length(s);
        unsigned char c = (unsigned char)*s;
        if (k == 0 || (k == 1 && (c < 0x20 || c == 0x7f)))
            fputc('?', out);
        else if (c == '&')
            fputs("&amp;", out);
        else if (c == '<')
            fputs("&lt;", out);
        else if (c == '>')
            fputs("&gt;", out);
        else if (c == '"')
            fputs("&quot;", out);
        else if (c == '\'')
            fputs("&apos;", out);
        else
            fwrite(s, 1, k, out);
        s += k ? k : 1;
    }
    if (keep < total && max > 0)
        fputs("\xe2\x80\xa6", out);
}

static const char *slice_label(const trace_slice_t *s)
{
    if (s->module != NULL && s->module[0])
        return s->module; /* what a collective or a copy is for */
    return s->name[0] ? s->name : "(root)"; /* "forward (root)", "adadelta", "wait" */
}

/* ---- choosing the step and the lanes --------------------------------------------------- */

/* The highest step number on every rank drawn. */
static int common_step(const picture_t *p, int64_t *step)
{
    const trace_rank_t *first = p->ranks[0];
    for (size_t k = first->n_steps; k-- > 0;) {
        int64_t candidate = p->m->steps[first->first_step + k].step;
        size_t r = 1;
        while (r < p->n_ranks && trace_model_step(p->m, p->ranks[r], candidate) != NULL)
            r++;
        if (r == p->n_ranks) {
            *step = candidate;
            return 0;
        }
    }
    return -1;
}

static int choose_step(picture_t *p, const trace_filter_t *filter, char *error, size_t len)
{
    const char *path = p->m->path;
    if (p->n_ranks == 0 || p->m->n_steps == 0)
        return trace_fail(error, len, "%s: no step slices (cat \"step\") to draw", path);
    if (!filter->has_step && common_step(p, &p->step) != 0)
        return trace_fail(error, len, "%s: no step appears on every rank; choose one with --step",
                    path);
    if (filter->has_step)
        p->step = filter->step;
    /* with --step N, the ranks that lack step N are left out */
    size_t kept = 0;
    p->ws = INFINITY;
    p->we = -INFINITY;
    for (size_t r = 0; r < p->n_ranks; r++) {
        const trace_step_t *s = trace_model_step(p->m, p->ranks[r], p->step);
        if (s == NULL)
            continue;
        p->ranks[kept++] = p->ranks[r];
        p->ws = s->ts < p->ws ? s->ts : p->ws;
        p->we = s->ts + s->dur > p->we ? s->ts + s->dur : p->we;
    }
    p->n_ranks = kept;
    if (kept == 0)
        return trace_fail(error, len, "%s: no step %lld in the trace%s", path, (long long)p->step,
                    filter->has_rank ? " on that rank" : "");
    if (p->we - p->ws < 1e-3)
        p->we = p->ws + 1e-3; /* a step of zero length still gets an axis */
    return 0;
}

/* Slices that only touch the window's edges stay out: the neighbouring steps'. */
static int visible(const picture_t *p, const trace_slice_t *s)
{
    if (s->dur == 0)
        return s->ts >= p->ws && s->ts <= p->we;
    return s->ts < p->we && s->ts + s->dur > p->ws;
}

static double x_of(const picture_t *p, double ts)
{
    double t = ts < p->ws ? p->ws : ts > p->we ? p->we : ts;
    return PLOT_X0 + (t - p->ws) / (p->we - p->ws) * (PLOT_X1 - PLOT_X0);
}

/* The categories of the slices drawn (for the legend) and the most bytes any memory
 * lane shows (its scale): the counters in effect at some moment of the window. */
static void survey(picture_t *p)
{
    const trace_model_t *m = p->m;
    for (size_t r = 0; r < p->n_ranks; r++) {
        const trace_rank_t *rank = p->ranks[r];
        for (size_t k = 0; k < rank->n_tracks; k++) {
            const trace_track_t *track = &m->tracks[rank->tracks[k]];
            for (size_t i = 0; i < track->n_slices; i++)
                if (visible(p, &m->slices[track->first_slice + i]))
                    p->used[colour_of(m->slices[track->first_slice + i].cat)] = 1;
        }
        const trace_counter_t *c = &m->counters[rank->first_counter];
        for (size_t i = 0; i < rank->n_counters && c[i].ts < p->we; i++) {
            int superseded = i + 1 < rank->n_counters &&
                             (c[i + 1].ts <= p->ws || c[i + 1].ts == c[i].ts);
            if (!superseded)
                p->max_bytes = fmax(p->max_bytes, trace_counter_total(&c[i]));
        }
    }
}

/* Lanes from y = p->top down; sets p->height. */
static int plan_lanes(picture_t *p)
{
    const trace_model_t *m = p->m;
    p->lanes = calloc(m->n_tracks + 2 * p->n_ranks + 1, sizeof(*p->lanes));
    p->lane_of_track = malloc((m->n_tracks + 1) * sizeof(*p->lane_of_track));
    if (p->lanes == NULL || p->lane_of_track == NULL)
        return -1;
    for (size_t t = 0; t < m->n_tracks; t++)
        p->lane_of_track[t] = SIZE_MAX;
    double y = p->top;
    for (size_t r = 0; r < p->n_ranks; r++) {
        const trace_rank_t *rank = p->ranks[r];
        y += RANK_HEADER_H;
        size_t first_lane = p->n_lanes;
        for (size_t k = 0; k < rank->n_tracks; k++) {
            const trace_track_t *track = &m->tracks[rank->tracks[k]];
            int depth = -1;
            for (size_t i = 0; i < track->n_slices; i++) {
                const trace_slice_t *s = &m->slices[track->first_slice + i];
                if (visible(p, s))
                    depth = s->depth > depth ? s->depth : depth;
            }
            if (depth < 0)
                continue;
            double h = (depth + 1) * ROW_H + 2 * LANE_PAD;
            p->lane_of_track[rank->tracks[k]] = p->n_lanes;
            p->lanes[p->n_lanes++] = (lane_t){rank, rank->tracks[k], y, h, 0};
            y += h;
        }
        double at;
        if (trace_memory_peak(m, rank, p->ws, p->we, &at) != NULL) {
            p->lanes[p->n_lanes++] = (lane_t){rank, SIZE_MAX, y, MEMORY_H, 0};
            y += MEMORY_H;
        }
        if (p->n_lanes > first_lane)
            p->lanes[first_lane].header = 1;
        else
            y += ROW_H; /* "nothing in the window" */
    }
    p->height = y + 20;
    return 0;
}

/* ---- drawing ------------------------------------------------------------------------- */

static void draw_header(picture_t *p, const char *title)
{
    FILE *o = p->out;
    fprintf(o, "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
               "height=\"%.0f\" viewBox=\"0 0 %d %.0f\" font-family=\"DejaVu Sans, Arial, "
               "Helvetica, sans-serif\" font-size=\"11\">\n",
            WIDTH, ceil(p->height), WIDTH, ceil(p->height));
    fprintf(o, "<defs><marker id=\"arrow\" viewBox=\"0 0 6 6\" refX=\"6\" refY=\"3\" "
               "markerWidth=\"5\" markerHeight=\"5\" orient=\"auto\">"
               "<path d=\"M0,0 L6,3 L0,6 z\" fill=\"#333333\" fill-opacity=\"0.6\"/></marker>"
               "</defs>\n");
    fprintf(o, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%.0f\" fill=\"#ffffff\"/>\n", WIDTH,
            ceil(p->height));
    fprintf(o, "<text x=\"12\" y=\"26\" font-size=\"16\" font-weight=\"bold\">");
    put_text(o, title, 80);
    fprintf(o, " \xe2\x80\x94 step %lld, %.3f ms, %zu rank%s</text>\n", (long long)p->step,
            (p->we - p->ws) / 1e3, p->n_ranks, p->n_ranks == 1 ? "" : "s");
}

/* The categories drawn, in palette order, wrapping; returns the y below it. */
static double draw_legend(picture_t *p, double y, int draw)
{
    double x = 12;
    for (size_t i = 0; i < N_COLOURS; i++) {
        if (!p->used[i])
            continue;
        double w = 14 + text_chars(palette[i].cat) * LABEL_CHAR_W + 18;
        if (x + w > WIDTH - 12) {
            x = 12;
            y += 18;
        }
        if (draw)
            fprintf(p->out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\" "
                    "stroke=\"#555555\" stroke-width=\"0.5\"/><text x=\"%.1f\" y=\"%.1f\">%s"
                    "</text>\n", x, y - 10, palette[i].fill, x + 16, y, palette[i].cat);
        x += w;
    }
    return y + 18;
}

/* 1, 2 or 5 times a power of ten, about a tenth of span. */
static double tick_step(double span)
{
    double raw = span / 10, unit = pow(10, floor(log10(raw)));
    double f = raw / unit;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * unit;
}

static void draw_axis(picture_t *p)
{
    FILE *o = p->out;
    double span_ms = (p->we - p->ws) / 1e3, step = tick_step(span_ms);
    int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    double bottom = p->height - 20;
    fprintf(o, "<text x=\"12\" y=\"%.1f\" fill=\"#555555\">ms (0 = ts %.3f ms)</text>\n",
            p->axis_y - 6, p->ws / 1e3);
    fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555555\"/>\n",
            PLOT_X0, p->axis_y, PLOT_X1, p->axis_y);
    for (int i = 0; i * step <= span_ms * (1 + 1e-9); i++) {
        double x = PLOT_X0 + i * step / span_ms * (PLOT_X1 - PLOT_X0);
        fprintf(o, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>"
                "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555555\">%.*f</text>\n",
                x, p->axis_y, x, bottom, x, p->axis_y - 6, decimals, i * step);
    }
}

static void draw_lane_label(picture_t *p, const lane_t *lane, const char *what)
{
    char text[320];
    snprintf(text, sizeof(text), "rank %lld \xc2\xb7 %s", (long long)lane->rank->pid, what);
    fprintf(p->out, "<text x=\"12\" y=\"%.1f\">", lane->y + LANE_PAD + ROW_H - 4);
    put_text(p->out, text, (size_t)((PLOT_X0 - 24) / LABEL_CHAR_W));
    fprintf(p->out, "</text>\n");
}

static void draw_slice(picture_t *p, const lane_t *lane, const trace_slice_t *s)
{
    FILE *o = p->out;
    const colour_t *c = &palette[colour_of(s->cat)];
    double x0 = x_of(p, s->ts), x1 = x_of(p, s->ts + s->dur), w = fmax(x1 - x0, 1.0);
    double y = lane->y + LANE_PAD + s->depth * ROW_H;
    fprintf(o, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
            "stroke=\"#ffffff\" stroke-width=\"0.5\"><title>", x0, y, w, ROW_H - 1, c->fill);
    put_text(o, s->name, 200);
    fprintf(o, " (");
    put_text(o, s->cat, 40);
    fprintf(o, ", %.3f ms)</title></rect>\n", s->dur / 1e3);
    const char *label = slice_label(s);
    size_t fits = (size_t)fmax((w - 4) / SLICE_CHAR_W, 0);
    if (fits >= text_chars(label) || fits >= 4) {
        fprintf(o, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\">", x0 + 2,
                y + ROW_H - 5, c->text);
        put_text(o, label, fits);
        fprintf(o, "</text>\n");
    }
}

static void draw_track(picture_t *p, const lane_t *lane)
{
    const trace_track_t *track = &p->m->tracks[lane->track];
    char buf[64];
    draw_lane_label(p, lane, trace_track_label(track, buf, sizeof(buf)));
    for (size_t i = 0; i < track->n_slices; i++) {
        const trace_slice_t *s = &p->m->slices[track->first_slice + i];
        if (visible(p, s))
            draw_slice(p, lane, s);
    }
}

/* The total in use across the window as "x,y" pairs, a step line. */
static void put_memory_points(picture_t *p, const trace_rank_t *r, double base, double scale)
{
    const trace_counter_t *c = &p->m->counters[r->first_counter];
    size_t i = 0;
    while (i < r->n_counters && c[i].ts <= p->ws)
        i++;
    /* from the counter in effect when the window opens, or from the first one inside */
    double x = i > 0 ? PLOT_X0 : x_of(p, c[i].ts);
    double value = trace_counter_total(i > 0 ? &c[i - 1] : &c[i++]);
    fprintf(p->out, "%.2f,%.2f", x, base - value * scale);
    for (; i < r->n_counters && c[i].ts < p->we; i++) {
        if (i + 1 < r->n_counters && c[i + 1].ts == c[i].ts)
            continue;
        x = x_of(p, c[i].ts);
        fprintf(p->out, " %.2f,%.2f", x, base - value * scale);
        value = trace_counter_total(&c[i]);
        fprintf(p->out, " %.2f,%.2f", x, base - value * scale);
    }
    fprintf(p->out, " %.2f,%.2f", PLOT_X1, base - value * scale);
}

/* The peak marked is the rank's peak in its own step, the one the summary reports. */
static void draw_memory(picture_t *p, const lane_t *lane)
{
    FILE *o = p->out;
    const trace_rank_t *r = lane->rank;
    double base = lane->y + lane->h - 6, scale = (lane->h - 24) / fmax(p->max_bytes, 1);
    char what[64], size[32];
    snprintf(what, sizeof(what), "memory (0\xe2\x80\x93%s)",
             trace_format_bytes(p->max_bytes, size, sizeof(size)));
    draw_lane_label(p, lane, what);
    fprintf(o, "<line x1=\"%.1f\" y1=\"%.2f\" x2=\"%.1f\" y2=\"%.2f\" stroke=\"#bbbbbb\"/>\n",
            PLOT_X0, base, PLOT_X1, base);
    fprintf(o, "<polygon fill=\"#1f77b4\" fill-opacity=\"0.15\" stroke=\"none\" points=\"");
    put_memory_points(p, r, base, scale);
    fprintf(o, " %.2f,%.2f %.2f,%.2f\"/>\n", PLOT_X1, base, PLOT_X0, base);
    fprintf(o, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
    put_memory_points(p, r, base, scale);
    fprintf(o, "\"/>\n");
    const trace_step_t *step = trace_model_step(p->m, r, p->step);
    double at;
    const trace_counter_t *peak = trace_memory_peak(p->m, r, step->ts, step->ts + step->dur, &at);
    if (peak == NULL)
        return;
    double px = x_of(p, at), py = base - trace_counter_total(peak) * scale;
    int left = px > PLOT_X1 - 160;
    fprintf(o, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" fill=\"#d62728\"/>"
            "<text x=\"%.2f\" y=\"%.2f\" fill=\"#d62728\" text-anchor=\"%s\">peak %s"
            "</text>\n", px, py, left ? px - 6 : px + 6, py - 5, left ? "end" : "start",
            trace_format_bytes(trace_counter_total(peak), size, sizeof(size)));
}

/* The lane of a flow's end, NULL when its track is not drawn. */
static const lane_t *flow_lane(const picture_t *p, int64_t pid, int64_t tid, size_t *track)
{
    const trace_model_t *m = p->m;
    size_t lo = 0, hi = m->n_tracks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const trace_track_t *t = &m->tracks[mid];
        if (t->pid < pid || (t->pid == pid && t->tid < tid))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == m->n_tracks || m->tracks[lo].pid != pid || m->tracks[lo].tid != tid ||
        p->lane_of_track[lo] == SIZE_MAX)
        return NULL;
    *track = lo;
    return &p->lanes[p->lane_of_track[lo]];
}

/* The row of the slice a flow's end binds to (docs/tracing.md): an 's' sits inside the
 * last slice enqueued before the record, the deepest one containing ts; an 'f' binds
 * to the next slice that starts on its track, the deepest of those starting then. */
static int flow_depth(const picture_t *p, size_t track, double ts, char phase)
{
    const trace_track_t *t = &p->m->tracks[track];
    const trace_slice_t *v = &p->m->slices[t->first_slice];
    size_t lo = 0, hi = t->n_slices; /* the first slice starting after ts (+ rounding) */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v[mid].ts <= ts + TRACE_EPSILON_US)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (phase == 'f') {
        if (lo > 0 && v[lo - 1].ts >= ts - TRACE_EPSILON_US)
            return v[lo - 1].depth; /* the last of those starting at ts is the deepest */
        size_t i = lo;
        while (i + 1 < t->n_slices && v[i + 1].ts == v[lo].ts)
            i++;
        return i < t->n_slices ? v[i].depth : 0;
    }
    /* an ancestor starts earlier and comes earlier: the walk back meets the deepest
     * containing slice first; a long way back only on a track of many siblings */
    for (size_t i = lo, steps = 0; i-- > 0 && steps < 256; steps++)
        if (v[i].ts + v[i].dur >= ts - TRACE_EPSILON_US)
            return v[i].depth;
    return 0;
}

/* Only flows with both ends in the window: one end clamped to an edge points nowhere. */
static void draw_flows(picture_t *p)
{
    for (size_t i = 0; i < p->m->n_flows; i++) {
        const trace_flow_t *f = &p->m->flows[i];
        size_t s_track, f_track;
        const lane_t *a, *b;
        if (f->s_ts < p->ws || f->f_ts > p->we ||
            (a = flow_lane(p, f->s_pid, f->s_tid, &s_track)) == NULL ||
            (b = flow_lane(p, f->f_pid, f->f_tid, &f_track)) == NULL)
            continue;
        double y0 = a->y + LANE_PAD + (flow_depth(p, s_track, f->s_ts, 's') + 0.5) * ROW_H;
        double y1 = b->y + LANE_PAD + (flow_depth(p, f_track, f->f_ts, 'f') + 0.5) * ROW_H;
        fprintf(p->out, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" "
                "stroke=\"#333333\" stroke-opacity=\"0.45\" stroke-width=\"0.7\" "
                "marker-end=\"url(#arrow)\"/>\n", x_of(p, f->s_ts), y0, x_of(p, f->f_ts), y1);
    }
}

static void draw(picture_t *p, const char *title)
{
    draw_header(p, title);
    draw_legend(p, 54, 1);
    draw_axis(p);
    for (size_t i = 0; i < p->n_lanes; i++) {
        const lane_t *lane = &p->lanes[i];
        if (i % 2 == 1)
            fprintf(p->out, "<rect x=\"0\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" "
                    "fill=\"#000000\" fill-opacity=\"0.035\"/>\n", lane->y, WIDTH, lane->h);
        if (lane->header)
            fprintf(p->out, "<line x1=\"0\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#999999\"/>"
                    "<text x=\"12\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">rank %lld"
                    "</text>\n", lane->y - RANK_HEADER_H + 2, WIDTH, lane->y - RANK_HEADER_H + 2,
                    lane->y - 7, (long long)lane->rank->pid);
        if (lane->track != SIZE_MAX)
            draw_track(p, lane);
        else
            draw_memory(p, lane);
    }
    draw_flows(p);
    fprintf(p->out, "</svg>\n");
}

int trace_svg_write(const trace_model_t *m, const trace_filter_t *filter, const char *title,
                    FILE *out, char *error, size_t error_len)
{
    picture_t p = {.m = m, .out = out};
    p.ranks = malloc((m->n_ranks + 1) * sizeof(*p.ranks));
    if (p.ranks == NULL)
        return trace_fail(error, error_len, "%s: out of memory", m->path);
    int n = trace_select_ranks(m, filter, p.ranks, error, error_len);
    int rc = n < 0 ? -1 : 0;
    p.n_ranks = n < 0 ? 0 : (size_t)n;
    if (rc == 0)
        rc = choose_step(&p, filter, error, error_len);
    if (rc == 0) {
        survey(&p);
        p.axis_y = draw_legend(&p, 54, 0) + 16;
        p.top = p.axis_y + 6;
        if (plan_lanes(&p) != 0)
            rc = trace_fail(error, error_len, "%s: out of memory", m->path);
    }
    if (rc == 0)
        draw(&p, title);
    free(p.lanes);
    free(p.lane_of_track);
    free(p.ranks);
    return rc;
}
