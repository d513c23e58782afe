/* Types shared by every NCCL profiler ABI version Mycroft exports.
 *
 * Declared from NCCL's documented profiler plugin interface
 * (plugins/profiler/README.md): plugins carry their own declarations. */
#ifndef MYCROFT_NCCL_COMMON_H
#define MYCROFT_NCCL_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5,
} ncclDebugLogLevel;

#define MYC_NCCL_INIT_FLAG 0x1UL /* NCCL_INIT subsystem */

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char *file,
                                  int line, const char *fmt, ...);

/* Event type bits (ncclProfile*). */
enum {
  MYC_EV_GROUP = 1 << 0,
  MYC_EV_COLL = 1 << 1,
  MYC_EV_P2P = 1 << 2,
  MYC_EV_PROXY_OP = 1 << 3,
  MYC_EV_PROXY_STEP = 1 << 4,
  MYC_EV_PROXY_CTRL = 1 << 5,
  MYC_EV_KERNEL_CH = 1 << 6,
  MYC_EV_NET_PLUGIN = 1 << 7,
  MYC_EV_GROUP_API = 1 << 8,
  MYC_EV_COLL_API = 1 << 9,
  MYC_EV_P2P_API = 1 << 10,
  MYC_EV_KERNEL_LAUNCH = 1 << 11,
  MYC_EV_CE_COLL = 1 << 12,
  MYC_EV_CE_SYNC = 1 << 13,
  MYC_EV_CE_BATCH = 1 << 14,
};

/* Event states (ncclProfilerEventState_t, one enum for v4..v6). */
typedef enum {
  MYC_ST_SEND_GPU_WAIT = 8,   /* proxy posted a slot to the GPU */
  MYC_ST_SEND_WAIT = 9,       /* isend returned a request: transmitted, transSize fresh */
  MYC_ST_RECV_WAIT = 10,      /* irecv posted */
  MYC_ST_RECV_FLUSH_WAIT = 11, /* test: data arrived, transSize fresh */
  MYC_ST_RECV_GPU_WAIT = 12,  /* data handed to the GPU */
  MYC_ST_PROXY_CTRL_IDLE = 13,
  MYC_ST_PROXY_CTRL_APPEND_END = 18,
  MYC_ST_PROXY_OP_IN_PROGRESS = 19,
  MYC_ST_SEND_PEER_WAIT = 20, /* data complete in the FIFO, before isend (repeats on retry) */
  MYC_ST_NET_PLUGIN_UPDATE = 21,
  MYC_ST_KERNEL_CH_STOP = 22, /* GPU timer of the channel's end in args->kernelCh.pTimer */
  MYC_ST_GROUP_START_API_STOP = 23,
  MYC_ST_GROUP_END_API_START = 24,
} mycNcclEventState_t;

typedef int ncclProfilerEventState_v4_t;
typedef int ncclProfilerEventState_v5_t;
typedef int ncclProfilerEventState_v6_t;

#endif
