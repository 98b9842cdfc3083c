/*
 * shardctl_ckpt.c - a checkpoint as shardctl's info and diff read it,
 * wherever it is:
 *
 *   in a shardfs mount   its manifest.json as the mount shows it (any
 *                        format's: sf_manifest_parse_shown), its bytes
 *                        read from the mount's own files (tensors/NAME,
 *                        objects/NAME, root files), which the daemon
 *                        assembles and verifies with core's engine;
 *   on disk              opened through the format seam exactly as the
 *                        daemon opens it (sf_ckpt_open: any format, a
 *                        foreign one with its shardfs.index.json), its
 *                        bytes read with core's engine (sf_engine_read).
 *
 * So a checkpoint reads the same in both places and whatever wrote it.
 * Nothing here writes. Everything read is bounded: a manifest by
 * SF_MAX_MANIFEST_BYTES; tensor bytes only in the caller's buffer.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "sf_error.h"
#include "sf_io.h"
#include "sf_manifest.h"
#include "sf_views.h"
#include "shardctl.h"

bool ctl_in_mount(const char *path)
{
	struct statfs fs;

	return statfs(path, &fs) == 0 && fs.f_type == FUSE_SUPER_MAGIC;
}

bool has_manifest(const char *dir)
{
	char *path;
	bool yes;

	if (asprintf(&path, "%s/" SF_VIEW_MANIFEST, dir) < 0)
		return false;
	yes = access(path, F_OK) == 0;
	free(path);
	return yes;
}

/* Read dir/manifest.json (bounded; a FIFO planted there fails instead of
 * blocking) and parse it, strictly or as a mount shows it. */
static int read_manifest(const char *cmd, const char *dir, bool shown,
			 struct sf_model **m)
{
	char err[512] = "", path[PATH_MAX];
	size_t len = 0;
	char *json = NULL;
	int rc;

	if ((size_t)snprintf(path, sizeof(path), "%s/" SF_VIEW_MANIFEST, dir) >=
	    sizeof(path)) {
		fprintf(stderr, "shardctl %s: %s: %s\n", cmd, dir,
			sf_strerror(-ENAMETOOLONG));
		return -ENAMETOOLONG;
	}
	rc = sf_read_file(path, SF_MAX_MANIFEST_BYTES, &json, &len);
	if (rc < 0) {
		fprintf(stderr, "shardctl %s: %s: %s\n", cmd, path,
			rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
		return rc;
	}
	rc = shown ? sf_manifest_parse_shown(json, len, m, err, sizeof(err)) :
		     sf_manifest_parse(json, len, m, err, sizeof(err));
	free(json);
	if (rc < 0)
		fprintf(stderr, "shardctl %s: %s: invalid manifest: %s\n",
			cmd, path, err[0] ? err : sf_strerror(rc));
	return rc;
}

int load_manifest(const char *cmd, const char *dir, struct sf_model **m)
{
	return read_manifest(cmd, dir, ctl_in_mount(dir), m);
}

int ctl_ckpt_open(const char *cmd, const char *path, struct ctl_ckpt **out)
{
	struct ctl_ckpt *c;
	char err[512] = "";
	struct stat sb;
	int rc;

	*out = NULL;
	if (stat(path, &sb) < 0) {
		rc = -errno;
		fprintf(stderr, "shardctl %s: %s: %s\n", cmd, path, strerror(errno));
		return rc;
	}
	if (!S_ISDIR(sb.st_mode)) {
		fprintf(stderr, "shardctl %s: %s: not a directory\n", cmd, path);
		return -ENOTDIR;
	}
	c = calloc(1, sizeof(*c));
	if (!c || !(c->dir = realpath(path, NULL))) {
		rc = c ? -errno : -ENOMEM;
		fprintf(stderr, "shardctl %s: %s: %s\n", cmd, path, sf_strerror(rc));
		free(c);
		return rc;
	}
	c->fd = -1;
	c->in_mount = ctl_in_mount(c->dir);
	if (c->in_mount) {
		if (!has_manifest(c->dir)) {
			fprintf(stderr, "shardctl %s: %s: not a committed checkpoint (no manifest.json: a store, or one being written)\n",
				cmd, path);
			rc = -ENOENT;
			goto out_close;
		}
		rc = read_manifest(cmd, c->dir, true, &c->own);
		if (rc < 0)
			goto out_close;
		c->m = c->own;
	} else {
		rc = sf_ckpt_open(c->dir, NULL, &c->ck, err, sizeof(err));
		if (rc < 0) {
			fprintf(stderr, "shardctl %s: %s: %s\n", cmd, path,
				err[0] ? err : sf_strerror(rc));
			goto out_close;
		}
		c->m = c->ck->m;
	}
	c->ref.dir = c->dir;
	c->ref.name = c->m->name;
	*out = c;
	return 0;

out_close:
	ctl_ckpt_close(c);
	return rc;
}

void ctl_ckpt_close(struct ctl_ckpt *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	sf_ckpt_close(c->ck);
	sf_model_destroy(c->own);
	free(c->dir);
	free(c);
}

/* The mount's file of entry t: DIR/tensors/NAME, DIR/objects/NAME or
 * DIR/NAME (names are validated: no "..", no leading '/'). */
static int open_mount_entry(struct ctl_ckpt *c, enum sf_entry_kind kind,
			    const struct sf_tensor *t)
{
	const char *sub = kind == SF_ENTRY_TENSOR ? SF_VIEW_TENSORS "/" :
			  kind == SF_ENTRY_OBJECT ? SF_VIEW_OBJECTS "/" : "";
	char *path;

	if (c->fd >= 0 && c->fd_of == t)
		return 0;
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->fd_of = NULL;
	if (asprintf(&path, "%s/%s%s", c->dir, sub, t->name) < 0)
		return -ENOMEM;
	c->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	free(path);
	if (c->fd < 0)
		return -errno;
	c->fd_of = t;
	return 0;
}

int ctl_ckpt_read(struct ctl_ckpt *c, struct sf_engine *e,
		  enum sf_entry_kind kind, const struct sf_tensor *t,
		  uint64_t off, void *buf, size_t len)
{
	int rc;

	if (!c->in_mount)
		return sf_engine_read(e, &c->ref, c->m, t, NULL, off, buf, len);
	rc = open_mount_entry(c, kind, t);
	if (rc < 0)
		return rc;
	return sf_pread_full(c->fd, buf, len, off);
}

void ctl_ckpt_forget(struct ctl_ckpt *c, struct sf_engine *e)
{
	if (!c->in_mount && e)
		sf_engine_forget(e, &c->ref);
}
