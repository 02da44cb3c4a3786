/* Product constructions over byte DFAs (dfa_ops.py's `product` and `split_regions`, loaded by
   native_dfa.py): a breadth-first walk over vectors of component states, one component per
   automaton, numbered in the order first met, as dfa_ops' Python walk numbers them. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DEAD 0

static uint64_t hash_vec(const int32_t *s, int64_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint32_t)s[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

/* The product of n automata: component i reads class gcls[i * n_groups + g] of its table
   tables[i] (int32, n_cls[i] columns) for byte group g; a component that dies kills the
   product state when required[i], else it stays dead (its state DEAD) while the others go on.
   Row 0 of rows (room for cap rows of n_groups) is the dead state, row 1 the start vector
   `start`; each row's component states go to states (room for cap rows of n). Returns the
   rows written, -1 when more than cap are needed (the budget), -2 on out of memory. */
int64_t product_explore(int64_t n, const int64_t *tables, const int64_t *n_cls,
                        const int32_t *gcls, int64_t n_groups, const uint8_t *required,
                        const int32_t *start, int32_t *rows, int32_t *states, int64_t cap) {
    if (cap < 2) return -1;
    int64_t slots_cap = 1024, count = 2;
    int32_t *slots = calloc((size_t)slots_cap, sizeof(int32_t));  /* row + 1, 0: empty */
    uint64_t *hashes = malloc((size_t)cap * sizeof(uint64_t));
    int32_t *nxt = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!slots || !hashes || !nxt) { free(slots); free(hashes); free(nxt); return -2; }
    memset(rows, 0, (size_t)n_groups * sizeof(int32_t));
    memset(states, 0, (size_t)n * sizeof(int32_t));
    memcpy(states + n, start, (size_t)n * sizeof(int32_t));
    hashes[1] = hash_vec(start, n);
    slots[hashes[1] & (uint64_t)(slots_cap - 1)] = 2;
    int64_t status = 0;
    for (int64_t r = 1; r < count && !status; r++) {
        int32_t *row = rows + r * n_groups;
        for (int64_t g = 0; g < n_groups; g++) {
            const int32_t *cur = states + r * n;
            int dead = 0;
            for (int64_t i = 0; i < n; i++) {
                int32_t s = cur[i], t = DEAD;
                if (s != DEAD) {
                    const int32_t *tab = (const int32_t *)(intptr_t)tables[i];
                    t = tab[(int64_t)s * n_cls[i] + gcls[i * n_groups + g]];
                }
                if (t == DEAD && required[i]) { dead = 1; break; }
                nxt[i] = t;
            }
            if (dead) { row[g] = DEAD; continue; }
            uint64_t h = hash_vec(nxt, n);
            int64_t at = (int64_t)(h & (uint64_t)(slots_cap - 1)), j = -1;
            for (;; at = (at + 1) & (slots_cap - 1)) {
                int32_t k = slots[at];
                if (!k) break;
                k--;
                if (hashes[k] == h && !memcmp(states + (int64_t)k * n, nxt, (size_t)n * 4)) {
                    j = k;
                    break;
                }
            }
            if (j < 0) {
                if (count >= cap) { status = -1; break; }
                j = count++;
                memcpy(states + j * n, nxt, (size_t)n * sizeof(int32_t));
                hashes[j] = h;
                slots[at] = (int32_t)(j + 1);
                if (2 * count > slots_cap) {  /* rehash at half full */
                    int64_t nc = slots_cap * 2;
                    int32_t *ns = calloc((size_t)nc, sizeof(int32_t));
                    if (!ns) { status = -2; break; }
                    for (int64_t q = 1; q < count; q++) {
                        int64_t p = (int64_t)(hashes[q] & (uint64_t)(nc - 1));
                        while (ns[p]) p = (p + 1) & (nc - 1);
                        ns[p] = (int32_t)(q + 1);
                    }
                    free(slots);
                    slots = ns; slots_cap = nc;
                }
            }
            row[g] = (int32_t)j;
        }
    }
    free(slots); free(hashes); free(nxt);
    return status ? status : count;
}

/* The states of a DFA that can reach an accepting state (fsm's dead-end pruning): table int32
   [n, k] (targets DEAD = 0, or another row), accepting one byte per state; live[s] set to 1
   for each such state s (DEAD never). A walk back from the accepting states over the table's
   edges by target (a counting sort of the edges, O(n k)). Returns 0, or -2 on out of memory. */
int64_t live_states(const int32_t *table, int64_t n, int64_t k, const uint8_t *accepting,
                    uint8_t *live) {
    if (n <= 0 || k < 0) return 0;
    int64_t *start = calloc((size_t)n + 2, sizeof(int64_t));
    int32_t *stack = malloc((size_t)n * sizeof(int32_t));
    if (!start || !stack) { free(start); free(stack); return -2; }
    for (int64_t i = 0; i < n * k; i++)
        if (table[i] > DEAD && table[i] < n) start[table[i] + 2]++;
    for (int64_t t = 0; t < n; t++) start[t + 2] += start[t + 1];
    int64_t n_edges = start[n + 1];
    int32_t *src = malloc((size_t)(n_edges ? n_edges : 1) * sizeof(int32_t));
    if (!src) { free(start); free(stack); return -2; }
    for (int64_t s = 0; s < n; s++)  /* sources of target t: src[start[t] .. start[t + 1]) */
        for (int64_t c = 0; c < k; c++) {
            int32_t t = table[s * k + c];
            if (t > DEAD && t < n) src[start[t + 1]++] = (int32_t)s;
        }
    int64_t top = 0;
    memset(live, 0, (size_t)n);
    for (int64_t s = 1; s < n; s++)
        if (accepting[s]) { live[s] = 1; stack[top++] = (int32_t)s; }
    while (top) {
        int32_t t = stack[--top];
        for (int64_t e = start[t]; e < start[t + 1]; e++)
            if (!live[src[e]]) { live[src[e]] = 1; stack[top++] = src[e]; }
    }
    free(start); free(stack); free(src);
    return 0;
}
