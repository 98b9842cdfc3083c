/*
 * sf_manifest.h - the "shardfs/1" manifest: parse, validate, build, dump.
 *
 * A struct sf_manifest is a plain description of one checkpoint: its
 * tensors (what tensors/ shows) and files (plain files at the checkpoint
 * root, always U8 with one dimension), each with the shards that hold its
 * bytes. Everything reachable from a manifest is owned by it and freed by
 * sf_manifest_destroy(); pointers into it stay valid until then (and, for a
 * manifest being built, until the next sf_manifest_add_* call).
 *
 * Parsing trusts nothing: every size, count and string is bounded (the
 * SF_MAX_* limits below), names and paths are checked, sizes are computed
 * without overflow, every shard must lie inside its tensor with the right
 * byte count and checksum count, and every tensor must be fully covered.
 */
#ifndef SF_MANIFEST_H
#define SF_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"
#include "sf_dtype.h"

#define SF_FORMAT "shardfs/1"
#define SF_MAX_MANIFEST_BYTES (256u << 20) /* manifest.json size */
#define SF_MAX_TENSORS (1u << 20)          /* tensors + files per checkpoint */
#define SF_MAX_SHARDS (1u << 16)           /* shards per tensor */
#define SF_MAX_NAME 1024                   /* bytes in a tensor name or path */
#define SF_MAX_COMPONENT 255               /* bytes in one path component */
#define SF_MAX_WORLD (1u << 16)            /* ranks */

struct sf_shard {
	uint32_t rank;          /* < world_size */
	bool flat;              /* flat byte range, else a box */
	struct sf_box box;      /* !flat: offsets/lengths in elements */
	uint64_t flat_off;      /* flat: byte offset in the flattened tensor */
	uint64_t flat_len;      /* flat: byte length */
	char *file;             /* payload path relative to the checkpoint dir */
	uint64_t file_offset;   /* bytes */
	uint64_t nbytes;        /* payload bytes = box bytes or flat_len */
	uint64_t *xxh3;         /* nblocks checksums (owned) */
	uint64_t nblocks;       /* sf_nblocks(nbytes, block_size) */
};

struct sf_tensor {
	char *name;             /* '/'-separated, validated */
	enum sf_dtype dtype;
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
	uint64_t nbytes;        /* numel * itemsize, overflow-checked */
	struct sf_shard *shards;
	size_t nshards;
	size_t cap_shards;      /* builder bookkeeping */
};

struct sf_manifest {
	char *name;             /* checkpoint name */
	uint32_t world_size;    /* 1..SF_MAX_WORLD */
	uint64_t block_size;    /* SF_MIN_BLOCK_SIZE..SF_MAX_BLOCK_SIZE */
	struct sf_tensor *tensors; /* sorted by strcmp(name) once finished */
	size_t ntensors;
	struct sf_tensor *files;   /* root files, sorted */
	size_t nfiles;
	size_t cap_tensors, cap_files; /* builder bookkeeping */
};

/*
 * Parse and fully validate manifest JSON (`len` bytes, need not be
 * NUL-terminated). On success *out is a new manifest (caller destroys).
 * On failure returns -SF_EMANIFEST (or -SF_EGAP, -SF_ETOOBIG, -ENOMEM) and
 * writes a one-line reason naming the offending field into err.
 */
int sf_manifest_parse(const char *json, size_t len, struct sf_manifest **out,
		      char *err, size_t errlen);

/*
 * As sf_manifest_parse, but for one rank's part of an uncommitted
 * checkpoint (sf_wckpt_export_part): every check except coverage.
 */
int sf_manifest_parse_part(const char *json, size_t len,
			   struct sf_manifest **out, char *err, size_t errlen);

void sf_manifest_destroy(struct sf_manifest *m); /* accepts NULL */

/* Binary search a finished manifest. NULL if absent. Borrowed pointer. */
const struct sf_tensor *sf_manifest_find(const struct sf_manifest *m,
					 const char *name);
const struct sf_tensor *sf_manifest_find_file(const struct sf_manifest *m,
					      const char *name);

/* --- building (writers, commit) --- */

/* A new empty manifest. Returns NULL on ENOMEM or bad arguments. */
struct sf_manifest *sf_manifest_new(const char *name, uint32_t world_size,
				    uint64_t block_size);

/* Add a tensor (is_file: a root file, dtype must be U8 and ndim 1). Checks
 * the name and the shape. *out (borrowed) is valid until the next add. */
int sf_manifest_add_tensor(struct sf_manifest *m, bool is_file,
			   const char *name, enum sf_dtype dtype,
			   unsigned ndim, const uint64_t *shape,
			   struct sf_tensor **out);

/* Append a deep copy of *s to t (checks it lies inside t and that nbytes
 * and nblocks agree). */
int sf_tensor_add_shard(const struct sf_manifest *m, struct sf_tensor *t,
			const struct sf_shard *s);

/* Sort, check for duplicate names and check coverage of every tensor. */
int sf_manifest_finish(struct sf_manifest *m, char *err, size_t errlen);

/* 0 if every byte of t is covered by some shard; else -SF_EGAP with the
 * first uncovered element index in err. Bounded work (-SF_ETOOBIG if the
 * shard arrangement is too complex to decide). */
int sf_tensor_check_coverage(const struct sf_tensor *t, char *err,
			     size_t errlen);

/* Validate a tensor name ('/'-separated components; no empty, "." or ".."
 * components, no control characters, no '@', at most SF_MAX_NAME bytes). */
bool sf_name_valid(const char *name);
/* Validate a relative payload path (same rules, '@' allowed). */
bool sf_relpath_valid(const char *path);

/* Serialize a finished manifest as JSON text (NUL-terminated, malloc'd,
 * caller frees) in the layout of docs/FORMAT.md. */
int sf_manifest_dump(const struct sf_manifest *m, char **out, size_t *len);

/* JSON list of a tensor's shards for user.shardfs.shards (no checksums).
 * malloc'd, caller frees. */
int sf_tensor_shards_json(const struct sf_tensor *t, char **out, size_t *len);

#endif
