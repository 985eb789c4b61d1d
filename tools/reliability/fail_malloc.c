// LD_PRELOAD shim for dpe_alloc_failure_test.sh: makes exactly one allocation of the process fail.
//
//   DPE_FAIL_ALLOCATION=N   allocation number N (0-based, counted over malloc, calloc, realloc, memalign,
//                           aligned_alloc and posix_memalign, every thread) returns NULL with errno ENOMEM;
//                           operator new then throws std::bad_alloc. Unset or negative: nothing fails.
//   DPE_COUNT_ALLOCATIONS=1 prints "allocations: <count>" on stderr at exit.
//
// glibc's __libc_* entry points do the real work, so the shim needs no dlsym (which itself allocates).
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);

static atomic_long count;
static long fail_at = -2;  // -2: not read yet

static int should_fail(void) {
  if (fail_at == -2) {
    const char* s = getenv("DPE_FAIL_ALLOCATION");  // getenv does not allocate
    fail_at = s != NULL ? atol(s) : -1;
  }
  return atomic_fetch_add(&count, 1) == fail_at;
}

void* malloc(size_t n) {
  if (should_fail()) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_malloc(n);
}

void* calloc(size_t a, size_t b) {
  if (should_fail()) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_calloc(a, b);
}

void* realloc(void* p, size_t n) {
  if (n != 0 && should_fail()) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_realloc(p, n);
}

void* memalign(size_t alignment, size_t n) {
  if (should_fail()) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_memalign(alignment, n);
}

void* aligned_alloc(size_t alignment, size_t n) { return memalign(alignment, n); }

int posix_memalign(void** out, size_t alignment, size_t n) {
  void* p = memalign(alignment, n);
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}

__attribute__((destructor)) static void report(void) {
  if (getenv("DPE_COUNT_ALLOCATIONS") != NULL) fprintf(stderr, "allocations: %ld\n", (long)atomic_load(&count));
}
