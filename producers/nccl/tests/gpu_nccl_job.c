/* A two-process NCCL job for gpu_check.sh that needs neither CUDA nor NCCL headers: it dlopens
 * libnccl.so.2 and the CUDA runtime and declares the few types, enum values and prototypes it
 * calls (as NCCL's src/nccl.h.in, 2.27 to 2.30, and CUDA's runtime API declare them).
 *
 *   gpu_nccl_job --probe
 *       key=value lines: nccl_version (ncclGetVersion code, 23007 = 2.30.7), nccl_lib, cudart,
 *       cuda_devices, cuda_graphs (1: the runtime has the stream-capture API), *_error lines
 *   gpu_nccl_job --rank R --world N --dir DIR [--device D] [--churn C] [--iters I] [--no-graph]
 *       one rank of the job; the ranks meet through DIR/bootstrap (rank 0 writes each
 *       ncclUniqueId to a file, the others read it) and rank R writes DIR/manifest-R.json:
 *       the ops it issued per communicator, the AllReduce times and its pid.
 *
 * The ops, in order, each counted in the manifest as "Kind bytes" (bytes as NCCL's profiler
 * reports them: count x element size of the per-rank input; ReduceScatter's per-rank output):
 *   world:  AllReduce, AllGather, ReduceScatter, Broadcast (root 0) of 4 KiB, 64 KiB, 1 MiB,
 *           twice over; grouped Send/Recv pairs with the neighbours (4 KiB, 256 KiB, 1 MiB);
 *           one AllReduce of 192 KiB, then the same captured in a CUDA graph and replayed 5
 *           times (skipped with a message when the runtime has no capture API); the timed
 *           AllReduces (128 KiB, 512 KiB, 4 MiB: --iters each after 5 warm-up ones);
 *   split:  ncclCommSplit of world with the ranks reversed; AllReduce x2, AllGather and
 *           ReduceScatter of 12 KiB;
 *   churn:  C communicators made and destroyed one after another (ncclCommInitRank with a
 *           fresh id and ncclCommSplit, alternately), one AllReduce of 8 KiB each; gpu_check.sh
 *           gives the plugin fewer communicator slots than that;
 *   world again: AllReduce of 20 KiB x3 (profiling goes on after the churn).
 * Any failed call prints it and exits 1. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t; /* ncclSuccess = 0 */
typedef struct ncclComm *ncclComm_t;
typedef struct {
  char internal[128]; /* NCCL_UNIQUE_ID_BYTES */
} ncclUniqueId;
enum { NCCL_FLOAT32 = 7, NCCL_SUM = 0 }; /* ncclFloat32 (ncclDataType_t), ncclSum (ncclRedOp_t) */

typedef int cudaError_t; /* cudaSuccess = 0 */
typedef void *cudaStream_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
enum { CUDA_CAPTURE_GLOBAL = 0 }; /* cudaStreamCaptureModeGlobal */

#define NCCL_FNS(X)                                                                              \
  X(ncclResult_t, ncclGetVersion, (int *))                                                       \
  X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *))                                             \
  X(ncclResult_t, ncclCommInitRank, (ncclComm_t *, int, ncclUniqueId, int))                      \
  X(ncclResult_t, ncclCommSplit, (ncclComm_t, int, int, ncclComm_t *, void *))                   \
  X(ncclResult_t, ncclCommDestroy, (ncclComm_t))                                                 \
  X(ncclResult_t, ncclAllReduce, (const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t)) \
  X(ncclResult_t, ncclAllGather, (const void *, void *, size_t, int, ncclComm_t, cudaStream_t))  \
  X(ncclResult_t, ncclReduceScatter, (const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t)) \
  X(ncclResult_t, ncclBroadcast, (const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t)) \
  X(ncclResult_t, ncclSend, (const void *, size_t, int, int, ncclComm_t, cudaStream_t))          \
  X(ncclResult_t, ncclRecv, (void *, size_t, int, int, ncclComm_t, cudaStream_t))                \
  X(ncclResult_t, ncclGroupStart, (void))                                                        \
  X(ncclResult_t, ncclGroupEnd, (void))                                                          \
  X(const char *, ncclGetErrorString, (ncclResult_t))

#define CUDA_FNS(X)                                                  \
  X(cudaError_t, cudaGetDeviceCount, (int *))                        \
  X(cudaError_t, cudaSetDevice, (int))                               \
  X(cudaError_t, cudaMalloc, (void **, size_t))                      \
  X(cudaError_t, cudaMemset, (void *, int, size_t))                  \
  X(cudaError_t, cudaFree, (void *))                                 \
  X(cudaError_t, cudaStreamCreate, (cudaStream_t *))                 \
  X(cudaError_t, cudaStreamSynchronize, (cudaStream_t))              \
  X(cudaError_t, cudaStreamDestroy, (cudaStream_t))                  \
  X(const char *, cudaGetErrorString, (cudaError_t))

#define GRAPH_FNS(X)                                                                   \
  X(cudaError_t, cudaStreamBeginCapture, (cudaStream_t, int))                          \
  X(cudaError_t, cudaStreamEndCapture, (cudaStream_t, cudaGraph_t *))                  \
  X(cudaError_t, cudaGraphInstantiateWithFlags, (cudaGraphExec_t *, cudaGraph_t, unsigned long long)) \
  X(cudaError_t, cudaGraphLaunch, (cudaGraphExec_t, cudaStream_t))                     \
  X(cudaError_t, cudaGraphExecDestroy, (cudaGraphExec_t))                              \
  X(cudaError_t, cudaGraphDestroy, (cudaGraph_t))

#define DECLARE(ret, name, args) static ret(*p_##name) args;
NCCL_FNS(DECLARE)
CUDA_FNS(DECLARE)
GRAPH_FNS(DECLARE)
#undef DECLARE

static const char *const NCCL_LIBS[] = {"libnccl.so.2", "libnccl.so", NULL};
static const char *const CUDART_LIBS[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                          "libcudart.so", NULL};

enum { MIX_REPS = 2, GRAPH_REPLAYS = 5, WARMUP = 5, MAX_OPS = 64 };
static const long MIX_BYTES[] = {4096, 65536, 1048576};
static const long P2P_BYTES[] = {4096, 262144, 1048576};
static const long TIMED_BYTES[] = {131072, 524288, 4194304};
#define NSIZES 3
#define GRAPH_BYTES 196608L
#define SPLIT_BYTES 12288L
#define CHURN_BYTES 8192L
#define TAIL_BYTES 20480L
#define MAX_WORLD 16
#define BUF_BYTES (16L << 20) /* world x 1 MiB (AllGather's output, ReduceScatter's input) */

static struct {
  int rank, world, device, churn, iters, graphs;
  const char *dir;
  void *send, *recv;
  cudaStream_t stream;
} job = {.world = 2, .churn = 80, .iters = 20, .graphs = 1};

/* The manifest: how many ops of each "Kind bytes" each communicator label got. */
static struct {
  const char *label, *kind;
  long bytes;
  int n;
} issued[MAX_OPS];
static int nissued;
static double timed_us[NSIZES];
static char graph_note[256];

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "gpu_nccl_job rank %d: ", job.rank);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static void nccl_ok(ncclResult_t r, const char *call, int line) {
  if (r != 0) die("line %d: %s: %s", line, call, p_ncclGetErrorString(r));
}
static void cuda_ok(cudaError_t r, const char *call, int line) {
  if (r != 0) die("line %d: %s: %s", line, call, p_cudaGetErrorString(r));
}
#define NCCL(call) nccl_ok(p_##call, #call, __LINE__)
#define CUDA(call) cuda_ok(p_##call, #call, __LINE__)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void count_op(const char *label, const char *kind, long bytes, int n) {
  for (int i = 0; i < nissued; i++)
    if (!strcmp(issued[i].label, label) && !strcmp(issued[i].kind, kind) && issued[i].bytes == bytes) {
      issued[i].n += n;
      return;
    }
  if (nissued == MAX_OPS) die("more than %d op kinds in the manifest", MAX_OPS);
  issued[nissued].label = label;
  issued[nissued].kind = kind;
  issued[nissued].bytes = bytes;
  issued[nissued++].n = n;
}

/* ---- loading ---- */

static void *open_first(const char *env, const char *const *names, char *err, size_t errlen) {
  const char *forced = getenv(env);
  if (forced && *forced) {
    void *h = dlopen(forced, RTLD_NOW | RTLD_GLOBAL);
    if (!h) snprintf(err, errlen, "%s", dlerror());
    return h;
  }
  size_t len = 0;
  for (int i = 0; names[i]; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (h) return h;
    const char *why = dlerror();
    if (len < errlen) len += (size_t)snprintf(err + len, errlen - len, "%s%s", i ? "; " : "", why);
  }
  if (len < errlen) snprintf(err + len, errlen - len, " (%s names the library)", env);
  return NULL;
}

static int resolve(void *h, const char *name, void *fn_ptr) {
  void *sym = dlsym(h, name);
  memcpy(fn_ptr, &sym, sizeof(sym));
  return sym != NULL;
}

static const char *path_of(void *h) {
  struct link_map *lm = NULL;
  return dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name[0] ? lm->l_name : "?";
}

/* Load NCCL, then the CUDA runtime: NULL, or why not. */
static void *nccl_lib, *cuda_lib;
static char load_error[512];
#define RESOLVE(ret, name, args)                                                                    \
  if (!resolve(lib, #name, &p_##name))                                                              \
    return snprintf(load_error, sizeof(load_error), "no %s in %s", #name, path_of(lib)), load_error;

static const char *load_nccl(void) {
  void *lib = nccl_lib = open_first("MYCROFT_NCCL_LIB", NCCL_LIBS, load_error, sizeof(load_error));
  if (!lib) return load_error;
  NCCL_FNS(RESOLVE)
  return NULL;
}

static const char *load_cuda(void) {
  void *lib = cuda_lib = open_first("MYCROFT_CUDART", CUDART_LIBS, load_error, sizeof(load_error));
  if (!lib) return load_error;
  CUDA_FNS(RESOLVE)
  int graphs = 1;
#undef RESOLVE
#define RESOLVE(ret, name, args) graphs &= resolve(lib, #name, &p_##name);
  GRAPH_FNS(RESOLVE)
#undef RESOLVE
  if (!graphs && job.graphs) job.graphs = -1; /* -1: the runtime has no capture API */
  return NULL;
}

static int probe(void) {
  const char *err = load_nccl();
  int v = 0;
  if (err)
    printf("nccl_error=%s\n", err);
  else if (p_ncclGetVersion(&v) == 0)
    printf("nccl_version=%d\nnccl_lib=%s\n", v, path_of(nccl_lib));
  if ((err = load_cuda())) {
    printf("cudart_error=%s\n", err);
    return 0;
  }
  int n = 0;
  cudaError_t e = p_cudaGetDeviceCount(&n);
  printf("cudart=%s\ncuda_devices=%d\ncuda_graphs=%d\n", path_of(cuda_lib), e ? 0 : n, job.graphs > 0);
  if (e) printf("cuda_error=%s\n", p_cudaGetErrorString(e));
  return 0;
}

/* ---- bootstrap: rank 0 writes each unique id to DIR/bootstrap/uid-TAG ---- */

static ncclUniqueId exchange_id(const char *tag) {
  char path[4096], tmp[4200];
  ncclUniqueId id;
  snprintf(path, sizeof(path), "%s/bootstrap/uid-%s", job.dir, tag);
  if (job.rank == 0) {
    NCCL(ncclGetUniqueId(&id));
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof(id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0)
      die("cannot write %s: %s", path, strerror(errno));
    return id;
  }
  for (double t0 = now_s(); now_s() - t0 < 300; sleep_ms(5)) {
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    size_t got = fread(&id, sizeof(id), 1, f);
    fclose(f);
    if (got == 1) return id;
  }
  die("rank 0 wrote no %s within 300 s", path);
  return id;
}

static ncclComm_t init_comm(const char *tag) {
  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, job.world, exchange_id(tag), job.rank));
  return comm;
}

/* ---- ops ---- */

static void stream_sync(void) { CUDA(cudaStreamSynchronize(job.stream)); }

static void all_reduce(ncclComm_t c, long bytes, const char *label) {
  NCCL(ncclAllReduce(job.send, job.recv, (size_t)bytes / 4, NCCL_FLOAT32, NCCL_SUM, c, job.stream));
  if (label) count_op(label, "AllReduce", bytes, 1);
}

static void mix(ncclComm_t c, const char *label) {
  for (int rep = 0; rep < MIX_REPS; rep++)
    for (int i = 0; i < NSIZES; i++) {
      size_t n = (size_t)MIX_BYTES[i] / 4;
      all_reduce(c, MIX_BYTES[i], label);
      NCCL(ncclAllGather(job.send, job.recv, n, NCCL_FLOAT32, c, job.stream));
      NCCL(ncclReduceScatter(job.send, job.recv, n, NCCL_FLOAT32, NCCL_SUM, c, job.stream));
      NCCL(ncclBroadcast(job.send, job.recv, n, NCCL_FLOAT32, 0, c, job.stream));
      count_op(label, "AllGather", MIX_BYTES[i], 1);
      count_op(label, "ReduceScatter", MIX_BYTES[i], 1);
      count_op(label, "Broadcast", MIX_BYTES[i], 1);
    }
  stream_sync();
}

static void send_recv(ncclComm_t c) {
  int to = (job.rank + 1) % job.world, from = (job.rank + job.world - 1) % job.world;
  for (int i = 0; i < NSIZES; i++) {
    size_t n = (size_t)P2P_BYTES[i] / 4;
    NCCL(ncclGroupStart());
    NCCL(ncclSend(job.send, n, NCCL_FLOAT32, to, c, job.stream));
    NCCL(ncclRecv(job.recv, n, NCCL_FLOAT32, from, c, job.stream));
    NCCL(ncclGroupEnd());
    stream_sync();
    count_op("p2p", "Send", P2P_BYTES[i], 1);
    count_op("p2p", "Recv", P2P_BYTES[i], 1);
  }
}

/* One AllReduce captured in a CUDA graph, replayed GRAPH_REPLAYS times: each replay is an op. */
static void graph_replays(ncclComm_t c) {
  if (job.graphs <= 0) {
    snprintf(graph_note, sizeof(graph_note), "skipped: %s",
             job.graphs < 0 ? "the CUDA runtime has no stream-capture API" : "--no-graph");
    fprintf(stderr, "gpu_nccl_job rank %d: CUDA graph %s\n", job.rank, graph_note);
    return;
  }
  all_reduce(c, GRAPH_BYTES, "world"); /* connects the algorithm's channels before the capture */
  stream_sync();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA(cudaStreamBeginCapture(job.stream, CUDA_CAPTURE_GLOBAL));
  all_reduce(c, GRAPH_BYTES, NULL);
  CUDA(cudaStreamEndCapture(job.stream, &graph));
  CUDA(cudaGraphInstantiateWithFlags(&exec, graph, 0));
  for (int i = 0; i < GRAPH_REPLAYS; i++) CUDA(cudaGraphLaunch(exec, job.stream));
  stream_sync();
  CUDA(cudaGraphExecDestroy(exec));
  CUDA(cudaGraphDestroy(graph));
  count_op("world", "AllReduce", GRAPH_BYTES, GRAPH_REPLAYS);
  snprintf(graph_note, sizeof(graph_note), "\"replays\": %d, \"bytes\": %ld", GRAPH_REPLAYS, GRAPH_BYTES);
}

static void timed(ncclComm_t c) {
  for (int i = 0; i < NSIZES; i++) {
    for (int k = 0; k < WARMUP; k++) all_reduce(c, TIMED_BYTES[i], "world");
    stream_sync();
    double t0 = now_s();
    for (int k = 0; k < job.iters; k++) all_reduce(c, TIMED_BYTES[i], "world");
    stream_sync();
    timed_us[i] = (now_s() - t0) / job.iters * 1e6;
  }
}

static void split_ops(ncclComm_t split) {
  size_t n = (size_t)SPLIT_BYTES / 4;
  all_reduce(split, SPLIT_BYTES, "split");
  all_reduce(split, SPLIT_BYTES, "split");
  NCCL(ncclAllGather(job.send, job.recv, n, NCCL_FLOAT32, split, job.stream));
  NCCL(ncclReduceScatter(job.send, job.recv, n, NCCL_FLOAT32, NCCL_SUM, split, job.stream));
  count_op("split", "AllGather", SPLIT_BYTES, 1);
  count_op("split", "ReduceScatter", SPLIT_BYTES, 1);
  stream_sync();
}

/* Communicators made and destroyed one after another: more than the plugin has slots for. */
static void churn(ncclComm_t world) {
  for (int i = 0; i < job.churn; i++) {
    ncclComm_t c;
    char tag[32];
    snprintf(tag, sizeof(tag), "churn-%d", i);
    if (i % 2 == 0)
      c = init_comm(tag);
    else
      NCCL(ncclCommSplit(world, 0, job.rank, &c, NULL));
    all_reduce(c, CHURN_BYTES, NULL);
    stream_sync();
    sleep_ms(20); /* let the proxy retire the op's flows before the destroy */
    NCCL(ncclCommDestroy(c));
  }
}

/* ---- manifest ---- */

static void write_ops(FILE *f, const char *label) {
  const char *sep = "";
  fputc('{', f);
  for (int i = 0; i < nissued; i++)
    if (!strcmp(issued[i].label, label)) {
      fprintf(f, "%s\"%s %ld\": %d", sep, issued[i].kind, issued[i].bytes, issued[i].n);
      sep = ", ";
    }
  fputc('}', f);
}

static void write_manifest(int version, double wall_s) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof(path), "%s/manifest-%d.json", job.dir, job.rank);
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) die("cannot write %s: %s", tmp, strerror(errno));
  const char *job_id = getenv("MYCROFT_JOB_ID");
  if (!job_id || strpbrk(job_id, "\"\\")) job_id = "";
  fprintf(f, "{\"job\": \"nccl\", \"rank\": %d, \"world\": %d, \"pid\": %d, \"device\": %d, "
             "\"nccl_version\": %d, \"job_id\": \"%s\",\n \"comms\": {\"world\": ",
          job.rank, job.world, (int)getpid(), job.device, version, job_id);
  write_ops(f, "world");
  fputs(", \"split\": ", f);
  write_ops(f, "split");
  fprintf(f, "},\n \"churn\": {\"count\": %d, \"ops\": {\"AllReduce %ld\": 1}},\n \"p2p\": ", job.churn,
          CHURN_BYTES);
  write_ops(f, "p2p");
  fprintf(f, ",\n \"after_churn\": {\"AllReduce %ld\": 3},\n \"graph\": ", TAIL_BYTES);
  if (graph_note[0] == 's')
    fprintf(f, "{\"skipped\": \"%s\"}", graph_note + strlen("skipped: "));
  else
    fprintf(f, "{%s}", graph_note);
  fputs(",\n \"timing_us\": {", f);
  for (int i = 0; i < NSIZES; i++) fprintf(f, "%s\"%ld\": %.2f", i ? ", " : "", TIMED_BYTES[i], timed_us[i]);
  fprintf(f, "}, \"iters\": %d, \"wall_s\": %.3f}\n", job.iters, wall_s);
  if (fclose(f) != 0 || rename(tmp, path) != 0) die("cannot write %s: %s", path, strerror(errno));
}

static void run_job(void) {
  const char *err = load_nccl();
  if (err) die("cannot load NCCL: %s", err);
  if ((err = load_cuda())) die("cannot load the CUDA runtime: %s", err);
  int version = 0;
  NCCL(ncclGetVersion(&version));
  char boot[4096];
  snprintf(boot, sizeof(boot), "%s/bootstrap", job.dir);
  if (mkdir(boot, 0755) != 0 && errno != EEXIST) die("cannot make %s: %s", boot, strerror(errno));
  double t0 = now_s();
  CUDA(cudaSetDevice(job.device));
  CUDA(cudaStreamCreate(&job.stream));
  CUDA(cudaMalloc(&job.send, BUF_BYTES));
  CUDA(cudaMalloc(&job.recv, BUF_BYTES));
  CUDA(cudaMemset(job.send, 0, BUF_BYTES));
  ncclComm_t world = init_comm("world");
  mix(world, "world");
  send_recv(world);
  graph_replays(world);
  timed(world);
  ncclComm_t split;
  NCCL(ncclCommSplit(world, 0, job.world - 1 - job.rank, &split, NULL));
  split_ops(split);
  churn(world);
  for (int i = 0; i < 3; i++) all_reduce(world, TAIL_BYTES, "world");
  stream_sync();
  sleep_ms(20);
  NCCL(ncclCommDestroy(split));
  NCCL(ncclCommDestroy(world));
  CUDA(cudaFree(job.send));
  CUDA(cudaFree(job.recv));
  CUDA(cudaStreamDestroy(job.stream));
  write_manifest(version, now_s() - t0);
  printf("gpu_nccl_job rank %d: done in %.1f s; AllReduce us: %.1f %.1f %.1f\n", job.rank, now_s() - t0,
         timed_us[0], timed_us[1], timed_us[2]);
}

static int int_arg(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) die("%s needs a value", argv[*i]);
  char *end;
  long v = strtol(argv[++*i], &end, 10);
  if (*end || v < 0 || v > 1000000) die("%s: not a count: %s", argv[*i - 1], argv[*i]);
  return (int)v;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--probe")) return probe();
  int have_rank = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--rank")) {
      job.rank = int_arg(argc, argv, &i);
      have_rank = 1;
    } else if (!strcmp(argv[i], "--world")) {
      job.world = int_arg(argc, argv, &i);
    } else if (!strcmp(argv[i], "--device")) {
      job.device = int_arg(argc, argv, &i);
    } else if (!strcmp(argv[i], "--churn")) {
      job.churn = int_arg(argc, argv, &i);
    } else if (!strcmp(argv[i], "--iters")) {
      job.iters = int_arg(argc, argv, &i);
    } else if (!strcmp(argv[i], "--no-graph")) {
      job.graphs = 0;
    } else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
      job.dir = argv[++i];
    } else {
      die("unknown argument %s (see the comment at the top of gpu_nccl_job.c)", argv[i]);
    }
  }
  if (!have_rank || !job.dir || job.world < 2 || job.world > MAX_WORLD || job.rank >= job.world ||
      job.iters < 1)
    die("usage: gpu_nccl_job --probe | --rank R --world N --dir DIR [--device D] [--churn C] "
        "[--iters I] [--no-graph]");
  run_job();
  return 0;
}
