/*
 * sf_manifest.h - the model <-> JSON codec and the layout names of the
 * native format "shardfs/1" (docs/FORMAT.md). Core proper: the write side
 * (sf_wckpt, sf_journal, sf_commit, sf_writer), the format seam, fs/,
 * mpi/ and the tools use it; the shardfs/1 adapter (formats/sf_shardfs)
 * is its probe and open alone.
 *
 * Every layout string of the format lives here: the manifest's name, the
 * marker of a directory shardfs made, the rank directories and their
 * journals. The JSON codec is the one place a shard becomes JSON text and
 * back: the manifest, a rank's part at commit, the journal's shard
 * records, the user.shardfs.shards xattr and the manifest.json the mount
 * synthesizes for other formats all go through it.
 */
#ifndef SF_MANIFEST_H
#define SF_MANIFEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_io.h"
#include "sf_jw.h"
#include "sf_model.h"

#define SF_SHARDFS_FORMAT "shardfs/1"
#define SF_SHARDFS_MANIFEST "manifest.json"   /* written last: committed */
#define SF_SHARDFS_MARKER ".shardfs"          /* shardfs made this directory */
#define SF_SHARDFS_RANK_PREFIX "rank-"        /* rank-NNNNN/: one rank's payloads */
#define SF_SHARDFS_RANK_FMT "rank-%05u"
#define SF_SHARDFS_JOURNAL "journal.jsonl"    /* in a rank directory, while writing */

/*
 * Parse and fully validate manifest JSON (`len` bytes, need not be
 * NUL-terminated). On success *out is a new model (caller destroys). On
 * failure returns -SF_EMANIFEST (or -SF_EGAP, -SF_ETOOBIG, -ENOMEM) and
 * writes a one-line reason naming the offending field into err.
 */
int sf_manifest_parse(const char *json, size_t len, struct sf_model **out,
		      char *err, size_t errlen);
/* As sf_manifest_parse, but for one rank's part of an uncommitted
 * checkpoint (sf_wckpt_export_part): every check except coverage. */
int sf_manifest_parse_part(const char *json, size_t len,
			   struct sf_model **out, char *err, size_t errlen);
/* Either, for text read through in (a file's window: the text is never
 * held whole; in must outlive the call). partial: no coverage check.
 * (sf_manifest_parse.c) */
int sf_manifest_parse_input(const struct sf_input *in, bool partial,
			    struct sf_model **out, char *err, size_t errlen);

/*
 * Parse a manifest.json as a mount shows it (sf_manifest_dump of any
 * format's model): as sf_manifest_parse, except that "format" may name any
 * format (kept in m->format), shards may lack checksums, a coded shard's
 * "codec", "stored_nbytes", "decoded_offset" and "decoded_nbytes" are
 * read, and root files may have any valid name. For tools that describe
 * a mounted checkpoint (shardctl info, diff in a mount).
 */
int sf_manifest_parse_shown(const char *json, size_t len, struct sf_model **out,
			    char *err, size_t errlen);

/* Serialize a finished model as manifest JSON (NUL-terminated, malloc'd,
 * the caller frees) in the layout of docs/FORMAT.md; "format" is
 * m->format, so a foreign checkpoint's manifest.json says what wrote it;
 * shards without checksums get no "xxh3". */
int sf_manifest_dump(const struct sf_model *m, char **out, size_t *len);
/* The same with the keys of extra (a JSON object, borrowed; NULL: none)
 * after the model's, in extra's order, each value compact (jansson's
 * JSON_COMPACT): what a format says besides the model, such as HF's "hf"
 * block. The parsers skip such keys. -EINVAL when extra is no object or
 * has a key the manifest uses itself ("format", "name", "world_size",
 * "block_size", "tensors", "files", "objects"); -SF_ETOOBIG past
 * SF_MAX_MANIFEST_BYTES; -ENOMEM. */
int sf_manifest_dump_extra(const struct sf_model *m, const json_t *extra,
			   char **out, size_t *len);

/* JSON list of an entry's shards for user.shardfs.shards (compact, no
 * checksums). malloc'd, the caller frees. */
int sf_manifest_shards_json(const struct sf_tensor *t, char **out, size_t *len);

/* One shard of an entry of ndim dimensions as a JSON object into w
 * (with_sums: its "xxh3" when it has checksums). */
void sf_manifest_put_shard(struct sf_jw *w, unsigned ndim,
			   const struct sf_shard *s, bool with_sums);
/*
 * One shard object o (a journal's record, written by sf_manifest_put_shard
 * with sums) of a tensor of ndim dimensions into *s, syntax only: every
 * number non-negative, the path valid, the checksums 16 hex digits (at
 * most 2^24). The caller checks it against its tensor. 0 or -EINVAL; on
 * failure *s holds nothing to free.
 */
int sf_manifest_get_shard(const json_t *o, unsigned ndim, struct sf_shard *s);

/* May a root file be called name (len bytes)? Not a rank directory's. */
bool sf_manifest_file_name_ok(const char *name, size_t len);

#endif
