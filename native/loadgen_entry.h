/* Finding LoadGen's C entry point for completing samples inside the loaded mlperf_loadgen module.
 *
 * The mlperf_loadgen wheel compiles LoadGen's C API (bindings/c_api.cc) into the Python module but
 * exports only PyInit_mlperf_loadgen. The symbol table (.symtab) of the shipped .so still names
 * mlperf::c::QuerySamplesComplete(QuerySampleResponse*, size_t), a plain two-argument function. Calling
 * it directly saves one pybind11 object per sample and the list-to-vector conversion. */
#ifndef MLHARNESS_LOADGEN_ENTRY_H
#define MLHARNESS_LOADGEN_ENTRY_H

#include <stddef.h>
#include <stdint.h>

/* mlperf::QuerySampleResponse as compiled into mlcommons-loadgen 6.x (32 bytes, checked against the
 * pybind11 binding, which divides the vector's byte length by 32). */
typedef struct {
    uintptr_t id;
    uintptr_t data;
    size_t size;
    int64_t n_tokens;
} lg_response;

_Static_assert(sizeof(lg_response) == 32, "lg_response must match mlperf::QuerySampleResponse");

typedef void (*lg_complete_fn)(lg_response *responses, size_t count);

/* Resolves mlperf::c::QuerySamplesComplete in the shared object that contains `address_in_module`.
 * Returns 0 and sets *fn on success; on failure returns -1 and writes a reason into `why`. The symbol's
 * code bytes in memory are compared with the file on disk, so a file replaced after loading, or a
 * symbol table that does not describe the mapped object, is refused. */
int lg_entry_resolve(const void *address_in_module, lg_complete_fn *fn, char *why, size_t why_len);

/* Any function symbol (mangled name) of that shared object, checked the same way. */
int lg_symbol_resolve(const void *address_in_module, const char *symbol, void **out, char *why, size_t why_len);

#endif
