/*
 * sf_model.h - the checkpoint model: what a checkpoint holds, whatever
 * format wrote it. The format adapters (core/formats/) build one from the
 * files they read; the engine, the views, the mount and the tools use it
 * and never learn a format.
 *
 * A struct sf_model is one checkpoint: its tensors (what tensors/ shows),
 * its files (plain files at the checkpoint root, always U8 with one
 * dimension) and its objects (non-tensor items as stored, objects/NAME:
 * U8, one dimension), each with the shards that hold its bytes. A shard is
 * a box of the tensor (offsets and lengths in elements) or a flat byte
 * range of the row-major flattened tensor, found at (file, file_offset,
 * nbytes); a box's payload is its elements in row-major order of the box
 * itself, unless the shard has strides (a foreign chunk saved from a
 * transposed or sliced view: box element (i_0..i_n) lies at payload byte
 * sum(i_d * strides[d]) * itemsize). A shard may carry XXH3 checksums of
 * its payload in blocks of the model's block_size; shards without them are
 * served unverified. A shard's bytes may be stored coded (compressed):
 * its payload is then a range of the decoded stream (sf_codec.h), and
 * checksums cover the decoded payload.
 *
 * Ownership: everything reachable from a model is owned by it and freed by
 * sf_model_destroy(); pointers into it stay valid until then (and, for a
 * model being built, until the next sf_model_add_* call on it). A model's
 * shards own nothing themselves: their boxes, strides, checksums and file
 * names live in the model's pool (one string per distinct file, shared by
 * its shards), so a million shards cost about 160 bytes each.
 *
 * A shard outside a model is a builder's: the one passed to
 * sf_tensor_add_shard borrows everything it points to (copied into the
 * model); the write side's own records (sf_payload_end,
 * sf_manifest_get_shard, sf_shard_set_box) own their file, checksums and
 * box, and are freed with sf_shard_clear.
 *
 * Validation trusts nothing: every size, count and string is bounded (the
 * SF_MAX_* limits below), names and paths are checked, sizes are computed
 * without overflow, every shard must lie inside its tensor with the right
 * byte count (and checksum count, when it has checksums), and every tensor
 * must be fully covered (by disjoint shards in a foreign format's model:
 * sf_overlap_rule). The validator's pieces are exported for format
 * adapters, with one-line reasons that name the entry, the shard and the
 * field.
 */
#ifndef SF_MODEL_H
#define SF_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"
#include "sf_codec.h"
#include "sf_dtype.h"

#define SF_MAX_MANIFEST_BYTES (256u << 20) /* a manifest's or index's JSON text */
#define SF_MAX_TENSORS (1u << 20)          /* tensors + files + objects per checkpoint */
#define SF_MAX_SHARDS (1u << 16)           /* shards per tensor */
#define SF_MAX_NAME 1024                   /* bytes in a tensor name or path */
#define SF_MAX_COMPONENT 255               /* bytes in one path component */
#define SF_MAX_WORLD (1u << 16)            /* ranks */
#define SF_MAX_FORMAT 64                   /* bytes of a format description */

#define SF_MAX_ST_HEADER (100u << 20) /* safetensors' own header limit */

/* The entries a checkpoint's directory shows beside its root files
 * (SPEC 3): no root file may take one of these names. */
#define SF_VIEW_TENSORS "tensors"            /* tensors/NAME, slices NAME@... */
#define SF_VIEW_NPY "npy"                    /* npy/NAME.npy */
#define SF_VIEW_OBJECTS "objects"            /* objects/NAME: non-tensor items */
#define SF_VIEW_SAFETENSORS "model.safetensors"
#define SF_VIEW_MANIFEST "manifest.json"     /* as stored, or synthesized */

/* Is name (len bytes) one of the view names above? */
bool sf_view_name_reserved(const char *name, size_t len);

struct sf_shard {
	uint32_t rank;          /* < world_size: the rank whose store holds file */
	bool flat;              /* flat byte range, else a box */
	const uint64_t *off;    /* box: the entry's ndim element offsets; NULL
				 * when flat or ndim is 0 (sf_shard_box) */
	const uint64_t *len;    /* box: its ndim element lengths, likewise */
	uint64_t flat_off;      /* flat: byte offset in the flattened tensor */
	uint64_t flat_len;      /* flat: byte length */
	uint64_t *strides;      /* box only, NULL: row-major contiguous; else
				 * ndim element strides */
	char *file;             /* payload path relative to the checkpoint dir */
	uint64_t file_offset;   /* bytes */
	uint64_t nbytes;        /* payload bytes: the box's or flat range's
				 * bytes, or (strides) the span they reach */
	uint64_t *xxh3;         /* nblocks checksums, NULL: unverified */
	uint64_t nblocks;       /* sf_nblocks(nbytes, block_size), or 0 */
	enum sf_codec codec;    /* SF_CODEC_NONE: the payload lies in file at
				 * file_offset; else file holds at file_offset
				 * a coded stream (sf_codec.h) and the payload
				 * is its decoded bytes from decoded_off */
	uint64_t stored_len;    /* coded: stream bytes in file, <= SF_MAX_STORED */
	uint64_t decoded_len;   /* coded: bytes it decodes to, <= SF_MAX_DECODED */
	uint64_t decoded_off;   /* coded: the payload's first decoded byte;
				 * decoded_off + nbytes <= decoded_len */
};

/* A copy of a shard's box that the overlap rule (sf_overlap_rule) took
 * out of its tensor: the engine never reads it; shardctl verify compares
 * its payload with the one served. Both structs point into the model's
 * pool, like its shards. */
struct sf_replica {
	struct sf_shard kept;   /* the copy served (as it was when the rule ran) */
	struct sf_shard copy;   /* the copy left out */
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
	struct sf_replica *replicas; /* owned; foreign formats only: the exact
				 * replicas sf_overlap_rule left out, never
				 * read by the engine (verify's) */
	size_t nreplicas, cap_replicas;
};

/* Which list of a model an entry belongs to. */
enum sf_entry_kind {
	SF_ENTRY_TENSOR,        /* tensors/NAME */
	SF_ENTRY_FILE,          /* a plain file at the checkpoint root */
	SF_ENTRY_OBJECT,        /* objects/NAME: a non-tensor item as stored */
};

struct sf_model {
	char *name;             /* checkpoint name */
	char format[SF_MAX_FORMAT]; /* what wrote it, e.g. "shardfs/1",
				 * "torch-dcp" (user.shardfs.format) */
	uint32_t world_size;    /* 1..SF_MAX_WORLD */
	uint64_t block_size;    /* SF_MIN_BLOCK_SIZE..SF_MAX_BLOCK_SIZE: the
				 * checksum block, and the engine's cache block */
	struct sf_tensor *tensors; /* sorted by strcmp(name) once finished */
	size_t ntensors;
	struct sf_tensor *files;   /* root files, sorted */
	size_t nfiles;
	struct sf_tensor *objects; /* objects, sorted */
	size_t nobjects;
	size_t cap_tensors, cap_files, cap_objects; /* builder bookkeeping */
	struct sf_model_pool *pool; /* owned: what shards point into (sf_model.c) */
	char why[256];          /* the last reason the builder refused something */
};

/* --- building (format adapters, writers, commit) --- */

/* A new empty model (format "shardfs/1" until set). NULL on ENOMEM or bad
 * arguments. The caller destroys it. */
struct sf_model *sf_model_new(const char *name, uint32_t world_size,
			      uint64_t block_size);
void sf_model_destroy(struct sf_model *m); /* accepts NULL */

/* Add a tensor, or (is_file) a root file: dtype U8, one dimension. Checks
 * the name and the shape. *out (borrowed) is valid until the next add. On
 * failure the reason is in sf_model_why(m). -EINVAL, -SF_ETOOBIG, -ENOMEM. */
int sf_model_add_tensor(struct sf_model *m, bool is_file, const char *name,
			enum sf_dtype dtype, unsigned ndim,
			const uint64_t *shape, struct sf_tensor **out);
/* Would sf_model_add_tensor take this entry into an empty model? The same
 * checks of the name and the shape, with no model built (the writer asks
 * at every declaration). 0, -EINVAL, -SF_ETOOBIG. */
int sf_model_entry_check(bool is_file, const char *name, enum sf_dtype dtype,
			 unsigned ndim, const uint64_t *shape);
/* Add an object of nbytes bytes (U8, one dimension; named like a tensor).
 * As sf_model_add_tensor. */
int sf_model_add_object(struct sf_model *m, const char *name, uint64_t nbytes,
			struct sf_tensor **out);

/* Append a deep copy of *s to t (checks it lies inside t and that nbytes,
 * strides and checksums agree). On failure the reason is in
 * sf_model_why(m). */
int sf_tensor_add_shard(struct sf_model *m, struct sf_tensor *t,
			const struct sf_shard *s);

/* Append a copy of shard s that sf_shard_check already accepted for t
 * (a parser that judged it itself, with its own messages). 0, -SF_ETOOBIG
 * past SF_MAX_SHARDS (reason in sf_model_why), -ENOMEM. */
int sf_model_put_shard(struct sf_model *m, struct sf_tensor *t,
		       const struct sf_shard *s);

/* Remove the entry of that kind added last (with its shards): an adapter
 * that finds, after adding an entry, that it cannot show it. */
void sf_model_drop_last(struct sf_model *m, enum sf_entry_kind kind);

/* The reason of the builder's last refusal ("" when none). Borrowed. */
const char *sf_model_why(const struct sf_model *m);

/* Set m->format (truncated to SF_MAX_FORMAT - 1 bytes). */
void sf_model_set_format(struct sf_model *m, const char *format);

/* Sort, check for duplicate names and prefixes, and check coverage of
 * every entry. One-line reason in err. */
int sf_model_finish(struct sf_model *m, char *err, size_t errlen);
/* As sf_model_finish without the coverage check (one rank's part). */
int sf_model_finish_part(struct sf_model *m, char *err, size_t errlen);

/* Binary search a finished model. NULL if absent. Borrowed. */
const struct sf_tensor *sf_model_find(const struct sf_model *m,
				      const char *name);
const struct sf_tensor *sf_model_find_file(const struct sf_model *m,
					   const char *name);
const struct sf_tensor *sf_model_find_object(const struct sf_model *m,
					     const char *name);

/* Does every shard carry checksums (reads are verified)? */
bool sf_model_verified(const struct sf_model *m);

/* The box of box shard s of an entry of ndim dimensions, as a struct.
 * (Inline: the engine, which sf_model.c reaches through the views, uses
 * it; library files never call each other in a cycle.) */
static inline void sf_shard_box(const struct sf_shard *s, unsigned ndim,
				struct sf_box *out)
{
	out->ndim = ndim;
	for (unsigned d = 0; d < ndim && d < SF_MAX_NDIM; d++) {
		out->off[d] = s->off[d];
		out->len[d] = s->len[d];
	}
}
/* Make a builder's own shard hold a copy of box b (off and len one
 * allocation, freed by sf_shard_clear). 0 or -ENOMEM. */
int sf_shard_set_box(struct sf_shard *s, const struct sf_box *b);
/* Free what a builder's own shard owns (file, strides, xxh3, box) and zero
 * those fields. Never for a model's shards. */
void sf_shard_clear(struct sf_shard *s);
/* A copy of n checksums in m's pool, for one of its shards' xxh3 (lives
 * as long as m; never freed on its own). NULL on ENOMEM. */
uint64_t *sf_model_copy_sums(struct sf_model *m, const uint64_t *sums,
			     uint64_t n);
/* Is file the file of some shard of m already (so it passed the path
 * check of sf_shard_check)? */
bool sf_model_has_file(const struct sf_model *m, const char *file);
/* Free the shards array of one of m's entries (taken out of it by the
 * caller). */
void sf_model_free_shards(struct sf_shard *shards, size_t n);

/* --- validation, for format adapters --- */

/* Validate a tensor name ('/'-separated components; no empty, "." or ".."
 * components, no control characters, no '@', at most SF_MAX_NAME bytes,
 * valid UTF-8). */
bool sf_name_valid(const char *name);
/* Validate a relative payload path (same rules, '@' allowed). */
bool sf_relpath_valid(const char *path);

/*
 * Where a problem is, so every message names it: "KIND NAME: shard I:
 * message". Lives on the caller's stack; err/errlen are the caller's
 * buffer (may be NULL/0).
 */
#define SF_QNAME_MAX 256 /* input bytes of a name shown before "..." */
#define SF_QNAME_SIZE (4 * SF_QNAME_MAX + 8) /* bytes of a quoted name */
struct sf_where {
	const char *kind;                   /* "tensor", "file", ... or NULL */
	char qname[SF_QNAME_SIZE];          /* quoted, escaped name of kind */
	long shard;                         /* shard index, or -1 */
	char *err;
	size_t errlen;
};
/* A where with no entry (top level) writing into err. */
void sf_where_init(struct sf_where *w, char *err, size_t errlen);
/* Name the entry (len bytes of name, may hold anything) and no shard. */
void sf_where_set(struct sf_where *w, const char *kind, const char *name,
		  size_t len);
/* Write "KIND NAME: shard I: <message>" into w->err (one printable line)
 * and return code. */
int sf_fail(const struct sf_where *w, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/*
 * The one quoting of names from input (entries, files, keys, paths) in
 * messages and log lines: s (len bytes, any bytes) as "..." with the
 * log's escapes (sf_log.h: C0 and C1 controls, U+2028/U+2029, bidi
 * controls and invalid bytes; '"' and '\' as \x22 and \x5c), at most
 * SF_QNAME_MAX input bytes, cut before a UTF-8 sequence that would not
 * fit whole, then "..." when cut. out holds SF_QNAME_SIZE bytes; returns
 * out (for a printf argument). s NULL: "".
 */
const char *sf_quote_name(char *out, const char *s, size_t len);
/* The same for a NUL-terminated s. */
const char *sf_quote_str(char *out, const char *s);
/* sf_quote_str into a buffer that lives to the end of the enclosing
 * block: for a printf argument, sf_warn("... %s", SF_QSTR(name)). */
#define SF_QSTR(s) sf_quote_str((char[SF_QNAME_SIZE]){ 0 }, (s))
/* Why s (len bytes) is no acceptable name, or NULL. single: one component
 * only; allow_at: '@' allowed. Static string. */
const char *sf_name_problem(const char *s, size_t len, bool single,
			    bool allow_at);

/* The one-word name of an entry kind ("tensor", "file", "object"). */
const char *sf_entry_kind_name(enum sf_entry_kind kind);

/* For codecs building a model from their own text (messages prefixed by
 * w, which names the entry): validate an entry and append it (as
 * sf_model_add_tensor, reasons in w), and check one shard of entry t
 * against every rule sf_tensor_add_shard applies. 0, -SF_EMANIFEST,
 * -SF_ERANGE (shard outside t), -SF_ETOOBIG, -ENOMEM. */
int sf_model_append_checked(struct sf_model *m, const struct sf_where *w,
			    enum sf_entry_kind kind, const char *name,
			    size_t len, enum sf_dtype dtype, unsigned ndim,
			    const uint64_t *shape, struct sf_tensor **out);
int sf_shard_check(const struct sf_where *w, const struct sf_model *m,
		   const struct sf_tensor *t, const struct sf_shard *s);

/* 0 if every byte of t is covered by some shard; else -SF_EGAP with the
 * first uncovered element index in err. Bounded work (-SF_ETOOBIG if the
 * shard arrangement is too complex to decide). */
int sf_tensor_check_coverage(const struct sf_tensor *t, char *err,
			     size_t errlen);
/* The same with messages prefixed by w. */
int sf_cover_check(const struct sf_where *w, const struct sf_tensor *t);

/*
 * The overlap rule of the read-only foreign formats (every adapter calls
 * it through the seam; shardfs/1 keeps its own: overlapping shards must
 * hold the same bytes, checked at commit). Call it on tensor t once all
 * its shards are added, in the adapter's order of preference:
 *  - exact replicas (shards of the same box, or the same flat range): the
 *    FIRST one in t->shards stays and serves every read, so the adapter
 *    puts first the copy its framework's own loader reads, in an order
 *    that does not depend on how a directory is listed. The others leave
 *    t->shards (whose order is otherwise kept); a copy stored elsewhere
 *    (another file, offset, length, layout or codec) is kept in
 *    t->replicas for shardctl verify, a copy of the very same bytes is
 *    forgotten;
 *  - a tensor whose remaining shards still overlap (a partial overlap:
 *    which bytes a framework serves there depends on its read order) gets
 *    -SF_ECONFLICT with the reason in w (naming two shards that overlap
 *    where it is cheap to find them): the adapter leaves it out with one
 *    log line.
 * Decided in O(n log n): once replicas are gone, shards that cover t are
 * disjoint iff their bytes add up to t->nbytes. 0, -SF_ECONFLICT, -ENOMEM,
 * -SF_ETOOBIG (replicas past SF_MAX_SHARDS). The model's validator then
 * refuses a foreign model (format other than "shardfs/1") whose covering
 * shards overlap, so the engine never assembles one view from two of them.
 */
int sf_overlap_rule(const struct sf_where *w, struct sf_tensor *t);

/* Bytes of t the shards of t hold, counted once per shard (an overlap
 * counts twice). Saturates at UINT64_MAX. */
uint64_t sf_tensor_shard_bytes(const struct sf_tensor *t);

/* The payload span of a strided box of ndim dims with element lengths len
 * and strides, in bytes of itemsize: (1 + sum((len_d - 1) * strides_d)) *
 * itemsize, 0 for an empty box. -SF_ETOOBIG on overflow. */
int sf_strided_span(unsigned ndim, const uint64_t *len, const uint64_t *strides,
		    size_t itemsize, uint64_t *out);

#endif
