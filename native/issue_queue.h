/* IssueQueue: LoadGen's issue path into a queue without the GIL (see issue_queue.c). */
#ifndef MLHARNESS_ISSUE_QUEUE_H
#define MLHARNESS_ISSUE_QUEUE_H

#include <Python.h>

/* Adds the IssueQueue type to the module; 0 on success, -1 with an exception set. */
int issue_queue_register(PyObject *module);

#endif
