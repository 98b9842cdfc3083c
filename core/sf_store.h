/*
 * sf_store.h - finding and opening the checkpoints of a store.
 *
 * A store is a directory of checkpoints (each a subdirectory) or one
 * checkpoint directory itself. Which directories are checkpoints, of which
 * format, and whether they are complete, the format adapters say from the
 * names inside (core/formats/sf_format.h); opening one builds its model
 * through its adapter (every read bounded) and precomputes the safetensors
 * layout.
 */
#ifndef SF_STORE_H
#define SF_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "sf_engine.h"
#include "sf_format.h"
#include "sf_model.h"
#include "sf_views.h"

struct sf_ckpt {
	struct sf_ckpt_ref ref;    /* ref.dir, ref.name point into this struct;
				    * pinned, ref.dirfd is dirfd */
	char *dir;                 /* absolute path (names it; files are
				    * opened beneath dirfd, never by it) */
	char *name;
	int blobsfd;               /* a Hugging Face hub snapshot: its
				    * repository's blobs/ (owned; ref.hub),
				    * else -1 */
	int dirfd;                 /* the directory as opened when it was
				    * scanned (owned), or -1 when this daemon
				    * holds none of it (MPI: peers' files) */
	uint64_t dev, ino;         /* dirfd's identity at open (the live store
				    * compares the name's with it); for a
				    * DeepSpeed directory, the tag directory's
				    * its latest named (sf_dstags.h) */
	const struct sf_format *fmt; /* the adapter that opened it (static) */
	struct sf_model *m;        /* owned */
	char *manifest_json;       /* manifest.json as the mount shows it (owned),
				    * or NULL: read from manifest_fd */
	size_t manifest_len;       /* its bytes */
	bool manifest_in_file;     /* the stored manifest.json, read again when
				    * shown if it is still the parsed one: */
	const char *manifest_path; /* its path in dir (static), */
	uint64_t manifest_ino;     /* its inode and st_mtim, at open */
	int64_t manifest_mtime_ns;
	struct sf_st_layout *st;   /* owned */
	struct sf_held *held;      /* objects/NAME the open made (sf_held.h;
				    * owned), beside the model's */
	size_t nheld;
	struct timespec mtime;     /* the checkpoint directory's, at open */
};

/* Open the complete checkpoint in dir, named name (if NULL, the basename
 * of dir), of whatever format its adapter recognizes. dir is a path the
 * caller chose (symlinks in it followed); the directory it names then is
 * the checkpoint's for good (pinned). On failure returns a negative error
 * and a one-line reason. */
int sf_ckpt_open(const char *dir, const char *name, struct sf_ckpt **out,
		 char *err, size_t errlen);
/*
 * Open checkpoint name of a mounted store, as the daemon does: its
 * directory is opened beneath storefd (the store's descriptor; store its
 * absolute path, for names) without following a symlink, and everything
 * the checkpoint ever reads is opened beneath that descriptor
 * (sf_open_ckpt_dir), so what a store's owner does to the store after the
 * scan never leads the daemon out of the directory it scanned. name NULL:
 * the store itself is the checkpoint. With src, a name this store lacks
 * is opened from the peers' files. A directory that is a symlink fails
 * with -ELOOP ("its directory is a symlink (not followed)").
 */
int sf_ckpt_open_at(int storefd, const char *store, const char *name,
		    struct sf_source *src, struct sf_ckpt **out, char *err,
		    size_t errlen);
void sf_ckpt_close(struct sf_ckpt *ck); /* accepts NULL */
/* Close ck's directory descriptor (a checkpoint no longer shown, with no
 * reader left: a deleted directory is not kept open): later payload opens
 * fail as missing. The caller makes sure nothing reads ck meanwhile. */
void sf_ckpt_unpin(struct sf_ckpt *ck);


/* Bytes [off, off+len) of the manifest.json the mount shows (the caller
 * clamps them to manifest_len). 0; -EIO when the stored file is no longer
 * the one parsed at open (another inode, size or mtime) or cannot be
 * read; -EINVAL past its end. */
int sf_ckpt_manifest_read(const struct sf_ckpt *ck, void *buf, uint64_t off,
			  size_t len);

/* Called by sf_store_scan for each checkpoint found. ck is NULL for a
 * directory that shardfs is writing (an uncommitted shardfs/1 checkpoint:
 * name and dir given, err 0). For a complete one that failed to open, ck
 * is NULL and err is set (already logged). Ownership of ck passes to the
 * callback. */
typedef void (*sf_store_fn)(void *arg, const char *name, const char *dir,
			    struct sf_ckpt *ck, int err, const char *why);

/* Is store itself one complete checkpoint (of any format)? */
bool sf_store_is_single(const char *store);

/* Scan a store. If a format recognizes the store itself as a complete
 * checkpoint, it is the only one; otherwise each subdirectory may be one
 * (hidden names skipped). Every entry left out gets one log line saying
 * why (rejected checkpoints at error level, directories no format
 * recognizes and checkpoints still being written by another program at
 * warning level, plain files at info level). Checkpoints are opened
 * concurrently (SF_STORE_OPEN_THREADS); fn is called once per entry, one
 * call at a time, in no particular order. Returns 0, or a negative
 * error if the store itself cannot be read. *single is set to 1 when the
 * store is one checkpoint. */
int sf_store_scan(const char *store, sf_store_fn fn, void *arg, int *single);

/* Checkpoints are opened by at most this many threads at once (a scan's
 * caller among them), so a checkpoint whose open takes long (up to its
 * budget) delays neither the others nor, beyond that budget, the mount. */
#define SF_STORE_OPEN_THREADS 4

/*
 * Open checkpoints names[0..n) of the store storefd (sf_ckpt_open_at)
 * concurrently, on at most SF_STORE_OPEN_THREADS threads; fn(arg, i, ck,
 * err, why) once per name, one call at a time: ck (owned by fn) on
 * success, else NULL with err and its reason (not logged). Returns when
 * every name was tried.
 */
typedef void (*sf_store_open_fn)(void *arg, size_t i, struct sf_ckpt *ck,
				 int err, const char *why);
void sf_store_open_many(int storefd, const char *store, char *const *names,
			size_t n, struct sf_source *src, sf_store_open_fn fn,
			void *arg);

/*
 * sf_store_scan through the store's descriptor storefd (store: its absolute
 * path, for names), as the daemon scans: every checkpoint is opened with
 * sf_ckpt_open_at, and a symlink in the store is skipped with a warning.
 * Under MPI, src (the payload source reaching the peers' stores) adds the
 * files peers hold to each checkpoint (a DCP checkpoint whose .metadata is
 * on another node opens here too) and the read-only checkpoints of which
 * this store holds nothing at all; NULL: this store only. single_hint: 1
 * the store is one checkpoint (decided with the peers,
 * sf_store_single_vote), 0 it is a store of checkpoints, -1 decide here.
 * wait_ms bounds the scan (SF_STORE_WAIT_FOREVER: no bound): an open
 * still running that long after the scan began is stopped and given to fn
 * with err -ETIMEDOUT (logged at info level: not refused, to be opened
 * again later); a store that is one checkpoint is always waited for.
 */
#define SF_STORE_WAIT_FOREVER ((unsigned)-1)
int sf_store_scan_fd(int storefd, const char *store, struct sf_source *src,
		     int single_hint, unsigned wait_ms, sf_store_fn fn,
		     void *arg, int *single);

/*
 * The names of the store that may be checkpoints, as a scan sees them:
 * each directory (hidden names and symlinks skipped), a Hugging Face hub
 * repository's directory (sf_hub.h) as the names of its snapshots
 * ("ORG/NAME", "ORG/NAME@REV"), and after a DeepSpeed checkpoint's
 * directory DIR each of its tag directories other than the one `latest`
 * names as "DIR@TAG" (sf_dstags.h). fn(arg, name, mtime) once each, mtime
 * what changes when the checkpoint may have (the directory's; for the
 * snapshot refs/main names, the later of it and refs/main's). 0, fn's
 * first non-zero result, or -errno.
 */
typedef int (*sf_store_name_fn)(void *arg, const char *name,
				const struct timespec *mtime);
int sf_store_names(int storefd, sf_store_name_fn fn, void *arg);

/* What name (as sf_store_names gives it) is in the store now: 0 and the
 * identity of its directory (for a hub name, the snapshot refs/main names
 * now; for DIR@TAG, TAG's, -ENOENT once latest names TAG; for a
 * DeepSpeed DIR, the tag directory its latest names now, as the
 * checkpoint's dev and ino are); -ENOENT gone, -ELOOP a symlink, -ENOTDIR not a directory, or
 * another -errno. Never follows a symlink. */
int sf_store_ident(int storefd, const char *name, uint64_t *dev,
		   uint64_t *ino);
/* The mtime sf_store_names gives for name now. 0 or -errno. */
int sf_store_mtime(int storefd, const char *name, struct timespec *mtime);

/*
 * This store's vote on "every daemon's STORE is one checkpoint": 2 it is
 * one complete checkpoint; 1 it could be part of one (a read-only format's
 * files without their metadata, or an empty directory); 0 it is a store of
 * checkpoints. The daemons agree on single when the largest vote is 2 and
 * the smallest is at least 1.
 */
int sf_store_single_vote(const char *store);

/*
 * Who may see a checkpoint through the mount, as its directory in the store
 * says: the directory's owner, group and mode, and the AND of the mode bits
 * of the regular files below it (two levels deep, hidden entries skipped,
 * at most SF_PERMS_MAX_FILES looked at), so the mount never shows a file
 * more readable than the least readable file it may be assembled from
 * (Hugging Face writes its shards 0600 inside 0755 directories).
 */
#define SF_PERMS_MAX_FILES 4096
struct sf_perms {
	unsigned uid, gid;      /* owner and group of the directory */
	unsigned dir_mode;      /* permission bits of the directory (07777) */
	unsigned file_mode;     /* AND of the files' permission bits (0777 when none) */
};
/* 0, or -errno when dir cannot be stat'ed (files that vanish are skipped). */
int sf_store_perms(const char *dir, struct sf_perms *out);
/* The same for the directory open as dirfd (a pinned checkpoint's). */
int sf_store_perms_fd(int dirfd, struct sf_perms *out);
/* The same for checkpoint ck as it was opened (its pinned directory, or
 * its path when it holds none; a hub snapshot's blobs/ files count too). */
int sf_ckpt_perms(const struct sf_ckpt *ck, struct sf_perms *out);

#endif
