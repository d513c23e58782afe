/* The ring's C writer: header, CRC-32 (ISO-HDLC) and the commit protocol of schemas/ring.md §6. */

#include "ring_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "glibc_compat.h" /* after the declarations it renames */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/* Filled once: a later ring (another device) is created while the first one is written. */
static void crc_fill(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    crc_table[i] = c;
  }
}

static void crc_init(void) { pthread_once(&crc_once, crc_fill); }

static uint32_t crc32_iso(const uint8_t *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

static int mkdirs(const char *dir) {
  char path[512];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof(path)) return ENAMETOOLONG;
  memcpy(path, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (path[i] == '/' || path[i] == '\0') {
      char c = path[i];
      path[i] = '\0';
      if (mkdir(path, 0755) != 0 && errno != EEXIST) return errno;
      path[i] = c;
    }
  }
  return 0;
}

/* The header's job id: as is up to 48 bytes; else its first 39 bytes, '~' and the 8 hex digits of
 * its FNV-1a 32-bit hash, so that every host shortens one id the same way. */
static void put_job_id(uint8_t *dst, const char *job_id) {
  size_t n = job_id ? strlen(job_id) : 0;
  if (n <= 48) {
    if (n) memcpy(dst, job_id, n);
    return;
  }
  uint32_t h = 0x811C9DC5u;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)job_id[i]) * 0x01000193u;
  char tail[10];
  snprintf(tail, sizeof(tail), "~%08x", h);
  memcpy(dst, job_id, 39);
  memcpy(dst + 39, tail, 9);
}

int myc_ring_create(myc_ring_t *ring, const char *dir, const char *name, uint32_t nslots,
                    int32_t rank, int32_t local_rank, int64_t created_ns, const char *job_id) {
  char final_path[768], tmp_path[800];
  crc_init();
  if (nslots < 2) return EINVAL;
  int err = mkdirs(dir);
  if (err) return err;
  snprintf(final_path, sizeof(final_path), "%s/%s", dir, name);
  snprintf(tmp_path, sizeof(tmp_path), "%s.init", final_path);
  size_t size = 128 + (size_t)nslots * 64;
  int fd = open(tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  if (ftruncate(fd, (off_t)size) != 0) {
    err = errno;
    close(fd);
    unlink(tmp_path);
    return err;
  }
  uint8_t *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = base == MAP_FAILED ? errno : 0;
  close(fd);
  if (err) {
    unlink(tmp_path);
    return err;
  }
  memcpy(base, "MYCRING1", 8);
  myc_put_u32(base + 8, 4); /* layout version 4 (schemas/ring.md §4c) */
  myc_put_u32(base + 12, 128);
  myc_put_u32(base + 16, 64);
  myc_put_u32(base + 20, nslots);
  myc_put_u32(base + 24, (uint32_t)getpid());
  myc_put_u32(base + 28, (uint32_t)rank);
  myc_put_u64(base + 32, (uint64_t)created_ns);
  myc_put_u32(base + 40, (uint32_t)local_rank);
  put_job_id(base + 80, job_id);
  if (rename(tmp_path, final_path) != 0) {
    err = errno;
    munmap(base, size);
    unlink(tmp_path);
    return err;
  }
  ring->base = base;
  ring->nslots = nslots;
  ring->next = 0;
  ring->size = size;
  return 0;
}

void myc_ring_commit(myc_ring_t *ring, uint8_t buf[64]) {
  uint64_t n = ring->next++;
  uint8_t *slot = ring->base + 128 + (n % ring->nslots) * 64;
  myc_put_u64(buf, 2 * n + 2);
  myc_put_u32(buf + 12, 0);
  myc_put_u32(buf + 12, crc32_iso(buf, 64));
  __atomic_store_n((uint64_t *)(void *)slot, 2 * n + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  memcpy(slot + 8, buf + 8, 56);
  __atomic_store_n((uint64_t *)(void *)slot, 2 * n + 2, __ATOMIC_RELEASE);
  __atomic_store_n((uint64_t *)(void *)(ring->base + 64), n + 1, __ATOMIC_RELEASE);
}

void myc_ring_close(myc_ring_t *ring) {
  if (ring->base) munmap(ring->base, ring->size);
  ring->base = NULL;
}
