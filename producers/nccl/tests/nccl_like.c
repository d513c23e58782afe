/* nccl_like: drives a profiler plugin the way NCCL 2.27-2.30 does.
 *
 *   nccl_like PLUGIN.so --release 2.27|2.28|2.29|2.30 [< scenario]
 *   nccl_like PLUGIN.so --release R --rate OPS_PER_S --seconds S [--p2p-peers N]
 *   --trace: every call into the plugin on stderr
 *
 * A transcription of NCCL's side of the profiler interface, with file:line references into
 * NVIDIA/nccl at v2.30.7-1 (other tags named where they differ; "2.30" means 2.30.3+):
 *   loader and event glue         src/plugin/profiler.cc
 *   API events, plans, launches   src/enqueue.cc, src/group.cc
 *   proxy thread                  src/proxy.cc
 *   network steps                 src/transport/net.cc (sendProxyProgress, recvProxyProgress)
 *   kernel channels               src/transport/profiler.cc
 *   communicator life             src/init.cc (initTransportsRank, commFree)
 * The GPU and the network are modelled: the GPU fills a posted send slot at once and consumes a
 * received step at once; isend/irecv accept unless the scenario makes them refuse.
 *
 * Threads as in NCCL: the application thread (scenario), one init thread per communicator of a
 * "comms" line (ncclCommInitAll: group.cc asyncJobLaunch), one proxy progress thread per
 * communicator (shared with share=), one CUDA host-callback thread for graph replays.
 * cuCtxGetDevice is exported (-rdynamic) and answers the calling thread's current device, set
 * as cudaSetDevice would be: on init threads (init.cc:1846) and proxy threads (proxy.cc:958).
 *
 * Faults the driver reports (exit status 3, "nccl_like: ERROR: ..." on stderr): the loader
 * refcount reaching 0 while a communicator holds a reference, a reference released twice,
 * a call through a NULL ncclProfiler (NCCL would crash), NCCL 2.27 disabling the profiler for
 * the whole process while communicators are alive.
 *
 * Scenario lines (NAME = communicator; key=value options after the positional words):
 *   comm NAME [nranks=8 rank=0 nnodes=2 dev=0 share=OTHER hash=0x..]   ncclCommInitRank / split
 *   comms NAME... [nranks=N]       concurrent inits, ranks 0.., devices 0.., one commHash
 *   allreduce|allgather|reducescatter|broadcast|reduce NAME [count=N dtype=ncclFloat32
 *       algo=RING proto=SIMPLE nch=2 steps=4 root=0 net=ring|none|collnet|memcpy
 *       stall=MS refuse=N hang=1 irecv_refuse=N hold=CH]
 *     net: ring = a send and a recv proxy op per channel (net.cc); none = no proxy op
 *       (NVLink/SHM: KernelCh only); collnet, memcpy = proxy ops NCCL never steps or stops
 *     isend refuses: for MS from its first try (stall), N tries (refuse), until "release" (hang)
 *     irecv_refuse: the first recv step's irecv returns NULL N times (the step restarts)
 *     hold: kernel channels >= CH start only at "release"
 *   send|recv NAME peer=P [count= dtype= nch=1 steps= net=...]
 *   alltoall NAME [peers=N count=]   one group of a send and a recv per peer
 *   group / end                       ncclGroupStart / ncclGroupEnd
 *   capture GRAPH / endcapture        ops in between are captured into a CUDA graph
 *   replay GRAPH [times=N]            graph launches: the plans run on the host-callback thread
 *   release NAME                      undo hold= and hang= of NAME's ops
 *   wait                              until proxy and callback threads have nothing left to do
 *   destroy NAME / abort NAME         ncclCommDestroy / ncclCommAbort (commFree)
 *   tick / flush / sleep MS / mark LABEL
 * Output: "init NAME rc=R mask=M ctx=0|1 refcount=N", "mark LABEL NS", "done errors=N". */

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
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

#define NCCL_STEPS 8    /* device.h:26 */
#define MAXCHANNELS 64  /* device.h:91 */
#define MAX_OPS_PER_PEER 2048 /* proxy.h:227: 2 * MAXCHANNELS * 2 * NCCL_MAX_DEV_WORK_P2P_PER_BATCH */
#define APPEND_BATCH_SIZE 16  /* proxy.cc:833 NCCL_PROXY_APPEND_BATCH_SIZE */
#define APPENDOP_FREQ 8       /* proxy.cc:926 NCCL_PROGRESS_APPENDOP_FREQ */
#define MAX_COMMS 4096
#define DIVUP(x, y) (((x) + (y) - 1) / (y))

static int rel; /* 27, 28, 29, 30 */
static _Atomic int nerrors;

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("nccl_like: ERROR: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  atomic_fetch_add(&nerrors, 1);
}

static int64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_us(long us) {
  struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000L};
  nanosleep(&ts, NULL);
}

/* ---- the current CUDA device of the calling thread ---- */

static _Thread_local int current_dev;

/* CUresult cuCtxGetDevice(CUdevice *): the device of the calling thread's context. */
__attribute__((visibility("default"))) int cuCtxGetDevice(int *dev) {
  *dev = current_dev;
  return 0; /* CUDA_SUCCESS */
}

/* ---- NCCL's vocabulary (collectives.cc:14-110) ---- */

enum { F_BROADCAST, F_REDUCE, F_ALLGATHER, F_REDUCESCATTER, F_ALLREDUCE, F_SEND, F_RECV, F_NUM };
static const char *const FUNC_NAMES[F_NUM] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                              "AllReduce", "Send",   "Recv"};
static const char *const FUNC_WORDS[F_NUM] = {"broadcast", "reduce", "allgather", "reducescatter",
                                              "allreduce", "send",   "recv"};

typedef struct {
  const char *name; /* ncclDatatypeToString; ncclUint8 has no case there (collectives.cc:66-92) */
  const char *word;
  int size;
} dtype_t;
static const dtype_t DTYPES[] = {
    {"ncclInt8", "ncclInt8", 1},           {"Unknown", "ncclUint8", 1},
    {"ncclInt32", "ncclInt32", 4},         {"ncclUint32", "ncclUint32", 4},
    {"ncclInt64", "ncclInt64", 8},         {"ncclUint64", "ncclUint64", 8},
    {"ncclFloat16", "ncclFloat16", 2},     {"ncclFloat32", "ncclFloat32", 4},
    {"ncclFloat64", "ncclFloat64", 8},     {"ncclBfloat16", "ncclBfloat16", 2},
    {"ncclFloat8e4m3", "ncclFloat8e4m3", 1}, {"ncclFloat8e5m2", "ncclFloat8e5m2", 1},
};
#define NDTYPES ((int)(sizeof(DTYPES) / sizeof(DTYPES[0])))
enum { DT_INT8 = 0, DT_FLOAT32 = 7 };

/* ---- the loader (profiler.cc:28-125) ---- */

static pthread_mutex_t profilerMutex = PTHREAD_MUTEX_INITIALIZER;
static int profilerPluginRefCount;
static void *profilerPluginLib;
static void *_Atomic ncclProfiler; /* ncclProfiler_v4/5/6_t of profilerVersion */
static int profilerVersion;
/* -1 failed, 0 ready, 1 loaded (:38-43); NCCL reads it before taking the mutex (:48) */
static _Atomic int profilerPluginStatus;
static pid_t ncclPid;
static _Atomic int ncclProfilerEventMask; /* :219, one for the process */
static const char *pluginPath;
static _Atomic int in_call; /* plugin calls in progress, for dlclose-while-called detection */
static void (*plugin_flush)(void);
static void (*plugin_tick)(void);
static int loads, unloads;
static int trace; /* --trace: every call into the plugin on stderr */

static const char *type_name(uint64_t type) {
  static const char *const names[] = {"Group",     "Coll",    "P2p",     "ProxyOp", "ProxyStep",
                                      "ProxyCtrl", "KernelCh", "NetPlugin", "GroupApi", "CollApi",
                                      "P2pApi",    "KernelLaunch"};
  for (int i = 0; i < 12; i++)
    if (type == (1ULL << i)) return names[i];
  return "?";
}

typedef struct comm comm_t;
static comm_t *comms[MAX_COMMS];
static int ncomms;
static pthread_mutex_t comms_lock = PTHREAD_MUTEX_INITIALIZER;

static int refs_held(const comm_t *except);

/* profiler.cc:46-111; symbol order per release: 2.27 v4..v1 (v2.27.7 :53-62), 2.28 v5..v1
 * (v2.28.9 :70-81), 2.29/2.30 v6..v1 (:73-88). A failed load is permanent (:48-50, :109). */
static void ncclProfilerPluginLoad(void) {
  if (profilerPluginStatus == -1) return;
  pthread_mutex_lock(&profilerMutex);
  if (profilerPluginStatus == 1) {
    ++profilerPluginRefCount;
    goto exit;
  }
  profilerPluginLib = dlopen(pluginPath, RTLD_NOW | RTLD_LOCAL); /* os/linux.cc:52 */
  if (!profilerPluginLib) {
    fprintf(stderr, "nccl_like: dlopen %s: %s\n", pluginPath, dlerror());
    goto fail;
  }
  {
    int first = rel >= 29 ? 6 : rel == 28 ? 5 : 4;
    void *t = NULL;
    int v;
    for (v = first; v >= 4 && !t; v--) {
      char sym[32];
      snprintf(sym, sizeof(sym), "ncclProfiler_v%d", v);
      t = dlsym(profilerPluginLib, sym);
      if (t) profilerVersion = v;
    }
    if (!t) goto fail; /* v3..v1 are not driven here */
    atomic_store(&ncclProfiler, t);
  }
  if (!plugin_flush) {
    plugin_flush = (void (*)(void))dlsym(profilerPluginLib, "mycroftNcclFlush");
    plugin_tick = (void (*)(void))dlsym(profilerPluginLib, "mycroftNcclTick");
  }
  ++profilerPluginRefCount;
  profilerPluginStatus = 1;
  ncclPid = getpid(); /* :102 */
  loads++;
exit:
  pthread_mutex_unlock(&profilerMutex);
  return;
fail:
  if (profilerPluginLib) dlclose(profilerPluginLib);
  profilerPluginLib = NULL;
  profilerPluginStatus = -1;
  goto exit;
}

/* profiler.cc:113-125 (2.27: v2.27.7 :86-97 reads ncclProfiler->name unguarded). */
static void ncclProfilerPluginUnload(comm_t *c);

/* ---- calls into the plugin: each re-reads ncclProfiler, as NCCL's code does ---- */

static void *table(int line) {
  void *t = atomic_load(&ncclProfiler);
  if (!t) fail("call through a NULL ncclProfiler (profiler.cc:%d): the plugin was unloaded in between", line);
  return t;
}
#define LOADED() (atomic_load(&ncclProfiler) != NULL)

static void P_start(void *ctx, void **h, ncclProfilerEventDescr_v6_t *d, int line) {
  void *t = table(line);
  *h = NULL;
  if (!t) return;
  atomic_fetch_add(&in_call, 1);
  if (profilerVersion == 6) {
    ((ncclProfiler_v6_t *)t)->startEvent(ctx, h, d);
  } else if (profilerVersion == 5) {
    ((ncclProfiler_v5_t *)t)->startEvent(ctx, h, (ncclProfilerEventDescr_v5_t *)(void *)d);
  } else { /* the v4 layout: u8 type, the same union offsets without parentGroup */
    ncclProfilerEventDescr_v4_t d4;
    memset(&d4, 0, sizeof(d4));
    d4.type = (uint8_t)d->type;
    d4.parentObj = d->parentObj;
    d4.rank = d->rank;
    memcpy(&d4.coll, &d->coll, sizeof(d4) - offsetof(ncclProfilerEventDescr_v4_t, coll));
    ((ncclProfiler_v4_t *)t)->startEvent(ctx, h, &d4);
  }
  atomic_fetch_sub(&in_call, 1);
  if (trace) fprintf(stderr, "start %s ctx=%p parent=%p -> %p\n", type_name(d->type), ctx, d->parentObj, *h);
}

static void P_stop(void *h, int line) {
  void *t = table(line);
  if (!t) return;
  if (trace) fprintf(stderr, "stop %p\n", h);
  atomic_fetch_add(&in_call, 1);
  if (profilerVersion == 6) ((ncclProfiler_v6_t *)t)->stopEvent(h);
  else if (profilerVersion == 5) ((ncclProfiler_v5_t *)t)->stopEvent(h);
  else ((ncclProfiler_v4_t *)t)->stopEvent(h);
  atomic_fetch_sub(&in_call, 1);
}

/* args NULL as NCCL passes for GroupApi states (:320). */
static void P_record(void *h, int state, ncclProfilerEventStateArgs_v5_t *a, int line) {
  void *t = table(line);
  if (!t) return;
  if (trace) fprintf(stderr, "record %p state=%d transSize=%zu\n", h, state, a ? a->proxyStep.transSize : 0);
  atomic_fetch_add(&in_call, 1);
  if (profilerVersion == 6) ((ncclProfiler_v6_t *)t)->recordEventState(h, state, a);
  else if (profilerVersion == 5) ((ncclProfiler_v5_t *)t)->recordEventState(h, state, a);
  else ((ncclProfiler_v4_t *)t)->recordEventState(h, state, (ncclProfilerEventStateArgs_v4_t *)(void *)a);
  atomic_fetch_sub(&in_call, 1);
}

/* ---- NCCL objects ---- */

enum { NET_RING, NET_NONE, NET_COLLNET, NET_MEMCPY };
static const char *const NET_WORDS[] = {"ring", "none", "collnet", "memcpy"};

typedef struct proxy proxy_t;

struct comm {
  char name[32];
  uint64_t hash;
  int nranks, rank, nnodes, dev;
  void *profilerContext;
  int holds_ref; /* this communicator's reference on the loader */
  int alive;
  _Atomic uint64_t seqNumber[F_NUM]; /* comm.h:759 */
  proxy_t *proxy;
  _Atomic int inflight; /* posted proxy ops not yet removed from the proxy's active list */
  struct task *tasks;   /* planner queue of the group in progress */
  int ntasks, cap;
  int in_group;
  struct launch *_Atomic held; /* launches waiting for "release" (hold=, hang=) */
  int rc;
};

typedef struct task {
  int is_p2p, func, dtype, nch, net, root, hold, hang;
  size_t count;
  long stall_ms, refuse, irecv_refuse;
  int steps;
  const char *algo, *proto;
  int eActivationMask;
  void *groupApiEventHandle, *apiEventHandle; /* CollApi or P2pApi */
  void *eventHandle;
} task_t;

typedef struct plan {
  comm_t *comm;
  task_t *tasks;
  int ntasks;
  int persistent;
  void *groupEventHandle;
  struct plan *next;
} plan_t;

/* A kernel launch of one task: GPU-side completion per channel (the KernelCh model). */
typedef struct launch {
  _Atomic int refs;
  _Atomic int hold_from; /* kernel channels from this one wait for "release" */
  _Atomic int hang;      /* isend refuses until "release" */
  _Atomic int left[MAXCHANNELS]; /* proxy subs of the channel whose GPU side is not finished */
  struct launch *next_held;
} launch_t;

enum { K_SEND, K_RECV, K_PROFILER, K_SILENT };

/* ncclProxyOp + ncclProxySubArgs + ncclProxyArgs with one sub (proxy.cc:366-436). */
typedef struct args {
  int kind;
  comm_t *comm;
  launch_t *launch;
  int channelId, peer, nsteps, sliceSteps, chunkSize, rank, state, idle, stuck;
  pid_t pid;
  int eActivationMask;
  void *taskEventHandle, *profilerContext;
  uint64_t opCount;
  /* sub state */
  int posted, transmitted, received, done, gpu_done;
  size_t transSize;
  void *opEventHandle, *kernelEventHandle;
  void *stepEventHandle[NCCL_STEPS];
  /* network model */
  long refuse, irecv_refuse;
  int64_t refuse_until_ns;
  long silent_passes;
  struct args *next;
} args_t;

struct proxy {
  int dev, refs;
  pthread_t thread;
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  args_t *posted_head, *posted_tail; /* ops posted, not yet appended */
  int nposted;
  args_t *active;
  _Atomic int nactive, nstuck;
  _Atomic long passes; /* progress loops run, so that a wait sees fresh stuck counts */
  _Atomic int stop, abort;
};

static void launch_put(launch_t *l) {
  if (atomic_fetch_sub(&l->refs, 1) == 1) free(l);
}

/* ---- API events (profiler.cc:275-386, thread-local ncclProfilerApiState :34) ---- */

static _Thread_local int ncclGroupDepth;
static _Thread_local struct {
  int eActivationMask, profilerGroupDepth, state;
  void *groupApiEventHandle, *collApiEventHandle, *p2pApiEventHandle;
} apiState;
enum { API_RESET = 0, API_STARTED = 1, API_STOPPED = 2 };
static _Thread_local int capturing; /* 1 while the app thread captures a graph */

static void startGroupApi(comm_t *c, int graph) { /* :275-296 */
  apiState.eActivationMask = atomic_load(&ncclProfilerEventMask);
  int groupApiMask = MYC_EV_GROUP_API | MYC_EV_P2P_API | MYC_EV_COLL_API | MYC_EV_KERNEL_LAUNCH |
                     MYC_EV_GROUP | MYC_EV_COLL | MYC_EV_P2P | MYC_EV_PROXY_OP | MYC_EV_PROXY_STEP |
                     MYC_EV_KERNEL_CH | MYC_EV_NET_PLUGIN | MYC_EV_CE_COLL | MYC_EV_CE_SYNC | MYC_EV_CE_BATCH;
  if (LOADED() && (apiState.eActivationMask & groupApiMask) && apiState.profilerGroupDepth == 0) {
    ncclProfilerEventDescr_v6_t d;
    memset(&d, 0, sizeof(d));
    d.type = MYC_EV_GROUP_API;
    d.groupApi.graphCaptured = graph;
    d.groupApi.groupDepth = ncclGroupDepth;
    P_start(c->profilerContext, &apiState.groupApiEventHandle, &d, 290);
    apiState.profilerGroupDepth = ncclGroupDepth;
    apiState.state = API_STARTED;
  }
}

static void recordGroupApi(int st) { /* :307-323 */
  int should = 0;
  if (st == MYC_ST_GROUP_START_API_STOP && apiState.state == API_STARTED) {
    apiState.state = API_STOPPED;
    should = 1;
  } else if (st == MYC_ST_GROUP_END_API_START && apiState.state == API_STOPPED) {
    apiState.state = API_RESET;
    should = 1;
  }
  if (LOADED() && apiState.groupApiEventHandle && should) P_record(apiState.groupApiEventHandle, st, NULL, 320);
}

static void stopGroupApi(void) { /* :298-305, called at every ncclGroupEndInternal exit (group.cc:876) */
  if (LOADED() && apiState.groupApiEventHandle && apiState.profilerGroupDepth == 0) {
    P_stop(apiState.groupApiEventHandle, 301);
    apiState.groupApiEventHandle = NULL;
  }
}

static void startTaskApi(comm_t *c, task_t *t, int graph) { /* :325-379 */
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof(d));
  d.parentObj = apiState.groupApiEventHandle;
  int mask = MYC_EV_PROXY_OP | MYC_EV_PROXY_STEP | MYC_EV_KERNEL_CH | MYC_EV_NET_PLUGIN;
  void **h;
  if (t->is_p2p) {
    d.type = MYC_EV_P2P_API;
    d.p2pApi.func = FUNC_NAMES[t->func];
    d.p2pApi.count = t->count;
    d.p2pApi.datatype = DTYPES[t->dtype].name;
    d.p2pApi.graphCaptured = graph;
    mask |= MYC_EV_P2P_API | MYC_EV_P2P;
    h = &apiState.p2pApiEventHandle;
  } else {
    d.type = MYC_EV_COLL_API;
    d.collApi.func = FUNC_NAMES[t->func];
    d.collApi.count = t->count;
    d.collApi.datatype = DTYPES[t->dtype].name;
    d.collApi.root = t->root;
    d.collApi.graphCaptured = graph;
    mask |= MYC_EV_COLL_API | MYC_EV_COLL | MYC_EV_CE_COLL | MYC_EV_CE_SYNC | MYC_EV_CE_BATCH;
    h = &apiState.collApiEventHandle;
  }
  if (LOADED() && (apiState.eActivationMask & mask)) P_start(c->profilerContext, h, &d, t->is_p2p ? 337 : 370);
}

/* ---- group, enqueue (enqueue.cc:2615-2752, group.cc:770-876) ---- */

static void launch_group(void);
static void add_task(comm_t *c, const task_t *t);

static void ncclGroupStart(void) { ncclGroupDepth++; }

static void ncclGroupEnd(void) {
  if (apiState.profilerGroupDepth > 0) apiState.profilerGroupDepth--; /* group.cc:781-786 */
  if (apiState.profilerGroupDepth == 0) recordGroupApi(MYC_ST_GROUP_END_API_START);
  if (--ncclGroupDepth == 0) launch_group();
  stopGroupApi(); /* group.cc:874-876 */
}

/* ncclEnqueueCheck: an implicit group around one task (enqueue.cc collTaskAppend/p2pTaskAppend). */
static void enqueue(comm_t *c, task_t *t) {
  ncclGroupStart();
  if (rel >= 28) { /* 2.27 has no API events */
    startGroupApi(c, capturing);
    recordGroupApi(MYC_ST_GROUP_START_API_STOP);
    startTaskApi(c, t, capturing);
    t->eActivationMask = apiState.eActivationMask; /* enqueue.cc:2643, 2743 */
    t->groupApiEventHandle = apiState.groupApiEventHandle;
    t->apiEventHandle = t->is_p2p ? apiState.p2pApiEventHandle : apiState.collApiEventHandle;
  } else {
    t->eActivationMask = atomic_load(&ncclProfilerEventMask); /* v2.27.7 enqueue.cc:2292, 2370 */
  }
  /* Broadcast becomes an AllGatherV task from 2.29 (NCCL_ALLGATHERV_ENABLE=1, enqueue.cc:2703-2723):
   * no Coll event, its proxy ops carry mask 0 (:1376-1378) and no task handle (:1386-1388). */
  if (rel >= 29 && !t->is_p2p && t->func == F_BROADCAST) t->eActivationMask = -1;
  add_task(c, t);
  if (rel >= 28) {
    if (t->is_p2p) { /* :349-354 */
      if (LOADED() && apiState.p2pApiEventHandle) {
        P_stop(apiState.p2pApiEventHandle, 350);
        apiState.p2pApiEventHandle = NULL;
      }
    } else if (LOADED() && apiState.collApiEventHandle) { /* :381-386: the handle is kept */
      P_stop(apiState.collApiEventHandle, 383);
    }
  }
  ncclGroupEnd();
}

static void add_task(comm_t *c, const task_t *t) {
  if (c->ntasks == c->cap) {
    c->cap = c->cap ? 2 * c->cap : 8;
    c->tasks = realloc(c->tasks, (size_t)c->cap * sizeof(task_t));
  }
  c->tasks[c->ntasks++] = *t;
  c->in_group = 1;
}

/* ---- plans and launches (enqueue.cc:1392-1450, 1700-1720, 1853-1860) ---- */

typedef struct graph {
  char name[32];
  plan_t *plans;
  struct graph *next;
} graph_t;
static graph_t *graphs, *capture_graph;

/* profiler.cc:432-465 */
static void startGroupEvent(plan_t *p) {
  if (!LOADED()) return;
  int mask = 0;
  for (int i = 0; i < p->ntasks && !mask; i++) mask = p->tasks[i].eActivationMask > 0 ? p->tasks[i].eActivationMask : 0;
  if (mask & (MYC_EV_GROUP | MYC_EV_COLL | MYC_EV_P2P | MYC_EV_PROXY_OP | MYC_EV_PROXY_STEP | MYC_EV_KERNEL_CH |
              MYC_EV_NET_PLUGIN)) {
    ncclProfilerEventDescr_v6_t d;
    memset(&d, 0, sizeof(d));
    d.type = MYC_EV_GROUP;
    P_start(p->comm->profilerContext, &p->groupEventHandle, &d, 460);
  }
}

/* profiler.cc:476-542 (2.27: Coll/P2p only under a Group handle, v2.27.7 :240, :274). */
static void startTaskEvents(plan_t *p) {
  comm_t *c = p->comm;
  for (int i = 0; i < p->ntasks; i++) {
    task_t *t = &p->tasks[i];
    t->eventHandle = NULL;
    if (t->is_p2p || t->eActivationMask < 0) continue;
    int enable = t->eActivationMask & (MYC_EV_COLL | MYC_EV_PROXY_OP | MYC_EV_PROXY_STEP | MYC_EV_KERNEL_CH |
                                       MYC_EV_NET_PLUGIN);
    if (LOADED() && enable && (rel >= 28 || p->groupEventHandle)) {
      ncclProfilerEventDescr_v6_t d;
      memset(&d, 0, sizeof(d));
      d.type = MYC_EV_COLL;
      d.coll.parentGroup = p->groupEventHandle;                            /* :486 */
      d.parentObj = rel >= 28 ? t->apiEventHandle : p->groupEventHandle;  /* :487; v2.27.7 :245 */
      d.rank = c->rank;
      d.coll.seqNumber = atomic_load(&c->seqNumber[t->func]);             /* :489 */
      d.coll.func = FUNC_NAMES[t->func];
      d.coll.count = t->count;
      d.coll.root = t->root;
      d.coll.datatype = DTYPES[t->dtype].name;
      d.coll.nChannels = (uint8_t)t->nch;
      d.coll.nWarps = 16;
      d.coll.algo = t->algo;
      d.coll.proto = t->proto;
      P_start(c->profilerContext, &t->eventHandle, &d, 500);
    }
    /* :511-515 (v2.27.7 :268: the Group handle only) */
    int api = rel >= 28 && t->apiEventHandle;
    if (!p->persistent || (LOADED() && (p->groupEventHandle || api) && (t->eActivationMask & MYC_EV_KERNEL_CH)))
      atomic_fetch_add(&c->seqNumber[t->func], 1);
  }
  if (!LOADED()) return;
  for (int i = 0; i < p->ntasks; i++) { /* :518-539 */
    task_t *t = &p->tasks[i];
    if (!t->is_p2p) continue;
    int enable = t->eActivationMask & (MYC_EV_P2P | MYC_EV_PROXY_OP | MYC_EV_PROXY_STEP | MYC_EV_KERNEL_CH |
                                       MYC_EV_NET_PLUGIN);
    if (enable && (rel >= 28 || p->groupEventHandle)) {
      ncclProfilerEventDescr_v6_t d;
      memset(&d, 0, sizeof(d));
      d.type = MYC_EV_P2P;
      d.p2p.parentGroup = p->groupEventHandle;
      d.parentObj = rel >= 28 ? t->apiEventHandle : p->groupEventHandle;
      d.rank = c->rank;
      d.p2p.func = FUNC_NAMES[t->func];
      d.p2p.count = t->count;
      d.p2p.datatype = DTYPES[t->dtype].name;
      d.p2p.peer = t->root;
      d.p2p.nChannels = (uint8_t)t->nch;
      P_start(c->profilerContext, &t->eventHandle, &d, 535);
    }
  }
}

static void stopTaskEvents(plan_t *p) { /* :544-560 (v2.27.7 :302: under a Group handle) */
  if (!LOADED() || (rel < 28 && !p->groupEventHandle)) return;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < p->ntasks; i++)
      if (p->tasks[i].is_p2p == pass && p->tasks[i].eventHandle) P_stop(p->tasks[i].eventHandle, pass ? 554 : 549);
}

static void post(proxy_t *x, args_t *a) { /* ncclLocalOpAppend (proxy.cc:489-530): waits for a free op */
  pthread_mutex_lock(&x->mutex);
  while (x->nposted >= MAX_OPS_PER_PEER && !x->abort) {
    pthread_mutex_unlock(&x->mutex);
    sched_yield();
    pthread_mutex_lock(&x->mutex);
  }
  a->next = NULL;
  if (x->posted_tail) x->posted_tail->next = a;
  else x->posted_head = a;
  x->posted_tail = a;
  x->nposted++;
  pthread_cond_signal(&x->cond); /* ncclProxyStart -> ncclProxyPost */
  pthread_mutex_unlock(&x->mutex);
}

static args_t *new_args(plan_t *p, task_t *t, launch_t *l, int kind, int ch, int peer, uint64_t opCount) {
  comm_t *c = p->comm;
  args_t *a = calloc(1, sizeof(args_t));
  a->kind = kind;
  a->comm = c;
  a->launch = l;
  atomic_fetch_add(&l->refs, 1);
  a->channelId = ch;
  a->peer = peer;
  a->sliceSteps = t->is_p2p ? 1 : 2; /* ring AllReduce: ALLREDUCE_SLICESTEPS = NCCL_STEPS/4 */
  a->nsteps = t->steps * a->sliceSteps;
  a->chunkSize = 1 << 17;
  a->rank = c->rank;
  a->opCount = opCount;
  /* uploadProxyOps (enqueue.cc:1402-1405) */
  a->profilerContext = c->profilerContext;
  a->eActivationMask = t->eActivationMask < 0 ? 0 : t->eActivationMask;
  a->taskEventHandle = t->eActivationMask < 0 ? NULL : t->eventHandle;
  a->pid = ncclPid;
  a->refuse = t->refuse;
  a->irecv_refuse = t->irecv_refuse;
  a->refuse_until_ns = t->stall_ms > 0 ? -t->stall_ms : 0; /* armed at the first isend */
  a->silent_passes = 3;
  atomic_fetch_add(&c->inflight, 1);
  return a;
}

/* The proxy ops of one task (enqueue.cc:643-653 collectives, 1102-1111 p2p): per channel its
 * network ops, then a profiler op for KernelCh when asked for (ncclProfilerNeedsProxy,
 * profiler.cc:772-776). */
static void uploadProxyOps(plan_t *p, _Atomic uint64_t *opCount) {
  comm_t *c = p->comm;
  for (int i = 0; i < p->ntasks; i++) {
    task_t *t = &p->tasks[i];
    launch_t *l = calloc(1, sizeof(launch_t));
    atomic_store(&l->refs, 1);
    atomic_store(&l->hold_from, t->hold > 0 ? t->hold : MAXCHANNELS);
    atomic_store(&l->hang, t->hang);
    uint64_t oc = atomic_fetch_add(opCount, 1) + 1;
    args_t *list[2 * MAXCHANNELS + MAXCHANNELS];
    int n = 0;
    for (int ch = 0; ch < t->nch; ch++) {
      int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
      if (t->net == NET_RING && !t->is_p2p) {
        list[n++] = new_args(p, t, l, K_SEND, ch, next, oc);
        list[n++] = new_args(p, t, l, K_RECV, ch, prev, oc);
      } else if (t->net == NET_RING) {
        list[n++] = new_args(p, t, l, t->func == F_SEND ? K_SEND : K_RECV, ch, t->root, oc);
      } else if (t->net == NET_COLLNET) { /* coll_net.cc: progress without profiler calls */
        list[n++] = new_args(p, t, l, K_SILENT, ch, next, oc);
        list[n++] = new_args(p, t, l, K_SILENT, ch, prev, oc);
      } else if (t->net == NET_MEMCPY) { /* p2p.cc:1476-1479 p2pSendProxyProgress */
        list[n++] = new_args(p, t, l, K_SILENT, ch, t->is_p2p ? t->root : next, oc);
      }
      for (int k = 0; k < n; k++)
        if (list[k]->channelId == ch && list[k]->kind != K_PROFILER) atomic_fetch_add(&l->left[ch], 1);
      if (t->eActivationMask > 0 && (t->eActivationMask & MYC_EV_KERNEL_CH) && LOADED())
        list[n++] = new_args(p, t, l, K_PROFILER, ch, c->rank, oc);
    }
    if (t->hold > 0 || t->hang) {
      l->next_held = atomic_load(&c->held);
      atomic_fetch_add(&l->refs, 1);
      atomic_store(&c->held, l);
    }
    for (int k = 0; k < n; k++) post(c->proxy, list[k]);
    launch_put(l);
  }
}

/* enqueue.cc:1436-1450 */
static _Atomic uint64_t opCounter;
static void hostStreamPlanTask(plan_t *p) {
  startGroupEvent(p);
  startTaskEvents(p);
  uploadProxyOps(p, &opCounter);
  stopTaskEvents(p);
  if (LOADED() && p->groupEventHandle) P_stop(p->groupEventHandle, 470); /* :467-474 */
  p->groupEventHandle = NULL;
}

/* The CUDA host-callback thread of graph launches (cudaLaunchHostFunc, enqueue.cc:1717). */
static struct {
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  plan_t **queue;
  int head, tail, cap, busy, started;
  pthread_t thread;
} cb = {.mutex = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void *callback_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&cb.mutex);
  for (;;) {
    while (cb.head == cb.tail) pthread_cond_wait(&cb.cond, &cb.mutex);
    plan_t *p = cb.queue[cb.head++ % cb.cap];
    cb.busy = 1;
    pthread_mutex_unlock(&cb.mutex);
    hostStreamPlanTask(p); /* hostStreamPlanCallback, enqueue.cc:1452-1459 */
    pthread_mutex_lock(&cb.mutex);
    cb.busy = 0;
  }
  return NULL;
}

static void callback_enqueue(plan_t *p) {
  pthread_mutex_lock(&cb.mutex);
  if (!cb.started) {
    cb.cap = 1 << 16;
    cb.queue = calloc((size_t)cb.cap, sizeof(plan_t *));
    pthread_create(&cb.thread, NULL, callback_main, NULL);
    cb.started = 1;
  }
  while (cb.tail - cb.head >= cb.cap) {
    pthread_mutex_unlock(&cb.mutex);
    sleep_us(100);
    pthread_mutex_lock(&cb.mutex);
  }
  cb.queue[cb.tail++ % cb.cap] = p;
  pthread_cond_signal(&cb.cond);
  pthread_mutex_unlock(&cb.mutex);
}

/* group.cc groupLaunch/doLaunches (:323-373): one plan per communicator of the group; its
 * proxy ops and task events are pushed right after the launch (ncclLaunchKernelAfter_NoCuda),
 * or captured into the graph (persistent plan, host callback at each replay). */
static void launch_group(void) {
  pthread_mutex_lock(&comms_lock);
  int n = ncomms;
  pthread_mutex_unlock(&comms_lock);
  for (int i = 0; i < n; i++) {
    comm_t *c = comms[i];
    if (!c || !c->in_group) continue;
    plan_t *p = calloc(1, sizeof(plan_t));
    p->comm = c;
    p->tasks = c->tasks;
    p->ntasks = c->ntasks;
    c->tasks = NULL;
    c->ntasks = c->cap = 0;
    c->in_group = 0;
    int saved = current_dev;
    current_dev = c->dev; /* cudaSetDevice(comm->cudaDev), group.cc:355 */
    if (capture_graph) {
      p->persistent = 1;
      p->next = capture_graph->plans;
      capture_graph->plans = p;
    } else {
      hostStreamPlanTask(p);
      free(p->tasks);
      free(p);
    }
    current_dev = saved;
  }
}

/* ---- the proxy thread (proxy.cc:801-1010) and progress functions ---- */

static void startProxyOp(args_t *a) { /* profiler.cc:567-587 via proxy.cc:434 */
  a->opEventHandle = NULL;
  if (!LOADED() || !(a->eActivationMask & (MYC_EV_PROXY_OP | MYC_EV_PROXY_STEP | MYC_EV_NET_PLUGIN))) return;
  ncclProfilerEventDescr_v6_t d;
  memset(&d, 0, sizeof(d));
  d.type = MYC_EV_PROXY_OP;
  d.parentObj = a->taskEventHandle;
  d.rank = a->rank;
  d.proxyOp.pid = a->pid;
  d.proxyOp.channelId = (uint8_t)a->channelId;
  d.proxyOp.peer = a->peer;
  d.proxyOp.nSteps = DIVUP(a->nsteps, a->sliceSteps);
  d.proxyOp.chunkSize = a->chunkSize * a->sliceSteps;
  d.proxyOp.isSend = a->kind == K_SEND; /* :581: the net transport's send progress only */
  P_start(a->profilerContext, &a->opEventHandle, &d, 582);
}

static void stopProxyOp(args_t *a) { /* :589-598 */
  if (LOADED() && a->opEventHandle) {
    P_stop(a->opEventHandle, 593);
    a->opEventHandle = NULL;
  }
}

static void recordProxyOp(args_t *a, int st) { /* :707-716 */
  if (LOADED() && a->opEventHandle) {
    ncclProfilerEventStateArgs_v5_t x;
    memset(&x, 0, sizeof(x));
    P_record(a->opEventHandle, st, &x, 712);
  }
}

static void startStep(args_t *a, int stepId) { /* :600-636 (v2.27.7 :361, :380: only under a ProxyOp handle) */
  int step = DIVUP(stepId, a->sliceSteps);
  if (LOADED() && (a->eActivationMask & (MYC_EV_PROXY_STEP | MYC_EV_NET_PLUGIN)) &&
      (rel >= 28 || a->opEventHandle)) {
    ncclProfilerEventDescr_v6_t d;
    memset(&d, 0, sizeof(d));
    d.type = MYC_EV_PROXY_STEP;
    d.parentObj = a->opEventHandle;
    d.rank = a->rank;
    d.proxyStep.step = step;
    P_start(a->profilerContext, &a->stepEventHandle[step % NCCL_STEPS], &d, 611);
  }
}

static void recordStep(args_t *a, int stepId, int st) { /* :718-732: skipped under a NULL ProxyOp handle */
  int step = DIVUP(stepId, a->sliceSteps);
  if (LOADED() && a->opEventHandle && a->stepEventHandle[step % NCCL_STEPS]) {
    ncclProfilerEventStateArgs_v5_t x;
    memset(&x, 0, sizeof(x));
    x.proxyStep.transSize = a->transSize;
    P_record(a->stepEventHandle[step % NCCL_STEPS], st, &x, 727);
  }
}

static void stopStep(args_t *a, int stepId) { /* :638-650 */
  int step = DIVUP(stepId, a->sliceSteps);
  if (LOADED() && a->stepEventHandle[step % NCCL_STEPS]) {
    P_stop(a->stepEventHandle[step % NCCL_STEPS], 644);
    a->stepEventHandle[step % NCCL_STEPS] = NULL;
  }
}

static void gpu_finished(args_t *a) {
  if (!a->gpu_done) {
    a->gpu_done = 1;
    atomic_fetch_sub(&a->launch->left[a->channelId], 1);
  }
}

/* isend: NULL (retry later) while the scenario refuses (stall=MS from the first try, refuse=N
 * tries, hang=1 until released); a request otherwise. */
static int isend_accepts(args_t *a) {
  int64_t now = clock_ns(CLOCK_MONOTONIC);
  if (a->refuse_until_ns < 0) a->refuse_until_ns = now - a->refuse_until_ns * 1000000LL;
  if (atomic_load(&a->launch->hang) || now < a->refuse_until_ns) return 0;
  if (a->refuse > 0) {
    a->refuse--;
    return 0;
  }
  return 1;
}

/* net.cc:1304-1468 with one sub, the GPU filling each posted slot at once. */
static void sendProxyProgress(args_t *a) {
  if (a->state == 0) { /* ncclProxyOpReady */
    a->posted = a->transmitted = a->done = 0;
    recordProxyOp(a, MYC_ST_PROXY_OP_IN_PROGRESS); /* :1315 */
    a->state = 1;
  }
  a->idle = 1;
  a->stuck = 0;
  int maxDepth = NCCL_STEPS; /* :1323, min(NCCL_STEPS, NCCL_SHARED_STEPS / nsubs) */
  int postedStepId = a->posted, transmittedStepId = a->transmitted, doneStepId = a->done;
  if (a->done == a->nsteps) goto check;
  if (a->posted < a->nsteps && a->posted < a->done + maxDepth) { /* :1335-1355 */
    startStep(a, postedStepId);
    a->posted += a->sliceSteps;
    recordStep(a, postedStepId, MYC_ST_SEND_GPU_WAIT);
    if (a->posted == a->nsteps) gpu_finished(a); /* the GPU fills the last slot and moves on */
    a->idle = 0;
    goto check;
  }
  if (a->transmitted < a->posted && a->transmitted < a->done + NCCL_STEPS) { /* :1358-1430 */
    recordStep(a, transmittedStepId, MYC_ST_SEND_PEER_WAIT); /* :1407, repeated while isend refuses */
    if (isend_accepts(a)) {
      a->transSize = (size_t)a->chunkSize * (size_t)a->sliceSteps; /* :1422 */
      a->transmitted += a->sliceSteps;
      recordStep(a, transmittedStepId, MYC_ST_SEND_WAIT); /* :1424 */
      a->idle = 0;
      goto check;
    }
    a->stuck = atomic_load(&a->launch->hang);
  }
  if (a->done < a->transmitted) { /* :1432-1458: test() completes at once */
    a->done += a->sliceSteps;
    stopStep(a, doneStepId);
    a->idle = 0;
  }
check:
  if (a->done == a->nsteps) { /* :1460-1465 */
    stopProxyOp(a);
    a->state = 2; /* ncclProxyOpNone */
  }
}

/* net.cc:1470-1765 with one sub (groupSize 1), no GDR flush: the GPU consumes at once. */
static void recvProxyProgress(args_t *a) {
  if (a->state == 0) {
    a->posted = a->received = a->transmitted = a->done = 0;
    recordProxyOp(a, MYC_ST_PROXY_OP_IN_PROGRESS); /* :1511 */
    a->state = 1;
  }
  a->idle = 1;
  a->stuck = 0;
  int maxDepth = NCCL_STEPS;
  if (a->posted < a->nsteps && a->posted < a->done + maxDepth) { /* :1528-1607 */
    int postedStepId = a->posted;
    startStep(a, postedStepId); /* :1536: started again while irecv returns NULL */
    if (a->irecv_refuse > 0 && postedStepId == 0) {
      a->irecv_refuse--;
    } else {
      a->posted += a->sliceSteps;
      recordStep(a, postedStepId, MYC_ST_RECV_WAIT); /* :1603 */
      a->idle = 0;
    }
  }
  if (a->idle == 0) return; /* :1609 */
  if (a->posted > a->received) { /* :1613-1690: test() completes at once */
    int receivedStepId = a->received;
    a->transSize = (size_t)a->chunkSize * (size_t)a->sliceSteps; /* :1632 */
    a->received += a->sliceSteps;
    recordStep(a, receivedStepId, MYC_ST_RECV_FLUSH_WAIT); /* :1634 */
    a->idle = 0;
  }
  if (a->idle == 0) return; /* :1692 */
  if (a->received > a->transmitted) { /* :1696-1718: no flush request, done = 1 */
    int transmittedStepId = a->transmitted;
    a->transmitted += a->sliceSteps;
    recordStep(a, transmittedStepId, MYC_ST_RECV_GPU_WAIT); /* :1707 */
    if (a->transmitted == a->nsteps) gpu_finished(a);
    a->idle = 0;
  }
  if (a->idle == 0) return; /* :1720 */
  while (a->done < a->nsteps && a->transmitted > a->done) { /* :1722-1756: sendHead = consumed */
    int doneStepId = a->done;
    a->done += a->sliceSteps;
    stopStep(a, doneStepId); /* :1745 */
    a->idle = 0;
  }
  if (a->done == a->nsteps) { /* :1757-1762 */
    a->state = 2;
    stopProxyOp(a);
  }
}

/* src/transport/profiler.cc:23-55 and profiler.cc:679-705. */
static void profilerProxyProgress(args_t *a) {
  a->stuck = 0;
  if (a->state == 0) a->state = 1;
  if (!a->posted && a->channelId < atomic_load(&a->launch->hold_from)) { /* workStarted reached base */
    if (LOADED() && (a->eActivationMask & MYC_EV_KERNEL_CH)) {
      ncclProfilerEventDescr_v6_t d;
      memset(&d, 0, sizeof(d));
      d.type = MYC_EV_KERNEL_CH;
      d.parentObj = a->taskEventHandle;
      d.kernelCh.channelId = (uint8_t)a->channelId;
      d.kernelCh.pTimer = (uint64_t)clock_ns(CLOCK_MONOTONIC);
      P_start(a->profilerContext, &a->kernelEventHandle, &d, 688);
    }
    a->posted = 1;
    return; /* "continue; allow events on every channel to start" */
  }
  if (!a->posted) {
    a->stuck = 1;
    return;
  }
  if (atomic_load(&a->launch->left[a->channelId]) == 0) { /* workCompleted reached base */
    if (LOADED() && a->kernelEventHandle) {                 /* :694-705: two calls, one check */
      ncclProfilerEventStateArgs_v5_t x;
      memset(&x, 0, sizeof(x));
      x.kernelCh.pTimer = (uint64_t)clock_ns(CLOCK_MONOTONIC);
      P_record(a->kernelEventHandle, MYC_ST_KERNEL_CH_STOP, &x, 700);
      P_stop(a->kernelEventHandle, 701);
    }
    a->state = 2;
  }
}

/* CollNet (coll_net.cc) and CUDA-memcpy P2P (p2p.cc): progress with no profiler call. */
static void silentProgress(args_t *a) {
  a->state = 1;
  if (--a->silent_passes <= 0) {
    gpu_finished(a);
    a->state = 2;
  }
}

/* proxy.cc:835-923 ncclProxyGetPostedOps: up to APPEND_BATCH_SIZE opCount groups; ProxyAppend
 * -> ncclProxyOpToArgs -> ProxyOp start (proxy.cc:434, not for the profiler pattern). */
static int getPostedOps(proxy_t *x) {
  pthread_mutex_lock(&x->mutex);
  if (!x->active)
    while (!x->posted_head && !x->stop && !x->abort) pthread_cond_wait(&x->cond, &x->mutex);
  args_t *batch = x->posted_head, *last = NULL;
  int count = 0, added = 0;
  uint64_t lastOpCount = 0;
  for (args_t *a = batch; a; a = a->next) {
    if (lastOpCount && a->opCount != lastOpCount) count++; /* proxy.cc:874-875 */
    if (count == APPEND_BATCH_SIZE + 1) break;
    lastOpCount = a->opCount;
    last = a;
    added++;
  }
  if (last) {
    x->posted_head = last->next;
    if (!x->posted_head) x->posted_tail = NULL;
    last->next = NULL;
    x->nposted -= added;
  } else {
    batch = NULL;
  }
  pthread_mutex_unlock(&x->mutex);
  args_t *tail = x->active;
  while (tail && tail->next) tail = tail->next;
  for (args_t *a = batch, *next; a; a = next) {
    next = a->next;
    a->next = NULL;
    if (a->kind != K_PROFILER) startProxyOp(a);
    if (tail) tail->next = a;
    else x->active = a;
    tail = a;
    atomic_fetch_add(&x->nactive, 1);
  }
  return added;
}

static void remove_args(proxy_t *x, args_t **link) {
  args_t *a = *link;
  *link = a->next;
  atomic_fetch_sub(&a->comm->inflight, 1);
  launch_put(a->launch);
  free(a);
  atomic_fetch_sub(&x->nactive, 1);
}

static void *proxy_main(void *arg) {
  proxy_t *x = arg;
  current_dev = x->dev; /* proxy.cc:958 cudaSetDevice(proxyState->cudaDev) */
  int appendCounter = 0, quiet = 0;
  do {
    int idle = 1, stuck = 0;
    for (args_t **link = &x->active; *link;) { /* progressOps, proxy.cc:801-830 */
      args_t *a = *link;
      switch (a->kind) {
        case K_SEND: sendProxyProgress(a); break;
        case K_RECV: recvProxyProgress(a); break;
        case K_PROFILER: profilerProxyProgress(a); break; /* polls only: counts as idle */
        default: silentProgress(a); a->idle = 0; break;
      }
      if (a->kind != K_PROFILER) idle &= a->idle;
      stuck += a->stuck;
      if (a->state == 2) remove_args(x, link);
      else link = &a->next;
    }
    atomic_store(&x->nstuck, stuck);
    atomic_fetch_add(&x->passes, 1);
    if (idle || !x->active || ++appendCounter == APPENDOP_FREQ) { /* proxy.cc:991-1006 */
      appendCounter = 0;
      int added = getPostedOps(x);
      if (!added) {
        sched_yield();
        if (idle && ++quiet > 64) sleep_us(50); /* spare the test machine's cores */
      } else {
        quiet = 0;
      }
    }
  } while ((!x->stop || x->active || x->posted_head) && !x->abort); /* proxy.cc:1008-1009 */
  return NULL;
}

static proxy_t *proxy_create(int dev) { /* ncclProxyCreate */
  proxy_t *x = calloc(1, sizeof(proxy_t));
  x->dev = dev;
  x->refs = 1;
  pthread_mutex_init(&x->mutex, NULL);
  pthread_cond_init(&x->cond, NULL);
  pthread_create(&x->thread, NULL, proxy_main, x);
  return x;
}

static void proxy_release(proxy_t *x, int abort) {
  pthread_mutex_lock(&x->mutex);
  int last = --x->refs == 0;
  if (last) {
    if (abort) x->abort = 1;
    x->stop = 1;
    pthread_cond_broadcast(&x->cond);
  }
  pthread_mutex_unlock(&x->mutex);
  if (last) pthread_join(x->thread, NULL); /* commFree, init.cc:284-285 */
}

/* ---- communicators: init (init.cc:1519-1530) and commFree (init.cc:267-379) ---- */

static void ncclDebugLog(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                         const char *fmt, ...) {
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

static int refs_held(const comm_t *except) {
  int n = 0;
  pthread_mutex_lock(&comms_lock);
  for (int i = 0; i < ncomms; i++)
    if (comms[i] && comms[i] != except && comms[i]->alive && comms[i]->holds_ref) n++;
  pthread_mutex_unlock(&comms_lock);
  return n;
}

static void ncclProfilerPluginUnload(comm_t *c) {
  if (!c->holds_ref)
    fail("communicator %s releases a loader reference it does not hold (2.30.3+: profiler.cc:253 at a failed "
         "init, then :268 at commFree)", c->name);
  c->holds_ref = 0;
  pthread_mutex_lock(&profilerMutex);
  unloads++;
  if (--profilerPluginRefCount == 0) {
    int others = refs_held(c);
    if (others)
      fail("loader refcount reached 0 while %d communicator(s) holding a reference are alive: NCCL dlcloses "
           "the plugin and sets ncclProfiler = NULL (profiler.cc:115-122) under them", others);
    if (atomic_load(&in_call)) fail("dlclose while a call into the plugin is in progress");
    if (rel == 27 && !atomic_load(&ncclProfiler))
      fail("NCCL 2.27 would crash here: ncclProfilerPluginUnload reads ncclProfiler->name with ncclProfiler == "
           "NULL (v2.27.7 profiler.cc:89) after an init failure");
    atomic_store(&ncclProfiler, NULL);
    if (profilerPluginLib) dlclose(profilerPluginLib);
    profilerPluginLib = NULL;
    profilerPluginStatus = 0;
  } else if (profilerPluginRefCount < 0) {
    fail("loader refcount went negative (%d)", profilerPluginRefCount);
  }
  pthread_mutex_unlock(&profilerMutex);
}

/* profiler.cc:245-261 (2.27: v2.27.7 :165-178; 2.28-2.29: v2.29.7 :218-232). */
static void ncclProfilerPluginInit(comm_t *c) {
  ncclProfilerPluginLoad();
  c->holds_ref = profilerPluginStatus == 1;
  void *t = atomic_load(&ncclProfiler);
  if (!t) return;
  int mask = atomic_load(&ncclProfilerEventMask); /* &ncclProfilerEventMask, process-wide */
  ncclResult_t err;
  atomic_fetch_add(&in_call, 1);
  if (profilerVersion == 4)
    err = ((ncclProfiler_v4_t *)t)->init(&c->profilerContext, &mask, c->name, c->hash, c->nnodes, c->nranks, c->rank,
                                         ncclDebugLog);
  else if (profilerVersion == 5)
    err = ((ncclProfiler_v5_t *)t)->init(&c->profilerContext, c->hash, &mask, c->name, c->nnodes, c->nranks, c->rank,
                                         ncclDebugLog);
  else
    err = ((ncclProfiler_v6_t *)t)->init(&c->profilerContext, c->hash, &mask, c->name, c->nnodes, c->nranks, c->rank,
                                         ncclDebugLog);
  atomic_fetch_sub(&in_call, 1);
  atomic_store(&ncclProfilerEventMask, mask);
  c->rc = err;
  if (err) {
    fprintf(stderr, "NCCL INFO Profiler init failed with error '%d'. Continue without profiler.\n", err);
    if (rel == 27) { /* v2.27.7 :171-174: off for the whole process */
      atomic_store(&ncclProfiler, NULL);
      int others = refs_held(c);
      if (others)
        fail("NCCL 2.27 sets ncclProfiler = NULL for the whole process (v2.27.7 profiler.cc:173) while %d other "
             "communicator(s) are alive: they go unprofiled", others);
    } else if (rel >= 30) { /* 2.30.3+ :252-254 */
      ncclProfilerPluginUnload(c);
    }
  }
}

static void ncclProfilerPluginFinalize(comm_t *c) { /* :263-273 (v2.27.7 :180-190 without the ctx check) */
  void *t = atomic_load(&ncclProfiler);
  if (t && (rel == 27 || c->profilerContext)) {
    atomic_fetch_add(&in_call, 1);
    if (profilerVersion == 4) ((ncclProfiler_v4_t *)t)->finalize(c->profilerContext);
    else if (profilerVersion == 5) ((ncclProfiler_v5_t *)t)->finalize(c->profilerContext);
    else ((ncclProfiler_v6_t *)t)->finalize(c->profilerContext);
    atomic_fetch_sub(&in_call, 1);
  }
  ncclProfilerPluginUnload(c);
}

static comm_t *find_comm(const char *name) {
  pthread_mutex_lock(&comms_lock);
  comm_t *r = NULL;
  for (int i = 0; i < ncomms && !r; i++)
    if (comms[i] && comms[i]->alive && strcmp(comms[i]->name, name) == 0) r = comms[i];
  pthread_mutex_unlock(&comms_lock);
  return r;
}

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
  return h;
}

typedef struct {
  comm_t *c;
  comm_t *share;
} init_job_t;

/* ncclCommInitRankFunc (init.cc:1835-) -> initTransportsRank: the plugin before the proxy. */
static void *init_main(void *arg) {
  init_job_t *j = arg;
  comm_t *c = j->c;
  current_dev = c->dev; /* init.cc:1846 cudaSetDevice(cudaDev) */
  ncclProfilerPluginInit(c); /* init.cc:1519-1520 */
  if (j->share) {            /* init.cc:1525-1527 splitShare: the parent's proxy thread */
    c->proxy = j->share->proxy;
    pthread_mutex_lock(&c->proxy->mutex);
    c->proxy->refs++;
    pthread_mutex_unlock(&c->proxy->mutex);
  } else {
    c->proxy = proxy_create(c->dev);
  }
  return NULL;
}

static comm_t *new_comm(const char *name, uint64_t hash, int nranks, int rank, int nnodes, int dev) {
  comm_t *c = calloc(1, sizeof(comm_t));
  snprintf(c->name, sizeof(c->name), "%s", name);
  c->hash = hash;
  c->nranks = nranks;
  c->rank = rank;
  c->nnodes = nnodes;
  c->dev = dev;
  c->alive = 1;
  pthread_mutex_lock(&comms_lock);
  if (ncomms == MAX_COMMS) { /* slots of destroyed communicators are reused */
    int w = 0;
    for (int i = 0; i < ncomms; i++)
      if (comms[i]) comms[w++] = comms[i];
    ncomms = w;
  }
  comms[ncomms++] = c;
  pthread_mutex_unlock(&comms_lock);
  return c;
}

static void print_init(const comm_t *c) {
  printf("init %s rc=%d mask=%d ctx=%d refcount=%d\n", c->name, c->rc, atomic_load(&ncclProfilerEventMask),
         c->profilerContext != NULL, profilerPluginRefCount);
}

static void comm_free(comm_t *c, int abort) {
  if (!abort)
    while (atomic_load(&c->inflight) > 0) sleep_us(100); /* ncclCommDestroy waits for the work */
  proxy_release(c->proxy, abort);
  ncclProfilerPluginFinalize(c); /* init.cc:379, after the proxy thread joined */
  pthread_mutex_lock(&comms_lock);
  c->alive = 0;
  for (int i = 0; i < ncomms; i++)
    if (comms[i] == c) comms[i] = NULL;
  pthread_mutex_unlock(&comms_lock);
  for (launch_t *l = atomic_load(&c->held), *n; l; l = n) {
    n = l->next_held;
    launch_put(l);
  }
  free(c->tasks); /* the comm_t itself stays: an aborted proxy's leftover args point at it */
  c->tasks = NULL;
}

/* ---- scenario ---- */

typedef struct {
  char *w[32];
  int n;
} words_t;

static const char *opt(const words_t *w, const char *key, const char *dflt) {
  size_t k = strlen(key);
  for (int i = 1; i < w->n; i++)
    if (strncmp(w->w[i], key, k) == 0 && w->w[i][k] == '=') return w->w[i] + k + 1;
  return dflt;
}
static long opt_l(const words_t *w, const char *key, long dflt) {
  const char *s = opt(w, key, NULL);
  return s ? strtol(s, NULL, 0) : dflt;
}

static comm_t *need_comm(const char *name, long lineno) {
  comm_t *c = name ? find_comm(name) : NULL;
  if (!c) {
    fprintf(stderr, "nccl_like: line %ld: no communicator %s\n", lineno, name ? name : "(none)");
    exit(2);
  }
  return c;
}

static int parse_dtype(const char *s) {
  for (int i = 0; i < NDTYPES; i++)
    if (strcmp(s, DTYPES[i].word) == 0) return i;
  fprintf(stderr, "nccl_like: unknown datatype %s\n", s);
  exit(2);
}

static int parse_net(const char *s) {
  for (int i = 0; i < 4; i++)
    if (strcmp(s, NET_WORDS[i]) == 0) return i;
  fprintf(stderr, "nccl_like: unknown net %s\n", s);
  exit(2);
}

static void make_task(task_t *t, int func, const words_t *w) {
  memset(t, 0, sizeof(*t));
  t->func = func;
  t->is_p2p = func == F_SEND || func == F_RECV;
  t->dtype = parse_dtype(opt(w, "dtype", "ncclFloat32"));
  t->count = (size_t)opt_l(w, "count", 1 << 20);
  t->nch = (int)opt_l(w, "nch", t->is_p2p ? 1 : 2);
  if (t->nch < 1 || t->nch > MAXCHANNELS) t->nch = 1;
  t->steps = (int)opt_l(w, "steps", 4);
  t->net = parse_net(opt(w, "net", "ring"));
  t->root = (int)opt_l(w, t->is_p2p ? "peer" : "root", 0);
  t->hold = (int)opt_l(w, "hold", 0);
  t->hang = (int)opt_l(w, "hang", 0);
  t->stall_ms = opt_l(w, "stall", 0);
  t->refuse = opt_l(w, "refuse", 0);
  t->irecv_refuse = opt_l(w, "irecv_refuse", 0);
  t->algo = strdup(opt(w, "algo", t->is_p2p ? "P2P" : "RING"));
  t->proto = strdup(opt(w, "proto", "SIMPLE"));
  if (func == F_ALLGATHER || func == F_BROADCAST) { /* enqueue.cc:2733-2737: bytes, as ncclInt8 */
    t->count *= (size_t)DTYPES[t->dtype].size;
    t->dtype = DT_INT8;
  }
}

static void issue(comm_t *c, int func, const words_t *w) {
  task_t t;
  make_task(&t, func, w);
  enqueue(c, &t);
}

static void alltoall(comm_t *c, int peers, const words_t *w) { /* one group, a send and a recv per peer */
  ncclGroupStart();
  for (int p = 0; p < peers; p++) {
    int peer = (c->rank + 1 + p) % c->nranks;
    for (int f = F_SEND; f <= F_RECV; f++) {
      task_t t;
      make_task(&t, f, w);
      t.root = peer;
      enqueue(c, &t);
    }
  }
  ncclGroupEnd();
}

static void wait_idle(void) {
  int64_t t0 = clock_ns(CLOCK_MONOTONIC);
  long start[MAX_COMMS];
  pthread_mutex_lock(&comms_lock);
  for (int i = 0; i < ncomms; i++) start[i] = comms[i] && comms[i]->proxy ? atomic_load(&comms[i]->proxy->passes) : 0;
  pthread_mutex_unlock(&comms_lock);
  for (;;) {
    int busy = 0;
    pthread_mutex_lock(&cb.mutex);
    busy |= cb.head != cb.tail || cb.busy;
    pthread_mutex_unlock(&cb.mutex);
    pthread_mutex_lock(&comms_lock);
    for (int i = 0; i < ncomms && !busy; i++) {
      proxy_t *x = comms[i] ? comms[i]->proxy : NULL;
      if (!x) continue;
      pthread_mutex_lock(&x->mutex);
      int active = atomic_load(&x->nactive);
      busy |= x->nposted > 0 ||
              (active > 0 && (active > atomic_load(&x->nstuck) || atomic_load(&x->passes) - start[i] < 2));
      pthread_mutex_unlock(&x->mutex);
    }
    pthread_mutex_unlock(&comms_lock);
    if (!busy) return;
    if (clock_ns(CLOCK_MONOTONIC) - t0 > 60000000000LL) {
      fail("wait: the proxy threads did not drain in 60 s");
      return;
    }
    sleep_us(200);
  }
}

static void comm_line(const words_t *w, long lineno) {
  int nranks = (int)opt_l(w, "nranks", 8), rank = (int)opt_l(w, "rank", 0);
  const char *share = opt(w, "share", NULL);
  comm_t *parent = share ? need_comm(share, lineno) : NULL;
  const char *hs = opt(w, "hash", NULL);
  uint64_t hash = hs ? strtoull(hs, NULL, 0) : name_hash(w->w[1]);
  comm_t *c = new_comm(w->w[1], hash, nranks, rank, (int)opt_l(w, "nnodes", 2),
                       (int)opt_l(w, "dev", parent ? parent->dev : 0));
  init_job_t j = {c, parent};
  pthread_t th;
  pthread_create(&th, NULL, init_main, &j); /* the creating thread, as ncclCommInitRank's job */
  pthread_join(th, NULL);
  print_init(c);
}

/* ncclCommInitAll (init.cc:2581-2640): one job per device in a group, run by their own threads. */
static void comms_line(const words_t *w) {
  int n = 0;
  while (n + 1 < w->n && !strchr(w->w[n + 1], '=')) n++;
  init_job_t jobs[64];
  pthread_t th[64];
  uint64_t hash = name_hash(w->w[1]);
  for (int i = 0; i < n && i < 64; i++) {
    jobs[i].c = new_comm(w->w[i + 1], hash, (int)opt_l(w, "nranks", n), i, (int)opt_l(w, "nnodes", 1), i);
    jobs[i].share = NULL;
    pthread_create(&th[i], NULL, init_main, &jobs[i]);
  }
  for (int i = 0; i < n && i < 64; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < n && i < 64; i++) print_init(jobs[i].c);
}

static graph_t *find_graph(const char *name) {
  for (graph_t *g = graphs; g; g = g->next)
    if (strcmp(g->name, name) == 0) return g;
  return NULL;
}

static int func_of(const char *word) {
  for (int f = 0; f < F_NUM; f++)
    if (strcmp(word, FUNC_WORDS[f]) == 0) return f;
  return -1;
}

static void run_line(words_t *w, long lineno) {
  const char *cmd = w->w[0];
  const char *arg = w->n > 1 ? w->w[1] : NULL;
  int f = func_of(cmd);
  if (f >= 0) {
    issue(need_comm(arg, lineno), f, w);
  } else if (!strcmp(cmd, "comm")) {
    comm_line(w, lineno);
  } else if (!strcmp(cmd, "comms")) {
    comms_line(w);
  } else if (!strcmp(cmd, "alltoall")) {
    comm_t *c = need_comm(arg, lineno);
    alltoall(c, (int)opt_l(w, "peers", c->nranks - 1), w);
  } else if (!strcmp(cmd, "group")) {
    ncclGroupStart();
  } else if (!strcmp(cmd, "end")) {
    ncclGroupEnd();
  } else if (!strcmp(cmd, "capture")) {
    graph_t *g = calloc(1, sizeof(graph_t));
    snprintf(g->name, sizeof(g->name), "%s", arg ? arg : "g");
    g->next = graphs;
    graphs = g;
    capture_graph = g;
    capturing = 1;
  } else if (!strcmp(cmd, "endcapture")) {
    capture_graph = NULL;
    capturing = 0;
  } else if (!strcmp(cmd, "replay")) {
    graph_t *g = arg ? find_graph(arg) : NULL;
    long times = opt_l(w, "times", 1);
    for (long r = 0; g && r < times; r++)
      for (plan_t *p = g->plans; p; p = p->next) callback_enqueue(p);
  } else if (!strcmp(cmd, "release")) {
    comm_t *c = need_comm(arg, lineno);
    for (launch_t *l = atomic_load(&c->held); l; l = l->next_held) {
      atomic_store(&l->hold_from, MAXCHANNELS);
      atomic_store(&l->hang, 0);
    }
  } else if (!strcmp(cmd, "wait")) {
    wait_idle();
  } else if (!strcmp(cmd, "destroy") || !strcmp(cmd, "abort")) {
    comm_free(need_comm(arg, lineno), cmd[0] == 'a');
  } else if (!strcmp(cmd, "tick")) {
    if (plugin_tick) plugin_tick();
  } else if (!strcmp(cmd, "flush")) {
    if (plugin_flush) plugin_flush();
  } else if (!strcmp(cmd, "sleep")) {
    sleep_us(arg ? atol(arg) * 1000L : 0);
  } else if (!strcmp(cmd, "mark")) {
    printf("mark %s %lld\n", arg ? arg : "-", (long long)clock_ns(CLOCK_REALTIME));
  } else {
    fprintf(stderr, "nccl_like: line %ld: unknown command %s\n", lineno, cmd);
    exit(2);
  }
  fflush(stdout);
}

static void run_script(FILE *in) {
  char line[1024];
  long lineno = 0;
  while (fgets(line, sizeof(line), in)) {
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    words_t w = {.n = 0};
    for (char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save); tok && w.n < 32;
         tok = strtok_r(NULL, " \t\r\n", &save))
      w.w[w.n++] = tok;
    if (w.n) run_line(&w, lineno);
  }
}

/* ---- --rate: one communicator issuing ops at a steady rate for a while ---- */

static int rate_mode(double ops_per_s, double seconds, int peers) {
  char ranks[32];
  snprintf(ranks, sizeof(ranks), "nranks=%d", peers > 0 ? peers + 1 : 8);
  words_t cw = {.n = 3, .w = {"comm", "rate", ranks}};
  comm_line(&cw, 0);
  comm_t *c = find_comm("rate");
  char steps[] = "steps=2", nch[] = "nch=1", count[] = "count=65536";
  words_t ow = {.n = 4, .w = {"allreduce", steps, nch, count}};
  long issued = 0, calls = 0;
  int per_call = peers > 0 ? 2 * peers : 1;
  int64_t t0 = clock_ns(CLOCK_MONOTONIC), end = t0 + (int64_t)(seconds * 1e9);
  for (;;) {
    int64_t now = clock_ns(CLOCK_MONOTONIC);
    if (now >= end) break;
    long due = (long)((double)(now - t0) * 1e-9 * ops_per_s);
    if (issued >= due) {
      sleep_us(200);
      continue;
    }
    while (issued < due) {
      if (peers > 0) alltoall(c, peers, &ow);
      else issue(c, F_ALLREDUCE, &ow);
      issued += per_call;
      calls++;
    }
  }
  int64_t t1 = clock_ns(CLOCK_MONOTONIC);
  wait_idle();
  sleep_us(400000); /* the application keeps running a few ticks before it tears down */
  comm_free(c, 0);
  printf("{\"ops\": %ld, \"calls\": %ld, \"seconds\": %.3f, \"p2p_peers\": %d, \"errors\": %d}\n", issued, calls,
         (double)(t1 - t0) * 1e-9, peers, atomic_load(&nerrors));
  return 0;
}

int main(int argc, char **argv) {
  double rate = 0, seconds = 1;
  int peers = 0;
  if (argc < 2) {
    fprintf(stderr, "usage: nccl_like PLUGIN.so --release 2.27|2.28|2.29|2.30 "
                    "[--rate OPS_PER_S --seconds S [--p2p-peers N]] [< scenario]\n");
    return 2;
  }
  pluginPath = argv[1];
  rel = 30;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--release") && i + 1 < argc) {
      const char *r = argv[++i];
      rel = !strncmp(r, "2.", 2) ? atoi(r + 2) : 0;
    } else if (!strcmp(argv[i], "--trace")) {
      trace = 1;
    } else if (!strcmp(argv[i], "--rate") && i + 1 < argc) {
      rate = atof(argv[++i]);
    } else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
      seconds = atof(argv[++i]);
    } else if (!strcmp(argv[i], "--p2p-peers") && i + 1 < argc) {
      peers = atoi(argv[++i]);
    } else {
      fprintf(stderr, "nccl_like: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (rel < 27 || rel > 30) {
    fprintf(stderr, "nccl_like: --release must be 2.27, 2.28, 2.29 or 2.30\n");
    return 2;
  }
  if (rate > 0) rate_mode(rate, seconds, peers);
  else run_script(stdin);
  pthread_mutex_lock(&comms_lock);
  for (int i = 0; i < ncomms; i++) { /* process exit without destroy: the proxies stop, no finalize */
    proxy_t *x = comms[i] ? comms[i]->proxy : NULL;
    if (x && x->refs > 0) {
      x->refs = 0;
      pthread_mutex_lock(&x->mutex);
      x->abort = 1;
      pthread_cond_broadcast(&x->cond);
      pthread_mutex_unlock(&x->mutex);
      pthread_join(x->thread, NULL);
    }
  }
  pthread_mutex_unlock(&comms_lock);
  printf("done errors=%d loads=%d unloads=%d\n", atomic_load(&nerrors), loads, unloads);
  fflush(stdout);
  return atomic_load(&nerrors) ? 3 : 0;
}
