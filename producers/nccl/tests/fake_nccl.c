/* Fake NCCL: loads the plugin with dlopen, as NCCL does, and drives one of its exported
 * function tables (ncclProfiler_v6, _v5 or _v4) from an event script on stdin.
 *
 *   fake_nccl PLUGIN.so ABI < script        (ABI: 4, 5 or 6)
 *   fake_nccl PLUGIN.so ABI --bench OPS STEPS   ns per callback, per event type and state (JSON)
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
 *   sleep MS                     (pace the script in real time, for the tick thread)
 *   forkinit                     (a forked child inits a communicator and exits)
 *   dlclose                      (NCCL closes the plugin after the last finalize; no event after)
 * A start whose handle came back NULL leaves ID null; events on a null ID are not sent,
 * as NCCL skips the children of an event the plugin ignored. */

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
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

/* ---- --bench: each callback timed on its own, per event type and state ---- */

#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t ticks(void) {
  _mm_lfence();
  uint64_t t = __rdtsc();
  _mm_lfence();
  return t;
}
#define TIMER "rdtsc"
#else
static inline uint64_t ticks(void) { return (uint64_t)mono_ns(); }
#define TIMER "clock_gettime"
#endif

enum { B_COLL_START, B_COLL_STOP, B_OP_START, B_OP_STOP, B_STEP_START, B_SEND_GPU, B_SEND_PEER,
       B_SEND_PEER_RETRY, B_SEND_WAIT, B_STEP_STOP, B_RECV_WAIT, B_RECV_FLUSH, B_RECV_GPU,
       B_KCH_START, B_KCH_STATE, B_KCH_STOP, B_EMPTY, B_N };
static const char *const B_NAMES[B_N] = {
    "Coll.startEvent", "Coll.stopEvent", "ProxyOp.startEvent", "ProxyOp.stopEvent",
    "ProxyStep.startEvent", "ProxyStep.SendGPUWait", "ProxyStep.SendPeerWait",
    "ProxyStep.SendPeerWait(retry)", "ProxyStep.SendWait", "ProxyStep.stopEvent",
    "ProxyStep.RecvWait", "ProxyStep.RecvFlushWait", "ProxyStep.RecvGPUWait",
    "KernelCh.startEvent", "KernelCh.KernelChStop", "KernelCh.stopEvent", "empty call"};
static uint32_t *samples[B_N];
static long nsamples[B_N];

static ncclResult_t empty_stop(void *h) {
  __asm__ __volatile__("" : : "r"(h) : "memory");
  return ncclSuccess;
}
static ncclResult_t (*volatile empty_fn)(void *) = empty_stop;

#define TIMED(k, call)                                   \
  do {                                                   \
    uint64_t t0_ = ticks();                              \
    call;                                                \
    uint64_t t1_ = ticks();                              \
    samples[k][nsamples[k]++] = (uint32_t)(t1_ - t0_);   \
  } while (0)

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static double ticks_per_ns(void) {
  int64_t n0 = mono_ns();
  uint64_t t0 = ticks();
  while (mono_ns() - n0 < 50000000LL) {
  }
  return (double)(ticks() - t0) / (double)(mono_ns() - n0);
}

/* One op of `nops` per round: Coll, a send and a recv ProxyOp of `steps` steps, 2 KernelCh. */
static void bench_round(void *ctx, long seq, int steps) {
  ncclProfilerEventDescr_v6_t d;
  void *op = NULL, *snd = NULL, *rcv = NULL, *st = NULL, *k0 = NULL, *k1 = NULL;
  memset(&d, 0, sizeof(d));
  d.type = MYC_EV_COLL;
  d.coll.seqNumber = (uint64_t)seq;
  d.coll.func = "AllReduce";
  d.coll.datatype = "ncclFloat32";
  d.coll.count = 1 << 20;
  d.coll.algo = "RING";
  d.coll.proto = "SIMPLE";
  d.coll.nChannels = 2;
  TIMED(B_COLL_START, do_start(ctx, &op, &d));
  memset(&d, 0, sizeof(d));
  d.type = MYC_EV_KERNEL_CH;
  d.parentObj = op;
  TIMED(B_KCH_START, do_start(ctx, &k0, &d));
  d.kernelCh.channelId = 1;
  do_start(ctx, &k1, &d);
  memset(&d, 0, sizeof(d));
  d.type = MYC_EV_PROXY_OP;
  d.parentObj = op;
  d.proxyOp.pid = getpid();
  d.proxyOp.peer = 1;
  d.proxyOp.nSteps = steps;
  d.proxyOp.isSend = 1;
  TIMED(B_OP_START, do_start(ctx, &snd, &d));
  d.proxyOp.isSend = 0;
  d.proxyOp.channelId = 1;
  do_start(ctx, &rcv, &d);
  TIMED(B_COLL_STOP, do_stop(op));
  ncclProfilerEventDescr_v6_t ds;
  memset(&ds, 0, sizeof(ds));
  ds.type = MYC_EV_PROXY_STEP;
  for (int i = 0; i < steps; i++) {
    ds.proxyStep.step = i;
    ds.parentObj = snd;
    TIMED(B_STEP_START, do_start(ctx, &st, &ds));
    TIMED(B_SEND_GPU, do_state(st, MYC_ST_SEND_GPU_WAIT, 0));
    TIMED(B_SEND_PEER, do_state(st, MYC_ST_SEND_PEER_WAIT, 0));
    TIMED(B_SEND_PEER_RETRY, do_state(st, MYC_ST_SEND_PEER_WAIT, 0));
    TIMED(B_SEND_WAIT, do_state(st, MYC_ST_SEND_WAIT, 524288));
    TIMED(B_STEP_STOP, do_stop(st));
    ds.parentObj = rcv;
    do_start(ctx, &st, &ds);
    TIMED(B_RECV_WAIT, do_state(st, MYC_ST_RECV_WAIT, 0));
    TIMED(B_RECV_FLUSH, do_state(st, MYC_ST_RECV_FLUSH_WAIT, 524288));
    TIMED(B_RECV_GPU, do_state(st, MYC_ST_RECV_GPU_WAIT, 0));
    do_stop(st);
    TIMED(B_EMPTY, empty_fn(st));
  }
  TIMED(B_OP_STOP, do_stop(snd));
  do_stop(rcv);
  TIMED(B_KCH_STATE, do_state(k0, MYC_ST_KERNEL_CH_STOP, 0));
  TIMED(B_KCH_STOP, do_stop(k0));
  do_stop(k1);
}

/* Median and p99 ns of every callback over `rounds` ops of `steps` steps, timer cost removed. */
static int bench(long rounds, int steps, void (*flush)(void)) {
  void *ctx;
  if (do_init(&ctx, 0x42, 2, 0, 1, "bench") != ncclSuccess) return 1;
  long cap = rounds * (long)steps + rounds;
  for (int k = 0; k < B_N; k++) samples[k] = calloc((size_t)cap, sizeof(uint32_t));
  double tpn = ticks_per_ns();
  long nticks = 200000;
  uint32_t *tt = calloc((size_t)nticks, sizeof(uint32_t));
  for (long i = 0; i < nticks; i++) {
    uint64_t a = ticks(), b = ticks();
    tt[i] = (uint32_t)(b - a);
  }
  qsort(tt, (size_t)nticks, sizeof(uint32_t), cmp_u32);
  double timer = tt[nticks / 2];
  uint32_t *ft = calloc((size_t)(rounds / 64 + 1), sizeof(uint32_t));
  long nft = 0;
  for (long r = 0; r < rounds; r++) {
    bench_round(ctx, r, steps);
    if (flush && r % 64 == 63) { /* the tick thread's work, timed apart from the callbacks */
      uint64_t t0 = ticks();
      flush();
      ft[nft++] = (uint32_t)(ticks() - t0);
    }
  }
  qsort(ft, (size_t)nft, sizeof(uint32_t), cmp_u32);
  printf("{\"abi\": %d, \"timer\": \"%s\", \"ticks_per_ns\": %.4f, \"timer_overhead_ns\": %.2f, "
         "\"rounds\": %ld, \"steps_per_op\": %d, \"tick_us_per_64_ops\": %.1f, \"callbacks\": {",
         abi, TIMER, tpn, timer / tpn, rounds, steps, nft ? (double)ft[nft / 2] / tpn / 1000.0 : 0.0);
  for (int k = 0; k < B_N; k++) {
    long n = nsamples[k];
    qsort(samples[k], (size_t)n, sizeof(uint32_t), cmp_u32);
    double med = ((double)samples[k][n / 2] - timer) / tpn;
    double p99 = ((double)samples[k][(n * 99) / 100] - timer) / tpn;
    printf("%s\"%s\": {\"n\": %ld, \"median_ns\": %.1f, \"p99_ns\": %.1f}", k ? ", " : "", B_NAMES[k], n,
           med < 0 ? 0 : med, p99 < 0 ? 0 : p99);
  }
  printf("}}\n");
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
    fprintf(stderr, "usage: fake_nccl PLUGIN.so {4|5|6} [--bench OPS STEPS | --stress T OPS STEPS] < script\n");
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
  if (argc >= 6 && strcmp(argv[3], "--bench") == 0) return bench(atol(argv[4]), atoi(argv[5]), flush);
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
    if (!strcmp(w[0], "dlclose")) {
      if (dlclose(lib) != 0) fprintf(stderr, "fake_nccl: dlclose: %s\n", dlerror());
      continue;
    }
    if (!strcmp(w[0], "forkinit")) {
      fflush(stdout);
      pid_t child = fork();
      if (child == 0) {
        void *cctx = NULL;
        printf("child ");
        do_init(&cctx, 0xC41D, 2, 0, 1, "child");
        fflush(stdout);
        _exit(0);
      }
      waitpid(child, NULL, 0);
      continue;
    }
    if (!strcmp(w[0], "sleep")) {
      struct timespec ts = {.tv_sec = id / 1000, .tv_nsec = (id % 1000) * 1000000L};
      nanosleep(&ts, NULL);
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
