/*
 * sf_open.h - opening files strictly beneath a directory (see sf_open.c):
 * what the format seam, the index and the payload sources share. Every
 * descriptor returned is the caller's to close.
 */
#ifndef SF_OPEN_H
#define SF_OPEN_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_source.h" /* struct sf_ckpt_ref */

/*
 * Open path (relative, already checked by sf_relpath_valid or an
 * adapter's own rules) below dirfd, with every component resolved beneath
 * it: no "..", no absolute symlink, no symlink leading out (openat2 with
 * RESOLVE_BENEATH), no magic links. flags as for open(2) (O_CLOEXEC is
 * added). The descriptor, or -errno (-EXDEV when the path leads out).
 */
int sf_open_beneath(int dirfd, const char *path, int flags);

/*
 * Open payload file (relative) of the checkpoint directory dir (absolute)
 * for reading, as the payload sources do: resolved beneath dir, a regular
 * file (a FIFO planted there never blocks the open), blocking reads. The
 * descriptor; -SF_ESHORT when it is missing; -EIO when it leads out of the
 * checkpoint, is not a regular file or cannot be opened.
 */
int sf_open_payload(const char *dir, const char *file);
/* The same beneath the directory descriptor dirfd (a pinned checkpoint's,
 * see struct sf_ckpt_ref): nothing but dirfd's own directory is reached. */
int sf_open_payload_at(int dirfd, const char *file);
/* The same for checkpoint ck: beneath ck->dirfd when pinned (through
 * sf_open_hub for a hub snapshot), else ck->dir. */
int sf_open_payload_ref(const struct sf_ckpt_ref *ck, const char *file);

/*
 * Open path (relative) of a Hugging Face hub snapshot, the directory
 * dirfd, whose repository's blobs/ is blobsfd (SPEC 7's one exception).
 * No symlink is followed by the kernel anywhere: a path that is a file of
 * the snapshot itself opens as sf_open_beneath would with no symlink
 * allowed; a last component that is a symlink is read, and its text must
 * be what huggingface_hub writes, "../" once per directory up to the
 * repository then "blobs/NAME" (NAME one component), and NAME is opened
 * in blobsfd with O_NOFOLLOW and must be a regular file. The descriptor,
 * or: -EXDEV the link leads anywhere else (its text in target, when
 * given, NUL-terminated and cut to tlen), -ELOOP the blob is itself a
 * symlink, -ENOENT a link that dangles (a download in progress),
 * -EINVAL not a regular file, another -errno.
 */
int sf_open_hub(int dirfd, int blobsfd, const char *path, int flags,
		char *target, size_t tlen);

/*
 * Open the checkpoint directory name (one component, no '/') of the store
 * whose descriptor is storefd, as every mounted checkpoint is reached: a
 * directory itself, never through a symlink. The descriptor and, in *dev
 * and *ino (either may be NULL), its identity; -ELOOP for a symlink,
 * -ENOTDIR for anything else that is not a directory, or another -errno.
 */
int sf_open_ckpt_dir(int storefd, const char *name, uint64_t *dev,
		     uint64_t *ino);

/*
 * Open directory name (one component) of at without following a symlink:
 * the descriptor, or -ELOOP for a symlink (O_DIRECTORY may say ENOTDIR for
 * one), -ENOTDIR, another -errno. O_NONBLOCK: a FIFO never blocks.
 */
int sf_open_dir_at(int at, const char *name);

/*
 * A directory stream over dirfd's directory from its first entry, on a
 * descriptor of its own (a dup would share dirfd's offset): the caller
 * closes it with closedir(); NULL on failure (errno set). dirfd stays the
 * caller's.
 */
DIR *sf_opendir_copy(int dirfd);

#endif
