/* The routed-experts MLP of one layer for a decode batch, in one call: the router product
   (float32), the routing of moe.py's `route` (softmax greedy or group-limited greedy, V3's
   sigmoid with its correction bias and group choice, the top-k weights renormalised, the routed
   scaling factor), each chosen expert's gate | up and SwiGLU down products through quant.c's
   q_matmul, the weighted sum, and the shared experts. The experts run as moe.py's
   `moe_forward` runs them: grouped (each expert once over the rows routed to it, experts in
   ascending order), each product's result in the model's dtype, `y * weight` rounded to it and
   added into the output row, the shared experts' output added last. So with the same routing
   the output is moe_forward's bit for bit; the routing itself may differ from torch's in the
   last bits of a weight (another summation order in the router product and the softmax). */

#include "common.h"
#include "moe.h"

int q_matmul(int t, int packed, const uint8_t *w, int64_t row_bytes, int64_t out, int64_t cols,
             const void *x, int x_bf16, int64_t rows, void *y_out, int64_t ldy, int y_bf16,
             void *scratch, int threads, int swiglu);
int64_t q_scratch_bytes(int t, int64_t rows, int64_t cols, int x_bf16);
/* quant.c's thread pool (the products' threads): fn(args, part, parts) for every part */
void q_pool_run(void (*fn)(void *, int, int), void *args, int parts);

#ifdef _OPENMP
#include <omp.h>
#endif

#define MOE_MIN_PARALLEL 65536 /* router products (rows x experts x hidden) one thread does */

/* a grow-only buffer per thread (a decode step's experts reuse it: no fresh pages a step) */
static __thread uint8_t *moe_buf;
static __thread int64_t moe_buf_bytes;

static void *moe_scratch(int64_t bytes) {
    if (bytes > moe_buf_bytes) {
        free(moe_buf);
        moe_buf = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64));
        moe_buf_bytes = moe_buf ? bytes : 0;
    }
    return moe_buf;
}

/* sum of a[i] * b[i] in float32 (sixteen running sums, then added pairwise) */
static float moe_dot(const float *a, const float *b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    for (int64_t j = 0; i < n; i++, j++) acc[j] += a[i] * b[i];
    for (int w = 8; w; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

/* the index of the largest v[i] with keep[i] (the lowest index among equals; -1: none left) */
static int64_t moe_best(const float *v, const uint8_t *keep, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (keep[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

/* keep[e] cleared for the experts outside the topk_group groups ranked highest by rank[g] */
static void moe_keep_groups(const struct q_moe *m, const float *rank, uint8_t *keep) {
    int64_t per = m->experts / m->n_group;
    uint8_t chosen[m->n_group], left[m->n_group];
    memset(chosen, 0, sizeof chosen);
    memset(left, 1, sizeof left);
    for (int64_t j = 0; j < m->topk_group; j++) {
        int64_t g = moe_best(rank, left, m->n_group);
        if (g < 0) break;
        chosen[g] = 1;
        left[g] = 0;
    }
    for (int64_t e = 0; e < m->experts; e++) keep[e] = chosen[e / per];
}

/* one token's routing: ids [k] and weights [k] from its router logits [experts] (`work`:
   3 * experts floats) */
static void moe_route_row(const struct q_moe *m, const float *logits, float *work, int64_t *ids,
                          float *weights) {
    int64_t e = m->experts, per = m->experts / m->n_group;
    float *scores = work, *choice = work + e, *rank = work + 2 * e;
    uint8_t keep[e];
    memset(keep, 1, (size_t)e);
    if (m->sigmoid) {
        for (int64_t i = 0; i < e; i++) {
            scores[i] = 1.0f / (1.0f + expf(-logits[i]));
            choice[i] = m->bias ? scores[i] + m->bias[i] : scores[i];
        }
        for (int64_t g = 0; g < m->n_group; g++) { /* the sum of the group's two best */
            const float *c = choice + g * per;
            int64_t a = 0, b = -1;
            for (int64_t i = 1; i < per; i++)
                if (c[i] > c[a]) b = a, a = i;
                else if (b < 0 || c[i] > c[b]) b = i;
            rank[g] = b < 0 ? c[a] : c[a] + c[b];
        }
        moe_keep_groups(m, rank, keep);
    } else {
        float top = logits[0], sum = 0.0f;
        for (int64_t i = 1; i < e; i++) top = logits[i] > top ? logits[i] : top;
        for (int64_t i = 0; i < e; i++) sum += scores[i] = expf(logits[i] - top);
        for (int64_t i = 0; i < e; i++) scores[i] /= sum;
        if (m->group_limited) { /* groups by their best score; the rest score 0 */
            for (int64_t g = 0; g < m->n_group; g++) {
                float best = scores[g * per];
                for (int64_t i = 1; i < per; i++)
                    best = scores[g * per + i] > best ? scores[g * per + i] : best;
                rank[g] = best;
            }
            moe_keep_groups(m, rank, keep);
            for (int64_t i = 0; i < e; i++) scores[i] = keep[i] ? scores[i] : 0.0f;
            memset(keep, 1, (size_t)e);
        }
        memcpy(choice, scores, (size_t)e * sizeof(float));
    }
    float total = 0.0f;
    for (int64_t j = 0; j < m->k; j++) {
        int64_t best = moe_best(choice, keep, e);
        ids[j] = best;
        keep[best] = 0;
        weights[j] = scores[best];
        total += weights[j];
    }
    if (m->norm_topk) {
        if (m->sigmoid) total += 1e-20f;
        for (int64_t j = 0; j < m->k; j++) weights[j] /= total;
    }
    for (int64_t j = 0; j < m->k; j++) weights[j] *= m->scale;
}

struct moe_logits_job {
    const struct q_moe *m;
    const float *xf; /* [rows][hidden] */
    int64_t rows;
    float *logits;   /* [rows][experts] */
};

/* the router products of one part of the experts, for every row */
static void moe_logits_part(void *args, int part, int parts) {
    const struct moe_logits_job *j = args;
    int64_t h = j->m->hidden, e = j->m->experts;
    int64_t lo = e * part / parts, hi = e * (part + 1) / parts;
    for (int64_t r = 0; r < j->rows; r++)
        for (int64_t i = lo; i < hi; i++)
            j->logits[r * e + i] = moe_dot(j->xf + r * h, j->m->router + i * h, h);
}

/* the floats of moe_route's `work` */
static int64_t moe_route_floats(const struct q_moe *m, int64_t rows) {
    return rows * (m->hidden + m->experts) + 3 * m->experts;
}

/* ids [rows][k] and weights [rows][k] of the tokens x [rows][hidden] (bf16 or float32); the
   router products split by experts over the products' threads (each the same sum whatever the
   split); `work`: moe_route_floats */
static void moe_route(const struct q_moe *m, const void *x, int64_t rows, int bf16, float *work,
                      int64_t *ids, float *weights) {
    int64_t h = m->hidden, e = m->experts;
    float *xf = work, *logits = work + rows * h, *rest = logits + rows * e;
    if (bf16)
        for (int64_t i = 0; i < rows * h; i++) xf[i] = bf2f(((const uint16_t *)x)[i]);
    else
        memcpy(xf, x, (size_t)(rows * h) * sizeof(float));
    struct moe_logits_job job = {m, xf, rows, logits};
    int parts = 1;
#ifdef _OPENMP
    if (rows * e * h >= MOE_MIN_PARALLEL) parts = omp_get_max_threads();
#endif
    parts = parts > e ? (int)e : (parts < 1 ? 1 : parts);
    q_pool_run(moe_logits_part, &job, parts);
    for (int64_t r = 0; r < rows; r++)
        moe_route_row(m, logits + r * e, rest, ids + r * m->k, weights + r * m->k);
}

int q_moe_route(const struct q_moe *m, const void *x, int64_t rows, int bf16, int64_t *ids,
                float *weights) {
    float *work = moe_scratch(moe_route_floats(m, rows) * (int64_t)sizeof(float));
    if (!work) return -3;
    moe_route(m, x, rows, bf16, work, ids, weights);
    return 0;
}

/* y [rows][mat->row] (the model's dtype) = x W for a weight of up to three parts */
static int moe_product(const struct moe_mat *mat, const void *x, int64_t rows, void *y, int bf16,
                       void *scratch) {
    int64_t col = 0;
    for (int k = 0; k < 3 && mat->part[k].out; k++) {
        const struct moe_proj *p = mat->part + k;
        int rc = q_matmul((int)p->t, (int)p->packed, p->w, p->row_bytes, p->out, p->cols, x, bf16,
                          rows, (uint8_t *)y + col * (bf16 ? 2 : 4), mat->row, bf16, scratch, 0, 0);
        if (rc) return rc;
        col += p->out;
    }
    return 0;
}

/* y [rows][hidden] = down(SiLU(gate) * up) of x [rows][hidden] through one expert's weights */
static int moe_expert(const struct moe_mat *gate_up, const struct moe_proj *down, const void *x,
                      int64_t rows, int bf16, void *gu, void *y, void *scratch) {
    int rc = moe_product(gate_up, x, rows, gu, bf16, scratch);
    if (rc) return rc;
    return q_matmul((int)down->t, (int)down->packed, down->w, down->row_bytes, down->out,
                    down->cols, gu, bf16, rows, y, down->out, bf16, scratch, 0, 1);
}

/* the scratch bytes a product of `rows` rows needs (q_matmul's: its inputs, a bf16 output's
   float32 copy, the SwiGLU input) */
static int64_t moe_need(const struct moe_proj *p, int64_t rows, int bf16) {
    if (!p->out) return 0;
    return q_scratch_bytes((int)p->t, rows, p->cols, bf16) + 4 * rows * (p->out + 2 * p->cols);
}

/* out[r] (+)= y * w in the model's dtype: float32 adds, or bf16's rounding of the product and
   of the sum (torch's `index_add_` of `(y * w).to(bf16)`) */
static void moe_add(void *out, const void *y, float w, int64_t h, int bf16) {
    if (bf16) {
        uint16_t *o = out;
        const uint16_t *v = y;
        for (int64_t i = 0; i < h; i++) o[i] = f2bf(bf2f(o[i]) + bf2f(f2bf(bf2f(v[i]) * w)));
    } else {
        float *o = out;
        const float *v = y;
        for (int64_t i = 0; i < h; i++) o[i] += v[i] * w;
    }
}

/* out [rows][hidden] = the layer's routed experts (those this rank holds) weighted, plus the
   shared experts, for the tokens x [rows][hidden] (bf16 when `bf16`, else float32); each
   expert's tokens added into m->load. Returns 0, -3 when out of memory, or q_matmul's code. */
int q_moe(const struct q_moe *m, const void *x, int64_t rows, void *out, int bf16) {
    int64_t h = m->hidden, e = m->experts, k = m->k, pairs = rows * k, esz = bf16 ? 2 : 4;
    int64_t wide = 2 * m->inter > m->shared_gate_up.row ? 2 * m->inter : m->shared_gate_up.row;
    int64_t need = 0;
    for (int64_t i = 0; i < m->held; i++)
        for (int p = 0; p < 3; p++) {
            int64_t n = moe_need(m->gate_up[i].part + p, rows, bf16);
            need = n > need ? n : need;
        }
    for (int64_t i = 0; i < m->held; i++) {
        int64_t n = moe_need(m->down + i, rows, bf16);
        need = n > need ? n : need;
    }
    for (int p = 0; p < 3; p++) {
        int64_t n = moe_need(m->shared_gate_up.part + p, rows, bf16);
        need = n > need ? n : need;
    }
    int64_t n_sd = moe_need(&m->shared_down, rows, bf16);
    need = (n_sd > need ? n_sd : need) + 64;
    int64_t floats = moe_route_floats(m, rows) + 2 * pairs, words = 2 * pairs + 2 * e;
    int64_t bytes = need + 4 * floats + 8 * words + esz * rows * (2 * h + wide) + 4 * 64;
    uint8_t *buf = moe_scratch(bytes);
    if (!buf) return -3;
    float *work = (float *)buf, *weights = work + moe_route_floats(m, rows);
    float *pair_w = weights + pairs;
    int64_t *ids = (int64_t *)(((uintptr_t)(pair_w + pairs) + 63) & ~(uintptr_t)63);
    int64_t *counts = ids + pairs, *start = counts + e, *pair_row = start + e;
    uint8_t *xs = (uint8_t *)(((uintptr_t)(pair_row + pairs) + 63) & ~(uintptr_t)63);
    uint8_t *gu = xs + esz * rows * h, *y = gu + esz * rows * wide;
    void *scratch = (void *)(((uintptr_t)(y + esz * rows * h) + 63) & ~(uintptr_t)63);

    moe_route(m, x, rows, bf16, work, ids, weights);
    memset(counts, 0, (size_t)e * sizeof(int64_t));
    for (int64_t i = 0; i < pairs; i++) counts[ids[i]]++;
    if (m->load)
        for (int64_t i = 0; i < e; i++) m->load[i] += counts[i];
    for (int64_t i = 0, at = 0; i < e; i++) start[i] = at, at += counts[i];
    for (int64_t i = 0; i < pairs; i++) { /* (token, expert) pairs by expert, tokens in order */
        int64_t at = start[ids[i]]++;
        pair_row[at] = i / k;
        pair_w[at] = weights[i];
    }
    memset(out, 0, (size_t)(esz * rows * h));
    for (int64_t i = 0, at = 0; i < e; at += counts[i], i++) {
        int64_t local = i - m->first, n = counts[i];
        if (!n || local < 0 || local >= m->held) continue;
        for (int64_t j = 0; j < n; j++)
            memcpy(xs + esz * j * h, (const uint8_t *)x + esz * pair_row[at + j] * h,
                   (size_t)(esz * h));
        int rc = moe_expert(m->gate_up + local, m->down + local, xs, n, bf16, gu, y, scratch);
        if (rc) return rc;
        for (int64_t j = 0; j < n; j++)
            moe_add((uint8_t *)out + esz * pair_row[at + j] * h, y + esz * j * h, pair_w[at + j],
                    h, bf16);
    }
    if (m->shared_gate_up.row) { /* out + shared(x): a float32 add, or bf16's rounded one */
        int rc = moe_expert(&m->shared_gate_up, &m->shared_down, x, rows, bf16, gu, y, scratch);
        if (rc) return rc;
        for (int64_t r = 0; r < rows; r++) {
            if (bf16) {
                uint16_t *o = (uint16_t *)out + r * h;
                const uint16_t *v = (const uint16_t *)y + r * h;
                for (int64_t i = 0; i < h; i++) o[i] = f2bf(bf2f(o[i]) + bf2f(v[i]));
            } else {
                float *o = (float *)out + r * h;
                const float *v = (const float *)y + r * h;
                for (int64_t i = 0; i < h; i++) o[i] += v[i];
            }
        }
    }
    return 0;
}

/* The layer's MLP half on the decode chain (quant.c's chain_half_fn): q_moe with `ctx` its
   arguments (their own `load`); the chain's scratch and step are not used (q_moe keeps a buffer
   of its own, so the chain's and the products' scratch stay as they are). */
int q_moe_half(const void *ctx, const void *x, int64_t rows, void *out, int bf16, void *scratch,
               const void *step) {
    (void)scratch;
    (void)step;
    return q_moe(ctx, x, rows, out, bf16);
}
