/*
 * sf_engine_vmap.h - the engine's maps of verified blocks: per shard read,
 * a bit per block that matched its XXH3, with the identity of the shard's
 * file (sf_source_ops.file_id) when it did. Engine-private: only
 * sf_engine.c uses them (the rules of when a bit may be set and trusted
 * are there). Thread-safe (own lock, never held while calling out).
 */
#ifndef SF_ENGINE_VMAP_H
#define SF_ENGINE_VMAP_H

#include <stdbool.h>
#include <stdint.h>

#include "sf_model.h"

struct sf_vmaps;

/* An empty set of maps. 0 or -ENOMEM. */
int sf_vmaps_create(struct sf_vmaps **out);
void sf_vmaps_destroy(struct sf_vmaps *v); /* accepts NULL */

/* Was block idx of shard s (of checkpoint ck: a key, never dereferenced)
 * noted verified while its file had identity id? */
bool sf_vmaps_test(struct sf_vmaps *v, const void *ck,
		   const struct sf_shard *s, uint64_t idx, uint64_t id);

/* Note block idx of s verified while its file had identity id (a map kept
 * for another identity starts over). Past SF_VMAPS_MAX shards, or out of
 * memory, nothing is noted (the block is then hashed again next time). */
void sf_vmaps_set(struct sf_vmaps *v, const void *ck,
		  const struct sf_shard *s, uint64_t idx, uint64_t id);
#define SF_VMAPS_MAX (1u << 16)

/* Drop the maps of ck (every map when ck is NULL). Accepts v NULL. */
void sf_vmaps_forget(struct sf_vmaps *v, const void *ck);

#endif
