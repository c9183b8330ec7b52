/* lamina.dispatch._core -- the per-call core in C.
 *
 * Note [Two cores] (reference.py): this file implements exactly the algorithm of the
 * pure-Python reference, dispatch/reference.py, with the same names: the Tensor's
 * fields (TensorBase), an operator's table (OperatorTable), the bindings of elementwise
 * operators (Binding), the dense elementwise fast path (ElementwiseKernel) and Tensor's
 * operator methods (set_slot). It handles the common case itself -- tensors of the
 * Tensor type, dense, contiguous, same shape and dtype, below the kernel's size limit --
 * and hands every other call to the reference (a binding's `fallback`, a kernel's
 * `reference` twin), so errors and corner cases are the same Python code in both cores.
 *
 * Note [C safety]: nothing here trusts a field it did not set: before a loop runs, the
 * operands' storage is checked to be C-contiguous NumPy arrays of the dtype the tensor
 * claims and of the same size, so a tensor assembled wrongly in Python takes the
 * reference's path (and its errors) instead of reading out of bounds. Every Python object
 * is touched with the GIL held; the loops run with it too (they are short: the fast path
 * ends below the parallel threshold).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <fenv.h>
#include <stdint.h>

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/ufuncobject.h>

#define MAX_DTYPES 32

/* ------------------------------------------------------------------ dtypes */

/* set_dtypes(): per dtype index, what the fast path needs of lamina's dtypes */
static PyObject *dtype_objs[MAX_DTYPES];     /* the DType objects */
static PyArray_Descr *dtype_descrs[MAX_DTYPES];  /* their NumPy dtypes */
static char dtype_kinds[MAX_DTYPES];         /* 'b', 'i', 'u', 'f', 'c' */
static int n_dtypes = 0;

static int dtype_index_of(PyObject *dtype) {
    for (int i = 0; i < n_dtypes; i++)
        if (dtype_objs[i] == dtype) return i;
    return -1;
}

/* ------------------------------------------------------------------ TensorBase */

typedef struct {
    PyObject_HEAD
    PyObject *data;     /* _data */
    PyObject *flat;     /* _flat: a 1-D alias of a C-contiguous storage, or None */
    PyObject *ks_obj;   /* _ks, as the int Python code reads */
    PyObject *dtype;    /* _dtype */
    PyObject *shape;    /* _shape */
    PyObject *grad_fn;  /* _grad_fn */
    PyObject *dict;
    PyObject *weakreflist;
    PyObject *accumulator;  /* _accumulator: a leaf's AccumulateGrad node (None: NULL) */
    long long ks;       /* _ks, for C */
    int dtype_index;    /* _dtype's index, -1 when it is not one of set_dtypes() */
    int output_nr;      /* _output_nr: which output of _grad_fn this tensor is */
} TensorObject;

static PyTypeObject TensorBaseType;
static PyTypeObject *tensor_type = NULL;  /* set_tensor_type(): the class of outputs */
static PyObject *cpu_ks;                  /* the int 1: the CPU key */

#define IS_TENSOR(o) PyObject_TypeCheck((o), &TensorBaseType)
#define T(o) ((TensorObject *)(o))

static int tensor_traverse(TensorObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->data);
    Py_VISIT(self->flat);
    Py_VISIT(self->ks_obj);
    Py_VISIT(self->dtype);
    Py_VISIT(self->shape);
    Py_VISIT(self->grad_fn);
    Py_VISIT(self->dict);
    Py_VISIT(self->accumulator);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int tensor_clear(TensorObject *self) {
    Py_CLEAR(self->data);
    Py_CLEAR(self->flat);
    Py_CLEAR(self->ks_obj);
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->shape);
    Py_CLEAR(self->grad_fn);
    Py_CLEAR(self->dict);
    Py_CLEAR(self->accumulator);
    return 0;
}

static void tensor_dealloc(TensorObject *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    tensor_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *tensor_get_ks(TensorObject *self, void *closure) {
    if (self->ks_obj == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_ks");
        return NULL;
    }
    Py_INCREF(self->ks_obj);
    return self->ks_obj;
}

static int tensor_set_ks(TensorObject *self, PyObject *value, void *closure) {
    if (value == NULL) {
        Py_CLEAR(self->ks_obj);
        self->ks = 0;
        return 0;
    }
    if (!PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "a tensor's _ks must be an int");
        return -1;
    }
    long long ks = PyLong_AsLongLong(value);
    if (ks == -1 && PyErr_Occurred()) return -1;
    Py_INCREF(value);
    Py_XSETREF(self->ks_obj, value);
    self->ks = ks;
    return 0;
}

static PyObject *tensor_get_dtype(TensorObject *self, void *closure) {
    if (self->dtype == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_dtype");
        return NULL;
    }
    Py_INCREF(self->dtype);
    return self->dtype;
}

static int tensor_set_dtype(TensorObject *self, PyObject *value, void *closure) {
    Py_XINCREF(value);
    Py_XSETREF(self->dtype, value);
    self->dtype_index = value == NULL ? -1 : dtype_index_of(value);
    return 0;
}

/* Note [Autograd fields] (reference.TensorBase): the defaults are None and 0 */
static PyObject *tensor_get_accumulator(TensorObject *self, void *closure) {
    PyObject *a = self->accumulator ? self->accumulator : Py_None;
    Py_INCREF(a);
    return a;
}

static int tensor_set_accumulator(TensorObject *self, PyObject *value, void *closure) {
    Py_XINCREF(value == Py_None ? NULL : value);
    Py_XSETREF(self->accumulator, value == Py_None ? NULL : value);
    return 0;
}

static PyObject *tensor_get_output_nr(TensorObject *self, void *closure) {
    return PyLong_FromLong(self->output_nr);
}

static int tensor_set_output_nr(TensorObject *self, PyObject *value, void *closure) {
    long nr = value == NULL ? 0 : PyLong_AsLong(value);
    if (nr == -1 && PyErr_Occurred()) return -1;
    self->output_nr = (int)nr;
    return 0;
}

static PyGetSetDef tensor_getset[] = {
    {"_accumulator", (getter)tensor_get_accumulator, (setter)tensor_set_accumulator,
     "a leaf's AccumulateGrad node", NULL},
    {"_output_nr", (getter)tensor_get_output_nr, (setter)tensor_set_output_nr,
     "which output of _grad_fn this tensor is", NULL},
    {"_ks", (getter)tensor_get_ks, (setter)tensor_set_ks, "the dispatch key set", NULL},
    {"_dtype", (getter)tensor_get_dtype, (setter)tensor_set_dtype, "the lamina dtype", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyMemberDef tensor_members[] = {
    {"_data", T_OBJECT_EX, offsetof(TensorObject, data), 0, "the storage"},
    {"_flat", T_OBJECT_EX, offsetof(TensorObject, flat), 0, "a 1-D alias, or None"},
    {"_shape", T_OBJECT_EX, offsetof(TensorObject, shape), 0, "the shape"},
    {"_grad_fn", T_OBJECT_EX, offsetof(TensorObject, grad_fn), 0, "the autograd node"},
    {NULL},
};

/* ------------------------------------------------------------------ calling helpers */

static PyObject *call1(PyObject *fn, PyObject *a) {
    PyObject *args[1] = {a};
    return PyObject_Vectorcall(fn, args, 1, NULL);
}

static PyObject *call2(PyObject *fn, PyObject *a, PyObject *b) {
    PyObject *args[2] = {a, b};
    return PyObject_Vectorcall(fn, args, 2, NULL);
}

static inline int bit_length(long long ks) {
    return ks <= 0 ? 0 : 64 - __builtin_clzll((unsigned long long)ks);
}

/* ------------------------------------------------------------------ OperatorTable */

typedef struct {
    PyObject_HEAD
    PyObject *table;         /* list, indexed by ks.bit_length() */
    PyObject *scalar_table;  /* list: the with_scalar variants (Note [Kernel variants]) */
    long long mask;
} OperatorTableObject;

static PyTypeObject OperatorTableType;

static PyObject *optable_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, ":OperatorTable")) return NULL;
    OperatorTableObject *self = (OperatorTableObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->table = PyList_New(0);
    self->scalar_table = PyList_New(0);
    if (self->table == NULL || self->scalar_table == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int optable_traverse(OperatorTableObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->table);
    Py_VISIT(self->scalar_table);
    return 0;
}

static int optable_clear(OperatorTableObject *self) {
    Py_CLEAR(self->table);
    Py_CLEAR(self->scalar_table);
    return 0;
}

static void optable_dealloc(OperatorTableObject *self) {
    PyObject_GC_UnTrack(self);
    optable_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int optable_set_list(PyObject **slot, PyObject *value) {
    if (value == NULL || !PyList_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "an operator's tables are lists");
        return -1;
    }
    Py_INCREF(value);
    Py_XSETREF(*slot, value);
    return 0;
}

static PyObject *optable_get_table(OperatorTableObject *self, void *c) {
    Py_INCREF(self->table);
    return self->table;
}
static int optable_set_table(OperatorTableObject *self, PyObject *v, void *c) {
    return optable_set_list(&self->table, v);
}
static PyObject *optable_get_scalar_table(OperatorTableObject *self, void *c) {
    Py_INCREF(self->scalar_table);
    return self->scalar_table;
}
static int optable_set_scalar_table(OperatorTableObject *self, PyObject *v, void *c) {
    return optable_set_list(&self->scalar_table, v);
}

static PyGetSetDef optable_getset[] = {
    {"table", (getter)optable_get_table, (setter)optable_set_table, NULL, NULL},
    {"scalar_table", (getter)optable_get_scalar_table, (setter)optable_set_scalar_table,
     NULL, NULL},
    {NULL},
};

static PyMemberDef optable_members[] = {
    {"mask", T_LONGLONG, offsetof(OperatorTableObject, mask), 0, "the keys that take part"},
    {NULL},
};

/* ------------------------------------------------------------------ ElementwiseKernel */

enum { FORM_TENSOR = 0, FORM_SCALAR = 1, FORM_UNCHECKED = 2 };  /* a kernel's forms */
enum { LOOP_FLAT = 0, LOOP_SCALAR = 1, LOOP_STRIDED = 2, N_LOOP_FORMS = 3 };  /* loops' */
enum { LOOP_ROWS = 3, LOOP_COLUMNS = 4 };  /* a reduction's loops */

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
typedef struct {
    PyObject_HEAD
    void *addresses[N_LOOP_FORMS][MAX_DTYPES];  /* [loop form][dtype index] */
    PyObject *ufuncs[MAX_DTYPES];
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

static void *kernel_loop(KernelObject *k, int form, int index) {
    void *address = k->cache->addresses[form][index];
    if (address != NULL) return address;
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

static inline int same_shape(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (a == NULL || b == NULL || !PyTuple_CheckExact(a) || !PyTuple_CheckExact(b)) return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(a);
    if (PyTuple_GET_SIZE(b) != n) return 0;
    for (Py_ssize_t d = 0; d < n; d++) {
        PyObject *x = PyTuple_GET_ITEM(a, d), *y = PyTuple_GET_ITEM(b, d);
        if (x != y) {
            int eq = PyObject_RichCompareBool(x, y, Py_EQ);
            if (eq != 1) {
                PyErr_Clear();
                return 0;
            }
        }
    }
    return 1;
}

/* A new CPU tensor of `shape` (a tuple of ints), dtype index `out`, n elements: its
 * storage and 1-D alias as reference.ElementwiseKernel makes them (np.empty(n), then
 * reshape). Sets *flat_data to the storage's data pointer. */
static PyObject *new_output(PyObject *shape, int out, npy_intp n, void **flat_data) {
    PyArray_Descr *descr = dtype_descrs[out];
    Py_INCREF(descr);
    PyObject *flat = PyArray_NewFromDescr(&PyArray_Type, descr, 1, &n, NULL, NULL, 0, NULL);
    if (flat == NULL) return NULL;
    PyObject *data;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    if (nd == 1) {
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
        data = PyArray_NewFromDescr(&PyArray_Type, descr, (int)nd, dims, NULL,
                                    PyArray_DATA((PyArrayObject *)flat), NPY_ARRAY_CARRAY, NULL);
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
    t->flat = flat;
    Py_INCREF(cpu_ks);
    t->ks_obj = cpu_ks;
    t->ks = 1;
    Py_INCREF(dtype_objs[out]);
    t->dtype = dtype_objs[out];
    t->dtype_index = out;
    Py_INCREF(shape);
    t->shape = shape;
    *flat_data = PyArray_DATA((PyArrayObject *)flat);
    return (PyObject *)t;
}

#define TENSOR_ARGS_OK(t) ((t)->ks_obj != NULL && (t)->dtype_index >= 0 && (t)->shape != NULL)

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
    ud->loop = loop;
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
    npy_intp dims[NPY_MAXDIMS];
    int nd = broadcast_dims(a, b, dims);
    if (nd < 0) return NULL;
    return general_call(k, i, out, (PyObject *)a, (PyObject *)b, nd, dims, ta, tb);
}

static PyObject *general_unary(KernelObject *k, TensorObject *tx, int i, int out) {
    if (tx->ks != 1) return NULL;
    PyArrayObject *x = data_array(tx, i);
    if (x == NULL) return NULL;
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
    if (fa == NULL || fb == NULL || !same_shape(ta->shape, tb->shape))
        return general_binary(k, ta, tb, i, out);  /* Note [C general path] */
    npy_intp n = PyArray_SIZE(fa);
    if (n >= k->limit || PyArray_SIZE(fb) != n) return NULL;
    loop2_t loop = (loop2_t)kernel_loop(k, LOOP_FLAT, i);
    if (loop == NULL) return NULL;
    void *o;
    PyObject *t = new_output(ta->shape, out, n, &o);
    if (t != NULL) loop(PyArray_DATA(fa), PyArray_DATA(fb), o, (long long)n);
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
    if (fx == NULL) return general_unary(k, tx, i, out);  /* Note [C general path] */
    npy_intp n = PyArray_SIZE(fx);
    if (n >= k->limit) return NULL;
    loop1_t loop = (loop1_t)kernel_loop(k, LOOP_FLAT, i);
    if (loop == NULL) return NULL;
    void *o;
    PyObject *t = new_output(tx->shape, out, n, &o);
    if (t != NULL) loop(PyArray_DATA(fx), o, (long long)n);
    return t;
}

/* reference.PY_SCALARS; a Python complex is not among them: it takes the reference's
 * binding and the kernel's general path (Note [Scalar fast path]) */
#define IS_PY_SCALAR(o) (PyFloat_CheckExact(o) || PyLong_CheckExact(o) || PyBool_Check(o))

/* a strided tensor with a Python scalar that keeps its dtype: the scalar as a 0-d array
 * of the dtype (in range: fast_with_scalar checked), broadcast by the ufunc */
static PyObject *general_scalar(KernelObject *k, TensorObject *t, PyObject *v, int first, int i,
                                int out) {
    if (t->ks != 1) return NULL;
    PyArrayObject *x = data_array(t, i);
    if (x == NULL) return NULL;
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
    if (f == NULL) return general_scalar(k, t, v, first, i, out);  /* Note [C general path] */
    npy_intp n = PyArray_SIZE(f);
    if (n >= k->limit) return NULL;
    void *loop = kernel_loop(k, LOOP_SCALAR, i);
    if (loop == NULL) return NULL;
    void *o;
    PyObject *r = new_output(t->shape, out, n, &o);
    if (r == NULL) return NULL;
    void *p = PyArray_DATA(f);
    if (kind == 'f' || kind == 'c')  /* a complex loop makes v + 0j of the double */
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
    if (t != NULL) loop(PyArray_DATA(fa), PyArray_DATA(fb), o, (long long)n);
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
static PyObject *run_kernel(PyObject *kernel, long long ks, PyObject *const *ops, int n) {
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
static PyObject *run_table_kernel(PyObject *table, int i, long long ks, PyObject *const *ops,
                                  int n) {
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

/* ------------------------------------------------------------------ ReductionKernel
 * Note [C reductions]: a fold (sum, prod, max, min, all, any) of a dense, C-contiguous
 * CPU tensor over its leading or its trailing axes, below the size limit, runs the
 * backend's own fold templates (compiled as C functions: loops.address(LOOP_ROWS or
 * LOOP_COLUMNS, i)) on the storage seen as a (rows, cols) array -- exactly what the
 * Python kernel's rows view gives for these layouts -- into an accumulator C
 * allocated and filled with the start value; the result is cast and reshaped as the
 * Python kernel does. Everything else (a dtype= argument, other axes or layouts, an
 * empty axis without identity, big inputs: parallel loops) is the Python kernel. */

typedef void (*fold_t)(void *, void *, long long, long long);
enum { START_ZERO, START_ONE, START_TRUE, START_FALSE, START_FIRST };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *reference;  /* the Python kernel: every other call */
    PyObject *spec;       /* the backend's FoldSpec: .address(form, index) */
    PyObject *dict;
    int has_dtype;        /* sum, prod: (x, axis, dtype, keepdims) */
    int start;
    long long limit;
    int acc_index[MAX_DTYPES], result_index[MAX_DTYPES];
    void *loops[2][MAX_DTYPES];  /* [rows, columns][dtype index] */
} ReductionObject;

static PyTypeObject ReductionType;

static void *reduction_loop(ReductionObject *r, int form, int i) {
    void **slot = &r->loops[form == LOOP_ROWS ? 0 : 1][i];
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

static PyObject *reduction_fast(ReductionObject *r, PyObject *const *args, Py_ssize_t n) {
    if (n != (r->has_dtype ? 5 : 4)) return NULL;
    PyObject *x_obj = args[1], *axis = args[2], *keepdims = args[n - 1];
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
    if (reduced == 0 && r->start == START_FIRST) return NULL;  /* the kernel's error */
    fold_t loop = (fold_t)reduction_loop(r, columns ? LOOP_COLUMNS : LOOP_ROWS, i);
    if (loop == NULL) return NULL;
    Py_INCREF(dtype_descrs[acc_i]);
    PyArrayObject *acc = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, dtype_descrs[acc_i], 1, &kept, NULL, NULL, 0, NULL);
    if (acc == NULL) return NULL;
    const char *data = PyArray_DATA(f);
    if (fill_start(r, acc, data, columns ? reduced : kept, columns ? kept : reduced, columns) < 0) {
        Py_DECREF(acc);
        return NULL;
    }
    if (reduced > 0 && kept > 0)
        loop((void *)data, PyArray_DATA(acc), columns ? reduced : kept, columns ? kept : reduced);
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
    PyObject *start = PyObject_GetAttrString(spec, "start");
    PyObject *results = PyObject_GetAttrString(spec, "results");
    PyObject *accs = PyObject_GetAttrString(spec, "accumulators");
    PyObject *limit = PyObject_GetAttrString(spec, "limit");
    int ok = has_dtype && start && results && accs && limit &&
             dtype_index_list(results, r->result_index) == 0 &&
             dtype_index_list(accs, r->acc_index) == 0;
    if (ok) {
        r->has_dtype = PyObject_IsTrue(has_dtype);
        if (PyUnicode_Check(start)) r->start = START_FIRST;
        else if (PyBool_Check(start)) r->start = start == Py_True ? START_TRUE : START_FALSE;
        else r->start = PyLong_AsLong(start) == 1 ? START_ONE : START_ZERO;
        double lim = PyFloat_Check(limit) ? PyFloat_AsDouble(limit) : (double)PyLong_AsLongLong(limit);
        r->limit = lim >= 9.0e18 ? LLONG_MAX : (long long)lim;
        ok = !PyErr_Occurred();
    }
    Py_XDECREF(has_dtype);
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

/* ------------------------------------------------------------------ NodeBase */

typedef struct {
    PyObject_HEAD
    PyObject *derivative, *next_nodes, *saved;
    PyObject *dict, *weakreflist;
} NodeObject;

static PyTypeObject NodeBaseType;

static int node_traverse(NodeObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->derivative);
    Py_VISIT(self->next_nodes);
    Py_VISIT(self->saved);
    Py_VISIT(self->dict);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int node_clear(NodeObject *self) {
    Py_CLEAR(self->derivative);
    Py_CLEAR(self->next_nodes);
    Py_CLEAR(self->saved);
    Py_CLEAR(self->dict);
    return 0;
}

static void node_dealloc(NodeObject *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    node_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef node_members[] = {
    {"derivative", T_OBJECT_EX, offsetof(NodeObject, derivative), 0, "the formula"},
    {"next_nodes", T_OBJECT_EX, offsetof(NodeObject, next_nodes), 0, "the inputs' nodes"},
    {"saved", T_OBJECT_EX, offsetof(NodeObject, saved), 0, "what the formula reads"},
    {NULL},
};

/* ------------------------------------------------------------------ RecordingKernel
 * Note [C recording]: the autograd layer's kernel of a binary operator, in C: it
 * redispatches below the AUTOGRAD key through the operator's table, and when grad mode
 * is on records the node as graph.record_binary's common case does (two tensors of the
 * result's dtype and shape, each a leaf, a first output or no grad, a formula saving
 * nothing or both, no version to record): one node, two tuples. Everything else calls
 * record_binary itself; the layer's Python kernel is the reference. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *reference;      /* the layer's Python kernel */
    OperatorTableObject *d;   /* the operator's table */
    PyObject *derivative;
    PyTypeObject *node_type;  /* graph.Node, a NodeBase subclass */
    PyObject *grad_state;     /* grad_mode.state: .enabled, per thread */
    PyObject *versions;       /* the version counters (a dict; empty: nothing written) */
    PyObject *nothing_saved;  /* (None, None) */
    PyObject *accumulator;    /* graph.grad_accumulator(leaf) */
    PyObject *record;         /* graph.record_binary(derivative, a, b, out) */
    PyObject *dict;
    long long autograd_key;
    int saves;                /* Derivative.binary_saves: 0, 1, or -1 (None) */
} RecordingObject;

static PyTypeObject RecordingType;
static PyObject *enabled_str;

/* the node a tensor's gradient flows into (new ref; None without grad), or NULL with
 * no error: a case for record_binary */
static PyObject *next_node(RecordingObject *r, TensorObject *t) {
    if (!(t->ks & r->autograd_key)) Py_RETURN_NONE;
    PyObject *fn = t->grad_fn;
    if (fn == NULL) return NULL;
    if (fn != Py_None) {
        if (t->output_nr) return NULL;
        Py_INCREF(fn);
        return fn;
    }
    if (t->accumulator != NULL) {
        Py_INCREF(t->accumulator);
        return t->accumulator;
    }
    return call1(r->accumulator, (PyObject *)t);
}

static int record_fast(RecordingObject *r, PyObject *a, PyObject *b, PyObject *out) {
    if (r->saves < 0 || Py_TYPE(a) != tensor_type || Py_TYPE(b) != tensor_type ||
        Py_TYPE(out) != tensor_type)
        return 0;
    TensorObject *ta = T(a), *tb = T(b), *to = T(out);
    if (ta->dtype != to->dtype || tb->dtype != to->dtype || !same_shape(ta->shape, to->shape) ||
        !same_shape(tb->shape, to->shape))
        return 0;
    if (r->saves && PyDict_GET_SIZE(r->versions)) return 0;  /* versions to record */
    PyObject *na = next_node(r, ta);
    if (na == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *nb = next_node(r, tb);
    if (nb == NULL) {
        Py_DECREF(na);
        return PyErr_Occurred() ? -1 : 0;
    }
    NodeObject *node = (NodeObject *)r->node_type->tp_alloc(r->node_type, 0);
    PyObject *next_nodes = PyTuple_Pack(2, na, nb);
    Py_DECREF(na);
    Py_DECREF(nb);
    PyObject *saved = r->saves ? PyTuple_Pack(2, a, b) : (Py_INCREF(r->nothing_saved), r->nothing_saved);
    PyObject *ks_obj = PyLong_FromLongLong(to->ks | r->autograd_key);
    if (node == NULL || next_nodes == NULL || saved == NULL || ks_obj == NULL) {
        Py_XDECREF(node);
        Py_XDECREF(next_nodes);
        Py_XDECREF(saved);
        Py_XDECREF(ks_obj);
        return -1;
    }
    Py_INCREF(r->derivative);
    node->derivative = r->derivative;
    node->next_nodes = next_nodes;
    node->saved = saved;
    to->ks |= r->autograd_key;
    Py_XSETREF(to->ks_obj, ks_obj);
    Py_XSETREF(to->grad_fn, (PyObject *)node);
    return 1;
}

static PyObject *recording_vectorcall(RecordingObject *r, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames) {
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 3 || !PyLong_CheckExact(args[0]))
        return PyObject_Vectorcall(r->reference, args, nargsf, kwnames);
    long long ks = PyLong_AsLongLong(args[0]);
    if (ks == -1 && PyErr_Occurred()) return NULL;
    long long below = ks & ~r->autograd_key;
    int i = bit_length(below);
    PyObject *table = r->d->table;
    if (i >= PyList_GET_SIZE(table)) return PyObject_Vectorcall(r->reference, args, nargsf, NULL);
    PyObject *out = run_table_kernel(table, i, below, args + 1, 2);
    if (out == NULL) return NULL;
    PyObject *enabled = PyObject_GetAttr(r->grad_state, enabled_str);
    if (enabled == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    int on = PyObject_IsTrue(enabled);
    Py_DECREF(enabled);
    if (on <= 0) {
        if (on < 0) Py_CLEAR(out);
        return out;
    }
    int done = record_fast(r, args[1], args[2], out);
    if (done == 0) {
        PyObject *rargs[4] = {r->derivative, args[1], args[2], out};
        PyObject *node = PyObject_Vectorcall(r->record, rargs, 4, NULL);
        if (node == NULL) done = -1;
        Py_XDECREF(node);
    }
    if (done < 0) Py_CLEAR(out);
    return out;
}

/* RecordingKernel(kernel, *, derivative, table, node_type, grad_state, versions,
 *                 nothing_saved, accumulator, record, autograd) */
static PyObject *recording_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kernel", "derivative", "table", "node_type", "grad_state",
                             "versions", "nothing_saved", "accumulator", "record", "autograd",
                             NULL};
    PyObject *kernel, *derivative, *node_type, *grad_state, *versions, *nothing, *acc, *record;
    OperatorTableObject *d;
    long long autograd;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OO!O!OO!O!OOL:RecordingKernel", kwlist,
                                     &kernel, &derivative, &OperatorTableType, &d, &PyType_Type,
                                     &node_type, &grad_state, &PyDict_Type, &versions,
                                     &PyTuple_Type, &nothing, &acc, &record, &autograd))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)node_type, &NodeBaseType)) {
        PyErr_SetString(PyExc_TypeError, "RecordingKernel: node_type must subclass NodeBase");
        return NULL;
    }
    PyObject *saves = PyObject_GetAttrString(derivative, "binary_saves");
    if (saves == NULL) return NULL;
    RecordingObject *r = (RecordingObject *)type->tp_alloc(type, 0);
    if (r == NULL) {
        Py_DECREF(saves);
        return NULL;
    }
    r->vectorcall = (vectorcallfunc)recording_vectorcall;
    r->saves = saves == Py_None ? -1 : PyObject_IsTrue(saves);
    Py_DECREF(saves);
    PyObject *parts[] = {kernel, (PyObject *)d, derivative, node_type, grad_state, versions,
                         nothing, acc, record};
    for (int k = 0; k < 9; k++) Py_INCREF(parts[k]);
    r->reference = kernel;
    r->d = d;
    r->derivative = derivative;
    r->node_type = (PyTypeObject *)node_type;
    r->grad_state = grad_state;
    r->versions = versions;
    r->nothing_saved = nothing;
    r->accumulator = acc;
    r->record = record;
    r->autograd_key = autograd;
    return (PyObject *)r;
}

static int recording_traverse(RecordingObject *r, visitproc visit, void *arg) {
    Py_VISIT(r->reference);
    Py_VISIT(r->d);
    Py_VISIT(r->derivative);
    Py_VISIT(r->node_type);
    Py_VISIT(r->grad_state);
    Py_VISIT(r->versions);
    Py_VISIT(r->nothing_saved);
    Py_VISIT(r->accumulator);
    Py_VISIT(r->record);
    Py_VISIT(r->dict);
    return 0;
}

static int recording_clear(RecordingObject *r) {
    Py_CLEAR(r->reference);
    Py_CLEAR(r->d);
    Py_CLEAR(r->derivative);
    Py_CLEAR(r->node_type);
    Py_CLEAR(r->grad_state);
    Py_CLEAR(r->versions);
    Py_CLEAR(r->nothing_saved);
    Py_CLEAR(r->accumulator);
    Py_CLEAR(r->record);
    Py_CLEAR(r->dict);
    return 0;
}

static void recording_dealloc(RecordingObject *r) {
    PyObject_GC_UnTrack(r);
    recording_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMemberDef recording_members[] = {
    {"reference", T_OBJECT, offsetof(RecordingObject, reference), READONLY, "the Python kernel"},
    {NULL},
};

/* ------------------------------------------------------------------ Binding */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    OperatorTableObject *d;
    PyObject *fallback;  /* the reference binding: every call that is not tensors (and
                            tensor with Python scalar) of the Tensor type */
    PyObject *direct;    /* the CPU kernel, for the dispatcher layer off; else NULL */
    PyObject *dict;
    int arity;
} BindingObject;

static PyTypeObject BindingType;

/* reference.binary_binding's call: two tensors through the table, a tensor and an
 * exact Python scalar through the scalar table, anything else by the reference */
/* bindings.direct_binding's call (the dispatcher layer off): dense CPU tensors straight
 * to the CPU kernel, anything else to the reference (which refuses it) */
static PyObject *direct_call(BindingObject *self, PyObject *const *ops, int n) {
    for (int i = 0; i < n; i++)
        if (!IS_TENSOR(ops[i]) || T(ops[i])->ks_obj == NULL || T(ops[i])->ks != 1)
            return PyObject_Vectorcall(self->fallback, ops, n, NULL);
    return run_kernel(self->direct, 1, ops, n);
}

static PyObject *binding_call2(BindingObject *self, PyObject *a, PyObject *b) {
    OperatorTableObject *d = self->d;
    PyObject *table, *ops[2] = {a, b};
    long long ks;
    if (self->direct != NULL) return direct_call(self, ops, 2);
    if (IS_TENSOR(a) && T(a)->ks_obj != NULL) {
        if (IS_TENSOR(b) && T(b)->ks_obj != NULL) {
            ks = (T(a)->ks | T(b)->ks) & d->mask;
            table = d->table;
        } else if (IS_PY_SCALAR(b)) {
            ks = T(a)->ks & d->mask;
            table = d->scalar_table;
        } else {
            return call2(self->fallback, a, b);
        }
    } else if (IS_PY_SCALAR(a) && IS_TENSOR(b) && T(b)->ks_obj != NULL) {
        ks = T(b)->ks & d->mask;
        table = d->scalar_table;
    } else {
        return call2(self->fallback, a, b);
    }
    int i = bit_length(ks);
    if (i >= PyList_GET_SIZE(table)) return call2(self->fallback, a, b);
    return run_table_kernel(table, i, ks, ops, 2);
}

static PyObject *binding_call1(BindingObject *self, PyObject *x) {
    if (self->direct != NULL) return direct_call(self, &x, 1);
    if (!IS_TENSOR(x) || T(x)->ks_obj == NULL) return call1(self->fallback, x);
    long long ks = T(x)->ks & self->d->mask;
    int i = bit_length(ks);
    if (i >= PyList_GET_SIZE(self->d->table)) return call1(self->fallback, x);
    return run_table_kernel(self->d->table, i, ks, &x, 1);
}

static PyObject *binding_vectorcall(BindingObject *self, PyObject *const *args, size_t nargsf,
                                    PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL && n == self->arity)
        return n == 2 ? binding_call2(self, args[0], args[1]) : binding_call1(self, args[0]);
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);  /* its TypeError */
}

/* Binding(name, operator_table, arity, fallback, direct=None) */
static PyObject *binding_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *name, *fallback, *direct = Py_None;
    OperatorTableObject *d;
    int arity;
    if (!PyArg_ParseTuple(args, "UO!iO|O:Binding", &name, &OperatorTableType, &d, &arity,
                          &fallback, &direct))
        return NULL;
    if (arity != 1 && arity != 2) {
        PyErr_SetString(PyExc_ValueError, "Binding: arity must be 1 or 2");
        return NULL;
    }
    BindingObject *self = (BindingObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = (vectorcallfunc)binding_vectorcall;
    Py_INCREF(d);
    self->d = d;
    Py_INCREF(fallback);
    self->fallback = fallback;
    if (direct != Py_None) {
        Py_INCREF(direct);
        self->direct = direct;
    }
    self->arity = arity;
    if (PyObject_SetAttrString((PyObject *)self, "__name__", name) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int binding_traverse(BindingObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->d);
    Py_VISIT(self->fallback);
    Py_VISIT(self->direct);
    Py_VISIT(self->dict);
    return 0;
}

static int binding_clear(BindingObject *self) {
    Py_CLEAR(self->d);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->direct);
    Py_CLEAR(self->dict);
    return 0;
}

static void binding_dealloc(BindingObject *self) {
    PyObject_GC_UnTrack(self);
    binding_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef binding_members[] = {
    {"fallback", T_OBJECT, offsetof(BindingObject, fallback), READONLY, "the reference binding"},
    {NULL},
};

static PyGetSetDef binding_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

/* ------------------------------------------------------------------ Tensor's operators */

enum {
    S_ADD, S_SUB, S_MUL, S_TRUEDIV, S_FLOORDIV, S_MOD, S_POW, S_AND, S_OR, S_XOR, S_LSHIFT,
    S_RSHIFT, S_MATMUL,
    S_IADD, S_ISUB, S_IMUL, S_ITRUEDIV, S_IFLOORDIV, S_IMOD, S_IPOW, S_IAND, S_IOR, S_IXOR,
    S_ILSHIFT, S_IRSHIFT, S_IMATMUL,
    S_NEG, S_POS, S_ABS, S_INVERT,
    S_EQ, S_NE, S_LT, S_LE, S_GT, S_GE,
    N_SLOTS
};

static const char *slot_names[N_SLOTS] = {
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift",
    "rshift", "matmul",
    "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior", "ixor",
    "ilshift", "irshift", "imatmul",
    "neg", "pos", "abs", "invert",
    "eq", "ne", "lt", "le", "gt", "ge",
};

typedef struct {
    PyObject *fn;         /* __X__(self, other) */
    PyObject *reflected;  /* __rX__(self, other) */
    int symmetric;        /* fn takes the operands in their own order */
} Slot;

static Slot slots[N_SLOTS];

/* a slot's function, called with a reference of its own (Note [Kernel references]:
 * set_slot from another thread may replace it meanwhile) */
static PyObject *slot_call2(PyObject *fn, PyObject *a, PyObject *b) {
    Py_INCREF(fn);
    PyObject *r = Py_TYPE(fn) == &BindingType ? binding_call2((BindingObject *)fn, a, b)
                                              : call2(fn, a, b);
    Py_DECREF(fn);
    return r;
}

/* Python's binary operator protocol for Tensor's slot i (reference.set_slot) */
static PyObject *binary_slot(int i, PyObject *a, PyObject *b) {
    Slot *s = &slots[i];
    if (s->fn != NULL && s->symmetric) return slot_call2(s->fn, a, b);
    if (s->fn != NULL && IS_TENSOR(a)) {
        PyObject *r = slot_call2(s->fn, a, b);
        if (r != Py_NotImplemented) return r;
        Py_DECREF(r);
    }
    if (s->reflected != NULL && IS_TENSOR(b)) return slot_call2(s->reflected, b, a);
    Py_RETURN_NOTIMPLEMENTED;
}

static PyObject *inplace_slot(int i, PyObject *a, PyObject *b) {
    if (slots[i].fn == NULL) Py_RETURN_NOTIMPLEMENTED;
    return slot_call2(slots[i].fn, a, b);
}

static PyObject *unary_slot(int i, PyObject *x) {
    PyObject *fn = slots[i].fn;
    if (fn == NULL) {
        PyErr_Format(PyExc_TypeError, "bad operand type for unary %s: '%s'", slot_names[i],
                     Py_TYPE(x)->tp_name);
        return NULL;
    }
    Py_INCREF(fn);
    PyObject *r = Py_TYPE(fn) == &BindingType ? binding_call1((BindingObject *)fn, x)
                                              : call1(fn, x);
    Py_DECREF(fn);
    return r;
}

#define BINARY_SLOT(fname, i) \
    static PyObject *fname(PyObject *a, PyObject *b) { return binary_slot(i, a, b); }
#define INPLACE_SLOT(fname, i) \
    static PyObject *fname(PyObject *a, PyObject *b) { return inplace_slot(i, a, b); }
#define UNARY_SLOT(fname, i) \
    static PyObject *fname(PyObject *x) { return unary_slot(i, x); }

BINARY_SLOT(nb_add, S_ADD)
BINARY_SLOT(nb_sub, S_SUB)
BINARY_SLOT(nb_mul, S_MUL)
BINARY_SLOT(nb_truediv, S_TRUEDIV)
BINARY_SLOT(nb_floordiv, S_FLOORDIV)
BINARY_SLOT(nb_mod, S_MOD)
BINARY_SLOT(nb_and, S_AND)
BINARY_SLOT(nb_or, S_OR)
BINARY_SLOT(nb_xor, S_XOR)
BINARY_SLOT(nb_lshift, S_LSHIFT)
BINARY_SLOT(nb_rshift, S_RSHIFT)
BINARY_SLOT(nb_matmul, S_MATMUL)
INPLACE_SLOT(nb_iadd, S_IADD)
INPLACE_SLOT(nb_isub, S_ISUB)
INPLACE_SLOT(nb_imul, S_IMUL)
INPLACE_SLOT(nb_itruediv, S_ITRUEDIV)
INPLACE_SLOT(nb_ifloordiv, S_IFLOORDIV)
INPLACE_SLOT(nb_imod, S_IMOD)
INPLACE_SLOT(nb_iand, S_IAND)
INPLACE_SLOT(nb_ior, S_IOR)
INPLACE_SLOT(nb_ixor, S_IXOR)
INPLACE_SLOT(nb_ilshift, S_ILSHIFT)
INPLACE_SLOT(nb_irshift, S_IRSHIFT)
INPLACE_SLOT(nb_imatmul, S_IMATMUL)
UNARY_SLOT(nb_neg, S_NEG)
UNARY_SLOT(nb_pos, S_POS)
UNARY_SLOT(nb_abs, S_ABS)
UNARY_SLOT(nb_invert, S_INVERT)

/* a ** b (pow with a modulus is not an operator of lamina's) */
static PyObject *nb_pow(PyObject *a, PyObject *b, PyObject *mod) {
    if (mod != Py_None) Py_RETURN_NOTIMPLEMENTED;
    return binary_slot(S_POW, a, b);
}

static PyObject *nb_ipow(PyObject *a, PyObject *b, PyObject *mod) {
    if (mod != Py_None) Py_RETURN_NOTIMPLEMENTED;
    return inplace_slot(S_IPOW, a, b);
}

static PyObject *tensor_richcompare(PyObject *a, PyObject *b, int op) {
    static const int map[6] = {S_LT, S_LE, S_EQ, S_NE, S_GT, S_GE};  /* Py_LT .. Py_GE */
    PyObject *fn = slots[map[op]].fn;
    if (fn == NULL) Py_RETURN_NOTIMPLEMENTED;
    return slot_call2(fn, a, b);
}

static PyNumberMethods tensor_as_number = {
    .nb_add = nb_add, .nb_subtract = nb_sub, .nb_multiply = nb_mul,
    .nb_remainder = nb_mod, .nb_power = nb_pow, .nb_negative = nb_neg,
    .nb_positive = nb_pos, .nb_absolute = nb_abs, .nb_invert = nb_invert,
    .nb_lshift = nb_lshift, .nb_rshift = nb_rshift, .nb_and = nb_and, .nb_xor = nb_xor,
    .nb_or = nb_or, .nb_inplace_add = nb_iadd, .nb_inplace_subtract = nb_isub,
    .nb_inplace_multiply = nb_imul, .nb_inplace_remainder = nb_imod,
    .nb_inplace_power = nb_ipow, .nb_inplace_lshift = nb_ilshift,
    .nb_inplace_rshift = nb_irshift, .nb_inplace_and = nb_iand, .nb_inplace_xor = nb_ixor,
    .nb_inplace_or = nb_ior, .nb_floor_divide = nb_floordiv, .nb_true_divide = nb_truediv,
    .nb_inplace_floor_divide = nb_ifloordiv, .nb_inplace_true_divide = nb_itruediv,
    .nb_matrix_multiply = nb_matmul, .nb_inplace_matrix_multiply = nb_imatmul,
};

/* ------------------------------------------------------------------ module functions */

static PyObject *mod_set_tensor_type(PyObject *m, PyObject *type) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &TensorBaseType)) {
        PyErr_SetString(PyExc_TypeError, "set_tensor_type: needs a subclass of TensorBase");
        return NULL;
    }
    Py_INCREF(type);
    Py_XSETREF(tensor_type, (PyTypeObject *)type);
    Py_RETURN_NONE;
}

/* set_dtypes(dtypes): lamina's dtypes in index order (each with .np and .kind) */
static PyObject *mod_set_dtypes(PyObject *m, PyObject *seq) {
    PyObject *items = PySequence_Fast(seq, "set_dtypes: needs a sequence of dtypes");
    if (items == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    if (n > MAX_DTYPES) {
        Py_DECREF(items);
        PyErr_SetString(PyExc_ValueError, "set_dtypes: too many dtypes");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PySequence_Fast_GET_ITEM(items, i);
        PyObject *np_dtype = PyObject_GetAttrString(d, "np");
        PyObject *kind = np_dtype ? PyObject_GetAttrString(d, "kind") : NULL;
        PyArray_Descr *descr = NULL;
        if (kind == NULL || !PyUnicode_Check(kind) || PyUnicode_GET_LENGTH(kind) < 1 ||
            !PyArray_DescrConverter(np_dtype, &descr)) {
            Py_XDECREF(np_dtype);
            Py_XDECREF(kind);
            Py_DECREF(items);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "set_dtypes: bad dtype");
            return NULL;
        }
        Py_INCREF(d);
        Py_XSETREF(dtype_objs[i], d);
        Py_XSETREF(dtype_descrs[i], descr);
        dtype_kinds[i] = (char)PyUnicode_READ_CHAR(kind, 0);
        Py_DECREF(np_dtype);
        Py_DECREF(kind);
    }
    n_dtypes = (int)n;
    Py_DECREF(items);
    Py_RETURN_NONE;
}

/* set_slot(dunder, fn, reflected=None, symmetric=False) */
static PyObject *mod_set_slot(PyObject *m, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"dunder", "fn", "reflected", "symmetric", NULL};
    const char *name;
    PyObject *fn, *reflected = Py_None;
    int symmetric = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "sO|Op:set_slot", kwlist, &name, &fn,
                                     &reflected, &symmetric))
        return NULL;
    for (int i = 0; i < N_SLOTS; i++) {
        if (strcmp(slot_names[i], name) != 0) continue;
        Py_XINCREF(fn == Py_None ? NULL : fn);
        Py_XSETREF(slots[i].fn, fn == Py_None ? NULL : fn);
        Py_XINCREF(reflected == Py_None ? NULL : reflected);
        Py_XSETREF(slots[i].reflected, reflected == Py_None ? NULL : reflected);
        slots[i].symmetric = symmetric;
        Py_RETURN_NONE;
    }
    PyErr_Format(PyExc_ValueError, "set_slot: Tensor has no operator slot __%s__", name);
    return NULL;
}

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

static PyMethodDef module_methods[] = {
    {"set_tensor_type", mod_set_tensor_type, METH_O, "the class of kernel outputs"},
    {"set_dtypes", mod_set_dtypes, METH_O, "lamina's dtypes, in index order"},
    {"set_slot", (PyCFunction)(void (*)(void))mod_set_slot, METH_VARARGS | METH_KEYWORDS,
     "Tensor's operator method __dunder__ (and __rdunder__)"},
    {"time_loop", mod_time_loop, METH_VARARGS, "k calls of a loop on preallocated arrays"},
    {"pool_install", mod_pool_install, METH_O, "NumPy allocates through the pool (or not)"},
    {"pool_configure", mod_pool_configure, METH_VARARGS, "(threshold, limit) in bytes"},
    {"pool_empty", mod_pool_empty, METH_NOARGS, "return every cached block"},
    {"pool_stats", mod_pool_stats, METH_NOARGS, "the pool's counters"},
    {"pool_reset", mod_pool_reset_peak, METH_NOARGS, "zero the counters, peak = in use"},
    {NULL},
};

/* ------------------------------------------------------------------ types */

static PyTypeObject TensorBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.TensorBase",
    .tp_doc = "The fields of a tensor (Note [Tensor fields]); lamina.Tensor adds the methods.",
    .tp_basicsize = sizeof(TensorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    /* tp_new: object's (set at module init), so that object.__new__(Tensor) works */
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_traverse = (traverseproc)tensor_traverse,
    .tp_clear = (inquiry)tensor_clear,
    .tp_getset = tensor_getset,
    .tp_members = tensor_members,
    .tp_dictoffset = offsetof(TensorObject, dict),
    .tp_weaklistoffset = offsetof(TensorObject, weakreflist),
    .tp_as_number = &tensor_as_number,
    .tp_richcompare = tensor_richcompare,
};

static PyTypeObject OperatorTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.OperatorTable",
    .tp_doc = "An operator's table, scalar table and mask (Note [Dispatch table]).",
    .tp_basicsize = sizeof(OperatorTableObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = optable_new,
    .tp_dealloc = (destructor)optable_dealloc,
    .tp_traverse = (traverseproc)optable_traverse,
    .tp_clear = (inquiry)optable_clear,
    .tp_getset = optable_getset,
    .tp_members = optable_members,
};

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

static PyTypeObject BindingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.Binding",
    .tp_doc = "The binding of an elementwise operator (Note [Bindings]), in C.",
    .tp_basicsize = sizeof(BindingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = binding_new,
    .tp_dealloc = (destructor)binding_dealloc,
    .tp_traverse = (traverseproc)binding_traverse,
    .tp_clear = (inquiry)binding_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(BindingObject, vectorcall),
    .tp_dictoffset = offsetof(BindingObject, dict),
    .tp_members = binding_members,
    .tp_getset = binding_getset,
};

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
    .tp_getset = binding_getset,
    .tp_members = reduction_members,
    .tp_methods = reduction_methods,
};

static PyTypeObject NodeBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.NodeBase",
    .tp_doc = "The fields every autograd node sets (lamina.autograd.graph.Node).",
    .tp_basicsize = sizeof(NodeObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)node_dealloc,
    .tp_traverse = (traverseproc)node_traverse,
    .tp_clear = (inquiry)node_clear,
    .tp_members = node_members,
    .tp_getset = binding_getset,
    .tp_dictoffset = offsetof(NodeObject, dict),
    .tp_weaklistoffset = offsetof(NodeObject, weakreflist),
};

static PyTypeObject RecordingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.RecordingKernel",
    .tp_doc = "The autograd layer's binary kernel, in C (Note [C recording]).",
    .tp_basicsize = sizeof(RecordingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = recording_new,
    .tp_dealloc = (destructor)recording_dealloc,
    .tp_traverse = (traverseproc)recording_traverse,
    .tp_clear = (inquiry)recording_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(RecordingObject, vectorcall),
    .tp_dictoffset = offsetof(RecordingObject, dict),
    .tp_getset = binding_getset,
    .tp_members = recording_members,
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "lamina.dispatch._core",
    "The per-call core of lamina in C (Note [Two cores] in dispatch/reference.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__core(void) {
    import_array();
    import_umath();
    TensorBaseType.tp_hash = PyBaseObject_Type.tp_hash;  /* identity, as object's */
    TensorBaseType.tp_new = PyBaseObject_Type.tp_new;    /* object.__new__(Tensor) works */
    NodeBaseType.tp_new = PyBaseObject_Type.tp_new;
    if (PyType_Ready(&TensorBaseType) < 0 || PyType_Ready(&OperatorTableType) < 0 ||
        PyType_Ready(&KernelType) < 0 || PyType_Ready(&BindingType) < 0 ||
        PyType_Ready(&ReductionType) < 0 || PyType_Ready(&NodeBaseType) < 0 ||
        PyType_Ready(&RecordingType) < 0 ||
        PyType_Ready(&LoopCacheType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL) return NULL;
    pool_lock = PyThread_allocate_lock();
    pool_capsule = PyCapsule_New(&pool_handler, "mem_handler", NULL);
    PyDataMem_Handler *numpy_handler = PyCapsule_GetPointer(PyDataMem_DefaultHandler, "mem_handler");
    if (pool_lock == NULL || pool_capsule == NULL || numpy_handler == NULL) return NULL;
    numpy_allocator = &numpy_handler->allocator;
    cpu_ks = PyLong_FromLong(1);
    out_kwnames = Py_BuildValue("(s)", "out");
    enabled_str = PyUnicode_InternFromString("enabled");
    if (cpu_ks == NULL || out_kwnames == NULL || PyModule_AddStringConstant(m, "IMPLEMENTATION", "c") < 0 ||
        PyModule_AddObjectRef(m, "TensorBase", (PyObject *)&TensorBaseType) < 0 ||
        PyModule_AddObjectRef(m, "OperatorTable", (PyObject *)&OperatorTableType) < 0 ||
        PyModule_AddObjectRef(m, "ElementwiseKernel", (PyObject *)&KernelType) < 0 ||
        PyModule_AddObjectRef(m, "Binding", (PyObject *)&BindingType) < 0 ||
        PyModule_AddObjectRef(m, "ReductionKernel", (PyObject *)&ReductionType) < 0 ||
        PyModule_AddObjectRef(m, "NodeBase", (PyObject *)&NodeBaseType) < 0 ||
        PyModule_AddObjectRef(m, "RecordingKernel", (PyObject *)&RecordingType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
