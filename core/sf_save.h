/*
 * sf_save.h - sealing a checkpoint a framework saved through the mount
 * (SPEC 8): once its format says it is complete, its files are checked
 * against the hashes the daemon took while they were written, and those
 * bytes are recorded as the checkpoint's shardfs.index.json, so that it is
 * shown verified (sf_index.h) by this daemon and by any daemon that opens
 * it later.
 *
 * The write-time hashes are per file (XXH3-64 of each consecutive
 * block_size bytes of the file, the last block short); the index is per
 * shard of the format's model. The seal reads every file once to compare
 * it with its write-time hashes, then builds the index from the same
 * (now checked) files; a file that differs from what was written is not
 * sealed (the checkpoint stays incomplete, one log line).
 */
#ifndef SF_SAVE_H
#define SF_SAVE_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "sf_store.h"

/* The marker file of a checkpoint saved through the mount: who saved it
 * (a hidden name: no format's loader or probe takes it for its own). */
#define SF_SAVE_MARKER ".shardfs-saved"

/* One file's write-time hashes (borrowed by sf_save_seal). */
struct sf_save_file {
	const char *path;       /* relative to the checkpoint directory */
	uint64_t size;          /* bytes hashed */
	const uint64_t *xxh3;   /* sf_nblocks(size, block_size) hashes */
	size_t nblocks;
};

/*
 * Seal checkpoint `name` of the store open as storefd (absolute path
 * store): open it through the format seam (not complete: -ENOENT or the
 * open's error, *out untouched); check each of files[0..n) (hashed with
 * block_size) against the store, beneath the checkpoint's directory;
 * build and write its index; open it again, now verified, into *out
 * (the caller closes it). 0 or a negative error with a one-line reason
 * in why.
 */
int sf_save_seal(int storefd, const char *store, const char *name,
		 uint64_t block_size, const struct sf_save_file *files,
		 size_t n, struct sf_ckpt **out, char *why, size_t whylen);

/* Does the checkpoint directory open as dirfd carry SF_SAVE_MARKER (saved
 * through a mount)? Its saver's uid and gid then (the marker file's
 * owner, as the daemon gave it). */
bool sf_save_marked(int dirfd, uid_t *uid, gid_t *gid);

/* Hash the file open as fd (block_size blocks): *sums (malloc'd, caller
 * frees), *nsums, *size. 0 or a negative errno. */
int sf_save_hash_fd(int fd, uint64_t block_size, uint64_t **sums,
		    size_t *nsums, uint64_t *size);

#endif
