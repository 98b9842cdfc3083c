/*
 * sf_fs_where.c - user.shardfs.where (issue 29, 2): where the bytes of a
 * committed tensor lie in this node's store, so that a loader on this
 * node (the Python package's direct reader) reads them itself, with its
 * own permissions, and checks them against the checksums given here.
 *
 * The value: {"block_size": B, "nbytes": N, "shards": [ENTRY, ...]}, one
 * ENTRY per shard of the tensor in its order: {"shard": SHARD} with SHARD
 * as manifest.json writes it (geometry, file, file_offset, nbytes, xxh3),
 * plus either "path" (absolute), "dev", "ino", "size", "mtime_ns" of the
 * file as this daemon opened it, or "why": the reason it is not offered,
 * for the caller to read those bytes through the mount.
 *
 * Invariants:
 *  - a path is given only for a shard stored plain (no codec, no
 *    strides) with checksums, whose file this daemon opens beneath the
 *    checkpoint as its payload sources do (sf_open_payload_ref: nothing
 *    outside the checkpoint, a hub snapshot's link only to its blobs/) and
 *    finds a regular file holding [file_offset, file_offset + nbytes);
 *  - and only to a caller who could open that file itself: root, or by
 *    the mode bits for the caller's uid, gid and groups, search on every
 *    directory of the path from "/" and read on the file, none of them
 *    carrying a POSIX ACL (an ACL may deny what the bits allow: such a
 *    file is not offered). The caller's own open(2) is the real check;
 *    this one only keeps a path from being told to whom it is closed;
 *  - nothing here grants anything: the caller opens the path itself, and
 *    a file changed or swapped since is found by its identity (dev, ino,
 *    size, mtime_ns) and by the checksums, then read through the mount;
 *  - the value is bounded by SF_FS_MAX_XATTR (-E2BIG beyond it: the
 *    caller reads the tensor through the mount).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "sf_error.h"
#include "sf_jw.h"
#include "sf_manifest.h"
#include "sf_open.h"
#include "sf_fs_internal.h"

#define WHERE_MAX_GROUPS 256        /* supplementary groups looked at */

/* Who asks: uid, gid, groups (fuse_req_getgroups). */
struct caller {
	uid_t uid;
	gid_t gid;
	gid_t groups[WHERE_MAX_GROUPS];
	int ngroups;                 /* -1: unknown (then only uid/gid count) */
};

static bool in_group(const struct caller *c, gid_t g)
{
	if (g == c->gid)
		return true;
	for (int i = 0; i < c->ngroups; i++)
		if (c->groups[i] == g)
			return true;
	return false;
}

/* May c do `want` (S_IROTH or S_IXOTH weight: 4 or 1) on st by its bits? */
static bool bits_allow(const struct caller *c, const struct stat *st,
		       unsigned want)
{
	unsigned m = (unsigned)st->st_mode;

	if (c->uid == st->st_uid)
		return ((m >> 6) & want) == want;
	if (in_group(c, st->st_gid))
		return ((m >> 3) & want) == want;
	return (m & want) == want;
}

static bool has_acl(const char *path)
{
	ssize_t n = lgetxattr(path, "system.posix_acl_access", NULL, 0);

	return n >= 0 || (errno != ENODATA && errno != ENOTSUP);
}

/* Could c open path (absolute, no symlink in it) for reading? Search on
 * "/" and every directory below it, read on the file. */
static bool caller_may_read(const struct caller *c, const char *path)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);
	struct stat st;

	if (c->uid == 0)
		return true;
	if (n < 2 || n >= sizeof(buf) || path[0] != '/' ||
	    lstat("/", &st) != 0 || !bits_allow(c, &st, 1))
		return false;
	memcpy(buf, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		bool last = buf[i] == '\0';

		if (buf[i] != '/' && !last)
			continue;
		buf[i] = '\0';
		if (lstat(buf, &st) != 0 || has_acl(buf))
			return false;
		if (last)
			return S_ISREG(st.st_mode) && bits_allow(c, &st, 4);
		if (!S_ISDIR(st.st_mode) || !bits_allow(c, &st, 1))
			return false;
		buf[i] = '/';
	}
	return false;
}

/* The file of shard s: *why when it is not offered; else path and st. */
static const char *locate(const struct sf_ckpt_ref *ref,
			  const struct sf_shard *s, const struct caller *c,
			  char *path, size_t pathlen, struct stat *st)
{
	char proc[64];
	ssize_t n;
	int fd;

	if (s->codec != SF_CODEC_NONE)
		return "stored compressed";
	if (s->strides)
		return "stored with strides";
	if (!s->xxh3)
		return "no checksums";
	fd = sf_open_payload_ref(ref, s->file);
	if (fd < 0)
		return "not in this node's store";
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	n = readlink(proc, path, pathlen - 1);
	if (n <= 0 || (size_t)n >= pathlen - 1 || fstat(fd, st) != 0) {
		close(fd);
		return "its path cannot be told";
	}
	close(fd);
	path[n] = '\0';
	if (path[0] != '/')
		return "its path cannot be told";
	if (!S_ISREG(st->st_mode) ||
	    (uint64_t)st->st_size < s->file_offset + s->nbytes)
		return "not in this node's store";
	if (!caller_may_read(c, path))
		return "not readable by the caller";
	return NULL;
}

int sf_fs_where_json(struct sf_fs *fs, fuse_req_t req, struct sf_node *n,
		     char **out, size_t *len)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	const struct sf_ckpt *ck = n->ck->ck;
	const struct sf_tensor *t = n->t;
	struct sf_jw w = { .pretty = false, .max = SF_FS_MAX_XATTR };
	struct caller c = { .uid = ctx->uid, .gid = ctx->gid };
	char path[PATH_MAX];
	int rc;

	(void)fs;
	c.ngroups = fuse_req_getgroups(req, WHERE_MAX_GROUPS, c.groups);
	if (c.ngroups > WHERE_MAX_GROUPS)
		c.ngroups = -1; /* more than we looked at: uid and gid only */
	if (c.ngroups < 0)
		c.ngroups = 0;
	sf_jw_lit(&w, "{\"block_size\":");
	sf_jw_u64(&w, ck->m->block_size);
	sf_jw_lit(&w, ",\"nbytes\":");
	sf_jw_u64(&w, t->nbytes);
	sf_jw_lit(&w, ",\"shards\":[");
	for (size_t i = 0; i < t->nshards && !w.err; i++) {
		const struct sf_shard *s = &t->shards[i];
		struct stat st;
		const char *why = locate(&ck->ref, s, &c, path, sizeof(path), &st);

		if (i)
			sf_jw_comma(&w);
		sf_jw_lit(&w, "{\"shard\":");
		sf_manifest_put_shard(&w, t->ndim, s, true);
		if (why) {
			sf_jw_lit(&w, ",\"why\":");
			sf_jw_str(&w, why);
		} else {
			sf_jw_lit(&w, ",\"path\":");
			sf_jw_str(&w, path);
			sf_jw_lit(&w, ",\"dev\":");
			sf_jw_u64(&w, (uint64_t)st.st_dev);
			sf_jw_lit(&w, ",\"ino\":");
			sf_jw_u64(&w, (uint64_t)st.st_ino);
			sf_jw_lit(&w, ",\"size\":");
			sf_jw_u64(&w, (uint64_t)st.st_size);
			sf_jw_lit(&w, ",\"mtime_ns\":");
			sf_jw_u64(&w, (uint64_t)st.st_mtim.tv_sec * 1000000000u +
					 (uint64_t)st.st_mtim.tv_nsec);
		}
		sf_jw_mem(&w, "}", 1);
	}
	sf_jw_lit(&w, "]}");
	rc = sf_jw_finish(&w, out, len);
	return rc == -SF_ETOOBIG ? -E2BIG : rc;
}
