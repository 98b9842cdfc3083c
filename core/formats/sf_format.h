/*
 * sf_format.h - the format seam: every checkpoint format shardfs mounts is
 * one adapter behind this header, listed in sf_format.c. An adapter says
 * from the names in a directory whether it holds a checkpoint of its
 * format (probe), and builds the format-neutral model of one (open). The
 * engine, the views, fs/, mpi/ and gpu/ only ever see the model; adding a
 * format is adding one adapter file (and its row in sf_format.c).
 *
 * Probes look at names only (no file is opened), so a scan of a big store
 * is cheap, and they are exact about what is complete: a checkpoint still
 * being written (a DCP directory without its .metadata or some rank's
 * __R.metadata yet, a shardfs directory without manifest.json) is
 * PARTIAL, never shown as complete.
 *
 * open() reads only files inside the checkpoint directory, through its
 * dirfd with every path resolved beneath it (sf_open_beneath), and bounds
 * everything it reads.
 */
#ifndef SF_FORMAT_H
#define SF_FORMAT_H

#include <stdbool.h>
#include <stddef.h>

#include "sf_model.h"

enum sf_probe {
	SF_PROBE_NO = 0,    /* not this format */
	SF_PROBE_PARTIAL,   /* this format, not complete (being written) */
	SF_PROBE_YES,       /* this format, complete */
};

/* A directory's entries as probes see them: every name but "." and ".."
 * (hidden ones too: DCP's is ".metadata"), at most SF_DIRLIST_MAX. */
#define SF_DIRLIST_MAX 100000
struct sf_dirlist {
	char **names;           /* owned; sorted by strcmp */
	bool *is_dir;           /* owned; per name: a directory (not followed) */
	size_t n;
	bool truncated;         /* more than SF_DIRLIST_MAX entries */
};
/* List dir. 0 or -errno; free with sf_dirlist_free. */
int sf_dirlist_read(int dirfd, struct sf_dirlist *out);
void sf_dirlist_free(struct sf_dirlist *ls); /* the contents; accepts zeroed */
/* Does ls hold name (as a file, or with want_dir as a directory)? */
bool sf_dirlist_has(const struct sf_dirlist *ls, const char *name, bool want_dir);

/* What an open checkpoint gives the mount. Owned by the caller, who frees
 * it with sf_format_result_clear. */
struct sf_format_result {
	struct sf_model *model;  /* finished (sf_model_finish) */
	char *meta;              /* manifest.json as the mount shows it: the
				  * stored one, or one synthesized in the
				  * shardfs/1 shape; NUL-terminated */
	size_t metalen;
};
void sf_format_result_clear(struct sf_format_result *r);

struct sf_format {
	const char *name;       /* short and stable: "shardfs/1", "torch-dcp" */
	bool writable;          /* shardfs writes, commits and deletes these;
				 * every other format is read-only */
	enum sf_probe (*probe)(const struct sf_dirlist *ls);
	/* Build the model of the complete checkpoint in dir (absolute path,
	 * open as dirfd) named name. 0, or a negative error with a one-line
	 * reason in err. */
	int (*open)(int dirfd, const char *dir, const char *name,
		    struct sf_format_result *out, char *err, size_t errlen);
};

/* The adapters, in probe order; NULL-terminated. */
extern const struct sf_format *const sf_formats[];

/*
 * Ask every adapter about the directory listed in ls: the first YES wins,
 * else the first PARTIAL; NULL when none claims it. *how gets the answer
 * (SF_PROBE_NO with NULL).
 */
const struct sf_format *sf_format_probe(const struct sf_dirlist *ls,
					enum sf_probe *how);

/* The adapter named name, or NULL. */
const struct sf_format *sf_format_find(const char *name);

/*
 * Open path (relative, already checked by sf_relpath_valid or an
 * adapter's own rules) below dirfd, with every component resolved beneath
 * it: no "..", no absolute symlink, no symlink leading out (openat2 with
 * RESOLVE_BENEATH), no magic links. flags as for open(2) (O_CLOEXEC is
 * added). The descriptor, or -errno (-EXDEV when the path leads out).
 */
int sf_open_beneath(int dirfd, const char *path, int flags);

#endif
