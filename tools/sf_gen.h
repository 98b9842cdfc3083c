/*
 * sf_gen.h - deterministic test checkpoints for `shardctl gen`.
 *
 * sf_gen_checkpoint() writes a committed "shardfs/1" checkpoint through the
 * core writer (sf_writer.h): realistic tensor sets (a Llama-shaped model,
 * optionally with optimizer state and odd dtypes) sharded the way training
 * jobs shard them (column/row-parallel boxes, FSDP flat ranges, replicas).
 * Every tensor byte is a pure function of (seed, tensor name, element
 * index), so a reader can recompute any byte; with ref_dir set the same
 * values are also written unsharded through a separate, deliberately naive
 * code path (no box math, no core writer) for tests to compare against.
 *
 * Memory stays bounded whatever the size: shard bytes are generated in
 * 1 MiB chunks straight into the payload writer.
 *
 * Sparse checkpoints (opts.sparse) are for scale tests: every tensor byte
 * is 0, payload files are sized with ftruncate (holes, no data written)
 * and every checksum is the XXH3 of zero bytes (computed once per block
 * length), so a 2 TB checkpoint takes seconds and almost no disk. Root
 * files still hold their real bytes.
 */
#ifndef SF_GEN_H
#define SF_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_dtype.h"

#define SF_GEN_MAX_RANKS 4096u
#define SF_GEN_MIN_SIZE (64u << 10)              /* smallest --size */
#define SF_GEN_MAX_SIZE (UINT64_C(1) << 42)      /* 4 TiB, largest --size */

enum sf_gen_layout {
	SF_GEN_MIXED = 0,     /* llama + optimizer state + odd dtypes + blobs */
	SF_GEN_LLAMA,         /* tensor/column/row-parallel boxes, replicated norms */
	SF_GEN_FSDP,          /* every tensor cut into N flat byte ranges */
	SF_GEN_REPLICATED,    /* every tensor whole on every rank */
	SF_GEN_MANY,          /* ntensors small tensors, each cut into one
			       * row box per rank (scale tests) */
};

#define SF_GEN_MANY_DEFAULT 1000u                /* tensors of "many" */
#define SF_GEN_MAX_TENSORS ((1u << 20) - 2)      /* largest --tensors (with
						  * the two blobs: SF_MAX_TENSORS) */

struct sf_gen_opts {
	enum sf_gen_layout layout;
	uint32_t ranks;        /* world size, 1..SF_GEN_MAX_RANKS */
	uint64_t size;         /* approximate total tensor bytes */
	enum sf_dtype dtype;   /* dtype of the model weights */
	uint64_t seed;
	uint64_t block_size;   /* SF_MIN_BLOCK_SIZE..SF_MAX_BLOCK_SIZE */
	const char *ref_dir;   /* NULL: no unsharded reference */
	bool blobs;            /* write config.json and tokenizer_config.json */
	uint64_t ntensors;     /* "many": tensors, 1..SF_GEN_MAX_TENSORS (0:
				* SF_GEN_MANY_DEFAULT); other layouts: 0 */
	bool sparse;           /* tensor bytes are all zero, payload files
				* made with ftruncate (holes); no ref_dir */
	/* NULL, or called after every chunk written (payloads, then the
	 * reference) with the bytes written so far and the total */
	void (*progress)(void *arg, uint64_t done, uint64_t total);
	void *progress_arg;
};

struct sf_gen_stats {
	size_t ntensors;        /* entries of manifest "tensors" */
	size_t nfiles;          /* entries of manifest "files" */
	size_t nshards;         /* shards of tensors and files */
	uint64_t tensor_bytes;  /* sum of tensor sizes (files excluded) */
	uint64_t payload_bytes; /* bytes written to payload files */
};

/* Why o cannot be generated (options that do not go together), or NULL.
 * Static string. */
const char *sf_gen_opts_problem(const struct sf_gen_opts *o);

/* "mixed", "llama", "fsdp", "replicated", "many" -> 0, or -EINVAL. */
int sf_gen_layout_parse(const char *s, enum sf_gen_layout *out);
/* Static name of a layout. */
const char *sf_gen_layout_name(enum sf_gen_layout l);

/*
 * Write the checkpoint into ckpt_dir (created; its basename is the
 * checkpoint name). A manifest.json already there is removed first, so an
 * interrupted run never leaves a stale checkpoint that looks committed.
 * Returns 0 and fills *st (may be NULL), or a negative error after logging
 * what failed.
 */
int sf_gen_checkpoint(const char *ckpt_dir, const struct sf_gen_opts *o,
		      struct sf_gen_stats *st);

/*
 * The generator's value function: write the itemsize bytes (little-endian)
 * of element idx of tensor `name` into out. Floats are finite values in
 * [-1, 1) (F8 types: any finite code), integers small, BOOL 0 or 1.
 */
void sf_gen_value(enum sf_dtype dt, uint64_t seed, const char *name,
		  uint64_t idx, uint8_t *out);
/* The same in two steps (sf_gen_value.c): the key of tensor name, then
 * element idx of the tensor with that key. */
uint64_t sf_gen_key(uint64_t seed, const char *name);
void sf_gen_elem(enum sf_dtype dt, uint64_t key, uint64_t idx, uint8_t *out);

#endif
