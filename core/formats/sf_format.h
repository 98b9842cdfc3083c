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
 * open() reads only files inside the checkpoint directory, through a
 * struct sf_cdir (the local directory, with every path resolved beneath
 * it, or a peer daemon's copy under MPI), and bounds everything it reads.
 */
#ifndef SF_FORMAT_H
#define SF_FORMAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "sf_budget.h"
#include "sf_engine.h"
#include "sf_io.h"
#include "sf_held.h"
#include "sf_model.h"
#include "sf_open.h" /* sf_open_beneath, sf_open_payload* (moved to core) */

enum sf_probe {
	SF_PROBE_NO = 0,    /* not this format */
	SF_PROBE_PARTIAL,   /* this format, not complete (being written) */
	SF_PROBE_YES,       /* this format, complete */
};

/* shardfs.index.json (sf_index.h): checksums for formats that have none,
 * never part of a listing (sf_dirlist_read, sf_cdir_list). */
#define SF_INDEX_NAME "shardfs.index.json"
#define SF_INDEX_TMP_PREFIX ".shardfs.index.json." /* + suffix: being written */

/* Is name the index or one of its temporary names? (Here, below sf_index:
 * the directory listing and sf_cdir leave the index out.) */
static inline bool sf_index_is_own_name(const char *name)
{
	return strcmp(name, SF_INDEX_NAME) == 0 ||
	       strncmp(name, SF_INDEX_TMP_PREFIX, sizeof(SF_INDEX_TMP_PREFIX) - 1) == 0;
}

/* A directory's entries as probes see them: every name but "." and ".."
 * (hidden ones too: DCP's is ".metadata") and shardfs's own index of a
 * foreign checkpoint (sf_index.h: shardfs.index.json and its temporary
 * names), at most SF_DIRLIST_MAX. */
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
/* Sort names (and is_dir with them) by strcmp. 0 or -ENOMEM. */
int sf_dirlist_sort(struct sf_dirlist *ls);
/* Does ls hold name (as a file, or with want_dir as a directory)? */
bool sf_dirlist_has(const struct sf_dirlist *ls, const char *name, bool want_dir);

/*
 * A checkpoint directory as an adapter reads it: the local directory and,
 * under MPI, the files other daemons hold of the same checkpoint (node-local
 * stores: a DCP checkpoint's .metadata on one node, each rank's .distcp on
 * its own). Adapters list and open files only through it, so one adapter
 * serves both cases. Borrowed by open() for its duration.
 */
struct sf_cdir {
	int dirfd;                 /* the local directory; -1 when this daemon
				    * holds none of the checkpoint */
	const char *dir;           /* its absolute path (may not exist) */
	const char *name;          /* the checkpoint's name */
	struct sf_source *src;     /* reaches peers' files (MPI); NULL: local
				    * only. Only its read, peer_files and
				    * peer_size. */
	struct sf_ckpt_ref ref;    /* { dir, name } for src */
	struct sf_budget *budget;  /* what this open may spend (sf_budget.h;
				    * borrowed): sf_format_open sets it;
				    * sf_cfile_open charges every file to it;
				    * NULL: unbounded */
};

/*
 * The entries of cd: the local directory's (sf_dirlist_read) and, with a
 * source that reaches peers, the top-level names of their files (a peer's
 * "a/b" adds directory "a"). 0 or -errno; free with sf_dirlist_free.
 */
int sf_cdir_list(const struct sf_cdir *cd, struct sf_dirlist *out);

/* Is path (relative, no symlink followed) a regular file of cd, here or on
 * a peer? 0 and its size; -EINVAL when it is something else (a symlink, a
 * directory, a FIFO); -ENOENT when no daemon holds it; another -errno. */
int sf_cdir_stat(const struct sf_cdir *cd, const char *path, uint64_t *size);

/* An open file of a checkpoint directory, local or a peer's copy. */
struct sf_cfile {
	struct sf_input in;        /* the whole file; valid until closed */
	uint64_t size;             /* bytes, at open */
	bool remote;               /* read from a peer over the source */
	bool has_fd;               /* fd is open and owned */
	int fd;                    /* with has_fd: the local file */
	struct sf_cfile_peer *peer; /* owned; remote state (a read window) */
};

/*
 * Open regular file path (relative; resolved beneath the directory as
 * sf_open_beneath does) of cd: the local file when there is one, else a
 * peer's copy. 0; -ENOENT when no daemon holds it; -EXDEV when it leads
 * out; -EINVAL when it is not a regular file; another -errno. Close with
 * sf_cfile_close (accepts a zeroed one, and one whose open failed).
 */
int sf_cfile_open(const struct sf_cdir *cd, const char *path,
		  struct sf_cfile *out);
void sf_cfile_close(struct sf_cfile *f);
/* Read all of f, at most max bytes, into *out (malloc'd, NUL-terminated,
 * the caller frees; *len without the NUL). -SF_ETOOBIG over max; else as
 * sf_read_fd. */
int sf_cfile_read_all(const struct sf_cfile *f, size_t max, char **out,
		      size_t *len);

/* What an open checkpoint gives the mount. Owned by the caller, who frees
 * it with sf_format_result_clear. An adapter fills model (and extra);
 * only shardfs/1 fills the meta fields, with its stored manifest. The
 * seam runs open -> index (sf_index_load) -> one dump
 * (sf_format_result_dump), which synthesizes meta for every other format
 * from the finished model, its checksums and extra. */
struct sf_format_result {
	struct sf_model *model;  /* finished (sf_model_finish) */
	json_t *extra;           /* NULL, or an object (owned, one reference):
				  * format-specific keys manifest.json shows
				  * after the model's (HF's "hf") */
	struct sf_held *held;    /* objects/NAME made at open (sf_held.h;
				  * owned), beside the model's; NULL */
	size_t nheld;
	char *meta;              /* manifest.json as the mount shows it: the
				  * dump, or the stored one read from a peer;
				  * NUL-terminated; NULL with meta_file and
				  * before the dump */
	size_t metalen;          /* bytes of it */
	bool meta_file;          /* it is the checkpoint's own manifest.json,
				  * read from the file when shown (a million
				  * shards' is 170 MB: never held), as long as
				  * it is still the file that was parsed: */
	const char *meta_path;   /* meta_file: its path in the checkpoint
				  * directory (static), */
	uint64_t meta_ino;       /* its inode, */
	int64_t meta_mtime_ns;   /* its st_mtim (ns since the epoch) */
};
void sf_format_result_clear(struct sf_format_result *r);

/*
 * The one dump of an open, run by the seam once the index (if any) has
 * attached its checksums: r->meta becomes manifest.json as the mount shows
 * it, synthesized from r->model in the shardfs/1 shape
 * (sf_manifest_dump_extra) with r->extra's keys; an extra that would take
 * it past SF_MAX_MANIFEST_BYTES is left out. Nothing to do when r already
 * has its manifest (shardfs/1's stored one: meta_file, or read from a
 * peer). 0, or -SF_ETOOBIG / -ENOMEM with r unchanged.
 */
int sf_format_result_dump(struct sf_format_result *r);

struct sf_format {
	const char *name;       /* short and stable: "shardfs/1", "torch-dcp" */
	bool writable;          /* shardfs writes, commits and deletes these;
				 * every other format is read-only */
	enum sf_probe (*probe)(const struct sf_dirlist *ls);
	/* Build the model of the complete checkpoint cd (its files read only
	 * through sf_cdir_list and sf_cfile_open) into out->model, finished,
	 * and out->extra if the format has more to show; never the dump
	 * (the seam's). 0, or a negative error with a one-line reason in
	 * err and nothing in out. */
	int (*open)(const struct sf_cdir *cd, struct sf_format_result *out,
		    char *err, size_t errlen);
};

/*
 * Run fmt's open of cd under a budget (sf_budget.h): cd->budget when it
 * has one, else a fresh one with the default limits. 0, or the adapter's
 * error; when the budget was spent, -SF_EBUDGET with the budget's one
 * line (which budget, how much) as the reason in err. Every open of a
 * checkpoint the mount or a tool shows goes through here.
 */
int sf_format_open(const struct sf_format *fmt, const struct sf_cdir *cd,
		   struct sf_format_result *out, char *err, size_t errlen);

/* The table of adapters, sf_format_probe and sf_format_find:
 * sf_formats.h (above every adapter). */

/* sf_cdir_add_root_files(): sf_rootfiles.h, a unit above this one and the
 * shardfs/1 adapter (included here so that every adapter has it). */
#include "sf_rootfiles.h"

#endif
