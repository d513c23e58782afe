/* C writer of the Mycroft trace ring (schemas/ring.md, layout version 4). Single writer. */
#ifndef MYCROFT_RING_WRITER_H
#define MYCROFT_RING_WRITER_H

#include <stddef.h>
#include <stdint.h>

enum {
  MYC_KIND_COMM = 1,
  MYC_KIND_OP_ISSUED = 2,
  MYC_KIND_FLOW_PROGRESS = 3,
  MYC_KIND_FLOW_DONE = 4,
  MYC_KIND_OP_DONE = 5,
  MYC_KIND_BEAT = 6,
  MYC_KIND_COMM_RANKS = 7,
  MYC_KIND_COMM_NAME = 8,
  MYC_KIND_FLOW_STEPS = 9, /* layout version 3 */
};

typedef struct {
  uint8_t *base;
  uint64_t nslots;
  uint64_t next; /* next record number */
  size_t size;
} myc_ring_t;

/* Create `dir/name` (via `name.init` and rename) with `nslots` slots; 0 on success, else errno.
 * `job_id` (NULL or "": unknown) goes to header bytes 80..127 (schemas/ring.md §2). */
int myc_ring_create(myc_ring_t *ring, const char *dir, const char *name, uint32_t nslots,
                    int32_t rank, int32_t local_rank, int64_t created_ns, const char *job_id);
/* Commit one 64-byte slot whose bytes 8..63 are in `buf` (seq and crc are filled here). */
void myc_ring_commit(myc_ring_t *ring, uint8_t buf[64]);
void myc_ring_close(myc_ring_t *ring);

static inline void myc_put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void myc_put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void myc_put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

#endif
