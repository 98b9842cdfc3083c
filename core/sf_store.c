/*
 * sf_store.c - scanning a store and opening committed checkpoints.
 *
 * A checkpoint directory is committed iff it holds manifest.json (the
 * writer publishes it last, atomically). Opening reads the manifest with a
 * size bound, validates it completely and precomputes the safetensors
 * layout; a checkpoint that fails is reported (and logged) but never stops
 * the others.
 */
#include "sf_store.h"
#include "sf_array.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int sf_ckpt_open(const char *dir, const char *name, struct sf_ckpt **out,
		 char *err, size_t errlen)
{
	struct sf_ckpt *ck;
	char path[4096];
	const char *base;
	int ret;

	if (errlen)
		err[0] = '\0';
	ck = calloc(1, sizeof(*ck));
	if (!ck)
		return -ENOMEM;
	ck->dir = realpath(dir, NULL);
	if (!ck->dir) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", dir, sf_strerror(ret));
		goto out_close;
	}
	base = strrchr(ck->dir, '/');
	base = base && base[1] ? base + 1 : ck->dir;
	ck->name = strdup(name ? name : base);
	if (!ck->name) {
		ret = -ENOMEM;
		goto out_close;
	}
	if ((size_t)snprintf(path, sizeof(path), "%s/manifest.json", ck->dir) >=
	    sizeof(path)) {
		ret = -ENAMETOOLONG;
		snprintf(err, errlen, "path too long");
		goto out_close;
	}
	ret = sf_read_file(path, SF_MAX_MANIFEST_BYTES, &ck->manifest_json,
			&ck->manifest_len);
	if (ret) {
		snprintf(err, errlen, "manifest.json: %s",
			 ret == -EINVAL ? "not a regular file" : sf_strerror(ret));
		goto out_close;
	}
	ret = sf_manifest_parse(ck->manifest_json, ck->manifest_len, &ck->m,
				err, errlen);
	if (ret)
		goto out_close;
	ret = sf_st_layout_build(ck->m, &ck->st);
	if (ret) {
		snprintf(err, errlen, "model.safetensors layout: %s",
			 sf_strerror(ret));
		goto out_close;
	}
	ck->ref.dir = ck->dir;
	ck->ref.name = ck->name;
	*out = ck;
	return 0;

out_close:
	sf_ckpt_close(ck);
	return ret;
}

void sf_ckpt_close(struct sf_ckpt *ck)
{
	if (!ck)
		return;
	sf_st_layout_destroy(ck->st);
	sf_manifest_destroy(ck->m);
	free(ck->manifest_json);
	free(ck->name);
	free(ck->dir);
	free(ck);
}

/* AND the modes of the regular files in dir (and, with depth 1, of its
 * subdirectories' files) into *mode; *budget counts entries looked at. */
static void and_file_modes(int dirfd, int depth, unsigned *mode,
			   unsigned *budget)
{
	struct dirent *de;
	DIR *d = fdopendir(dirfd);

	if (!d) {
		close(dirfd);
		return;
	}
	while (*budget > 0 && (de = readdir(d))) {
		struct stat sb;

		if (de->d_name[0] == '.')
			continue;
		(*budget)--;
		if (fstatat(dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		if (S_ISREG(sb.st_mode)) {
			*mode &= (unsigned)sb.st_mode & 0777;
		} else if (S_ISDIR(sb.st_mode) && depth > 0) {
			int sub = openat(dirfd, de->d_name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sub >= 0)
				and_file_modes(sub, depth - 1, mode, budget);
		}
	}
	closedir(d);
}

int sf_store_perms(const char *dir, struct sf_perms *out)
{
	unsigned budget = SF_PERMS_MAX_FILES;
	struct stat sb;
	int fd;

	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) != 0) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	out->uid = sb.st_uid;
	out->gid = sb.st_gid;
	out->dir_mode = (unsigned)sb.st_mode & 07777;
	out->file_mode = 0777;
	and_file_modes(fd, 1, &out->file_mode, &budget); /* closes fd */
	return 0;
}

static int has_manifest(const char *dir)
{
	char path[4096];
	struct stat sb;

	if ((size_t)snprintf(path, sizeof(path), "%s/manifest.json", dir) >=
	    sizeof(path))
		return 0;
	return lstat(path, &sb) == 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void open_one(const char *dir, const char *name, sf_store_fn fn,
		     void *arg)
{
	struct sf_ckpt *ck = NULL;
	char why[512];
	int ret;

	if (!has_manifest(dir)) {
		fn(arg, name, dir, NULL, 0, NULL);
		return;
	}
	ret = sf_ckpt_open(dir, name, &ck, why, sizeof(why));
	if (ret) {
		sf_err("checkpoint %s left out: %s", name, why[0] ? why : sf_strerror(ret));
		fn(arg, name, dir, NULL, ret, why);
		return;
	}
	fn(arg, name, dir, ck, 0, NULL);
}

int sf_store_scan(const char *store, sf_store_fn fn, void *arg, int *single)
{
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;
	DIR *d;
	int ret = 0;

	*single = 0;
	if (has_manifest(store)) {
		char *real = realpath(store, NULL);
		const char *base;
		const char *nm;

		if (!real)
			return -errno;
		base = strrchr(real, '/');
		nm = base && base[1] ? base + 1 : real;
		*single = 1;
		open_one(real, nm, fn, arg);
		free(real);
		return 0;
	}
	d = opendir(store);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		char path[4096];
		struct stat sb;

		if (de->d_name[0] == '.')
			continue; /* hidden: shardfs's own .deleted-* and .creating-* */
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", store,
				     de->d_name) >= sizeof(path)) {
			sf_warn("store: %s skipped: path too long", de->d_name);
			continue;
		}
		if (stat(path, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
			sf_info("store: %s skipped: not a directory", de->d_name);
			continue;
		}
		ret = sf_array_grow(&names, n, &cap, sizeof(*names), 16, 0);
		if (ret < 0)
			goto out_free_names;
		names[n] = strdup(de->d_name);
		if (!names[n]) {
			ret = -ENOMEM;
			goto out_free_names;
		}
		n++;
	}
	if (n > 1) /* qsort wants a non-NULL array even for 0 elements */
		qsort(names, n, sizeof(*names), cmp_names);
	for (size_t i = 0; i < n; i++) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", store, names[i]);
		open_one(path, names[i], fn, arg);
	}
out_free_names:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	closedir(d);
	return ret;
}
