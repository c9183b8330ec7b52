/* The pool allocator (Note [C core files], Note [Pool allocator]). */
#include <stdint.h>

#include "core.h"

/* ------------------------------------------------------------------ pool allocator */

/*
 * Note [Pool allocator]: the "allocator" layer (lamina.memory) is a NumPy memory
 * handler (NEP 49, PyDataMem_SetHandler), so every array NumPy allocates -- kernel
 * outputs, im2col buffers, BLAS results -- goes through it. A request of at least
 * `threshold` bytes is rounded up to a size class (four per octave, so at most 19%
 * more than asked) and, when the array dies, its block waits on its class's free list
 * for the next request of that class instead of going back to the C library: a
 * training step's buffers then stop costing page faults. The cached bytes never exceed
 * `limit`: a block that would go beyond it is returned at once, and empty_cache()
 * returns them all. A pooled block's data is 64-byte aligned (POOL_ALIGN, as PyTorch's
 * CPU allocator aligns: no AVX-512 load of a row's start straddles two cache lines).
 * Smaller requests go to NumPy's default allocator, as before (it caches blocks under
 * 1 KiB itself). Every block carries a header saying which class
 * it is (or that it is not pooled), because an array made while the pool was on may
 * die after it was switched off, and NumPy then still calls this handler's free. The
 * lists and counters are guarded by their own lock: NumPy may allocate and free
 * without the GIL.
 *
 * The threshold (128 KiB) is glibc's initial mmap threshold, and should not be higher.
 * glibc maps every request from 128 KiB up and unmaps it on free (a page fault per
 * page on the next use), but each block it unmaps raises that threshold to the block's
 * size (up to 32 MiB) and the heap's trim threshold to twice it, so after a few steps
 * it serves such blocks from a heap it keeps: without the pool, a training step whose
 * arrays are under 32 MiB can run with no faults at all. The pool keeps its blocks, so
 * glibc's thresholds stop at the largest block it still frees itself. With a 1 MiB
 * threshold that was under 1 MiB (2 MiB of trim), while the heap of 128 KiB - 1 MiB
 * arrays swung by more each step: its top was given back (brk) and faulted in again,
 * ~3,000 minor faults per AlexNet step (batch 32) with every pool request a hit. From
 * 128 KiB, what glibc keeps is small arrays, whose churn its heap absorbs: no
 * brk, no faults (measured on the three convnets, batch 1 to 32, 1 and 2 threads).
 */

#define POOL_HEADER 64      /* keeps a plain block's data 16-byte aligned, as malloc's */
#define POOL_ALIGN 64       /* a pooled block's data: a cache line, an AVX-512 vector */
#define POOL_CLASSES 256    /* four per octave of a 64-bit size */

typedef struct PoolBlock {
    size_t capacity;           /* 0: not pooled (plain malloc) */
    size_t size;               /* a plain block's size (what realloc may copy) */
    int size_class;
    struct PoolBlock *next;    /* on a free list */
    void *memory;              /* a pooled block's allocation (what free takes) */
} PoolBlock;
_Static_assert(sizeof(PoolBlock) <= POOL_HEADER && POOL_HEADER % POOL_ALIGN == 0,
               "the header fits before the data and keeps it aligned");

static PoolBlock *pool_free[POOL_CLASSES];
static PyThread_type_lock pool_lock;
static size_t pool_threshold = (size_t)1 << 17;  /* Note [Pool allocator] */
static size_t pool_limit = (size_t)1 << 30;
static struct {
    unsigned long long allocations, hits, returned;
    size_t bytes_cached, blocks_cached, bytes_in_use, peak_in_use;
} pool_stats;

/* the class of a request of `size` bytes and that class's capacity */
static int pool_class(size_t size, size_t *capacity) {
    int octave = 63 - __builtin_clzll((unsigned long long)size);
    size_t base = (size_t)1 << octave, quarter = base >> 2;
    int step = quarter ? (int)((size - base + quarter - 1) / quarter) : 0;  /* 0..4 */
    *capacity = base + (size_t)step * quarter;
    return octave * 4 + step;  /* step 4 is the next octave's step 0: same capacity */
}

static void *pool_block_data(PoolBlock *b) { return (char *)b + POOL_HEADER; }
static PoolBlock *pool_block_of(void *p) { return (PoolBlock *)((char *)p - POOL_HEADER); }

/* NumPy's default allocator, which small requests keep: it caches small blocks itself */
static PyDataMemAllocator *numpy_allocator;

static void *pool_plain(size_t size, int zero) {
    void *ctx = numpy_allocator->ctx;
    PoolBlock *b = zero ? numpy_allocator->calloc(ctx, 1, size + POOL_HEADER)
                        : numpy_allocator->malloc(ctx, size + POOL_HEADER);
    if (b == NULL) return NULL;
    b->capacity = 0;
    b->size = size;
    return pool_block_data(b);
}

static void *pool_get(size_t size, int zero) {
    if (size < pool_threshold) return pool_plain(size, zero);
    size_t capacity;
    int c = pool_class(size, &capacity);
    if (c >= POOL_CLASSES) return NULL;
    PyThread_acquire_lock(pool_lock, WAIT_LOCK);
    PoolBlock *b = pool_free[c];
    pool_stats.allocations++;
    if (b != NULL) {
        pool_free[c] = b->next;
        pool_stats.hits++;
        pool_stats.bytes_cached -= capacity;
        pool_stats.blocks_cached--;
    }
    pool_stats.bytes_in_use += capacity;
    if (pool_stats.bytes_in_use > pool_stats.peak_in_use)
        pool_stats.peak_in_use = pool_stats.bytes_in_use;
    PyThread_release_lock(pool_lock);
    if (b != NULL) {
        if (zero) memset(pool_block_data(b), 0, size);
    } else {
        size_t bytes = capacity + POOL_HEADER + POOL_ALIGN;
        void *memory = zero ? calloc(1, bytes) : malloc(bytes);
        b = memory ? (PoolBlock *)(((uintptr_t)memory + POOL_ALIGN - 1) & -(uintptr_t)POOL_ALIGN) : NULL;
        if (b == NULL) {
            PyThread_acquire_lock(pool_lock, WAIT_LOCK);
            pool_stats.bytes_in_use -= capacity;
            PyThread_release_lock(pool_lock);
            return NULL;
        }
        b->capacity = capacity;
        b->size_class = c;
        b->memory = memory;
    }
    return pool_block_data(b);
}

static void pool_put(void *ctx, void *p, size_t size) {
    (void)ctx; (void)size;
    if (p == NULL) return;
    PoolBlock *b = pool_block_of(p);
    if (b->capacity == 0) {
        numpy_allocator->free(numpy_allocator->ctx, b, b->size + POOL_HEADER);
        return;
    }
    PyThread_acquire_lock(pool_lock, WAIT_LOCK);
    pool_stats.bytes_in_use -= b->capacity;
    int keep = pool_stats.bytes_cached + b->capacity <= pool_limit;
    if (keep) {
        b->next = pool_free[b->size_class];
        pool_free[b->size_class] = b;
        pool_stats.bytes_cached += b->capacity;
        pool_stats.blocks_cached++;
    } else {
        pool_stats.returned++;
    }
    PyThread_release_lock(pool_lock);
    if (!keep) free(b->memory);
}

static void *pool_malloc(void *ctx, size_t size) { (void)ctx; return pool_get(size ? size : 1, 0); }

static void *pool_calloc(void *ctx, size_t n, size_t elsize) {
    (void)ctx;
    if (elsize && n > ((size_t)-1 - POOL_HEADER) / elsize) return NULL;
    size_t size = n * elsize;
    return pool_get(size ? size : 1, 1);
}

static void *pool_realloc(void *ctx, void *p, size_t size) {
    if (p == NULL) return pool_malloc(ctx, size);
    PoolBlock *b = pool_block_of(p);
    if (b->capacity == 0 && size < pool_threshold) {  /* small stays small */
        PoolBlock *moved = numpy_allocator->realloc(numpy_allocator->ctx, b, (size ? size : 1) + POOL_HEADER);
        if (moved == NULL) return NULL;
        moved->size = size ? size : 1;
        return pool_block_data(moved);
    }
    if (b->capacity >= size && b->capacity != 0) return p;
    void *q = pool_malloc(ctx, size);
    if (q == NULL) return NULL;
    size_t old = b->capacity ? b->capacity : b->size;
    memcpy(q, p, old < size ? old : size);
    pool_put(ctx, p, 0);
    return q;
}

static PyDataMem_Handler pool_handler = {
    "lamina_pool", 1, {NULL, pool_malloc, pool_calloc, pool_realloc, pool_put},
};
static PyObject *pool_capsule;  /* the handler, as NumPy takes it */

static PyObject *mod_pool_install(PyObject *self, PyObject *on) {
    /* the pool (on) or NumPy's default (off) for the calling thread's context */
    PyObject *handler = PyObject_IsTrue(on) ? pool_capsule : PyDataMem_DefaultHandler;
    PyObject *old = PyDataMem_SetHandler(handler);
    if (old == NULL) return NULL;
    Py_DECREF(old);
    Py_RETURN_NONE;
}

static PyObject *mod_pool_configure(PyObject *self, PyObject *args) {
    unsigned long long threshold, limit;
    if (!PyArg_ParseTuple(args, "KK", &threshold, &limit)) return NULL;
    if (threshold < 1) {
        PyErr_SetString(PyExc_ValueError, "pool threshold must be at least 1 byte");
        return NULL;
    }
    PyThread_acquire_lock(pool_lock, WAIT_LOCK);
    pool_threshold = (size_t)threshold;
    pool_limit = (size_t)limit;
    PyThread_release_lock(pool_lock);
    Py_RETURN_NONE;
}

static PyObject *mod_pool_empty(PyObject *self, PyObject *unused) {
    /* every cached block back to the C library */
    PoolBlock *lists[POOL_CLASSES];
    PyThread_acquire_lock(pool_lock, WAIT_LOCK);
    memcpy(lists, pool_free, sizeof lists);
    memset(pool_free, 0, sizeof pool_free);
    pool_stats.returned += pool_stats.blocks_cached;
    pool_stats.bytes_cached = pool_stats.blocks_cached = 0;
    PyThread_release_lock(pool_lock);
    for (int c = 0; c < POOL_CLASSES; c++)
        for (PoolBlock *b = lists[c], *next; b != NULL; b = next) {
            next = b->next;
            free(b->memory);
        }
    Py_RETURN_NONE;
}

static PyObject *mod_pool_stats(PyObject *self, PyObject *unused) {
    PyThread_acquire_lock(pool_lock, WAIT_LOCK);
    __typeof__(pool_stats) s = pool_stats;
    size_t threshold = pool_threshold, limit = pool_limit;
    PyThread_release_lock(pool_lock);
    return Py_BuildValue(
        "{sKsKsKsnsnsnsnsnsn}", "allocations", s.allocations, "hits", s.hits, "returned",
        s.returned, "bytes_cached", (Py_ssize_t)s.bytes_cached, "blocks_cached",
        (Py_ssize_t)s.blocks_cached, "bytes_in_use", (Py_ssize_t)s.bytes_in_use,
        "peak_bytes_in_use", (Py_ssize_t)s.peak_in_use, "threshold", (Py_ssize_t)threshold,
        "limit", (Py_ssize_t)limit);
}

static PyObject *mod_pool_reset_peak(PyObject *self, PyObject *unused) {
    PyThread_acquire_lock(pool_lock, WAIT_LOCK);
    pool_stats.peak_in_use = pool_stats.bytes_in_use;
    pool_stats.allocations = pool_stats.hits = pool_stats.returned = 0;
    PyThread_release_lock(pool_lock);
    Py_RETURN_NONE;
}

static PyMethodDef pool_functions[] = {
    {"pool_install", mod_pool_install, METH_O, "NumPy allocates through the pool (or not)"},
    {"pool_configure", mod_pool_configure, METH_VARARGS, "(threshold, limit) in bytes"},
    {"pool_empty", mod_pool_empty, METH_NOARGS, "return every cached block"},
    {"pool_stats", mod_pool_stats, METH_NOARGS, "the pool's counters"},
    {"pool_reset", mod_pool_reset_peak, METH_NOARGS, "zero the counters, peak = in use"},
    {NULL},
};

int init_pool(PyObject *m) {
    pool_lock = PyThread_allocate_lock();
    pool_capsule = PyCapsule_New(&pool_handler, "mem_handler", NULL);
    PyDataMem_Handler *numpy_handler = PyCapsule_GetPointer(PyDataMem_DefaultHandler, "mem_handler");
    if (pool_lock == NULL || pool_capsule == NULL || numpy_handler == NULL) return -1;
    numpy_allocator = &numpy_handler->allocator;
    return PyModule_AddFunctions(m, pool_functions);
}
