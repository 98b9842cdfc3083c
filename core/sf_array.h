/*
 * sf_array.h - the one way shardfs grows an array: doubling, overflow-safe,
 * capped. Every list built from untrusted input (manifest shards, journal
 * entries, directory scans) grows through here, so a hostile count fails
 * with -SF_ETOOBIG or -ENOMEM instead of wrapping a size.
 */
#ifndef SF_ARRAY_H
#define SF_ARRAY_H

#include <stddef.h>

/*
 * Make room for one more element in the array *arrp (a pointer to any
 * element pointer, e.g. &list->items), which holds `n` elements in `*cap`
 * slots of `elem` bytes. When n < *cap nothing changes. Otherwise the
 * capacity doubles (`first` slots when it was 0), clamped to `max` slots
 * (0: no cap beyond what size_t can address), and the array is reallocated.
 * Returns 0; -SF_ETOOBIG when n >= max; -ENOMEM when the allocation fails
 * or the byte size would overflow. On failure *arrp and *cap are unchanged
 * and still owned by the caller.
 */
int sf_array_grow(void *arrp, size_t n, size_t *cap, size_t elem,
		  size_t first, size_t max);

#endif
