/* Mycroft's NCCL profiler plugin: per-flow G/T/D counters from NCCL's proxy events into the ring.
 *
 * Threads: NCCL's application, CUDA-callback and proxy threads call the event functions; they
 * only touch fixed pools (allocated at the first init) with atomics, one clock read per finished
 * step (three per send step: its SendPeerWait and SendWait too, for the ready wait and the wire
 * time), no lock and no syscall. One tick thread (every MYCROFT_NCCL_TICK_MS, default 100 ms, the
 * torch tracer's tick) is the rings' only writer: it snapshots live flows (FLOW_PROGRESS),
 * retires finished flows (FLOW_DONE) and ops (OP_DONE) and writes a BEAT with the coverage
 * counters each tick. A tick thread was chosen over writing on the proxy thread's own events
 * because a ring needs a single writer and a CRC per record; doing that per step would cost the
 * proxy ~100 ns per event and a lock across proxy threads (bench/nccl_plugin_overhead.py).
 *
 * How NCCL drives a plugin, and why the code below is shaped by it (NCCL v2.27-2.30 sources,
 * read in ../../shared/reference/nccl-real-calls.md when it is beside the checkout):
 *  - coll.seqNumber is comm->seqNumber[func], a counter per collective function, and CUDA-graph
 *    replays repeat it: an op's identity is the plugin's own per-communicator count of Coll
 *    starts (every rank starts a communicator's collectives in the same order).
 *  - init runs for every communicator a process ever creates; an error from init turns the
 *    profiler off for the process (2.27) or unloads the plugin twice for one load (2.30.3+):
 *    init never fails. A full communicator pool or a failed setup declines the communicator
 *    (NULL context), and finalize returns the communicator's slot.
 *  - Some ProxyOps are never stopped (CollNet, CUDA-memcpy P2P/SHM, ncclCommAbort mid-op):
 *    their flows are released once the op's kernel ended, and finalize releases a
 *    communicator's ops.
 *  - One process may drive several GPUs: one ring per device. */

#include <dlfcn.h>
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

#include "glibc_compat.h" /* after the declarations it renames */

#define MYC_STEPS 8   /* NCCL_STEPS: step handles live in pHandles[step % NCCL_STEPS] */
#define MYC_MAX_CH 64 /* MAXCHANNELS */
#define MYC_MAX_DEV 64

enum { FREE = 0, LIVE = 1, STOPPED = 2, FILLING = 3, RETIRING = 4 }; /* FILLING: taken, not yet visible */

/* One ring per device (a process may drive several GPUs). */
typedef struct myc_dev {
  _Atomic int ready;
  int key; /* CUDA device ordinal of the communicators' init thread, -1: unknown */
  int32_t rank;
  myc_ring_t ring;
  _Atomic uint32_t drop_comms, drop_ops, drop_flows, pxn_flows, unseen_ops, abandoned_ops, orphan_flows;
} myc_dev_t;

typedef struct myc_comm {
  _Atomic int state; /* FREE or LIVE (between init and finalize) */
  uint64_t hash;
  int nranks, rank, nnodes;
  myc_dev_t *dev;
  char name[32];
  _Atomic int announced;
  _Atomic int64_t coll_seq; /* Coll starts so far: the op's seq */
  _Atomic int64_t *p2p_seq; /* [dir * nranks + peer]: per (dir, peer) virtual communicator */
  _Atomic uint8_t *p2p_announced;
  int p2p_cap;
  _Atomic uint64_t api_colls; /* CollApi starts outside graph capture (v5+) */
  _Atomic uint64_t api_seen;  /* Coll starts whose parent is such a CollApi */
  uint64_t api_hist[2];       /* tick thread: api_colls one and two ticks ago */
  uint64_t unseen;            /* tick thread: unseen ops counted so far */
  uint8_t api_tag[2];         /* handles of CollApi: [0] eager, [1] graph-captured */
} myc_comm_t;

typedef struct myc_op {
  _Atomic int enqueued; /* Coll/P2p stopEvent: enqueued, not complete */
  _Atomic int refs;     /* flows not yet retired by the tick + live KernelCh + starting children */
  _Atomic int children; /* ProxyOp and KernelCh events seen */
  int issued_written;
  int stale; /* tick thread: a flow was released without FLOW_DONE */
  myc_comm_t *comm;
  uint64_t ring_comm;
  int64_t seq, bytes, issue_ns;
  uint32_t func_seq;
  _Atomic int64_t start_ns, end_ns;
  uint8_t kind, algo, proto, dtype;
  int nchannels, nflows_done, p2p_dir, p2p_peer;
  int quiet_children; /* tick thread: children count when first seen complete, -1: not yet */
  _Atomic uint64_t kch_live; /* bit c: KernelCh of channel c started, not stopped */
  _Atomic uint64_t kch_seen; /* bit c: KernelCh of channel c started */
  uint8_t kch_tag[MYC_MAX_CH]; /* &kch_tag[c] is the KernelCh handle of channel c */
} myc_op_t;

typedef struct myc_flow {
  myc_op_t *op; /* NULL for a PXN flow (another process's op) */
  int channel, dir, peer, total;
  /* G/T/D of FLOW_PROGRESS; posted, received and the ready wait go to FLOW_STEPS (schemas/ring.md).
   * send: posted = SendGPUWait, ready = SendPeerWait, trans = SendWait, done = stop.
   * recv: ready = RecvWait (posted), received = RecvFlushWait, trans = RecvGPUWait,
   *       done = stop (consumed); posted mirrors ready. */
  _Atomic int posted, ready, received, trans, done;
  _Atomic int stepped; /* a ProxyStep started: NCCL's net proxy drives this flow */
  _Atomic int64_t bytes, first_ns, last_ns;
  _Atomic int64_t wire_ns;  /* send: per step, SendWait to stop, summed (FLOW_DONE wire_us) */
  _Atomic int64_t wait_ns;  /* send: per step, first SendPeerWait to SendWait, summed */
  _Atomic int64_t head_ns;  /* send: first SendPeerWait of the step waiting now, 0: none */
  int last[6];    /* tick thread's last snapshot of posted, ready, received, trans, done, wait_us */
  int idle_ticks; /* tick thread: ticks without a change */
} myc_flow_t;

typedef struct {
  myc_flow_t *flow;
  _Atomic uint8_t bits; /* which states of this step were counted */
  int64_t ready_ns;     /* send: first SendPeerWait; 0 before */
  int64_t posted_ns;    /* send: SendWait (the data went to the network); 0 before */
} myc_step_t;

static struct {
  pthread_once_t once;
  int ok;
  char error[256];
  _Atomic(ncclDebugLogger_t) log; /* set by every init, from any thread */
  _Atomic int logged_setup, logged_pool, logged_ring;
  pid_t pid;
  int ncomms, nops, nflows, tick_ms, stale_ticks;
  long nslots;
  myc_comm_t *comms;
  myc_op_t *ops;
  _Atomic int *op_state; /* compact, so that the tick scans states, not ops */
  myc_flow_t *flows;
  _Atomic int *flow_state;
  myc_step_t *steps;
  _Atomic unsigned op_hint, flow_hint;
  pthread_mutex_t dev_lock; /* init and finalize only */
  myc_dev_t devs[MYC_MAX_DEV];
  _Atomic int ndevs;
  pthread_mutex_t tick_lock; /* tick thread vs flush and finalize; never taken on the event path */
  pthread_t tick_thread;
  _Atomic int stop;
  uint8_t group_tag[2]; /* handles of Group and GroupApi / P2pApi events */
} g = {.once = PTHREAD_ONCE_INIT,
       .tick_lock = PTHREAD_MUTEX_INITIALIZER,
       .dev_lock = PTHREAD_MUTEX_INITIALIZER};

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

static int env_first(const char *const *names) {
  for (int i = 0; names[i]; i++) {
    const char *s = getenv(names[i]);
    if (s && *s) return atoi(s);
  }
  return -1;
}

static void warn_once(_Atomic int *flag, const char *fmt, const char *what) {
  ncclDebugLogger_t log = atomic_load_explicit(&g.log, memory_order_relaxed);
  if (log && atomic_exchange(flag, 1) == 0) log(NCCL_LOG_WARN, MYC_NCCL_INIT_FLAG, __FILE__, __LINE__, fmt, what);
}

static uint8_t code_of(const char *s, const char *const *names, int n, uint8_t dflt) {
  if (!s) return dflt;
  for (int i = 0; i < n; i++)
    if (names[i][0] && strcasecmp(s, names[i]) == 0) return (uint8_t)i;
  return dflt;
}

/* schemas/vocab.py OP_NAMES, ALGORITHMS, PROTOCOLS; ring_layout.DTYPES in NCCL's spellings
 * (codes with no NCCL type are ""). AllGather and Broadcast reach the plugin as ncclInt8 with
 * the count in bytes (enqueue.cc), so their bytes are right and their dtype reads int8. */
static const char *const OP_NAMES[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                       "Reduce",    "Send",      "Recv",          "AllToAll",
                                       "Barrier",   "Gather",    "Scatter"};
static const char *const ALGOS[] = {"unknown", "RING", "TREE", "P2P", "NVLS",
                                    "COLLNET_DIRECT", "COLLNET_CHAIN", "PAT", "NVLS_TREE"};
static const char *const PROTOS[] = {"unknown", "SIMPLE", "LL", "LL128"};
#define DTYPE_OTHER 11
static const char *const DTYPES[] = {"",           "ncclFloat32",     "ncclFloat64",    "ncclFloat16",
                                     "ncclBfloat16", "ncclInt8",      "ncclUint8",      "",
                                     "ncclInt32",  "ncclInt64",       "",               "",
                                     "ncclUint32", "ncclUint64",      "ncclFloat8e4m3", "ncclFloat8e5m2"};
static const int DTYPE_BYTES[] = {0, 4, 8, 2, 2, 1, 1, 2, 4, 8, 1, 0, 4, 8, 1, 1};
#define NDTYPES ((int)(sizeof(DTYPE_BYTES) / sizeof(DTYPE_BYTES[0])))

static uint64_t p2p_comm_id(uint64_t hash, int src, int dst) {
  uint64_t x = hash ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(src + 1)) ^
               (0xC2B2AE3D27D4EB4FULL * (uint64_t)(dst + 1));
  x ^= x >> 31;
  return x * 0xBF58476D1CE4E5B9ULL;
}

/* ---- setup (first init) ---- */

/* A child forked after the first init shares the parent's ring mappings: a second writer would
 * corrupt them, so the child's communicators are declined. */
static void on_fork_child(void) {
  g.ok = 0;
  snprintf(g.error, sizeof(g.error), "the process forked after the first init (the rings are the parent's)");
  atomic_store(&g.logged_setup, 0);
}

static void setup_once(void) {
  g.pid = getpid();
  /* Defaults hold >= 50,000 ops/s at the default tick with no drop: an op lives about two
   * ticks (bench/nccl_plugin_overhead.py --rate measures it). */
  g.ncomms = (int)env_long("MYCROFT_NCCL_COMMS", 256, 1, 1 << 16);
  g.nops = (int)env_long("MYCROFT_NCCL_OPS", 32768, 1, 1 << 22);
  g.nflows = (int)env_long("MYCROFT_NCCL_FLOWS", 65536, 1, 1 << 24);
  g.tick_ms = (int)env_long("MYCROFT_NCCL_TICK_MS", 100, 0, 60000);
  g.stale_ticks = (int)env_long("MYCROFT_NCCL_STALE_TICKS", 100, 1, 1 << 20);
  g.nslots = env_long("MYCROFT_NCCL_RING_SLOTS", 1 << 18, 2, 1L << 28);
  if (g.ncomms < 0 || g.nops < 0 || g.nflows < 0 || g.tick_ms < 0 || g.stale_ticks < 0 || g.nslots < 0) {
    snprintf(g.error, sizeof(g.error),
             "a MYCROFT_NCCL_* setting is not an integer in range (see producers/nccl/README.md)");
    return;
  }
  g.comms = calloc((size_t)g.ncomms, sizeof(myc_comm_t));
  g.ops = calloc((size_t)g.nops, sizeof(myc_op_t));
  g.op_state = calloc((size_t)g.nops, sizeof(*g.op_state));
  g.flows = calloc((size_t)g.nflows, sizeof(myc_flow_t));
  g.flow_state = calloc((size_t)g.nflows, sizeof(*g.flow_state));
  g.steps = calloc((size_t)g.nflows * MYC_STEPS, sizeof(myc_step_t));
  if (!g.comms || !g.ops || !g.op_state || !g.flows || !g.flow_state || !g.steps) {
    snprintf(g.error, sizeof(g.error), "cannot allocate the event pools; lower MYCROFT_NCCL_OPS or MYCROFT_NCCL_FLOWS");
    return;
  }
  pthread_atfork(NULL, NULL, on_fork_child);
  g.ok = 1;
}

/* The CUDA device current on the calling thread (NCCL's init threads run after cudaSetDevice),
 * through the driver API of an already loaded libcuda; -1 without one. */
typedef int (*get_device_fn)(int *);
static get_device_fn get_device;
static pthread_once_t get_device_once = PTHREAD_ONCE_INIT;

static void find_get_device(void) {
  void *f = dlsym(RTLD_DEFAULT, "cuCtxGetDevice");
  if (!f) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib) f = dlsym(lib, "cuCtxGetDevice");
  }
  memcpy(&get_device, &f, sizeof(get_device));
}

static int current_device(void) {
  pthread_once(&get_device_once, find_get_device); /* several inits may run at once */
  int dev = -1;
  if (!get_device || get_device(&dev) != 0) return -1;
  return dev;
}

/* The rank a device's ring is written under. The first device takes the launcher's rank
 * (RANK and the like) unless its first communicator has more ranks than the launcher's world,
 * which means the process drives several GPUs and the launcher's rank is a process's; other
 * devices, and a process with no launcher rank, take their first communicator's rank. */
static int32_t ring_rank(int first_device, int comm_rank, int comm_nranks) {
  static const char *const rank_env[] = {"MYCROFT_RANK", "RANK", "OMPI_COMM_WORLD_RANK",
                                         "PMI_RANK", "SLURM_PROCID", NULL};
  static const char *const size_env[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                         "SLURM_NTASKS", NULL};
  int env_rank = env_first(rank_env), env_size = env_first(size_env);
  if (first_device && env_rank >= 0 && (env_size <= 0 || comm_nranks <= env_size)) return env_rank;
  return comm_rank;
}

/* The training job this process belongs to, for the ring header: MYCROFT_JOB_ID, else the
 * launcher's (torchrun's run id, Slurm's, PBS's, LSF's); NULL: not known (the agent's setting
 * applies). On Kubernetes set MYCROFT_JOB_ID from a pod label with the downward API. */
static const char *job_id(void) {
  static const char *const job_env[] = {"MYCROFT_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                                        "PBS_JOBID", "LSB_JOBID", NULL};
  for (int i = 0; job_env[i]; i++) {
    const char *s = getenv(job_env[i]);
    if (s && *s) return s;
  }
  return NULL;
}

/* The ring of device `key`, created on the first communicator of that device (dev_lock held). */
static myc_dev_t *dev_for(int key, int comm_rank, int comm_nranks) {
  int n = atomic_load(&g.ndevs);
  for (int i = 0; i < n; i++)
    if (g.devs[i].key == key) return &g.devs[i];
  if (n == MYC_MAX_DEV) return NULL;
  static const char *const local_env[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "MPI_LOCALRANKID", "SLURM_LOCALID", NULL};
  myc_dev_t *d = &g.devs[n];
  d->key = key;
  d->rank = ring_rank(n == 0, comm_rank, comm_nranks);
  const char *dir = getenv("MYCROFT_NCCL_RING_DIR");
  if (!dir || !*dir) dir = "/dev/shm/mycroft";
  int64_t created = now_ns();
  char name[128];
  snprintf(name, sizeof(name), "nccl-%d-d%d-%lld.ring", (int)g.pid, key, (long long)created);
  int local = n == 0 ? env_first(local_env) : key;
  int err = myc_ring_create(&d->ring, dir, name, (uint32_t)g.nslots, d->rank, local, created, job_id());
  if (err) {
    char msg[200];
    snprintf(msg, sizeof(msg), "%s: %s", dir, strerror(err));
    warn_once(&g.logged_ring,
              "Mycroft profiler: cannot create a ring in %s (set MYCROFT_NCCL_RING_DIR to a writable "
              "directory); communicators of this device run unprofiled",
              msg);
    return NULL;
  }
  atomic_store_explicit(&d->ready, 1, memory_order_release);
  atomic_store(&g.ndevs, n + 1);
  return d;
}

static void *tick_main(void *arg);
static void write_comm(myc_dev_t *dev, uint64_t comm, int nranks, int rank, int nch, const char *name);

static void start_tick(void) {
  if (g.tick_ms > 0 && pthread_create(&g.tick_thread, NULL, tick_main, NULL) != 0) g.tick_ms = 0;
}

static pthread_once_t tick_once = PTHREAD_ONCE_INIT;

/* A free communicator slot with room for `nranks` P2P peers (dev_lock held), or NULL. */
static myc_comm_t *take_comm(int nranks) {
  for (int i = 0; i < g.ncomms; i++) {
    myc_comm_t *c = &g.comms[i];
    if (atomic_load(&c->state) != FREE) continue;
    size_t n = 2 * (size_t)(nranks > 0 ? nranks : 1);
    if (c->p2p_cap < (int)n) {
      _Atomic int64_t *seq = calloc(n, sizeof(*seq));
      _Atomic uint8_t *ann = calloc(n, sizeof(*ann));
      if (!seq || !ann) {
        free(seq);
        free(ann);
        return NULL;
      }
      free(c->p2p_seq);
      free(c->p2p_announced);
      c->p2p_seq = seq;
      c->p2p_announced = ann;
      c->p2p_cap = (int)n;
    } else {
      memset(c->p2p_seq, 0, n * sizeof(*c->p2p_seq));
      memset(c->p2p_announced, 0, n * sizeof(*c->p2p_announced));
    }
    return c;
  }
  return NULL;
}

/* NCCL's reaction to an init error differs by release and is harmful in each (2.27: profiler off
 * for the process; 2.30.3+: two unloads for one load), so init always succeeds: a communicator
 * the plugin cannot track is declined with a NULL context and its events are ignored. */
static ncclResult_t init_common(void **ctx, int *mask, const char *name, uint64_t hash, int nnodes,
                                int nranks, int rank, ncclDebugLogger_t logfn) {
  *ctx = NULL;
  if (logfn) atomic_store_explicit(&g.log, logfn, memory_order_relaxed);
  pthread_once(&g.once, setup_once);
  if (!g.ok) {
    warn_once(&g.logged_setup, "Mycroft profiler disabled: %s", g.error);
    *mask = 0;
    return ncclSuccess;
  }
  int key = current_device();
  pthread_mutex_lock(&g.dev_lock);
  myc_dev_t *dev = dev_for(key, rank, nranks);
  myc_comm_t *c = dev ? take_comm(nranks) : NULL;
  if (!c) {
    myc_dev_t *count = dev ? dev : (atomic_load(&g.ndevs) ? &g.devs[0] : NULL);
    if (count) atomic_fetch_add(&count->drop_comms, 1);
    pthread_mutex_unlock(&g.dev_lock);
    if (dev)
      warn_once(&g.logged_pool, "Mycroft profiler: %s",
                "more live communicators than MYCROFT_NCCL_COMMS; the newest run unprofiled");
    return ncclSuccess;
  }
  c->hash = hash;
  c->nranks = nranks;
  c->rank = rank;
  c->nnodes = nnodes;
  c->dev = dev;
  c->name[0] = 0;
  if (name) snprintf(c->name, sizeof(c->name), "%s", name);
  atomic_store(&c->announced, 0);
  atomic_store(&c->coll_seq, 0);
  atomic_store(&c->api_colls, 0);
  atomic_store(&c->api_seen, 0);
  c->api_hist[0] = c->api_hist[1] = 0;
  c->unseen = 0;
  atomic_store_explicit(&c->state, LIVE, memory_order_release);
  pthread_mutex_unlock(&g.dev_lock);
  /* COMM at init (channels unknown until the first op, whose announcement repeats it) */
  pthread_mutex_lock(&g.tick_lock);
  write_comm(dev, hash, nranks, rank, 0, c->name);
  pthread_mutex_unlock(&g.tick_lock);
  pthread_once(&tick_once, start_tick);
  *mask = MYC_EV_COLL | MYC_EV_P2P | MYC_EV_PROXY_OP | MYC_EV_PROXY_STEP | MYC_EV_KERNEL_CH;
  *ctx = c;
  return ncclSuccess;
}

/* ---- event path ---- */

static int take_slot(_Atomic int *state, int n, _Atomic unsigned *hint) {
  unsigned start = atomic_fetch_add_explicit(hint, 1, memory_order_relaxed);
  for (int i = 0; i < n; i++) {
    int k = (int)((start + (unsigned)i) % (unsigned)n);
    int expect = FREE;
    if (atomic_load_explicit(&state[k], memory_order_relaxed) == FREE &&
        atomic_compare_exchange_strong(&state[k], &expect, FILLING))
      return k;
  }
  return -1;
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
static _Atomic int *op_state(const myc_op_t *op) { return &g.op_state[op - g.ops]; }
static _Atomic int *flow_state(const myc_flow_t *f) { return &g.flow_state[f - g.flows]; }

/* The fields Mycroft reads, at the same offsets in v4, v5 and v6. */
typedef struct {
  uint64_t type;
  void *parent;
  const char *func, *datatype, *algo, *proto;
  uint64_t seq;
  size_t count;
  int peer, nchannels;
  pid_t pid;
  int channel, nsteps, is_send, step, captured;
} myc_descr_t;

static void set_min(_Atomic int64_t *v, int64_t t) {
  int64_t cur = atomic_load_explicit(v, memory_order_relaxed);
  while ((cur == 0 || t < cur) && !atomic_compare_exchange_weak(v, &cur, t)) {
  }
}

static void set_max(_Atomic int64_t *v, int64_t t) {
  int64_t cur = atomic_load(v);
  while (t > cur && !atomic_compare_exchange_weak(v, &cur, t)) {
  }
}

/* A child (ProxyOp, KernelCh) takes a reference before it checks that its op is live; the tick
 * retires an op by leaving LIVE before it checks the references (both sequentially consistent),
 * so a child that starts while its op retires either keeps it live or sees it gone. */
static int hold(myc_op_t *op) {
  atomic_fetch_add(&op->refs, 1);
  if (atomic_load(op_state(op)) == LIVE) return 1;
  atomic_fetch_sub(&op->refs, 1);
  return 0;
}

static void start_op(myc_comm_t *c, void **h, const myc_descr_t *d, int is_p2p) {
  int kind = code_of(d->func, OP_NAMES, 11, 0);
  int64_t seq;
  int dir = 0, peer = -1;
  if (is_p2p) {
    dir = kind == 6 ? 1 : 0; /* Recv */
    peer = d->peer;
    seq = peer >= 0 && peer < c->nranks
              ? atomic_fetch_add_explicit(&c->p2p_seq[dir * c->nranks + peer], 1, memory_order_relaxed)
              : -1;
  } else {
    /* the op's identity: this communicator's count of Coll starts, taken even when the pool is
     * full so that later ops keep the seq the other ranks give them */
    seq = atomic_fetch_add_explicit(&c->coll_seq, 1, memory_order_relaxed);
    if (d->parent && d->parent == (void *)&c->api_tag[0]) atomic_fetch_add(&c->api_seen, 1);
  }
  int k = take_slot(g.op_state, g.nops, &g.op_hint);
  if (k < 0) {
    atomic_fetch_add_explicit(&c->dev->drop_ops, 1, memory_order_relaxed);
    return;
  }
  myc_op_t *op = &g.ops[k];
  op->comm = c;
  op->seq = seq;
  op->kind = (uint8_t)kind;
  op->dtype = code_of(d->datatype, DTYPES, NDTYPES, DTYPE_OTHER);
  op->bytes = (int64_t)d->count * DTYPE_BYTES[op->dtype < NDTYPES ? op->dtype : 0];
  op->nchannels = d->nchannels;
  op->p2p_dir = dir;
  op->p2p_peer = peer;
  if (is_p2p) {
    op->ring_comm = dir == 0 ? p2p_comm_id(c->hash, c->rank, peer) : p2p_comm_id(c->hash, peer, c->rank);
    op->func_seq = 0;
    op->algo = 3;
    op->proto = 1;
  } else {
    op->ring_comm = c->hash;
    op->func_seq = (uint32_t)d->seq;
    op->algo = code_of(d->algo, ALGOS, 9, 0);
    op->proto = code_of(d->proto, PROTOS, 4, 0);
  }
  op->issue_ns = now_ns();
  atomic_store_explicit(&op->start_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&op->end_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&op->enqueued, 0, memory_order_relaxed);
  atomic_store_explicit(&op->refs, 0, memory_order_relaxed);
  atomic_store_explicit(&op->children, 0, memory_order_relaxed);
  atomic_store_explicit(&op->kch_live, 0, memory_order_relaxed);
  atomic_store_explicit(&op->kch_seen, 0, memory_order_relaxed);
  op->issued_written = 0;
  op->stale = 0;
  op->nflows_done = 0;
  op->quiet_children = -1;
  atomic_store(op_state(op), LIVE);
  *h = op;
}

static void start_flow(void **h, const myc_descr_t *d) {
  myc_op_t *op = NULL;
  if (d->pid != g.pid) { /* PXN: another process's op; its parent and context are never dereferenced */
    if (atomic_load(&g.ndevs)) atomic_fetch_add_explicit(&g.devs[0].pxn_flows, 1, memory_order_relaxed);
  } else {
    op = as_op(d->parent);
    if (!op || !hold(op)) {
      /* the op was not tracked (pool full), or retired: its flows are lost too */
      myc_dev_t *dev = op ? op->comm->dev : (atomic_load(&g.ndevs) ? &g.devs[0] : NULL);
      if (dev) atomic_fetch_add_explicit(&dev->drop_flows, 1, memory_order_relaxed);
      return;
    }
  }
  int k = take_slot(g.flow_state, g.nflows, &g.flow_hint);
  if (k < 0) {
    if (op) {
      atomic_fetch_add_explicit(&op->comm->dev->drop_flows, 1, memory_order_relaxed);
      atomic_fetch_sub(&op->refs, 1);
    }
    return;
  }
  myc_flow_t *f = &g.flows[k];
  f->op = op;
  f->channel = d->channel;
  f->dir = d->is_send ? 0 : 1;
  f->peer = d->peer;
  f->total = d->nsteps;
  atomic_store_explicit(&f->posted, 0, memory_order_relaxed);
  atomic_store_explicit(&f->ready, 0, memory_order_relaxed);
  atomic_store_explicit(&f->received, 0, memory_order_relaxed);
  atomic_store_explicit(&f->trans, 0, memory_order_relaxed);
  atomic_store_explicit(&f->done, 0, memory_order_relaxed);
  atomic_store_explicit(&f->stepped, 0, memory_order_relaxed);
  atomic_store_explicit(&f->bytes, 0, memory_order_relaxed);
  atomic_store_explicit(&f->first_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&f->last_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&f->wire_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&f->wait_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&f->head_ns, 0, memory_order_relaxed);
  for (int i = 0; i < 6; i++) f->last[i] = -1;
  f->idle_ticks = 0;
  if (op) atomic_fetch_add(&op->children, 1); /* the reference taken by hold() is the flow's */
  atomic_store_explicit(flow_state(f), LIVE, memory_order_release);
  *h = f;
}

static void start_kernel_ch(void **h, const myc_descr_t *d) {
  myc_op_t *op = as_op(d->parent);
  if (!op || !hold(op)) return;
  unsigned ch = (unsigned)d->channel % MYC_MAX_CH;
  if (atomic_fetch_or(&op->kch_live, 1ULL << ch) & (1ULL << ch)) {
    atomic_fetch_sub(&op->refs, 1);
    return;
  }
  atomic_fetch_or(&op->kch_seen, 1ULL << ch);
  atomic_fetch_add(&op->children, 1);
  set_min(&op->start_ns, now_ns());
  *h = &op->kch_tag[ch];
}

static ncclResult_t start_common(void *ctx, void **h, const myc_descr_t *d) {
  *h = NULL;
  myc_comm_t *c = ctx; /* dereferenced only for the events of this process's own communicators */
  if (!c) return ncclSuccess; /* a declined communicator */
  switch (d->type) {
    case MYC_EV_COLL:
      start_op(c, h, d, 0);
      break;
    case MYC_EV_P2P:
      start_op(c, h, d, 1);
      break;
    case MYC_EV_PROXY_OP:
      start_flow(h, d);
      break;
    case MYC_EV_PROXY_STEP: {
      myc_flow_t *f = as_flow(d->parent);
      if (!f) return ncclSuccess;
      myc_step_t *s = &g.steps[(size_t)(f - g.flows) * MYC_STEPS + (unsigned)d->step % MYC_STEPS];
      s->flow = f;
      s->ready_ns = 0;
      s->posted_ns = 0;
      atomic_store_explicit(&s->bits, 0, memory_order_relaxed);
      atomic_store_explicit(&f->stepped, 1, memory_order_relaxed);
      *h = s;
      break;
    }
    case MYC_EV_KERNEL_CH:
      start_kernel_ch(h, d);
      break;
    /* v5+: NCCL advances a graph-captured op's coll.seqNumber only while a Group or CollApi handle
     * is open (profiler.cc), and its API events come first: give them handles that stop ignores. */
    case MYC_EV_GROUP:
      *h = &g.group_tag[0];
      break;
    case MYC_EV_GROUP_API:
    case MYC_EV_P2P_API:
      *h = &g.group_tag[1];
      break;
    case MYC_EV_COLL_API:
      if (!d->captured) atomic_fetch_add(&c->api_colls, 1);
      *h = &c->api_tag[d->captured ? 1 : 0];
      break;
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

static void first_progress(myc_flow_t *f, int64_t t) {
  if (atomic_load_explicit(&f->first_ns, memory_order_relaxed) == 0)
    atomic_store_explicit(&f->first_ns, t ? t : now_ns(), memory_order_relaxed);
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
    case MYC_ST_SEND_PEER_WAIT: /* head step's data ready: send G (repeats while isend retries) */
      if (first_time(s, 2)) {
        int64_t t = now_ns();
        s->ready_ns = t;
        atomic_store_explicit(&f->head_ns, t, memory_order_relaxed);
        first_progress(f, t);
        bump(&f->ready);
      }
      break;
    case MYC_ST_RECV_FLUSH_WAIT: /* data arrived from the network */
      if (first_time(s, 2)) {
        first_progress(f, 0);
        bump(&f->received);
        atomic_fetch_add_explicit(&f->bytes, (int64_t)trans_size, memory_order_relaxed);
      }
      break;
    case MYC_ST_SEND_WAIT: /* isend returned a request: send T */
      if (first_time(s, 4)) {
        int64_t t = now_ns();
        s->posted_ns = t;
        if (s->ready_ns && t > s->ready_ns)
          atomic_fetch_add_explicit(&f->wait_ns, t - s->ready_ns, memory_order_relaxed);
        atomic_store_explicit(&f->head_ns, 0, memory_order_relaxed);
        first_progress(f, t);
        bump(&f->trans);
        atomic_fetch_add_explicit(&f->bytes, (int64_t)trans_size, memory_order_relaxed);
      }
      break;
    case MYC_ST_RECV_GPU_WAIT: /* handed to the GPU: recv T */
      if (first_time(s, 4)) {
        first_progress(f, 0);
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
    int live = LIVE;
    atomic_compare_exchange_strong(flow_state(f), &live, STOPPED);
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
    set_max(&kop->end_ns, now_ns());
    atomic_fetch_sub(&kop->refs, 1);
  }
  return ncclSuccess; /* Group and API handles: nothing to do */
}

/* ---- tick thread: the rings' only writer ---- */

static void write_comm(myc_dev_t *dev, uint64_t comm, int nranks, int rank, int nch, const char *name) {
  uint8_t b[64] = {0};
  int64_t t = now_ns();
  b[8] = MYC_KIND_COMM;
  myc_put_u64(b + 16, (uint64_t)t);
  myc_put_u64(b + 24, comm);
  myc_put_u32(b + 32, (uint32_t)nranks);
  myc_put_u32(b + 36, (uint32_t)rank);
  myc_put_u32(b + 40, (uint32_t)nch);
  myc_put_u32(b + 44, (uint32_t)dev->key);
  myc_ring_commit(&dev->ring, b);
  if (name && *name) {
    memset(b, 0, 64);
    b[8] = MYC_KIND_COMM_NAME;
    myc_put_u64(b + 16, (uint64_t)t);
    myc_put_u64(b + 24, comm);
    memcpy(b + 32, name, strnlen(name, 32));
    myc_ring_commit(&dev->ring, b);
  }
}

typedef struct {
  int v[6]; /* posted, ready, received, trans, done, send ready wait (µs) */
} myc_snap_t;

static myc_snap_t snapshot(myc_flow_t *f, int64_t t) {
  myc_snap_t n;
  n.v[0] = atomic_load_explicit(&f->posted, memory_order_acquire);
  n.v[1] = atomic_load_explicit(&f->ready, memory_order_acquire);
  n.v[2] = atomic_load_explicit(&f->received, memory_order_acquire);
  n.v[3] = atomic_load_explicit(&f->trans, memory_order_acquire);
  n.v[4] = atomic_load_explicit(&f->done, memory_order_acquire);
  /* counters are read one by one while the proxy moves: keep G >= T >= D in the record */
  if (n.v[3] < n.v[4]) n.v[3] = n.v[4];
  if (n.v[1] < n.v[3]) n.v[1] = n.v[3];
  n.v[5] = 0;
  if (f->dir == 0) {
    int64_t wait = atomic_load_explicit(&f->wait_ns, memory_order_relaxed);
    int64_t head = atomic_load_explicit(&f->head_ns, memory_order_relaxed);
    if (head && t > head) wait += t - head;
    int64_t us = wait / 1000;
    n.v[5] = us > INT32_MAX ? INT32_MAX : (int)us;
  }
  return n;
}

static myc_ring_t *ring_of(const myc_op_t *op) { return &op->comm->dev->ring; }

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
  myc_ring_t *ring = ring_of(f->op);
  flow_head(b, MYC_KIND_FLOW_PROGRESS, f, t);
  myc_put_u16(b + 40, (uint16_t)f->channel);
  b[42] = (uint8_t)f->dir;
  myc_put_u32(b + 44, (uint32_t)f->peer);
  myc_put_u32(b + 48, (uint32_t)(f->total > n->v[1] ? f->total : n->v[1]));
  myc_put_u32(b + 52, (uint32_t)n->v[1]);
  myc_put_u32(b + 56, (uint32_t)n->v[3]);
  myc_put_u32(b + 60, (uint32_t)n->v[4]);
  myc_ring_commit(ring, b);
  flow_head(b, MYC_KIND_FLOW_STEPS, f, t);
  myc_put_u16(b + 40, (uint16_t)f->channel);
  b[42] = (uint8_t)f->dir;
  myc_put_u32(b + 44, (uint32_t)f->peer);
  myc_put_u32(b + 48, (uint32_t)n->v[0]);
  myc_put_u32(b + 52, (uint32_t)(f->dir == 0 ? n->v[5] : n->v[2])); /* send: ready_wait_us */
  myc_put_u64(b + 56, (uint64_t)atomic_load_explicit(&f->bytes, memory_order_relaxed));
  myc_ring_commit(ring, b);
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
  myc_ring_commit(ring_of(f->op), b);
}

static void announce_op(myc_op_t *op) {
  myc_comm_t *c = op->comm;
  if (op->p2p_peer < 0) {
    if (!atomic_exchange(&c->announced, 1)) write_comm(c->dev, c->hash, c->nranks, c->rank, op->nchannels, NULL);
  } else if (op->p2p_peer < c->nranks &&
             !atomic_exchange(&c->p2p_announced[op->p2p_dir * c->nranks + op->p2p_peer], 1)) {
    write_comm(c->dev, op->ring_comm, 2, op->p2p_dir == 0 ? 0 : 1, op->nchannels, NULL);
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
  myc_put_u32(b + 60, op->func_seq);
  myc_ring_commit(ring_of(op), b);
  op->issued_written = 1;
}

static void write_beat(myc_dev_t *d, int64_t t) {
  uint8_t b[64] = {0};
  b[8] = MYC_KIND_BEAT;
  myc_put_u64(b + 16, (uint64_t)t);
  myc_put_u64(b + 24, (uint64_t)-1);
  myc_put_u32(b + 32, atomic_load(&d->drop_comms));
  myc_put_u32(b + 36, atomic_load(&d->drop_ops));
  myc_put_u32(b + 40, atomic_load(&d->drop_flows));
  myc_put_u32(b + 44, atomic_load(&d->pxn_flows));
  myc_put_u32(b + 48, atomic_load(&d->unseen_ops));
  myc_put_u32(b + 52, atomic_load(&d->abandoned_ops));
  myc_put_u32(b + 56, atomic_load(&d->orphan_flows));
  myc_ring_commit(&d->ring, b);
}

/* The op's kernel ended on every channel it announced (KernelCh stopped everywhere). */
static int kernel_done(myc_op_t *op) {
  uint64_t seen = atomic_load(&op->kch_seen);
  if (!seen || atomic_load(&op->kch_live)) return 0;
  int want = op->nchannels < MYC_MAX_CH ? op->nchannels : MYC_MAX_CH;
  return __builtin_popcountll(seen) >= want;
}

/* Some kernel channel ran and none runs now (fewer than announced may ever start). */
static int kernel_quiet(myc_op_t *op) { return atomic_load(&op->kch_seen) && !atomic_load(&op->kch_live); }

static void release_flow(myc_flow_t *f) {
  atomic_store_explicit(flow_state(f), FREE, memory_order_release);
  atomic_fetch_sub(&f->op->refs, 1);
}

/* One flow at a tick: progress if it moved; FLOW_DONE once stopped; released without a record if
 * NCCL never steps or stops it (closing: its communicator is being finalized). */
static void tick_flow(myc_flow_t *f, int st, int64_t t, int closing) {
  myc_op_t *op = f->op;
  myc_snap_t n = snapshot(f, t);
  int changed = memcmp(n.v, f->last, sizeof(f->last)) != 0;
  if (changed || st == STOPPED) {
    if (!op->issued_written) announce_op(op);
    if (changed) write_progress(f, &n, t);
  }
  if (st == STOPPED) {
    int64_t last = atomic_load(&f->last_ns);
    write_flow_done(f, n.v[4], last ? last : t);
    int64_t first = atomic_load(&f->first_ns);
    if (first) set_min(&op->start_ns, first);
    set_max(&op->end_ns, last);
    op->nflows_done++;
    release_flow(f);
    return;
  }
  f->idle_ticks = changed ? 0 : f->idle_ticks + 1;
  myc_dev_t *dev = op->comm->dev;
  if (!atomic_load(&f->stepped) &&
      (kernel_done(op) || (kernel_quiet(op) && f->idle_ticks >= g.stale_ticks))) {
    /* CollNet, CUDA-memcpy P2P/SHM: NCCL started the ProxyOp and will never step or stop it */
    atomic_fetch_add(&dev->orphan_flows, 1);
    release_flow(f);
  } else if (closing || (kernel_quiet(op) && f->idle_ticks >= g.stale_ticks)) {
    op->stale = 1; /* moved once, then stopped for good after the kernel ended, or aborted */
    release_flow(f);
  }
}

/* Retire a finished op (OP_DONE, or nothing if a flow of it was released unfinished). */
static void retire_op(myc_op_t *op, int64_t t) {
  if (op->stale) {
    atomic_fetch_add(&op->comm->dev->abandoned_ops, 1);
  } else {
    if (!op->issued_written) announce_op(op);
    uint8_t b[64] = {0};
    int64_t end = atomic_load(&op->end_ns);
    b[8] = MYC_KIND_OP_DONE;
    myc_put_u64(b + 16, (uint64_t)(end ? end : t));
    myc_put_u64(b + 24, op->ring_comm);
    myc_put_u64(b + 32, (uint64_t)op->seq);
    myc_put_u64(b + 40, (uint64_t)atomic_load(&op->start_ns));
    myc_put_u32(b + 48, (uint32_t)op->nflows_done);
    myc_ring_commit(ring_of(op), b);
  }
  atomic_store(op_state(op), FREE);
}

/* One op at a tick. An op is done once NCCL enqueued it (Coll stop), every flow of it retired, and
 * its kernel ended on every channel; without KernelCh, after one more tick with no new child (NCCL
 * starts an op's ProxyOps per channel as its proxy reaches them). */
static void tick_op(myc_op_t *op, int64_t t, int force, int closing) {
  int children = atomic_load(&op->children);
  int idle = atomic_load(&op->enqueued) && children > 0 && atomic_load(&op->refs) == 0;
  if (!idle && !closing) {
    op->quiet_children = -1;
    return;
  }
  if (idle && !force && !kernel_done(op) && op->quiet_children != children) {
    op->quiet_children = children;
    return;
  }
  int live = LIVE;
  if (!atomic_compare_exchange_strong(op_state(op), &live, RETIRING)) return;
  if (!closing && atomic_load(&op->refs) != 0) { /* a child started meanwhile */
    atomic_store(op_state(op), LIVE);
    return;
  }
  if (!idle) op->stale = 1; /* closing mid-op: ncclCommAbort, or a destroy before completion */
  retire_op(op, t);
}

/* Collectives the API announced two ticks ago that still have no Coll event. */
static void count_unseen(myc_comm_t *c) {
  uint64_t then = c->api_hist[1], seen = atomic_load(&c->api_seen);
  c->api_hist[1] = c->api_hist[0];
  c->api_hist[0] = atomic_load(&c->api_colls);
  if (then > seen + c->unseen) {
    atomic_fetch_add(&c->dev->unseen_ops, (uint32_t)(then - seen - c->unseen));
    c->unseen = then - seen;
  }
}

/* A pass over the pools. `only`: the communicator being finalized (its ops are forced out,
 * nothing else is touched); NULL: every communicator, `force` retiring finished ops at once. */
static void tick(int force, myc_comm_t *only) {
  int64_t t = now_ns();
  int closing = only != NULL;
  for (int i = 0; i < g.nops; i++) {
    if (atomic_load_explicit(&g.op_state[i], memory_order_acquire) != LIVE) continue;
    myc_op_t *op = &g.ops[i];
    if ((!only || op->comm == only) && !op->issued_written) announce_op(op);
  }
  for (int i = 0; i < g.nflows; i++) {
    int st = atomic_load_explicit(&g.flow_state[i], memory_order_acquire);
    if (st != LIVE && st != STOPPED) continue;
    myc_flow_t *f = &g.flows[i];
    if (!f->op) { /* PXN: counted in the BEAT, not attributable to a local op */
      if (st == STOPPED && !only) atomic_store_explicit(&g.flow_state[i], FREE, memory_order_release);
      continue;
    }
    if (!only || f->op->comm == only) tick_flow(f, st, t, closing);
  }
  for (int i = 0; i < g.nops; i++) {
    if (atomic_load_explicit(&g.op_state[i], memory_order_acquire) != LIVE) continue;
    myc_op_t *op = &g.ops[i];
    if (!only || op->comm == only) tick_op(op, t, force || closing, closing);
  }
  if (only) return;
  for (int i = 0; i < g.ncomms; i++)
    if (atomic_load_explicit(&g.comms[i].state, memory_order_acquire) == LIVE) count_unseen(&g.comms[i]);
  /* A BEAT every tick on every ring, as the torch tracer beats: the agent's rc seen_ns is a
   * rank's liveness, and the worker counts a rank silent after 1 s. */
  int n = atomic_load(&g.ndevs);
  for (int i = 0; i < n; i++)
    if (atomic_load_explicit(&g.devs[i].ready, memory_order_acquire)) write_beat(&g.devs[i], t);
}

static void *tick_main(void *arg) {
  (void)arg;
  struct timespec ts = {.tv_sec = g.tick_ms / 1000, .tv_nsec = (long)(g.tick_ms % 1000) * 1000000L};
  while (!atomic_load(&g.stop)) {
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&g.tick_lock);
    tick(0, NULL);
    pthread_mutex_unlock(&g.tick_lock);
  }
  return NULL;
}

/* Write everything pending now (the test harness with MYCROFT_NCCL_TICK_MS=0). */
__attribute__((visibility("default"))) void mycroftNcclFlush(void) {
  if (!g.ok) return;
  pthread_mutex_lock(&g.tick_lock);
  tick(1, NULL);
  pthread_mutex_unlock(&g.tick_lock);
}

/* One timed tick, as the tick thread runs it (the test harness's "tick" line). */
__attribute__((visibility("default"))) void mycroftNcclTick(void) {
  if (!g.ok) return;
  pthread_mutex_lock(&g.tick_lock);
  tick(0, NULL);
  pthread_mutex_unlock(&g.tick_lock);
}

/* NCCL finalizes each communicator from commFree (ncclCommDestroy and ncclCommAbort); 2.27 also
 * for a declined one (NULL). Its ops are written out or released, and its slot is free again;
 * other communicators are not touched. */
static ncclResult_t finalize_common(void *ctx) {
  myc_comm_t *c = ctx;
  if (!c || !g.ok) return ncclSuccess;
  pthread_mutex_lock(&g.tick_lock);
  tick(1, c);
  write_beat(c->dev, now_ns()); /* the counters as they stand when the communicator goes */
  /* freed under the tick lock: a tick never reads a slot that a new init is resetting */
  atomic_store_explicit(&c->state, FREE, memory_order_release);
  pthread_mutex_unlock(&g.tick_lock);
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
  if (d.type == MYC_EV_COLL_API) d.captured = e->collApi.graphCaptured;
  return start_common(ctx, h, &d);
}
static ncclResult_t start_v6(void *ctx, void **h, ncclProfilerEventDescr_v6_t *e) {
  myc_descr_t d;
  FILL_COMMON(d, e);
  if (d.type == MYC_EV_COLL_API) d.captured = e->collApi.graphCaptured;
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
