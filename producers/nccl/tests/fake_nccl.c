/* Fake NCCL: loads the plugin with dlopen, as NCCL does, and drives one of its exported
 * function tables (ncclProfiler_v6, _v5 or _v4) from an event script on stdin.
 *
 *   fake_nccl PLUGIN.so ABI < script        (ABI: 4, 5 or 6)
 *   fake_nccl PLUGIN.so ABI --bench N       per-callback cost of a send step, in ns (JSON)
 *   fake_nccl PLUGIN.so ABI --stress T OPS STEPS
 *       T threads, each a communicator (hash 0x5000+t, rank t) driven by its own proxy
 *       thread: OPS AllReduces (seq 0..), each with a send and a recv ProxyOp on 2 channels
 *       of STEPS steps, with the plugin's tick thread running; then finalize.
 *
 * Script lines (ids name handles; NCCL's own order and nesting is the script's job):
 *   init CID HASH NRANKS RANK NNODES NAME
 *   coll ID CID SEQ FUNC COUNT DTYPE ALGO PROTO NCH
 *   p2p ID CID FUNC PEER COUNT DTYPE
 *   proxyop ID PARENT CHANNEL PEER NSTEPS ISSEND [PID]   (PID other than ours: PXN)
 *   step ID PARENT STEP
 *   kch ID PARENT CHANNEL
 *   state ID STATE TRANSSIZE
 *   stop ID
 *   flush | tick | fin CID       (flush: write everything now; tick: one timed tick)
 * A start whose handle came back NULL leaves ID null; events on a null ID are not sent,
 * as NCCL skips the children of an event the plugin ignored. */

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../include/profiler_v4.h"
#include "../include/profiler_v5.h"
#include "../include/profiler_v6.h"

#define MAXH 1000000
static void **handles;
static void *ctxs[256];
static int abi;
static ncclProfiler_v4_t *t4;
static ncclProfiler_v5_t *t5;
static ncclProfiler_v6_t *t6;
static long nulls;

static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "NCCL %s ", level == NCCL_LOG_WARN ? "WARN" : "INFO");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static ncclResult_t do_start(void *ctx, void **h, ncclProfilerEventDescr_v6_t *d6) {
  if (abi == 6) return t6->startEvent(ctx, h, d6);
  if (abi == 5) return t5->startEvent(ctx, h, (ncclProfilerEventDescr_v5_t *)(void *)d6);
  ncclProfilerEventDescr_v4_t d4;
  memset(&d4, 0, sizeof(d4));
  d4.type = (uint8_t)d6->type;
  d4.parentObj = d6->parentObj;
  d4.rank = d6->rank;
  memcpy(&d4.coll, &d6->coll, sizeof(d4) - offsetof(ncclProfilerEventDescr_v4_t, coll));
  return t4->startEvent(ctx, h, &d4);
}

static ncclResult_t do_state(void *h, int st, size_t trans) {
  ncclProfilerEventStateArgs_v5_t a;
  memset(&a, 0, sizeof(a));
  a.proxyStep.transSize = trans;
  if (abi == 6) return t6->recordEventState(h, st, &a);
  if (abi == 5) return t5->recordEventState(h, st, &a);
  return t4->recordEventState(h, st, (ncclProfilerEventStateArgs_v4_t *)(void *)&a);
}

static ncclResult_t do_stop(void *h) { return abi == 6 ? t6->stopEvent(h) : abi == 5 ? t5->stopEvent(h) : t4->stopEvent(h); }

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int do_init(void **ctx, uint64_t hash, int nranks, int rank, int nnodes, const char *name) {
  int mask = 0;
  ncclResult_t r = abi == 6   ? t6->init(ctx, hash, &mask, name, nnodes, nranks, rank, logger)
                   : abi == 5 ? t5->init(ctx, hash, &mask, name, nnodes, nranks, rank, logger)
                              : t4->init(ctx, &mask, name, hash, nnodes, nranks, rank, logger);
  printf("init %d mask %d\n", (int)r, mask);
  return r;
}

/* ns per callback of NCCL's send-step sequence: start, GPUWait, PeerWait, SendWait, stop. */
static int bench(long n) {
  void *ctx;
  if (do_init(&ctx, 0x42, 2, 0, 1, "bench") != ncclSuccess) return 1;
  ncclProfilerEventDescr_v6_t d;
  void *op, *pop, *st;
  memset(&d, 0, sizeof(d));
  d.type = MYC_EV_COLL;
  d.coll.func = "AllReduce";
  d.coll.datatype = "ncclFloat32";
  d.coll.count = 1 << 20;
  d.coll.algo = "RING";
  d.coll.proto = "SIMPLE";
  d.coll.nChannels = 1;
  do_start(ctxs[0] = ctx, &op, &d);
  memset(&d, 0, sizeof(d));
  d.type = MYC_EV_PROXY_OP;
  d.parentObj = op;
  d.proxyOp.pid = getpid();
  d.proxyOp.peer = 1;
  d.proxyOp.nSteps = (int)n;
  d.proxyOp.isSend = 1;
  do_start(ctx, &pop, &d);
  ncclProfilerEventDescr_v6_t ds;
  memset(&ds, 0, sizeof(ds));
  ds.type = MYC_EV_PROXY_STEP;
  ds.parentObj = pop;
  int64_t t0 = mono_ns();
  for (long i = 0; i < n; i++) {
    ds.proxyStep.step = (int)i;
    do_start(ctx, &st, &ds);
    do_state(st, MYC_ST_SEND_GPU_WAIT, 0);
    do_state(st, MYC_ST_SEND_PEER_WAIT, 0);
    do_state(st, MYC_ST_SEND_WAIT, 524288);
    do_stop(st);
  }
  int64_t t1 = mono_ns();
  /* the same loop through an empty table: the harness's own cost, subtracted */
  int64_t t2 = mono_ns();
  volatile long sink = 0;
  for (long i = 0; i < n; i++) {
    ds.proxyStep.step = (int)i;
    sink += ds.proxyStep.step;
  }
  int64_t t3 = mono_ns();
  do_stop(pop);
  do_stop(op);
  printf("{\"abi\": %d, \"steps\": %ld, \"callbacks\": %ld, \"ns_per_step\": %.2f, \"ns_per_callback\": %.2f, \"loop_ns_per_step\": %.2f}\n",
         abi, n, n * 5, (double)(t1 - t0) / (double)n, (double)(t1 - t0) / (double)(n * 5),
         (double)(t3 - t2) / (double)n);
  return 0;
}

typedef struct {
  int t, ops, steps;
} stress_arg_t;

static void *stress_thread(void *p) {
  stress_arg_t *a = p;
  void *ctx = NULL;
  char name[32];
  snprintf(name, sizeof(name), "stress%d", a->t);
  if (do_init(&ctx, 0x5000 + (uint64_t)a->t, 64, a->t, 8, name) != ncclSuccess) return NULL;
  for (int i = 0; i < a->ops; i++) {
    ncclProfilerEventDescr_v6_t d;
    void *op = NULL, *flows[4] = {0}, *st;
    memset(&d, 0, sizeof(d));
    d.type = MYC_EV_COLL;
    d.coll.seqNumber = (uint64_t)i;
    d.coll.func = "AllReduce";
    d.coll.datatype = "ncclFloat32";
    d.coll.count = 1024;
    d.coll.algo = "RING";
    d.coll.proto = "SIMPLE";
    d.coll.nChannels = 2;
    do_start(ctx, &op, &d);
    if (!op) continue;
    for (int f = 0; f < 4; f++) {
      memset(&d, 0, sizeof(d));
      d.type = MYC_EV_PROXY_OP;
      d.parentObj = op;
      d.proxyOp.pid = getpid();
      d.proxyOp.channelId = (uint8_t)(f / 2);
      d.proxyOp.peer = (a->t + 1 + f % 2) % 64;
      d.proxyOp.nSteps = a->steps;
      d.proxyOp.isSend = f % 2 == 0;
      do_start(ctx, &flows[f], &d);
    }
    do_stop(op); /* enqueued */
    for (int k = 0; k < a->steps; k++) {
      for (int f = 0; f < 4; f++) {
        if (!flows[f]) continue;
        memset(&d, 0, sizeof(d));
        d.type = MYC_EV_PROXY_STEP;
        d.parentObj = flows[f];
        d.proxyStep.step = k;
        do_start(ctx, &st, &d);
        if (f % 2 == 0) {
          do_state(st, MYC_ST_SEND_GPU_WAIT, 0);
          do_state(st, MYC_ST_SEND_PEER_WAIT, 0);
          do_state(st, MYC_ST_SEND_WAIT, 1000);
        } else {
          do_state(st, MYC_ST_RECV_WAIT, 0);
          do_state(st, MYC_ST_RECV_FLUSH_WAIT, 1000);
          do_state(st, MYC_ST_RECV_GPU_WAIT, 0);
        }
        do_stop(st);
      }
    }
    for (int f = 0; f < 4; f++)
      if (flows[f]) do_stop(flows[f]);
  }
  return ctx;
}

static int stress(int threads, int ops, int steps) {
  pthread_t th[64];
  stress_arg_t args[64];
  void *ctx[64] = {0};
  if (threads < 1 || threads > 64) return 2;
  for (int t = 0; t < threads; t++) {
    args[t] = (stress_arg_t){t, ops, steps};
    pthread_create(&th[t], NULL, stress_thread, &args[t]);
  }
  for (int t = 0; t < threads; t++) pthread_join(th[t], &ctx[t]);
  for (int t = 0; t < threads; t++)
    if (ctx[t]) abi == 6 ? t6->finalize(ctx[t]) : abi == 5 ? t5->finalize(ctx[t]) : t4->finalize(ctx[t]);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: fake_nccl PLUGIN.so {4|5|6} [--bench N] < script\n");
    return 2;
  }
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "fake_nccl: %s\n", dlerror());
    return 2;
  }
  abi = atoi(argv[2]);
  t6 = dlsym(lib, "ncclProfiler_v6");
  t5 = dlsym(lib, "ncclProfiler_v5");
  t4 = dlsym(lib, "ncclProfiler_v4");
  if ((abi == 6 && !t6) || (abi == 5 && !t5) || (abi == 4 && !t4) || abi < 4 || abi > 6) {
    fprintf(stderr, "fake_nccl: no ncclProfiler_v%d in %s\n", abi, argv[1]);
    return 2;
  }
  void (*flush)(void) = (void (*)(void))dlsym(lib, "mycroftNcclFlush");
  void (*tick)(void) = (void (*)(void))dlsym(lib, "mycroftNcclTick");
  if (argc >= 5 && strcmp(argv[3], "--bench") == 0) return bench(atol(argv[4]));
  if (argc >= 7 && strcmp(argv[3], "--stress") == 0) return stress(atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
  handles = calloc(MAXH, sizeof(void *));
  char line[512], w[16][128];
  long lineno = 0;
  while (fgets(line, sizeof(line), stdin)) {
    lineno++;
    int n = sscanf(line, "%127s %127s %127s %127s %127s %127s %127s %127s %127s %127s %127s", w[0], w[1], w[2], w[3],
                   w[4], w[5], w[6], w[7], w[8], w[9], w[10]);
    if (n <= 0 || w[0][0] == '#') continue;
    ncclProfilerEventDescr_v6_t d;
    memset(&d, 0, sizeof(d));
    long id = n > 1 ? atol(w[1]) : 0;
    if (id < 0 || id >= MAXH) {
      fprintf(stderr, "fake_nccl: line %ld: id out of range\n", lineno);
      return 2;
    }
    void *parent = NULL;
    if (!strcmp(w[0], "init")) {
      if (do_init(&ctxs[id % 256], strtoull(w[2], NULL, 0), atoi(w[3]), atoi(w[4]), atoi(w[5]), w[6]) != ncclSuccess)
        ctxs[id % 256] = NULL;
      continue;
    }
    if (!strcmp(w[0], "flush")) {
      if (flush) flush();
      continue;
    }
    if (!strcmp(w[0], "tick")) {
      if (tick) tick();
      continue;
    }
    if (!strcmp(w[0], "fin")) {
      if (ctxs[id % 256]) abi == 6 ? t6->finalize(ctxs[id % 256]) : abi == 5 ? t5->finalize(ctxs[id % 256]) : t4->finalize(ctxs[id % 256]);
      continue;
    }
    if (!strcmp(w[0], "state")) {
      if (handles[id]) do_state(handles[id], atoi(w[2]), (size_t)atoll(w[3]));
      continue;
    }
    if (!strcmp(w[0], "stop")) {
      if (handles[id]) do_stop(handles[id]);
      continue;
    }
    void *ctx = NULL;
    if (!strcmp(w[0], "coll")) {
      ctx = ctxs[atol(w[2]) % 256];
      d.type = MYC_EV_COLL;
      d.coll.seqNumber = strtoull(w[3], NULL, 0);
      d.coll.func = strdup(w[4]);
      d.coll.count = (size_t)atoll(w[5]);
      d.coll.datatype = strdup(w[6]);
      d.coll.algo = strdup(w[7]);
      d.coll.proto = strdup(w[8]);
      d.coll.nChannels = (uint8_t)atoi(w[9]);
    } else if (!strcmp(w[0], "p2p")) {
      ctx = ctxs[atol(w[2]) % 256];
      d.type = MYC_EV_P2P;
      d.p2p.func = strdup(w[3]);
      d.p2p.peer = atoi(w[4]);
      d.p2p.count = (size_t)atoll(w[5]);
      d.p2p.datatype = strdup(w[6]);
    } else if (!strcmp(w[0], "proxyop") || !strcmp(w[0], "step") || !strcmp(w[0], "kch")) {
      long pid_ = atol(w[2]);
      parent = pid_ >= 0 && pid_ < MAXH ? handles[pid_] : NULL;
      ctx = ctxs[0];
      if (!strcmp(w[0], "proxyop")) {
        pid_t pid = n > 7 ? (pid_t)atoi(w[7]) : getpid();
        if (pid != getpid()) parent = (void *)(uintptr_t)0xdead0000; /* another process's pointer */
        else if (!parent) { nulls++; continue; }
        d.type = MYC_EV_PROXY_OP;
        d.proxyOp.pid = pid;
        d.proxyOp.channelId = (uint8_t)atoi(w[3]);
        d.proxyOp.peer = atoi(w[4]);
        d.proxyOp.nSteps = atoi(w[5]);
        d.proxyOp.isSend = atoi(w[6]);
      } else if (!parent) {
        nulls++;
        continue;
      } else if (!strcmp(w[0], "step")) {
        d.type = MYC_EV_PROXY_STEP;
        d.proxyStep.step = atoi(w[3]);
      } else {
        d.type = MYC_EV_KERNEL_CH;
        d.kernelCh.channelId = (uint8_t)atoi(w[3]);
        d.kernelCh.pTimer = (uint64_t)mono_ns();
      }
    } else {
      fprintf(stderr, "fake_nccl: line %ld: unknown event %s\n", lineno, w[0]);
      return 2;
    }
    d.parentObj = parent;
    handles[id] = NULL;
    if (ctx) do_start(ctx, &handles[id], &d);
    if (!handles[id]) nulls++;
  }
  printf("nulls %ld\n", nulls);
  return 0;
}
