/*
 * sf_dstags.h - a DeepSpeed checkpoint's other tags as entries of a store
 * (SPEC 7; see sf_dstags.c).
 *
 * A DeepSpeed (or HF Trainer) checkpoint directory DIR holds `latest`
 * (text: a tag) and one directory per saved tag (global_stepN/). The
 * store shows DIR as the tag latest names (the DeepSpeed adapter reads
 * latest) and every other tag directory TAG as a checkpoint of its own
 * named "DIR@TAG", opened as that bare tag directory (which the adapter
 * reads as it reads any bare global_stepN/). The same mechanism as the
 * hub cache's "ORG/NAME@REV" (sf_hub.h): sf_store lists and opens these
 * names; fs/ sees plain names.
 */
#ifndef SF_DSTAGS_H
#define SF_DSTAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define SF_DSTAGS_MAX 4096      /* tags listed per checkpoint directory */
#define SF_DSTAGS_LATEST_MAX 255 /* bytes of `latest` read */

/*
 * The other tags of directory dir (one entry of the store storefd): when
 * dir/latest is a regular file naming one plain directory of dir,
 * fn(arg, "DIR@TAG", mtime of TAG) for every other subdirectory TAG of
 * dir (not a symlink, not hidden, no '@') that holds a
 * *_model_states.pt (at most SF_DSTAGS_MAX), unless the store has an
 * entry of that name itself. 0 (nothing to list included), fn's first
 * non-zero result, or -ENOMEM.
 */
typedef int (*sf_dstags_fn)(void *arg, const char *name,
			    const struct timespec *mtime);
int sf_dstags_list(int storefd, const char *dir, sf_dstags_fn fn, void *arg);

/*
 * The identity of the tag directory that checkpoint directory dirfd's
 * `latest` names (a regular file naming one plain component that is a
 * directory, reached without a symlink): 0 and *dev, *ino; -ENOENT when
 * there is none. The store takes it as a DeepSpeed directory's identity,
 * so that a new `latest` reads as another directory (opened again).
 */
int sf_dstags_latest_ident(int dirfd, uint64_t *dev, uint64_t *ino);

/* A tag directory opened for checkpoint name "DIR@TAG". */
struct sf_dstags_tag {
	int dirfd;             /* DIR/TAG, reached without a symlink; the
				* caller closes it (O_CLOEXEC) */
	uint64_t dev, ino;     /* its identity */
	struct timespec mtime; /* its mtime */
	char rel[600];         /* "DIR/TAG", its path below the store */
};

/*
 * Open the tag directory name "DIR@TAG" stands for in the store storefd:
 * DIR and TAG each one plain component, DIR a directory of the store with
 * a `latest` that names a plain tag other than TAG, TAG a directory of
 * DIR; each opened beneath the one before with O_NOFOLLOW. 0; -ENOENT
 * when name is no such tag (latest names TAG: it is shown as DIR);
 * -ELOOP a symlink on the way; another -errno.
 */
int sf_dstags_open(int storefd, const char *name, struct sf_dstags_tag *out);

#endif
