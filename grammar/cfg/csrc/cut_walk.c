/* Context-free first-visit walks (grammar/cfg/native_walk.py loads this): the vocabulary's
   token trie (grammar/tokens/csrc/trie.c's node_t, preorder) walked depth first through one
   terminal's, or one lexer's, byte table (int32 [states, 256], 0 = dead), splitting the tokens
   into those that end inside the terminal (their id bits set) and the trie nodes where a
   terminal boundary cuts them (the rest of each such token is walked later, from the next
   terminal's start, as a task of its own).

   A task is a pair (a, s): a >= 0 walks node a and its subtree, s the state before a's byte;
   a < 0 walks the strict descendants of node ~a, s the state after its byte (~0 = -1: every
   token from state s). */

#include <stdint.h>

#define MAX_DEPTH 4096

typedef struct { int32_t end; int32_t row; int32_t depth; int32_t byte; } node_t;

static inline void set_ids(uint32_t *words, const node_t *x, const int64_t *row_start,
                           const int64_t *row_ids) {
    for (int64_t j = row_start[x->row]; j < row_start[x->row + 1]; j++) {
        int64_t id = row_ids[j];
        words[id >> 5] |= 1u << (id & 31);
    }
}

/* The task's first node, its end, and the depth of its first level; st[first depth - 1] = s. */
static inline int64_t task_start(const node_t *nodes, int64_t a, int64_t s, int32_t *st,
                                 int64_t *stop, int32_t *first_depth) {
    if (a >= 0) {
        *stop = nodes[a].end;
        *first_depth = nodes[a].depth;
        st[nodes[a].depth - 1] = (int32_t)s;
        return a;
    }
    a = ~a;
    *stop = nodes[a].end;
    *first_depth = nodes[a].depth + 1;
    st[nodes[a].depth] = (int32_t)s;
    return a + 1;
}

/* A set of bytes as 3 x 64 bits: ASCII exactly, the bytes from 128 folded (b & 63). */
#define SIG_WORDS 3
static inline int sig_bit(int b) { return b < 128 ? b : 128 + (b & 63); }

/* The bytes a state reads without dying, as a signature: with `child_sig` it rules out, in one
   test, the nodes none of whose children the state can read. */
static inline void state_sig(const int32_t *table, int64_t s, uint64_t *sig) {
    sig[0] = sig[1] = sig[2] = 0;
    for (int b = 0; b < 256; b++)
        if (table[s * 256 + b]) sig[sig_bit(b) >> 6] |= 1ull << (sig_bit(b) & 63);
}

/* child_sig[3 i ..]: the bytes of node i's children as a signature; desc_sig: the bytes of all
   the nodes strictly below i (one pass each, per trie; desc_sigs after child_sigs). */
void child_sigs(const node_t *nodes, int64_t n, uint64_t *sig) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t *x = sig + SIG_WORDS * i;
        x[0] = x[1] = x[2] = 0;
        for (int64_t j = i + 1; j < nodes[i].end; j = nodes[j].end) {
            int k = sig_bit(nodes[j].byte);
            x[k >> 6] |= 1ull << (k & 63);
        }
    }
}

void desc_sigs(const node_t *nodes, int64_t n, const uint64_t *child_sig, uint64_t *desc) {
    for (int64_t i = n - 1; i >= 0; i--) {
        uint64_t *x = desc + SIG_WORDS * i;
        for (int w = 0; w < SIG_WORDS; w++) x[w] = child_sig[SIG_WORDS * i + w];
        for (int64_t j = i + 1; j < nodes[i].end; j = nodes[j].end)
            for (int w = 0; w < SIG_WORDS; w++) x[w] |= desc[SIG_WORDS * j + w];
    }
}

/* GBNF terminals (grammar/ebnf/compiler.py's decompose): a token whose bytes all survive the
   table ends inside the terminal (bit set in words, *n_inside counted); at a node with
   descendants whose state accepts, the terminal may complete there: the node goes to cuts as a
   descendants task (its ~index), and the walk goes on below it while the state is live.

   Loop sets: `clean` (when not null) marks the subtrees that stay in a set S of live states, all
   accepting or none (mode & SET_ACCEPTS says which), see loop_states below: in_set[state] is the
   state's index in S (-1: not in S), clean[i] bit k says node i's byte read from S's state k,
   and every path of its subtree, stays in S. Such a subtree is not walked node by node: its
   tokens all end inside (their bits set from the node range, or, with mode & SKIP_FROM_START
   while the path from the task's start stayed in S, not at all: the caller has the mask of the
   tokens that stay in S from S's first state, loop_states' words), and when S accepts, every
   node of it with descendants is a cut: the subtree goes to cuts as one region (its index,
   >= 0). pre_ids: every node's token ids in preorder, node i's from pre_start[i] (a subtree's
   ids are pre_ids[pre_start[i] : pre_start[end]]). n_inside[0]: the tokens that end inside;
   n_inside[1]: the words of `words` the walk set (zero before), the first touch_cap of them
   listed in `touched`.

   The tasks: every entry of `starts` from one state: ~i (i = 0: every token) walks the
   descendants of node i, a region i >= 0 the descendants of each node of the region that has
   some (none when no byte below node i is one the state reads: desc_sig). Returns the number
   of cuts, or -1 when more than cap. */
#define SKIP_FROM_START 1
#define SET_ACCEPTS 2

typedef struct {
    const node_t *nodes;
    const int64_t *row_start, *row_ids;
    const int32_t *table;
    const uint8_t *accepting, *live, *clean;
    const int8_t *in_set;
    int64_t mode;
    const uint64_t *child_sig, *desc_sig;
    const int64_t *pre_start;
    const int32_t *pre_ids;
    uint32_t *words;
    int32_t *cuts, *touched;
    int64_t cap, nc, inside, sig_state, n_touched, touch_cap;
    uint64_t sig[SIG_WORDS];
} walk_t;

/* Set token id's bit; the first bit set in a word records the word in `touched` (while there is
   room; n_touched counts on past it): a walk that sets few words hands back just those. */
static inline void walk_set(walk_t *w, int64_t id) {
    uint32_t *word = w->words + (id >> 5);
    if (!*word) {
        if (w->n_touched < w->touch_cap) w->touched[w->n_touched] = (int32_t)(id >> 5);
        w->n_touched++;
    }
    *word |= 1u << (id & 31);
}

static inline void walk_set_node(walk_t *w, const node_t *x) {
    for (int64_t j = w->row_start[x->row]; j < w->row_start[x->row + 1]; j++)
        walk_set(w, w->row_ids[j]);
    w->inside++;
}

/* Some byte of signature c is one state s reads. */
static inline int sig_meets(walk_t *w, const uint64_t *c, int64_t s) {
    if (s != w->sig_state) {
        w->sig_state = s;
        state_sig(w->table, s, w->sig);
    }
    return ((c[0] & w->sig[0]) | (c[1] & w->sig[1]) | (c[2] & w->sig[2])) != 0;
}

static int walk_task(walk_t *w, int64_t a, int64_t s) {
    const node_t *nodes = w->nodes;
    int32_t st[MAX_DEPTH + 1];
    uint8_t outside[MAX_DEPTH + 1];  /* the path left S above (or at) this depth */
    if (a < 0 && !sig_meets(w, w->child_sig + SIG_WORDS * ~a, s)) return 0;
    int64_t stop;
    int32_t d0;
    int64_t i = task_start(nodes, a, s, st, &stop, &d0);
    outside[d0 - 1] = 0;
    while (i < stop) {
        const node_t *x = nodes + i;
        int32_t d = x->depth, par = st[d - 1];
        if (w->clean && w->in_set[par] >= 0 && ((w->clean[i] >> w->in_set[par]) & 1)) {
            if (!(w->mode & SKIP_FROM_START) || outside[d - 1]) {
                /* the subtree's token ids, contiguous in preorder */
                const int32_t *id = w->pre_ids + w->pre_start[i];
                const int32_t *id_end = w->pre_ids + w->pre_start[x->end];
                w->inside += id_end - id;
                for (; id < id_end; id++) walk_set(w, *id);
            }
            if ((w->mode & SET_ACCEPTS) && x->end != i + 1) {
                if (w->nc >= w->cap) return -1;
                w->cuts[w->nc++] = (int32_t)i;
            }
            i = x->end;
            continue;
        }
        int32_t nx = w->table[(int64_t)par * 256 + x->byte];
        if (nx == 0) { i = x->end; continue; }
        if (w->clean) outside[d] = outside[d - 1] | (w->in_set[nx] < 0);
        if (x->row >= 0) walk_set_node(w, x);
        if (x->end == i + 1) { i++; continue; }  /* a leaf */
        if (w->accepting[nx]) {
            if (w->nc >= w->cap) return -1;
            w->cuts[w->nc++] = (int32_t)~i;
        }
        if (!w->live[nx]) { i = x->end; continue; }
        st[d] = nx;
        i++;
    }
    return 0;
}

int64_t walk_terminal(const node_t *nodes, const int64_t *row_start, const int64_t *row_ids,
                      const int32_t *table, const uint8_t *accepting, const uint8_t *live,
                      const int32_t *starts, int64_t n_starts, int64_t s,
                      const uint8_t *clean, const int8_t *in_set, int64_t mode,
                      const uint64_t *child_sig,
                      const uint64_t *desc_sig, const int64_t *pre_start,
                      const int32_t *pre_ids, uint32_t *words, int64_t *n_inside,
                      int32_t *touched, int64_t touch_cap, int32_t *cuts, int64_t cap) {
    walk_t w = {nodes, row_start, row_ids, table, accepting, live, clean, in_set, mode,
                child_sig, desc_sig, pre_start, pre_ids, words, cuts, touched, cap, 0, 0, -1, 0,
                touch_cap, {0, 0, 0}};
    for (int64_t t = 0; t < n_starts; t++) {
        int64_t a = starts[t];
        if (a < 0) {
            if (walk_task(&w, a, s) < 0) return -1;
            continue;
        }
        if (!sig_meets(&w, desc_sig + SIG_WORDS * a, s)) continue;
        for (int64_t j = a; j < nodes[a].end; j++)
            if (nodes[j].end != j + 1 && walk_task(&w, ~j, s) < 0) return -1;
    }
    n_inside[0] = w.inside;
    n_inside[1] = w.n_touched;
    return w.nc;
}

/* A lark context's lexer (grammar/cfg/mask.py's decompose): maximal munch. A byte the lexer
   state cannot continue with cuts the token there when the text so far is a terminal
   (winner[state] >= 0): the node (with its subtree) goes to cuts, the terminal to cut_terms;
   otherwise the token is refused. A dead byte on a task's first level is neither (the caller
   handles tokens whose first byte is a cut). A token that ends in a live state sets its bit in
   words[group[state] * n_words ...] and marks used[group]. Returns the number of cuts, or -1
   when more than cap. */
int64_t walk_lexer(const node_t *nodes, const int64_t *row_start, const int64_t *row_ids,
                   const int32_t *table, const int32_t *winner, const int32_t *group,
                   const int64_t *tasks, int64_t n_tasks, uint32_t *words, int64_t n_words,
                   uint8_t *used, int32_t *cuts, int32_t *cut_terms, int64_t cap) {
    int32_t st[MAX_DEPTH + 1];
    int64_t nc = 0;
    for (int64_t t = 0; t < n_tasks; t++) {
        int64_t stop;
        int32_t d0;
        int64_t i = task_start(nodes, tasks[2 * t], tasks[2 * t + 1], st, &stop, &d0);
        while (i < stop) {
            const node_t *x = nodes + i;
            int32_t d = x->depth, par = st[d - 1];
            int32_t nx = table[(int64_t)par * 256 + x->byte];
            if (nx == 0) {
                if (d > d0 && winner[par] >= 0) {
                    if (nc >= cap) return -1;
                    cuts[nc] = (int32_t)i;
                    cut_terms[nc++] = winner[par];
                }
                i = x->end;
                continue;
            }
            if (x->row >= 0) {
                int32_t g = group[nx];
                set_ids(words + (int64_t)g * n_words, x, row_start, row_ids);
                used[g] = 1;
            }
            st[d] = nx;
            i++;
        }
    }
    return nc;
}

/* A set S of at most 8 non-accepting live states of a terminal (the string states a JSON string
   loops through, its UTF-8 and escape states included), as sub (int8 [n_sub, 256]: the S index a
   byte leads to from each of S's states, -1 when it leaves S): the tokens whose whole path from
   S's state 0 stays in S end inside the terminal (their id bits set in words); clean[i] bit k
   = 1 when node i's byte read from S's state k, and every path of i's subtree after it, stays in
   S (the root, with no byte, gets 0), as walk_terminal reads it. */
void loop_states(const node_t *nodes, int64_t n, const int64_t *row_start,
                 const int64_t *row_ids, const int8_t *sub, int64_t n_sub, uint32_t *words,
                 uint8_t *clean) {
    int8_t at[MAX_DEPTH + 1];
    at[0] = 0;
    for (int64_t i = 1; i < n;) {
        const node_t *x = nodes + i;
        int8_t to = sub[at[x->depth - 1] * 256 + x->byte];
        if (to < 0) { i = x->end; continue; }  /* the subtree left S */
        at[x->depth] = to;
        if (x->row >= 0) set_ids(words, x, row_start, row_ids);
        i++;
    }
    /* clean bit k of a node = bit to_k of `below` (to_k: where its byte leads from S's state
       k): per byte, the bits of `below` mapped to clean bits through two nibble tables */
    uint8_t lo[256][16], hi[256][16];
    for (int b = 0; b < 256; b++) {
        uint8_t from[8] = {0};  /* from[j]: the S states the byte leads to S's state j from */
        for (int64_t k = 0; k < n_sub; k++)
            if (sub[k * 256 + b] >= 0) from[sub[k * 256 + b]] |= (uint8_t)(1u << k);
        for (int v = 0; v < 16; v++) {
            lo[b][v] = hi[b][v] = 0;
            for (int j = 0; j < 4; j++)
                if ((v >> j) & 1) {
                    lo[b][v] |= from[j];
                    hi[b][v] |= from[j + 4];
                }
        }
    }
    /* reverse preorder: a node's children come just before it; ok[d] gathers the AND of the
       clean bits of the children of the depth-d node visited next (reset once it is read) */
    uint8_t ok[MAX_DEPTH + 2];
    for (int d = 0; d <= MAX_DEPTH + 1; d++) ok[d] = 0xff;
    for (int64_t i = n - 1; i >= 1; i--) {
        int32_t d = nodes[i].depth, b = nodes[i].byte;
        uint8_t below = ok[d];
        ok[d] = 0xff;
        uint8_t c = lo[b][below & 15] | hi[b][below >> 4];
        clean[i] = c;
        ok[d - 1] &= c;
    }
    clean[0] = 0;
}
