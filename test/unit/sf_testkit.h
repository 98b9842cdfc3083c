/*
 * sf_testkit.h - random sharded checkpoints held in memory, and their naive
 * model, shared by test_engine and test_views.
 *
 * A kit is one checkpoint: a finished struct sf_model built through the
 * public builder, an in-memory struct sf_source whose payload "files" hold
 * the shard bytes, and for every tensor the whole tensor bytes as one array
 * (the model every read is compared against). Shard bytes are cut out of
 * the model with a naive element loop and checksummed with XXH3_64bits per
 * block, independently of core.
 */
#ifndef SF_TESTKIT_H
#define SF_TESTKIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"
#include "sf_engine.h"
#include "sf_model.h"

#define KIT_MAX_FILES 64      /* payload files per kit */
#define KIT_MAX_TENSOR_BYTES (160u << 10) /* model bytes per tensor */

/* One payload file of the in-memory source. */
struct kit_file {
	char name[64];        /* "rank-NNNNN/data-K.bin" */
	uint32_t rank;
	unsigned char *data;  /* owned; len bytes */
	size_t len, cap;
	bool missing;         /* reads answer -SF_ESHORT as if it were gone */
};

/* The model of one tensor, in manifest order once the kit is finished. */
struct kit_tensor {
	const struct sf_tensor *t;  /* borrowed from the kit's manifest */
	unsigned char *bytes;       /* whole tensor, row-major (owned) */
	size_t itemsize;
	bool exclusive;             /* every byte in exactly one shard */
};

struct kit {
	struct sf_model *m;      /* owned, finished */
	struct sf_ckpt_ref ref;     /* dir "/mem/NAME", name NAME */
	char dir[96], name[32];
	struct kit_file files[KIT_MAX_FILES];
	size_t nfiles;
	struct kit_tensor *tensors; /* m->ntensors entries */
	size_t ntensors;
	struct sf_source src;       /* ops = the in-memory source, ctx = kit */
	_Atomic uint64_t source_reads;  /* calls to src.ops->read */
	_Atomic uint64_t source_bytes;  /* bytes they returned */
};

/* Build a random kit of ntensors tensors (block_size 4096 or 8192) from
 * its own generator seeded with `seed` (callers pass sf_rand(), so the
 * program's printed seed replays it). With exclusive, no tensor has
 * overlapping shards. Returns 0 or a negative error (with a line on
 * stderr). Caller frees with kit_destroy(). */
int kit_create(uint64_t seed, size_t ntensors, bool exclusive,
	       struct kit **out);

/* kit_create with the shapes foreign formats bring: with KIT_STRIDED about
 * half the box shards are stored strided (their dimensions in a random
 * order, and sometimes with unused elements between rows, as a chunk saved
 * from a transposed or sliced view is: sf_shard.strides); with
 * KIT_UNVERIFIED about a third of the shards carry no checksums. */
#define KIT_EXCLUSIVE 1u
#define KIT_STRIDED 2u
#define KIT_UNVERIFIED 4u
int kit_create_ex(uint64_t seed, size_t ntensors, unsigned flags,
		  struct kit **out);
void kit_destroy(struct kit *k); /* accepts NULL */

/*
 * The naive byte map of box b of a tensor: map[j] = byte of the flattened
 * tensor that is byte j of the box's own row-major bytes. *out is malloc'd
 * (caller frees), *n its length. view NULL: the identity over the tensor.
 */
int kit_view_map(const struct sf_tensor *t, const struct sf_box *view,
		 uint64_t **out, uint64_t *n);

/* A random non-empty box of t (t must have bytes), drawn from *rng. */
void kit_rand_view(const struct sf_tensor *t, struct sf_box *view,
		   uint64_t *rng);

/* For shard s of t: the tensor byte of payload byte j (naive). */
uint64_t kit_shard_byte(const struct sf_tensor *t, const struct sf_shard *s,
			uint64_t j);

/* The kit file holding shard s, or NULL. */
struct kit_file *kit_file_of(struct kit *k, const struct sf_shard *s);

#endif
