/*
 * sf_fileset.h - the files a foreign checkpoint's metadata names, each
 * opened once, beneath the checkpoint directory, and found again by path
 * in constant time (a hash of the paths).
 *
 * A path must be one plain name (sf_relpath_valid, no '/'), opened with
 * sf_cfile_open (beneath the directory, or a peer's copy under MPI), and
 * be a regular file; a path that fails
 * any of that is recorded with its error, so the caller can say why each
 * entry that needs it cannot be served.
 *
 * Ownership: the set owns its open files and paths until
 * sf_fileset_clear(); an entry pointer stays valid until the next
 * sf_fileset_get() (the table may grow).
 */
#ifndef SF_FILESET_H
#define SF_FILESET_H

#include <stddef.h>
#include <stdint.h>

#include "sf_format.h"

struct sf_fileset_file {
	char *path;             /* owned */
	struct sf_cfile cf;     /* owned; zeroed when it failed to open (err) */
	int err;                /* the open's error: -SF_EREFUSED (not a plain
				 * name), -EXDEV (leads out), -EINVAL (not a
				 * regular file), or the -errno of the open */
	uint64_t size;          /* bytes, at open */
};

struct sf_fileset {
	const struct sf_cdir *cd; /* borrowed: the checkpoint directory */
	size_t max;             /* at most this many files */
	struct sf_fileset_file *files;
	size_t n, cap;
	uint32_t *idx;          /* index + 1 per slot, 0 empty; idxcap slots
				 * (a power of two, at most half full) */
	size_t idxcap;
};

/* An empty set of at most max files of cd. */
void sf_fileset_init(struct sf_fileset *fs, const struct sf_cdir *cd,
		     size_t max);
/* Close and free everything (the set is empty afterwards). */
void sf_fileset_clear(struct sf_fileset *fs);
/* The entry of path, opened now if it is new, into *out. 0;
 * -SF_ETOOBIG past max files; -SF_EBUDGET when the open's budget is
 * spent (sf_budget.h; nothing recorded); -ENOMEM. */
int sf_fileset_get(struct sf_fileset *fs, const char *path,
		   const struct sf_fileset_file **out);
/* Why f could not be opened, in words ("leads out of the checkpoint"). */
const char *sf_fileset_why(const struct sf_fileset_file *f);

#endif
