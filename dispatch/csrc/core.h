/* lamina.dispatch._core -- the per-call core in C: what its source files share.
 *
 * Note [Two cores] (reference.py): these files implement exactly the algorithm of the
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
 *
 * Note [C core files]: one concern per file, each compiled on its own (setup.py
 * compiles every .c file of this folder into the one extension):
 *
 *   tensor.c     lamina's dtypes as the fast path sees them, TensorBase, and a compiled
 *                function's guards (guard_key, guard_token) and hot path (CompiledCall)
 *   tables.c     OperatorTable, Binding, and Tensor's operator methods (set_slot)
 *   fastpath.c   ElementwiseKernel (contiguous and general paths), ReductionKernel,
 *                RowsKernel, FusedLoop (a compiled plan's fused elementwise loops)
 *   recording.c  autograd's recording: NodeBase, RecordingKernel (Note [C recording])
 *   pool.c       the pool allocator (Note [Pool allocator])
 *   module.c     the module: each file's types and functions, added by its init
 *
 * What they share is declared here and nowhere else; everything else in a file is
 * static. The hot path crosses files once per call (a binding or the recording kernel
 * calling run_table_kernel); the helpers it runs on every call are static inline here,
 * and the shared names are hidden (CORE_SHARED): the compiler reaches them directly, as
 * a static one. Measured with callgrind on `out = out + x` (100 float32, full stack),
 * instructions per call: 2,181-2,193 so compiled, 2,179-2,185 for the same code as one
 * file, 2,204 linked with -flto; so the files are compiled separately, with no link-time
 * step.
 *
 * Note [Autograd in C]: dispatch knows nothing of autograd, with one exception, here:
 * recording.c records a binary or one-argument operator's node in C (Note [C
 * recording]): it runs on every differentiable call, part of the per-call cost this
 * core exists to cut (its Python twin is reference.RecordingKernel). The exception is kept to that file, and
 * tests/test_architecture.py reads these files to hold it there:
 *   - only recording.c names autograd's types and fields (nodes, derivatives, grad
 *     mode, the recording itself);
 *   - tensor.c stores TensorBase's autograd fields (Note [Autograd fields]) and hands
 *     them to Python, as reference.TensorBase does, without acting on them;
 *   - module.c calls recording.c's init; no other file names any of it;
 *   - no file includes anything but this header and the C library's, Python's and
 *     NumPy's, and no file imports a Python module: autograd hands the recording kernel
 *     its node type, grad state and formula (autograd/layer.py), so the imports still
 *     run one way.
 */
#ifndef LAMINA_CORE_H
#define LAMINA_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* one NumPy API table for the whole extension, filled by module.c's import_array() */
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL lamina_core_ARRAY_API
#define PY_UFUNC_UNIQUE_SYMBOL lamina_core_UFUNC_API
#ifndef CORE_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#define NO_IMPORT_UFUNC
#endif
#include <numpy/arrayobject.h>
#include <numpy/ufuncobject.h>

/* a name shared between the core's files: never exported from the extension, so the
 * compiler reaches it directly, as it does a static one */
#define CORE_SHARED __attribute__((visibility("hidden")))

#define MAX_DTYPES 32

/* ------------------------------------------------------------------ tensor.c */

/* set_dtypes(): per dtype index, what the fast path needs of lamina's dtypes */
CORE_SHARED extern PyObject *dtype_objs[MAX_DTYPES];         /* the DType objects */
CORE_SHARED extern PyArray_Descr *dtype_descrs[MAX_DTYPES];  /* their NumPy dtypes */
CORE_SHARED extern char dtype_kinds[MAX_DTYPES];             /* 'b', 'i', 'u', 'f', 'c' */
CORE_SHARED extern int n_dtypes;

static inline int dtype_index_of(PyObject *dtype) {
    for (int i = 0; i < n_dtypes; i++)
        if (dtype_objs[i] == dtype) return i;
    return -1;
}

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

CORE_SHARED extern PyTypeObject TensorBaseType;
CORE_SHARED extern PyTypeObject *tensor_type;  /* set_tensor_type(): the class of outputs */
CORE_SHARED extern PyObject *cpu_ks;           /* the int 1: the CPU key */
CORE_SHARED extern PyGetSetDef dict_getset[];  /* __dict__, for the types that have one */

#define IS_TENSOR(o) PyObject_TypeCheck((o), &TensorBaseType)
#define T(o) ((TensorObject *)(o))
#define TENSOR_ARGS_OK(t) ((t)->ks_obj != NULL && (t)->dtype_index >= 0 && (t)->shape != NULL)

/* reference.PY_SCALARS; a Python complex is not among them: it takes the reference's
 * binding and the kernel's general path (Note [Scalar fast path]) */
#define IS_PY_SCALAR(o) (PyFloat_CheckExact(o) || PyLong_CheckExact(o) || PyBool_Check(o))

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

/* ------------------------------------------------------------------ calling helpers */

static inline PyObject *call1(PyObject *fn, PyObject *a) {
    PyObject *args[1] = {a};
    return PyObject_Vectorcall(fn, args, 1, NULL);
}

static inline PyObject *call2(PyObject *fn, PyObject *a, PyObject *b) {
    PyObject *args[2] = {a, b};
    return PyObject_Vectorcall(fn, args, 2, NULL);
}

static inline int bit_length(long long ks) {
    return ks <= 0 ? 0 : 64 - __builtin_clzll((unsigned long long)ks);
}

/* ------------------------------------------------------------------ tables.c */

typedef struct {
    PyObject_HEAD
    PyObject *table;         /* list, indexed by ks.bit_length() */
    PyObject *scalar_table;  /* list: the with_scalar variants (Note [Kernel variants]) */
    long long mask;
} OperatorTableObject;

CORE_SHARED extern PyTypeObject OperatorTableType;

/* Tensor's operator methods (set_slot): TensorBase's number protocol and comparisons */
CORE_SHARED extern PyNumberMethods tensor_as_number;
CORE_SHARED PyObject *tensor_richcompare(PyObject *a, PyObject *b, int op);

/* ------------------------------------------------------------------ fastpath.c */

/* the kernel in slot i of an operator's table, run on n operands (Note [Kernel
 * references]); a C ElementwiseKernel's fast path runs without boxing the key set */
CORE_SHARED PyObject *run_table_kernel(PyObject *table, int i, long long ks,
                                       PyObject *const *ops, int n);
CORE_SHARED PyObject *run_kernel(PyObject *kernel, long long ks, PyObject *const *ops, int n);
/* a compiled call's run when it is a FusedLoop's run method: the loop's call on the
 * call's arguments, with no tuple made; NULL with no error set for any other run */
CORE_SHARED PyObject *call_fused_run(PyObject *run, PyObject *const *args, Py_ssize_t n);

/* ------------------------------------------------------------------ each file's init:
 * makes its types ready and adds them and its functions to the module; -1 on error */
CORE_SHARED int init_tensor(PyObject *m);
CORE_SHARED int init_tables(PyObject *m);
CORE_SHARED int init_fastpath(PyObject *m);
CORE_SHARED int init_recording(PyObject *m);
CORE_SHARED int init_pool(PyObject *m);

#endif
