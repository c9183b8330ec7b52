/* TensorBase, the fields of every tensor (Note [Tensor fields]), and lamina's dtypes as
 * the fast path sees them (Note [C core files]). */
#include "core.h"

/* ------------------------------------------------------------------ dtypes */

PyObject *dtype_objs[MAX_DTYPES];
PyArray_Descr *dtype_descrs[MAX_DTYPES];
char dtype_kinds[MAX_DTYPES];
int n_dtypes = 0;

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

/* ------------------------------------------------------------------ TensorBase */

PyTypeObject *tensor_type = NULL;
PyObject *cpu_ks;

static PyObject *mod_set_tensor_type(PyObject *m, PyObject *type) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &TensorBaseType)) {
        PyErr_SetString(PyExc_TypeError, "set_tensor_type: needs a subclass of TensorBase");
        return NULL;
    }
    Py_INCREF(type);
    Py_XSETREF(tensor_type, (PyTypeObject *)type);
    Py_RETURN_NONE;
}

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

PyGetSetDef dict_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

PyTypeObject TensorBaseType = {
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

/* reference.guard_key: prefix + one (shape, dtype, ks, strides or False) per tensor,
 * or None for an argument that is not a tensor with a storage that has strides */
static PyObject *mod_guard_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_CheckExact(args[0]) || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "guard_key(prefix, args): two tuples");
        return NULL;
    }
    PyObject *prefix = args[0], *tensors = args[1];
    Py_ssize_t np = PyTuple_GET_SIZE(prefix), n = PyTuple_GET_SIZE(tensors);
    PyObject *key = PyTuple_New(np + n);
    if (key == NULL) return NULL;
    for (Py_ssize_t i = 0; i < np; i++)
        PyTuple_SET_ITEM(key, i, Py_NewRef(PyTuple_GET_ITEM(prefix, i)));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(tensors, i);
        TensorObject *t = T(a);
        if (!IS_TENSOR(a) || t->shape == NULL || t->dtype == NULL || t->ks_obj == NULL ||
            t->flat == NULL || t->data == NULL)
            goto not_tensors;
        PyObject *strides = t->flat == Py_None ? PyObject_GetAttrString(t->data, "strides")
                                               : Py_NewRef(Py_False);
        if (strides == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError) &&
                !PyErr_ExceptionMatches(PyExc_TypeError))
                goto error;
            PyErr_Clear();
            goto not_tensors;
        }
        PyObject *item = PyTuple_Pack(4, t->shape, t->dtype, t->ks_obj, strides);
        Py_DECREF(strides);
        if (item == NULL) goto error;
        PyTuple_SET_ITEM(key, np + i, item);
    }
    return key;
not_tensors:
    Py_DECREF(key);
    Py_RETURN_NONE;
error:
    Py_DECREF(key);
    return NULL;
}

/* reference.guard_token: the same facts as guard_key, as bytes (hashed and compared
 * as one buffer: a tuple key's nested hash and comparison were a third of a compiled
 * call); None where guard_key's general path must decide. The prefix is of ints. */
#define TOKEN_WORDS 512
#define NO_TOKEN (-1) /* token_words: guard_key's general path decides (error not set) */

/* the token's words into buffer: how many, NO_TOKEN, or -2 with an error set */
static Py_ssize_t token_words(PyObject *const *prefix, Py_ssize_t np, PyObject *const *tensors,
                              Py_ssize_t n, long long *buffer) {
    Py_ssize_t used = 0;
    if (np > 8) return NO_TOKEN;
    buffer[used++] = np;  /* then every record delimits itself */
    for (Py_ssize_t i = 0; i < np; i++) {
        buffer[used++] = PyLong_AsLongLong(prefix[i]);
        if (buffer[used - 1] == -1 && PyErr_Occurred()) return -2;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = tensors[i];
        TensorObject *t = T(a);
        if (!IS_TENSOR(a) || !TENSOR_ARGS_OK(t) || !PyTuple_CheckExact(t->shape) ||
            t->flat == NULL || t->data == NULL)
            return NO_TOKEN;
        Py_ssize_t nd = PyTuple_GET_SIZE(t->shape);
        int strided = t->flat == Py_None;
        if (strided && (!PyArray_Check(t->data) || PyArray_NDIM((PyArrayObject *)t->data) != nd))
            return NO_TOKEN;
        if (used + 3 + 2 * nd > TOKEN_WORDS) return NO_TOKEN;
        buffer[used++] = t->dtype_index;
        buffer[used++] = t->ks;
        buffer[used++] = strided ? -nd - 1 : nd;  /* the layout's kind and the rank */
        for (Py_ssize_t d = 0; d < nd; d++) {
            buffer[used++] = PyLong_AsLongLong(PyTuple_GET_ITEM(t->shape, d));
            if (buffer[used - 1] == -1 && PyErr_Occurred()) return -2;
        }
        if (strided)
            for (Py_ssize_t d = 0; d < nd; d++)
                buffer[used++] = PyArray_STRIDE((PyArrayObject *)t->data, (int)d);
    }
    return used;
}

static PyObject *token_of(PyObject *const *prefix, Py_ssize_t np, PyObject *const *tensors,
                          Py_ssize_t n) {
    long long buffer[TOKEN_WORDS];
    Py_ssize_t used = token_words(prefix, np, tensors, n, buffer);
    if (used == NO_TOKEN) Py_RETURN_NONE;
    if (used < 0) return NULL;
    return PyBytes_FromStringAndSize((const char *)buffer, used * (Py_ssize_t)sizeof(long long));
}

static PyObject *mod_guard_token(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_CheckExact(args[0]) || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "guard_token(prefix, args): two tuples");
        return NULL;
    }
    return token_of(PySequence_Fast_ITEMS(args[0]), PyTuple_GET_SIZE(args[0]),
                    PySequence_Fast_ITEMS(args[1]), PyTuple_GET_SIZE(args[1]));
}

/* reference.CompiledCall (Note [Guard tokens] in lamina.jit's compiler): a compiled
 * function's hot path. A call of positional tensors whose token (with the tables'
 * generation and this thread's recording mode) is in `runs` runs that variant's plan on the
 * arguments; every other call goes to `general`, the Python function, which compiles,
 * runs and fills `runs`. Other attributes are the general function's. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *general;     /* lamina.jit's CompiledFunction */
    PyObject *runs;        /* its dict: token -> run(arguments) */
    PyObject *generation;  /* (object, name) holding the tables' generation */
    PyObject *mode;        /* (object, name) holding the recording mode */
    PyObject *last_token;  /* the token of the last call that ran, or NULL */
    PyObject *weakreflist;
} CompiledCallObject;

/* The run of this call's token words, a new reference; NULL with or without an error
 * set. A call like the last one (most are) reuses the last token's bytes object: its
 * hash is cached, so the lookup neither allocates nor hashes (a third of the fixed
 * cost of a 100-element fused call). Looked up in `runs` every time, so a variant the
 * Python side dropped is never run. */
static PyObject *run_of(CompiledCallObject *c, const long long *words, Py_ssize_t used) {
    Py_ssize_t size = used * (Py_ssize_t)sizeof(long long);
    PyObject *token = c->last_token;
    if (token != NULL && PyBytes_GET_SIZE(token) == size &&
        memcmp(PyBytes_AS_STRING(token), words, size) == 0) {
        Py_INCREF(token);
    } else {
        token = PyBytes_FromStringAndSize((const char *)words, size);
        if (token == NULL) return NULL;
    }
    PyObject *run = PyDict_GetItemWithError(c->runs, token);
    if (run != NULL) Py_XSETREF(c->last_token, Py_NewRef(token));
    Py_DECREF(token);
    return Py_XNewRef(run);
}

static PyObject *compiled_call(CompiledCallObject *c, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        PyObject *prefix[2];
        prefix[0] = PyObject_GetAttr(PyTuple_GET_ITEM(c->generation, 0),
                                     PyTuple_GET_ITEM(c->generation, 1));
        if (prefix[0] == NULL) return NULL;
        prefix[1] = PyObject_GetAttr(PyTuple_GET_ITEM(c->mode, 0), PyTuple_GET_ITEM(c->mode, 1));
        if (prefix[1] == NULL) {
            Py_DECREF(prefix[0]);
            return NULL;
        }
        long long words[TOKEN_WORDS];
        Py_ssize_t used = token_words(prefix, 2, args, nargs, words);
        Py_DECREF(prefix[0]);
        Py_DECREF(prefix[1]);
        if (used == -2) return NULL;
        /* a new reference: the dict may change while it runs */
        PyObject *run = used == NO_TOKEN ? NULL : run_of(c, words, used);
        if (run != NULL) {
            PyObject *result = call_fused_run(run, args, nargs);
            PyObject *arguments = result || PyErr_Occurred() ? NULL : PyTuple_New(nargs);
            if (arguments != NULL) {
                for (Py_ssize_t i = 0; i < nargs; i++)
                    PyTuple_SET_ITEM(arguments, i, Py_NewRef(args[i]));
                result = PyObject_CallOneArg(run, arguments);
                Py_DECREF(arguments);
            }
            Py_DECREF(run);
            return result;
        }
        if (PyErr_Occurred()) return NULL;
    }
    return PyObject_Vectorcall(c->general, args, nargsf, kwnames);
}

static PyObject *compiled_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *general, *runs, *generation, *mode;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "CompiledCall takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!O!O!:CompiledCall", &general, &PyDict_Type, &runs,
                          &PyTuple_Type, &generation, &PyTuple_Type, &mode))
        return NULL;
    if (PyTuple_GET_SIZE(generation) != 2 || PyTuple_GET_SIZE(mode) != 2 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(generation, 1)) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(mode, 1))) {
        PyErr_SetString(PyExc_TypeError,
                        "CompiledCall(general, runs, (object, name), (object, name))");
        return NULL;
    }
    CompiledCallObject *c = (CompiledCallObject *)type->tp_alloc(type, 0);
    if (c == NULL) return NULL;
    c->vectorcall = (vectorcallfunc)compiled_call;
    c->general = Py_NewRef(general);
    c->runs = Py_NewRef(runs);
    c->generation = Py_NewRef(generation);
    c->mode = Py_NewRef(mode);
    return (PyObject *)c;
}

static PyObject *compiled_getattro(CompiledCallObject *c, PyObject *name) {
    /* the wrapped function's docstring and module, not this type's */
    if (PyUnicode_CompareWithASCIIString(name, "__doc__") == 0 ||
        PyUnicode_CompareWithASCIIString(name, "__module__") == 0)
        return PyObject_GetAttr(c->general, name);
    PyObject *found = PyObject_GenericGetAttr((PyObject *)c, name);
    if (found != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) return found;
    PyErr_Clear();
    return PyObject_GetAttr(c->general, name);
}

/* an attribute set on the compiled function is the Python function's (cache_limit) */
static int compiled_setattro(CompiledCallObject *c, PyObject *name, PyObject *value) {
    return PyObject_SetAttr(c->general, name, value);
}

static int compiled_traverse(CompiledCallObject *c, visitproc visit, void *arg) {
    Py_VISIT(c->general);
    Py_VISIT(c->runs);
    Py_VISIT(c->generation);
    Py_VISIT(c->mode);
    return 0;
}

static int compiled_clear(CompiledCallObject *c) {
    Py_CLEAR(c->general);
    Py_CLEAR(c->runs);
    Py_CLEAR(c->generation);
    Py_CLEAR(c->mode);
    Py_CLEAR(c->last_token);
    return 0;
}

static void compiled_dealloc(CompiledCallObject *c) {
    PyObject_GC_UnTrack(c);
    if (c->weakreflist != NULL) PyObject_ClearWeakRefs((PyObject *)c);
    compiled_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *compiled_repr(CompiledCallObject *c) { return PyObject_Repr(c->general); }

static PyMemberDef compiled_members[] = {
    {"general", T_OBJECT, offsetof(CompiledCallObject, general), READONLY,
     "the compiled function's Python twin: every call the hot path does not take"},
    {NULL},
};

static PyTypeObject CompiledCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lamina.dispatch._core.CompiledCall",
    .tp_doc = "A compiled function's hot path (reference.CompiledCall), in C.",
    .tp_basicsize = sizeof(CompiledCallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = compiled_new,
    .tp_dealloc = (destructor)compiled_dealloc,
    .tp_traverse = (traverseproc)compiled_traverse,
    .tp_clear = (inquiry)compiled_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(CompiledCallObject, vectorcall),
    .tp_getattro = (getattrofunc)compiled_getattro,
    .tp_setattro = (setattrofunc)compiled_setattro,
    .tp_weaklistoffset = offsetof(CompiledCallObject, weakreflist),
    .tp_repr = (reprfunc)compiled_repr,
    .tp_members = compiled_members,
};

static PyMethodDef tensor_functions[] = {
    {"set_tensor_type", mod_set_tensor_type, METH_O, "the class of kernel outputs"},
    {"guard_key", (PyCFunction)(void (*)(void))mod_guard_key, METH_FASTCALL,
     "a compiled function's guard key (reference.guard_key)"},
    {"guard_token", (PyCFunction)(void (*)(void))mod_guard_token, METH_FASTCALL,
     "the guard key's facts as bytes (reference.guard_token)"},
    {"set_dtypes", mod_set_dtypes, METH_O, "lamina's dtypes, in index order"},
    {NULL},
};

int init_tensor(PyObject *m) {
    TensorBaseType.tp_hash = PyBaseObject_Type.tp_hash;  /* identity, as object's */
    TensorBaseType.tp_new = PyBaseObject_Type.tp_new;    /* object.__new__(Tensor) works */
    cpu_ks = PyLong_FromLong(1);
    if (cpu_ks == NULL || PyType_Ready(&TensorBaseType) < 0) return -1;
    if (PyType_Ready(&CompiledCallType) < 0) return -1;
    if (PyModule_AddObjectRef(m, "TensorBase", (PyObject *)&TensorBaseType) < 0 ||
        PyModule_AddObjectRef(m, "CompiledCall", (PyObject *)&CompiledCallType) < 0)
        return -1;
    return PyModule_AddFunctions(m, tensor_functions);
}
