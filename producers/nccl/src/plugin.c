/* Mycroft's NCCL profiler plugin: per-flow G/T/D counters from NCCL's proxy events into the ring.
 *
 * Threads: NCCL's proxy threads call the event functions; they only touch fixed pools
 * (allocated at the first init) with atomics, one clock read per finished step (two per send
 * step: its SendWait too, for the wire time), no lock and no syscall. One tick thread (every
 * MYCROFT_NCCL_TICK_MS, default 100 ms, the torch tracer's tick) is the ring's only writer: it snapshots live flows (FLOW_PROGRESS), retires finished flows
 * (FLOW_DONE) and ops (OP_DONE) and writes a BEAT with the pool-exhaustion counters each tick.
 * A tick thread was chosen over writing on the proxy thread's own events because the ring needs
 * a single writer and a CRC per record; doing that per step would cost the proxy ~100 ns per
 * event and a lock across proxy threads (bench/nccl_plugin_overhead.py measures the event path). */

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "../include/profiler_v4.h"
#include "../include/profiler_v5.h"
#include "../include/profiler_v6.h"
#include "ring_writer.h"

#define MYC_STEPS 8     /* NCCL_STEPS: step handles live in pHandles[step % NCCL_STEPS] */
#define MYC_MAX_CH 64   /* MAXCHANNELS */
#define MYC_P2P_PEERS 1024

enum { FREE = 0, LIVE = 1, STOPPED = 2, FILLING = 3 }; /* FILLING: taken, fields not yet visible */

typedef struct myc_comm {
  uint64_t hash;
  int nranks, rank, nnodes;
  char name[32];
  _Atomic int announced;
  _Atomic int64_t p2p_seq[2][MYC_P2P_PEERS]; /* per (dir, peer) virtual communicator */
  _Atomic uint8_t p2p_announced[2][MYC_P2P_PEERS];
} myc_comm_t;

typedef struct myc_op {
  _Atomic int state;
  _Atomic int enqueued;  /* Coll/P2p stopEvent: enqueued, not complete */
  _Atomic int refs;      /* flows not yet retired by the tick + live KernelCh */
  _Atomic int children;  /* ProxyOp and KernelCh events seen */
  int issued_written;
  myc_comm_t *comm;
  uint64_t ring_comm;
  int64_t seq, bytes, issue_ns;
  _Atomic int64_t start_ns, end_ns;
  uint8_t kind, algo, proto, dtype;
  int nchannels, nflows_done, p2p_dir, p2p_peer;
  int quiet_children; /* tick thread: children count when first seen complete, -1: not yet */
  _Atomic uint64_t kch_live; /* bit c: KernelCh of channel c started, not stopped */
  uint8_t kch_tag[MYC_MAX_CH]; /* &kch_tag[c] is the KernelCh handle of channel c */
} myc_op_t;

typedef struct myc_flow {
  _Atomic int state;
  myc_op_t *op; /* NULL for a PXN flow (another process's op) */
  int channel, dir, peer, total;
  /* G/T/D of FLOW_PROGRESS; posted and received go to FLOW_STEPS (schemas/ring.md §4b).
   * send: posted = SendGPUWait, ready = SendPeerWait, trans = SendWait, done = stop.
   * recv: ready = RecvWait (posted), received = RecvFlushWait, trans = RecvGPUWait,
   *       done = stop (consumed); posted mirrors ready. */
  _Atomic int posted, ready, received, trans, done;
  _Atomic int64_t bytes, first_ns, last_ns;
  _Atomic int64_t wire_ns; /* send: per step, SendWait to stop, summed (FLOW_DONE wire_us) */
  int last[5]; /* tick thread's last snapshot of posted, ready, received, trans, done */
} myc_flow_t;

typedef struct {
  myc_flow_t *flow;
  _Atomic uint8_t bits; /* which states of this step were counted */
  int64_t posted_ns;    /* send: SendWait (the data went to the network); 0 before */
} myc_step_t;


static struct {
  pthread_once_t once;
  int ok;
  char error[256];
  _Atomic(ncclDebugLogger_t) log; /* set by every init, from any thread */
  _Atomic int logged;
  pid_t pid;
  int ncomms, nops, nflows, tick_ms;
  myc_comm_t *comms;
  _Atomic int ncomms_used;
  myc_op_t *ops;
  myc_flow_t *flows;
  myc_step_t *steps;
  _Atomic unsigned op_hint, flow_hint;
  _Atomic uint64_t drop_comms, drop_ops, drop_flows, pxn_flows;
  _Atomic int first_rank; /* rank of the first init, for a ring header without RANK */
  myc_ring_t ring;
  pthread_mutex_t tick_lock; /* tick thread vs explicit flush; never taken on the event path */
  pthread_t tick_thread;
  _Atomic int stop;
  int64_t last_beat_ns;
  int32_t rank;
} g = {.once = PTHREAD_ONCE_INIT, .tick_lock = PTHREAD_MUTEX_INITIALIZER, .first_rank = -1};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts); /* vDSO: no syscall */
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long env_long(const char *name, long dflt, long lo, long hi) {
  const char *s = getenv(name);
  if (!s || !*s) return dflt;
  char *end;
  long v = strtol(s, &end, 10);
  if (*end || v < lo || v > hi) return -1;
  return v;
}

static int env_rank(const char *const *names) {
  for (int i = 0; names[i]; i++) {
    const char *s = getenv(names[i]);
    if (s && *s) return atoi(s);
  }
  return -1;
}

static uint8_t code_of(const char *s, const char *const *names, int n, uint8_t dflt) {
  if (!s) return dflt;
  for (int i = 0; i < n; i++)
    if (strcasecmp(s, names[i]) == 0) return (uint8_t)i;
  return dflt;
}

/* schemas/vocab.py OP_NAMES, ALGORITHMS, PROTOCOLS; ring_layout.DTYPES (NCCL's spellings). */
static const char *const OP_NAMES[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                       "Reduce",    "Send",      "Recv",          "AllToAll",
                                       "Barrier",   "Gather",    "Scatter"};
static const char *const ALGOS[] = {"unknown", "RING", "TREE", "P2P", "NVLS",
                                    "COLLNET_DIRECT", "COLLNET_CHAIN", "PAT"};
static const char *const PROTOS[] = {"unknown", "SIMPLE", "LL", "LL128"};
static const char *const DTYPES[] = {"unknown", "ncclFloat32", "ncclFloat64", "ncclFloat16",
                                     "ncclBfloat16", "ncclInt8", "ncclUint8", "unused",
                                     "ncclInt32", "ncclInt64"};
static const int DTYPE_BYTES[] = {0, 4, 8, 2, 2, 1, 1, 0, 4, 8};

static uint64_t p2p_comm_id(uint64_t hash, int src, int dst) {
  uint64_t x = hash ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(src + 1)) ^
               (0xC2B2AE3D27D4EB4FULL * (uint64_t)(dst + 1));
  x ^= x >> 31;
  return x * 0xBF58476D1CE4E5B9ULL;
}

/* ---- setup (first init) ---- */

/* A child forked after the first init shares the parent's ring mapping: a second writer would
 * corrupt it, so the child's communicators run without the plugin. */
static void on_fork_child(void) {
  g.ok = 0;
  snprintf(g.error, sizeof(g.error), "the process forked after the first init (the ring is the parent's)");
  atomic_store(&g.logged, 0);
}

static void setup_once(void) {
  g.pid = getpid();
  g.ncomms = (int)env_long("MYCROFT_NCCL_COMMS", 64, 1, 1 << 16);
  g.nops = (int)env_long("MYCROFT_NCCL_OPS", 1024, 1, 1 << 22);
  g.nflows = (int)env_long("MYCROFT_NCCL_FLOWS", 8192, 1, 1 << 24);
  g.tick_ms = (int)env_long("MYCROFT_NCCL_TICK_MS", 100, 0, 60000);
  long nslots = env_long("MYCROFT_NCCL_RING_SLOTS", 1 << 16, 2, 1L << 28);
  if (g.ncomms < 0 || g.nops < 0 || g.nflows < 0 || g.tick_ms < 0 || nslots < 0) {
    snprintf(g.error, sizeof(g.error),
             "a MYCROFT_NCCL_* pool size is not an integer in range (see producers/nccl/README.md)");
    return;
  }
  g.comms = calloc((size_t)g.ncomms, sizeof(myc_comm_t));
  g.ops = calloc((size_t)g.nops, sizeof(myc_op_t));
  g.flows = calloc((size_t)g.nflows, sizeof(myc_flow_t));
  g.steps = calloc((size_t)g.nflows * MYC_STEPS, sizeof(myc_step_t));
  if (!g.comms || !g.ops || !g.flows || !g.steps) {
    snprintf(g.error, sizeof(g.error), "cannot allocate the event pools; lower MYCROFT_NCCL_OPS or MYCROFT_NCCL_FLOWS");
    return;
  }
  static const char *const rank_env[] = {"MYCROFT_RANK", "RANK", "OMPI_COMM_WORLD_RANK",
                                         "PMI_RANK", "SLURM_PROCID", NULL};
  static const char *const local_env[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "MPI_LOCALRANKID", "SLURM_LOCALID", NULL};
  g.rank = env_rank(rank_env);
  if (g.rank < 0) g.rank = atomic_load(&g.first_rank); /* the first communicator's rank */
  const char *dir = getenv("MYCROFT_NCCL_RING_DIR");
  if (!dir || !*dir) dir = "/dev/shm/mycroft";
  int64_t created = now_ns();
  char name[128];
  snprintf(name, sizeof(name), "nccl-%d-%lld.ring", (int)g.pid, (long long)created);
  int err = myc_ring_create(&g.ring, dir, name, (uint32_t)nslots, g.rank, env_rank(local_env), created);
  if (err) {
    snprintf(g.error, sizeof(g.error), "cannot create the ring in %s: %s (set MYCROFT_NCCL_RING_DIR to a writable directory)",
             dir, strerror(err));
    return;
  }
  pthread_atfork(NULL, NULL, on_fork_child);
  g.ok = 1;
}

static void *tick_main(void *arg);
static void write_comm(uint64_t comm, int nranks, int rank, int nch, const char *name);

static void start_tick(void) {
  if (g.tick_ms > 0 && pthread_create(&g.tick_thread, NULL, tick_main, NULL) != 0) g.tick_ms = 0;
}

static pthread_once_t tick_once = PTHREAD_ONCE_INIT;

static ncclResult_t init_common(void **ctx, int *mask, const char *name, uint64_t hash, int nnodes,
                                int nranks, int rank, ncclDebugLogger_t logfn) {
  *ctx = NULL;
  if (logfn) atomic_store_explicit(&g.log, logfn, memory_order_relaxed);
  int unset = -1;
  atomic_compare_exchange_strong(&g.first_rank, &unset, rank);
  pthread_once(&g.once, setup_once);
  if (!g.ok) {
    ncclDebugLogger_t log = atomic_load_explicit(&g.log, memory_order_relaxed);
    if (atomic_exchange(&g.logged, 1) == 0 && log)
      log(NCCL_LOG_WARN, MYC_NCCL_INIT_FLAG, __FILE__, __LINE__, "Mycroft profiler disabled: %s", g.error);
    return ncclInternalError;
  }
  int idx = atomic_fetch_add(&g.ncomms_used, 1);
  if (idx >= g.ncomms) {
    atomic_fetch_add(&g.drop_comms, 1);
    return ncclInternalError; /* NCCL disables the plugin for this communicator only */
  }
  myc_comm_t *c = &g.comms[idx];
  c->hash = hash;
  c->nranks = nranks;
  c->rank = rank;
  c->nnodes = nnodes;
  if (name) snprintf(c->name, sizeof(c->name), "%s", name);
  /* COMM at init (channels unknown until the first op, whose announcement repeats it) */
  pthread_mutex_lock(&g.tick_lock);
  write_comm(hash, nranks, rank, 0, c->name);
  pthread_mutex_unlock(&g.tick_lock);
  pthread_once(&tick_once, start_tick);
  *mask = MYC_EV_COLL | MYC_EV_P2P | MYC_EV_PROXY_OP | MYC_EV_PROXY_STEP | MYC_EV_KERNEL_CH;
  *ctx = c;
  return ncclSuccess;
}

/* ---- event path ---- */

static myc_op_t *alloc_op(void) {
  unsigned start = atomic_fetch_add_explicit(&g.op_hint, 1, memory_order_relaxed);
  for (int i = 0; i < g.nops; i++) {
    myc_op_t *op = &g.ops[(start + (unsigned)i) % (unsigned)g.nops];
    int expect = FREE;
    if (atomic_load_explicit(&op->state, memory_order_relaxed) == FREE &&
        atomic_compare_exchange_strong(&op->state, &expect, FILLING))
      return op;
  }
  atomic_fetch_add_explicit(&g.drop_ops, 1, memory_order_relaxed);
  return NULL;
}

static myc_flow_t *alloc_flow(void) {
  unsigned start = atomic_fetch_add_explicit(&g.flow_hint, 1, memory_order_relaxed);
  for (int i = 0; i < g.nflows; i++) {
    myc_flow_t *f = &g.flows[(start + (unsigned)i) % (unsigned)g.nflows];
    int expect = FREE;
    if (atomic_load_explicit(&f->state, memory_order_relaxed) == FREE &&
        atomic_compare_exchange_strong(&f->state, &expect, FILLING))
      return f;
  }
  atomic_fetch_add_explicit(&g.drop_flows, 1, memory_order_relaxed);
  return NULL;
}

static myc_op_t *as_op(void *p) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)g.ops;
  if (!p || a < b || a >= b + (uintptr_t)g.nops * sizeof(myc_op_t)) return NULL;
  return (a - b) % sizeof(myc_op_t) ? NULL : (myc_op_t *)p;
}
static myc_flow_t *as_flow(void *p) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)g.flows;
  if (!p || a < b || a >= b + (uintptr_t)g.nflows * sizeof(myc_flow_t)) return NULL;
  return (a - b) % sizeof(myc_flow_t) ? NULL : (myc_flow_t *)p;
}
static myc_step_t *as_step(void *p) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)g.steps;
  if (!p || a < b || a >= b + (uintptr_t)g.nflows * MYC_STEPS * sizeof(myc_step_t)) return NULL;
  return (a - b) % sizeof(myc_step_t) ? NULL : (myc_step_t *)p;
}
/* A KernelCh handle points into its op (kch_tag), so the KernelCh path touches no other line. */
static myc_op_t *as_kch(void *p, int *channel) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)g.ops;
  if (!p || a < b || a >= b + (uintptr_t)g.nops * sizeof(myc_op_t)) return NULL;
  size_t off = (a - b) % sizeof(myc_op_t), tag = offsetof(myc_op_t, kch_tag);
  if (off < tag || off >= tag + MYC_MAX_CH) return NULL;
  *channel = (int)(off - tag);
  return (myc_op_t *)(b + (a - b) / sizeof(myc_op_t) * sizeof(myc_op_t));
}

/* The fields Mycroft reads, at the same offsets in v4, v5 and v6. */
typedef struct {
  uint64_t type;
  void *parent;
  const char *func, *datatype, *algo, *proto;
  uint64_t seq;
  size_t count;
  int peer, nchannels;
  pid_t pid;
  int channel, nsteps, is_send, step;
} myc_descr_t;

static void set_min(_Atomic int64_t *v, int64_t t) {
  int64_t cur = atomic_load_explicit(v, memory_order_relaxed);
  while ((cur == 0 || t < cur) && !atomic_compare_exchange_weak(v, &cur, t)) {
  }
}

static void start_op(myc_comm_t *c, void **h, const myc_descr_t *d, int is_p2p) {
  myc_op_t *op = alloc_op();
  *h = op;
  if (!op) return;
  op->comm = c;
  op->dtype = code_of(d->datatype, DTYPES, 10, 11);
  int esize = op->dtype <= 9 ? DTYPE_BYTES[op->dtype] : 0;
  op->bytes = (int64_t)d->count * esize;
  op->kind = code_of(d->func, OP_NAMES, 11, 0);
  op->nchannels = d->nchannels;
  if (is_p2p) {
    int dir = op->kind == 6 ? 1 : 0; /* Recv */
    int peer = d->peer;
    op->p2p_dir = dir;
    op->p2p_peer = peer;
    op->ring_comm = dir == 0 ? p2p_comm_id(c->hash, c->rank, peer) : p2p_comm_id(c->hash, peer, c->rank);
    op->seq = peer >= 0 && peer < MYC_P2P_PEERS
                  ? atomic_fetch_add_explicit(&c->p2p_seq[dir][peer], 1, memory_order_relaxed)
                  : -1;
    op->algo = 3;
    op->proto = 1;
  } else {
    op->ring_comm = c->hash;
    op->seq = (int64_t)d->seq;
    op->algo = code_of(d->algo, ALGOS, 8, 0);
    op->proto = code_of(d->proto, PROTOS, 4, 0);
    op->p2p_peer = -1;
  }
  op->issue_ns = now_ns();
  atomic_store_explicit(&op->start_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&op->end_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&op->enqueued, 0, memory_order_relaxed);
  atomic_store_explicit(&op->refs, 0, memory_order_relaxed);
  atomic_store_explicit(&op->children, 0, memory_order_relaxed);
  atomic_store_explicit(&op->kch_live, 0, memory_order_relaxed);
  op->issued_written = 0;
  op->nflows_done = 0;
  op->quiet_children = -1;
  atomic_store_explicit(&op->state, LIVE, memory_order_release);
}

static ncclResult_t start_common(void *ctx, void **h, const myc_descr_t *d) {
  *h = NULL;
  myc_comm_t *c = ctx;
  if (!c) return ncclSuccess;
  switch (d->type) {
    case MYC_EV_COLL:
      start_op(c, h, d, 0);
      break;
    case MYC_EV_P2P:
      start_op(c, h, d, 1);
      break;
    case MYC_EV_PROXY_OP: {
      myc_op_t *op = NULL;
      int pxn = d->pid != g.pid;
      if (pxn) {
        atomic_fetch_add_explicit(&g.pxn_flows, 1, memory_order_relaxed);
      } else {
        op = as_op(d->parent);
        if (!op || atomic_load_explicit(&op->state, memory_order_acquire) != LIVE) {
          atomic_fetch_add_explicit(&g.drop_flows, 1, memory_order_relaxed); /* parent retired */
          return ncclSuccess;
        }
      }
      myc_flow_t *f = alloc_flow();
      if (!f) return ncclSuccess;
      f->op = op; /* a PXN parent lives in another process: never dereferenced */
      f->channel = d->channel;
      f->dir = d->is_send ? 0 : 1;
      f->peer = d->peer;
      f->total = d->nsteps;
      atomic_store_explicit(&f->posted, 0, memory_order_relaxed);
      atomic_store_explicit(&f->ready, 0, memory_order_relaxed);
      atomic_store_explicit(&f->received, 0, memory_order_relaxed);
      atomic_store_explicit(&f->trans, 0, memory_order_relaxed);
      atomic_store_explicit(&f->done, 0, memory_order_relaxed);
      atomic_store_explicit(&f->bytes, 0, memory_order_relaxed);
      atomic_store_explicit(&f->first_ns, 0, memory_order_relaxed);
      atomic_store_explicit(&f->last_ns, 0, memory_order_relaxed);
      atomic_store_explicit(&f->wire_ns, 0, memory_order_relaxed);
      for (int i = 0; i < 5; i++) f->last[i] = -1;
      if (op) {
        atomic_fetch_add(&op->refs, 1);
        atomic_fetch_add(&op->children, 1);
      }
      atomic_store_explicit(&f->state, LIVE, memory_order_release);
      *h = f;
      break;
    }
    case MYC_EV_PROXY_STEP: {
      myc_flow_t *f = as_flow(d->parent);
      if (!f) return ncclSuccess;
      myc_step_t *s = &g.steps[(size_t)(f - g.flows) * MYC_STEPS + (unsigned)d->step % MYC_STEPS];
      s->flow = f;
      s->posted_ns = 0;
      atomic_store_explicit(&s->bits, 0, memory_order_relaxed);
      *h = s;
      break;
    }
    case MYC_EV_KERNEL_CH: {
      myc_op_t *op = as_op(d->parent);
      if (!op) return ncclSuccess;
      unsigned ch = (unsigned)d->channel % MYC_MAX_CH;
      if (atomic_fetch_or(&op->kch_live, 1ULL << ch) & (1ULL << ch)) return ncclSuccess;
      atomic_fetch_add(&op->refs, 1);
      atomic_fetch_add(&op->children, 1);
      set_min(&op->start_ns, now_ns());
      *h = &op->kch_tag[ch];
      break;
    }
    default:
      break;
  }
  return ncclSuccess;
}

/* Count a step's state once: NCCL repeats SendPeerWait while isend is retried. */
static int first_time(myc_step_t *s, uint8_t bit) {
  uint8_t b = atomic_load_explicit(&s->bits, memory_order_relaxed);
  if (b & bit) return 0;
  atomic_store_explicit(&s->bits, (uint8_t)(b | bit), memory_order_relaxed);
  return 1;
}

static void bump(_Atomic int *v) {
  atomic_store_explicit(v, atomic_load_explicit(v, memory_order_relaxed) + 1, memory_order_release);
}

static void first_progress(myc_flow_t *f) {
  if (atomic_load_explicit(&f->first_ns, memory_order_relaxed) == 0)
    atomic_store_explicit(&f->first_ns, now_ns(), memory_order_relaxed);
}

/* transSize is fresh only at SendWait and RecvFlushWait; every other state carries a stale one. */
static ncclResult_t record_common(void *h, int state, size_t trans_size) {
  myc_step_t *s = as_step(h);
  if (!s) return ncclSuccess; /* KernelCh stop times come from the host clock at stopEvent */
  myc_flow_t *f = s->flow;
  switch (state) {
    case MYC_ST_SEND_GPU_WAIT: /* slot posted to the GPU */
      if (first_time(s, 1)) bump(&f->posted);
      break;
    case MYC_ST_RECV_WAIT: /* irecv posted: recv G */
      if (first_time(s, 1)) {
        bump(&f->posted);
        bump(&f->ready);
      }
      break;
    case MYC_ST_SEND_PEER_WAIT: /* GPU made the data ready: send G (repeats while isend retries) */
      if (first_time(s, 2)) {
        first_progress(f);
        bump(&f->ready);
      }
      break;
    case MYC_ST_RECV_FLUSH_WAIT: /* data arrived from the network */
      if (first_time(s, 2)) {
        first_progress(f);
        bump(&f->received);
        atomic_fetch_add_explicit(&f->bytes, (int64_t)trans_size, memory_order_relaxed);
      }
      break;
    case MYC_ST_SEND_WAIT: /* isend returned a request: send T */
      if (first_time(s, 4)) {
        s->posted_ns = now_ns();
        first_progress(f);
        bump(&f->trans);
        atomic_fetch_add_explicit(&f->bytes, (int64_t)trans_size, memory_order_relaxed);
      }
      break;
    case MYC_ST_RECV_GPU_WAIT: /* handed to the GPU: recv T */
      if (first_time(s, 4)) {
        first_progress(f);
        bump(&f->trans);
      }
      break;
    default:
      break;
  }
  return ncclSuccess;
}

static ncclResult_t stop_common(void *h) {
  myc_step_t *s = as_step(h);
  if (s) {
    if (first_time(s, 8)) {
      int64_t t = now_ns();
      atomic_store_explicit(&s->flow->last_ns, t, memory_order_relaxed);
      if (s->posted_ns && t > s->posted_ns)
        atomic_fetch_add_explicit(&s->flow->wire_ns, t - s->posted_ns, memory_order_relaxed);
      bump(&s->flow->done);
    }
    return ncclSuccess;
  }
  myc_flow_t *f = as_flow(h);
  if (f) {
    atomic_store_explicit(&f->state, STOPPED, memory_order_release);
    return ncclSuccess;
  }
  myc_op_t *op = as_op(h);
  if (op) {
    atomic_store_explicit(&op->enqueued, 1, memory_order_release);
    return ncclSuccess;
  }
  int ch;
  myc_op_t *kop = as_kch(h, &ch);
  if (kop && (atomic_fetch_and(&kop->kch_live, ~(1ULL << ch)) & (1ULL << ch))) {
    int64_t t = now_ns();
    int64_t cur = atomic_load(&kop->end_ns);
    while (t > cur && !atomic_compare_exchange_weak(&kop->end_ns, &cur, t)) {
    }
    atomic_fetch_sub(&kop->refs, 1);
  }
  return ncclSuccess;
}

/* ---- tick thread: the ring's only writer ---- */

static void write_comm(uint64_t comm, int nranks, int rank, int nch, const char *name) {
  uint8_t b[64] = {0};
  int64_t t = now_ns();
  b[8] = MYC_KIND_COMM;
  myc_put_u64(b + 16, (uint64_t)t);
  myc_put_u64(b + 24, comm);
  myc_put_u32(b + 32, (uint32_t)nranks);
  myc_put_u32(b + 36, (uint32_t)rank);
  myc_put_u32(b + 40, (uint32_t)nch);
  myc_put_u32(b + 44, (uint32_t)-1);
  myc_ring_commit(&g.ring, b);
  if (name && *name) {
    memset(b, 0, 64);
    b[8] = MYC_KIND_COMM_NAME;
    myc_put_u64(b + 16, (uint64_t)t);
    myc_put_u64(b + 24, comm);
    memcpy(b + 32, name, strnlen(name, 32));
    myc_ring_commit(&g.ring, b);
  }
}

typedef struct {
  int v[5]; /* posted, ready, received, trans, done */
} myc_snap_t;

static myc_snap_t snapshot(myc_flow_t *f) {
  myc_snap_t n;
  n.v[0] = atomic_load_explicit(&f->posted, memory_order_acquire);
  n.v[1] = atomic_load_explicit(&f->ready, memory_order_acquire);
  n.v[2] = atomic_load_explicit(&f->received, memory_order_acquire);
  n.v[3] = atomic_load_explicit(&f->trans, memory_order_acquire);
  n.v[4] = atomic_load_explicit(&f->done, memory_order_acquire);
  /* counters are read one by one while the proxy moves: keep G >= T >= D in the record */
  if (n.v[3] < n.v[4]) n.v[3] = n.v[4];
  if (n.v[1] < n.v[3]) n.v[1] = n.v[3];
  return n;
}

static void flow_head(uint8_t *b, uint8_t kind, const myc_flow_t *f, int64_t t) {
  memset(b, 0, 64);
  b[8] = kind;
  myc_put_u64(b + 16, (uint64_t)t);
  myc_put_u64(b + 24, f->op->ring_comm);
  myc_put_u64(b + 32, (uint64_t)f->op->seq);
}

/* FLOW_PROGRESS and FLOW_STEPS of one snapshot (same ts_ns). */
static void write_progress(myc_flow_t *f, const myc_snap_t *n, int64_t t) {
  uint8_t b[64];
  flow_head(b, MYC_KIND_FLOW_PROGRESS, f, t);
  myc_put_u16(b + 40, (uint16_t)f->channel);
  b[42] = (uint8_t)f->dir;
  myc_put_u32(b + 44, (uint32_t)f->peer);
  myc_put_u32(b + 48, (uint32_t)(f->total > n->v[1] ? f->total : n->v[1]));
  myc_put_u32(b + 52, (uint32_t)n->v[1]);
  myc_put_u32(b + 56, (uint32_t)n->v[3]);
  myc_put_u32(b + 60, (uint32_t)n->v[4]);
  myc_ring_commit(&g.ring, b);
  flow_head(b, MYC_KIND_FLOW_STEPS, f, t);
  myc_put_u16(b + 40, (uint16_t)f->channel);
  b[42] = (uint8_t)f->dir;
  myc_put_u32(b + 44, (uint32_t)f->peer);
  myc_put_u32(b + 48, (uint32_t)n->v[0]);
  myc_put_u32(b + 52, (uint32_t)n->v[2]);
  myc_put_u64(b + 56, (uint64_t)atomic_load_explicit(&f->bytes, memory_order_relaxed));
  myc_ring_commit(&g.ring, b);
  memcpy(f->last, n->v, sizeof(f->last));
}

static void write_flow_done(myc_flow_t *f, int done, int64_t t) {
  uint8_t b[64];
  flow_head(b, MYC_KIND_FLOW_DONE, f, t);
  myc_put_u64(b + 40, (uint64_t)atomic_load(&f->first_ns));
  myc_put_u16(b + 48, (uint16_t)f->channel);
  b[50] = (uint8_t)f->dir;
  myc_put_u32(b + 52, (uint32_t)f->peer);
  myc_put_u32(b + 56, (uint32_t)done);
  int64_t wire_us = atomic_load_explicit(&f->wire_ns, memory_order_relaxed) / 1000;
  myc_put_u32(b + 60, (uint32_t)(wire_us > UINT32_MAX ? UINT32_MAX : wire_us));
  myc_ring_commit(&g.ring, b);
}

static void announce_op(myc_op_t *op) {
  myc_comm_t *c = op->comm;
  if (op->p2p_peer < 0) {
    if (!atomic_exchange(&c->announced, 1)) write_comm(c->hash, c->nranks, c->rank, op->nchannels, NULL);
  } else if (op->p2p_peer < MYC_P2P_PEERS && !atomic_exchange(&c->p2p_announced[op->p2p_dir][op->p2p_peer], 1)) {
    write_comm(op->ring_comm, 2, op->p2p_dir == 0 ? 0 : 1, op->nchannels, NULL);
  }
  uint8_t b[64] = {0};
  b[8] = MYC_KIND_OP_ISSUED;
  myc_put_u64(b + 16, (uint64_t)op->issue_ns);
  myc_put_u64(b + 24, op->ring_comm);
  myc_put_u64(b + 32, (uint64_t)op->seq);
  myc_put_u64(b + 40, (uint64_t)op->bytes);
  b[48] = op->kind;
  b[49] = op->algo;
  b[50] = op->proto;
  myc_put_u32(b + 52, 0);
  b[56] = op->dtype;
  myc_ring_commit(&g.ring, b);
  op->issued_written = 1;
}

static void write_beat(int64_t t) {
  uint8_t b[64] = {0};
  b[8] = MYC_KIND_BEAT;
  myc_put_u64(b + 16, (uint64_t)t);
  myc_put_u64(b + 24, (uint64_t)-1);
  myc_put_u32(b + 32, (uint32_t)atomic_load(&g.drop_comms));
  myc_put_u32(b + 36, (uint32_t)atomic_load(&g.drop_ops));
  myc_put_u32(b + 40, (uint32_t)atomic_load(&g.drop_flows));
  myc_put_u32(b + 44, (uint32_t)atomic_load(&g.pxn_flows));
  myc_ring_commit(&g.ring, b);
}

static void tick(int force) {
  int64_t t = now_ns();
  for (int i = 0; i < g.nops; i++) {
    myc_op_t *op = &g.ops[i];
    if (atomic_load_explicit(&op->state, memory_order_acquire) == LIVE && !op->issued_written) announce_op(op);
  }
  for (int i = 0; i < g.nflows; i++) {
    myc_flow_t *f = &g.flows[i];
    int st = atomic_load_explicit(&f->state, memory_order_acquire);
    if (st == FREE || st == FILLING) continue;
    if (!f->op) { /* PXN: counted in the BEAT, not attributable to a local op */
      if (st == STOPPED) atomic_store_explicit(&f->state, FREE, memory_order_release);
      continue;
    }
    myc_snap_t n = snapshot(f);
    int changed = memcmp(n.v, f->last, sizeof(f->last)) != 0;
    if (changed || st == STOPPED) {
      if (!f->op->issued_written) announce_op(f->op);
      if (changed) write_progress(f, &n, t);
    }
    if (st == STOPPED) {
      int64_t last = atomic_load(&f->last_ns);
      write_flow_done(f, n.v[4], last ? last : t);
      myc_op_t *op = f->op;
      int64_t first = atomic_load(&f->first_ns);
      if (first) set_min(&op->start_ns, first);
      int64_t cur = atomic_load(&op->end_ns);
      while (last > cur && !atomic_compare_exchange_weak(&op->end_ns, &cur, last)) {
      }
      op->nflows_done++;
      atomic_store_explicit(&f->state, FREE, memory_order_release);
      atomic_fetch_sub(&op->refs, 1);
    }
  }
  for (int i = 0; i < g.nops; i++) {
    myc_op_t *op = &g.ops[i];
    if (atomic_load_explicit(&op->state, memory_order_acquire) != LIVE) continue;
    int children = atomic_load(&op->children);
    if (!atomic_load(&op->enqueued) || children == 0 || atomic_load(&op->refs) != 0) {
      op->quiet_children = -1;
      continue;
    }
    /* Coll/P2p stop means enqueued, and NCCL starts an op's ProxyOps per channel as the proxy
     * reaches them: a timed tick waits one more tick with no new child before calling the op
     * done, so a channel whose ProxyOp starts a little later is not cut off. */
    if (!force && op->quiet_children != children) {
      op->quiet_children = children;
      continue;
    }
    uint8_t b[64] = {0};
    int64_t end = atomic_load(&op->end_ns);
    b[8] = MYC_KIND_OP_DONE;
    myc_put_u64(b + 16, (uint64_t)(end ? end : t));
    myc_put_u64(b + 24, op->ring_comm);
    myc_put_u64(b + 32, (uint64_t)op->seq);
    myc_put_u64(b + 40, (uint64_t)atomic_load(&op->start_ns));
    myc_put_u32(b + 48, (uint32_t)op->nflows_done);
    myc_ring_commit(&g.ring, b);
    atomic_store_explicit(&op->state, FREE, memory_order_release);
  }
  /* A BEAT every tick, as the torch tracer beats: the agent's rc seen_ns is
   * a rank's liveness, and the worker counts a rank silent after 1 s. */
  write_beat(t);
  g.last_beat_ns = t;
}

static void *tick_main(void *arg) {
  (void)arg;
  struct timespec ts = {.tv_sec = g.tick_ms / 1000, .tv_nsec = (long)(g.tick_ms % 1000) * 1000000L};
  while (!atomic_load(&g.stop)) {
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&g.tick_lock);
    tick(0);
    pthread_mutex_unlock(&g.tick_lock);
  }
  return NULL;
}

/* Write everything pending now (finalize; the test harness with MYCROFT_NCCL_TICK_MS=0). */
__attribute__((visibility("default"))) void mycroftNcclFlush(void) {
  if (!g.ok) return;
  pthread_mutex_lock(&g.tick_lock);
  tick(1);
  pthread_mutex_unlock(&g.tick_lock);
}

/* One timed tick, as the tick thread runs it (the test harness's "tick" line). */
__attribute__((visibility("default"))) void mycroftNcclTick(void) {
  if (!g.ok) return;
  pthread_mutex_lock(&g.tick_lock);
  tick(0);
  pthread_mutex_unlock(&g.tick_lock);
}

static ncclResult_t finalize_common(void *ctx) {
  (void)ctx;
  mycroftNcclFlush();
  return ncclSuccess;
}

/* ---- version adapters ---- */

#define FILL_COMMON(d, e)                       \
  do {                                          \
    memset(&(d), 0, sizeof(d));                 \
    (d).type = (e)->type;                       \
    (d).parent = (e)->parentObj;                \
    switch ((d).type) {                         \
      case MYC_EV_COLL:                         \
        (d).seq = (e)->coll.seqNumber;          \
        (d).func = (e)->coll.func;              \
        (d).count = (e)->coll.count;            \
        (d).datatype = (e)->coll.datatype;      \
        (d).nchannels = (e)->coll.nChannels;    \
        (d).algo = (e)->coll.algo;              \
        (d).proto = (e)->coll.proto;            \
        break;                                  \
      case MYC_EV_P2P:                          \
        (d).func = (e)->p2p.func;               \
        (d).count = (e)->p2p.count;             \
        (d).datatype = (e)->p2p.datatype;       \
        (d).peer = (e)->p2p.peer;               \
        (d).nchannels = (e)->p2p.nChannels;     \
        break;                                  \
      case MYC_EV_PROXY_OP:                     \
        (d).pid = (e)->proxyOp.pid;             \
        (d).channel = (e)->proxyOp.channelId;   \
        (d).peer = (e)->proxyOp.peer;           \
        (d).nsteps = (e)->proxyOp.nSteps;       \
        (d).is_send = (e)->proxyOp.isSend;      \
        break;                                  \
      case MYC_EV_PROXY_STEP:                   \
        (d).step = (e)->proxyStep.step;         \
        break;                                  \
      case MYC_EV_KERNEL_CH:                    \
        (d).channel = (e)->kernelCh.channelId;  \
        break;                                  \
      default:                                  \
        break;                                  \
    }                                           \
  } while (0)

static ncclResult_t init_v4(void **ctx, int *mask, const char *name, uint64_t hash, int nnodes, int nranks,
                            int rank, ncclDebugLogger_t logfn) {
  return init_common(ctx, mask, name, hash, nnodes, nranks, rank, logfn);
}
static ncclResult_t init_v5(void **ctx, uint64_t id, int *mask, const char *name, int nnodes, int nranks,
                            int rank, ncclDebugLogger_t logfn) {
  return init_common(ctx, mask, name, id, nnodes, nranks, rank, logfn);
}
static ncclResult_t start_v4(void *ctx, void **h, ncclProfilerEventDescr_v4_t *e) {
  myc_descr_t d;
  FILL_COMMON(d, e);
  return start_common(ctx, h, &d);
}
static ncclResult_t start_v5(void *ctx, void **h, ncclProfilerEventDescr_v5_t *e) {
  myc_descr_t d;
  FILL_COMMON(d, e);
  return start_common(ctx, h, &d);
}
static ncclResult_t start_v6(void *ctx, void **h, ncclProfilerEventDescr_v6_t *e) {
  myc_descr_t d;
  FILL_COMMON(d, e);
  return start_common(ctx, h, &d);
}
static ncclResult_t record_v4(void *h, ncclProfilerEventState_v4_t st, ncclProfilerEventStateArgs_v4_t *a) {
  return record_common(h, st, a ? a->proxyStep.transSize : 0);
}
static ncclResult_t record_v5(void *h, ncclProfilerEventState_v5_t st, ncclProfilerEventStateArgs_v5_t *a) {
  return record_common(h, st, a ? a->proxyStep.transSize : 0);
}

#define EXPORT __attribute__((visibility("default")))
EXPORT ncclProfiler_v6_t ncclProfiler_v6 = {"Mycroft", init_v5, start_v6, stop_common, record_v5, finalize_common};
EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {"Mycroft", init_v5, start_v5, stop_common, record_v5, finalize_common};
EXPORT ncclProfiler_v4_t ncclProfiler_v4 = {"Mycroft", init_v4, start_v4, stop_common, record_v4, finalize_common};
