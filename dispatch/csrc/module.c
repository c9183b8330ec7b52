/* The module lamina.dispatch._core (Note [C core files]): each file's init adds its types
 * and functions. The one file that fills NumPy's API table (import_array). */
#define CORE_IMPORTS_NUMPY
#include "core.h"

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "lamina.dispatch._core",
    "The per-call core of lamina in C (Note [Two cores] in dispatch/reference.py).", -1,
};

PyMODINIT_FUNC PyInit__core(void) {
    import_array();
    import_umath();
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL) return NULL;
    if (PyModule_AddStringConstant(m, "IMPLEMENTATION", "c") < 0 || init_tensor(m) < 0 ||
        init_tables(m) < 0 || init_fastpath(m) < 0 || init_recording(m) < 0 ||
        init_pool(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
