/*
 * mf_svg: draws a simulated step (mf_sim_result) as one self-contained SVG
 * picture, readable in any browser or image viewer without other tools.
 *
 * What is drawn: a lane per stream (compute, inner, outer), one box per op
 * instance or compute segment, coloured by kind (legend at the top); dashed
 * lines at each microbatch's first forward segment; a time axis with round
 * ticks and units; exposed communication (compute idle waiting for it,
 * mf_simulate.h) as a red hatched band over the compute lane's idle gap and a
 * red bar under the communication it waited for; the event edges on the
 * critical path as red dashed connectors. Each box carries a
 * <title> so hovering in a browser names the op, unit, bytes and times.
 *
 * A window [t0, t1) draws only that part of the step (items clipped to it),
 * for zooming into a long step; the summary line stays the whole step's.
 *
 * Invariants: output is well-formed XML (text escaped); it depends only on
 * the schedule, the result and the window; zero-length items (record, wait)
 * are not drawn as boxes.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mf_simulate.h"

enum {
    SVG_WIDTH = 1400,
    SVG_LEFT = 178,         /* px for the lane labels */
    SVG_RIGHT = 24,
    SVG_LANE_TOP = 96,
    SVG_LANE_H = 46,
    SVG_LANE_GAP = 26,
};

/* How an item is drawn: its box colour and its label. */
typedef struct item_look {
    const char *color;
    const char *label;
} item_look;

static item_look look_of(const mf_sim_item *it, const mf_schedule *s)
{
    if (it->op < 0)
        return it->phase == MF_PHASE_BACKWARD_PRE ? (item_look){"#2f7d32", "B"}
                                                  : (item_look){"#7cc06f", "F"};
    switch (s->ops[it->op].kind) {
    case MF_OP_ALL_GATHER: return (item_look){"#3f74b5", "AG"};
    case MF_OP_REDUCE_SCATTER: return (item_look){"#f28e2b", "RS"};
    case MF_OP_ALL_REDUCE: return (item_look){"#9c6bb0", "AR"};
    case MF_OP_SLICE: return (item_look){"#8c6d31", "slice"};
    case MF_OP_CAST: return (item_look){"#9aa0a6", "cast"};
    case MF_OP_ACCUMULATE: return (item_look){"#5bb5b0", "acc"};
    default: return (item_look){"#cccccc", ""};
    }
}

static void xml_text(FILE *out, const char *s)
{
    for (const char *p = s ? s : ""; *p; p++) {
        switch (*p) {
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '&': fputs("&amp;", out); break;
        case '"': fputs("&quot;", out); break;
        default:
            if ((unsigned char)*p >= 0x20)
                fputc(*p, out);
        }
    }
}

/* Time formatting in the unit chosen for the whole picture. */
typedef struct tunit {
    double scale;           /* multiply seconds by this */
    const char *name;
} tunit;

static tunit pick_unit(double span)
{
    if (span >= 2.0)
        return (tunit){1.0, "s"};
    if (span >= 2e-3)
        return (tunit){1e3, "ms"};
    return (tunit){1e6, "us"};
}

/* A round tick step (1, 2 or 5 times a power of ten) giving about n ticks. */
static double tick_step(double span, int n)
{
    if (!(span > 0))
        return 1.0;
    double raw = span / n;
    double p = pow(10.0, floor(log10(raw)));
    double f = raw / p;
    return p * (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0);
}

typedef struct canvas {
    double t0, t1;          /* seconds at the left and right edges */
    double px_per_s;
} canvas;

static double xpos(const canvas *c, double t)
{
    if (t < c->t0)
        t = c->t0;
    if (t > c->t1)
        t = c->t1;
    return SVG_LEFT + (t - c->t0) * c->px_per_s;
}

/* Whether [a, b] shows in the window (zero-length items at an edge count). */
static bool visible(const canvas *c, double a, double b)
{
    return b >= c->t0 && a <= c->t1;
}

static int lane_y(int stream)
{
    return SVG_LANE_TOP + stream * (SVG_LANE_H + SVG_LANE_GAP);
}

/* About 6.5 px per character of the 11 px font. */
static void legend_entry(FILE *out, int *x, int y, const char *fill, const char *label)
{
    fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"12\" fill=\"%s\" stroke=\"#444\" stroke-width=\"0.5\"/>",
            *x, y, fill);
    fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"small\">%s</text>\n", *x + 18, y + 10, label);
    *x += 34 + (int)(6.5 * (double)strlen(label));
}

static void draw_legend(FILE *out, int y)
{
    int x = 12;
    legend_entry(out, &x, y, "#7cc06f", "forward compute");
    legend_entry(out, &x, y, "#2f7d32", "backward compute");
    legend_entry(out, &x, y, "#3f74b5", "all_gather");
    legend_entry(out, &x, y, "#f28e2b", "reduce_scatter");
    legend_entry(out, &x, y, "#9c6bb0", "all_reduce");
    legend_entry(out, &x, y, "#9aa0a6", "cast");
    legend_entry(out, &x, y, "#5bb5b0", "accumulate");
    legend_entry(out, &x, y, "#8c6d31", "slice");
    legend_entry(out, &x, y, "url(#exposed)", "exposed: compute idle, waiting for it");
}

static void draw_box(FILE *out, const mf_schedule *s, const mf_sim_result *r, const canvas *c,
                     int i, tunit tu)
{
    const mf_sim_item *it = &r->items[i];
    double x0 = xpos(c, it->start), x1 = xpos(c, it->end);
    double w = x1 - x0 < 0.6 ? 0.6 : x1 - x0;
    int y = lane_y(it->stream);
    char label[160];
    mf_sim_item_label(s, it, label, sizeof label);
    /* narrow boxes get no white outline, which would wash them out */
    fprintf(out, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"%s><title>",
            x0, y + 2, w, SVG_LANE_H - 4, look_of(it, s).color, w >= 4 ? " class=\"box\"" : "");
    xml_text(out, label);
    if (it->microbatch >= 0)
        fprintf(out, " m%d", it->microbatch);
    if (it->op >= 0) {
        const mf_op *op = &s->ops[it->op];
        fprintf(out, " | op %d, %s, T%d", op->id, mf_phase_name(op->phase), op->transition);
        if (op->axis >= 0 && op->axis < s->mesh.naxes) {
            fprintf(out, ", axis ");
            xml_text(out, s->mesh.axes[op->axis].name);
        }
        fprintf(out, ", %lld bytes", (long long)it->bytes);
    }
    fprintf(out, " | %.3f .. %.3f %s%s</title></rect>\n", it->start * tu.scale, it->end * tu.scale,
            tu.name, it->critical ? " | critical" : "");
    /* Label inside the box when it fits (about 6 px per character). */
    char text[160];
    if (it->op < 0)
        snprintf(text, sizeof text, "%s%d %s", look_of(it, s).label, it->microbatch,
                 s->units[it->unit].name);
    else {
        const mf_op *op = &s->ops[it->op];
        snprintf(text, sizeof text, "%s %s", look_of(it, s).label,
                 op->bucket >= 0 && op->bucket < s->nbuckets ? s->buckets[op->bucket].name : "");
    }
    size_t n = strlen(text);
    if (w < 6.0 * (double)n + 4) {
        snprintf(text, sizeof text, "%s", look_of(it, s).label);
        n = strlen(text);
    }
    if (w >= 6.0 * (double)n + 4) {
        fprintf(out, "<text x=\"%.2f\" y=\"%d\" class=\"inbox\">", x0 + 2, y + SVG_LANE_H / 2 + 4);
        xml_text(out, text);
        fprintf(out, "</text>\n");
    }
}

/* Seconds with 4 significant digits in a unit chosen for the value. */
static const char *fmt_time(double t, char *buf, size_t size)
{
    tunit u = pick_unit(t * 2); /* 1.2 ms rather than 1200 us */
    snprintf(buf, size, "%.4g %s", t * u.scale, u.name);
    return buf;
}

static void draw_header(FILE *out, const mf_schedule *s, const mf_sim_result *r, const canvas *c,
                        tunit tu)
{
    fprintf(out, "<text x=\"12\" y=\"22\" class=\"title\">");
    xml_text(out, s->source ? s->source : "schedule");
    fprintf(out, ": one step, mesh");
    for (int j = 0; j < s->mesh.naxes; j++) {
        fprintf(out, "%s", j ? " x " : " ");
        xml_text(out, s->mesh.axes[j].name);
        fprintf(out, "=%lld", (long long)s->mesh.axes[j].size);
    }
    fprintf(out, ", %lld microbatches, %d units", (long long)s->microbatches, s->nunits);
    if (c->t0 > 0 || c->t1 < r->step_time)
        fprintf(out, " (showing %.4g .. %.4g %s)", c->t0 * tu.scale, c->t1 * tu.scale, tu.name);
    fprintf(out, "</text>\n");
    char a[32], b[32], d[32], e[32], f[32], g[32];
    fprintf(out, "<text x=\"12\" y=\"42\" class=\"small\">step %s; compute busy %s; communication "
                 "busy %s, exposed %s (inner %s, outer %s); overlap %.1f%% (hidden / busy)</text>\n",
            fmt_time(r->step_time, a, sizeof a), fmt_time(r->compute_time, b, sizeof b),
            fmt_time(r->comm_busy, d, sizeof d), fmt_time(r->comm_exposed, e, sizeof e),
            fmt_time(r->exposed[MF_STREAM_INNER], f, sizeof f),
            fmt_time(r->exposed[MF_STREAM_OUTER], g, sizeof g), 100.0 * r->overlap);
    draw_legend(out, 56);
}

static void draw_lanes(FILE *out, const mf_schedule *s, const mf_sim_result *r)
{
    for (int k = 0; k < MF_STREAM_COUNT; k++) {
        int y = lane_y(k);
        fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f4f4f4\"/>\n",
                SVG_LEFT, y, SVG_WIDTH - SVG_LEFT - SVG_RIGHT, SVG_LANE_H);
        fprintf(out, "<text x=\"12\" y=\"%d\" class=\"lane\">%s", y + 14, mf_stream_name((mf_stream)k));
        /* inner is the innermost axis; outer every other axis */
        if (k == MF_STREAM_INNER && s->mesh.naxes > 0) {
            fprintf(out, " <tspan class=\"small\">(");
            xml_text(out, s->mesh.axes[s->mesh.naxes - 1].name);
            fprintf(out, ")</tspan>");
        } else if (k == MF_STREAM_OUTER && s->mesh.naxes > 1) {
            fprintf(out, " <tspan class=\"small\">(");
            for (int j = 0; j < s->mesh.naxes - 1; j++) {
                fprintf(out, "%s", j ? ", " : "");
                xml_text(out, s->mesh.axes[j].name);
            }
            fprintf(out, ")</tspan>");
        }
        fprintf(out, "</text>");
        char a[32], b[32];
        fprintf(out, "<text x=\"12\" y=\"%d\" class=\"small\">busy %s</text>\n", y + 28,
                fmt_time(r->busy[k], a, sizeof a));
        if (k != MF_STREAM_COMPUTE)
            fprintf(out, "<text x=\"12\" y=\"%d\" class=\"small\">exposed %s</text>\n", y + 41,
                    fmt_time(r->exposed[k], b, sizeof b));
    }
}

int mf_svg_write(FILE *out, const mf_schedule *s, const mf_sim_result *r, double t0, double t1)
{
    canvas c;
    double end = r->step_time > 0 ? r->step_time : 1e-6;
    if (!(t1 > t0) || !isfinite(t0) || !isfinite(t1)) {
        t0 = 0;
        t1 = end;
    }
    c.t0 = t0 < 0 ? 0 : t0;
    c.t1 = t1 > c.t0 ? t1 : end;
    c.px_per_s = (SVG_WIDTH - SVG_LEFT - SVG_RIGHT) / (c.t1 - c.t0);
    tunit tu = pick_unit(c.t1 - c.t0);
    int axis_y = lane_y(MF_STREAM_COUNT) - SVG_LANE_GAP + 18;
    int height = axis_y + 52;
    char buf[64];

    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
            SVG_WIDTH, height, SVG_WIDTH, height);
    fprintf(out, "<style>.small{font-size:11px;font-weight:normal;fill:#222}.title{font-size:15px;font-weight:bold;fill:#111}"
                 ".inbox{font-size:10px;fill:#fff}.lane{font-size:13px;font-weight:bold;fill:#111}"
                 ".box{stroke:#fff;stroke-width:0.4}.tick{stroke:#bbb;stroke-width:0.5}</style>\n");
    fprintf(out, "<defs><pattern id=\"exposed\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" patternTransform=\"rotate(45)\">"
                 "<rect width=\"6\" height=\"6\" fill=\"#fde0dd\"/><rect width=\"3\" height=\"6\" fill=\"#d62728\"/></pattern></defs>\n");
    fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
    draw_header(out, s, r, &c, tu);
    draw_lanes(out, s, r);

    /* Grid lines under everything, at round times from the window's start. */
    double step = tick_step((c.t1 - c.t0) * tu.scale, 10) / tu.scale;
    double first = ceil(c.t0 / step - 1e-9) * step;
    for (int k = 0; first + k * step <= c.t1 * (1 + 1e-12) && k < 1000; k++)
        fprintf(out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" class=\"tick\"/>\n",
                xpos(&c, first + k * step), SVG_LANE_TOP, xpos(&c, first + k * step), axis_y);

    /* Exposed communication: hatch over the compute lane where compute idles,
     * a red bar under the communication it waited for. */
    for (int i = 0; i < r->nexposed_spans; i++) {
        const mf_sim_span *sp = &r->exposed_spans[i];
        if (!visible(&c, sp->t0, sp->t1))
            continue;
        double x0 = xpos(&c, sp->t0), w = xpos(&c, sp->t1) - x0;
        if (w < 0.8)
            w = 0.8;
        fprintf(out, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"url(#exposed)\"/>\n",
                x0, lane_y(MF_STREAM_COMPUTE) + 2, w, SVG_LANE_H - 4);
        fprintf(out, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"4\" fill=\"#d62728\"/>\n", x0,
                lane_y(sp->stream) + SVG_LANE_H + 1, w);
    }
    for (int i = 0; i < r->nitems; i++)
        if (r->items[i].end > r->items[i].start && visible(&c, r->items[i].start, r->items[i].end))
            draw_box(out, s, r, &c, i, tu);
    /* Critical event edges: a record on one lane released a wait on another. */
    for (int i = 0; i < r->nitems; i++) {
        const mf_sim_item *it = &r->items[i];
        if (!it->critical || !it->blocked || it->dep < 0 || !visible(&c, it->start, it->start))
            continue;
        const mf_sim_item *rec = &r->items[it->dep];
        double x = xpos(&c, it->start);
        int ya = lane_y(rec->stream) + SVG_LANE_H / 2, yb = lane_y(it->stream) + SVG_LANE_H / 2;
        fprintf(out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#d62728\" stroke-width=\"1\" stroke-dasharray=\"2,2\"/>\n",
                x, ya, x, yb);
    }

    /* Microbatch boundaries at each microbatch's first forward segment. */
    int seen = -1;
    for (int i = 0; i < r->nitems; i++) {
        const mf_sim_item *it = &r->items[i];
        if (it->op >= 0 || it->phase != MF_PHASE_FORWARD_PRE || it->microbatch <= seen)
            continue;
        seen = it->microbatch;
        if (!visible(&c, it->start, it->start))
            continue;
        double x = xpos(&c, it->start);
        fprintf(out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#333\" stroke-width=\"1\" stroke-dasharray=\"5,3\"/>",
                x, SVG_LANE_TOP - 8, x, axis_y);
        fprintf(out, "<text x=\"%.2f\" y=\"%d\" class=\"small\">microbatch %d</text>\n", x + 3,
                SVG_LANE_TOP - 2, it->microbatch);
    }

    /* Time axis. */
    fprintf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#222\"/>\n", SVG_LEFT,
            axis_y, SVG_WIDTH - SVG_RIGHT, axis_y);
    for (int k = 0; first + k * step <= c.t1 * (1 + 1e-12) && k < 1000; k++) {
        double x = xpos(&c, first + k * step);
        fprintf(out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#222\"/>", x, axis_y,
                x, axis_y + 5);
        snprintf(buf, sizeof buf, "%.6g", (first + k * step) * tu.scale);
        fprintf(out, "<text x=\"%.2f\" y=\"%d\" class=\"small\" text-anchor=\"middle\">%s</text>\n",
                x, axis_y + 17, buf);
    }
    fprintf(out, "<text x=\"%d\" y=\"%d\" class=\"small\" text-anchor=\"middle\">time since step begin (%s)</text>\n",
            SVG_LEFT + (SVG_WIDTH - SVG_LEFT - SVG_RIGHT) / 2, axis_y + 36, tu.name);
    fprintf(out, "</svg>\n");
    return ferror(out) ? -1 : 0;
}
