/* LD_PRELOAD library for tests/test_shims.py: counts heap allocations (malloc and friends)
 * made while counting is on whose call stack passes through a given address range (a
 * library's mapping, e.g. flux_dnn's _core). Linux/glibc only. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void* (*real_malloc)(size_t);
static void* (*real_calloc)(size_t, size_t);
static void* (*real_realloc)(void*, size_t);
static int (*real_posix_memalign)(void**, size_t, size_t);
static void* (*real_aligned_alloc)(size_t, size_t);
static void (*real_free)(void*);
static __thread int busy; /* inside our own bookkeeping: do not count, do not recurse */
static volatile int counting;
static uintptr_t range_lo, range_hi;
static long hits;
static char early[1 << 16]; /* what dlsym allocates before the real functions are known */
static size_t early_used;

void alloc_counter_range(uintptr_t lo, uintptr_t hi) { range_lo = lo; range_hi = hi; }
void alloc_counter_start(void) {
  void* frames[4];
  busy = 1;
  backtrace(frames, 4); /* loads the unwinder now, not while counting */
  busy = 0;
  hits = 0;
  counting = 1;
}
long alloc_counter_stop(void) { counting = 0; return hits; }

static void note(void) {
  if (!counting || busy) return;
  busy = 1;
  void* frames[16];
  int n = backtrace(frames, 16);
  for (int i = 0; i < n; ++i) {
    uintptr_t p = (uintptr_t)frames[i];
    if (p >= range_lo && p < range_hi) {
      ++hits;
      break;
    }
  }
  busy = 0;
}

static void* early_alloc(size_t n) {
  void* p = early + early_used;
  early_used += (n + 15) & ~(size_t)15;
  return early_used <= sizeof early ? p : NULL;
}

static void init(void) {
  busy = 1;
  real_malloc = dlsym(RTLD_NEXT, "malloc");
  real_calloc = dlsym(RTLD_NEXT, "calloc");
  real_realloc = dlsym(RTLD_NEXT, "realloc");
  real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
  real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
  real_free = dlsym(RTLD_NEXT, "free");
  busy = 0;
}

void* malloc(size_t n) {
  if (real_malloc == NULL) {
    if (busy) return early_alloc(n);
    init();
  }
  note();
  return real_malloc(n);
}

void* calloc(size_t count, size_t size) {
  if (real_calloc == NULL) {
    if (busy) return early_alloc(count * size); /* static storage: already zero */
    init();
  }
  note();
  return real_calloc(count, size);
}

void* realloc(void* p, size_t n) {
  if (real_realloc == NULL) init();
  note();
  return real_realloc(p, n);
}

int posix_memalign(void** p, size_t alignment, size_t n) {
  if (real_posix_memalign == NULL) init();
  note();
  return real_posix_memalign(p, alignment, n);
}

void* aligned_alloc(size_t alignment, size_t n) {
  if (real_aligned_alloc == NULL) init();
  note();
  return real_aligned_alloc(alignment, n);
}

void free(void* p) {
  if ((char*)p >= early && (char*)p < early + sizeof early) return;
  if (real_free == NULL) init();
  real_free(p);
}
