/*
 * sf_engine_map.h - touching a file mapping without dying of it: the
 * engine's guarded hash (and copy) of a block that lies in a source
 * mapping (sf_source_ops.map, map_live). Engine-private: only sf_engine.c calls it.
 */
#ifndef SF_ENGINE_MAP_H
#define SF_ENGINE_MAP_H

#include <stddef.h>
#include <stdint.h>

/* Install the process's SIGBUS handler that sf_map_hash needs (once; later
 * calls return the first result). 0, or a negative errno: then mapped
 * blocks must not be used. */
int sf_map_guard_init(void);

/* Pre-fault the len bytes at p (a file mapping) without touching them from
 * user space: MADV_POPULATE_READ, which fails (-EFAULT, -EIO) where an
 * access would raise SIGBUS. 0 or a negative errno; -EINVAL where the
 * kernel lacks it (then the hash faults the pages in itself). */
int sf_map_populate(const void *p, size_t len);

/*
 * *out = XXH3 of the len bytes at p (inside a file mapping). Returns 0, or
 * -EFAULT when touching them raised SIGBUS (the file shrank under the
 * mapping, or a page could not be read): the signal is caught on this
 * thread and nothing else changed. sf_map_guard_init() must have
 * succeeded. A SIGBUS outside such a call, or at another address, goes to
 * the handler that was there before (by default: the process dies).
 */
int sf_map_hash(const void *p, size_t len, uint64_t *out);

/* Copy the len bytes at src (inside a file mapping) to dst under the same
 * guard: 0, or -EFAULT when touching them raised SIGBUS (dst then holds
 * some of them). For mappings without a lease (map_live), whose file may
 * shrink under them at any time. */
int sf_map_copy(void *dst, const void *src, size_t len);

#endif
