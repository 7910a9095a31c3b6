/* IssueQueue: LoadGen's issue path without the GIL (Server).
 *
 * The Python binding's SUT calls a Python function for every query, so LoadGen's issue thread takes
 * the GIL once per query and Server tops out at the binding's limit. LoadGen's own C API
 * (mlperf::c::ConstructSUT, compiled into the mlperf_loadgen module beside the binding and found in
 * its symbol table as loadgen_entry.c finds QuerySamplesComplete) takes a plain C callback instead.
 * That callback, below, appends the query's samples to a queue under a mutex and signals a condition
 * variable: no Python, no GIL. Python workers call take(), which waits with the GIL released and
 * returns a batch of (ids, indices). The SUT pointer ConstructSUT returns is a mlperf::SystemUnderTest
 * like the binding's own (both derive from it singly), so the binding's StartTestWithLogSettings
 * takes it as it takes ConstructFastSUT's integer. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "issue_queue.h"
#include "loadgen_entry.h"

/* mlperf::QuerySample: a response id and a sample index, 16 bytes. */
typedef struct {
    uintptr_t id;
    size_t index;
} lg_sample;

_Static_assert(sizeof(lg_sample) == 16, "lg_sample must match mlperf::QuerySample");

typedef void (*lg_issue_fn)(uintptr_t client, const lg_sample *samples, size_t count);
typedef void (*lg_flush_fn)(void);
typedef void *(*lg_construct_fn)(uintptr_t client, const char *name, size_t name_length, lg_issue_fn issue,
                                 lg_flush_fn flush);
typedef void (*lg_destroy_fn)(void *sut);

static const char k_construct[] = "_ZN6mlperf1c12ConstructSUTEmPKcmPFvmPKNS_11QuerySampleEmEPFvvE";
static const char k_destroy[] = "_ZN6mlperf1c10DestroySUTEPv";

static lg_construct_fn construct_sut = NULL;
static lg_destroy_fn destroy_sut = NULL;
static int resolve_state = 0; /* 0 not tried, 1 resolved, -1 refused */
static char resolve_reason[256] = "";

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t ready;
    lg_sample *items; /* a ring: head is the oldest, count items from there */
    size_t capacity, head, count;
    int closed;
    uint64_t issued; /* samples issued so far (read by tests and progress) */
} IssueQueue;

static int queue_grow(IssueQueue *q)
{
    size_t capacity = q->capacity ? q->capacity * 2 : 4096;
    lg_sample *items = malloc(capacity * sizeof(lg_sample));
    if (items == NULL)
        return -1;
    for (size_t i = 0; i < q->count; i++)
        items[i] = q->items[(q->head + i) % q->capacity];
    free(q->items);
    q->items = items;
    q->capacity = capacity;
    q->head = 0;
    return 0;
}

/* LoadGen's issue thread: no Python here. A sample that cannot be queued (out of memory) is dropped;
 * LoadGen then never sees it complete and the run ends by its timeout, as a hung SUT would. */
static void issue_callback(uintptr_t client, const lg_sample *samples, size_t count)
{
    IssueQueue *q = (IssueQueue *)client;
    pthread_mutex_lock(&q->lock);
    for (size_t i = 0; i < count; i++) {
        if (q->count == q->capacity && queue_grow(q) != 0)
            break;
        q->items[(q->head + q->count) % q->capacity] = samples[i];
        q->count++;
    }
    q->issued += count;
    pthread_cond_signal(&q->ready);
    pthread_mutex_unlock(&q->lock);
}

static void flush_callback(void) {}

static int resolve(void)
{
    if (resolve_state != 0)
        return resolve_state;
    resolve_state = -1;
    PyObject *lg = PyImport_ImportModule("mlperf_loadgen");
    if (lg == NULL)
        return -2;
    PyObject *function = PyObject_GetAttrString(lg, "QuerySamplesComplete");
    Py_DECREF(lg);
    if (function == NULL)
        return -2;
    if (!PyCFunction_Check(function)) {
        Py_DECREF(function);
        snprintf(resolve_reason, sizeof(resolve_reason), "QuerySamplesComplete is not a builtin function");
        return resolve_state;
    }
    const void *inside;
    PyCFunction method = ((PyCFunctionObject *)function)->m_ml->ml_meth;
    memcpy(&inside, &method, sizeof(inside));
    Py_DECREF(function);
    void *construct = NULL, *destroy = NULL;
    if (lg_symbol_resolve(inside, k_construct, &construct, resolve_reason, sizeof(resolve_reason)) != 0 ||
        lg_symbol_resolve(inside, k_destroy, &destroy, resolve_reason, sizeof(resolve_reason)) != 0)
        return resolve_state;
    memcpy(&construct_sut, &construct, sizeof(construct_sut));
    memcpy(&destroy_sut, &destroy, sizeof(destroy_sut));
    resolve_state = 1;
    return resolve_state;
}

static int IssueQueue_init(IssueQueue *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "", keywords))
        return -1;
    int state = resolve();
    if (state == -2)
        return -1;
    if (state != 1) {
        PyErr_Format(PyExc_RuntimeError, "LoadGen's C SUT interface is not usable here: %s", resolve_reason);
        return -1;
    }
    if (pthread_mutex_init(&self->lock, NULL) != 0 || pthread_cond_init(&self->ready, NULL) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "cannot create the queue's lock");
        return -1;
    }
    self->items = NULL;
    self->capacity = self->head = self->count = 0;
    self->closed = 0;
    self->issued = 0;
    if (queue_grow(self) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void IssueQueue_dealloc(IssueQueue *self)
{
    free(self->items);
    pthread_cond_destroy(&self->ready);
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* construct_sut(name) -> int: LoadGen's C SUT whose issue callback fills this queue. The queue must
 * outlive it (the caller destroys the SUT first). */
static PyObject *IssueQueue_construct_sut(IssueQueue *self, PyObject *args)
{
    const char *name;
    Py_ssize_t length;
    if (!PyArg_ParseTuple(args, "s#", &name, &length))
        return NULL;
    void *sut = construct_sut((uintptr_t)self, name, (size_t)length, issue_callback, flush_callback);
    if (sut == NULL)
        return PyErr_Format(PyExc_RuntimeError, "LoadGen's ConstructSUT returned nothing");
    return PyLong_FromVoidPtr(sut);
}

static PyObject *IssueQueue_destroy_sut(IssueQueue *self, PyObject *handle)
{
    void *sut = PyLong_AsVoidPtr(handle);
    if (sut == NULL && PyErr_Occurred())
        return NULL;
    destroy_sut(sut);
    Py_RETURN_NONE;
}

static void deadline_after(struct timespec *when, double seconds)
{
    clock_gettime(CLOCK_REALTIME, when);
    long long nanos = (long long)(seconds * 1e9);
    when->tv_sec += (time_t)(nanos / 1000000000LL);
    when->tv_nsec += (long)(nanos % 1000000000LL);
    if (when->tv_nsec >= 1000000000L) {
        when->tv_sec += 1;
        when->tv_nsec -= 1000000000L;
    }
}

/* take(max_count, wait_s, batch_wait_s) -> (ids, indices) | None
 * Waits up to wait_s for a first sample (empty lists when none came, so the caller can look at its
 * own state), then up to batch_wait_s more for the batch to fill to max_count; None once closed and
 * empty. The GIL is released while waiting. */
static PyObject *IssueQueue_take(IssueQueue *self, PyObject *args)
{
    Py_ssize_t max_count;
    double wait_s, batch_wait_s;
    if (!PyArg_ParseTuple(args, "ndd", &max_count, &wait_s, &batch_wait_s))
        return NULL;
    if (max_count < 1)
        return PyErr_Format(PyExc_ValueError, "max_count must be >= 1, got %zd", max_count);
    lg_sample stack_items[64];
    lg_sample *taken = max_count <= 64 ? stack_items : malloc((size_t)max_count * sizeof(lg_sample));
    if (taken == NULL)
        return PyErr_NoMemory();
    size_t got = 0;
    int closed = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    if (self->count == 0 && !self->closed && wait_s > 0) {
        struct timespec until;
        deadline_after(&until, wait_s);
        while (self->count == 0 && !self->closed)
            if (pthread_cond_timedwait(&self->ready, &self->lock, &until) == ETIMEDOUT)
                break;
    }
    if (self->count > 0 && self->count < (size_t)max_count && batch_wait_s > 0 && !self->closed) {
        struct timespec until;
        deadline_after(&until, batch_wait_s);
        while (self->count < (size_t)max_count && !self->closed)
            if (pthread_cond_timedwait(&self->ready, &self->lock, &until) == ETIMEDOUT)
                break;
    }
    while (got < (size_t)max_count && self->count > 0) {
        taken[got++] = self->items[self->head];
        self->head = (self->head + 1) % self->capacity;
        self->count--;
    }
    if (self->count > 0)
        pthread_cond_signal(&self->ready); /* more left: wake another worker */
    closed = self->closed && got == 0;
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (closed) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *ids = PyList_New((Py_ssize_t)got), *indices = PyList_New((Py_ssize_t)got);
        if (ids != NULL && indices != NULL) {
            for (size_t i = 0; i < got; i++) {
                PyList_SET_ITEM(ids, (Py_ssize_t)i, PyLong_FromSize_t(taken[i].id));
                PyList_SET_ITEM(indices, (Py_ssize_t)i, PyLong_FromSize_t(taken[i].index));
            }
            if (!PyErr_Occurred())
                result = PyTuple_Pack(2, ids, indices);
        }
        Py_XDECREF(ids);
        Py_XDECREF(indices);
    }
    if (taken != stack_items)
        free(taken);
    return result;
}

static PyObject *IssueQueue_close(IssueQueue *self, PyObject *unused)
{
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    self->closed = 1;
    pthread_cond_broadcast(&self->ready);
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* push(ids, indices): what LoadGen's callback does, from Python (tests drive the queue with it). */
static PyObject *IssueQueue_push(IssueQueue *self, PyObject *args)
{
    PyObject *ids, *indices;
    if (!PyArg_ParseTuple(args, "OO", &ids, &indices))
        return NULL;
    Py_ssize_t count = PySequence_Size(ids);
    if (count < 0 || PySequence_Size(indices) != count)
        return PyErr_Format(PyExc_ValueError, "ids and indices must be sequences of one length");
    lg_sample *samples = malloc((size_t)(count ? count : 1) * sizeof(lg_sample));
    if (samples == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *id = PySequence_GetItem(ids, i), *index = PySequence_GetItem(indices, i);
        samples[i].id = id ? (uintptr_t)PyLong_AsSize_t(id) : 0;
        samples[i].index = index ? PyLong_AsSize_t(index) : 0;
        Py_XDECREF(id);
        Py_XDECREF(index);
        if (PyErr_Occurred()) {
            free(samples);
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    issue_callback((uintptr_t)self, samples, (size_t)count);
    Py_END_ALLOW_THREADS
    free(samples);
    Py_RETURN_NONE;
}

static PyObject *IssueQueue_get_issued(IssueQueue *self, void *closure)
{
    pthread_mutex_lock(&self->lock);
    uint64_t issued = self->issued;
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromUnsignedLongLong(issued);
}

static PyObject *IssueQueue_get_pending(IssueQueue *self, void *closure)
{
    pthread_mutex_lock(&self->lock);
    size_t pending = self->count;
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromSize_t(pending);
}

static PyMethodDef IssueQueue_methods[] = {
    {"construct_sut", (PyCFunction)IssueQueue_construct_sut, METH_VARARGS,
     "construct_sut(name) -> int: LoadGen's C SUT feeding this queue, for StartTestWithLogSettings."},
    {"destroy_sut", (PyCFunction)IssueQueue_destroy_sut, METH_O, "destroy_sut(handle): destroy that SUT."},
    {"take", (PyCFunction)IssueQueue_take, METH_VARARGS,
     "take(max_count, wait_s, batch_wait_s) -> (ids, indices) or None once closed; waits without the GIL."},
    {"close", (PyCFunction)IssueQueue_close, METH_NOARGS, "close(): wake every waiting take()."},
    {"push", (PyCFunction)IssueQueue_push, METH_VARARGS, "push(ids, indices): queue samples as LoadGen would."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef IssueQueue_getset[] = {
    {"issued", (getter)IssueQueue_get_issued, NULL, "Samples issued into the queue so far.", NULL},
    {"pending", (getter)IssueQueue_get_pending, NULL, "Samples waiting to be taken.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject IssueQueueType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mlharness.sut._native.IssueQueue",
    .tp_basicsize = sizeof(IssueQueue),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LoadGen's issue path into a queue without the GIL (see native/issue_queue.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)IssueQueue_init,
    .tp_dealloc = (destructor)IssueQueue_dealloc,
    .tp_methods = IssueQueue_methods,
    .tp_getset = IssueQueue_getset,
};

int issue_queue_register(PyObject *module)
{
    if (PyType_Ready(&IssueQueueType) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "IssueQueue", (PyObject *)&IssueQueueType);
}
