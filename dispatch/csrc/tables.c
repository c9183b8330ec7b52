/* The tables and bindings (Note [C core files]): an operator's table (OperatorTable),
 * the bindings of elementwise operators (Binding), and Tensor's operator methods
 * (set_slot), which call a Binding directly. */
#include "core.h"

/* ------------------------------------------------------------------ OperatorTable */

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

PyTypeObject OperatorTableType = {
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

/* Note [Modes] (modes.py): while a mode is on in any thread, every call goes to the
 * reference binding, which applies the calling thread's mode keys */
static int modes_active = 0;

/* bindings.direct_binding's call (the dispatcher layer off): dense CPU tensors straight
 * to the CPU kernel, anything else to the reference (which refuses it) */
static PyObject *direct_call(BindingObject *self, PyObject *const *ops, int n) {
    for (int i = 0; i < n; i++)
        if (!IS_TENSOR(ops[i]) || T(ops[i])->ks_obj == NULL || T(ops[i])->ks != 1)
            return PyObject_Vectorcall(self->fallback, ops, n, NULL);
    return run_kernel(self->direct, 1, ops, n);
}

/* reference.binary_binding's call: two tensors through the table, a tensor and an
 * exact Python scalar through the scalar table, anything else by the reference */
static PyObject *binding_call2(BindingObject *self, PyObject *a, PyObject *b) {
    OperatorTableObject *d = self->d;
    PyObject *table, *ops[2] = {a, b};
    long long ks;
    if (modes_active) return call2(self->fallback, a, b);
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
    if (modes_active) return call1(self->fallback, x);
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
    .tp_getset = dict_getset,
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

PyObject *tensor_richcompare(PyObject *a, PyObject *b, int op) {
    static const int map[6] = {S_LT, S_LE, S_EQ, S_NE, S_GT, S_GE};  /* Py_LT .. Py_GE */
    PyObject *fn = slots[map[op]].fn;
    if (fn == NULL) Py_RETURN_NOTIMPLEMENTED;
    return slot_call2(fn, a, b);
}

PyNumberMethods tensor_as_number = {
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

static PyObject *mod_set_modes_active(PyObject *mod, PyObject *on) {
    int flag = PyObject_IsTrue(on);
    if (flag < 0) return NULL;
    modes_active = flag;
    Py_RETURN_NONE;
}

static PyMethodDef tables_functions[] = {
    {"set_modes_active", (PyCFunction)mod_set_modes_active, METH_O,
     "whether a mode is on in any thread (Note [Modes])"},
    {"set_slot", (PyCFunction)(void (*)(void))mod_set_slot, METH_VARARGS | METH_KEYWORDS,
     "Tensor's operator method __dunder__ (and __rdunder__)"},
    {NULL},
};

int init_tables(PyObject *m) {
    if (PyType_Ready(&OperatorTableType) < 0 || PyType_Ready(&BindingType) < 0) return -1;
    if (PyModule_AddObjectRef(m, "OperatorTable", (PyObject *)&OperatorTableType) < 0 ||
        PyModule_AddObjectRef(m, "Binding", (PyObject *)&BindingType) < 0)
        return -1;
    return PyModule_AddFunctions(m, tables_functions);
}
