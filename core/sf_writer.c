/*
 * sf_writer.c - append-only payload files and durable manifest publishing.
 *
 * A payload handle owns one open file in CKPT/rank-NNNNN/ and at most one
 * shard in progress; the shard's checksums are computed as its bytes are
 * appended (sf_blockhash), so nothing is buffered beyond one write call.
 * Invariant: end == the file's size == the next shard's file_offset.
 */
#include "sf_writer.h"
#include "sf_confine.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct sf_payload {
	int fd;                      /* O_WRONLY, owned */
	uint32_t rank;
	char *relpath;               /* "rank-NNNNN/fname", owned */
	uint64_t block_size;         /* bytes */
	uint64_t end;                /* bytes written to the file */
	uint64_t shard_start;        /* file offset of the shard in progress */
	struct sf_blockhash *bh;     /* non-NULL while a shard is in progress */
};

int sf_mkdir_p(const char *path)
{
	char buf[4096];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return -ENAMETOOLONG;
	/* The whole path first: it is usually there already (every writer
	 * open and payload file asks again), and then one call does. */
	if (sf_c_mkdir(path, 0755) == 0 || errno == EEXIST)
		return 0;
	if (errno != ENOENT)
		return -errno;
	memcpy(buf, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != '\0')
			continue;
		buf[i] = '\0';
		if (sf_c_mkdir(buf, 0755) < 0 && errno != EEXIST)
			return -errno;
		buf[i] = path[i];
	}
	return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
	const unsigned char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int sf_payload_open(const char *ckpt_dir, uint32_t rank, const char *fname,
		    uint64_t block_size, struct sf_payload **out)
{
	struct sf_payload *p;
	char dir[4096], path[4096];
	int ret;

	if (!fname[0] || strchr(fname, '/') || fname[0] == '.' ||
	    block_size < SF_MIN_BLOCK_SIZE || block_size > SF_MAX_BLOCK_SIZE)
		return -EINVAL;
	if ((size_t)snprintf(dir, sizeof(dir), "%s/" SF_SHARDFS_RANK_FMT, ckpt_dir, rank) >=
	    sizeof(dir) ||
	    (size_t)snprintf(path, sizeof(path), "%s/%s", dir, fname) >= sizeof(path))
		return -ENAMETOOLONG;
	ret = sf_mkdir_p(dir);
	if (ret)
		return ret;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	if (asprintf(&p->relpath, SF_SHARDFS_RANK_FMT "/%s", rank, fname) < 0) {
		p->relpath = NULL;
		ret = -ENOMEM;
		goto out_free;
	}
	p->fd = sf_c_open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (p->fd < 0) {
		ret = -errno;
		goto out_free;
	}
	p->rank = rank;
	p->block_size = block_size;
	*out = p;
	return 0;

out_free:
	free(p->relpath);
	free(p);
	return ret;
}

int sf_payload_begin(struct sf_payload *p)
{
	if (p->bh)
		return -EBUSY;
	p->bh = sf_blockhash_create(p->block_size);
	if (!p->bh)
		return -ENOMEM;
	p->shard_start = p->end;
	return 0;
}

int sf_payload_write(struct sf_payload *p, const void *buf, size_t len)
{
	int ret;

	if (!p->bh)
		return -EINVAL;
	ret = write_full(p->fd, buf, len);
	if (ret)
		return ret;
	p->end += len;
	return sf_blockhash_update(p->bh, buf, len);
}

int sf_payload_end(struct sf_payload *p, struct sf_shard *out)
{
	const uint64_t *sums;
	size_t n;
	int ret;

	if (!p->bh)
		return -EINVAL;
	ret = sf_blockhash_final(p->bh, &sums, &n);
	if (ret)
		return ret;
	memset(out, 0, sizeof(*out));
	out->rank = p->rank;
	out->file = strdup(p->relpath);
	out->xxh3 = malloc(n ? n * sizeof(uint64_t) : 1);
	if (!out->file || !out->xxh3) {
		sf_shard_clear(out);
		return -ENOMEM;
	}
	memcpy(out->xxh3, sums, n * sizeof(uint64_t));
	out->nblocks = n;
	out->file_offset = p->shard_start;
	out->nbytes = p->end - p->shard_start;
	sf_blockhash_destroy(p->bh);
	p->bh = NULL;
	return 0;
}

int sf_payload_close(struct sf_payload *p, bool do_fsync)
{
	int ret = 0;

	if (!p)
		return 0;
	if (do_fsync && fsync(p->fd) < 0)
		ret = -errno;
	if (close(p->fd) < 0 && !ret)
		ret = -errno;
	sf_blockhash_destroy(p->bh);
	free(p->relpath);
	free(p);
	return ret;
}

static int fsync_dir(const char *dir)
{
	int fd = sf_c_open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	int ret = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

int sf_write_atomic(const char *dir, const char *fname, const void *buf,
		    size_t len)
{
	char tmp[4096], path[4096];
	int fd, ret;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s/.%s.tmp.%d", dir, fname,
			     (int)getpid()) >= sizeof(tmp) ||
	    (size_t)snprintf(path, sizeof(path), "%s/%s", dir, fname) >=
	    sizeof(path))
		return -ENAMETOOLONG;
	fd = sf_c_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	ret = write_full(fd, buf, len);
	if (!ret && fsync(fd) < 0)
		ret = -errno;
	if (close(fd) < 0 && !ret)
		ret = -errno;
	if (ret)
		goto out_unlink_tmp;
	if (sf_c_rename(tmp, path, 0) < 0) {
		ret = -errno;
		goto out_unlink_tmp;
	}
	return fsync_dir(dir);

out_unlink_tmp:
	sf_c_unlink(tmp);
	return ret;
}

int sf_shardfs_publish(const char *ckpt_dir, const struct sf_model *m)
{
	char *text = NULL;
	size_t len;
	int ret;

	ret = sf_manifest_dump(m, &text, &len);
	if (ret)
		return ret;
	ret = sf_write_atomic(ckpt_dir, SF_SHARDFS_MANIFEST, text, len);
	free(text);
	return ret;
}
