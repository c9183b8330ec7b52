/* Autograd's recording in C (Note [C core files], Note [Autograd in C]): NodeBase, the
 * fields every autograd node sets, and RecordingKernel, the autograd layer's kernel of
 * a binary operator (Note [C recording]). The only file of the core that knows autograd. */
#include "core.h"

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
    .tp_getset = dict_getset,
    .tp_dictoffset = offsetof(NodeObject, dict),
    .tp_weaklistoffset = offsetof(NodeObject, weakreflist),
};

/* ------------------------------------------------------------------ RecordingKernel
 * Note [C recording]: the autograd layer's kernel of a binary operator, in C: it
 * redispatches below the AUTOGRAD key through the operator's table, and when grad mode
 * is on records the node as graph.record_binary's common case does (two tensors of the
 * result's dtype and shape, each a leaf, a first output or no grad, a formula saving
 * nothing or both, no version to record): one node, two tuples. Everything else calls
 * record_binary itself; the layer's Python kernel is the reference. With tensors=1 it
 * is the kernel of an operator of one tensor (exp, tanh, relu, ...), and of one setting
 * after it with inputs=2 (softmax's dim, leaky_relu's slope), and records as
 * graph.record_unary's common case does: one tensor of the result's dtype and shape, a
 * formula saving nothing or its input (the setting is always kept), and, for a formula
 * that uses the result, the pair (weak reference to it, detached alias) record()
 * keeps. */

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
    PyObject *record;         /* graph.record_binary(derivative, a, b, out) (record_unary) */
    PyObject *dict;
    long long autograd_key;
    int inputs;               /* the operator's arguments: 1 or 2 */
    int tensors;              /* 2: a binary operator's kernel; 1: one tensor's */
    int saves;                /* Derivative.binary_saves (unary_saves): 0, 1, or -1 (None) */
    int uses_result;          /* Derivative.uses_result (one-argument operators) */
} RecordingObject;

static PyTypeObject RecordingType;
static PyObject *enabled_str, *detach_str, *result_str;

/* the node a tensor's gradient flows into (new ref; None without grad), or NULL with
 * no error: a case for record_binary (record_unary) */
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

/* graph.record_unary's common case; 0: a case for record_unary itself */
static int record_unary_fast(RecordingObject *r, PyObject *x, PyObject *setting, PyObject *out) {
    if (r->saves < 0 || Py_TYPE(x) != tensor_type || Py_TYPE(out) != tensor_type) return 0;
    TensorObject *tx = T(x), *to = T(out);
    if (tx->dtype != to->dtype || !same_shape(tx->shape, to->shape)) return 0;
    if ((r->saves || r->uses_result) && PyDict_GET_SIZE(r->versions)) return 0;
    PyObject *nx = next_node(r, tx);
    if (nx == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *result = NULL;
    if (r->uses_result) {  /* (weakref.ref(out), out.detach()) */
        PyObject *ref = PyWeakref_NewRef(out, NULL);
        PyObject *alias = ref == NULL ? NULL : PyObject_CallMethodNoArgs(out, detach_str);
        result = alias == NULL ? NULL : PyTuple_Pack(2, ref, alias);
        Py_XDECREF(ref);
        Py_XDECREF(alias);
        if (result == NULL) {
            Py_DECREF(nx);
            return -1;
        }
    }
    NodeObject *node = (NodeObject *)r->node_type->tp_alloc(r->node_type, 0);
    PyObject *next_nodes, *saved;
    if (setting == NULL) {
        next_nodes = PyTuple_Pack(1, nx);
        saved = r->saves ? PyTuple_Pack(1, x) : (Py_INCREF(r->nothing_saved), r->nothing_saved);
    } else {
        next_nodes = PyTuple_Pack(2, nx, Py_None);
        saved = PyTuple_Pack(2, r->saves ? x : Py_None, setting);
    }
    Py_DECREF(nx);
    PyObject *ks_obj = PyLong_FromLongLong(to->ks | r->autograd_key);
    if (node == NULL || next_nodes == NULL || saved == NULL || ks_obj == NULL ||
        (result != NULL && PyObject_SetAttr((PyObject *)node, result_str, result) < 0)) {
        Py_XDECREF(node);
        Py_XDECREF(next_nodes);
        Py_XDECREF(saved);
        Py_XDECREF(ks_obj);
        Py_XDECREF(result);
        return -1;
    }
    Py_XDECREF(result);
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
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != r->inputs + 1 ||
        !PyLong_CheckExact(args[0]))
        return PyObject_Vectorcall(r->reference, args, nargsf, kwnames);
    long long ks = PyLong_AsLongLong(args[0]);
    if (ks == -1 && PyErr_Occurred()) return NULL;
    long long below = ks & ~r->autograd_key;
    int i = bit_length(below);
    PyObject *table = r->d->table;
    if (i >= PyList_GET_SIZE(table)) return PyObject_Vectorcall(r->reference, args, nargsf, NULL);
    PyObject *out = run_table_kernel(table, i, below, args + 1, r->inputs);
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
    int unary = r->tensors == 1;
    PyObject *setting = unary && r->inputs == 2 ? args[2] : NULL;
    int done = unary ? record_unary_fast(r, args[1], setting, out)
                     : record_fast(r, args[1], args[2], out);
    if (done == 0) {  /* record_binary(derivative, a, b, out), record_unary(derivative, x, out[,
                       * setting]) */
        PyObject *rargs[4] = {r->derivative, args[1], unary ? out : args[2], unary ? setting : out};
        PyObject *node = PyObject_Vectorcall(r->record, rargs, unary ? 3 + (setting != NULL) : 4, NULL);
        if (node == NULL) done = -1;
        Py_XDECREF(node);
    }
    if (done < 0) Py_CLEAR(out);
    return out;
}

/* RecordingKernel(kernel, *, derivative, table, node_type, grad_state, versions,
 *                 nothing_saved, accumulator, record, autograd, tensors=2, inputs=tensors) */
static PyObject *recording_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kernel", "derivative", "table", "node_type", "grad_state",
                             "versions", "nothing_saved", "accumulator", "record", "autograd",
                             "tensors", "inputs", NULL};
    PyObject *kernel, *derivative, *node_type, *grad_state, *versions, *nothing, *acc, *record;
    OperatorTableObject *d;
    long long autograd;
    int tensors = 2, inputs = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OO!O!OO!O!OOLii:RecordingKernel", kwlist,
                                     &kernel, &derivative, &OperatorTableType, &d, &PyType_Type,
                                     &node_type, &grad_state, &PyDict_Type, &versions,
                                     &PyTuple_Type, &nothing, &acc, &record, &autograd, &tensors,
                                     &inputs))
        return NULL;
    if (inputs < 0) inputs = tensors;
    if ((tensors != 1 && tensors != 2) || inputs < tensors || inputs > 2) {
        PyErr_SetString(PyExc_ValueError,
                        "RecordingKernel: tensors must be 1 or 2, inputs tensors to 2");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)node_type, &NodeBaseType)) {
        PyErr_SetString(PyExc_TypeError, "RecordingKernel: node_type must subclass NodeBase");
        return NULL;
    }
    PyObject *saves = PyObject_GetAttrString(derivative, tensors == 1 ? "unary_saves" : "binary_saves");
    if (saves == NULL) return NULL;
    PyObject *uses = PyObject_GetAttrString(derivative, "uses_result");
    int uses_result = uses == NULL ? -1 : PyObject_IsTrue(uses);
    Py_XDECREF(uses);
    RecordingObject *r = uses_result < 0 ? NULL : (RecordingObject *)type->tp_alloc(type, 0);
    if (r == NULL) {
        Py_DECREF(saves);
        return NULL;
    }
    r->vectorcall = (vectorcallfunc)recording_vectorcall;
    r->saves = saves == Py_None ? -1 : PyObject_IsTrue(saves);
    Py_DECREF(saves);
    r->inputs = inputs;
    r->tensors = tensors;
    r->uses_result = tensors == 1 && uses_result;
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
    .tp_getset = dict_getset,
    .tp_members = recording_members,
};

int init_recording(PyObject *m) {
    NodeBaseType.tp_new = PyBaseObject_Type.tp_new;
    enabled_str = PyUnicode_InternFromString("enabled");
    detach_str = PyUnicode_InternFromString("detach");
    result_str = PyUnicode_InternFromString("result");
    if (enabled_str == NULL || detach_str == NULL || result_str == NULL || PyType_Ready(&NodeBaseType) < 0 ||
        PyType_Ready(&RecordingType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "NodeBase", (PyObject *)&NodeBaseType) < 0 ||
        PyModule_AddObjectRef(m, "RecordingKernel", (PyObject *)&RecordingType) < 0)
        return -1;
    return 0;
}
