/* A small spinning thread pool, a static copy in each library that includes it: the one-row
   projections' (gemv.c) and the quantized kernels' (quant.c).

   Why not OpenMP: libgomp gives every thread that opens a parallel region a team of its own, and
   once more threads are managed than there are CPUs (the main thread's team, from loading the
   model, plus the scheduler thread's, which runs the forward) its workers stop spinning between
   regions and sleep: each region then pays a futex wake-up. Measured on this 2-core machine, a
   region opened from a second thread costs ~35 us against ~7 us from the main thread, and a
   batch-1 bf16 step (~120 regions) took 9-10 ms instead of 6.5.

   This pool's workers spin on a generation counter for up to `SPIN_NS` after each job (a decode
   step's jobs come every few tens of microseconds), then sleep on a condition variable; the
   caller does part 0 itself and spins until the workers are done. One caller at a time: another
   thread arriving meanwhile runs its job alone, so two engines in one process never wait on each
   other. A forked child starts with no workers (they are started again on first use). The
   thread count follows torch's (`omp_get_max_threads` of the calling thread, which
   `torch.set_num_threads` sets), capped at `POOL_MAX`. */

#ifndef POOL_H
#define POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define POOL_MAX 64
#define SPIN_NS 2000000 /* how long an idle worker spins (ns) before it sleeps */

typedef void (*pool_fn)(void *args, int part, int parts);
typedef void (*pool_runner_fn)(pool_fn fn, void *args, int parts); /* a pool_run */

static struct {
    pthread_mutex_t busy;  /* held by the one caller whose job runs */
    pthread_mutex_t mu;    /* guards sleeping */
    pthread_cond_t wake;
    atomic_ulong gen;      /* bumped once per job */
    atomic_int done;       /* workers finished with the current job */
    atomic_int sleepers;
    int workers;           /* started, all waiting for the next generation */
    unsigned long birth;   /* the generation a worker starts after (set before creating it) */
    pool_fn fn;
    void *args;
    int parts;
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static inline void pool_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t pool_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void *pool_worker(void *arg) {
    int id = (int)(intptr_t)arg; /* 1 .. workers; the caller is part 0 */
    unsigned long seen = pool.birth; /* read after pthread_create: it may start late */
    for (;;) {
        unsigned long g;
        int64_t since = pool_now();
        for (unsigned n = 1; (g = atomic_load(&pool.gen)) == seen; n++) {
            pool_relax();
            if (n % 256 == 0 && pool_now() - since > SPIN_NS) {
                pthread_mutex_lock(&pool.mu);
                atomic_fetch_add(&pool.sleepers, 1);
                while (atomic_load(&pool.gen) == seen) pthread_cond_wait(&pool.wake, &pool.mu);
                atomic_fetch_sub(&pool.sleepers, 1);
                pthread_mutex_unlock(&pool.mu);
            }
        }
        seen = g;
        if (id < pool.parts) pool.fn(pool.args, id, pool.parts);
        atomic_fetch_add(&pool.done, 1);
    }
    return NULL;
}

/* in a forked child the workers are gone (only the forking thread survives) */
static void pool_after_fork(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    pool.busy = fresh;
    pool.mu = fresh;
    pool.wake = cond;
    pool.workers = 0;
    atomic_store(&pool.sleepers, 0);
}

static void pool_init(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

static int pool_threads(void) {
#ifdef _OPENMP
    int n = omp_get_max_threads();
    return n < 1 ? 1 : (n > POOL_MAX ? POOL_MAX : n);
#else
    return 1;
#endif
}

/* fn(args, part, parts) for every part in [0, parts), over up to `parts` threads */
static void pool_run(pool_fn fn, void *args, int parts) {
    if (parts <= 1 || pthread_mutex_trylock(&pool.busy) != 0) {
        for (int i = 0; i < parts; i++) fn(args, i, parts);
        return;
    }
    pthread_once(&pool_once, pool_init);
    pool.birth = atomic_load(&pool.gen);
    while (pool.workers < parts - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, pool_worker, (void *)(intptr_t)(pool.workers + 1));
        pthread_attr_destroy(&attr);
        if (failed) break;
        pool.workers++;
    }
    int used = parts < pool.workers + 1 ? parts : pool.workers + 1;
    pool.fn = fn;
    pool.args = args;
    pool.parts = used;
    atomic_store(&pool.done, 0);
    atomic_fetch_add(&pool.gen, 1);
    if (atomic_load(&pool.sleepers)) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.mu);
    }
    fn(args, 0, used);
    while (atomic_load(&pool.done) < pool.workers) pool_relax();
    pthread_mutex_unlock(&pool.busy);
}

#endif
