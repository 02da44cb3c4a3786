/* The lazy DFA's subset construction (lazy_dfa.py's native core, loaded by native_dfa.py): DFA
   states are interned sets of NFA states; `subset_expand` computes one state's 256-byte row.

   The NFA stays in Python (its blocks and deferred pieces are filled as walks read them): the
   core holds a mirror of the NFA states it has been handed, each one's epsilon targets and byte
   edges (256-bit masks, targets), and computes closures over them (the epsilon-reachable
   states with byte edges, or final). An expansion that meets a state it lacks numbers nothing:
   it returns the states it lacks, Python fills them (as its own construction would, reading
   them) and hands them over, and the expansion runs again. Not thread-safe: the caller
   serialises calls on one core. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DEAD 0
#define UNEXPANDED (-1)

enum { OK = 0, OVER_BUDGET = 2, NO_MEMORY = 3 };

typedef struct { uint64_t w[4]; } mask_t;

typedef struct {
    /* the NFA mirror, indexed by NFA state id: 1 + its record, 0 when not handed over */
    int32_t *rec_of; int64_t rec_of_cap;
    int32_t *edge_start, *edge_count;  /* per record: its edges (-1: not handed over) */
    int32_t *eps_start, *eps_count;    /* per record: its epsilon targets */
    int32_t *clo_start, *clo_len;      /* per record: its closure (-1: not computed) */
    int64_t n_recs, recs_cap;
    int32_t *eps; int64_t n_eps, eps_cap;
    mask_t *masks; int32_t *targets; int64_t n_edges, edges_cap;
    int32_t *clo; int64_t n_clo, clo_cap;
    int32_t final;
    /* DFA states: sorted NFA state sets, interned by an open-addressed hash table */
    int32_t *set_start, *set_len; uint64_t *set_hash; int64_t n_states, states_cap;
    int32_t *sets; int64_t n_sets, sets_cap;
    int32_t *slots; int64_t slots_cap;  /* state id + 1, 0: empty */
    int64_t max_states;
    /* scratch: epoch stamps per NFA record (a union's, a closure walk's, the missing list's) */
    uint32_t *stamp, *seen, *listed; uint32_t epoch, listed_epoch;
    int32_t *buf; int64_t buf_cap;
    int32_t *stack; int64_t stack_cap;
} core_t;

static int grow(void **p, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * size);
    if (!q) return -1;
    *p = q; *cap = n;
    return 0;
}

static uint64_t hash_set(const int32_t *s, int64_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint32_t)s[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

void subset_free(core_t *c) {
    if (!c) return;
    free(c->eps_start); free(c->eps_count); free(c->eps); free(c->seen); free(c->listed);
    free(c->stack);
    free(c->rec_of); free(c->edge_start); free(c->edge_count); free(c->clo_start);
    free(c->clo_len); free(c->masks); free(c->targets); free(c->clo); free(c->set_start);
    free(c->set_len); free(c->set_hash); free(c->sets); free(c->slots); free(c->stamp);
    free(c->buf); free(c);
}

core_t *subset_new(int64_t final, int64_t max_states) {
    core_t *c = calloc(1, sizeof(core_t));
    if (!c) return 0;
    c->final = (int32_t)final;
    c->max_states = max_states;
    c->slots_cap = 1024;
    c->slots = calloc((size_t)c->slots_cap, sizeof(int32_t));
    if (!c->slots) { subset_free(c); return 0; }
    return c;
}

/* the record of NFA state x, made when missing (-1: out of memory) */
static int64_t record(core_t *c, int64_t x) {
    if (x >= c->rec_of_cap) {
        int64_t old = c->rec_of_cap;
        if (grow((void **)&c->rec_of, &c->rec_of_cap, x + 1, sizeof(int32_t))) return -1;
        memset(c->rec_of + old, 0, (size_t)(c->rec_of_cap - old) * sizeof(int32_t));
    }
    if (c->rec_of[x]) return c->rec_of[x] - 1;
    int64_t r = c->n_recs, cap = c->recs_cap;
    if (r >= cap) {
        int64_t need = r + 1;
        if (grow((void **)&c->edge_start, &cap, need, sizeof(int32_t))) return -1;
        cap = c->recs_cap;
        if (grow((void **)&c->edge_count, &cap, need, sizeof(int32_t))) return -1;
        cap = c->recs_cap;
        if (grow((void **)&c->clo_start, &cap, need, sizeof(int32_t))) return -1;
        cap = c->recs_cap;
        if (grow((void **)&c->clo_len, &cap, need, sizeof(int32_t))) return -1;
        cap = c->recs_cap;
        if (grow((void **)&c->eps_start, &cap, need, sizeof(int32_t))) return -1;
        cap = c->recs_cap;
        if (grow((void **)&c->eps_count, &cap, need, sizeof(int32_t))) return -1;
        cap = c->recs_cap;
        if (grow((void **)&c->stamp, &cap, need, sizeof(uint32_t))) return -1;
        cap = c->recs_cap;
        if (grow((void **)&c->seen, &cap, need, sizeof(uint32_t))) return -1;
        cap = c->recs_cap;
        if (grow((void **)&c->listed, &cap, need, sizeof(uint32_t))) return -1;
        c->recs_cap = cap;
    }
    c->edge_start[r] = c->clo_start[r] = c->clo_len[r] = -1;
    c->edge_count[r] = c->eps_start[r] = c->eps_count[r] = 0;
    c->stamp[r] = c->seen[r] = c->listed[r] = 0;
    c->n_recs = r + 1;
    c->rec_of[x] = (int32_t)(r + 1);
    return r;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void sort_i32(int32_t *s, int64_t n) {
    if (n > 24) { qsort(s, (size_t)n, sizeof(int32_t), cmp_i32); return; }
    for (int64_t i = 1; i < n; i++) {  /* most unions are a few states */
        int32_t v = s[i]; int64_t j = i;
        while (j > 0 && s[j - 1] > v) { s[j] = s[j - 1]; j--; }
        s[j] = v;
    }
}

/* Hand over n NFA states: state ids[k] has n_eps[k] epsilon targets (taken in turn from
   eps_targets) and n_edges[k] edges (masks: 4 little-endian 64-bit words each, and
   edge_targets). A state handed over before is skipped. Returns OK or NO_MEMORY. */
int64_t subset_add(core_t *c, int64_t n, const int64_t *ids, const int64_t *n_eps,
                   const int64_t *n_edges, const int64_t *eps_targets, const uint64_t *masks,
                   const int64_t *edge_targets) {
    int64_t e = 0, p = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = record(c, ids[k]), m = n_edges[k], q = n_eps[k];
        if (r < 0) return NO_MEMORY;
        if (c->edge_start[r] >= 0) { e += m; p += q; continue; }
        int64_t cap = c->edges_cap;
        if (grow((void **)&c->masks, &cap, c->n_edges + m, sizeof(mask_t))) return NO_MEMORY;
        cap = c->edges_cap;
        if (grow((void **)&c->targets, &cap, c->n_edges + m, sizeof(int32_t))) return NO_MEMORY;
        c->edges_cap = cap;
        if (grow((void **)&c->eps, &c->eps_cap, c->n_eps + q, sizeof(int32_t))) return NO_MEMORY;
        c->edge_start[r] = (int32_t)c->n_edges;
        c->edge_count[r] = (int32_t)m;
        memcpy(c->masks + c->n_edges, masks + 4 * e, (size_t)m * sizeof(mask_t));
        for (int64_t j = 0; j < m; j++) c->targets[c->n_edges++] = (int32_t)edge_targets[e++];
        c->eps_start[r] = (int32_t)c->n_eps;
        c->eps_count[r] = (int32_t)q;
        for (int64_t j = 0; j < q; j++) c->eps[c->n_eps++] = (int32_t)eps_targets[p++];
    }
    return OK;
}

/* The record of t with its closure computed (-1: t or a state its epsilon walk reaches is
   not handed over: each such state is added to missing, once per `listed` epoch, while
   *n_missing < cap; -2: out of memory). */
static int64_t closure(core_t *c, int64_t t, int64_t *missing, int64_t *n_missing, int64_t cap) {
    int64_t rt = record(c, t);
    if (rt < 0) return -2;
    if (c->clo_len[rt] >= 0) return rt;
    uint32_t ep = ++c->epoch;
    int64_t top = 0, len = 0, lacking = 0;
    if (grow((void **)&c->stack, &c->stack_cap, 1, sizeof(int32_t))) return -2;
    c->stack[top++] = (int32_t)t;
    c->seen[rt] = ep;
    while (top) {
        int32_t x = c->stack[--top];
        int64_t rx = c->rec_of[x] - 1;
        if (c->edge_start[rx] < 0) {  /* not handed over: Python fills it */
            lacking = 1;
            if (c->listed[rx] != c->listed_epoch && *n_missing < cap) {
                c->listed[rx] = c->listed_epoch;
                missing[(*n_missing)++] = x;
            }
            continue;
        }
        if (c->edge_count[rx] > 0 || x == c->final) {
            if (grow((void **)&c->buf, &c->buf_cap, len + 1, sizeof(int32_t))) return -2;
            c->buf[len++] = x;
        }
        for (int32_t j = 0; j < c->eps_count[rx]; j++) {
            int32_t y = c->eps[c->eps_start[rx] + j];
            int64_t ry = record(c, y);
            if (ry < 0) return -2;
            if (c->seen[ry] == ep) continue;
            c->seen[ry] = ep;
            if (grow((void **)&c->stack, &c->stack_cap, top + 1, sizeof(int32_t))) return -2;
            c->stack[top++] = y;
        }
    }
    if (lacking) return -1;
    sort_i32(c->buf, len);
    if (grow((void **)&c->clo, &c->clo_cap, c->n_clo + len, sizeof(int32_t))) return -2;
    c->clo_start[rt] = (int32_t)c->n_clo;
    c->clo_len[rt] = (int32_t)len;
    memcpy(c->clo + c->n_clo, c->buf, (size_t)len * sizeof(int32_t));
    c->n_clo += len;
    return rt;
}

static int64_t lookup(const core_t *c, const int32_t *s, int64_t n, uint64_t h) {
    int64_t mask = c->slots_cap - 1;
    for (int64_t i = (int64_t)(h & (uint64_t)mask);; i = (i + 1) & mask) {
        int32_t j = c->slots[i];
        if (!j) return -1 - i;  /* not there: -1 - the free slot */
        j--;
        if (c->set_hash[j] == h && c->set_len[j] == n &&
            !memcmp(c->sets + c->set_start[j], s, (size_t)n * sizeof(int32_t)))
            return j;
    }
}

static int rehash(core_t *c) {
    int64_t cap = c->slots_cap * 2;
    int32_t *slots = calloc((size_t)cap, sizeof(int32_t));
    if (!slots) return -1;
    for (int64_t j = 0; j < c->n_states; j++) {
        int64_t i = (int64_t)(c->set_hash[j] & (uint64_t)(cap - 1));
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = (int32_t)(j + 1);
    }
    free(c->slots);
    c->slots = slots; c->slots_cap = cap;
    return 0;
}

/* The id of the sorted set s (n states), numbered when new (-1 - error when it cannot be). */
static int64_t intern(core_t *c, const int32_t *s, int64_t n) {
    uint64_t h = hash_set(s, n);
    int64_t at = lookup(c, s, n, h);
    if (at >= 0) return at;
    int64_t j = c->n_states;
    if (j > c->max_states && n) return -1 - OVER_BUDGET;  /* (the empty set is DEAD, state 0) */
    if (2 * (j + 1) > c->slots_cap) {
        if (rehash(c)) return -1 - NO_MEMORY;
        at = lookup(c, s, n, h);
    }
    int64_t cap = c->states_cap;
    if (grow((void **)&c->set_start, &cap, j + 1, sizeof(int32_t))) return -1 - NO_MEMORY;
    cap = c->states_cap;
    if (grow((void **)&c->set_len, &cap, j + 1, sizeof(int32_t))) return -1 - NO_MEMORY;
    cap = c->states_cap;
    if (grow((void **)&c->set_hash, &cap, j + 1, sizeof(uint64_t))) return -1 - NO_MEMORY;
    c->states_cap = cap;
    if (grow((void **)&c->sets, &c->sets_cap, c->n_sets + n, sizeof(int32_t)))
        return -1 - NO_MEMORY;
    memcpy(c->sets + c->n_sets, s, (size_t)n * sizeof(int32_t));
    c->set_start[j] = (int32_t)c->n_sets; c->set_len[j] = (int32_t)n; c->set_hash[j] = h;
    c->n_sets += n;
    c->slots[-1 - at] = (int32_t)(j + 1);
    c->n_states = j + 1;
    return j;
}

/* Number the closure of NFA state s as the start state: its id (1; DEAD when the closure is
   empty), its `accepting` entry written; -(16 + n) when n states it reaches are missing (as
   `subset_expand`), -1 - OVER_BUDGET or -1 - NO_MEMORY. */
int64_t subset_start(core_t *c, int64_t s, uint8_t *accepting, int64_t *missing, int64_t cap) {
    int64_t n_missing = 0;
    c->listed_epoch = ++c->epoch;
    int64_t r = closure(c, s, missing, &n_missing, cap);
    if (r == -1) return -(16 + n_missing);
    if (r < 0) return -1 - NO_MEMORY;
    if (c->n_states == 0) intern(c, c->buf, 0);  /* DEAD first */
    int64_t n = c->clo_len[r];
    if (n == 0) return DEAD;
    if (grow((void **)&c->buf, &c->buf_cap, n, sizeof(int32_t))) return -1 - NO_MEMORY;
    memcpy(c->buf, c->clo + c->clo_start[r], (size_t)n * sizeof(int32_t));
    int64_t before = c->n_states, j = intern(c, c->buf, n);
    if (j < 0) return j;
    if (j >= before) {
        int acc = 0;
        for (int64_t q = 0; q < n; q++) acc |= c->buf[q] == c->final;
        accepting[j] = (uint8_t)acc;
    }
    return j;
}

/* Number the sorted set s (n states) as the next DFA state, or find it (restoring a pickled
   lazy DFA: its sets in their order); its id, or -1 - OVER_BUDGET / NO_MEMORY. */
int64_t subset_intern_set(core_t *c, const int64_t *s, int64_t n) {
    if (grow((void **)&c->buf, &c->buf_cap, n + 1, sizeof(int32_t))) return -1 - NO_MEMORY;
    if (c->n_states == 0) intern(c, c->buf, 0);  /* DEAD first */
    for (int64_t i = 0; i < n; i++) c->buf[i] = (int32_t)s[i];
    return intern(c, c->buf, n);
}

/* The NFA states of DFA state j (sorted) into out (room for cap); their count (-1: no room). */
int64_t subset_states(const core_t *c, int64_t j, int64_t *out, int64_t cap) {
    if (j <= 0 || j >= c->n_states) return 0;
    int64_t n = c->set_len[j];
    if (n > cap) return -1;
    for (int64_t i = 0; i < n; i++) out[i] = c->sets[c->set_start[j] + i];
    return n;
}

int64_t subset_num_states(const core_t *c) { return c->n_states; }

/* a new state budget (the owner's budget changed after the core was made) */
void subset_set_budget(core_t *c, int64_t max_states) { c->max_states = max_states; }

/* Expand DFA state i: its row in table (int32 [rows, 256]) gets each byte's target state, new
   states' rows are set UNEXPANDED and their `accepting` entries written; the caller makes room
   for 256 new states. Returns, when done, new + (live << 10) + ((only + 1) << 20): the states
   numbered, how many bytes have an edge, the one such byte (-1: not one). Else negative:
   -1 - OVER_BUDGET when a new state would pass the budget (the states numbered so far stay
   numbered, the row is not written), -1 - NO_MEMORY, or -(16 + n) when n targets' closures
   are missing, listed in missing (room for cap; the rest come with the next call). */
int64_t subset_expand(core_t *c, int64_t i, int32_t *table, uint8_t *accepting, int64_t *missing,
                      int64_t cap) {
    const int32_t *set = c->sets + c->set_start[i];
    int64_t n = c->set_len[i], n_edges = 0;
    /* the set's edges; each target's closure must be computable */
    for (int64_t k = 0; k < n; k++) n_edges += c->edge_count[c->rec_of[set[k]] - 1];
    int64_t words = (n_edges + 63) / 64, n_missing = 0, lacking = 0;
    c->listed_epoch = ++c->epoch;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = c->rec_of[set[k]] - 1;
        for (int32_t e = c->edge_start[r]; e < c->edge_start[r] + c->edge_count[r]; e++) {
            int64_t rt = closure(c, c->targets[e], missing, &n_missing, cap);
            if (rt == -2) return -1 - NO_MEMORY;
            lacking |= rt == -1;
        }
    }
    if (lacking) return -(16 + n_missing);
    /* which edges each byte fires: a bitset of `words` words per byte */
    uint64_t *fire = calloc((size_t)(256 * (words ? words : 1)), sizeof(uint64_t));
    int32_t *edge_target = malloc((size_t)(n_edges ? n_edges : 1) * sizeof(int32_t));
    if (!fire || !edge_target) {
        free(fire); free(edge_target);
        return -1 - NO_MEMORY;
    }
    int64_t ne = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = c->rec_of[set[k]] - 1;
        for (int32_t e = c->edge_start[r]; e < c->edge_start[r] + c->edge_count[r]; e++) {
            const mask_t *m = c->masks + e;
            for (int w = 0; w < 4; w++)
                for (uint64_t bits = m->w[w]; bits; bits &= bits - 1) {
                    int b = w * 64 + __builtin_ctzll(bits);
                    fire[b * words + ne / 64] |= 1ull << (ne % 64);
                }
            edge_target[ne++] = c->targets[e];
        }
    }
    /* each distinct set of fired edges: the union of its targets' closures, numbered */
    int32_t row[256], first_of[256];
    int64_t n_distinct = 0, n_live = 0, only = -1, before = c->n_states, status = OK;
    for (int b = 0; b < 256 && status == OK; b++) {
        const uint64_t *f = fire + b * words;
        int any = 0;
        for (int64_t w = 0; w < words; w++) any |= f[w] != 0;
        if (!any) { row[b] = DEAD; continue; }
        n_live++; only = b;
        int64_t d = 0;
        for (; d < n_distinct; d++)
            if (!memcmp(fire + first_of[d] * words, f, (size_t)words * sizeof(uint64_t))) break;
        if (d < n_distinct) { row[b] = row[first_of[d]]; continue; }
        first_of[n_distinct++] = b;
        uint32_t ep2 = ++c->epoch;
        int64_t len = 0;
        for (int64_t e = 0; e < ne; e++) {
            if (!(f[e / 64] >> (e % 64) & 1)) continue;
            int64_t rt = c->rec_of[edge_target[e]] - 1;
            const int32_t *cl = c->clo + c->clo_start[rt];
            for (int32_t q = 0; q < c->clo_len[rt]; q++) {
                int64_t rq = c->rec_of[cl[q]] - 1;
                if (c->stamp[rq] == ep2) continue;
                c->stamp[rq] = ep2;
                if (grow((void **)&c->buf, &c->buf_cap, len + 1, sizeof(int32_t))) {
                    status = NO_MEMORY;
                    break;
                }
                c->buf[len++] = cl[q];
            }
        }
        if (status != OK) break;
        sort_i32(c->buf, len);
        int64_t j = intern(c, c->buf, len);
        if (j < 0) { status = -1 - j; break; }
        if (j >= before && j == c->n_states - 1) {  /* new: unexpanded, accepting if final */
            int acc = 0;
            for (int64_t q = 0; q < len; q++) acc |= c->buf[q] == c->final;
            accepting[j] = (uint8_t)acc;
            for (int q = 0; q < 256; q++) table[j * 256 + q] = UNEXPANDED;
        }
        row[b] = (int32_t)j;
    }
    free(fire); free(edge_target);
    if (status != OK) return -1 - status;
    memcpy(table + i * 256, row, sizeof(row));
    if (n_live != 1) only = -1;
    return (c->n_states - before) + (n_live << 10) + ((only + 1) << 20);
}
