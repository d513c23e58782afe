/* A profiler plugin whose init fails (ncclInternalError) for every communicator after the first,
 * as Mycroft's plugin did with a full communicator pool: the tests check with it that nccl_like
 * reports what each NCCL release then does to its loader. Every event is declined.
 * Built with -I producers/nccl/include. */

#include "profiler_v4.h"
#include "profiler_v5.h"
#include "profiler_v6.h"

static int inits;
static int ctx;

static ncclResult_t init_v4(void **c, int *mask, const char *name, uint64_t hash, int nnodes, int nranks,
                            int rank, ncclDebugLogger_t log) {
  (void)name, (void)hash, (void)nnodes, (void)nranks, (void)rank, (void)log;
  *c = NULL;
  if (__atomic_fetch_add(&inits, 1, __ATOMIC_RELAXED) > 0) return ncclInternalError;
  *c = &ctx;
  *mask = MYC_EV_COLL;
  return ncclSuccess;
}

static ncclResult_t init_v5(void **c, uint64_t id, int *mask, const char *name, int nnodes, int nranks, int rank,
                            ncclDebugLogger_t log) {
  return init_v4(c, mask, name, id, nnodes, nranks, rank, log);
}

static ncclResult_t start_v4(void *c, void **h, ncclProfilerEventDescr_v4_t *d) {
  (void)c, (void)d;
  *h = NULL;
  return ncclSuccess;
}
static ncclResult_t start_v5(void *c, void **h, ncclProfilerEventDescr_v5_t *d) {
  (void)c, (void)d;
  *h = NULL;
  return ncclSuccess;
}
static ncclResult_t start_v6(void *c, void **h, ncclProfilerEventDescr_v6_t *d) {
  (void)c, (void)d;
  *h = NULL;
  return ncclSuccess;
}
static ncclResult_t stop(void *h) { return h ? ncclInternalError : ncclSuccess; }
static ncclResult_t record_v4(void *h, ncclProfilerEventState_v4_t st, ncclProfilerEventStateArgs_v4_t *a) {
  (void)st, (void)a;
  return h ? ncclInternalError : ncclSuccess;
}
static ncclResult_t record_v5(void *h, ncclProfilerEventState_v5_t st, ncclProfilerEventStateArgs_v5_t *a) {
  (void)st, (void)a;
  return h ? ncclInternalError : ncclSuccess;
}
static ncclResult_t finalize(void *c) { return c == &ctx ? ncclSuccess : ncclInternalError; }

#define EXPORT __attribute__((visibility("default")))
EXPORT ncclProfiler_v6_t ncclProfiler_v6 = {"declining", init_v5, start_v6, stop, record_v5, finalize};
EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {"declining", init_v5, start_v5, stop, record_v5, finalize};
EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {"declining", init_v4, start_v4, stop, record_v4, finalize};
