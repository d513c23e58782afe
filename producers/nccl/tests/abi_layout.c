/* Prints sizeof/offsetof of the declared ABI structs, one "NAME VALUE" per line (checked by pytest). */
#include <stdio.h>

#include "../include/profiler_v4.h"
#include "../include/profiler_v5.h"
#include "../include/profiler_v6.h"

#define SZ(t) printf("sizeof %s %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(t, f))
#define ALL(v)                                  \
  SZ(ncclProfilerEventDescr_##v##_t);           \
  SZ(ncclProfilerEventStateArgs_##v##_t);       \
  SZ(ncclProfiler_##v##_t);                     \
  OFF(ncclProfilerEventDescr_##v##_t, parentObj); \
  OFF(ncclProfilerEventDescr_##v##_t, rank);    \
  OFF(ncclProfilerEventDescr_##v##_t, coll.seqNumber); \
  OFF(ncclProfilerEventDescr_##v##_t, coll.datatype); \
  OFF(ncclProfilerEventDescr_##v##_t, coll.nChannels); \
  OFF(ncclProfilerEventDescr_##v##_t, coll.algo); \
  OFF(ncclProfilerEventDescr_##v##_t, coll.proto); \
  OFF(ncclProfilerEventDescr_##v##_t, p2p.peer); \
  OFF(ncclProfilerEventDescr_##v##_t, p2p.nChannels); \
  OFF(ncclProfilerEventDescr_##v##_t, proxyOp.pid); \
  OFF(ncclProfilerEventDescr_##v##_t, proxyOp.channelId); \
  OFF(ncclProfilerEventDescr_##v##_t, proxyOp.peer); \
  OFF(ncclProfilerEventDescr_##v##_t, proxyOp.nSteps); \
  OFF(ncclProfilerEventDescr_##v##_t, proxyOp.chunkSize); \
  OFF(ncclProfilerEventDescr_##v##_t, proxyOp.isSend); \
  OFF(ncclProfilerEventDescr_##v##_t, proxyStep.step); \
  OFF(ncclProfilerEventDescr_##v##_t, kernelCh.channelId); \
  OFF(ncclProfilerEventDescr_##v##_t, kernelCh.pTimer); \
  OFF(ncclProfiler_##v##_t, init);              \
  OFF(ncclProfiler_##v##_t, startEvent);        \
  OFF(ncclProfiler_##v##_t, stopEvent);         \
  OFF(ncclProfiler_##v##_t, recordEventState);  \
  OFF(ncclProfiler_##v##_t, finalize)

int main(void) {
  ALL(v4);
  ALL(v5);
  ALL(v6);
  OFF(ncclProfilerEventDescr_v5_t, coll.parentGroup);
  OFF(ncclProfilerEventDescr_v5_t, p2p.parentGroup);
  OFF(ncclProfilerEventDescr_v6_t, ceColl.stream);
  OFF(ncclProfilerEventDescr_v6_t, ceCollBatch.totalBytes);
  return 0;
}
