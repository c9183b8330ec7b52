/* The fast paths (Note [C core files]): ElementwiseKernel, the dense elementwise fast
 * path with its general path (Note [C general path]), ReductionKernel, the folds over
 * leading or trailing axes (Note [C reductions]), RowsKernel, the operators along the
 * last axis whose result keeps their input's shape (Note [C rows]), and FusedLoop, a
 * compiled plan's call of a fused elementwise loop (Note [Fused loops] in
 * reference.py). */
#include <fenv.h>

#include "core.h"

/* ------------------------------------------------------------------ ElementwiseKernel */

enum { FORM_TENSOR = 0, FORM_SCALAR = 1, FORM_UNCHECKED = 2 };  /* a kernel's forms */
enum { LOOP_FLAT = 0, LOOP_SCALAR = 1, LOOP_STRIDED = 2, N_LOOP_FORMS = 3 };  /* loops' */
enum { LOOP_ROWS = 3, LOOP_COLUMNS = 4 };  /* a reduction's loops */
enum { LOOP_DEVIATION_ROWS = 5, LOOP_DEVIATION_COLUMNS = 6 };  /* Note [C moments] */

typedef void (*loop1_t)(void *, void *, long long);
typedef void (*loop2_t)(void *, void *, void *, long long);
typedef void (*loop_scalar_f)(void *, double, void *, long long, int);
typedef void (*loop_scalar_i)(void *, long long, void *, long long, int);
typedef void (*loop_scalar_u)(void *, unsigned long long, void *, long long, int);
/* strided loops: element strides after the length (Note [C loops]) */
typedef void (*sloop1_t)(void *, void *, long long, long long, long long);
typedef void (*sloop2_t)(void *, void *, void *, long long, long long, long long, long long);

/* What the kernel and its variants share: the loops' C addresses, compiled on first
 * use through loops.address(form, index) (Note [C loops] in numba_cpu/kernels.py), and
 * the NumPy ufuncs of the general path, one per dtype around its strided loop. */
/* Note [NumPy inner loops]: an operator whose loops name a NumPy ufunc for dtype i
 * (loops.numpy_ufunc(i): the transcendental functions, Note [NumPy SIMD loops] in
 * numba_cpu/elementwise.py) runs that ufunc's own inner loop for dtype i -- the function
 * NumPy's iterator calls, SIMD code chosen for the CPU when NumPy loaded -- straight from
 * the fast path and as the general path's ufunc loop, at every size, with no Python and
 * no errstate: the values are NumPy's, as the reference's ufunc call gives them. The
 * loop is looked up once, in the ufunc's table (ntypes, types, functions, data) by its
 * signature, every operand of dtype i, and its forms' addresses become NUMPY_LOOP. A
 * ufunc without one (another NumPy's table) sends the dtype's calls to the reference,
 * which calls the ufunc; never to the backend's loops, whose values differ. NumPy's
 * loops report inf and NaN results in the floating-point status, which the loops'
 * callers clear (lamina never warns of them). */
static char numpy_loop_marker;
#define NUMPY_LOOP ((void *)&numpy_loop_marker)

typedef struct {
    PyObject_HEAD
    void *addresses[N_LOOP_FORMS][MAX_DTYPES];  /* [loop form][dtype index] */
    PyObject *ufuncs[MAX_DTYPES];
    PyUFuncGenericFunction np_funcs[MAX_DTYPES];  /* NumPy's loops (NUMPY_LOOP) */
    void *np_data[MAX_DTYPES];
} LoopCacheObject;

static void loopcache_dealloc(LoopCacheObject *self) {
    for (int i = 0; i < MAX_DTYPES; i++) Py_CLEAR(self->ufuncs[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject LoopCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.LoopCache",
    .tp_basicsize = sizeof(LoopCacheObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)loopcache_dealloc,
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *reference;   /* the reference.ElementwiseKernel twin: every other call */
    PyObject *loops;       /* the backend's loops: .address(form, index) */
    LoopCacheObject *cache;
    PyObject *dict;
    int arity;
    int form;
    long long limit;       /* from this many elements on, the reference (general) serves */
    PyObject *fast_out[MAX_DTYPES];  /* borrowed from the twin's tuples */
    PyObject *results[MAX_DTYPES];
    int out_index[MAX_DTYPES];       /* dtype index of fast_out[i] (-1: None) */
    int result_index[MAX_DTYPES];
    long long lo[MAX_DTYPES], hi[MAX_DTYPES];  /* integer bounds; hi < lo: none */
    unsigned long long ulo[MAX_DTYPES], uhi[MAX_DTYPES];
    PyObject *tuples;      /* keeps the twin's fast_out, results, bounds alive */
} KernelObject;

static PyTypeObject KernelType;

/* Note [NumPy inner loops]: 1 where dtype i runs NumPy's loop (now in the cache), 0
 * where the backend's loops serve it, -1 where neither (error set or not) */
/* the loop of ufunc u whose every operand has NumPy type `type`: 1 and its function
 * and data, or 0 */
static int ufunc_loop(PyObject *u, int type, PyUFuncGenericFunction *fn, void **data) {
    PyUFuncObject *uf = (PyUFuncObject *)u;
    if (!PyObject_TypeCheck(u, &PyUFunc_Type) || uf->nout != 1 || uf->nin > 2) return 0;
    int nargs = uf->nin + 1;
    for (int j = 0; j < uf->ntypes; j++) {
        int same = uf->functions[j] != NULL;
        for (int a = 0; a < nargs; a++) same &= uf->types[j * nargs + a] == type;
        if (same) {
            *fn = uf->functions[j];
            *data = uf->data == NULL ? NULL : uf->data[j];
            return 1;
        }
    }
    return 0;
}

static int find_numpy_loop(KernelObject *k, int i) {
    PyObject *u = PyObject_CallMethod(k->loops, "numpy_ufunc", "i", i);
    if (u == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {  /* loops without */
        PyErr_Clear();
        return 0;
    }
    if (u == NULL) return -1;
    int found = u == Py_None ? 0 : -1;
    if (found < 0 && PyObject_TypeCheck(u, &PyUFunc_Type) &&
        ((PyUFuncObject *)u)->nin == k->arity && k->result_index[i] == i &&  /* in dtype i */
        ufunc_loop(u, dtype_descrs[i]->type_num, &k->cache->np_funcs[i], &k->cache->np_data[i]))
        found = 1;
    Py_DECREF(u);
    return found;
}

/* NumPy's loop of dtype i on n contiguous elements; `scalar_at` >= 0: that operand is
 * one element read n times (stride 0) */
static void run_numpy_loop(KernelObject *k, int i, char **args, npy_intp n, int scalar_at) {
    npy_intp item = PyDataType_ELSIZE(dtype_descrs[i]), steps[3] = {item, item, item};
    if (scalar_at >= 0) steps[scalar_at] = 0;
    k->cache->np_funcs[i](args, &n, steps, k->cache->np_data[i]);
    feclearexcept(FE_ALL_EXCEPT);
}

/* Note [NumPy loops on threads]: NumPy's loops are single-threaded, so from the
 * parallel threshold on the backend runs one on parts of dense operands, one part per
 * thread, from a Numba parallel loop whose body is this function: no Python, no GIL
 * (numba_cpu/elementwise.py, run_simd). A job is int64s: the loop's function and data,
 * the operand count (inputs, then the output), the element count, the operands' data
 * pointers and their strides in bytes (0: one element read throughout). */
static void run_numpy_part(long long job_address, long long part, long long parts) {
    const long long *job = (const long long *)job_address;
    int nargs = (int)job[2];
    npy_intp n = (npy_intp)job[3], start = n * part / parts, len = n * (part + 1) / parts - start;
    char *args[3];
    npy_intp steps[3];
    for (int a = 0; a < nargs; a++) {
        steps[a] = (npy_intp)job[7 + a];
        args[a] = (char *)job[4 + a] + start * steps[a];
    }
    if (len > 0) ((PyUFuncGenericFunction)job[0])(args, &len, steps, (void *)job[1]);
    feclearexcept(FE_ALL_EXCEPT);
}

static void *kernel_loop(KernelObject *k, int form, int index) {
    void *address = k->cache->addresses[form][index];
    if (address != NULL) return address;
    int numpy = find_numpy_loop(k, index);
    if (numpy != 0) {
        if (numpy < 0) return NULL;
        for (int f = 0; f < N_LOOP_FORMS; f++) k->cache->addresses[f][index] = NUMPY_LOOP;
        return NUMPY_LOOP;
    }
    PyObject *got = PyObject_CallMethod(k->loops, "address", "ii", form, index);
    if (got == NULL) return NULL;
    address = PyLong_AsVoidPtr(got);
    Py_DECREF(got);
    if (address == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "loops.address returned a null address");
        return NULL;
    }
    k->cache->addresses[form][index] = address;
    return address;
}

/* A storage the loops may read as n elements of dtype index i (Note [C safety]). */
static inline PyArrayObject *flat_array(TensorObject *t, int i) {
    PyObject *f = t->flat;
    if (f == NULL || !PyArray_CheckExact(f)) return NULL;
    PyArrayObject *a = (PyArrayObject *)f;
    if (PyArray_NDIM(a) != 1 || !PyArray_IS_C_CONTIGUOUS(a)) return NULL;
    if (PyArray_DESCR(a)->type_num != dtype_descrs[i]->type_num) return NULL;
    return a;
}

/* A new CPU tensor of `shape` (a tuple of ints), dtype index `out`, n elements: its
 * storage and 1-D alias as reference.ElementwiseKernel makes them (np.empty(n), then
 * reshape), or with `strides` (bytes, a dense order of the n elements) the storage seen
 * with them and no 1-D alias (_flat is None: it is not C-contiguous). Sets *flat_data
 * to the storage's data pointer. */
static PyObject *make_output(PyObject *shape, int out, npy_intp n, const npy_intp *strides,
                             void **flat_data) {
    PyArray_Descr *descr = dtype_descrs[out];
    Py_INCREF(descr);
    PyObject *flat = PyArray_NewFromDescr(&PyArray_Type, descr, 1, &n, NULL, NULL, 0, NULL);
    if (flat == NULL) return NULL;
    PyObject *data;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    if (nd == 1 && strides == NULL) {
        Py_INCREF(flat);
        data = flat;
    } else {
        npy_intp dims[NPY_MAXDIMS];
        if (nd > NPY_MAXDIMS) {
            Py_DECREF(flat);
            PyErr_SetString(PyExc_ValueError, "too many dimensions");
            return NULL;
        }
        for (Py_ssize_t d = 0; d < nd; d++) {
            dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
            if (dims[d] == -1 && PyErr_Occurred()) {
                Py_DECREF(flat);
                return NULL;
            }
        }
        Py_INCREF(descr);
        data = PyArray_NewFromDescr(&PyArray_Type, descr, (int)nd, dims, (npy_intp *)strides,
                                    PyArray_DATA((PyArrayObject *)flat),
                                    strides == NULL ? NPY_ARRAY_CARRAY : NPY_ARRAY_BEHAVED, NULL);
        if (data == NULL) {
            Py_DECREF(flat);
            return NULL;
        }
        Py_INCREF(flat);  /* the view's base (PyArray_SetBaseObject steals it) */
        if (PyArray_SetBaseObject((PyArrayObject *)data, flat) < 0) {
            Py_DECREF(data);
            Py_DECREF(flat);
            return NULL;
        }
    }
    TensorObject *t = (TensorObject *)tensor_type->tp_alloc(tensor_type, 0);
    if (t == NULL) {
        Py_DECREF(data);
        Py_DECREF(flat);
        return NULL;
    }
    t->data = data;
    *flat_data = PyArray_DATA((PyArrayObject *)data);  /* the storage's start either way */
    if (strides != NULL) {  /* the view holds the storage */
        Py_DECREF(flat);
        Py_INCREF(Py_None);
        flat = Py_None;
    }
    t->flat = flat;
    Py_INCREF(cpu_ks);
    t->ks_obj = cpu_ks;
    t->ks = 1;
    Py_INCREF(dtype_objs[out]);
    t->dtype = dtype_objs[out];
    t->dtype_index = out;
    Py_INCREF(shape);
    t->shape = shape;
    return (PyObject *)t;
}

static PyObject *new_output(PyObject *shape, int out, npy_intp n, void **flat_data) {
    return make_output(shape, out, n, NULL, flat_data);
}

/* ---------------------------------------------- the general path's operator setup
 * Note [C general path]: a call of same-dtype dense CPU tensors that the contiguous
 * path does not take (broadcasting, strides; a Python scalar with a strided tensor)
 * is set up by NumPy's own iterator: the kernel's ufunc for the dtype, whose inner
 * loop is the backend's strided loop (LOOP_STRIDED), is called with an output that C
 * allocated C-contiguous in the broadcast shape, as the reference's general path
 * allocates it. Anything else -- promotion, a shape that does not broadcast (the
 * reference raises lamina's error), sizes from the limit on -- is the reference's. */

typedef struct {
    void *loop;
    int itemsizes[3];  /* inputs', then the output's */
    PyUFuncGenericFunction np_func;  /* NUMPY_LOOP's function and data */
    void *np_data;
} UfuncData;

/* The inner loops clear the floating-point status the loop left: NumPy reads it after
 * a ufunc's loops and would warn of inf and NaN results, which lamina never does (the
 * reference's loops are Numba's, which NumPy does not watch). */
static void ufunc_inner1(char **args, npy_intp const *dims, npy_intp const *steps, void *data) {
    UfuncData *u = (UfuncData *)data;
    ((sloop1_t)u->loop)(args[0], args[1], (long long)dims[0],
                        (long long)(steps[0] / u->itemsizes[0]),
                        (long long)(steps[1] / u->itemsizes[2]));
    feclearexcept(FE_ALL_EXCEPT);
}

static void ufunc_inner2(char **args, npy_intp const *dims, npy_intp const *steps, void *data) {
    UfuncData *u = (UfuncData *)data;
    ((sloop2_t)u->loop)(args[0], args[1], args[2], (long long)dims[0],
                        (long long)(steps[0] / u->itemsizes[0]),
                        (long long)(steps[1] / u->itemsizes[1]),
                        (long long)(steps[2] / u->itemsizes[2]));
    feclearexcept(FE_ALL_EXCEPT);
}

static void ufunc_inner_numpy(char **args, npy_intp const *dims, npy_intp const *steps,
                              void *data) {
    UfuncData *u = (UfuncData *)data;
    u->np_func(args, dims, steps, u->np_data);
    feclearexcept(FE_ALL_EXCEPT);
}

/* The NumPy ufunc of dtype index i, made on first use (it lives as long as the kernel:
 * its loop tables are allocated once and never freed, as NumPy's own are). */
static PyObject *kernel_ufunc(KernelObject *k, int i, int out) {
    PyObject *u = k->cache->ufuncs[i];
    if (u != NULL) return u;
    void *loop = kernel_loop(k, LOOP_STRIDED, i);
    if (loop == NULL) return NULL;
    PyUFuncGenericFunction *funcs = PyMem_Malloc(sizeof(PyUFuncGenericFunction));
    void **data = PyMem_Malloc(sizeof(void *));
    UfuncData *ud = PyMem_Malloc(sizeof(UfuncData));
    char *types = PyMem_Malloc(3);
    if (!funcs || !data || !ud || !types) {
        PyMem_Free(funcs);
        PyMem_Free(data);
        PyMem_Free(ud);
        PyMem_Free(types);
        return PyErr_NoMemory();
    }
    int nin = k->arity;
    funcs[0] = nin == 1 ? ufunc_inner1 : ufunc_inner2;
    if (loop == NUMPY_LOOP) funcs[0] = ufunc_inner_numpy;
    ud->loop = loop;
    ud->np_func = k->cache->np_funcs[i];
    ud->np_data = k->cache->np_data[i];
    for (int j = 0; j < nin; j++) {
        types[j] = (char)dtype_descrs[i]->type_num;
        ud->itemsizes[j] = (int)PyDataType_ELSIZE(dtype_descrs[i]);
    }
    types[nin] = (char)dtype_descrs[out]->type_num;
    ud->itemsizes[2] = (int)PyDataType_ELSIZE(dtype_descrs[out]);
    data[0] = ud;
    u = PyUFunc_FromFuncAndData(funcs, data, types, 1, nin, 1, PyUFunc_None, "lamina_loop",
                                "the general path's ufunc of one lamina kernel and dtype", 0);
    if (u == NULL) return NULL;
    k->cache->ufuncs[i] = u;
    return u;
}

/* An operand's storage the ufunc may read: a NumPy array of dtype index i whose strides
 * are whole elements (the strided loops take element strides). */
static inline PyArrayObject *data_array(TensorObject *t, int i) {
    PyObject *d = t->data;
    if (d == NULL || !PyArray_CheckExact(d)) return NULL;
    PyArrayObject *a = (PyArrayObject *)d;
    if (PyArray_DESCR(a)->type_num != dtype_descrs[i]->type_num) return NULL;
    npy_intp item = PyArray_ITEMSIZE(a);
    for (int d_ = 0; d_ < PyArray_NDIM(a); d_++)
        if (PyArray_STRIDES(a)[d_] % item) return NULL;
    return a;
}

/* Whether a's strides are a C-contiguous array's with its axes permuted, other than C
 * order itself: the reference's general path may keep such an order in its result
 * (Note [Result layouts]), so a call with such operands is the reference's. */
static int permuted_dense(PyArrayObject *a) {
    if (PyArray_IS_C_CONTIGUOUS(a)) return 0;
    int nd = PyArray_NDIM(a), used[NPY_MAXDIMS] = {0};
    npy_intp step = PyArray_ITEMSIZE(a), *dims = PyArray_DIMS(a), *strides = PyArray_STRIDES(a);
    for (int k = 0; k < nd; k++) {  /* from the innermost axis out, ignoring sizes of 1 */
        int inner = -1;
        for (int d = 0; d < nd; d++)
            if (!used[d] && dims[d] != 1 && (inner < 0 || strides[d] < strides[inner])) inner = d;
        if (inner < 0) break;
        if (strides[inner] != step) return 0;
        used[inner] = 1;
        step *= dims[inner];
    }
    return 1;
}

/* the broadcast shape of up to two arrays, or -1 (not broadcastable: the reference's) */
static int broadcast_dims(PyArrayObject *a, PyArrayObject *b, npy_intp *dims) {
    int na = PyArray_NDIM(a), nb = b == NULL ? 0 : PyArray_NDIM(b);
    int nd = na > nb ? na : nb;
    for (int d = 0; d < nd; d++) {
        npy_intp x = d - (nd - na) >= 0 ? PyArray_DIMS(a)[d - (nd - na)] : 1;
        npy_intp y = b != NULL && d - (nd - nb) >= 0 ? PyArray_DIMS(b)[d - (nd - nb)] : 1;
        if (x != y && x != 1 && y != 1) return -1;
        dims[d] = x == 1 ? y : x;
    }
    return nd;
}

static PyObject *shape_tuple(int nd, const npy_intp *dims, TensorObject *a, TensorObject *b) {
    for (int k = 0; k < 2; k++) {  /* the broadcast shape is usually an operand's */
        TensorObject *t = k == 0 ? a : b;
        if (t == NULL || PyTuple_GET_SIZE(t->shape) != nd) continue;
        PyArrayObject *arr = (PyArrayObject *)t->data;
        if (PyArray_NDIM(arr) == nd && memcmp(PyArray_DIMS(arr), dims, nd * sizeof(npy_intp)) == 0) {
            Py_INCREF(t->shape);
            return t->shape;
        }
    }
    PyObject *shape = PyTuple_New(nd);
    if (shape == NULL) return NULL;
    for (int d = 0; d < nd; d++) {
        PyObject *n = PyLong_FromSsize_t(dims[d]);
        if (n == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, d, n);
    }
    return shape;
}

/* Note [C permuted path]: operands that share one dense order other than C's
 * (channels-last images: NHWC memory seen as NCHW) are n elements in a row of memory,
 * as contiguous ones are. A call of one such tensor, two of one shape and the same
 * strides, or one with a Python scalar, runs the contiguous loop over that memory, and
 * its result has the operands' order with the strides the reference's general path
 * gives it (Note [Result layouts]): axes by decreasing stride (ties in axis order),
 * each stride the product of the sizes (at least 1) inside it. The general path took
 * ~13 us for a small channels-last add; this one takes what a contiguous call does. */

/* the strides (bytes) of a result of dtype index `out` in a's dense order */
static npy_intp *order_strides(PyArrayObject *a, int out, npy_intp *strides) {
    int nd = PyArray_NDIM(a), order[NPY_MAXDIMS];
    const npy_intp *s = PyArray_STRIDES(a), *dims = PyArray_DIMS(a);
    for (int d = 0; d < nd; d++) {  /* a stable insertion sort, as Python's sorted */
        int j = d;
        for (; j > 0 && s[order[j - 1]] < s[d]; j--) order[j] = order[j - 1];
        order[j] = d;
    }
    npy_intp step = PyDataType_ELSIZE(dtype_descrs[out]);
    for (int j = nd - 1; j >= 0; j--) {
        strides[order[j]] = step;
        step *= dims[order[j]] > 1 ? dims[order[j]] : 1;
    }
    return strides;
}

/* t's storage where it is in such an order (else NULL), with *strides set to those of
 * a result of dtype index `out` in it (kept in `kept`) */
static PyArrayObject *permuted_operand(TensorObject *t, int i, int out, npy_intp *kept,
                                       npy_intp **strides) {
    /* its key set may hold AUTOGRAD (the layer above redispatched): the storage decides,
     * as for the contiguous path */
    PyArrayObject *a = data_array(t, i);
    if (a == NULL || !permuted_dense(a)) return NULL;
    *strides = order_strides(a, out, kept);
    return a;
}

static int same_layout(PyArrayObject *a, PyArrayObject *b) {
    int nd = PyArray_NDIM(a);
    return PyArray_NDIM(b) == nd &&
           memcmp(PyArray_DIMS(a), PyArray_DIMS(b), nd * sizeof(npy_intp)) == 0 &&
           memcmp(PyArray_STRIDES(a), PyArray_STRIDES(b), nd * sizeof(npy_intp)) == 0;
}

static PyObject *out_kwnames;  /* ("out",) */

/* ufunc(*operands, out=<a new C-contiguous tensor's storage>) -> the tensor; operands
 * are arrays or a Python scalar (a weak scalar keeps the loop's dtype, NEP 50) */
static PyObject *general_call(KernelObject *k, int i, int out, PyObject *x1, PyObject *x2,
                              int nd, npy_intp *dims, TensorObject *ta, TensorObject *tb) {
    npy_intp n = 1;
    for (int d = 0; d < nd; d++) n *= dims[d];
    if (n >= k->limit) return NULL;
    PyObject *ufunc = kernel_ufunc(k, i, out);
    if (ufunc == NULL) return NULL;
    PyObject *shape = shape_tuple(nd, dims, ta, tb);
    if (shape == NULL) return NULL;
    void *o;
    PyObject *t = new_output(shape, out, n, &o);
    Py_DECREF(shape);
    if (t == NULL) return NULL;
    PyObject *args[3] = {x1, x2, T(t)->data};
    int nin = x2 == NULL ? 1 : 2;
    if (nin == 1) args[1] = T(t)->data;
    PyObject *r = PyObject_Vectorcall(ufunc, args, nin, out_kwnames);
    if (r == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    Py_DECREF(r);
    return t;
}

static PyObject *general_binary(KernelObject *k, TensorObject *ta, TensorObject *tb, int i, int out) {
    if (ta->ks != 1 || tb->ks != 1) return NULL;  /* dense CPU tensors only */
    PyArrayObject *a = data_array(ta, i), *b = data_array(tb, i);
    if (a == NULL || b == NULL) return NULL;
    int na = PyArray_NDIM(a), nb = PyArray_NDIM(b);
    if ((na || nb) && (!na || permuted_dense(a)) && (!nb || permuted_dense(b)))
        return NULL;  /* perhaps one order not C's: the result keeps it */
    npy_intp dims[NPY_MAXDIMS];
    int nd = broadcast_dims(a, b, dims);
    if (nd < 0) return NULL;
    return general_call(k, i, out, (PyObject *)a, (PyObject *)b, nd, dims, ta, tb);
}

static PyObject *general_unary(KernelObject *k, TensorObject *tx, int i, int out) {
    if (tx->ks != 1) return NULL;
    PyArrayObject *x = data_array(tx, i);
    if (x == NULL || permuted_dense(x)) return NULL;  /* the result keeps x's order */
    return general_call(k, i, out, (PyObject *)x, NULL, PyArray_NDIM(x),
                        (npy_intp *)PyArray_DIMS(x), tx, NULL);
}

/* reference.ElementwiseKernel._binary: NULL with no error set means "not fast" */
static PyObject *fast_binary(KernelObject *k, PyObject *a, PyObject *b) {
    if (!IS_TENSOR(a) || !IS_TENSOR(b)) return NULL;
    TensorObject *ta = T(a), *tb = T(b);
    if (!TENSOR_ARGS_OK(ta) || !TENSOR_ARGS_OK(tb) || ta->dtype != tb->dtype) return NULL;
    int i = ta->dtype_index, out = k->out_index[i];
    if (out < 0) return NULL;
    PyArrayObject *fa = flat_array(ta, i), *fb = flat_array(tb, i);
    npy_intp kept[NPY_MAXDIMS], *strides = NULL;
    if (fa == NULL || fb == NULL || !same_shape(ta->shape, tb->shape)) {
        fa = permuted_operand(ta, i, out, kept, &strides);  /* Note [C permuted path] */
        fb = fa == NULL ? NULL : data_array(tb, i);
        if (fb == NULL || !same_layout(fa, fb))
            return general_binary(k, ta, tb, i, out);  /* Note [C general path] */
    }
    npy_intp n = PyArray_SIZE(fa);
    if (n >= k->limit || PyArray_SIZE(fb) != n) return NULL;
    loop2_t loop = (loop2_t)kernel_loop(k, LOOP_FLAT, i);
    if (loop == NULL) return NULL;
    void *o;
    PyObject *t = make_output(ta->shape, out, n, strides, &o);
    if (t == NULL) return NULL;
    if ((void *)loop != NUMPY_LOOP) {
        loop(PyArray_DATA(fa), PyArray_DATA(fb), o, (long long)n);
    } else {
        char *args[3] = {PyArray_DATA(fa), PyArray_DATA(fb), o};
        run_numpy_loop(k, i, args, n, -1);
    }
    return t;
}

/* reference.ElementwiseKernel._unary */
static PyObject *fast_unary(KernelObject *k, PyObject *x) {
    if (!IS_TENSOR(x)) return NULL;
    TensorObject *tx = T(x);
    if (!TENSOR_ARGS_OK(tx)) return NULL;
    int i = tx->dtype_index, out = k->out_index[i];
    if (out < 0) return NULL;
    PyArrayObject *fx = flat_array(tx, i);
    npy_intp kept[NPY_MAXDIMS], *strides = NULL;
    if (fx == NULL && (fx = permuted_operand(tx, i, out, kept, &strides)) == NULL)
        return general_unary(k, tx, i, out);  /* Note [C general path] */
    npy_intp n = PyArray_SIZE(fx);
    if (n >= k->limit) return NULL;
    loop1_t loop = (loop1_t)kernel_loop(k, LOOP_FLAT, i);
    if (loop == NULL) return NULL;
    void *o;
    PyObject *t = make_output(tx->shape, out, n, strides, &o);
    if (t == NULL) return NULL;
    if ((void *)loop != NUMPY_LOOP) {
        loop(PyArray_DATA(fx), o, (long long)n);
    } else {
        char *args[2] = {PyArray_DATA(fx), o};
        run_numpy_loop(k, i, args, n, -1);
    }
    return t;
}

/* a strided tensor with a Python scalar that keeps its dtype: the scalar as a 0-d array
 * of the dtype (in range: fast_with_scalar checked), broadcast by the ufunc */
static PyObject *general_scalar(KernelObject *k, TensorObject *t, PyObject *v, int first, int i,
                                int out) {
    if (t->ks != 1) return NULL;
    PyArrayObject *x = data_array(t, i);
    if (x == NULL || permuted_dense(x)) return NULL;  /* the result keeps x's order */
    Py_INCREF(dtype_descrs[i]);
    PyObject *s = PyArray_NewFromDescr(&PyArray_Type, dtype_descrs[i], 0, NULL, NULL, NULL, 0, NULL);
    if (s == NULL) return NULL;
    if (PyArray_SETITEM((PyArrayObject *)s, PyArray_DATA((PyArrayObject *)s), v) < 0) {
        Py_DECREF(s);
        return NULL;
    }
    PyObject *r = general_call(k, i, out, first ? s : (PyObject *)x, first ? (PyObject *)x : s,
                               PyArray_NDIM(x), (npy_intp *)PyArray_DIMS(x), t, NULL);
    Py_DECREF(s);
    return r;
}

/* reference.ElementwiseKernel._with_scalar (Note [Scalar fast path]) */
static PyObject *fast_with_scalar(KernelObject *k, PyObject *a, PyObject *b) {
    int first = IS_PY_SCALAR(a);
    PyObject *t_obj = first ? b : a, *v = first ? a : b;
    if (!IS_PY_SCALAR(v) || Py_TYPE(t_obj) != tensor_type) return NULL;
    TensorObject *t = T(t_obj);
    if (!TENSOR_ARGS_OK(t)) return NULL;
    int i = t->dtype_index;
    char kind = dtype_kinds[i];
    double dv = 0.0;
    long long iv = 0;
    unsigned long long uv = 0;
    if (PyLong_CheckExact(v)) {
        if (kind == 'b') return NULL;  /* an int with a bool tensor promotes */
        if (kind == 'i') {
            int overflow;
            iv = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow || (iv == -1 && PyErr_Occurred()) || iv < k->lo[i] || iv > k->hi[i]) {
                PyErr_Clear();
                return NULL;  /* out of range: OverflowError from the general path */
            }
        } else if (kind == 'u') {
            if (Py_SIZE(v) < 0) return NULL;  /* negative */
            uv = PyLong_AsUnsignedLongLong(v);
            if ((uv == (unsigned long long)-1 && PyErr_Occurred()) || uv > k->uhi[i]) {
                PyErr_Clear();
                return NULL;
            }
        } else if (kind == 'f' || kind == 'c') {
            dv = PyLong_AsDouble(v);
            if (dv == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                return NULL;
            }
        } else {
            return NULL;
        }
    } else if (PyFloat_CheckExact(v)) {
        if (kind != 'f' && kind != 'c') return NULL;  /* promotion to the default float */
        dv = PyFloat_AS_DOUBLE(v);
    } else {  /* a bool */
        iv = v == Py_True;
        uv = (unsigned long long)iv;
        dv = (double)iv;
    }
    int out = k->out_index[i];
    if (out < 0) return NULL;
    PyArrayObject *f = flat_array(t, i);
    npy_intp kept[NPY_MAXDIMS], *strides = NULL;
    if (f == NULL && (f = permuted_operand(t, i, out, kept, &strides)) == NULL)
        return general_scalar(k, t, v, first, i, out);  /* Note [C general path] */
    npy_intp n = PyArray_SIZE(f);
    if (n >= k->limit) return NULL;
    void *loop = kernel_loop(k, LOOP_SCALAR, i);
    if (loop == NULL) return NULL;
    void *o;
    PyObject *r = make_output(t->shape, out, n, strides, &o);
    if (r == NULL) return NULL;
    void *p = PyArray_DATA(f);
    if (loop == NUMPY_LOOP) {  /* NumPy's loops are float32's and float64's */
        float f32 = (float)dv;
        char *scalar = dtype_descrs[i]->type_num == NPY_FLOAT ? (char *)&f32 : (char *)&dv;
        char *args[3] = {first ? scalar : p, first ? p : scalar, o};
        run_numpy_loop(k, i, args, n, first ? 0 : 1);
    } else if (kind == 'f' || kind == 'c')  /* a complex loop makes v + 0j of the double */
        ((loop_scalar_f)loop)(p, dv, o, (long long)n, first);
    else if (kind == 'u')
        ((loop_scalar_u)loop)(p, uv, o, (long long)n, first);
    else
        ((loop_scalar_i)loop)(p, iv, o, (long long)n, first);
    return r;
}

/* reference.ElementwiseKernel._unchecked (Note [Unchecked fast path]): the tensors'
 * sizes and dtypes are still compared, so memory is never read out of bounds */
static PyObject *fast_unchecked(KernelObject *k, PyObject *a, PyObject *b) {
    if (!IS_TENSOR(a) || !IS_TENSOR(b)) return NULL;
    TensorObject *ta = T(a), *tb = T(b);
    if (!TENSOR_ARGS_OK(ta) || ta->dtype != tb->dtype) return NULL;
    int i = ta->dtype_index, out = k->result_index[i];
    PyArrayObject *fa = flat_array(ta, i), *fb = flat_array(tb, i);
    if (out < 0 || fa == NULL || fb == NULL) return NULL;
    npy_intp n = PyArray_SIZE(fa);
    if (PyArray_SIZE(fb) != n) return NULL;
    loop2_t loop = (loop2_t)kernel_loop(k, LOOP_FLAT, i);
    if (loop == NULL) return NULL;
    void *o;
    PyObject *t = new_output(ta->shape, out, n, &o);
    if (t == NULL) return NULL;
    if ((void *)loop != NUMPY_LOOP) {
        loop(PyArray_DATA(fa), PyArray_DATA(fb), o, (long long)n);
    } else {
        char *args[3] = {PyArray_DATA(fa), PyArray_DATA(fb), o};
        run_numpy_loop(k, i, args, n, -1);
    }
    return t;
}

/* kernel(ks, *operands): the fast path, else the reference twin */
static PyObject *kernel_call_fast(KernelObject *k, PyObject *const *ops, Py_ssize_t n) {
    if (k->form == FORM_TENSOR) {
        if (k->arity == 1 && n == 1) return fast_unary(k, ops[0]);
        if (k->arity == 2 && n == 2) return fast_binary(k, ops[0], ops[1]);
    } else if (n == 2) {
        return k->form == FORM_SCALAR ? fast_with_scalar(k, ops[0], ops[1])
                                      : fast_unchecked(k, ops[0], ops[1]);
    }
    return NULL;
}

static PyObject *kernel_vectorcall(KernelObject *k, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL && n >= 2) {
        PyObject *r = kernel_call_fast(k, args + 1, n - 1);
        if (r != NULL || PyErr_Occurred()) return r;
    }
    return PyObject_Vectorcall(k->reference, args, nargsf, kwnames);
}

/* the binding's call of a kernel found in a table: a kernel of this type is run
 * without boxing the key set (the fast path ignores it) */
PyObject *run_kernel(PyObject *kernel, long long ks, PyObject *const *ops, int n) {
    if (Py_TYPE(kernel) == &KernelType) {
        PyObject *r = kernel_call_fast((KernelObject *)kernel, ops, n);
        if (r != NULL || PyErr_Occurred()) return r;
    }
    PyObject *ks_obj = PyLong_FromLongLong(ks);
    if (ks_obj == NULL) return NULL;
    PyObject *args[3] = {ks_obj, ops[0], n > 1 ? ops[1] : NULL};
    PyObject *r = PyObject_Vectorcall(kernel, args, n + 1, NULL);
    Py_DECREF(ks_obj);
    return r;
}

/* Note [Kernel references]: a table slot is a borrowed reference, and the kernel may
 * run Python code (its reference twin, a compile) during which another thread rebuilds
 * the table and drops the slot's last reference: the call holds its own. */
PyObject *run_table_kernel(PyObject *table, int i, long long ks, PyObject *const *ops, int n) {
    PyObject *kernel = PyList_GET_ITEM(table, i);
    Py_INCREF(kernel);
    PyObject *r = run_kernel(kernel, ks, ops, n);
    Py_DECREF(kernel);
    return r;
}

static int kernel_read_twin(KernelObject *k) {
    PyObject *ref = k->reference;
    PyObject *fast_out = PyObject_GetAttrString(ref, "fast_out");
    PyObject *results = PyObject_GetAttrString(ref, "results");
    PyObject *bounds = PyObject_GetAttrString(ref, "bounds");
    PyObject *arity = PyObject_GetAttrString(ref, "arity");
    PyObject *form = PyObject_GetAttrString(ref, "form");
    PyObject *limit = PyObject_GetAttrString(ref, "limit");
    k->loops = PyObject_GetAttrString(ref, "loops");
    int ok = fast_out && results && bounds && arity && form && limit && k->loops &&
             PyTuple_Check(fast_out) && PyTuple_Check(results) && PyTuple_Check(bounds);
    if (ok && (PyTuple_GET_SIZE(fast_out) > n_dtypes || PyTuple_GET_SIZE(results) > n_dtypes ||
               PyTuple_GET_SIZE(bounds) > n_dtypes)) {
        PyErr_SetString(PyExc_ValueError, "ElementwiseKernel: more dtypes than set_dtypes()");
        ok = 0;
    } else if (!ok && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError, "ElementwiseKernel: fast_out, results and bounds "
                        "must be tuples");
    }
    if (ok) {
        k->arity = (int)PyLong_AsLong(arity);
        k->form = (int)PyLong_AsLong(form);
        double lim = PyFloat_Check(limit) ? PyFloat_AsDouble(limit) : (double)PyLong_AsLongLong(limit);
        k->limit = lim >= 9.0e18 ? LLONG_MAX : (long long)lim;
        for (int i = 0; i < MAX_DTYPES; i++) {
            k->out_index[i] = k->result_index[i] = -1;
            k->lo[i] = 1;
            k->hi[i] = 0;
            k->ulo[i] = 1;
            k->uhi[i] = 0;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fast_out); i++) {
            PyObject *d = PyTuple_GET_ITEM(fast_out, i);
            k->fast_out[i] = d;
            k->out_index[i] = d == Py_None ? -1 : dtype_index_of(d);
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(results); i++) {
            PyObject *d = PyTuple_GET_ITEM(results, i);
            k->results[i] = d;
            k->result_index[i] = d == Py_None ? -1 : dtype_index_of(d);
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(bounds) && ok; i++) {
            PyObject *b = PyTuple_GET_ITEM(bounds, i);
            if (b == Py_None) continue;
            if (!PyTuple_Check(b) || PyTuple_GET_SIZE(b) != 2) {
                PyErr_SetString(PyExc_TypeError, "ElementwiseKernel: bounds are (min, max)");
                ok = 0;
                break;
            }
            if (dtype_kinds[i] == 'u') {
                k->ulo[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(b, 0));
                k->uhi[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(b, 1));
            } else {
                k->lo[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(b, 0));
                k->hi[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(b, 1));
            }
            if (PyErr_Occurred()) ok = 0;
        }
        if (ok && PyErr_Occurred()) ok = 0;
        if (ok) k->tuples = PyTuple_Pack(3, fast_out, results, bounds);
        if (k->tuples == NULL) ok = 0;
    }
    Py_XDECREF(fast_out);
    Py_XDECREF(results);
    Py_XDECREF(bounds);
    Py_XDECREF(arity);
    Py_XDECREF(form);
    Py_XDECREF(limit);
    return ok ? 0 : -1;
}

static PyObject *kernel_from_twin(PyObject *reference, LoopCacheObject *cache) {
    if (n_dtypes == 0) {
        PyErr_SetString(PyExc_RuntimeError, "ElementwiseKernel: set_dtypes() was not called");
        return NULL;
    }
    KernelObject *k = (KernelObject *)KernelType.tp_alloc(&KernelType, 0);
    if (k == NULL) return NULL;
    k->vectorcall = (vectorcallfunc)kernel_vectorcall;
    Py_INCREF(reference);
    k->reference = reference;
    if (cache == NULL) {
        k->cache = (LoopCacheObject *)PyObject_CallNoArgs((PyObject *)&LoopCacheType);
        if (k->cache == NULL) {
            Py_DECREF(k);
            return NULL;
        }
    } else {
        Py_INCREF(cache);
        k->cache = cache;
    }
    if (kernel_read_twin(k) < 0) {
        Py_DECREF(k);
        return NULL;
    }
    return (PyObject *)k;
}

/* ElementwiseKernel(reference): the C kernel mirroring a reference.ElementwiseKernel */
static PyObject *kernel_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *reference;
    if (!PyArg_ParseTuple(args, "O:ElementwiseKernel", &reference)) return NULL;
    return kernel_from_twin(reference, NULL);
}

static PyObject *kernel_variant(KernelObject *k, PyObject *form) {
    PyObject *twin = PyObject_CallMethod(k->reference, "variant", "O", form);
    if (twin == NULL) return NULL;
    PyObject *v = kernel_from_twin(twin, k->cache);
    Py_DECREF(twin);
    if (v == NULL) return NULL;
    PyObject *variants = PyObject_GetAttrString((PyObject *)k, "_c_variants");
    if (variants == NULL) {
        PyErr_Clear();
        variants = PyList_New(0);
        if (variants == NULL || PyObject_SetAttrString((PyObject *)k, "_c_variants", variants) < 0) {
            Py_XDECREF(variants);
            Py_DECREF(v);
            return NULL;
        }
    }
    int failed = PyList_Append(variants, v);
    Py_DECREF(variants);
    if (failed) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
}

static PyObject *kernel_set_limit(KernelObject *k, PyObject *limit) {
    PyObject *r = PyObject_CallMethod(k->reference, "set_limit", "O", limit);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    double lim = PyFloat_Check(limit) ? PyFloat_AsDouble(limit) : (double)PyLong_AsLongLong(limit);
    if (PyErr_Occurred()) return NULL;
    long long value = lim >= 9.0e18 ? LLONG_MAX : (long long)lim;
    k->limit = value;
    PyObject *variants = PyObject_GetAttrString((PyObject *)k, "_c_variants");
    if (variants == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(variants); i++)
        ((KernelObject *)PyList_GET_ITEM(variants, i))->limit = value;
    Py_DECREF(variants);
    Py_RETURN_NONE;
}

static PyObject *kernel_get_attr_of_twin(KernelObject *k, void *name) {
    return PyObject_GetAttrString(k->reference, (const char *)name);
}

static PyGetSetDef kernel_getset[] = {
    {"name", (getter)kernel_get_attr_of_twin, NULL, NULL, "name"},
    {"arity", (getter)kernel_get_attr_of_twin, NULL, NULL, "arity"},
    {"form", (getter)kernel_get_attr_of_twin, NULL, NULL, "form"},
    {"fast_out", (getter)kernel_get_attr_of_twin, NULL, NULL, "fast_out"},
    {"results", (getter)kernel_get_attr_of_twin, NULL, NULL, "results"},
    {"loops", (getter)kernel_get_attr_of_twin, NULL, NULL, "loops"},
    {"general", (getter)kernel_get_attr_of_twin, NULL, NULL, "general"},
    {"bounds", (getter)kernel_get_attr_of_twin, NULL, NULL, "bounds"},
    {"limit", (getter)kernel_get_attr_of_twin, NULL, NULL, "limit"},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyMemberDef kernel_members[] = {
    {"reference", T_OBJECT, offsetof(KernelObject, reference), READONLY, "the Python twin"},
    {NULL},
};

static PyMethodDef kernel_methods[] = {
    {"variant", (PyCFunction)kernel_variant, METH_O, "the same kernel in another form"},
    {"set_limit", (PyCFunction)kernel_set_limit, METH_O, "the size limit of the fast path"},
    {NULL},
};

static int kernel_traverse(KernelObject *k, visitproc visit, void *arg) {
    Py_VISIT(k->reference);
    Py_VISIT(k->loops);
    Py_VISIT(k->cache);
    Py_VISIT(k->dict);
    Py_VISIT(k->tuples);
    return 0;
}

static int kernel_clear(KernelObject *k) {
    Py_CLEAR(k->reference);
    Py_CLEAR(k->loops);
    Py_CLEAR(k->cache);
    Py_CLEAR(k->dict);
    Py_CLEAR(k->tuples);
    return 0;
}

static void kernel_dealloc(KernelObject *k) {
    PyObject_GC_UnTrack(k);
    kernel_clear(k);
    Py_TYPE(k)->tp_free((PyObject *)k);
}

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.ElementwiseKernel",
    .tp_doc = "The dense fast path of an elementwise operator (Note [Fast path]), in C.",
    .tp_basicsize = sizeof(KernelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = kernel_new,
    .tp_dealloc = (destructor)kernel_dealloc,
    .tp_traverse = (traverseproc)kernel_traverse,
    .tp_clear = (inquiry)kernel_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(KernelObject, vectorcall),
    .tp_dictoffset = offsetof(KernelObject, dict),
    .tp_getset = kernel_getset,
    .tp_members = kernel_members,
    .tp_methods = kernel_methods,
};

/* ------------------------------------------------------------------ ReductionKernel
 * Note [C reductions]: a fold (sum, prod, max, min, all, any) of a dense, C-contiguous
 * CPU tensor over its leading or its trailing axes, below the size limit, runs the
 * backend's own fold templates (compiled as C functions: loops.address(LOOP_ROWS or
 * LOOP_COLUMNS, i)) on the storage seen as a (rows, cols) array -- exactly what the
 * Python kernel's rows view gives for these layouts -- into an accumulator C
 * allocated and filled with the start value; the result is cast and reshaped as the
 * Python kernel does. mean is the sum's fold into float64 divided by the count, as
 * the Python kernel's _mean; argmax and argmin fold indices into a zeroed int64
 * accumulator beside each row's best value, which starts from the row's first; var,
 * std and vector_norm are Note [C moments]. Everything else (a dtype= argument, other
 * axes or layouts, an empty axis without identity or of a mean, big inputs: parallel
 * loops) is the Python kernel. */

typedef void (*fold_t)(void *, void *, long long, long long);
typedef void (*arg_fold_t)(void *, void *, void *, long long, long long);
enum { START_ZERO, START_ONE, START_TRUE, START_FALSE, START_FIRST };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *reference;  /* the Python kernel: every other call */
    PyObject *spec;       /* the backend's FoldSpec: .address(form, index) */
    PyObject *dict;
    int has_dtype;        /* sum, prod: (x, axis, dtype, keepdims) */
    int mean;             /* divide the float64 sums by the count */
    int arg;              /* argmax, argmin: indices, beside each row's best value */
    int moments;          /* var, std, vector_norm: Note [C moments] */
    int centered;         /* var, std: the deviations from the mean (else from zero) */
    int root;             /* std, vector_norm: the square root of the result */
    int start;
    long long limit;
    int acc_index[MAX_DTYPES], result_index[MAX_DTYPES];
    void *loops[4][MAX_DTYPES];  /* [rows, columns, deviation rows, columns][dtype index] */
} ReductionObject;

static PyTypeObject ReductionType;

static void *reduction_loop(ReductionObject *r, int form, int i) {
    void **slot = &r->loops[form - LOOP_ROWS][i];
    if (*slot != NULL) return *slot;
    PyObject *got = PyObject_CallMethod(r->spec, "address", "ii", form, i);
    if (got == NULL) return NULL;
    *slot = PyLong_AsVoidPtr(got);
    Py_DECREF(got);
    return *slot;
}

static int fill_start(ReductionObject *r, PyArrayObject *acc, const char *x, npy_intp rows,
                      npy_intp cols, int columns) {
    char *p = PyArray_DATA(acc);
    npy_intp n = PyArray_SIZE(acc), item = PyArray_ITEMSIZE(acc);
    switch (r->start) {
    case START_ZERO:
    case START_FALSE:
        memset(p, 0, n * item);
        return 0;
    case START_TRUE:
        memset(p, 1, n * item);
        return 0;
    case START_ONE: {
        PyObject *one = PyLong_FromLong(1);
        int failed = one == NULL || PyArray_FillWithScalar(acc, one) < 0;
        Py_XDECREF(one);
        return failed ? -1 : 0;
    }
    default:  /* each row's (column's) first value: the input's dtype is the accumulator's */
        if (columns) {
            memcpy(p, x, n * item);
        } else {
            for (npy_intp k = 0; k < rows; k++) memcpy(p + k * item, x + k * cols * item, item);
        }
        return 0;
    }
}

/* Note [C moments]: var and std (x, axis, correction, keepdims) and vector_norm's
 * 2-norm (x, axis, keepdims, ord=2.0) fold in two passes as the Python kernel does
 * (reductions.py, _moments_of and vector_norm): the sum's fold into float64 divided by
 * the count gives each row's mean (var, std; the norm's "mean" is zero), then the
 * deviations template (spec.address(LOOP_DEVIATION_ROWS or _COLUMNS, i)) sums the
 * squared deviations from it into the zeroed float64 accumulator; var divides by
 * count - correction (NaN where that is not positive), std and the norm take the square
 * root. Squares of float32 values in float64 neither overflow nor underflow; float64
 * ones do where NumPy's do. Other ords, and an empty axis of var or std, are the
 * Python kernel. */
static int moments_arguments(ReductionObject *r, PyObject *const *args, PyObject **keepdims,
                             double *correction) {
    PyObject *scalar = r->centered ? args[3] : args[4];
    *keepdims = r->centered ? args[4] : args[3];
    if (!PyFloat_CheckExact(scalar) && !PyLong_CheckExact(scalar)) return -1;
    double v = PyFloat_CheckExact(scalar) ? PyFloat_AS_DOUBLE(scalar) : PyLong_AsDouble(scalar);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (!r->centered && v != 2.0) return -1;
    *correction = r->centered ? v : 0.0;
    return 0;
}

static int moments_fold(ReductionObject *r, int i, int columns, const char *data,
                        PyArrayObject *acc, npy_intp reduced, npy_intp kept, double correction) {
    arg_fold_t deviations = (arg_fold_t)reduction_loop(
        r, columns ? LOOP_DEVIATION_COLUMNS : LOOP_DEVIATION_ROWS, i);
    fold_t sum = r->centered ? (fold_t)reduction_loop(r, columns ? LOOP_COLUMNS : LOOP_ROWS, i)
                             : NULL;
    if (deviations == NULL || (r->centered && sum == NULL)) return -1;
    double *means = PyMem_Calloc(kept > 0 ? kept : 1, sizeof(double));
    if (means == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    double *m2 = PyArray_DATA(acc);
    npy_intp nrows = columns ? reduced : kept, ncols = columns ? kept : reduced;
    if (reduced > 0 && kept > 0) {
        if (sum != NULL) {
            sum((void *)data, means, nrows, ncols);
            for (npy_intp k = 0; k < kept; k++) means[k] /= (double)reduced;
        }
        deviations((void *)data, m2, means, nrows, ncols);
    }
    PyMem_Free(means);
    double dof = (double)reduced - correction;
    for (npy_intp k = 0; k < kept; k++) {
        double v = !r->centered ? m2[k] : dof > 0 ? m2[k] / dof : NAN;
        m2[k] = r->root ? sqrt(v) : v;
    }
    return 0;
}

static PyObject *reduction_fast(ReductionObject *r, PyObject *const *args, Py_ssize_t n) {
    if (n != (r->has_dtype || r->moments ? 5 : 4)) return NULL;
    PyObject *x_obj = args[1], *axis = args[2], *keepdims = args[n - 1];
    double correction = 0.0;
    if (r->moments && moments_arguments(r, args, &keepdims, &correction) < 0) return NULL;
    if (r->has_dtype && args[3] != Py_None) return NULL;
    if (!IS_TENSOR(x_obj) || !PyTuple_CheckExact(axis) || !PyBool_Check(keepdims)) return NULL;
    TensorObject *t = T(x_obj);
    if (!TENSOR_ARGS_OK(t) || t->ks != 1) return NULL;
    int i = t->dtype_index, acc_i = r->acc_index[i], res_i = r->result_index[i];
    if (acc_i < 0 || res_i < 0) return NULL;
    PyArrayObject *f = flat_array(t, i);
    if (f == NULL || !PyArray_CheckExact(t->data)) return NULL;
    PyArrayObject *x = (PyArrayObject *)t->data;
    int nd = PyArray_NDIM(x);
    Py_ssize_t m = PyTuple_GET_SIZE(axis);
    if (m == 0 || m > nd || PyArray_SIZE(f) >= r->limit) return NULL;
    int prefix = 1, suffix = 1;
    for (Py_ssize_t k = 0; k < m; k++) {
        long a = PyLong_AsLong(PyTuple_GET_ITEM(axis, k));
        if (a == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return NULL;
        }
        prefix &= a == k;
        suffix &= a == nd - m + k;
    }
    if (!prefix && !suffix) return NULL;
    int columns = !suffix;  /* a reduction over leading axes folds down the columns */
    npy_intp reduced = 1, kept = 1;
    for (int d = 0; d < nd; d++) {
        int is_reduced = columns ? d < m : d >= nd - m;
        if (is_reduced) reduced *= PyArray_DIMS(x)[d];
        else kept *= PyArray_DIMS(x)[d];
    }
    if (reduced == 0 && (r->start == START_FIRST || r->mean || r->centered))
        return NULL;  /* an error, NaN */
    fold_t loop = r->moments ? NULL : (fold_t)reduction_loop(r, columns ? LOOP_COLUMNS : LOOP_ROWS, i);
    if (loop == NULL && !r->moments) return NULL;
    Py_INCREF(dtype_descrs[acc_i]);
    PyArrayObject *acc = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, dtype_descrs[acc_i], 1, &kept, NULL, NULL, 0, NULL);
    if (acc == NULL) return NULL;
    const char *data = PyArray_DATA(f);
    PyArrayObject *best = NULL;  /* argmax, argmin: the values, in the input's dtype */
    if (r->arg) {
        Py_INCREF(dtype_descrs[i]);
        best = (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, dtype_descrs[i], 1, &kept,
                                                     NULL, NULL, 0, NULL);
        if (best == NULL) {
            Py_DECREF(acc);
            return NULL;
        }
        memset(PyArray_DATA(acc), 0, kept * PyArray_ITEMSIZE(acc));
    }
    if (fill_start(r, best != NULL ? best : acc, data, columns ? reduced : kept,
                   columns ? kept : reduced, columns) < 0) {
        Py_XDECREF(best);
        Py_DECREF(acc);
        return NULL;
    }
    if (r->moments) {
        if (moments_fold(r, i, columns, data, acc, reduced, kept, correction) < 0) {
            Py_DECREF(acc);
            return NULL;
        }
    } else if (reduced > 0 && kept > 0 && best != NULL)
        ((arg_fold_t)loop)((void *)data, PyArray_DATA(acc), PyArray_DATA(best),
                           columns ? reduced : kept, columns ? kept : reduced);
    else if (reduced > 0 && kept > 0)
        loop((void *)data, PyArray_DATA(acc), columns ? reduced : kept, columns ? kept : reduced);
    Py_XDECREF(best);
    if (r->mean) {  /* a float64 accumulator: FoldSpec gives none other to a mean */
        double *sums = PyArray_DATA(acc);
        for (npy_intp k = 0; k < kept; k++) sums[k] /= (double)reduced;
    }
    PyArrayObject *flat = acc;
    if (res_i != acc_i) {
        Py_INCREF(dtype_descrs[res_i]);
        flat = (PyArrayObject *)PyArray_CastToType(acc, dtype_descrs[res_i], 0);
        Py_DECREF(acc);
        if (flat == NULL) return NULL;
    }
    /* the result's shape: the kept dims, with 1s for the reduced ones under keepdims */
    npy_intp dims[NPY_MAXDIMS];
    int out_nd = 0, keep = keepdims == Py_True;
    for (int d = 0; d < nd; d++) {
        int is_reduced = columns ? d < m : d >= nd - m;
        if (!is_reduced) dims[out_nd++] = PyArray_DIMS(x)[d];
        else if (keep) dims[out_nd++] = 1;
    }
    PyObject *shape = shape_tuple(out_nd, dims, NULL, NULL);
    if (shape == NULL) {
        Py_DECREF(flat);
        return NULL;
    }
    PyObject *out_data;
    if (out_nd == 1) {
        Py_INCREF(flat);
        out_data = (PyObject *)flat;
    } else {
        Py_INCREF(dtype_descrs[res_i]);
        out_data = PyArray_NewFromDescr(&PyArray_Type, dtype_descrs[res_i], out_nd, dims, NULL,
                                        PyArray_DATA(flat), NPY_ARRAY_CARRAY, NULL);
        Py_INCREF(flat);
        if (out_data == NULL || PyArray_SetBaseObject((PyArrayObject *)out_data, (PyObject *)flat) < 0) {
            Py_XDECREF(out_data);
            Py_DECREF(flat);
            Py_DECREF(shape);
            if (out_data == NULL) Py_DECREF(flat);
            return NULL;
        }
    }
    TensorObject *out = (TensorObject *)tensor_type->tp_alloc(tensor_type, 0);
    if (out == NULL) {
        Py_DECREF(out_data);
        Py_DECREF(flat);
        Py_DECREF(shape);
        return NULL;
    }
    out->data = out_data;
    out->flat = (PyObject *)flat;
    Py_INCREF(cpu_ks);
    out->ks_obj = cpu_ks;
    out->ks = 1;
    Py_INCREF(dtype_objs[res_i]);
    out->dtype = dtype_objs[res_i];
    out->dtype_index = res_i;
    out->shape = shape;
    return (PyObject *)out;
}

static PyObject *reduction_vectorcall(ReductionObject *r, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL) {
        PyObject *out = reduction_fast(r, args, n);
        if (out != NULL || PyErr_Occurred()) return out;
    }
    return PyObject_Vectorcall(r->reference, args, nargsf, kwnames);
}

static int dtype_index_list(PyObject *seq, int *out) {
    PyObject *items = PySequence_Fast(seq, "a list of dtypes");
    if (items == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    for (int i = 0; i < MAX_DTYPES; i++) out[i] = -1;
    for (Py_ssize_t i = 0; i < n && i < MAX_DTYPES; i++) {
        PyObject *d = PySequence_Fast_GET_ITEM(items, i);
        out[i] = d == Py_None ? -1 : dtype_index_of(d);
    }
    Py_DECREF(items);
    return 0;
}

/* ReductionKernel(kernel, spec): the fold `kernel` with the fast path of `spec` */
static PyObject *reduction_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *kernel, *spec;
    if (!PyArg_ParseTuple(args, "OO:ReductionKernel", &kernel, &spec)) return NULL;
    ReductionObject *r = (ReductionObject *)type->tp_alloc(type, 0);
    if (r == NULL) return NULL;
    r->vectorcall = (vectorcallfunc)reduction_vectorcall;
    Py_INCREF(kernel);
    r->reference = kernel;
    Py_INCREF(spec);
    r->spec = spec;
    PyObject *has_dtype = PyObject_GetAttrString(spec, "has_dtype");
    PyObject *mean = PyObject_GetAttrString(spec, "mean");
    PyObject *arg = PyObject_GetAttrString(spec, "arg");
    PyObject *moments = PyObject_GetAttrString(spec, "moments");
    PyObject *centered = PyObject_GetAttrString(spec, "centered");
    PyObject *root = PyObject_GetAttrString(spec, "root");
    PyObject *start = PyObject_GetAttrString(spec, "start");
    PyObject *results = PyObject_GetAttrString(spec, "results");
    PyObject *accs = PyObject_GetAttrString(spec, "accumulators");
    PyObject *limit = PyObject_GetAttrString(spec, "limit");
    int ok = has_dtype && mean && arg && moments && centered && root && start && results && accs && limit &&
             dtype_index_list(results, r->result_index) == 0 &&
             dtype_index_list(accs, r->acc_index) == 0;
    if (ok) {
        r->has_dtype = PyObject_IsTrue(has_dtype);
        r->mean = PyObject_IsTrue(mean);
        r->arg = PyObject_IsTrue(arg);
        r->moments = PyObject_IsTrue(moments);
        r->centered = PyObject_IsTrue(centered);
        r->root = PyObject_IsTrue(root);
        if (PyUnicode_Check(start)) r->start = START_FIRST;
        else if (PyBool_Check(start)) r->start = start == Py_True ? START_TRUE : START_FALSE;
        else r->start = PyLong_AsLong(start) == 1 ? START_ONE : START_ZERO;
        double lim = PyFloat_Check(limit) ? PyFloat_AsDouble(limit) : (double)PyLong_AsLongLong(limit);
        r->limit = lim >= 9.0e18 ? LLONG_MAX : (long long)lim;
        ok = !PyErr_Occurred();
    }
    Py_XDECREF(has_dtype);
    Py_XDECREF(mean);
    Py_XDECREF(arg);
    Py_XDECREF(moments);
    Py_XDECREF(centered);
    Py_XDECREF(root);
    Py_XDECREF(start);
    Py_XDECREF(results);
    Py_XDECREF(accs);
    Py_XDECREF(limit);
    if (!ok) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

static PyObject *reduction_set_limit(ReductionObject *r, PyObject *limit) {
    double lim = PyFloat_Check(limit) ? PyFloat_AsDouble(limit) : (double)PyLong_AsLongLong(limit);
    if (PyErr_Occurred()) return NULL;
    r->limit = lim >= 9.0e18 ? LLONG_MAX : (long long)lim;
    Py_RETURN_NONE;
}

static PyMethodDef reduction_methods[] = {
    {"set_limit", (PyCFunction)reduction_set_limit, METH_O, "the size limit of the fast path"},
    {NULL},
};

static PyMemberDef reduction_members[] = {
    {"reference", T_OBJECT, offsetof(ReductionObject, reference), READONLY, "the Python kernel"},
    {"spec", T_OBJECT, offsetof(ReductionObject, spec), READONLY, "the fold's description"},
    {NULL},
};

static int reduction_traverse(ReductionObject *r, visitproc visit, void *arg) {
    Py_VISIT(r->reference);
    Py_VISIT(r->spec);
    Py_VISIT(r->dict);
    return 0;
}

static int reduction_clear(ReductionObject *r) {
    Py_CLEAR(r->reference);
    Py_CLEAR(r->spec);
    Py_CLEAR(r->dict);
    return 0;
}

static void reduction_dealloc(ReductionObject *r) {
    PyObject_GC_UnTrack(r);
    reduction_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyTypeObject ReductionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.ReductionKernel",
    .tp_doc = "A fold with the C core's fast path (Note [C reductions]).",
    .tp_basicsize = sizeof(ReductionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = reduction_new,
    .tp_dealloc = (destructor)reduction_dealloc,
    .tp_traverse = (traverseproc)reduction_traverse,
    .tp_clear = (inquiry)reduction_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ReductionObject, vectorcall),
    .tp_dictoffset = offsetof(ReductionObject, dict),
    .tp_getset = dict_getset,
    .tp_members = reduction_members,
    .tp_methods = reduction_methods,
};

/* ------------------------------------------------------------------ RowsKernel
 * Note [C rows]: an operator along one axis whose result has its input's shape and dtype
 * (softmax, log_softmax, cumulative_sum). On a dense, C-contiguous CPU tensor below the
 * size limit, with the axis the last one (or None for a 1-D tensor) and every argument
 * after it None or False (the rare options at their defaults), the backend's loop over
 * rows (spec.address(LOOP_ROWS, i): the template the Python kernel runs, compiled as a C
 * function) writes a new tensor of that shape, both storages seen as (rows, n) arrays.
 * Everything else (other axes, layouts and dtypes, empty or big inputs) is the Python
 * kernel. */

typedef void (*rows_t)(void *, void *, long long, long long);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *reference;  /* the Python kernel: every other call */
    PyObject *spec;       /* the backend's RowsSpec: .address(LOOP_ROWS, index) */
    PyObject *dict;
    long long limit;
    int fast[MAX_DTYPES];  /* whether dtype index i has a loop */
    void *loops[MAX_DTYPES];
} RowsObject;

static PyTypeObject RowsType;

static rows_t rows_loop(RowsObject *r, int i) {
    if (r->loops[i] != NULL) return (rows_t)r->loops[i];
    PyObject *got = PyObject_CallMethod(r->spec, "address", "ii", LOOP_ROWS, i);
    if (got == NULL) return NULL;
    r->loops[i] = PyLong_AsVoidPtr(got);
    Py_DECREF(got);
    return (rows_t)r->loops[i];
}

static PyObject *rows_fast(RowsObject *r, PyObject *const *args, Py_ssize_t n) {
    if (n < 3 || !IS_TENSOR(args[1])) return NULL;
    for (Py_ssize_t k = 3; k < n; k++)
        if (args[k] != Py_None && args[k] != Py_False) return NULL;
    /* its key set may hold AUTOGRAD (the layer above redispatched): the storage decides,
     * as for ElementwiseKernel */
    TensorObject *t = T(args[1]);
    if (!TENSOR_ARGS_OK(t) || !PyTuple_CheckExact(t->shape)) return NULL;
    int i = t->dtype_index;
    if (!r->fast[i]) return NULL;
    PyArrayObject *f = flat_array(t, i);
    if (f == NULL) return NULL;
    Py_ssize_t nd = PyTuple_GET_SIZE(t->shape);
    PyObject *axis = args[2];
    if (nd == 0 || (axis == Py_None && nd != 1)) return NULL;
    if (axis != Py_None) {
        if (!PyLong_CheckExact(axis)) return NULL;
        long a = PyLong_AsLong(axis);
        if (a == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return NULL;
        }
        if (a != -1 && a != nd - 1) return NULL;
    }
    npy_intp size = PyArray_SIZE(f), count = 1, cols = 0;
    for (Py_ssize_t d = 0; d < nd; d++) {  /* the shape must describe the storage */
        cols = PyLong_AsSsize_t(PyTuple_GET_ITEM(t->shape, d));
        if (cols < 0) {
            PyErr_Clear();
            return NULL;
        }
        count *= cols;
    }
    if (count != size || size == 0 || size >= r->limit) return NULL;
    rows_t loop = rows_loop(r, i);
    if (loop == NULL) return NULL;
    void *o;
    PyObject *out = new_output(t->shape, i, size, &o);
    if (out != NULL) loop(PyArray_DATA(f), o, (long long)(size / cols), (long long)cols);
    return out;
}

static PyObject *rows_vectorcall(RowsObject *r, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL) {
        PyObject *out = rows_fast(r, args, n);
        if (out != NULL || PyErr_Occurred()) return out;
    }
    return PyObject_Vectorcall(r->reference, args, nargsf, kwnames);
}

static int set_rows_limit(RowsObject *r, PyObject *limit) {
    double lim = PyFloat_Check(limit) ? PyFloat_AsDouble(limit) : (double)PyLong_AsLongLong(limit);
    if (PyErr_Occurred()) return -1;
    r->limit = lim >= 9.0e18 ? LLONG_MAX : (long long)lim;
    return 0;
}

/* RowsKernel(kernel, spec): `kernel` with the fast path of `spec` (.dtypes: a loop's
 * dtype index is in it; .limit) */
static PyObject *rows_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *kernel, *spec;
    if (!PyArg_ParseTuple(args, "OO:RowsKernel", &kernel, &spec)) return NULL;
    RowsObject *r = (RowsObject *)type->tp_alloc(type, 0);
    if (r == NULL) return NULL;
    r->vectorcall = (vectorcallfunc)rows_vectorcall;
    Py_INCREF(kernel);
    r->reference = kernel;
    Py_INCREF(spec);
    r->spec = spec;
    int indices[MAX_DTYPES];
    PyObject *dtypes = PyObject_GetAttrString(spec, "dtypes");
    PyObject *limit = PyObject_GetAttrString(spec, "limit");
    int ok = dtypes && limit && dtype_index_list(dtypes, indices) == 0 &&
             set_rows_limit(r, limit) == 0;
    for (int i = 0; ok && i < MAX_DTYPES; i++) r->fast[i] = indices[i] == i;
    Py_XDECREF(dtypes);
    Py_XDECREF(limit);
    if (!ok) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

static PyObject *rows_set_limit(RowsObject *r, PyObject *limit) {
    if (set_rows_limit(r, limit) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef rows_methods[] = {
    {"set_limit", (PyCFunction)rows_set_limit, METH_O, "the size limit of the fast path"},
    {NULL},
};

static PyMemberDef rows_members[] = {
    {"reference", T_OBJECT, offsetof(RowsObject, reference), READONLY, "the Python kernel"},
    {"spec", T_OBJECT, offsetof(RowsObject, spec), READONLY, "the loops' description"},
    {NULL},
};

static int rows_traverse(RowsObject *r, visitproc visit, void *arg) {
    Py_VISIT(r->reference);
    Py_VISIT(r->spec);
    Py_VISIT(r->dict);
    return 0;
}

static int rows_clear(RowsObject *r) {
    Py_CLEAR(r->reference);
    Py_CLEAR(r->spec);
    Py_CLEAR(r->dict);
    return 0;
}

static void rows_dealloc(RowsObject *r) {
    PyObject_GC_UnTrack(r);
    rows_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyTypeObject RowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.RowsKernel",
    .tp_doc = "An operator along the last axis with the C core's fast path (Note [C rows]).",
    .tp_basicsize = sizeof(RowsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = rows_new,
    .tp_dealloc = (destructor)rows_dealloc,
    .tp_traverse = (traverseproc)rows_traverse,
    .tp_clear = (inquiry)rows_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(RowsObject, vectorcall),
    .tp_dictoffset = offsetof(RowsObject, dict),
    .tp_getset = dict_getset,
    .tp_members = rows_members,
    .tp_methods = rows_methods,
};

/* ------------------------------------------------------------------ FusedLoop */

/* reference.FusedLoop (Note [Fused loops]): every call whose inputs are what the loop was
 * made for runs here; any other goes to the twin, which says what is wrong. */
#define MAX_FUSED 64  /* operands of a group; a larger one is refused at construction */

typedef void (*fused_loop_t)(void **, long long, long long);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *reference;  /* the twin: its fields are the truth, its errors the errors */
    PyObject *shape;
    fused_loop_t loop;
    npy_intp size;                   /* of each output */
    long long rows, inner;           /* the loop's lengths */
    int n_inputs, n_outputs;
    int input_index[MAX_FUSED];      /* dtype index of each input */
    npy_intp input_size[MAX_FUSED];  /* size or 1 */
    int output_index[MAX_FUSED];
} FusedLoopObject;

static PyObject *fused_call(FusedLoopObject *f, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    void *pointers[MAX_FUSED];
    if (nargs != f->n_inputs || kwnames != NULL) goto twin;
    for (int k = 0; k < f->n_inputs; k++) {
        PyObject *a = args[k];
        if (!IS_TENSOR(a) || T(a)->dtype_index != f->input_index[k]) goto twin;
        PyArrayObject *flat = flat_array(T(a), f->input_index[k]);
        if (flat == NULL || PyArray_SIZE(flat) != f->input_size[k]) goto twin;
        pointers[k] = PyArray_DATA(flat);
    }
    PyObject *results[MAX_FUSED];
    for (int m = 0; m < f->n_outputs; m++) {
        results[m] = new_output(f->shape, f->output_index[m], f->size, &pointers[f->n_inputs + m]);
        if (results[m] == NULL) {
            for (int j = 0; j < m; j++) Py_DECREF(results[j]);
            return NULL;
        }
    }
    f->loop(pointers, f->rows, f->inner);
    if (f->n_outputs == 1) return results[0];
    PyObject *tuple = PyTuple_New(f->n_outputs);
    if (tuple == NULL) {
        for (int m = 0; m < f->n_outputs; m++) Py_DECREF(results[m]);
        return NULL;
    }
    for (int m = 0; m < f->n_outputs; m++) PyTuple_SET_ITEM(tuple, m, results[m]);
    return tuple;
twin:
    return PyObject_Vectorcall(f->reference, args, nargsf, kwnames);
}

/* each dtype of `dtypes` (a tuple) as its index, and each size of `sizes` (NULL: none) */
static int fused_operands(PyObject *items, int *index, npy_intp *sizes, int *count) {
    if (!PyTuple_Check(items) || PyTuple_GET_SIZE(items) > MAX_FUSED) {
        PyErr_SetString(PyExc_ValueError, "FusedLoop: too many operands");
        return -1;
    }
    *count = (int)PyTuple_GET_SIZE(items);
    for (int k = 0; k < *count; k++) {
        PyObject *item = PyTuple_GET_ITEM(items, k), *dtype = item;
        if (sizes != NULL) {  /* an input: (DType, size) */
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
                PyErr_SetString(PyExc_TypeError, "FusedLoop: an input is (dtype, size)");
                return -1;
            }
            dtype = PyTuple_GET_ITEM(item, 0);
            sizes[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
            if (sizes[k] == -1 && PyErr_Occurred()) return -1;
        }
        index[k] = dtype_index_of(dtype);
        if (index[k] < 0) {
            PyErr_SetString(PyExc_TypeError, "FusedLoop: not one of lamina's dtypes");
            return -1;
        }
    }
    return 0;
}

static PyObject *fused_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *reference;
    if (!PyArg_ParseTuple(args, "O:FusedLoop", &reference)) return NULL;
    FusedLoopObject *f = (FusedLoopObject *)type->tp_alloc(type, 0);
    if (f == NULL) return NULL;
    f->vectorcall = (vectorcallfunc)fused_call;
    Py_INCREF(reference);
    f->reference = reference;
    PyObject *address = PyObject_GetAttrString(reference, "address");
    PyObject *size = PyObject_GetAttrString(reference, "size");
    PyObject *rows = PyObject_GetAttrString(reference, "rows");
    PyObject *inner = PyObject_GetAttrString(reference, "inner");
    PyObject *inputs = PyObject_GetAttrString(reference, "inputs");
    PyObject *outputs = PyObject_GetAttrString(reference, "outputs");
    f->shape = PyObject_GetAttrString(reference, "shape");
    int failed = address == NULL || size == NULL || rows == NULL || inner == NULL ||
                 inputs == NULL || outputs == NULL || f->shape == NULL ||
                 !PyTuple_CheckExact(f->shape);
    if (!failed) {  /* the twin checked that the lengths fit the operands' sizes */
        f->loop = (fused_loop_t)PyLong_AsVoidPtr(address);
        f->size = PyLong_AsSsize_t(size);
        f->rows = PyLong_AsLongLong(rows);
        f->inner = PyLong_AsLongLong(inner);
        failed = PyErr_Occurred() != NULL ||
                 fused_operands(inputs, f->input_index, f->input_size, &f->n_inputs) < 0 ||
                 fused_operands(outputs, f->output_index, NULL, &f->n_outputs) < 0 ||
                 f->n_inputs + f->n_outputs > MAX_FUSED || f->n_outputs < 1;
        if (failed && !PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "FusedLoop: too many operands, or no output");
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError, "FusedLoop: the shape is a tuple");
    }
    Py_XDECREF(address);
    Py_XDECREF(size);
    Py_XDECREF(rows);
    Py_XDECREF(inner);
    Py_XDECREF(inputs);
    Py_XDECREF(outputs);
    if (failed) {
        Py_DECREF(f);
        return NULL;
    }
    return (PyObject *)f;
}

static int fused_traverse(FusedLoopObject *f, visitproc visit, void *arg) {
    Py_VISIT(f->reference);
    Py_VISIT(f->shape);
    return 0;
}

static int fused_clear(FusedLoopObject *f) {
    Py_CLEAR(f->reference);
    Py_CLEAR(f->shape);
    return 0;
}

static void fused_dealloc(FusedLoopObject *f) {
    PyObject_GC_UnTrack(f);
    fused_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* reference.FusedLoop.run: the call on a tuple or list of inputs (a plan's run) */
static PyObject *fused_run(FusedLoopObject *f, PyObject *inputs) {
    PyObject *seq = PySequence_Fast(inputs, "FusedLoop.run takes a sequence of inputs");
    if (seq == NULL) return NULL;
    PyObject *result = fused_call(f, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq),
                                  NULL);
    Py_DECREF(seq);
    return result;
}

PyObject *call_fused_run(PyObject *run, PyObject *const *args, Py_ssize_t n) {
    if (!PyCFunction_Check(run) || PyCFunction_GET_FUNCTION(run) != (PyCFunction)fused_run)
        return NULL;
    return fused_call((FusedLoopObject *)PyCFunction_GET_SELF(run), args, (size_t)n, NULL);
}

static PyMethodDef fused_methods[] = {
    {"run", (PyCFunction)fused_run, METH_O, "the loop on a sequence of inputs"},
    {NULL},
};

static PyMemberDef fused_members[] = {
    {"reference", T_OBJECT, offsetof(FusedLoopObject, reference), READONLY, "the Python twin"},
    {NULL},
};

static PyTypeObject FusedLoopType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.FusedLoop",
    .tp_doc = "A compiled plan's call of a fused elementwise loop (Note [Fused loops]), in C.",
    .tp_basicsize = sizeof(FusedLoopObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = fused_new,
    .tp_dealloc = (destructor)fused_dealloc,
    .tp_traverse = (traverseproc)fused_traverse,
    .tp_clear = (inquiry)fused_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FusedLoopObject, vectorcall),
    .tp_members = fused_members,
    .tp_methods = fused_methods,
};

/* time_loop(address, arity, a, b, out, k): the raw cost of a loop (the overhead tool's
 * "raw kernel" row of the C stack): k calls on preallocated contiguous arrays */
static PyObject *mod_time_loop(PyObject *m, PyObject *args) {
    PyObject *addr;
    int arity;
    PyArrayObject *a, *b, *out;
    long long k;
    if (!PyArg_ParseTuple(args, "OiO!O!O!L:time_loop", &addr, &arity, &PyArray_Type, &a,
                          &PyArray_Type, &b, &PyArray_Type, &out, &k))
        return NULL;
    void *p = PyLong_AsVoidPtr(addr);
    if (p == NULL) return NULL;
    npy_intp n = PyArray_SIZE(out);
    if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_IS_C_CONTIGUOUS(b) ||
        !PyArray_IS_C_CONTIGUOUS(out) || PyArray_SIZE(a) != n || PyArray_SIZE(b) != n ||
        PyArray_ITEMSIZE(a) != PyArray_ITEMSIZE(out) || PyArray_ITEMSIZE(b) != PyArray_ITEMSIZE(out)) {
        PyErr_SetString(PyExc_ValueError, "time_loop: contiguous arrays of one size and dtype");
        return NULL;
    }
    for (long long r = 0; r < k; r++) {
        if (arity == 1)
            ((loop1_t)p)(PyArray_DATA(a), PyArray_DATA(out), (long long)n);
        else
            ((loop2_t)p)(PyArray_DATA(a), PyArray_DATA(b), PyArray_DATA(out), (long long)n);
    }
    Py_RETURN_NONE;
}

/* numpy_loop(ufunc, dtype_index): (function, data) addresses of the ufunc's loop with
 * every operand of that dtype, or None (Note [NumPy loops on threads]) */
static PyObject *mod_numpy_loop(PyObject *m, PyObject *args) {
    PyObject *u;
    int i;
    if (!PyArg_ParseTuple(args, "Oi:numpy_loop", &u, &i)) return NULL;
    if (i < 0 || i >= n_dtypes) {
        PyErr_SetString(PyExc_ValueError, "numpy_loop: not a dtype index");
        return NULL;
    }
    PyUFuncGenericFunction fn;
    void *data;
    if (!ufunc_loop(u, dtype_descrs[i]->type_num, &fn, &data)) Py_RETURN_NONE;
    return Py_BuildValue("(NN)", PyLong_FromVoidPtr((void *)fn), PyLong_FromVoidPtr(data));
}

static PyObject *mod_numpy_part_address(PyObject *m, PyObject *noargs) {
    return PyLong_FromVoidPtr((void *)run_numpy_part);
}

static PyMethodDef fastpath_functions[] = {
    {"numpy_loop", mod_numpy_loop, METH_VARARGS, "a NumPy ufunc's loop for one dtype"},
    {"numpy_part_address", mod_numpy_part_address, METH_NOARGS,
     "the C function running a NumPy loop on one part of a job"},
    {"time_loop", mod_time_loop, METH_VARARGS, "k calls of a loop on preallocated arrays"},
    {NULL},
};

int init_fastpath(PyObject *m) {
    out_kwnames = Py_BuildValue("(s)", "out");
    if (out_kwnames == NULL || PyType_Ready(&LoopCacheType) < 0 ||
        PyType_Ready(&KernelType) < 0 || PyType_Ready(&ReductionType) < 0 ||
        PyType_Ready(&RowsType) < 0 || PyType_Ready(&FusedLoopType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "ElementwiseKernel", (PyObject *)&KernelType) < 0 ||
        PyModule_AddObjectRef(m, "ReductionKernel", (PyObject *)&ReductionType) < 0 ||
        PyModule_AddObjectRef(m, "RowsKernel", (PyObject *)&RowsType) < 0 ||
        PyModule_AddObjectRef(m, "FusedLoop", (PyObject *)&FusedLoopType) < 0)
        return -1;
    return PyModule_AddFunctions(m, fastpath_functions);
}
