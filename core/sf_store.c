/*
 * sf_store.c - scanning a store and opening checkpoints through the format
 * seam (see sf_store.h).
 *
 * Which directories are checkpoints is the adapters' call (sf_format.h):
 * a complete one is opened (its model built and validated, a foreign
 * one's shardfs.index.json checksums attached (sf_index.h), the
 * safetensors layout precomputed); one shardfs is writing goes to the
 * caller to resume; anything else is left out with one log line. A
 * checkpoint that fails to open never stops the others.
 */
#include "sf_store.h"
#include "sf_array.h"
#include "sf_error.h"
#include "sf_index.h"
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
	struct sf_format_result res = { 0 };
	struct sf_dirlist ls = { 0 };
	enum sf_probe how;
	struct sf_ckpt *ck;
	struct stat sb;
	const char *base;
	int dirfd = -1, ret;

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
	dirfd = open(ck->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0 || fstat(dirfd, &sb) != 0) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", ck->dir, sf_strerror(ret));
		goto out_close;
	}
	ck->mtime = sb.st_mtim;
	ret = sf_dirlist_read(dirfd, &ls);
	if (ret) {
		snprintf(err, errlen, "cannot list it: %s", sf_strerror(ret));
		goto out_close;
	}
	ck->fmt = sf_format_probe(&ls, &how);
	sf_dirlist_free(&ls);
	if (how != SF_PROBE_YES) {
		ret = -ENOENT;
		snprintf(err, errlen, "%s", how == SF_PROBE_PARTIAL ?
			 "not complete yet (still being written)" :
			 "no format shardfs reads recognizes it");
		goto out_close;
	}
	ret = ck->fmt->open(dirfd, ck->dir, ck->name, &res, err, errlen);
	if (ret)
		goto out_close;
	/* checksums shardctl index keeps for a format that has none */
	if (!ck->fmt->writable)
		sf_index_load(dirfd, ck->name, ck->fmt, &res, NULL);
	ck->m = res.model;
	ck->manifest_json = res.meta;
	ck->manifest_len = res.metalen;
	res.model = NULL;
	res.meta = NULL;
	ret = sf_st_layout_build(ck->m, &ck->st);
	if (ret) {
		snprintf(err, errlen, "model.safetensors layout: %s",
			 sf_strerror(ret));
		goto out_close;
	}
	ck->ref.dir = ck->dir;
	ck->ref.name = ck->name;
	close(dirfd);
	*out = ck;
	return 0;

out_close:
	sf_format_result_clear(&res);
	if (dirfd >= 0)
		close(dirfd);
	sf_ckpt_close(ck);
	return ret;
}

void sf_ckpt_close(struct sf_ckpt *ck)
{
	if (!ck)
		return;
	sf_st_layout_destroy(ck->st);
	sf_model_destroy(ck->m);
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

/* What the adapters say of directory dir: *how, and the format. */
static const struct sf_format *probe_dir(const char *dir, enum sf_probe *how)
{
	struct sf_dirlist ls = { 0 };
	const struct sf_format *fmt = NULL;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	*how = SF_PROBE_NO;
	if (fd < 0)
		return NULL;
	if (sf_dirlist_read(fd, &ls) == 0)
		fmt = sf_format_probe(&ls, how);
	sf_dirlist_free(&ls);
	close(fd);
	return fmt;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void open_one(const char *dir, const char *name, sf_store_fn fn,
		     void *arg)
{
	struct sf_ckpt *ck = NULL;
	const struct sf_format *fmt;
	enum sf_probe how;
	char why[512];
	int ret;

	fmt = probe_dir(dir, &how);
	if (how == SF_PROBE_NO) {
		sf_warn("store: %s skipped: no format shardfs reads recognizes it", name);
		return;
	}
	if (how == SF_PROBE_PARTIAL) {
		if (fmt->writable)
			fn(arg, name, dir, NULL, 0, NULL);
		else
			sf_warn("store: %s skipped: a %s checkpoint still being written; shown once complete",
				name, fmt->name);
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

bool sf_store_is_single(const char *store)
{
	enum sf_probe how;

	(void)probe_dir(store, &how);
	return how == SF_PROBE_YES;
}

int sf_store_scan(const char *store, sf_store_fn fn, void *arg, int *single)
{
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;
	DIR *d;
	int ret = 0;

	*single = 0;
	if (sf_store_is_single(store)) {
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
