/*
 * sf_hub.h - the Hugging Face hub cache as a store (SPEC 7; see sf_hub.c).
 *
 * A cache root (~/.cache/huggingface/hub) holds one directory per model
 * repository, models--ORG--NAME/{blobs,refs,snapshots/REV}; every file of
 * a snapshot is a relative symlink into ../../blobs/. The store shows each
 * snapshot as a checkpoint named "ORG/NAME" (the one refs/main names) or
 * "ORG/NAME@REV" (REV: the snapshot directory's name); a repository
 * without an organization ("gpt2") as "NAME" and "NAME@REV". A snapshot
 * directory mounted on its own is one checkpoint. sf_store calls these;
 * the links are followed by sf_open_hub (sf_open.h) only.
 */
#ifndef SF_HUB_H
#define SF_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define SF_HUB_MAX_SNAPSHOTS 4096 /* per repository, listed */

/* Is name (an entry of a store) a hub model repository's directory,
 * "models--ORG--NAME" or "models--NAME", whose parts are names the mount
 * can show? Its shown name ("ORG/NAME", "NAME") into shown (size len). */
bool sf_hub_repo_name(const char *name, char *shown, size_t len);

/* Is name a hub repository of another kind (datasets--, spaces--)? */
bool sf_hub_other_repo(const char *name);

/*
 * The checkpoints of repository directory repo of the store storefd:
 * fn(arg, name, mtime) once per snapshot (at most SF_HUB_MAX_SNAPSHOTS),
 * name as shown, mtime the later of the snapshot directory's and, for the
 * one refs/main names, refs/main's (so a change of either is seen).
 * 0, fn's first non-zero result, or -errno (-EAGAIN: refs/main is being
 * rewritten; nothing listed).
 */
typedef int (*sf_hub_fn)(void *arg, const char *name,
			 const struct timespec *mtime);
int sf_hub_list(int storefd, const char *repo, sf_hub_fn fn, void *arg);

/* A snapshot opened for a checkpoint: both descriptors are the caller's
 * to close (O_CLOEXEC); rel its path below the store. */
struct sf_hub_snap {
	int dirfd;           /* snapshots/REV, never reached through a symlink */
	int blobsfd;         /* the repository's blobs/, the same */
	uint64_t dev, ino;   /* dirfd's identity */
	bool is_main;        /* REV is the one refs/main names */
	struct timespec mtime; /* as sf_hub_list gives it for this name */
	char rel[600];       /* "models--ORG--NAME/snapshots/REV" */
};

/*
 * Open the snapshot shown as name in the store storefd: its repository,
 * snapshots/, REV (read from refs/main for a name without "@REV") and
 * blobs/ each opened beneath the one before with O_NOFOLLOW. 0; -ENOENT
 * when name is no snapshot of a hub repository of this store; -ELOOP a
 * symlink on the way; -EAGAIN refs/main is empty (being rewritten);
 * another -errno.
 */
int sf_hub_open(int storefd, const char *name, struct sf_hub_snap *out);

/*
 * The store whose descriptor is storefd and path store is itself a
 * snapshot (store is .../models--ORG--NAME/snapshots/REV): its
 * repository's blobs/, opened (the caller closes it). -ENOENT when it is
 * not one.
 */
int sf_hub_store_blobs(int storefd, const char *store);

/* Has snapshot dirfd (blobs blobsfd) a link into blobs/ that dangles (a
 * download in progress)? Looks at most 4 levels and 10,000 entries deep. */
bool sf_hub_incomplete(int dirfd, int blobsfd);

#endif
