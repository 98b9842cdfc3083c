/*
 * sf_fileset.h - the files a foreign checkpoint's metadata names, each
 * opened once, beneath the checkpoint directory, and found again by path
 * in constant time (a hash of the paths): the one file registry every
 * adapter uses (through its sf_kit, sf_kit.h).
 *
 * A path must be one plain name (sf_relpath_valid, no '/'), opened with
 * sf_cfile_open (beneath the directory, or a peer's copy under MPI), and
 * be a regular file; a path that fails
 * any of that is recorded with its error, so the caller can say why each
 * entry that needs it cannot be served. An adapter that decodes each file
 * once (a data file's table of arrays) gives a decoder
 * (sf_fileset_set_decoder): it runs once per file that opened, and what it
 * makes of the file stays with the entry (note) until the set is cleared;
 * a file it cannot decode is recorded as unusable with its reason.
 *
 * Ownership: the set owns its open files, paths, reasons and notes until
 * sf_fileset_clear(); an entry pointer stays valid until then (entries
 * never move when the set grows). The decoder and its arg are borrowed.
 */
#ifndef SF_FILESET_H
#define SF_FILESET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_format.h"

struct sf_fileset_file {
	char *path;             /* owned */
	struct sf_cfile cf;     /* owned; zeroed when it failed to open (err) */
	int err;                /* the open's error: -SF_EREFUSED (not a plain
				 * name), -EXDEV (leads out), -EINVAL (not a
				 * regular file), or the -errno of the open;
				 * else the decoder's */
	char *why;              /* owned: with the decoder's err, its reason
				 * (NULL: sf_fileset_why's words for err) */
	uint64_t size;          /* bytes, at open */
	void *note;             /* owned (the decoder's drop frees it): what
				 * the decoder made of the file, or NULL */
};

/* What an adapter makes of each file that opened (f->err 0), once.
 * decode returns 0 (f->note set or left NULL); -ENOMEM or -SF_EBUDGET,
 * which end sf_fileset_get (nothing recorded); or another negative error,
 * which records f as unusable with the reason decode wrote in why (a
 * phrase that follows the file's name: "does not decode: ..."). A decoder
 * that refuses the whole checkpoint says so through its arg. */
struct sf_fileset_decoder {
	int (*decode)(void *arg, struct sf_fileset_file *f, char *why,
		      size_t whylen);
	void (*drop)(void *note);   /* frees a note (also one decode left
				     * after failing); NULL: free() */
	void *arg;
	bool close;                 /* close each file once decoded (f->cf
				     * zeroed; size and note stay): for an
				     * adapter that reads its files only
				     * while opening (a header each), so that
				     * thousands of them never hold thousands
				     * of descriptors */
};

struct sf_fileset {
	const struct sf_cdir *cd; /* borrowed: the checkpoint directory */
	size_t max;             /* at most this many files */
	struct sf_fileset_file **files; /* each owned; never moved */
	size_t n, cap;
	uint32_t *idx;          /* index + 1 per slot, 0 empty; idxcap slots
				 * (a power of two, at most half full) */
	size_t idxcap;
	const struct sf_fileset_decoder *dec; /* borrowed, or NULL */
};

/* An empty set of at most max files of cd, with no decoder. */
void sf_fileset_init(struct sf_fileset *fs, const struct sf_cdir *cd,
		     size_t max);
/* Decode every file opened from now on with dec (borrowed; NULL: none). */
void sf_fileset_set_decoder(struct sf_fileset *fs,
			    const struct sf_fileset_decoder *dec);
/* Close and free everything (the set is empty afterwards, its decoder
 * kept). */
void sf_fileset_clear(struct sf_fileset *fs);
/* The entry of path, opened (and decoded) now if it is new, into *out.
 * 0; -SF_ETOOBIG past max files; -SF_EBUDGET when the open's budget is
 * spent (sf_budget.h; nothing recorded); -ENOMEM. */
int sf_fileset_get(struct sf_fileset *fs, const char *path,
		   const struct sf_fileset_file **out);
/* Why f could not be used, as a phrase that follows its name ("leads out
 * of the checkpoint", "is missing"): the decoder's reason, or the open's
 * error's. */
const char *sf_fileset_why(const struct sf_fileset_file *f);

#endif
