/*
 * sf_gen_plan.h - the plan of a `shardctl gen` checkpoint (sf_gen_plan.c):
 * its tensors and root files with the geometry of their shards, no tensor
 * bytes. Shared by sf_gen.c, which writes what the plan says. A plan owns
 * its tensors, their names, blobs and shards; sf_gen_plan_clear frees them.
 */
#ifndef SF_GEN_PLAN_H
#define SF_GEN_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_gen.h"
#include "sf_model.h"

struct gen_tensor {
	char *name;               /* owned */
	bool is_file;             /* a root file (U8, 1-d), bytes in blob */
	enum sf_dtype dt;
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
	uint64_t nbytes;
	uint64_t key;             /* sf_gen_key(seed, name) */
	char *blob;               /* is_file: the file's bytes (owned) */
	struct sf_shard *shards;  /* geometry from the plan; file, offsets and
				   * checksums filled by the writer (owned) */
	size_t nshards, cap;
};

struct gen_plan {
	struct gen_tensor *t;     /* owned */
	size_t n, cap;
	uint64_t tensor_bytes;    /* sum of nbytes of non-file tensors */
	/* model hyper-parameters, for config.json */
	uint64_t hidden, inter, vocab, layers, heads, kv_heads, max_pos;
};

/* Free everything p owns and zero it. */
void sf_gen_plan_clear(struct gen_plan *p);
/* The plan of o's layout: for "many", o->ntensors small tensors; else the
 * largest hidden size whose plan stays within o->size (the smallest model
 * if none does). 0 or a negative error. */
int sf_gen_plan_for_size(struct gen_plan *p, const struct sf_gen_opts *o);
/* Add config.json and tokenizer_config.json (o->blobs) as root files. */
int sf_gen_add_blobs(struct gen_plan *p, const struct sf_gen_opts *o);

#endif
