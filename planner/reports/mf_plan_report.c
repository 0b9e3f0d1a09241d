/*
 * mf_plan_report: the output of `mfsdpc plan` (see mf_plan_report.h).
 */
#include "mf_plan_report.h"

#include <stdlib.h>
#include <string.h>

#include "mf_human.h"
#include "mf_pipeline.h"
#include "mf_plan_stats.h"

/* Bytes with a binary unit and two decimals (mf_human_bytes_digits). */
static const char *gib(int64_t bytes, char *buf, size_t n)
{
    return mf_human_bytes_digits(bytes, 2, buf, n);
}

void mf_plan_report_point_layouts(const mf_plan_search *ps, const mf_ps_point *pt, char *buf, size_t size)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int g = 0; g < ps->ngroups && o < size; g++) {
        const mf_ps_group *gr = &ps->groups[g];
        if (!gr->is_auto)
            continue;
        const mf_ps_choice *ch = &gr->choices[pt->choice[g]];
        o += (size_t)snprintf(buf + o, size - o, "%s%s=%s%s", o ? " " : "", gr->name,
                              ps->spec.layouts[ch->layout].name,
                              ch->reshard || gr->reshard_set ? "" : "(no reshard)");
    }
    if (o == 0)
        snprintf(buf, size, "(no auto units)");
}

static void bucket_text(int64_t b, char *buf, size_t n)
{
    if (b == 0)
        snprintf(buf, n, "off");
    else
        snprintf(buf, n, "%lldMiB", (long long)(b >> 20));
}

void mf_plan_report_print_front(const mf_plan_search *ps, const char *input, int64_t budget, const mf_ps_point *chosen)
{
    const mf_mesh *m = &ps->spec.mesh;
    char h[32];
    printf("plan %s: mesh", input);
    for (int j = 0; j < m->naxes; j++)
        printf("%s%s=%lld", j ? " x " : " ", m->axes[j].name, (long long)m->axes[j].size);
    printf(", %d units in %d declarations, budget %s per rank\n", ps->base->nunits, ps->ngroups,
           gib(budget, h, sizeof h));
    printf("search: %lld candidates, %lld simulated, %lld more laid out only%s; optimizer state %lld "
           "bytes per main_weight element\n",
           (long long)ps->ncandidates, (long long)ps->evaluated, (long long)ps->memory_only,
           ps->opt.exhaustive ? " (exhaustive)" : " (the rest dominated by lower bounds)",
           (long long)ps->opt.optimizer_bytes);
    if (ps->opt.muon) {
        printf("muon: Newton-Schulz on every 2-D tensor");
        for (int i = 0; i < ps->opt.nadamw; i++)
            printf("%s%s", i ? ", " : " but ", ps->opt.adamw[i]);
        printf(ps->opt.nadamw ? " (the embedding and the head: AdamW, the Muon recipe; --muon-all counts them)\n"
                              : "\n");
    }
    printf("\nPareto front (peak memory per rank vs step time; * = chosen):\n");
    printf("     #      peak memory     step time  overlap");
    if (ps->opt.muon)
        printf("   optimizer");
    for (int j = 0; j < m->naxes; j++)
        printf("  %10.10s GB", m->axes[j].name);
    printf("  prefetch  bucket  layouts\n");
    for (int i = 0; i < ps->nfront; i++) {
        const mf_ps_point *p = &ps->front[i];
        char lay[1024], bk[32];
        mf_plan_report_point_layouts(ps, p, lay, sizeof lay);
        bucket_text(p->bucket_size, bk, sizeof bk);
        printf("  %c%3d  %11s%s  %10.3f ms  %6.1f%%", p == chosen ? '*' : ' ', i + 1, gib(p->mem.peak, h, sizeof h),
               p->mem.peak > budget ? "!" : " ", p->step_time * 1e3, 100 * p->overlap);
        if (ps->opt.muon)
            printf("  %7.3f ms", p->optimizer_time * 1e3);
        for (int j = 0; j < m->naxes; j++)
            printf("  %13.6f", (double)p->bytes[j] / 1e9);
        printf("  %8d  %6s  %s\n", p->prefetch, bk, lay);
    }
    printf("  (! = over the budget; GB = bytes sent per rank per step on that axis%s)\n",
           ps->opt.muon ? "; step time = simulated + optimizer, muon's Newton-Schulz step" : "");
}

int mf_plan_report_infeasible(const mf_plan_search *ps, int64_t budget)
{
    const mf_ps_point *p = &ps->front[0];
    char h1[32], h2[32], h3[32], h4[32], h5[32], h6[32], lay[1024];
    mf_plan_report_point_layouts(ps, p, lay, sizeof lay);
    const int64_t part[3] = {p->mem.persistent, p->mem.arena, p->mem.optimizer};
    static const char *const names[3] = {"the persistent region", "the transient arena", "the optimizer state"};
    int big = 0;
    for (int k = 1; k < 3; k++)
        if (part[k] > part[big])
            big = k;
    fprintf(stderr,
            "%s: error: no plan fits --memory %s per rank; the smallest peak reachable is %s (%s, prefetch %d): "
            "persistent region %s + transient arena %s allocated, optimizer state %s; the largest part is %s (%s)\n",
            ps->base->path ? ps->base->path : "spec", gib(budget, h1, sizeof h1), gib(p->mem.peak, h2, sizeof h2),
            lay, p->prefetch, gib(p->mem.persistent, h3, sizeof h3), gib(p->mem.arena, h4, sizeof h4),
            gib(p->mem.optimizer, h5, sizeof h5), names[big], gib(part[big], h6, sizeof h6));
    return 1;
}

typedef struct alt {
    int c;
    mf_ps_point pt;
} alt;

static int alt_cmp(const void *a, const void *b)
{
    const alt *x = a, *y = b;
    return x->pt.step_time < y->pt.step_time ? -1 : x->pt.step_time > y->pt.step_time;
}

int mf_plan_report_explain_choice(mf_plan_search *ps, const mf_ps_point *chosen, int64_t budget)
{
    int *ch = malloc((size_t)(ps->ngroups ? ps->ngroups : 1) * sizeof *ch);
    alt *alts = NULL;
    int rc = -1;
    if (!ch)
        goto done;
    printf("\nwhy each unit got its layout (the other choices of that unit, the rest of the plan fixed):\n");
    for (int g = 0; g < ps->ngroups; g++) {
        const mf_ps_group *gr = &ps->groups[g];
        if (!gr->is_auto)
            continue;
        free(alts);
        alts = calloc((size_t)gr->nchoices, sizeof *alts);
        if (!alts)
            goto done;
        for (int c = 0; c < gr->nchoices; c++) {
            memcpy(ch, chosen->choice, (size_t)ps->ngroups * sizeof *ch);
            ch[g] = c;
            alts[c].c = c;
            alts[c].pt.choice = ch;
            if (mf_plan_search_evaluate(ps, chosen->prefetch, chosen->bucket_size, ch, &alts[c].pt) != 0)
                goto done;
        }
        qsort(alts, (size_t)gr->nchoices, sizeof *alts, alt_cmp);
        printf("  %s (%d unit%s): %s%s\n", gr->name, gr->nunits, gr->nunits == 1 ? "" : "s",
               ps->spec.layouts[gr->choices[chosen->choice[g]].layout].name,
               gr->choices[chosen->choice[g]].reshard || gr->reshard_set ? "" : " (no reshard after forward)");
        for (int k = 0; k < gr->nchoices; k++) {
            const mf_ps_choice *c = &gr->choices[alts[k].c];
            const mf_ps_point *p = &alts[k].pt;
            char h[32];
            const char *why = alts[k].c == chosen->choice[g] ? "chosen"
                              : p->mem.peak > budget          ? "over the budget"
                              : p->step_time > chosen->step_time ? "slower"
                                                                 : "as fast, but more memory or outer bytes";
            printf("    %-26s%-14s %10.3f ms  %+9.3f ms  peak %s  outer %.3f GB  %s\n",
                   ps->spec.layouts[c->layout].name, c->reshard || gr->reshard_set ? "" : " no-reshard",
                   p->step_time * 1e3, (p->step_time - chosen->step_time) * 1e3, gib(p->mem.peak, h, sizeof h),
                   (double)p->outer_bytes / 1e9, why);
        }
    }
    rc = 0;
done:
    if (rc != 0 && !ps->err[0])
        snprintf(ps->err, sizeof ps->err, "out of memory");
    free(alts);
    free(ch);
    return rc;
}

int mf_plan_report_confirm(const mf_plan_search *ps, const char *path, const char *text, const mf_ps_point *pt)
{
    mf_compile_options opt = {.stop_after = MF_STAGE_VERIFY, .verify = true, .cost = &ps->opt.sim.cost};
    mf_compilation c;
    mf_sim_result res = {0};
    mf_plan_mem mem;
    char err[256];
    int rc = 1;
    if (mf_pipeline_compile_buffer(path, text, strlen(text), &opt, &c) != 0 || !c.plan || !c.plan->sched) {
        fprintf(stderr, "mfsdpc plan: internal error: the chosen spec does not compile\n");
        goto done;
    }
    mf_plan_mem_of(c.plan->sched, ps->opt.optimizer_bytes, &mem);
    if (mf_simulate(c.plan->sched, &ps->opt.sim, &res, err, sizeof err) != 0) {
        fprintf(stderr, "mfsdpc plan: internal error: the chosen spec cannot be simulated\n");
        goto done;
    }
    char h[32];
    double opt_s = mf_plan_search_optimizer_seconds(&ps->opt, c.plan->sched), step = res.step_time + opt_s;
    printf("\nchosen: step time %.6f ms, peak %s (%lld bytes) per rank, overlap %.1f%%\n", step * 1e3,
           gib(mem.peak, h, sizeof h), (long long)mem.peak, 100 * res.overlap);
    printf("        (recomputed from the written spec: compiled, verified, 'explain' memory, 'simulate' time)\n");
    if (ps->opt.muon)
        printf("        (= simulated %.6f ms + muon's optimizer step %.6f ms)\n", res.step_time * 1e3, opt_s * 1e3);
    if (mem.peak != pt->mem.peak || step != pt->step_time) {
        fprintf(stderr, "mfsdpc plan: internal error: the written spec gives peak %lld and step time %.9f s, "
                        "the search found %lld and %.9f s\n",
                (long long)mem.peak, step, (long long)pt->mem.peak, pt->step_time);
        goto done;
    }
    rc = 0;
done:
    mf_sim_result_free(&res);
    mf_compilation_free(&c);
    return rc;
}

int mf_plan_report_front_svg(FILE *out, const mf_plan_search *ps, int64_t budget, const mf_ps_point *chosen)
{
    const double W = 640, H = 400, L = 80, R = 20, T = 30, B = 50;
    double m0 = 0, m1 = 1, t0 = 0, t1 = 1;
    for (int i = 0; i < ps->nfront; i++) {
        double m = (double)ps->front[i].mem.peak / 1073741824.0, t = ps->front[i].step_time * 1e3;
        if (i == 0 || m < m0) m0 = m;
        if (i == 0 || m > m1) m1 = m;
        if (i == 0 || t < t0) t0 = t;
        if (i == 0 || t > t1) t1 = t;
    }
    double mb = (double)budget / 1073741824.0;
    if (budget < INT64_MAX / 2 && mb > m1 && mb < 2 * m1)
        m1 = mb;
    if (m1 <= m0) m1 = m0 + 1;
    if (t1 <= t0) t1 = t0 + 1;
    double dm = (m1 - m0) * 0.08, dt = (t1 - t0) * 0.08;
    m0 -= dm; m1 += dm; t0 -= dt; t1 += dt;
#define X(m) (L + ((m) - m0) / (m1 - m0) * (W - L - R))
#define Y(t) (H - B - ((t) - t0) / (t1 - t0) * (H - T - B))
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                 "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(out, "<text x=\"%.0f\" y=\"18\">Pareto front: peak memory per rank vs step time (%d points)</text>\n", L,
            ps->nfront);
    fprintf(out, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    fprintf(out, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T, L, H - B);
    for (int k = 0; k <= 4; k++) {
        double m = m0 + (m1 - m0) * k / 4, t = t0 + (t1 - t0) * k / 4;
        fprintf(out, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.2f</text>\n", X(m), H - B + 16, m);
        fprintf(out, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 6, Y(t) + 4, t);
    }
    fprintf(out, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">peak memory per rank (GiB)</text>\n",
            (L + W - R) / 2, H - 12);
    fprintf(out, "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" text-anchor=\"middle\">"
                 "step time (ms)</text>\n", (T + H - B) / 2, (T + H - B) / 2);
    if (budget < INT64_MAX / 2 && mb >= m0 && mb <= m1)
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"red\" "
                     "stroke-dasharray=\"4 3\"/><text x=\"%.1f\" y=\"%.0f\" fill=\"red\">budget</text>\n",
                X(mb), T, X(mb), H - B, X(mb) + 4, T + 12);
    fprintf(out, "<polyline fill=\"none\" stroke=\"#888\" points=\"");
    for (int i = 0; i < ps->nfront; i++)
        fprintf(out, "%.1f,%.1f ", X((double)ps->front[i].mem.peak / 1073741824.0), Y(ps->front[i].step_time * 1e3));
    fprintf(out, "\"/>\n");
    for (int i = 0; i < ps->nfront; i++) {
        const mf_ps_point *p = &ps->front[i];
        char lay[512];
        mf_plan_report_point_layouts(ps, p, lay, sizeof lay);
        for (char *c = lay; *c; c++)
            if (*c == '<' || *c == '>' || *c == '&' || *c == '"')
                *c = '_';
        fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"%s\"><title>#%d %s, prefetch %d</title></circle>\n",
                X((double)p->mem.peak / 1073741824.0), Y(p->step_time * 1e3), p == chosen ? 6 : 4,
                p == chosen ? "#d62728" : "#1f77b4", i + 1, lay, p->prefetch);
    }
#undef X
#undef Y
    fprintf(out, "</svg>\n");
    return ferror(out) ? -1 : 0;
}
