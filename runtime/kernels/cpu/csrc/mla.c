/* Multi-head Latent Attention (DeepSeek V2 / V3) for the decode rows of a step, in one call a
   layer: what runtime/models/mla.py's `latent_attention` does between its projections, for a
   step of decode rows only, on a latent pool of the model's type (float32 or bfloat16).

   From a row's query q [H][nope + Dr] (q_proj's, or q_b's) and its kv_a output [R + Dr]:
     c      = RMSNorm(kv[:R]) * kv_norm (normalised in float32, rounded to the model's type,
              then scaled, as models/layers.py's rms_norm)
     k_rope = rotary(kv[R:]), q_rope = rotary(q[h][nope:])  (rotate-half or DeepSeek's
              interleaved pairs, the rotated first members then the second ones)
     [c, k_rope] written into the latent pool at the row's slot, then per head h
     q_lat  = q[h][:nope] W_uk[h]                                   [R]
     s_j    = (q_lat . c_j + q_rope . k_rope_j) * scale  over the request's cached tokens j
     out[h] = W_uv[h] (sum_j softmax(s)_j c_j)                      [v]
   Sums in float32 (16 partial sums, then added); the output rounded once to the model's type.
   The heads are split over quant.c's thread pool (q_pool_run) where the step is large enough. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common.h"

void q_pool_run(void (*fn)(void *, int, int), void *args, int parts); /* quant.c */

struct mla_step {                  /* a decode-only step's rows */
    int64_t n;                     /* rows (requests) */
    const int64_t *pos;            /* [n] rows of cos / sin; NULL: row b reads row b */
    const int64_t *slots;          /* [n] flat pool slots of the new tokens */
    const int32_t *table;          /* [n][table_stride] page ids */
    int64_t table_stride;
    const int32_t *lens;           /* [n] cached tokens, the new one counted */
    int64_t page_size, num_pages;
    const void *cos, *sin;         /* [positions][Dr], the model's type */
};

struct mla_layer {
    int64_t heads, nope, dr, vdim, rank, interleave;
    float eps, scale;
    const void *kv_norm;           /* [R] */
    const void *w_uk;              /* [H][nope][R] */
    const void *w_uv;              /* [H][v][R] */
    void *latent;                  /* [pages][page_size][R + Dr] */
};

static inline float mla_ld(const void *p, int64_t i, int bf16) {
    return bf16 ? bf2f(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void mla_st(void *p, int64_t i, float v, int bf16) {
    if (bf16) ((uint16_t *)p)[i] = f2bf(v);
    else ((float *)p)[i] = v;
}

/* `n` values of p (of the model's type) as float32: p itself, or converted into buf */
static inline const float *mla_row(const void *p, int64_t n, int bf16, float *buf) {
    if (!bf16) return (const float *)p;
    for (int64_t i = 0; i < n; i++) buf[i] = bf2f(((const uint16_t *)p)[i]);
    return buf;
}

/* a . b over n values: 16 partial sums (vectorised without reassociation), then added */
static inline float mla_dot(const float *a, const float *b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += a[i + k] * b[i + k];
    float s = 0.0f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int k = 0; k < 16; k++) s += acc[k];
    return s;
}

/* x [dr] (float32) rotated by the cos / sin row (the model's type) into out [dr] */
static void mla_rotate(const float *x, const void *cos, const void *sin, int64_t row, int64_t dr,
                       int interleave, int bf16, float *out) {
    int64_t half = dr / 2, base = row * dr;
    for (int64_t i = 0; i < half; i++) {
        float c = mla_ld(cos, base + i, bf16), s = mla_ld(sin, base + i, bf16);
        if (interleave) {
            float even = x[2 * i], odd = x[2 * i + 1];
            out[i] = even * c - odd * s;
            out[half + i] = odd * c + even * s;
        } else {
            float c2 = mla_ld(cos, base + half + i, bf16), s2 = mla_ld(sin, base + half + i, bf16);
            out[i] = x[i] * c - x[half + i] * s;
            out[half + i] = x[half + i] * c2 + x[i] * s2;
        }
    }
}

/* the rounding a value of the model's type gets (identity in float32) */
static inline float mla_round(float v, int bf16) { return bf16 ? bf2f(f2bf(v)) : v; }

/* the new tokens' [c, k_rope] into their slots of the latent pool */
static void mla_store(const struct mla_layer *L, const struct mla_step *st, const void *kv,
                      int64_t kv_row, int bf16, float *buf) {
    int64_t R = L->rank, dr = L->dr, width = R + dr;
    for (int64_t b = 0; b < st->n; b++) {
        const float *x = mla_row((const uint8_t *)kv + b * kv_row * (bf16 ? 2 : 4), width, bf16,
                                 buf);
        float ss = 0.0f;
        for (int64_t i = 0; i < R; i++) ss += x[i] * x[i];
        float inv = 1.0f / sqrtf(ss / (float)R + L->eps);
        int64_t slot = st->slots[b];
        float rot[512];
        mla_rotate(x + R, st->cos, st->sin, st->pos ? st->pos[b] : b, dr, (int)L->interleave,
                   bf16, rot);
        for (int64_t i = 0; i < R; i++) {
            float normed = mla_round(x[i] * inv, bf16);
            mla_st(L->latent, slot * width + i, mla_ld(L->kv_norm, i, bf16) * normed, bf16);
        }
        for (int64_t i = 0; i < dr; i++) mla_st(L->latent, slot * width + R + i, rot[i], bf16);
    }
}

struct mla_job {
    const struct mla_layer *L;
    const struct mla_step *st;
    const void *q;
    int64_t q_row;
    void *out;
    int bf16;
    int64_t max_len;
    int rc;
};

/* the latent row of a request's token t (its page through the page table) */
static inline const void *mla_token(const struct mla_job *j, const int32_t *pages, int64_t t) {
    const struct mla_step *st = j->st;
    int64_t ps = st->page_size, width = j->L->rank + j->L->dr;
    int64_t page = clamp_page(pages[t / ps], st->num_pages);
    return (const uint8_t *)j->L->latent + ((page * ps + t % ps) * width) * (j->bf16 ? 2 : 4);
}

/* heads [h0, h0 + nh) of row b: qf [nh][R + Dr] (float32, absorbed and rotated) against the
   request's latents -> out. Token-major: each latent row is read (and converted) once for all
   the heads, not once a head. scores [nh][len], acc [nh][R], buf [R + Dr]. */
static void mla_heads(const struct mla_job *j, int64_t b, int64_t h0, int64_t nh,
                      const float *qf, float *scores, float *acc, float *buf) {
    const struct mla_layer *L = j->L;
    const struct mla_step *st = j->st;
    int64_t R = L->rank, width = R + L->dr, len = st->lens[b], vd = L->vdim;
    const int32_t *pages = st->table + b * st->table_stride;
    int bf16 = j->bf16;
    for (int64_t t = 0; t < len; t++) {
        const float *row = mla_row(mla_token(j, pages, t), width, bf16, buf);
        for (int64_t h = 0; h < nh; h++)
            scores[h * len + t] = mla_dot(qf + h * width, row, width) * L->scale;
    }
    for (int64_t h = 0; h < nh; h++) { /* softmax, the probabilities in place */
        float *s = scores + h * len, top = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < len; t++) top = s[t] > top ? s[t] : top;
        for (int64_t t = 0; t < len; t++) {
            s[t] = expf(s[t] - top);
            sum += s[t];
        }
        float inv = 1.0f / sum;
        for (int64_t t = 0; t < len; t++) s[t] *= inv;
    }
    memset(acc, 0, (size_t)(nh * R) * sizeof(float));
    for (int64_t t = 0; t < len; t++) {
        const float *c = mla_row(mla_token(j, pages, t), R, bf16, buf);
        for (int64_t h = 0; h < nh; h++) {
            float p = scores[h * len + t], *a = acc + h * R;
            for (int64_t r = 0; r < R; r++) a[r] += p * c[r];
        }
    }
    for (int64_t h = 0; h < nh; h++) {
        const uint8_t *w_uv = (const uint8_t *)L->w_uv + (h0 + h) * vd * R * (bf16 ? 2 : 4);
        for (int64_t v = 0; v < vd; v++) {
            const float *w = mla_row(w_uv + v * R * (bf16 ? 2 : 4), R, bf16, buf);
            mla_st(j->out, (b * L->heads + h0 + h) * vd + v, mla_dot(acc + h * R, w, R), bf16);
        }
    }
}

/* the (row, head) pairs of one part, a row's consecutive heads at once: the query absorbed
   through W_uk and its rope part rotated, then the attention */
static void mla_part(void *args, int part, int parts) {
    struct mla_job *j = args;
    const struct mla_layer *L = j->L;
    const struct mla_step *st = j->st;
    int64_t H = L->heads, R = L->rank, nope = L->nope, dr = L->dr, width = R + dr;
    int64_t pairs = st->n * H, lo = pairs * part / parts, hi = pairs * (part + 1) / parts;
    int64_t most = hi - lo < H ? hi - lo : H; /* heads of one row in this part, at most */
    int bf16 = j->bf16;
    size_t floats = (size_t)(most * (width + R + j->max_len) + width + nope + dr);
    float *mem = malloc(floats * sizeof(float));
    if (!mem) {
        j->rc = -1;
        return;
    }
    float *qf = mem, *acc = qf + most * width, *scores = acc + most * R;
    float *buf = scores + most * j->max_len, *qh = buf + width;
    for (int64_t p = lo; p < hi;) {
        int64_t b = p / H, h0 = p % H, nh = H - h0 < hi - p ? H - h0 : hi - p;
        for (int64_t h = 0; h < nh; h++) {
            const uint8_t *qrow = (const uint8_t *)j->q +
                                  (b * j->q_row + (h0 + h) * (nope + dr)) * (bf16 ? 2 : 4);
            for (int64_t i = 0; i < nope + dr; i++) qh[i] = mla_ld(qrow, i, bf16);
            float *q = qf + h * width;
            memset(q, 0, (size_t)R * sizeof(float));
            const uint8_t *w_uk = (const uint8_t *)L->w_uk + (h0 + h) * nope * R * (bf16 ? 2 : 4);
            for (int64_t i = 0; i < nope; i++) {
                const float *w = mla_row(w_uk + i * R * (bf16 ? 2 : 4), R, bf16, buf);
                float x = qh[i];
                for (int64_t r = 0; r < R; r++) q[r] += x * w[r];
            }
            mla_rotate(qh + nope, st->cos, st->sin, st->pos ? st->pos[b] : b, dr,
                       (int)L->interleave, bf16, q + R);
        }
        mla_heads(j, b, h0, nh, qf, scores, acc, buf);
        p += nh;
    }
    free(mem);
}

/* The layer's latent attention for the step's decode rows: q [n][q_row] (each row H heads of
   nope + Dr), kv [n][kv_row] (kv_a's R + Dr values first) -> out [n][H][v]; the new latents
   are written into the pool first. `bf16`: every tensor is bfloat16 (else float32). Returns 0,
   or -1 for a shape it does not take or no memory. */
int q_mla_decode(const struct mla_layer *L, const struct mla_step *st, const void *q,
                 int64_t q_row, const void *kv, int64_t kv_row, void *out, int64_t bf16) {
    if (L->dr > 512 || L->dr % 2 || L->rank <= 0 || st->n <= 0) return -1;
    float *buf = malloc((size_t)(L->rank + L->dr) * sizeof(float));
    if (!buf) return -1;
    mla_store(L, st, kv, kv_row, (int)bf16, buf);
    free(buf);
    int64_t max_len = 1, work = 0;
    for (int64_t b = 0; b < st->n; b++) {
        if (st->lens[b] > max_len) max_len = st->lens[b];
        work += st->lens[b];
    }
    struct mla_job job = {L, st, q, q_row, out, (int)bf16, max_len, 0};
    int64_t pairs = st->n * L->heads;
    int parts = 1;
#ifdef _OPENMP
    /* split where the scores alone are ~1M multiply-adds (~150 us on one core): below that the
       hand-off to the pool's workers costs about what the split saves */
    if (work * L->heads * (L->rank + L->dr) >= (1 << 20)) parts = omp_get_max_threads();
#endif
    if (parts > 64) parts = 64;
    if (parts > pairs) parts = (int)pairs;
    if (parts > 1) q_pool_run(mla_part, &job, parts);
    else mla_part(&job, 0, 1);
    return job.rc;
}

/* ---- the decode chain's attention half for an MLA layer (quant_chain.py's ChainHook) ------- */

int q_matmul(int t, int packed, const uint8_t *w, int64_t row_bytes, int64_t out, int64_t cols,
             const void *x, int x_bf16, int64_t n, void *y, int64_t ldy, int y_bf16,
             void *scratch, int threads, int swiglu); /* quant.c */

struct mla_proj { /* quant.c's struct q_proj: q_matmul's leading arguments for one weight */
    int64_t t, packed;
    const uint8_t *w;
    int64_t row_bytes, out, cols;
};

struct mla_chain_step { /* quant.c's struct q_chain_hook_step */
    const void *rope_step;
    void *k_pool, *v_pool;
    int64_t layer, hidden;
};

struct mla_rope_step { /* the leading fields of attention.c's struct rope_decode_step */
    const void *cos, *sin;
    const int64_t *pos, *slots;
    const int32_t *table, *lens;
    int64_t table_stride, n, hq, hkv, d, ps, num_pages;
};

struct mla_hook {
    struct mla_layer layer;  /* its `latent` set from the chain's pool at each call */
    struct mla_proj x_proj[3]; /* q (or q_a) | kv_a, in up to three formats (out 0: none) */
    struct mla_proj q_b, o;  /* q_b.out 0: no q_lora_rank */
    const void *q_a_norm;    /* [q_rows], with q_b */
    int64_t x_row, q_rows;   /* x_proj's outputs, the q (or q_a) part's */
};

/* y [n][ldy] (columns from 0) = x p, for the parts of a product (q_matmul's) */
static int mla_product(const struct mla_proj *p, int parts, const void *x, int64_t n, void *y,
                       int64_t ldy, int bf16, void *scratch) {
    int64_t col = 0;
    for (int k = 0; k < parts && p[k].out; k++) {
        int rc = q_matmul((int)p[k].t, (int)p[k].packed, p[k].w, p[k].row_bytes, p[k].out,
                          p[k].cols, x, bf16, n, (uint8_t *)y + col * (bf16 ? 2 : 4), ldy, bf16,
                          scratch, 0, 0);
        if (rc) return rc;
        col += p[k].out;
    }
    return 0;
}

/* rows of x [n][row] (first `cols` values) RMSNorm'd by w into y [n][cols], as rms_norm */
static void mla_rms_rows(const void *x, int64_t row, int64_t cols, int64_t n, const void *w,
                         float eps, int bf16, void *y) {
    for (int64_t b = 0; b < n; b++) {
        float ss = 0.0f;
        for (int64_t i = 0; i < cols; i++) {
            float v = mla_ld(x, b * row + i, bf16);
            ss += v * v;
        }
        float inv = 1.0f / sqrtf(ss / (float)cols + eps);
        for (int64_t i = 0; i < cols; i++) {
            float normed = mla_round(mla_ld(x, b * row + i, bf16) * inv, bf16);
            mla_st(y, b * cols + i, mla_ld(w, i, bf16) * normed, bf16);
        }
    }
}

/* chain_half_fn: x [rows][hidden] (normed) -> out [rows][hidden], the layer's attention through
   o: x_proj's product, q_a's norm and q_b's product, q_mla_decode, o's product. */
int q_mla_attn_half(const void *ctx, const void *x, int64_t rows, void *out, int bf16,
                    void *scratch, const struct mla_chain_step *step) {
    const struct mla_hook *hk = ctx;
    const struct mla_rope_step *rs = step->rope_step;
    if (!rs || !rs->cos || !step->k_pool || rs->n != rows) return -2;
    const struct mla_layer *L = &hk->layer;
    int64_t size = bf16 ? 2 : 4, q_width = L->heads * (L->nope + L->dr);
    int64_t att_width = L->heads * L->vdim;
    int64_t q_cols = hk->q_b.out ? q_width + hk->q_rows : 0;
    uint8_t *mem = malloc((size_t)(rows * (hk->x_row + q_cols + att_width) * size));
    if (!mem) return -1;
    uint8_t *both = mem, *q_a = both + rows * hk->x_row * size, *q = q_a + rows * hk->q_rows * size;
    uint8_t *att = hk->q_b.out ? q + rows * q_width * size : q_a;
    int rc = mla_product(hk->x_proj, 3, x, rows, both, hk->x_row, bf16, scratch);
    const void *qs = both;
    int64_t q_row = hk->x_row;
    if (!rc && hk->q_b.out) {
        mla_rms_rows(both, hk->x_row, hk->q_rows, rows, hk->q_a_norm, L->eps, bf16, q_a);
        rc = mla_product(&hk->q_b, 1, q_a, rows, q, q_width, bf16, scratch);
        qs = q;
        q_row = q_width;
    }
    if (!rc) {
        struct mla_layer layer = *L;
        layer.latent = step->k_pool;
        struct mla_step st = {rows, rs->pos, rs->slots, rs->table, rs->table_stride, rs->lens,
                              rs->ps, rs->num_pages, rs->cos, rs->sin};
        rc = q_mla_decode(&layer, &st, qs, q_row, both + hk->q_rows * size, hk->x_row, att, bf16);
    }
    if (!rc) rc = mla_product(&hk->o, 1, att, rows, out, hk->o.out, bf16, scratch);
    free(mem);
    return rc;
}
