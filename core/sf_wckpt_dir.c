/*
 * sf_wckpt_dir.c - claiming and retiring the directories of shardfs/1
 * checkpoints in a store (see sf_wckpt_dir.h): the write side's file
 * operations on a checkpoint as a whole, below the writable checkpoint
 * itself (sf_wckpt.c).
 *
 * Invariants: a new checkpoint directory appears atomically with its
 * marker (made under a hidden name, then renamed into place without
 * replacing anything); a directory shardfs did not make, or a committed
 * one, is never adopted; a deleted checkpoint loses its manifest.json
 * before it is renamed aside, so a crash never leaves a committed
 * checkpoint with missing payloads. Every path is resolved through
 * sf_confine (beneath the store, no symlink followed).
 */
#include "sf_wckpt_dir.h"
#include "sf_confine.h"
#include "sf_log.h"
#include "sf_manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool sf_wckpt_dir_is_ours(const char *dir)
{
	char path[4096];
	struct dirent *de;
	struct stat sb;
	unsigned seen = 0;
	bool ours = false;
	DIR *d;

	if ((size_t)snprintf(path, sizeof(path), "%s/" SF_SHARDFS_MARKER, dir) >=
	    sizeof(path))
		return false;
	if (sf_c_lstat(path, &sb) == 0 && S_ISREG(sb.st_mode))
		return true;
	d = sf_c_opendir(dir);
	if (!d)
		return false;
	/* Bounded: a directory shardfs made holds a few rank directories. */
	while (!ours && seen++ < 4096 && (de = readdir(d))) {
		unsigned r;
		char tail;

		if (sscanf(de->d_name, SF_SHARDFS_RANK_PREFIX "%5u%c", &r, &tail) != 1 ||
		    strlen(de->d_name) != 10)
			continue;
		if ((size_t)snprintf(path, sizeof(path), "%s/%s/" SF_SHARDFS_JOURNAL, dir,
				     de->d_name) >= sizeof(path))
			continue;
		ours = sf_c_lstat(path, &sb) == 0 && S_ISREG(sb.st_mode);
	}
	closedir(d);
	return ours;
}

/* Is dir a committed checkpoint? */
static bool dir_has_manifest(const char *dir)
{
	char path[4096];
	struct stat sb;

	if ((size_t)snprintf(path, sizeof(path), "%s/" SF_SHARDFS_MANIFEST, dir) >=
	    sizeof(path))
		return false;
	return sf_c_lstat(path, &sb) == 0;
}

/* An existing dir: ours to write into, or -EEXIST. */
static int claim_existing(const char *dir)
{
	struct stat sb;

	if (sf_c_lstat(dir, &sb) != 0)
		return -errno;
	if (!S_ISDIR(sb.st_mode) || dir_has_manifest(dir) ||
	    !sf_wckpt_dir_is_ours(dir))
		return -EEXIST;
	return 0;
}

int sf_wckpt_claim_dir(const char *dir)
{
	static const char marker[] = "{\"format\": \"shardfs/1\"}\n";
	static _Atomic unsigned seq;
	const char *slash = strrchr(dir, '/');
	char *tmp = NULL, *mpath = NULL;
	int fd, rc;

	if (!slash || !slash[1])
		return -EINVAL;
	if (sf_c_exists(dir))
		return claim_existing(dir);
	if (asprintf(&tmp, "%.*s/.creating-%s-%d-%u", (int)(slash - dir), dir,
		     slash + 1, (int)getpid(), seq++) < 0) {
		tmp = NULL;
		return -ENOMEM;
	}
	if (asprintf(&mpath, "%s/" SF_SHARDFS_MARKER, tmp) < 0) {
		mpath = NULL;
		rc = -ENOMEM;
		goto out_free;
	}
	if (sf_c_mkdir(tmp, 0755) != 0) {
		rc = -errno;
		goto out_free;
	}
	fd = sf_c_open(mpath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out_remove_tmp;
	}
	rc = write(fd, marker, sizeof(marker) - 1) == (ssize_t)(sizeof(marker) - 1) ?
	     0 : -EIO;
	close(fd);
	if (rc)
		goto out_remove_tmp;
	if (sf_c_rename(tmp, dir, RENAME_NOREPLACE) == 0)
		goto out_free;
	rc = -errno;
	if (rc == -EEXIST || rc == -ENOTEMPTY) /* made meanwhile: by whom? */
		rc = claim_existing(dir);
out_remove_tmp:
	(void)sf_c_unlink(mpath);
	(void)sf_c_rmdir(tmp);
out_free:
	free(mpath);
	free(tmp);
	return rc;
}

bool sf_wckpt_rank_wrote(const char *dir, uint32_t rank)
{
	char path[4096];

	if ((size_t)snprintf(path, sizeof(path), "%s/" SF_SHARDFS_RANK_FMT "/"
			     SF_SHARDFS_JOURNAL, dir, rank) >= sizeof(path))
		return false;
	return sf_c_exists(path);
}

int sf_wckpt_retire(const char *store, const char *dir, const char *name,
		    char **gone, char *why, size_t whylen)
{
	static _Atomic unsigned seq;
	char *mpath = NULL;
	int rc = 0;

	*gone = NULL;
	if (asprintf(&mpath, "%s/" SF_SHARDFS_MANIFEST, dir) < 0) {
		mpath = NULL;
		return -ENOMEM;
	}
	if (asprintf(gone, "%s/.deleted-%s-%d-%u", store, name, (int)getpid(),
		     seq++) < 0) {
		*gone = NULL;
		rc = -ENOMEM;
		goto out_free;
	}
	if (sf_c_unlink(mpath) != 0 && errno != ENOENT) {
		rc = -errno;
		snprintf(why, whylen, "%s: %s", mpath, strerror(errno));
		goto out_free;
	}
	if (sf_c_rename(dir, *gone, 0) != 0) {
		rc = -errno;
		snprintf(why, whylen, "rename %s: %s", dir, strerror(errno));
	}
out_free:
	if (rc) {
		free(*gone);
		*gone = NULL;
	}
	free(mpath);
	return rc;
}

void sf_wckpt_remove_retired(const char *gone)
{
	int rc = sf_c_remove_tree(gone);

	if (rc)
		sf_warn("delete: %s: %s", gone, strerror(-rc));
}
