/* Template (see instance.h), included once per model type and pool type: decode attention over
   the paged pool, float32 softmax. */

#ifndef DECODE_ATTENTION_ONCE /* the parts the same for every instance */
#define DECODE_ATTENTION_ONCE
/* n floats from a 64-byte boundary (free() them): a row's buffers sit the same way whether it
   is attended alone or in a group, so the vectorised loops over them sum in the same order */
static float *aligned_floats(int64_t n) {
    return aligned_alloc(64, (size_t)((n * (int64_t)sizeof(float) + 63) / 64 * 64));
}
#endif

#ifdef HAVE_VECTORS
/* The scores of a full 16-token page: for each query head, 16 per-token vectors of partial
   products (d / 16 multiply-adds each), summed across lanes together. */
static inline __attribute__((always_inline)) void FN(page_scores)(
    const float *qf, const kv_t *page_rows, int64_t g, int64_t hkv, int64_t h0, int64_t h1,
    int64_t d, int64_t len, int64_t t0, float *scores) {
    for (int64_t h = h0; h < h1; h++)
        for (int64_t gi = 0; gi < g; gi++) {
            const float *qh = qf + (h * g + gi) * d;
            v16f part[16];
            for (int o = 0; o < 16; o++) {
                const kv_t *k = page_rows + (o * hkv + h) * d;
                v16f acc = ldv_f32(qh) * LDV_KV(k);
                for (int64_t c = 16; c < d; c += 16) acc += ldv_f32(qh + c) * LDV_KV(k + c);
                part[o] = acc;
            }
            v16f sums = sum_lanes16(part);
            memcpy(scores + (h * g + gi) * len + t0, &sums, sizeof sums);
        }
}

/* acc[qh] = sum_t p[qh, t] v_t for the nb query heads qh0 .. qh0 + nb - 1 (all reading kv
   head h): their accumulators stay in registers (nb * d / 16 vectors, at most 16) while the
   tokens' value rows stream past. */
static inline __attribute__((always_inline)) void FN(value_block)(
    const kv_t *v_pool, const int32_t *pages, int64_t len, int64_t h, int64_t hkv, int64_t d,
    int64_t ps, int64_t num_pages, const float *scores, int64_t qh0, int nb, float *acc,
    const kv_t *fetch_pool, const int32_t *fetch_pages, int64_t fetch_count) {
    v16f a[4][8];
    for (int i = 0; i < nb; i++)
        for (int c = 0; c < d / 16; c++) a[i][c] = (v16f){0};
    for (int64_t t0 = 0; t0 < len; t0 += ps) {
        int64_t page = clamp_page(pages[t0 / ps], num_pages);
        for (int64_t f = t0 / ps; f < fetch_count && f < t0 / ps + 1; f++)
            prefetch_page(fetch_pool + clamp_page(fetch_pages[f], num_pages) * ps * hkv * d,
                          (int64_t)sizeof(kv_t) * ps * hkv * d);
        int64_t m = len - t0 < ps ? len - t0 : ps;
        for (int64_t o = 0; o < m; o++) {
            const kv_t *v = v_pool + ((page * ps + o) * hkv + h) * d;
            for (int c = 0; c < d / 16; c++) {
                v16f x = LDV_KV(v + 16 * c);
                for (int i = 0; i < nb; i++) a[i][c] += scores[(qh0 + i) * len + t0 + o] * x;
            }
        }
    }
    for (int i = 0; i < nb; i++) memcpy(acc + (qh0 + i) * d, a[i], sizeof(float) * (size_t)d);
}
#endif

/* The scores of the first m tokens of a page (page_rows), one token at a time through `row`
   (its K row as float): a page that page_scores does not take. */
static inline __attribute__((always_inline)) void FN(token_scores)(
    const float *qf, const kv_t *page_rows, int64_t m, int64_t g, int64_t hkv, int64_t h0,
    int64_t h1, int64_t d, int64_t len, int64_t t0, float *row, float *scores) {
    for (int64_t o = 0; o < m; o++) {
        const kv_t *src = page_rows + o * hkv * d;
        for (int64_t j = h0 * d; j < h1 * d; j++) row[j] = LDK(src[j]);
        for (int64_t qh = h0 * g; qh < h1 * g; qh++) {
            const float *r = row + qh / g * d;
            float dot = 0.0f;
            for (int64_t j = 0; j < d; j++) dot += qf[qh * d + j] * r[j];
            scores[qh * len + t0 + o] = dot;
        }
    }
}

/* Each query head's scores (rows qh0 .. qh1 - 1 of [*, len]) into probabilities, float32;
   keys before `skip` (outside a window) weigh nothing; a soft cap (> 0) first maps each score
   s to cap * tanh(s / cap). */
static inline void FN(softmax)(float *scores, int64_t len, int64_t skip, int64_t qh0,
                               int64_t qh1, float cap) {
    for (int64_t qh = qh0; qh < qh1; qh++) {
        float *sc = scores + qh * len;
        if (cap > 0.0f)
            for (int64_t t = skip; t < len; t++) sc[t] = cap * tanhf(sc[t] / cap);
        float top = sc[skip], total = 0.0f;
        for (int64_t t = 0; t < skip; t++) sc[t] = 0.0f;
        for (int64_t t = skip + 1; t < len; t++) top = sc[t] > top ? sc[t] : top;
        for (int64_t t = skip; t < len; t++) {
            sc[t] = expf(sc[t] - top);
            total += sc[t];
        }
        float inv = 1.0f / total;
        for (int64_t t = 0; t < len; t++) sc[t] *= inv;
    }
}

/* Attention of one request's query heads (qf: scaled, float [hq, d]) to its `len` keys, into
   acc [hq, d] (normalised), for the query heads of kv heads h0 .. h1 - 1 (each head's
   arithmetic the same whichever range it is in). Token by token over the kv heads (a token's
   K or V row is one contiguous run of hkv * d values), the next page prefetched. Inlined with
   constant d and ps for the common shapes, so the row loops unroll into whole vectors. */
static inline __attribute__((always_inline)) void FN(attend)(
    const float *qf, const kv_t *k_pool, const kv_t *v_pool, const int32_t *pages, int64_t len,
    int64_t g, int64_t hkv, int64_t h0, int64_t h1, int64_t d, int64_t ps, int64_t num_pages,
    float *scores, float *row, float *acc, const int32_t *next_pages, int64_t next_count,
    int64_t skip, float cap) {
    int64_t hq = g * hkv, width = hkv * d, npages = (len + ps - 1) / ps;
    int64_t page_bytes = (int64_t)sizeof(kv_t) * ps * width;
    for (int pass = 0; pass < 2; pass++) {
        const kv_t *pool = pass == 0 ? k_pool : v_pool;
#ifdef HAVE_VECTORS
        if (pass == 1 && d % 16 == 0 && d <= 128) {
            int most = d <= 64 ? 4 : 2; /* query heads per block: at most 16 accumulators */
            for (int64_t h = h0; h < h1; h++)
                for (int64_t qh = h * g, nb; qh < (h + 1) * g; qh += nb) {
                    nb = (h + 1) * g - qh < most ? (h + 1) * g - qh : most;
                    /* a constant block size each, so the accumulators are registers */
#define VALUE_BLOCK(n)                                                                    \
    FN(value_block)(v_pool, pages, len, h, hkv, d, ps, num_pages, scores, qh, n, acc, k_pool, \
                    next_pages, qh == 0 ? next_count : 0)
                    if (nb == 4) VALUE_BLOCK(4);
                    else if (nb == 3) VALUE_BLOCK(3);
                    else if (nb == 2) VALUE_BLOCK(2);
                    else VALUE_BLOCK(1);
#undef VALUE_BLOCK
                }
            break;
        }
#endif
        if (pass == 1) memset(acc, 0, sizeof(float) * (size_t)(hq * d));
        for (int64_t pi = 0; pi < npages; pi++) {
            int64_t page = clamp_page(pages[pi], num_pages);
            if (pi + 2 < npages) {  /* two pages ahead */
                prefetch_page(pool + clamp_page(pages[pi + 2], num_pages) * ps * width, page_bytes);
            if (pass == 0)  /* the V pass reads this page next */
                prefetch_page(v_pool + page * ps * width, page_bytes);
            }
            int64_t t0 = pi * ps, m = len - t0 < ps ? len - t0 : ps;
#ifdef HAVE_VECTORS
            if (pass == 0 && ps == 16 && m == 16 && d % 16 == 0) {
                FN(page_scores)(qf, pool + page * ps * width, g, hkv, h0, h1, d, len, t0, scores);
                continue;
            }
#endif
            if (pass == 0) {
                FN(token_scores)(qf, pool + page * ps * width, m, g, hkv, h0, h1, d, len, t0, row,
                                 scores);
                continue;
            }
            for (int64_t o = 0; o < m; o++) {
                const kv_t *src = pool + (page * ps + o) * width;
                for (int64_t j = h0 * d; j < h1 * d; j++) row[j] = LDK(src[j]);
                for (int64_t qh = h0 * g; qh < h1 * g; qh++) {
                    const float *r = row + qh / g * d;
                    float p = scores[qh * len + t0 + o];
                    for (int64_t j = 0; j < d; j++) acc[qh * d + j] += p * r[j];
                }
            }
        }
        if (pass == 1) break;
        FN(softmax)(scores, len, skip, h0 * g, h1 * g, cap);
    }
}

#ifdef HAVE_VECTORS
#define GROUP_ROWS 16       /* the most rows of one request attended together (a verify's) */
#define GROUP_CHUNK_PAGES 4 /* value pages read for all of a group's rows before the next */

/* One row of a group: its scaled query, its first page (its window's), its `len` keys from
   there, `skip` of them outside the window, its scores [hq, len] and output acc [hq, d]. */
struct FN(group_row) {
    const float *qf;
    int64_t first, len, skip;
    float *scores, *acc;
};

/* value_block over the keys ta .. tb - 1 of one row (ta on a page boundary), adding to the
   accumulators already in acc: the same sums in the same order, split at page boundaries. */
static inline __attribute__((always_inline)) void FN(value_span)(
    const kv_t *v_pool, const int32_t *pages, int64_t ta, int64_t tb, int64_t h, int64_t hkv,
    int64_t d, int64_t ps, int64_t num_pages, const float *scores, int64_t len, int64_t qh0,
    int nb, float *acc) {
    v16f a[4][8];
    for (int i = 0; i < nb; i++) memcpy(a[i], acc + (qh0 + i) * d, sizeof(float) * (size_t)d);
    for (int64_t t0 = ta; t0 < tb; t0 += ps) {
        int64_t page = clamp_page(pages[t0 / ps], num_pages);
        int64_t m = tb - t0 < ps ? tb - t0 : ps;
        for (int64_t o = 0; o < m; o++) {
            const kv_t *v = v_pool + ((page * ps + o) * hkv + h) * d;
            for (int c = 0; c < d / 16; c++) {
                v16f x = LDV_KV(v + 16 * c);
                for (int i = 0; i < nb; i++) a[i][c] += scores[(qh0 + i) * len + t0 + o] * x;
            }
        }
    }
    for (int i = 0; i < nb; i++) memcpy(acc + (qh0 + i) * d, a[i], sizeof(float) * (size_t)d);
}

/* attend for n rows of one request (one page table, `pages`): each K page is read once for
   all the rows that reach it (then hot in cache), and the values a few pages at a time for
   all rows. Each row's arithmetic is attend's, in the same order. ps == 16, d % 16 == 0,
   d <= 128. */
static inline __attribute__((always_inline)) void FN(attend_group)(
    struct FN(group_row) *rows, int64_t n, const kv_t *k_pool, const kv_t *v_pool,
    const int32_t *pages, int64_t g, int64_t hkv, int64_t h0, int64_t h1, int64_t d, int64_t ps,
    int64_t num_pages, float *row, float cap) {
    int64_t width = hkv * d, p0 = INT64_MAX, p1 = 0; /* the pages any row reads */
    for (int64_t r = 0; r < n; r++) {
        int64_t end = rows[r].first + (rows[r].len + ps - 1) / ps;
        p0 = rows[r].first < p0 ? rows[r].first : p0;
        p1 = end > p1 ? end : p1;
    }
    for (int64_t pi = p0; pi < p1; pi++) {
        const kv_t *kp = k_pool + clamp_page(pages[pi], num_pages) * ps * width;
        for (int64_t r = 0; r < n; r++) {
            struct FN(group_row) *w = rows + r;
            int64_t t0 = (pi - w->first) * ps;
            if (t0 < 0 || t0 >= w->len) continue;
            int64_t m = w->len - t0 < ps ? w->len - t0 : ps;
            if (m == 16) {
                FN(page_scores)(w->qf, kp, g, hkv, h0, h1, d, w->len, t0, w->scores);
                continue;
            }
            FN(token_scores)(w->qf, kp, m, g, hkv, h0, h1, d, w->len, t0, row, w->scores);
        }
    }
    for (int64_t r = 0; r < n; r++) {
        FN(softmax)(rows[r].scores, rows[r].len, rows[r].skip, h0 * g, h1 * g, cap);
        memset(rows[r].acc + h0 * g * d, 0, sizeof(float) * (size_t)((h1 - h0) * g * d));
    }
    int most = d <= 64 ? 4 : 2; /* query heads per block, as attend's */
    for (int64_t c0 = p0; c0 < p1; c0 += GROUP_CHUNK_PAGES)
        for (int64_t r = 0; r < n; r++) {
            struct FN(group_row) *w = rows + r;
            int64_t ta = (c0 > w->first ? c0 - w->first : 0) * ps;
            int64_t tb = (c0 + GROUP_CHUNK_PAGES - w->first) * ps;
            tb = tb < w->len ? tb : w->len;
            if (ta >= tb) continue;
            for (int64_t h = h0; h < h1; h++)
                for (int64_t qh = h * g, nb; qh < (h + 1) * g; qh += nb) {
                    nb = (h + 1) * g - qh < most ? (h + 1) * g - qh : most;
#define VALUE_SPAN(k)                                                                        \
    FN(value_span)(v_pool, pages + w->first, ta, tb, h, hkv, d, ps, num_pages, w->scores, w->len, \
                   qh, k, w->acc)
                    if (nb == 4) VALUE_SPAN(4);
                    else if (nb == 3) VALUE_SPAN(3);
                    else if (nb == 2) VALUE_SPAN(2);
                    else VALUE_SPAN(1);
#undef VALUE_SPAN
                }
        }
}

/* How many rows from bi on (at most GROUP_ROWS, before `last`) are one request's consecutive
   positions: lengths len, len + 1, ... and the same pages in their page tables. */
static int64_t FN(group_of)(const int32_t *table, int64_t stride, const int32_t *lens, int64_t bi,
                            int64_t last, int64_t ps) {
    int64_t n = 1;
    if (lens[bi] <= 0) return 1;
    while (bi + n < last && n < GROUP_ROWS && lens[bi + n] == lens[bi] + n &&
           !memcmp(table + (bi + n) * stride, table + bi * stride,
                   sizeof(int32_t) * (size_t)((lens[bi + n] + ps - 1) / ps)))
        n++;
    return n;
}

/* The rows bi .. bi + n - 1 (a group_of) together: attend_rows' results for them. */
static void FN(attend_together)(const scalar_t *q, const kv_t *k_pool, const kv_t *v_pool,
                                const int32_t *pages, const int32_t *lens, int64_t n, int64_t hq,
                                int64_t hkv, int64_t h0, int64_t h1, int64_t d, int64_t ps,
                                int64_t num_pages, float scale, int64_t window, float cap,
                                scalar_t *out) {
    int64_t g = hq / hkv, j0 = h0 * g * d, j1 = h1 * g * d, most = lens[n - 1];
    struct FN(group_row) rows[GROUP_ROWS];
    /* each row's buffers placed as attend_rows places its own (qf, acc, row; scores), on
       64-byte boundaries: the vectorised loops split their sums the same way, same bits */
    int64_t part = (2 * hq * d + hkv * d + 15) / 16 * 16, stride = part + (hq * most + 15) / 16 * 16;
    float *buf = aligned_floats(n * stride);
    for (int64_t r = 0; r < n; r++) {
        struct FN(group_row) *w = rows + r;
        int64_t start = window > 0 && lens[r] > window ? lens[r] - window : 0;
        float *qf = buf + r * stride;
        w->qf = qf;
        w->acc = qf + hq * d;
        w->scores = qf + part;
        w->first = start / ps;
        w->len = lens[r] - w->first * ps;
        w->skip = start % ps;
        for (int64_t j = j0; j < j1; j++) qf[j] = LD(q[r * hq * d + j]) * scale;
    }
    float *row = buf + 2 * hq * d;
    if (d == 64)
        FN(attend_group)(rows, n, k_pool, v_pool, pages, g, hkv, h0, h1, 64, 16, num_pages, row,
                          cap);
    else if (d == 128)
        FN(attend_group)(rows, n, k_pool, v_pool, pages, g, hkv, h0, h1, 128, 16, num_pages, row,
                          cap);
    else
        FN(attend_group)(rows, n, k_pool, v_pool, pages, g, hkv, h0, h1, d, 16, num_pages, row,
                          cap);
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = j0; j < j1; j++) out[r * hq * d + j] = ST(rows[r].acc[j]);
    free(buf);
}
#endif

/* One query per request against its paged K/V (pools [pages, ps, hkv, d]); query head h reads
   kv head h / (hq / hkv). Float32 softmax; a request with no key gets zeros. With a window
   (> 0), only a request's last `window` keys: its pages from the one holding the first of
   them, the keys before it in that page skipped. */
/* decode attention for requests first .. last - 1, the query heads of kv heads h0 .. h1 - 1 */
static void FN(attend_rows)(const scalar_t *q, const kv_t *k_pool, const kv_t *v_pool,
                            const int32_t *table, int64_t table_stride, const int32_t *lens,
                            int64_t first, int64_t last, int64_t hq, int64_t hkv, int64_t h0,
                            int64_t h1, int64_t d, int64_t ps, int64_t num_pages, float scale,
                            int64_t window, float softcap, scalar_t *out) {
    int64_t g = hq / hkv, cap = 0, j0 = h0 * g * d, j1 = h1 * g * d; /* their q / out values */
    float *scores = NULL;
    float *qf = aligned_floats(2 * hq * d + hkv * d);
    float *acc = qf + hq * d, *row = acc + hq * d;
    for (int64_t bi = first; bi < last; bi++) {
        int64_t len = lens[bi];
        scalar_t *oh = out + bi * hq * d;
#ifdef HAVE_VECTORS
        /* a verify's rows of one request: its K/V read once for all of them */
        int64_t n = ps == 16 && d % 16 == 0 && d <= 128
                        ? FN(group_of)(table, table_stride, lens, bi, last, ps)
                        : 1;
        if (n > 1) {
            FN(attend_together)(q + bi * hq * d, k_pool, v_pool, table + bi * table_stride,
                                lens + bi, n, hq, hkv, h0, h1, d, ps, num_pages, scale, window,
                                softcap, oh);
            bi += n - 1;
            continue;
        }
#endif
        if (len <= 0) {
            for (int64_t j = j0; j < j1; j++) oh[j] = ST(0.0f);
            continue;
        }
        if (len > cap) {
            cap = len;
            free(scores);
            scores = aligned_floats(hq * cap);
        }
        const int32_t *pages = table + bi * table_stride;
        /* the V pass prefetches the next request's K pages, one per page it reads */
        const int32_t *next = bi + 1 < last ? pages + table_stride : NULL;
        int64_t next_count = next ? (lens[bi + 1] + ps - 1) / ps : 0, skip = 0;
        if (window > 0 && len > window) { /* from the window's first page */
            int64_t start = len - window;
            pages += start / ps;
            len -= start / ps * ps;
            skip = start % ps;
            next_count = 0;
        }
        for (int64_t j = j0; j < j1; j++) qf[j] = LD(q[bi * hq * d + j]) * scale;
        if (d == 64 && ps == 16)
            FN(attend)(qf, k_pool, v_pool, pages, len, g, hkv, h0, h1, 64, 16, num_pages, scores,
                       row, acc, next, next_count, skip, softcap);
        else if (d == 128 && ps == 16)
            FN(attend)(qf, k_pool, v_pool, pages, len, g, hkv, h0, h1, 128, 16, num_pages,
                       scores, row, acc, next, next_count, skip, softcap);
        else
            FN(attend)(qf, k_pool, v_pool, pages, len, g, hkv, h0, h1, d, ps, num_pages, scores,
                       row, acc, next, next_count, skip, softcap);
        for (int64_t j = j0; j < j1; j++) oh[j] = ST(acc[j]);
    }
    free(scores);
    free(qf);
}

struct FN(attend_job) {
    const scalar_t *q;
    const kv_t *k_pool, *v_pool;
    const int32_t *table, *lens;
    int64_t table_stride, b, hq, hkv, d, ps, num_pages;
    float scale;
    scalar_t *out;
    int64_t window;
    float cap;
};

#ifdef _OPENMP /* the runner's jobs (decode_attention's OpenMP branch) */
static void FN(attend_part)(void *p, int part, int parts) { /* a contiguous run of requests */
    const struct FN(attend_job) *j = p;
    FN(attend_rows)(j->q, j->k_pool, j->v_pool, j->table, j->table_stride, j->lens,
                    j->b * part / parts, j->b * (part + 1) / parts, j->hq, j->hkv, 0, j->hkv,
                    j->d, j->ps, j->num_pages, j->scale, j->window, j->cap,
                    j->out);
}

static void FN(attend_heads)(void *p, int part, int parts) { /* one request, a run of kv heads */
    const struct FN(attend_job) *j = p;
    FN(attend_rows)(j->q, j->k_pool, j->v_pool, j->table, j->table_stride, j->lens, 0, 1, j->hq,
                    j->hkv, j->hkv * part / parts, j->hkv * (part + 1) / parts, j->d, j->ps,
                    j->num_pages, j->scale, j->window, j->cap,
                    j->out);
}
#endif

/* decode_attention with a window (0: none; attend_rows) and a soft cap of the scores (0: none) */
static void FN(decode_attention_window)(const scalar_t *q, const kv_t *k_pool, const kv_t *v_pool,
                                        const int32_t *table, int64_t table_stride,
                                        const int32_t *lens, int64_t b, int64_t hq, int64_t hkv,
                                        int64_t d, int64_t ps, int64_t num_pages, float scale,
                                        int64_t window, float cap, scalar_t *out) {
#ifdef _OPENMP
    if (b > 1 && attention_runner && omp_get_max_threads() > 1) {
        struct FN(attend_job) j = {q, k_pool, v_pool, table, lens, table_stride, b, hq, hkv, d,
                                   ps, num_pages, scale, out, window, cap};
        int parts = omp_get_max_threads();
        attention_runner(FN(attend_part), &j, parts < b ? parts : (int)b);
        return;
    }
    /* one request with a long enough context: its kv heads split over the runner's threads
       (a batch-1 decode step's attention, while the other core would wait for the next
       product) */
    if (b == 1 && hkv > 1 && lens[0] >= MIN_LEN_TO_SPLIT && attention_runner &&
        omp_get_max_threads() > 1) {
        struct FN(attend_job) j = {q, k_pool, v_pool, table, lens, table_stride, b, hq, hkv, d,
                                   ps, num_pages, scale, out, window, cap};
        int parts = omp_get_max_threads();
        attention_runner(FN(attend_heads), &j, parts < hkv ? parts : (int)hkv);
        return;
    }
    /* OpenMP is torch's own runtime here, so this follows torch's thread count: each thread
       takes a contiguous run of requests */
    if (b > 1 && omp_get_max_threads() > 1) {
#pragma omp parallel
        {
            int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
            FN(attend_rows)(q, k_pool, v_pool, table, table_stride, lens, b * id / nt,
                            b * (id + 1) / nt, hq, hkv, 0, hkv, d, ps, num_pages, scale, window,
                            cap, out);
        }
        return;
    }
#endif
    FN(attend_rows)(q, k_pool, v_pool, table, table_stride, lens, 0, b, hq, hkv, 0, hkv, d, ps,
                    num_pages, scale, window, cap, out);
}

void FN(decode_attention)(const scalar_t *q, const kv_t *k_pool, const kv_t *v_pool,
                          const int32_t *table, int64_t table_stride, const int32_t *lens,
                          int64_t b, int64_t hq, int64_t hkv, int64_t d, int64_t ps,
                          int64_t num_pages, float scale, scalar_t *out) {
    FN(decode_attention_window)(q, k_pool, v_pool, table, table_stride, lens, b, hq, hkv, d, ps,
                                num_pages, scale, 0, 0.0f, out);
}
