/* The lazy DFA's subset construction (lazy_dfa.py's native core, loaded by native_dfa.py): DFA
   states are interned sets of NFA states; `subset_expand` computes one state's 256-byte row.

   The NFA stays in Python (its blocks and deferred pieces are filled as walks read them): the
   core holds a mirror of the NFA states it has been handed, each one's epsilon targets and byte
   edges (256-bit masks, targets), and computes closures over them (the epsilon-reachable
   states with byte edges, or final). An expansion that meets a state it lacks numbers nothing:
   it returns the states it lacks, Python fills them (as its own construction would, reading
   them) and hands them over, and the expansion runs again. Not thread-safe: the caller
   serialises calls on one core.

   The DFA's arrays are the caller's (`subset_bind`: the table, `accepting`, each state's live
   byte count and forced byte), written here; `subset_inline` is what the token trie walk
   (tokens/csrc/trie.c) calls, through a function pointer, for a row it meets unbuilt: the
   row is built at once when the core has every NFA state it needs and the table has room,
   else the walk leaves that subtree to Python. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DEAD 0
#define UNEXPANDED (-1)

enum { OK = 0, OVER_BUDGET = 2, NO_MEMORY = 3, NO_ROOM = 4 };
#define NEW_PER_EXPAND 256  /* states one expansion may number */

typedef struct { uint64_t w[4]; } mask_t;

/* A block of NFA state ids filled on first read (grammar/automata/nfa_blocks.py), filled here
   instead of in Python: EMBEDDED, a ByteDFA's states 1.. as ids first..; COPIES, the copies of
   a template block (the template's states handed over by Python, as any state). */
enum { EMBEDDED = 0, COPIES = 1 };
typedef struct {
    int64_t first, size, kind, k;
    const int32_t *table; const uint8_t *acc; int64_t n_cls; mask_t *cls_mask;  /* EMBEDDED */
    int64_t t_first, t_start, hole, n, m;                                      /* COPIES */
} block_t;

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
    block_t *blocks; int64_t n_blocks, blocks_cap, block_fills;
    int32_t *tmp_eps, *tmp_targets; mask_t *tmp_masks; int64_t tmp_eps_cap, tmp_edges_cap;
    /* the DFA's arrays (`subset_bind`): table int32 [capacity, 256], accepting, live (bytes
       with an edge; -1: the row is not built), forced (the one byte a state forces, or -1) */
    int32_t *table; uint8_t *accepting; int32_t *live, *forced; int64_t capacity;
    /* scratch: epoch stamps per NFA record (a union's, a closure walk's, the missing list's) */
    uint32_t *stamp, *seen, *listed; uint32_t epoch, listed_epoch;
    int32_t *buf; int64_t buf_cap;
    int32_t *stack; int64_t stack_cap;
    /* an expansion's scratch: its distinct edge masks, each one's edges (targets, chained),
       and per byte the set of distinct masks holding it (`words` 64-bit words a byte) */
    mask_t *dm; int64_t dm_cap; int32_t *dm_head; int64_t dm_head_cap;
    int32_t *e_target; int64_t e_target_cap; int32_t *e_next; int64_t e_next_cap;
    uint64_t *fire; int64_t fire_cap;
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
    free(c->buf); free(c->dm); free(c->dm_head); free(c->e_target); free(c->e_next);
    free(c->fire);
    for (int64_t b = 0; b < c->n_blocks; b++) free(c->blocks[b].cls_mask);
    free(c->blocks); free(c->tmp_eps); free(c->tmp_targets); free(c->tmp_masks);
    free(c);
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

/* Sort n distinct ints ascending: insertion sort for a few (most unions), else quicksort
   (Hoare partition around the median of three, the smaller side first). */
static void sort_i32(int32_t *s, int64_t n) {
    while (n > 24) {
        int64_t mid = n / 2;
        int32_t t;
        if (s[mid] < s[0]) { t = s[mid]; s[mid] = s[0]; s[0] = t; }
        if (s[n - 1] < s[0]) { t = s[n - 1]; s[n - 1] = s[0]; s[0] = t; }
        if (s[n - 1] < s[mid]) { t = s[n - 1]; s[n - 1] = s[mid]; s[mid] = t; }
        int32_t p = s[mid];
        int64_t i = -1, j = n;
        for (;;) {
            do i++; while (s[i] < p);
            do j--; while (s[j] > p);
            if (i >= j) break;
            t = s[i]; s[i] = s[j]; s[j] = t;
        }
        /* [0, j] <= p <= [j + 1, n) */
        if (j + 1 < n - j - 1) { sort_i32(s, j + 1); s += j + 1; n -= j + 1; }
        else { sort_i32(s + j + 1, n - j - 1); n = j + 1; }
    }
    for (int64_t i = 1; i < n; i++) {
        int32_t v = s[i]; int64_t j = i;
        while (j > 0 && s[j - 1] > v) { s[j] = s[j - 1]; j--; }
        s[j] = v;
    }
}

/* Give record r (not handed over) q epsilon targets and m edges. OK or NO_MEMORY. */
static int put_record(core_t *c, int64_t r, const int32_t *eps, int64_t q, const mask_t *masks,
                      const int32_t *targets, int64_t m) {
    int64_t cap = c->edges_cap;
    if (grow((void **)&c->masks, &cap, c->n_edges + m, sizeof(mask_t))) return NO_MEMORY;
    cap = c->edges_cap;
    if (grow((void **)&c->targets, &cap, c->n_edges + m, sizeof(int32_t))) return NO_MEMORY;
    c->edges_cap = cap;
    if (grow((void **)&c->eps, &c->eps_cap, c->n_eps + q, sizeof(int32_t))) return NO_MEMORY;
    c->edge_start[r] = (int32_t)c->n_edges;
    c->edge_count[r] = (int32_t)m;
    memcpy(c->masks + c->n_edges, masks, (size_t)m * sizeof(mask_t));
    memcpy(c->targets + c->n_edges, targets, (size_t)m * sizeof(int32_t));
    c->n_edges += m;
    c->eps_start[r] = (int32_t)c->n_eps;
    c->eps_count[r] = (int32_t)q;
    memcpy(c->eps + c->n_eps, eps, (size_t)q * sizeof(int32_t));
    c->n_eps += q;
    return OK;
}

static int room_tmp(core_t *c, int64_t q, int64_t m) {
    if (grow((void **)&c->tmp_eps, &c->tmp_eps_cap, q + 1, sizeof(int32_t))) return -1;
    int64_t cap = c->tmp_edges_cap;
    if (grow((void **)&c->tmp_targets, &cap, m + 1, sizeof(int32_t))) return -1;
    cap = c->tmp_edges_cap;
    if (grow((void **)&c->tmp_masks, &cap, m + 1, sizeof(mask_t))) return -1;
    c->tmp_edges_cap = cap;
    return 0;
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
        if (c->edge_start[r] < 0) {
            if (room_tmp(c, q, m)) return NO_MEMORY;
            for (int64_t j = 0; j < q; j++) c->tmp_eps[j] = (int32_t)eps_targets[p + j];
            for (int64_t j = 0; j < m; j++) c->tmp_targets[j] = (int32_t)edge_targets[e + j];
            if (put_record(c, r, c->tmp_eps, q, (const mask_t *)(masks + 4 * e), c->tmp_targets, m))
                return NO_MEMORY;
        }
        e += m; p += q;
    }
    return OK;
}

/* Fill NFA state x (record rx, not handed over) from its block: 1 when filled; 0 when x is
   in no block (Python fills it); 2 when its template state is not handed over yet (listed in
   missing, as `closure` lists); -1 on out of memory. What nfa_blocks.py's `fill` writes. */
static int fill_block(core_t *c, int64_t x, int64_t rx, int64_t *missing, int64_t *n_missing,
                      int64_t cap) {
    int64_t lo = 0, hi = c->n_blocks;  /* the last block whose first <= x */
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (c->blocks[mid].first <= x) lo = mid; else hi = mid;
    }
    if (!c->n_blocks) return 0;
    const block_t *b = c->blocks + lo;
    if (x < b->first || x >= b->first + b->size) return 0;
    if (b->kind == EMBEDDED) {
        int64_t i = x - b->first + 1, m = 0;
        if (room_tmp(c, 1, b->n_cls)) return -1;
        const int32_t *row = b->table + i * b->n_cls;
        for (int64_t cl = 0; cl < b->n_cls; cl++) {  /* edges grouped by target */
            int32_t j = row[cl];
            if (!j) continue;
            int32_t t = (int32_t)(j + b->first - 1);
            int64_t d = 0;
            while (d < m && c->tmp_targets[d] != t) d++;
            if (d == m) { c->tmp_targets[m] = t; memset(c->tmp_masks + m, 0, sizeof(mask_t)); m++; }
            for (int w = 0; w < 4; w++) c->tmp_masks[d].w[w] |= b->cls_mask[cl].w[w];
        }
        c->tmp_eps[0] = (int32_t)b->k;
        if (put_record(c, rx, c->tmp_eps, b->acc[i] ? 1 : 0, c->tmp_masks, c->tmp_targets, m))
            return -1;
        c->block_fills++;
        return 1;
    }
    /* COPIES: copy c_ of the template (numbered from the last; the m_ last are optional, each
       with an entry state before its block) */
    int64_t z = x - b->first, cp, o, n = b->n;
    if (z < b->m * (n + 1)) {
        cp = z / (n + 1); o = z % (n + 1);
        if (o == 0) {  /* an optional copy's entry: to k, or into the copy */
            int32_t eps[2] = {(int32_t)b->k,
                              (int32_t)(b->first + cp * (n + 1) + 1 + b->t_start - b->t_first)};
            if (put_record(c, rx, eps, 2, 0, 0, 0)) return -1;
            c->block_fills++;
            return 1;
        }
        o -= 1;
    } else {
        cp = (z - b->m * (n + 1)) / n + b->m;
        o = (z - b->m * (n + 1)) % n;
    }
    int64_t t = b->t_first + o;
    int64_t rt = record(c, t);
    if (rt < 0) return -1;
    if (c->edge_start[rt] < 0) {  /* the template state: Python hands it over first */
        if (c->listed[rt] != c->listed_epoch && *n_missing < cap) {
            c->listed[rt] = c->listed_epoch;
            missing[(*n_missing)++] = t;
        }
        return 2;
    }
    int64_t blk = cp < b->m ? b->first + cp * (n + 1) + 1
                            : b->first + b->m * (n + 1) + (cp - b->m) * n;
    int64_t off = blk - b->t_first, after;
    if (cp == 0) after = b->k;
    else {
        int64_t pc = cp - 1;
        after = pc < b->m ? b->first + pc * (n + 1)
                          : b->first + b->m * (n + 1) + (pc - b->m) * n + b->t_start - b->t_first;
    }
    int64_t q = c->eps_count[rt], m = c->edge_count[rt];
    if (room_tmp(c, q, m)) return -1;
    for (int64_t j = 0; j < q; j++) {
        int32_t y = c->eps[c->eps_start[rt] + j];
        c->tmp_eps[j] = (int32_t)(y == b->hole ? after : y + off);
    }
    for (int64_t j = 0; j < m; j++) {
        int32_t y = c->targets[c->edge_start[rt] + j];
        c->tmp_targets[j] = (int32_t)(y == b->hole ? after : y + off);
        c->tmp_masks[j] = c->masks[c->edge_start[rt] + j];
    }
    if (put_record(c, rx, c->tmp_eps, q, c->tmp_masks, c->tmp_targets, m)) return -1;
    c->block_fills++;
    return 1;
}

static block_t *new_block(core_t *c, int64_t first, int64_t size, int64_t kind, int64_t k) {
    if (c->n_blocks && first < c->blocks[c->n_blocks - 1].first + c->blocks[c->n_blocks - 1].size)
        return 0;  /* (blocks come in id order, without overlap) */
    if (grow((void **)&c->blocks, &c->blocks_cap, c->n_blocks + 1, sizeof(block_t))) return 0;
    block_t *b = c->blocks + c->n_blocks;
    memset(b, 0, sizeof(*b));
    b->first = first; b->size = size; b->kind = kind; b->k = k;
    return b;
}

/* Register an Embedded block (nfa_blocks.Embedded): a ByteDFA's table (int32 [n, n_cls]),
   byte_to_class (int32 [256]) and accepting (bool [n]), kept alive by the caller; its states
   i >= 1 are ids first + i - 1, accepting ones with an epsilon edge to k. OK or NO_MEMORY
   (or OVER_BUDGET for a block out of order: Python fills its states instead). */
int64_t subset_add_embedded(core_t *c, int64_t first, int64_t size, const int32_t *table,
                            int64_t n_cls, const int32_t *b2c, const uint8_t *acc, int64_t k) {
    mask_t *cls = calloc((size_t)(n_cls ? n_cls : 1), sizeof(mask_t));
    if (!cls) return NO_MEMORY;
    for (int byte = 0; byte < 256; byte++) cls[b2c[byte]].w[byte / 64] |= 1ull << (byte % 64);
    block_t *b = new_block(c, first, size, EMBEDDED, k);
    if (!b) { free(cls); return OVER_BUDGET; }
    b->table = table; b->acc = acc; b->n_cls = n_cls; b->cls_mask = cls;
    c->n_blocks++;
    return OK;
}

/* Register a Copies block (nfa_blocks.Copies): its template's states [t_first, t_first + n),
   start t_start and placeholder continuation hole; m optional copies of hi; then k. */
int64_t subset_add_copies(core_t *c, int64_t first, int64_t size, int64_t t_first,
                          int64_t t_start, int64_t hole, int64_t n, int64_t m, int64_t k) {
    block_t *b = new_block(c, first, size, COPIES, k);
    if (!b) return OVER_BUDGET;
    b->t_first = t_first; b->t_start = t_start; b->hole = hole; b->n = n; b->m = m;
    c->n_blocks++;
    return OK;
}

int64_t subset_block_fills(const core_t *c) { return c->block_fills; }

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
        if (c->edge_start[rx] < 0) {  /* not handed over: filled here, or Python fills it */
            int f = fill_block(c, x, rx, missing, n_missing, cap);
            if (f < 0) return -2;
            if (f != 1) {
                lacking = 1;
                if (f == 0 && c->listed[rx] != c->listed_epoch && *n_missing < cap) {
                    c->listed[rx] = c->listed_epoch;
                    missing[(*n_missing)++] = x;
                }
                continue;
            }
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
int64_t subset_start(core_t *c, int64_t s, int64_t *missing, int64_t cap) {
    uint8_t *accepting = c->accepting;
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
        c->live[j] = c->forced[j] = -1;
        for (int q = 0; q < 256; q++) c->table[j * 256 + q] = UNEXPANDED;
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

/* The arrays expansions write (the caller's; bound again whenever one is replaced): table
   int32 [capacity, 256], accepting, live and forced (int32), each with room for capacity. */
void subset_bind(core_t *c, int32_t *table, int64_t capacity, uint8_t *accepting, int32_t *live,
                 int32_t *forced) {
    c->table = table; c->capacity = capacity; c->accepting = accepting;
    c->live = live; c->forced = forced;
}

/* The closures of every edge target of DFA state i computed; 1 when they all could be, 0 when
   some target reaches NFA states not handed over (listed in missing while *n_missing < cap),
   -1 on out of memory. */
static int targets_ready(core_t *c, int64_t i, int64_t *missing, int64_t *n_missing,
                         int64_t cap) {
    const int32_t *set = c->sets + c->set_start[i];
    int64_t n = c->set_len[i];
    int lacking = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = c->rec_of[set[k]] - 1;
        for (int32_t e = c->edge_start[r]; e < c->edge_start[r] + c->edge_count[r]; e++) {
            int64_t rt = closure(c, c->targets[e], missing, n_missing, cap);
            if (rt == -2) return -1;
            lacking |= rt == -1;
        }
    }
    return !lacking;
}

/* Expand DFA state i into the bound arrays: its row gets each byte's target state, live[i]
   the bytes with an edge, forced[i] the one such byte (-1: none, several, or i accepts); new
   states' rows are set UNEXPANDED, their live and forced -1, their `accepting` entries
   written. Returns the states numbered (>= 0), or negative: -1 - NO_ROOM when the table has
   not room for NEW_PER_EXPAND more states, -1 - OVER_BUDGET when a new state would pass the
   budget (the states numbered so far stay numbered, the row is not written), -1 - NO_MEMORY,
   or -(16 + n) when n targets' closures are missing, listed in missing (room for cap; the
   rest come with the next call). */
int64_t subset_expand(core_t *c, int64_t i, int64_t *missing, int64_t cap) {
    if (c->n_states + NEW_PER_EXPAND > c->capacity) return -1 - NO_ROOM;
    const int32_t *set = c->sets + c->set_start[i];
    int64_t n = c->set_len[i], n_edges = 0, n_missing = 0;
    for (int64_t k = 0; k < n; k++) n_edges += c->edge_count[c->rec_of[set[k]] - 1];
    c->listed_epoch = ++c->epoch;
    int ready = targets_ready(c, i, missing, &n_missing, cap);
    if (ready < 0) return -1 - NO_MEMORY;
    if (!ready) return -(16 + n_missing);
    /* the state's edges grouped by mask: a row depends only on which of the distinct masks
       hold each byte (a state's edges share few masks: the copies of a counted class) */
    if (grow((void **)&c->dm, &c->dm_cap, n_edges + 1, sizeof(mask_t)) ||
        grow((void **)&c->dm_head, &c->dm_head_cap, n_edges + 1, sizeof(int32_t)) ||
        grow((void **)&c->e_target, &c->e_target_cap, n_edges + 1, sizeof(int32_t)) ||
        grow((void **)&c->e_next, &c->e_next_cap, n_edges + 1, sizeof(int32_t)))
        return -1 - NO_MEMORY;
    int64_t n_dm = 0, ne = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = c->rec_of[set[k]] - 1;
        for (int32_t e = c->edge_start[r]; e < c->edge_start[r] + c->edge_count[r]; e++) {
            const mask_t *m = c->masks + e;
            int64_t d = n_dm - 1;  /* the same mask as the last edge's, most often */
            if (d < 0 || memcmp(c->dm + d, m, sizeof(mask_t)))
                for (d = 0; d < n_dm && memcmp(c->dm + d, m, sizeof(mask_t)); d++) {}
            if (d == n_dm) { c->dm[n_dm] = *m; c->dm_head[n_dm++] = -1; }
            c->e_target[ne] = c->targets[e];
            c->e_next[ne] = c->dm_head[d];
            c->dm_head[d] = (int32_t)ne++;
        }
    }
    int64_t words = (n_dm + 63) / 64;
    if (!words) words = 1;
    if (grow((void **)&c->fire, &c->fire_cap, 256 * words, sizeof(uint64_t)))
        return -1 - NO_MEMORY;
    uint64_t *fire = c->fire;  /* per byte: the distinct masks holding it */
    memset(fire, 0, (size_t)(256 * words) * sizeof(uint64_t));
    for (int64_t d = 0; d < n_dm; d++) {
        const mask_t *m = c->dm + d;
        uint64_t bit = 1ull << (d % 64);
        uint64_t *f = fire + d / 64;
        for (int w = 0; w < 4; w++) {
            uint64_t bits = m->w[w];
            if (__builtin_popcountll(bits) > 8) {  /* dense: every byte, no branch */
                for (int q = 0; q < 64; q++)
                    f[(w * 64 + q) * words] |= (0 - ((bits >> q) & 1)) & bit;
            } else {
                for (; bits; bits &= bits - 1)
                    f[(w * 64 + __builtin_ctzll(bits)) * words] |= bit;
            }
        }
    }
    /* each distinct set of masks: the union of its edges' targets' closures, numbered */
    int32_t row[256], first_of[256];
    int64_t n_distinct = 0, n_live = 0, only = -1, before = c->n_states, status = OK;
    for (int b = 0; b < 256 && status == OK; b++) {
        const uint64_t *f = fire + b * words;
        int any = 0;
        for (int64_t w = 0; w < words; w++) any |= f[w] != 0;
        if (!any) { row[b] = DEAD; continue; }
        n_live++; only = b;
        if (b > 0 && row[b - 1] != DEAD &&
            !memcmp(f - words, f, (size_t)words * sizeof(uint64_t))) {  /* a byte range */
            row[b] = row[b - 1];
            continue;
        }
        int64_t d = 0;
        if (words == 1) {
            while (d < n_distinct && fire[first_of[d]] != f[0]) d++;
        } else {
            while (d < n_distinct &&
                   memcmp(fire + first_of[d] * words, f, (size_t)words * sizeof(uint64_t)))
                d++;
        }
        if (d < n_distinct) { row[b] = row[first_of[d]]; continue; }
        first_of[n_distinct++] = b;
        uint32_t ep2 = ++c->epoch;
        int64_t len = 0, parts = 0;  /* closures that added states */
        for (int64_t w = 0; w < words && status == OK; w++)
            for (uint64_t bits = f[w]; bits && status == OK; bits &= bits - 1) {
                int64_t dd = w * 64 + __builtin_ctzll(bits);
                for (int32_t e = c->dm_head[dd]; e >= 0; e = c->e_next[e]) {
                    int64_t rt = c->rec_of[c->e_target[e]] - 1;
                    const int32_t *cl = c->clo + c->clo_start[rt];
                    int64_t added = len;
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
                    parts += len > added;
                }
            }
        if (status != OK) break;
        if (parts > 1) sort_i32(c->buf, len);  /* one closure: sorted already */
        int64_t j = intern(c, c->buf, len);
        if (j < 0) { status = -1 - j; break; }
        if (j >= before && j == c->n_states - 1) {  /* new: unexpanded, accepting if final */
            int acc = 0;
            for (int64_t q = 0; q < len; q++) acc |= c->buf[q] == c->final;
            c->accepting[j] = (uint8_t)acc;
            c->live[j] = c->forced[j] = -1;
            for (int q = 0; q < 256; q++) c->table[j * 256 + q] = UNEXPANDED;
        }
        row[b] = (int32_t)j;
    }
    if (status != OK) return -1 - status;
    memcpy(c->table + i * 256, row, sizeof(row));
    c->forced[i] = n_live == 1 && !c->accepting[i] ? (int32_t)only : -1;
    c->live[i] = (int32_t)n_live;  /* last: readers take a built row from live >= 0 */
    return c->n_states - before;
}

/* For the token trie walk (its `expand` hook): build state i's row now when everything it
   needs is here (0), else leave it to Python (-1: NFA states missing, no room, the budget). */
int64_t subset_inline(core_t *c, int64_t i) {
    if (i <= 0 || i >= c->n_states) return -1;
    if (c->live[i] >= 0) return 0;
    return subset_expand(c, i, 0, 0) >= 0 ? 0 : -1;
}

/* For a forced text's first visit: from state i, while the state allows exactly one byte,
   build its row when everything it needs is here and step through that byte; at most limit
   steps. The states stepped from go to states[0 .. n), the state reached to states[n], the
   bytes to bytes[0 .. n); returns n. It stops early (the caller goes on, state by state) at a
   state it cannot build now: NFA states missing, no room for another expansion, the budget. */
int64_t subset_forced_run(core_t *c, int64_t i, int64_t limit, int64_t *states,
                          uint8_t *bytes) {
    int64_t n = 0;
    while (n < limit && i > 0 && i < c->n_states) {
        if (c->live[i] < 0 && subset_expand(c, i, 0, 0) < 0) break;
        int32_t b = c->forced[i];
        if (b < 0) break;
        states[n] = i;
        bytes[n++] = (uint8_t)b;
        i = c->table[i * 256 + b];
    }
    states[n] = i;
    return n;
}

/* The NFA states the expansions of DFA states states[0 .. n) still lack (those already
   expanded skipped), into missing (room for cap, each once); how many (at most cap), or -1
   on out of memory. Python fills and hands them over, and asks again, until none is left:
   one round trip for many states' expansions. */
int64_t subset_missing(core_t *c, const int64_t *states, int64_t n, int64_t *missing,
                       int64_t cap) {
    int64_t n_missing = 0;
    c->listed_epoch = ++c->epoch;
    for (int64_t k = 0; k < n && n_missing < cap; k++) {
        int64_t i = states[k];
        if (i <= 0 || i >= c->n_states || c->live[i] >= 0) continue;
        if (targets_ready(c, i, missing, &n_missing, cap) < 0) return -1;
    }
    return n_missing;
}

/* An eager construction (fsm.nfa_to_dfa, every NFA state handed over first): expand DFA states
   *at, *at + 1, ... until every numbered state is expanded (0), or until one stops (its status,
   as `subset_expand`: no room, over budget, out of memory, missing states); *at is then the
   state that stopped, to be expanded again once the caller has answered. One call for the
   whole automaton, not one per state. */
int64_t subset_expand_all(core_t *c, int64_t *at, int64_t *missing, int64_t cap) {
    for (int64_t i = *at; i < c->n_states; i++) {
        int64_t r = subset_expand(c, i, missing, cap);
        if (r < 0) {
            *at = i;
            return r;
        }
    }
    *at = c->n_states;
    return 0;
}
