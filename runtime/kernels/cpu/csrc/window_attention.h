/* Template (see instance.h), included once per model type by window_attention.c: causal paged
   attention of query chunks whose keys may be limited to a sliding window and whose scores may
   be soft-capped (Gemma's local layers once a sequence outgrows the window), float32 softmax.

   Chunk b has prefix[b] cached tokens before its n[b] new ones (a decode row: a chunk of one);
   its rows are consecutive in q [T, hq, d], chunks in order. The query at position p sees the
   keys lo(p) .. p, lo(p) = max(0, p - window + 1) with a window (> 0), else 0: only those keys'
   pages are read, so a page table whose entries before a window are stale (window pages given
   back) is fine. Scores are cap * tanh(s / cap) when cap > 0.

   The work is split into tasks of up to WA_ROWS query rows of one chunk and one kv head: a
   task reads each key row of its range once for all its rows and query heads. Threads take
   tasks from a shared counter (the chunks' lengths differ). */

struct FN(wa_job) {
    const scalar_t *q;
    const scalar_t *k_pool, *v_pool;
    const int32_t *table, *prefix;
    const int64_t *tasks; /* per task: chunk, first row of the chunk, kv head, first q row */
    int64_t ntasks, table_stride, hq, hkv, d, ps, num_pages, window;
    const int32_t *n;
    float scale, cap;
    scalar_t *out;
    atomic_long next, done;
};

/* the dot product of a float query row and a key row of d values */
static inline float FN(wa_dot)(const float *qf, const scalar_t *k, int64_t d) {
#ifdef HAVE_VECTORS
    if (d % 16 == 0) {
        v16f acc = ldv_f32(qf) * LDV_KV(k);
        for (int64_t c = 16; c < d; c += 16) acc += ldv_f32(qf + c) * LDV_KV(k + c);
        float s = 0.0f;
        for (int i = 0; i < 16; i++) s += acc[i];
        return s;
    }
#endif
    float s = 0.0f;
    for (int64_t c = 0; c < d; c++) s += qf[c] * LD(k[c]);
    return s;
}

static void FN(wa_task)(struct FN(wa_job) *j, const int64_t *task, float *buf) {
    int64_t b = task[0], r0 = task[1], h = task[2], row0 = task[3];
    int64_t d = j->d, ps = j->ps, hkv = j->hkv, g = j->hq / hkv, w = j->window;
    int64_t nr = j->n[b] - r0 < WA_ROWS ? j->n[b] - r0 : WA_ROWS, m = nr * g;
    int64_t p0 = j->prefix[b] + r0, hi = p0 + nr; /* keys lo .. hi - 1 */
    int64_t lo = w > 0 && p0 - w + 1 > 0 ? p0 - w + 1 : 0, len = hi - lo;
    const int32_t *pages = j->table + b * j->table_stride;
    float *qf = buf, *acc = buf + m * d, *scores = buf + 2 * m * d;
    for (int64_t i = 0; i < nr; i++)
        for (int64_t gi = 0; gi < g; gi++) {
            const scalar_t *src = j->q + ((row0 + i) * j->hq + h * g + gi) * d;
            for (int64_t c = 0; c < d; c++) qf[(i * g + gi) * d + c] = LD(src[c]) * j->scale;
        }
    /* row i (position p0 + i) sees keys first(i) .. p0 + i */
#define WA_FIRST(i) (w > 0 && p0 + (i) - w + 1 > lo ? p0 + (i) - w + 1 : lo)
    for (int64_t t = lo; t < hi; t++) {
        int64_t page = clamp_page(pages[t / ps], j->num_pages);
        const scalar_t *k = j->k_pool + ((page * ps + t % ps) * hkv + h) * d;
        for (int64_t i = 0; i < nr; i++) {
            if (t > p0 + i || t < WA_FIRST(i)) continue;
            for (int64_t gi = 0; gi < g; gi++) {
                float s = FN(wa_dot)(qf + (i * g + gi) * d, k, d);
                if (j->cap > 0.0f) s = j->cap * tanhf(s / j->cap);
                scores[(i * g + gi) * len + t - lo] = s;
            }
        }
    }
    for (int64_t i = 0; i < nr; i++)
        for (int64_t gi = 0; gi < g; gi++) {
            float *sc = scores + (i * g + gi) * len;
            int64_t a = WA_FIRST(i) - lo, e = p0 + i - lo + 1;
            float top = sc[a], total = 0.0f;
            for (int64_t t = a + 1; t < e; t++) top = sc[t] > top ? sc[t] : top;
            for (int64_t t = a; t < e; t++) {
                sc[t] = expf(sc[t] - top);
                total += sc[t];
            }
            for (int64_t t = a; t < e; t++) sc[t] /= total;
        }
    memset(acc, 0, sizeof(float) * (size_t)(m * d));
    for (int64_t t = lo; t < hi; t++) {
        int64_t page = clamp_page(pages[t / ps], j->num_pages);
        const scalar_t *v = j->v_pool + ((page * ps + t % ps) * hkv + h) * d;
        for (int64_t i = 0; i < nr; i++) {
            if (t > p0 + i || t < WA_FIRST(i)) continue;
            for (int64_t gi = 0; gi < g; gi++) {
                float p = scores[(i * g + gi) * len + t - lo], *o = acc + (i * g + gi) * d;
                for (int64_t c = 0; c < d; c++) o[c] += p * LD(v[c]);
            }
        }
    }
#undef WA_FIRST
    for (int64_t i = 0; i < nr; i++)
        for (int64_t gi = 0; gi < g; gi++) {
            scalar_t *dst = j->out + ((row0 + i) * j->hq + h * g + gi) * d;
            for (int64_t c = 0; c < d; c++) dst[c] = ST(acc[(i * g + gi) * d + c]);
        }
}

/* one thread's share: tasks from the shared counter until none is left */
static void FN(wa_part)(void *p, int part, int parts) {
    struct FN(wa_job) *j = p;
    (void)part;
    (void)parts;
    float *buf = NULL;
    int64_t cap = 0;
    for (;;) {
        int64_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->ntasks) break;
        const int64_t *task = j->tasks + 4 * k;
        int64_t b = task[0], nr = j->n[b] - task[1] < WA_ROWS ? j->n[b] - task[1] : WA_ROWS;
        int64_t p0 = j->prefix[b] + task[1], m = nr * (j->hq / j->hkv);
        int64_t len = j->window > 0 && j->window - 1 < p0 ? j->window - 1 + nr : p0 + nr;
        int64_t need = m * (2 * j->d + len);
        if (need > cap) {
            free(buf);
            cap = need;
            buf = malloc(sizeof(float) * (size_t)cap);
            if (!buf) return; /* the caller sees the unfinished count */
        }
        FN(wa_task)(j, task, buf);
        atomic_fetch_add(&j->done, 1);
    }
    free(buf);
}

/* The attention of `chunks` query chunks (see above) into out [T, hq, d]; `runner`: a thread
   pool to split the tasks over (NULL: OpenMP where built with it, else this thread). Returns 0,
   or -1 when memory ran out. */
int FN(window_attention)(const scalar_t *q, const scalar_t *k_pool, const scalar_t *v_pool,
                         const int32_t *table, int64_t table_stride, const int32_t *prefix,
                         const int32_t *n, int64_t chunks, int64_t hq, int64_t hkv, int64_t d,
                         int64_t ps, int64_t num_pages, float scale, int64_t window, float cap,
                         par_runner runner, scalar_t *out) {
    int64_t ntasks = 0;
    for (int64_t b = 0; b < chunks; b++) ntasks += (n[b] + WA_ROWS - 1) / WA_ROWS * hkv;
    int64_t *tasks = malloc(sizeof(int64_t) * (size_t)(4 * ntasks + 1));
    if (!tasks) return -1;
    int64_t k = 0, row = 0;
    for (int64_t b = 0; b < chunks; b++) {
        for (int64_t r0 = 0; r0 < n[b]; r0 += WA_ROWS)
            for (int64_t h = 0; h < hkv; h++) {
                int64_t *t = tasks + 4 * k++;
                t[0] = b, t[1] = r0, t[2] = h, t[3] = row + r0;
            }
        row += n[b];
    }
    struct FN(wa_job) j = {.q = q, .k_pool = k_pool, .v_pool = v_pool, .table = table,
                           .prefix = prefix, .tasks = tasks, .ntasks = ntasks,
                           .table_stride = table_stride, .hq = hq, .hkv = hkv, .d = d, .ps = ps,
                           .num_pages = num_pages, .window = window, .n = n, .scale = scale,
                           .cap = cap, .out = out};
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    int parts = 1;
#ifdef _OPENMP
    parts = omp_get_max_threads();
#endif
    if (parts > ntasks) parts = ntasks > 0 ? (int)ntasks : 1;
    if (runner && parts > 1) {
        runner(FN(wa_part), &j, parts);
    } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(parts) if (parts > 1)
        FN(wa_part)(&j, omp_get_thread_num(), omp_get_num_threads());
#else
        FN(wa_part)(&j, 0, 1);
#endif
    }
    free(tasks);
    return atomic_load(&j.done) == ntasks ? 0 : -1;
}
