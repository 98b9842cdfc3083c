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

/*
 * Under MPI, a save through several daemons' mounts (each rank's files in
 * its own node's store). Each daemon seals its part: the checkpoint opens
 * over the union through src (the format's rule over every store's
 * files), its own files (files[0..n), this daemon's write-time hashes)
 * match the store, and it writes, beside them, the part of the index of
 * the shards that lie in them (SF_SAVE_PART_PREFIX + rank) and those
 * files' write-time hashes (SF_SAVE_FILES_PREFIX + rank, an sf_index
 * whose shards are whole files of kind "file"). Both names are hidden
 * from probes and the mount (the index's temporary prefix) and fetched by
 * peers like any file of the checkpoint. Once the parts of every daemon
 * holding a file of it cover every shard of its model, they are merged
 * into this store's shardfs.index.json and the checkpoint is opened
 * again, verified, into *out. -ENOENT (not complete yet: a part is
 * missing, the format's rule does not hold) or another error, with a
 * reason in why. The engine then checks every byte read from a peer
 * against the hashes its holder took.
 */
#define SF_SAVE_PART_PREFIX ".shardfs.index.json.part-"
#define SF_SAVE_FILES_PREFIX ".shardfs.index.json.files-"
struct sf_source;
/* Two daemons' files parts that name one file with different bytes (size
 * or write-time hashes): the file and the two ranks. */
struct sf_save_clash {
	char file[SF_MAX_NAME + 1];
	uint32_t rank[2];
};
/* -SF_ECONFLICT with *clash filled (when clash is not NULL): two daemons
 * hold files of the same name with different bytes; the checkpoint is
 * not complete while they do. */
int sf_save_seal_union(int storefd, const char *store, const char *name,
		       struct sf_source *src, uint32_t rank,
		       const struct sf_save_file *files, size_t n,
		       struct sf_ckpt **out, struct sf_save_clash *clash,
		       char *why, size_t whylen);

/* Drop this rank's parts from the checkpoint directory dirfd (its files
 * change again: a re-save). */
void sf_save_unpart(int dirfd, uint32_t rank);

/* The write-time hashes of file `file` of checkpoint ref (block size
 * SF_DEFAULT_BLOCK_SIZE), from the files part of the rank that holds it,
 * read through src: *size, *sums (malloc'd, caller frees), *nsums.
 * -ENOENT when no part names it. */
struct sf_ckpt_ref;
int sf_save_file_hashes(struct sf_source *src, const struct sf_ckpt_ref *ref,
			const char *file, uint64_t *size, uint64_t **sums,
			size_t *nsums);

/* Does the checkpoint directory open as dirfd carry SF_SAVE_MARKER (saved
 * through a mount)? Its saver's uid and gid then (the marker file's
 * owner, as the daemon gave it). */
bool sf_save_marked(int dirfd, uid_t *uid, gid_t *gid);

/* SF_SAVE_MARKER's body names the saver for the daemons that hold none of
 * the checkpoint's files (under MPI they read it from a peer):
 * {"saved_by_uid": N, "saved_by_gid": G}. At most SF_SAVE_MARKER_MAX
 * bytes. sf_save_marker_body writes it into buf (size bytes, at least
 * SF_SAVE_MARKER_MAX) and returns its length. sf_save_marker_parse reads
 * body[0..len) (untrusted, not NUL-terminated): 0 with *uid and *gid
 * ((gid_t)-1 when it does not say: an older daemon's marker), or
 * -SF_EFORMAT (no uid, a number out of range, too long). */
#define SF_SAVE_MARKER_MAX 128
size_t sf_save_marker_body(uid_t uid, gid_t gid, char *buf, size_t size);
int sf_save_marker_parse(const char *body, size_t len, uid_t *uid, gid_t *gid);

/* Hash the file open as fd (block_size blocks): *sums (malloc'd, caller
 * frees), *nsums, *size. 0 or a negative errno. */
int sf_save_hash_fd(int fd, uint64_t block_size, uint64_t **sums,
		    size_t *nsums, uint64_t *size);

#endif
