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
#include <stdint.h>

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>

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
    long long ks;       /* _ks, for C */
    int dtype_index;    /* _dtype's index, -1 when it is not one of set_dtypes() */
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

static PyGetSetDef tensor_getset[] = {
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

enum { FORM_TENSOR = 0, FORM_SCALAR = 1, FORM_UNCHECKED = 2 };

typedef void (*loop1_t)(void *, void *, long long);
typedef void (*loop2_t)(void *, void *, void *, long long);
typedef void (*loop_scalar_f)(void *, double, void *, long long, int);
typedef void (*loop_scalar_i)(void *, long long, void *, long long, int);
typedef void (*loop_scalar_u)(void *, unsigned long long, void *, long long, int);

/* What the kernel and its variants share: the loops' C addresses, compiled on first
 * use through loops.address(form, index) (Note [C loops] in numba_cpu/kernels.py). */
typedef struct {
    PyObject_HEAD
    void *addresses[2][MAX_DTYPES];  /* [TENSOR or SCALAR form][dtype index] */
} LoopCacheObject;

static PyTypeObject LoopCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.LoopCache",
    .tp_basicsize = sizeof(LoopCacheObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
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

/* reference.ElementwiseKernel._binary: NULL with no error set means "not fast" */
static PyObject *fast_binary(KernelObject *k, PyObject *a, PyObject *b) {
    if (!IS_TENSOR(a) || !IS_TENSOR(b)) return NULL;
    TensorObject *ta = T(a), *tb = T(b);
    if (!TENSOR_ARGS_OK(ta) || ta->dtype != tb->dtype || !same_shape(ta->shape, tb->shape))
        return NULL;
    int i = ta->dtype_index, out = k->out_index[i];
    if (out < 0) return NULL;
    PyArrayObject *fa = flat_array(ta, i), *fb = flat_array(tb, i);
    if (fa == NULL || fb == NULL) return NULL;
    npy_intp n = PyArray_SIZE(fa);
    if (n >= k->limit || PyArray_SIZE(fb) != n) return NULL;
    loop2_t loop = (loop2_t)kernel_loop(k, FORM_TENSOR, i);
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
    if (fx == NULL) return NULL;
    npy_intp n = PyArray_SIZE(fx);
    if (n >= k->limit) return NULL;
    loop1_t loop = (loop1_t)kernel_loop(k, FORM_TENSOR, i);
    if (loop == NULL) return NULL;
    void *o;
    PyObject *t = new_output(tx->shape, out, n, &o);
    if (t != NULL) loop(PyArray_DATA(fx), o, (long long)n);
    return t;
}

/* reference.PY_SCALARS; a Python complex is not among them: it takes the reference's
 * binding and the kernel's general path (Note [Scalar fast path]) */
#define IS_PY_SCALAR(o) (PyFloat_CheckExact(o) || PyLong_CheckExact(o) || PyBool_Check(o))

/* reference.ElementwiseKernel._with_scalar (Note [Scalar fast path]) */
static PyObject *fast_with_scalar(KernelObject *k, PyObject *a, PyObject *b) {
    int first = IS_PY_SCALAR(a);
    PyObject *t_obj = first ? b : a, *v = first ? a : b;
    if (!IS_PY_SCALAR(v) || Py_TYPE(t_obj) != tensor_type) return NULL;
    TensorObject *t = T(t_obj);
    if (!TENSOR_ARGS_OK(t) || t->flat == Py_None) return NULL;
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
    if (f == NULL) return NULL;
    npy_intp n = PyArray_SIZE(f);
    if (n >= k->limit) return NULL;
    void *loop = kernel_loop(k, FORM_SCALAR, i);
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
    loop2_t loop = (loop2_t)kernel_loop(k, FORM_TENSOR, i);
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
    return run_kernel(PyList_GET_ITEM(table, i), ks, ops, 2);
}

static PyObject *binding_call1(BindingObject *self, PyObject *x) {
    if (self->direct != NULL) return direct_call(self, &x, 1);
    if (!IS_TENSOR(x) || T(x)->ks_obj == NULL) return call1(self->fallback, x);
    long long ks = T(x)->ks & self->d->mask;
    int i = bit_length(ks);
    if (i >= PyList_GET_SIZE(self->d->table)) return call1(self->fallback, x);
    return run_kernel(PyList_GET_ITEM(self->d->table, i), ks, &x, 1);
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

/* Python's binary operator protocol for Tensor's slot i (reference.set_slot) */
static PyObject *binary_slot(int i, PyObject *a, PyObject *b) {
    Slot *s = &slots[i];
    if (s->fn != NULL && s->symmetric) {
        if (Py_TYPE(s->fn) == &BindingType) return binding_call2((BindingObject *)s->fn, a, b);
        return call2(s->fn, a, b);
    }
    if (s->fn != NULL && IS_TENSOR(a)) {
        PyObject *r = call2(s->fn, a, b);
        if (r != Py_NotImplemented) return r;
        Py_DECREF(r);
    }
    if (s->reflected != NULL && IS_TENSOR(b)) return call2(s->reflected, b, a);
    Py_RETURN_NOTIMPLEMENTED;
}

static PyObject *inplace_slot(int i, PyObject *a, PyObject *b) {
    if (slots[i].fn == NULL) Py_RETURN_NOTIMPLEMENTED;
    return call2(slots[i].fn, a, b);
}

static PyObject *unary_slot(int i, PyObject *x) {
    PyObject *fn = slots[i].fn;
    if (fn == NULL) {
        PyErr_Format(PyExc_TypeError, "bad operand type for unary %s: '%s'", slot_names[i],
                     Py_TYPE(x)->tp_name);
        return NULL;
    }
    if (Py_TYPE(fn) == &BindingType) return binding_call1((BindingObject *)fn, x);
    return call1(fn, x);
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
    return call2(fn, a, b);
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

static PyMethodDef module_methods[] = {
    {"set_tensor_type", mod_set_tensor_type, METH_O, "the class of kernel outputs"},
    {"set_dtypes", mod_set_dtypes, METH_O, "lamina's dtypes, in index order"},
    {"set_slot", (PyCFunction)(void (*)(void))mod_set_slot, METH_VARARGS | METH_KEYWORDS,
     "Tensor's operator method __dunder__ (and __rdunder__)"},
    {"time_loop", mod_time_loop, METH_VARARGS, "k calls of a loop on preallocated arrays"},
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

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "lamina.dispatch._core",
    "The per-call core of lamina in C (Note [Two cores] in dispatch/reference.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__core(void) {
    import_array();
    TensorBaseType.tp_hash = PyBaseObject_Type.tp_hash;  /* identity, as object's */
    TensorBaseType.tp_new = PyBaseObject_Type.tp_new;    /* object.__new__(Tensor) works */
    if (PyType_Ready(&TensorBaseType) < 0 || PyType_Ready(&OperatorTableType) < 0 ||
        PyType_Ready(&KernelType) < 0 || PyType_Ready(&BindingType) < 0 ||
        PyType_Ready(&LoopCacheType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL) return NULL;
    cpu_ks = PyLong_FromLong(1);
    if (cpu_ks == NULL || PyModule_AddStringConstant(m, "IMPLEMENTATION", "c") < 0 ||
        PyModule_AddObjectRef(m, "TensorBase", (PyObject *)&TensorBaseType) < 0 ||
        PyModule_AddObjectRef(m, "OperatorTable", (PyObject *)&OperatorTableType) < 0 ||
        PyModule_AddObjectRef(m, "ElementwiseKernel", (PyObject *)&KernelType) < 0 ||
        PyModule_AddObjectRef(m, "Binding", (PyObject *)&BindingType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
