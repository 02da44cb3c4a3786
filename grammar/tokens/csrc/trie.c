/* The grammar's first-visit mask walk (native.py loads it): the vocabulary's token byte strings
   as a trie, walked depth first through a DFA's transition table. */

#include <stdint.h>

#define MAX_DEPTH 4096

/* one trie node, in preorder: its subtree is nodes [i, end); row: the token row ending here
   (-1: a prefix only); byte: the edge from its parent; depth: bytes from the root */
typedef struct { int32_t end; int32_t row; int32_t depth; int32_t byte; } node_t;

/* The trie of n distinct byte strings sorted lexicographically (string k: data[off[k] ..
   off[k + 1]], its row rows[k]) into nodes (room for cap); returns the node count, or -1. */
int64_t trie_build(const uint8_t *data, const int64_t *off, const int64_t *rows, int64_t n,
                   node_t *nodes, int64_t cap) {
    static __thread int32_t stack[MAX_DEPTH + 1];
    int64_t count = 1, top = 0, plen = 0;
    const uint8_t *prev = 0;
    nodes[0].end = 0; nodes[0].row = -1; nodes[0].depth = 0; nodes[0].byte = 0;
    stack[0] = 0;
    for (int64_t k = 0; k < n; k++) {
        const uint8_t *s = data + off[k];
        int64_t len = off[k + 1] - off[k], l = 0;
        if (len > MAX_DEPTH) return -1;
        while (l < len && l < plen && prev[l] == s[l]) l++;
        while (top > l) nodes[stack[top--]].end = (int32_t)count;  /* subtrees left behind */
        for (int64_t j = l; j < len; j++) {
            if (count >= cap) return -1;
            node_t *x = nodes + count;
            x->row = -1; x->depth = (int32_t)(j + 1); x->byte = s[j];
            stack[++top] = (int32_t)count++;
        }
        nodes[count - 1].row = (int32_t)rows[k];
        prev = s; plen = len;
    }
    while (top >= 0) nodes[stack[top--]].end = (int32_t)count;
    return count;
}

/* The walk's view of the trie (trie_compact builds it): per node, its subtree's end, depth and
   byte in 8 bytes (half a node_t: a pruned walk jumps over subtrees, and each node it lands on
   is a cache miss), and its token id in wid: the id of its row when the row has exactly one,
   -1 when it has none, -2 when several (read through row_start / row_ids). */
typedef struct { int32_t end; uint16_t depth; uint8_t byte; uint8_t pad; } wnode_t;

void trie_compact(const node_t *nodes, int64_t n, const int64_t *row_start,
                  const int64_t *row_ids, wnode_t *wn, int32_t *wid) {
    for (int64_t i = 0; i < n; i++) {
        int32_t row = nodes[i].row, id = -1;
        if (row >= 0)
            id = row_start[row + 1] - row_start[row] == 1 ? (int32_t)row_ids[row_start[row]] : -2;
        wn[i].end = nodes[i].end;
        wn[i].depth = (uint16_t)nodes[i].depth;
        wn[i].byte = (uint8_t)nodes[i].byte;
        wn[i].pad = 0;
        wid[i] = id;
    }
}

/* Walk each task (node a, state s) through the DFA: a = 0, the root's subtree from state s;
   else node a and its subtree, s the state before a's byte. A node reads
   table[parent_state * n_cls + class(byte)] (class: b2c[byte], or the byte itself when b2c
   is null); DEAD (0) prunes its subtree; a live node's token ids (row_ids[row_start[row] ..
   row_start[row + 1]]) get their bit set in words. first_ok (when not null) says which first
   bytes are walked at all. An entry not built (negative, or a state at or past n_rows) is
   first offered to `expand` (when not null: a lazy DFA's C subset construction,
   automata/csrc/subset.c's `subset_inline`, which builds the parent state's row in place and
   returns 0, or -1 when it cannot); one still not built is returned in pending as the task
   (node, parent state), its subtree skipped. node_ok (when not null) walks some of the tokens
   only: a node whose bit 1 is clear has none of them in its subtree (skipped), a node whose
   bit 2 is clear is not one of them (its ids not set). clear_first (when not null): in the
   root task (a = 0), every token whose first byte it marks has its id bit cleared first,
   walked or not (a mask borrowed from another state, its tokens of those first bytes
   dropped, then the walked ones set again). The nodes are read through trie_compact's wn and
   wid. Returns the pending tasks, or -1 when more than cap. */
typedef int64_t (*expand_fn)(void *core, int64_t state);

static void set_row(const node_t *nodes, int64_t i, const int64_t *row_start,
                    const int64_t *row_ids, uint32_t *words) {
    int32_t row = nodes[i].row;
    for (int64_t j = row_start[row]; j < row_start[row + 1]; j++)
        words[row_ids[j] >> 5] |= 1u << (row_ids[j] & 31);
}

int64_t trie_walk(const node_t *nodes, const wnode_t *wn, const int32_t *wid,
                  const int32_t *table, int64_t n_rows, int64_t n_cls, const int32_t *b2c,
                  const uint8_t *first_ok, const int64_t *row_start, const int64_t *row_ids,
                  const int64_t *tasks, int64_t n_tasks, uint32_t *words, int64_t *pending,
                  int64_t cap, expand_fn expand, void *core, const uint8_t *node_ok,
                  const uint8_t *clear_first) {
    int32_t st[MAX_DEPTH + 1];
    /* states `expand` could not build in this pass (it cannot later in the pass either: what
       it lacks comes from Python between passes): not asked again, as each of their trie
       children would (a failing expansion redoes its epsilon closures: ~ms for a large one) */
    int32_t failed[256];
    for (int k = 0; k < 256; k++) failed[k] = -1;
    int64_t np = 0;
    for (int64_t t = 0; t < n_tasks; t++) {
        int64_t a = tasks[2 * t], i = a ? a : 1, stop = wn[a].end;
        st[a ? wn[a].depth - 1 : 0] = (int32_t)tasks[2 * t + 1];
        while (i < stop) {
            const wnode_t *x = wn + i;
            int32_t d = x->depth, par = st[d - 1];
            if (d == 1 && clear_first && !a && clear_first[x->byte])
                for (int64_t k = i; k < x->end; k++) {
                    int32_t id = wid[k];
                    if (id >= 0) {
                        words[id >> 5] &= ~(1u << (id & 31));
                        continue;
                    }
                    if (id == -1) continue;
                    for (int64_t j = row_start[nodes[k].row]; j < row_start[nodes[k].row + 1];
                         j++)
                        words[row_ids[j] >> 5] &= ~(1u << (row_ids[j] & 31));
                }
            if (d == 1 && first_ok && !first_ok[x->byte]) { i = x->end; continue; }
            if (node_ok && !(node_ok[i] & 1)) { i = x->end; continue; }
            int32_t nx = -1;
            int64_t at = (int64_t)par * n_cls + (b2c ? b2c[x->byte] : x->byte);
            if (par < n_rows) nx = table[at];
            if (nx < 0 && expand && par < n_rows) {
                int32_t *slot = failed + ((uint32_t)par * 2654435761u >> 24);
                if (*slot != par) {
                    if (expand(core, par) == 0) nx = table[at];
                    else *slot = par;
                }
            }
            if (nx < 0) {  /* the entry is not built: this subtree waits */
                if (np >= cap) return -1;
                pending[2 * np] = i;
                pending[2 * np + 1] = par;
                np++;
                i = x->end;
                continue;
            }
            if (nx == 0) { i = x->end; continue; }
            int32_t id = wid[i];
            if (id != -1 && (!node_ok || node_ok[i] & 2)) {
                if (id >= 0) words[id >> 5] |= 1u << (id & 31);
                else set_row(nodes, i, row_start, row_ids, words);
            }
            st[d] = nx;
            i++;
        }
    }
    return np;
}

/* The child of node i (at depth d) for byte c, or -1. jumps (int32): the root's children by
   byte ([0, 256)), the depth-2 nodes by their two bytes ([256 + (b0 << 8 | b1)]); deeper
   children are found along their siblings (sorted by byte). */
static inline int64_t child(const node_t *nodes, const int32_t *jumps, int64_t i, int64_t d,
                            const uint8_t *s) {
    if (d == 0) return jumps[s[0]];
    if (d == 1) return jumps[256 + ((int64_t)s[0] << 8 | s[1])];
    int64_t j = i + 1, stop = nodes[i].end;  /* i's children: j, nodes[j].end, ... */
    while (j < stop && nodes[j].byte < s[d]) j = nodes[j].end;
    return j < stop && nodes[j].byte == s[d] ? j : -1;
}

/* Walk the n bytes of s down the trie from the root (jumps: see child). Returns -1 when all
   of s is read and the node reached has children (a token longer than s starts with it); else
   the bytes read, L (the longest prefix of s that begins some token). With words (not null)
   and L >= 0, the ids of every token that is a non-empty prefix of s (the nodes on the way)
   get their bit. */
int64_t trie_prefix(const node_t *nodes, const int32_t *jumps, const uint8_t *s, int64_t n,
                    const int64_t *row_start, const int64_t *row_ids, uint32_t *words) {
    int64_t i = 0, d = 0;
    for (; d < n; d++) {
        int64_t j = child(nodes, jumps, i, d, s);
        if (j < 0) break;
        i = j;
        if (words && nodes[i].row >= 0)
            for (int64_t r = row_start[nodes[i].row]; r < row_start[nodes[i].row + 1]; r++)
                words[row_ids[r] >> 5] |= 1u << (row_ids[r] & 31);
    }
    if (d == n && nodes[i].end > i + 1) return -1;
    return d;
}

/* trie_prefix (without words) of s[j .. min(len, j + limit)) for each j < n, into out[j]. */
void trie_prefixes(const node_t *nodes, const int32_t *jumps, const uint8_t *s, int64_t len,
                   int64_t n, int64_t limit, int64_t *out) {
    for (int64_t j = 0; j < n; j++) {
        int64_t m = len - j < limit ? len - j : limit;
        out[j] = trie_prefix(nodes, jumps, s + j, m, 0, 0, 0);
    }
}
