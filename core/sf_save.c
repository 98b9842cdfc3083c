/*
 * sf_save.c - sealing a checkpoint a framework saved through the mount
 * (sf_save.h, SPEC 8): completeness by the format seam, the files checked
 * against their write-time hashes, the index written, the checkpoint
 * opened again with it.
 *
 * Invariants: every file is opened beneath the checkpoint's directory
 * with no symlink followed (sf_open_beneath); one block is held in
 * memory at a time; nothing but shardfs.index.json is written, and only
 * once every file matched its write-time hashes.
 */
#include "sf_save.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_index.h"
#include "sf_io.h"
#include "sf_open.h"

#define SF_SAVE_READ (1u << 20) /* bytes per read while hashing */

int sf_save_hash_fd(int fd, uint64_t block_size, uint64_t **sums,
		    size_t *nsums, uint64_t *size)
{
	struct sf_blockhash *bh = sf_blockhash_create(block_size);
	const uint64_t *s;
	char *buf = malloc(SF_SAVE_READ);
	uint64_t off = 0;
	size_t n;
	int rc = 0;

	*sums = NULL;
	*nsums = 0;
	if (!bh || !buf) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (;;) {
		ssize_t got = pread(fd, buf, SF_SAVE_READ, (off_t)off);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			rc = -errno;
			goto out_free;
		}
		if (got == 0)
			break;
		rc = sf_blockhash_update(bh, buf, (size_t)got);
		if (rc)
			goto out_free;
		off += (uint64_t)got;
	}
	rc = sf_blockhash_final(bh, &s, &n);
	if (rc)
		goto out_free;
	if (n) {
		*sums = malloc(n * sizeof(**sums));
		if (!*sums) {
			rc = -ENOMEM;
			goto out_free;
		}
		memcpy(*sums, s, n * sizeof(**sums));
	}
	*nsums = n;
	*size = off;
out_free:
	free(buf);
	sf_blockhash_destroy(bh);
	return rc;
}

bool sf_save_marked(int dirfd, uid_t *uid, gid_t *gid)
{
	struct stat sb;

	if (dirfd < 0 || fstatat(dirfd, SF_SAVE_MARKER, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
	    !S_ISREG(sb.st_mode))
		return false;
	*uid = sb.st_uid;
	*gid = sb.st_gid;
	return true;
}

/* Does dirfd/f hold exactly the bytes f's hashes say? */
static int check_file(int dirfd, uint64_t block_size,
		      const struct sf_save_file *f, char *why, size_t whylen)
{
	uint64_t *sums = NULL, size = 0;
	size_t n = 0;
	int fd = sf_open_beneath(dirfd, f->path, O_RDONLY | O_NONBLOCK);
	int rc;

	if (fd < 0) {
		snprintf(why, whylen, "%s: %s", f->path, sf_strerror(fd));
		return fd;
	}
	rc = sf_save_hash_fd(fd, block_size, &sums, &n, &size);
	close(fd);
	if (rc) {
		snprintf(why, whylen, "%s: %s", f->path, sf_strerror(rc));
		return rc;
	}
	if (size != f->size || n != f->nblocks ||
	    (n && memcmp(sums, f->xxh3, n * sizeof(*sums)) != 0)) {
		snprintf(why, whylen,
			 "%s: its bytes in the store (%" PRIu64 ") are not the ones written (%" PRIu64 ")",
			 f->path, size, f->size);
		rc = -SF_ECHECKSUM;
	}
	free(sums);
	return rc;
}

int sf_save_seal(int storefd, const char *store, const char *name,
		 uint64_t block_size, const struct sf_save_file *files,
		 size_t n, struct sf_ckpt **out, char *why, size_t whylen)
{
	struct sf_ckpt *ck = NULL;
	struct sf_index *ix = NULL;
	int rc;

	why[0] = '\0';
	/* a stale index (a re-save) is never matched against new files */
	{
		int dfd = sf_open_beneath(storefd, name, O_RDONLY | O_DIRECTORY);

		if (dfd >= 0) {
			(void)unlinkat(dfd, SF_INDEX_NAME, 0);
			close(dfd);
		}
	}
	rc = sf_ckpt_open_at(storefd, store, name, NULL, &ck, why, whylen);
	if (rc)
		return rc;
	if (ck->fmt->writable) {
		snprintf(why, whylen, "a %s checkpoint is not saved as plain files", ck->fmt->name);
		rc = -EINVAL;
		goto out_close;
	}
	for (size_t i = 0; i < n; i++) {
		rc = check_file(ck->dirfd, block_size, &files[i], why, whylen);
		if (rc)
			goto out_close;
	}
	rc = sf_index_build(ck->dirfd, ck->m, ck->fmt->name,
			    ck->m->block_size ? ck->m->block_size : SF_DEFAULT_BLOCK_SIZE,
			    NULL, NULL, &ix, why, whylen);
	if (!rc)
		rc = sf_index_write(ck->dirfd, ix, why, whylen);
	sf_index_free(ix);
	if (rc)
		goto out_close;
	sf_ckpt_close(ck);
	ck = NULL;
	rc = sf_ckpt_open_at(storefd, store, name, NULL, &ck, why, whylen);
	if (rc)
		return rc;
	if (!sf_model_verified(ck->m)) {
		snprintf(why, whylen, "its index was not applied");
		rc = -SF_EMANIFEST;
		goto out_close;
	}
	*out = ck;
	return 0;
out_close:
	sf_ckpt_close(ck);
	return rc;
}
