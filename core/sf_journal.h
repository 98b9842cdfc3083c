/*
 * sf_journal.h - the write journal of one rank of a shardfs/1 checkpoint
 * being written (rank-NNNNN/journal.jsonl, docs/FORMAT.md): one JSON
 * record per line, appended with one write(2) each, and replayed at the
 * next start.
 *
 * Records: {"op":"declare","name":N,"dtype":D,"shape":[..]},
 * {"op":"file","name":N}, {"op":"truncate","name":N} and
 * {"op":"shard","name":N,"shard":{...}} with the shard in the one shard
 * codec of sf_manifest.h. Replay hands over well-formed records in order;
 * malformed lines are skipped (logged), and a torn last line (a write that
 * never finished) is cut off the file so the next record starts on a line
 * of its own.
 */
#ifndef SF_JOURNAL_H
#define SF_JOURNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"
#include "sf_dtype.h"
#include "sf_model.h"

#define SF_JOURNAL_MAX (1ull << 30)  /* bytes replayed */

struct sf_journal;

/* Open (creating) the journal at path for appending. */
int sf_journal_open(const char *path, struct sf_journal **out);
void sf_journal_close(struct sf_journal *j); /* accepts NULL */

/* Append one record. 0, -EIO on a short write, -EBADF with j NULL (the
 * writer released its files), -ENOMEM / -SF_ETOOBIG. */
int sf_journal_declare(struct sf_journal *j, const char *name,
		       enum sf_dtype dtype, unsigned ndim,
		       const uint64_t *shape);
int sf_journal_file(struct sf_journal *j, const char *name);
int sf_journal_truncate(struct sf_journal *j, const char *name);
int sf_journal_shard(struct sf_journal *j, const char *name, unsigned ndim,
		     const struct sf_shard *s);

enum sf_journal_op { SF_JOP_DECLARE, SF_JOP_FILE, SF_JOP_TRUNCATE, SF_JOP_SHARD };

/* A record as replay hands it over: valid for the callback's duration. */
struct sf_journal_rec {
	enum sf_journal_op op;
	const char *name;            /* any string: the caller checks it */
	enum sf_dtype dtype;         /* DECLARE (SF_DT_INVALID when unknown) */
	unsigned ndim;               /* DECLARE */
	uint64_t shape[SF_MAX_NDIM]; /* DECLARE */
	const json_t *shard;         /* SHARD: its object, for
				      * sf_manifest_get_shard with the
				      * entry's ndim */
};

/*
 * Replay the journal at path: fn for every well-formed record, in order.
 * fn returns 0, or non-zero when it refuses the record (then logged as
 * skipped, naming `who`). 0 (also when there is no journal), or a negative
 * error reading or cutting the file.
 */
int sf_journal_replay(const char *path, const char *who,
		      int (*fn)(void *arg, const struct sf_journal_rec *r),
		      void *arg);

#endif
