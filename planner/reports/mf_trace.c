/*
 * mf_trace: writes a simulated step (mf_sim_result) as Chrome trace JSON, the
 * format Perfetto (ui.perfetto.dev) and chrome://tracing open.
 *
 * Layout of the trace: one process ("mfsdp step"), one thread per stream
 * (tid 0 compute, 1 inner, 2 outer, sorted in that order); one complete
 * ("X") slice per executed op instance and per compute segment, timestamps in
 * microseconds; record and wait are zero-length slices; every wait whose
 * record ran on another stream gets a flow arrow (ph "s" at the record, ph
 * "f" bound to the wait). Summary numbers go to the top-level "otherData".
 *
 * Invariants: the output is one valid JSON document (strings escaped, only
 * finite numbers, no trailing commas); it depends only on the schedule and
 * the result, so the same inputs give byte-identical files.
 */
#include <math.h>
#include <stdio.h>

#include "mf_simulate.h"

/* Writes s as a JSON string literal. */
static void json_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

/* Seconds to trace microseconds; non-finite values cannot occur in a result
 * but are clamped so the document stays valid JSON whatever happens. */
static double us(double t)
{
    return isfinite(t) ? t * 1e6 : 0.0;
}

static void write_item(FILE *out, const mf_schedule *s, const mf_sim_result *r, int i)
{
    const mf_sim_item *it = &r->items[i];
    char label[160];
    mf_sim_item_label(s, it, label, sizeof label);
    const char *cat = it->op < 0 ? "compute" : mf_opkind_name(s->ops[it->op].kind);
    fprintf(out, ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":",
            (int)it->stream, us(it->start), us(it->end - it->start));
    json_str(out, label);
    fprintf(out, ",\"cat\":\"%s\",\"args\":{\"item\":%d", cat, i);
    if (it->unit >= 0) {
        fprintf(out, ",\"unit\":");
        json_str(out, s->units[it->unit].name);
    }
    fprintf(out, ",\"microbatch\":%d,\"critical\":%s", it->microbatch,
            it->critical ? "true" : "false");
    if (it->op < 0) {
        fprintf(out, ",\"kind\":\"%s\"}}",
                it->phase == MF_PHASE_BACKWARD_PRE ? "backward" : "forward");
        return;
    }
    const mf_op *op = &s->ops[it->op];
    fprintf(out, ",\"op\":%d,\"kind\":\"%s\",\"phase\":\"%s\",\"when\":\"%s\"", op->id,
            mf_opkind_name(op->kind), mf_phase_name(op->phase), mf_when_name(op->when));
    if (op->bucket >= 0 && op->bucket < s->nbuckets) {
        fprintf(out, ",\"bucket\":");
        json_str(out, s->buckets[op->bucket].name);
    }
    if (op->transition > 0)
        fprintf(out, ",\"transition\":\"T%d\"", op->transition);
    if (op->axis >= 0 && op->axis < s->mesh.naxes) {
        fprintf(out, ",\"axis\":");
        json_str(out, s->mesh.axes[op->axis].name);
    }
    if (op->kind == MF_OP_RECORD || op->kind == MF_OP_WAIT) {
        fprintf(out, ",\"event\":%d", op->event);
        if (it->dep >= 0)
            fprintf(out, ",\"waited_for_item\":%d,\"blocked\":%s", it->dep,
                    it->blocked ? "true" : "false");
    } else {
        fprintf(out, ",\"dtype\":\"%s\",\"count\":%lld,\"bytes\":%lld",
                mf_dtype_name(op->dtype) ? mf_dtype_name(op->dtype) : "?", (long long)op->count,
                (long long)it->bytes);
    }
    fprintf(out, "}}");
}

int mf_trace_write(FILE *out, const mf_schedule *s, const mf_sim_result *r)
{
    fprintf(out, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"source\":");
    json_str(out, s->source);
    fprintf(out, ",\"step_time_us\":%.3f,\"overlap\":%.4f", us(r->step_time),
            isfinite(r->overlap) ? r->overlap : 0.0);
    for (int k = 0; k < MF_STREAM_COUNT; k++)
        fprintf(out, ",\"%s_busy_us\":%.3f,\"%s_exposed_us\":%.3f", mf_stream_name((mf_stream)k),
                us(r->busy[k]), mf_stream_name((mf_stream)k), us(r->exposed[k]));
    for (int j = 0; j < s->mesh.naxes; j++) {
        fprintf(out, ",");
        char key[96];
        snprintf(key, sizeof key, "bytes_per_rank_%s", s->mesh.axes[j].name);
        json_str(out, key);
        fprintf(out, ":%lld", (long long)r->bytes[j]);
    }
    fprintf(out, "},\n\"traceEvents\":[\n");
    fprintf(out, "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":");
    json_str(out, s->source ? s->source : "mfsdp step");
    fprintf(out, "}}");
    for (int k = 0; k < MF_STREAM_COUNT; k++) {
        fprintf(out,
                ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}}",
                k, mf_stream_name((mf_stream)k));
        fprintf(out,
                ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}",
                k, k);
    }
    for (int i = 0; i < r->nitems; i++)
        write_item(out, s, r, i);
    /* Event edges that cross streams: one flow per wait. */
    for (int i = 0; i < r->nitems; i++) {
        const mf_sim_item *w = &r->items[i];
        if (w->dep < 0 || r->items[w->dep].stream == w->stream)
            continue;
        const mf_sim_item *rec = &r->items[w->dep];
        const mf_op *op = &s->ops[w->op];
        fprintf(out,
                ",\n{\"ph\":\"s\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"id\":%d,\"name\":\"e%d\",\"cat\":\"event\"}",
                (int)rec->stream, us(rec->start), i, op->event);
        fprintf(out,
                ",\n{\"ph\":\"f\",\"bp\":\"e\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"id\":%d,\"name\":\"e%d\",\"cat\":\"event\"}",
                (int)w->stream, us(w->start), i, op->event);
    }
    fprintf(out, "\n]}\n");
    return ferror(out) ? -1 : 0;
}
