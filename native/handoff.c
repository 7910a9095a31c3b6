/* sut._native: the zero-copy handoff between the harness stages (see sut/handoff.py for the interface).
 *
 * NativeHandoff.gather copies staged rows into a batch buffer with memcpy, the GIL released for large
 * copies. NativeHandoff.complete turns one batch output buffer into LoadGen responses that point into
 * it and calls LoadGen while holding a buffer view of it, so the bytes cannot move or be freed until
 * LoadGen has returned. Completion goes straight to LoadGen's C entry point when it can be found in the
 * loaded module ("loadgen-c"), otherwise through the pybind11 objects, built from C ("pybind"). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "issue_queue.h"
#include "loadgen_entry.h"

/* Below this many bytes a copy takes less time than handing the GIL to another thread and waiting to
 * get it back (which can take a whole switch interval when that thread runs Python). */
#define GATHER_RELEASE_GIL_BYTES (256 * 1024)

/* Responses for batches up to this size live on the stack (32 bytes each). */
#define STACK_RESPONSES 256

enum completion_path { PATH_LOADGEN_C, PATH_PYBIND };

typedef struct {
    PyObject_HEAD
    enum completion_path path;
    lg_complete_fn loadgen_complete; /* PATH_LOADGEN_C */
    PyObject *response_type;         /* PATH_PYBIND: mlperf_loadgen.QuerySampleResponse */
    PyObject *samples_complete;      /* PATH_PYBIND: mlperf_loadgen.QuerySamplesComplete */
} NativeHandoff;

/* ---------------------------------------------------------------- integer vectors from Python */

/* An integer vector read from a list, tuple or 1-d integer buffer (numpy array), without copying
 * buffers. Exactly one of `items` (a PySequence_Fast result) and `view` is in use. */
typedef struct {
    PyObject *items;
    Py_buffer view;
    int has_view;
    char kind;  /* buffer format letter */
    Py_ssize_t length;
} int_vector;

static const char *skip_byte_order(const char *format)
{
    /* '@' and '=' are native order; '<' is native on the little-endian machines we build for. */
    if (format && (format[0] == '@' || format[0] == '=' || (format[0] == '<' && PY_LITTLE_ENDIAN)))
        return format + 1;
    return format ? format : "B";
}

static int int_vector_open(int_vector *vector, PyObject *source, const char *what)
{
    memset(vector, 0, sizeof(*vector));
    if (!PyList_CheckExact(source) && !PyTuple_CheckExact(source) && PyObject_CheckBuffer(source)) {
        if (PyObject_GetBuffer(source, &vector->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            return -1;
        vector->has_view = 1;
        const char *format = skip_byte_order(vector->view.format);
        if (vector->view.ndim != 1 || format[0] == '\0' || format[1] != '\0' ||
            !strchr("bBhHiIlLqQnN", format[0])) {
            PyErr_Format(PyExc_TypeError, "%s must be a 1-d integer array or a sequence of ints, got format %s",
                         what, vector->view.format ? vector->view.format : "B");
            PyBuffer_Release(&vector->view);
            vector->has_view = 0;
            return -1;
        }
        vector->kind = format[0];
        vector->length = vector->view.shape[0];
        return 0;
    }
    vector->items = PySequence_Fast(source, what);
    if (vector->items == NULL)
        return -1;
    vector->length = PySequence_Fast_GET_SIZE(vector->items);
    return 0;
}

static void int_vector_close(int_vector *vector)
{
    if (vector->has_view)
        PyBuffer_Release(&vector->view);
    Py_CLEAR(vector->items);
}

/* Element i as a signed 64-bit value; sets *overflow when it does not fit (huge unsigned values). */
static int int_vector_get(const int_vector *vector, Py_ssize_t i, long long *value)
{
    if (vector->items) {
        int overflow = 0;
        *value = PyLong_AsLongLongAndOverflow(PySequence_Fast_ITEMS(vector->items)[i], &overflow);
        if (overflow) {
            *value = overflow > 0 ? LLONG_MAX : LLONG_MIN;
            return 0;
        }
        return (*value == -1 && PyErr_Occurred()) ? -1 : 0;
    }
    const char *base = (const char *)vector->view.buf;
    switch (vector->kind) {
    case 'b': *value = ((const signed char *)base)[i]; break;
    case 'B': *value = ((const unsigned char *)base)[i]; break;
    case 'h': *value = ((const short *)base)[i]; break;
    case 'H': *value = ((const unsigned short *)base)[i]; break;
    case 'i': *value = ((const int *)base)[i]; break;
    case 'I': *value = ((const unsigned int *)base)[i]; break;
    case 'l': *value = ((const long *)base)[i]; break;
    case 'q': *value = ((const long long *)base)[i]; break;
    case 'n': *value = ((const Py_ssize_t *)base)[i]; break;
    default: { /* unsigned 64-bit: 'L', 'Q', 'N' */
        unsigned long long raw = ((const unsigned long long *)base)[i];
        *value = raw > (unsigned long long)LLONG_MAX ? LLONG_MAX : (long long)raw;
    }
    }
    return 0;
}

/* Element i as an unsigned 64-bit value (LoadGen response ids are pointers). */
static int int_vector_get_unsigned(const int_vector *vector, Py_ssize_t i, unsigned long long *value)
{
    if (vector->items) {
        *value = PyLong_AsUnsignedLongLong(PySequence_Fast_ITEMS(vector->items)[i]);
        return (*value == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : 0;
    }
    if (strchr("LQN", vector->kind)) {
        *value = ((const unsigned long long *)vector->view.buf)[i];
        return 0;
    }
    long long signed_value;
    int_vector_get(vector, i, &signed_value);
    if (signed_value < 0) {
        PyErr_Format(PyExc_OverflowError, "query id %lld at position %zd is negative", signed_value, i);
        return -1;
    }
    *value = (unsigned long long)signed_value;
    return 0;
}

/* ---------------------------------------------------------------- gather */

static int same_element_type(const Py_buffer *a, const Py_buffer *b)
{
    return a->itemsize == b->itemsize && strcmp(skip_byte_order(a->format), skip_byte_order(b->format)) == 0;
}

static PyObject *NativeHandoff_gather(NativeHandoff *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "gather(staged, rows, out) takes 3 arguments, got %zd", nargs);
        return NULL;
    }
    Py_buffer staged, out;
    int_vector rows;
    if (PyObject_GetBuffer(args[0], &staged, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&staged);
        return NULL;
    }
    if (int_vector_open(&rows, args[1], "rows") < 0) {
        PyBuffer_Release(&out);
        PyBuffer_Release(&staged);
        return NULL;
    }

    PyObject *result = NULL;
    long long *row_numbers = NULL;
    Py_ssize_t count = rows.length;
    if (staged.ndim < 1 || out.ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "staged and out must have at least one dimension");
        goto done;
    }
    if (!same_element_type(&staged, &out)) {
        PyErr_Format(PyExc_TypeError, "out holds %s elements, staged holds %s", out.format ? out.format : "B",
                     staged.format ? staged.format : "B");
        goto done;
    }
    Py_ssize_t staged_rows = staged.shape[0];
    Py_ssize_t row_bytes = staged.itemsize;
    for (int d = 1; d < staged.ndim; d++)
        row_bytes *= staged.shape[d];
    if (out.shape[0] != count || out.len != count * row_bytes) {
        PyErr_Format(PyExc_ValueError, "out must hold %zd rows of %zd bytes, has %zd rows and %zd bytes", count,
                     row_bytes, out.shape[0], out.len);
        goto done;
    }
    /* Same bytes per row is not enough: a row of another shape (or any shape, with no rows) is a bug. */
    int same_row_shape = out.ndim == staged.ndim;
    for (int d = 1; same_row_shape && d < staged.ndim; d++)
        same_row_shape = out.shape[d] == staged.shape[d];
    if (!same_row_shape) {
        PyErr_SetString(PyExc_ValueError, "out rows must have the shape of staged rows");
        goto done;
    }
    /* memcpy between overlapping buffers is undefined; the harness never asks for it. */
    const char *staged_begin = staged.buf, *out_begin = out.buf;
    if (out.len > 0 && staged.len > 0 && out_begin < staged_begin + staged.len && staged_begin < out_begin + out.len) {
        PyErr_SetString(PyExc_ValueError, "out overlaps staged");
        goto done;
    }
    /* Check every row before copying any, so a bad row leaves out untouched. */
    row_numbers = PyMem_Malloc((size_t)(count > 0 ? count : 1) * sizeof(long long));
    if (row_numbers == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (int_vector_get(&rows, i, &row_numbers[i]) < 0)
            goto done;
        if (row_numbers[i] < 0 || row_numbers[i] >= staged_rows) {
            PyErr_Format(PyExc_IndexError, "row %lld (position %zd) is out of bounds for %zd staged samples",
                         row_numbers[i], i, staged_rows);
            goto done;
        }
    }

    char *destination = out.buf;
    const char *source = staged.buf;
    size_t stride = (size_t)row_bytes;
    if (out.len >= GATHER_RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count; i++)
            memcpy(destination + (size_t)i * stride, source + (size_t)row_numbers[i] * stride, stride);
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t i = 0; i < count; i++)
            memcpy(destination + (size_t)i * stride, source + (size_t)row_numbers[i] * stride, stride);
    }
    result = Py_NewRef(Py_None);

done:
    PyMem_Free(row_numbers);
    int_vector_close(&rows);
    PyBuffer_Release(&out);
    PyBuffer_Release(&staged);
    return result;
}

/* ---------------------------------------------------------------- complete */

static int complete_loadgen_c(NativeHandoff *self, const int_vector *ids, uintptr_t base, size_t stride)
{
    lg_response on_stack[STACK_RESPONSES];
    Py_ssize_t count = ids->length;
    lg_response *responses = count <= STACK_RESPONSES ? on_stack : PyMem_Malloc((size_t)count * sizeof(lg_response));
    if (responses == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        unsigned long long id;
        if (int_vector_get_unsigned(ids, i, &id) < 0) {
            if (responses != on_stack)
                PyMem_Free(responses);
            return -1;
        }
        responses[i].id = (uintptr_t)id;
        responses[i].data = base + (size_t)i * stride;
        responses[i].size = stride;
        responses[i].n_tokens = 0;
    }
    /* LoadGen takes its own locks and may wait on threads that need the GIL (as its binding does). */
    Py_BEGIN_ALLOW_THREADS
    self->loadgen_complete(responses, (size_t)count);
    Py_END_ALLOW_THREADS
    if (responses != on_stack)
        PyMem_Free(responses);
    return 0;
}

static int complete_pybind(NativeHandoff *self, const int_vector *ids, uintptr_t base, size_t stride)
{
    Py_ssize_t count = ids->length;
    PyObject *size = PyLong_FromSize_t(stride);
    PyObject *responses = size ? PyList_New(count) : NULL;
    int status = -1;
    if (responses == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *id;
        if (ids->items) {
            id = Py_NewRef(PySequence_Fast_ITEMS(ids->items)[i]);
        } else {
            unsigned long long value;
            if (int_vector_get_unsigned(ids, i, &value) < 0)
                goto done;
            id = PyLong_FromUnsignedLongLong(value);
        }
        PyObject *data = PyLong_FromSize_t(base + (size_t)i * stride);
        PyObject *response = NULL;
        if (id && data) {
            PyObject *call_args[3] = {id, data, size};
            response = PyObject_Vectorcall(self->response_type, call_args, 3, NULL);
        }
        Py_XDECREF(id);
        Py_XDECREF(data);
        if (response == NULL)
            goto done;
        PyList_SET_ITEM(responses, i, response);
    }
    /* The binding releases the GIL around LoadGen itself. */
    PyObject *returned = PyObject_Vectorcall(self->samples_complete, &responses, 1, NULL);
    if (returned == NULL)
        goto done;
    Py_DECREF(returned);
    status = 0;
done:
    Py_XDECREF(responses);
    Py_XDECREF(size);
    return status;
}

static PyObject *NativeHandoff_complete(NativeHandoff *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "complete(query_ids, results) takes 2 arguments, got %zd", nargs);
        return NULL;
    }
    int_vector ids;
    if (int_vector_open(&ids, args[0], "query_ids") < 0)
        return NULL;
    if (ids.length == 0) {
        int_vector_close(&ids);
        Py_RETURN_NONE;
    }
    /* The view pins `results` (a reference plus a buffer export) until LoadGen has returned. */
    Py_buffer results;
    if (PyObject_GetBuffer(args[1], &results, PyBUF_C_CONTIGUOUS) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) { /* same error as the Python handoff */
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "results must be C-contiguous");
        }
        int_vector_close(&ids);
        return NULL;
    }
    int status = -1;
    if (results.len % ids.length != 0) {
        PyErr_Format(PyExc_ValueError, "results has %zd bytes, not a whole number of rows for %zd query ids",
                     results.len, ids.length);
    } else {
        uintptr_t base = (uintptr_t)results.buf;
        size_t stride = (size_t)(results.len / ids.length);
        status = self->path == PATH_LOADGEN_C ? complete_loadgen_c(self, &ids, base, stride)
                                              : complete_pybind(self, &ids, base, stride);
    }
    PyBuffer_Release(&results);
    int_vector_close(&ids);
    if (status < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- construction */

/* The response struct we fill must be the one LoadGen was built with: the binding's fields must be
 * exactly id, data, size, n_tokens. */
static int response_layout_matches(PyObject *response_type)
{
    static const char *expected[] = {"id", "data", "size", "n_tokens"};
    PyObject *names = PyObject_Dir(response_type);
    if (names == NULL)
        return -1;
    Py_ssize_t public_names = 0, matched = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(names); i++) {
        const char *name = PyUnicode_AsUTF8(PyList_GET_ITEM(names, i));
        if (name == NULL) {
            Py_DECREF(names);
            return -1;
        }
        if (name[0] == '_')
            continue;
        public_names++;
        for (size_t e = 0; e < sizeof(expected) / sizeof(expected[0]); e++)
            matched += strcmp(name, expected[e]) == 0;
    }
    Py_DECREF(names);
    return public_names == 4 && matched == 4;
}

/* LoadGen's C entry point, resolved once per process: 0 not tried, 1 found, -1 not available. */
static int loadgen_c_state = 0;
static lg_complete_fn loadgen_c_function = NULL;
static char loadgen_c_reason[256] = "";

static int resolve_loadgen_c(PyObject *samples_complete, PyObject *response_type)
{
    if (loadgen_c_state != 0)
        return loadgen_c_state;
    loadgen_c_state = -1;
    int layout = response_layout_matches(response_type);
    if (layout < 0)
        return -2;
    if (!layout) {
        snprintf(loadgen_c_reason, sizeof(loadgen_c_reason), "QuerySampleResponse fields are not id, data, size, n_tokens");
        return loadgen_c_state;
    }
    /* The binding's C function lives in the mlperf_loadgen shared object: that names the file. */
    if (!PyCFunction_Check(samples_complete)) {
        snprintf(loadgen_c_reason, sizeof(loadgen_c_reason), "QuerySamplesComplete is not a builtin function");
        return loadgen_c_state;
    }
    const void *inside;
    PyCFunction method = ((PyCFunctionObject *)samples_complete)->m_ml->ml_meth;
    memcpy(&inside, &method, sizeof(inside)); /* POSIX: object and function pointers share a size */
    if (lg_entry_resolve(inside, &loadgen_c_function, loadgen_c_reason, sizeof(loadgen_c_reason)) == 0)
        loadgen_c_state = 1;
    return loadgen_c_state;
}

static int NativeHandoff_init(NativeHandoff *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"completion", NULL};
    const char *completion = "auto";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|s:NativeHandoff", keywords, &completion))
        return -1;
    int want_c = strcmp(completion, "loadgen-c") == 0, want_pybind = strcmp(completion, "pybind") == 0;
    if (!want_c && !want_pybind && strcmp(completion, "auto") != 0) {
        PyErr_Format(PyExc_ValueError, "completion='%s': expected 'auto', 'loadgen-c' or 'pybind'", completion);
        return -1;
    }
    PyObject *loadgen = PyImport_ImportModule("mlperf_loadgen");
    if (loadgen == NULL)
        return -1;
    PyObject *response_type = PyObject_GetAttrString(loadgen, "QuerySampleResponse");
    PyObject *samples_complete = response_type ? PyObject_GetAttrString(loadgen, "QuerySamplesComplete") : NULL;
    Py_DECREF(loadgen);
    if (samples_complete == NULL) {
        Py_XDECREF(response_type);
        return -1;
    }
    Py_XSETREF(self->response_type, response_type);
    Py_XSETREF(self->samples_complete, samples_complete);

    self->path = PATH_PYBIND;
    if (!want_pybind) {
        int found = resolve_loadgen_c(samples_complete, response_type);
        if (found == -2)
            return -1;
        if (found == 1) {
            self->path = PATH_LOADGEN_C;
            self->loadgen_complete = loadgen_c_function;
        } else if (want_c) {
            PyErr_Format(PyExc_RuntimeError, "LoadGen's C entry point is not available: %s", loadgen_c_reason);
            return -1;
        }
    }
    return 0;
}

static void NativeHandoff_dealloc(NativeHandoff *self)
{
    Py_XDECREF(self->response_type);
    Py_XDECREF(self->samples_complete);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *NativeHandoff_get_name(NativeHandoff *self, void *closure)
{
    (void)self, (void)closure;
    return PyUnicode_FromString("native");
}

static PyObject *NativeHandoff_get_completion(NativeHandoff *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->path == PATH_LOADGEN_C ? "loadgen-c" : "pybind");
}

static PyObject *NativeHandoff_repr(NativeHandoff *self)
{
    return PyUnicode_FromFormat("NativeHandoff(completion='%s')", self->path == PATH_LOADGEN_C ? "loadgen-c" : "pybind");
}

static PyMethodDef NativeHandoff_methods[] = {
    {"gather", (PyCFunction)(void (*)(void))NativeHandoff_gather, METH_FASTCALL,
     "gather(staged, rows, out): out[i] = staged[rows[i]], bounds-checked, by row memcpy."},
    {"complete", (PyCFunction)(void (*)(void))NativeHandoff_complete, METH_FASTCALL,
     "complete(query_ids, results): complete query_ids[i] with row i of results, without copying it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef NativeHandoff_getset[] = {
    {"name", (getter)NativeHandoff_get_name, NULL, "Implementation name, 'native'.", NULL},
    {"completion", (getter)NativeHandoff_get_completion, NULL,
     "How responses reach LoadGen: 'loadgen-c' (its C entry point) or 'pybind' (its Python objects).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject NativeHandoffType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mlharness.sut._native.NativeHandoff",
    .tp_doc = "Zero-copy gather and LoadGen completion; same interface as sut.handoff.PythonHandoff.",
    .tp_basicsize = sizeof(NativeHandoff),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)NativeHandoff_init,
    .tp_dealloc = (destructor)NativeHandoff_dealloc,
    .tp_repr = (reprfunc)NativeHandoff_repr,
    .tp_methods = NativeHandoff_methods,
    .tp_getset = NativeHandoff_getset,
};

static PyObject *module_loadgen_c_unavailable_reason(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    if (loadgen_c_state == 1)
        Py_RETURN_NONE;
    return PyUnicode_FromString(loadgen_c_state == 0 ? "not resolved yet" : loadgen_c_reason);
}

static PyMethodDef module_methods[] = {
    {"loadgen_c_unavailable_reason", module_loadgen_c_unavailable_reason, METH_NOARGS,
     "Why completion falls back to pybind (None when LoadGen's C entry point is in use)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mlharness.sut._native",
    .m_doc = "Zero-copy handoff between the harness stages and LoadGen.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&NativeHandoffType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "NativeHandoff", (PyObject *)&NativeHandoffType) < 0 ||
        issue_queue_register(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
