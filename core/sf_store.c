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

int sf_ckpt_open_src(const char *dir, const char *name, struct sf_source *src,
		     struct sf_ckpt **out, char *err, size_t errlen)
{
	struct sf_format_result res = { 0 };
	struct sf_dirlist ls = { 0 };
	struct sf_cdir cd = { .dirfd = -1 };
	enum sf_probe how;
	struct sf_ckpt *ck;
	struct stat sb;
	const char *base;
	int ret;

	if (errlen)
		err[0] = '\0';
	ck = calloc(1, sizeof(*ck));
	if (!ck)
		return -ENOMEM;
	ck->dir = realpath(dir, NULL);
	if (!ck->dir && errno == ENOENT && src && name && dir[0] == '/') {
		/* None of it here: every file is a peer's (MPI). */
		ck->dir = strdup(dir);
		if (!ck->dir) {
			ret = -ENOMEM;
			goto out_close;
		}
		clock_gettime(CLOCK_REALTIME, &ck->mtime);
	} else if (!ck->dir) {
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
	cd.dir = ck->dir;
	cd.name = ck->name;
	cd.src = src;
	cd.ref.dir = ck->dir;
	cd.ref.name = ck->name;
	if (access(ck->dir, F_OK) == 0 || !src) {
		cd.dirfd = open(ck->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (cd.dirfd < 0 || fstat(cd.dirfd, &sb) != 0) {
			ret = -errno;
			snprintf(err, errlen, "%s: %s", ck->dir, sf_strerror(ret));
			goto out_close;
		}
		ck->mtime = sb.st_mtim;
	}
	ret = sf_cdir_list(&cd, &ls);
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
	ret = sf_format_open(ck->fmt, &cd, &res, err, errlen);
	if (ret)
		goto out_close;
	/* checksums shardctl index keeps for a format that has none */
	if (!ck->fmt->writable && cd.dirfd >= 0)
		sf_index_load(cd.dirfd, ck->name, ck->fmt, &res, NULL);
	ck->m = res.model;
	ck->manifest_json = res.meta;
	ck->manifest_len = res.metalen;
	ck->manifest_in_file = res.meta_file;
	ck->manifest_path = res.meta_path;
	ck->manifest_ino = res.meta_ino;
	ck->manifest_mtime_ns = res.meta_mtime_ns;
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
	ret = 0;
	*out = ck;
	ck = NULL;

out_close:
	/* The source keys state (open files, prefetch) by the ref's address,
	 * which dies here. */
	if (src && src->ops->forget)
		src->ops->forget(src->ctx, &cd.ref);
	sf_format_result_clear(&res);
	if (cd.dirfd >= 0)
		close(cd.dirfd);
	sf_ckpt_close(ck);
	return ret;
}

int sf_ckpt_manifest_read(const struct sf_ckpt *ck, void *buf, uint64_t off,
			  size_t len)
{
	if (off > ck->manifest_len || len > ck->manifest_len - off)
		return -EINVAL;
	struct stat sb;
	int dfd, fd, rc = -EIO;

	if (!ck->manifest_in_file) {
		memcpy(buf, ck->manifest_json + off, len);
		return 0;
	}
	/* opened each time (reads of it are rare; a store of many
	 * checkpoints holds no descriptor per checkpoint), beneath the
	 * checkpoint's directory as at open */
	dfd = open(ck->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -EIO;
	fd = sf_open_beneath(dfd, ck->manifest_path, O_RDONLY | O_NONBLOCK);
	close(dfd);
	if (fd < 0)
		return -EIO;
	if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
	    (uint64_t)sb.st_ino == ck->manifest_ino &&
	    (uint64_t)sb.st_size == ck->manifest_len &&
	    (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec ==
	    ck->manifest_mtime_ns)
		rc = sf_pread_full(fd, buf, len, off) ? -EIO : 0;
	close(fd);
	return rc;
}

int sf_ckpt_open(const char *dir, const char *name, struct sf_ckpt **out,
		 char *err, size_t errlen)
{
	return sf_ckpt_open_src(dir, name, NULL, out, err, errlen);
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

/* What the adapters say of directory dir (with src: and of the files peers
 * hold of checkpoint name): *how, and the format. */
static const struct sf_format *probe_dir(const char *dir, const char *name,
					 struct sf_source *src,
					 enum sf_probe *how)
{
	struct sf_cdir cd = { .dirfd = -1, .dir = dir, .name = name,
			      .src = src, .ref = { dir, name } };
	struct sf_dirlist ls = { 0 };
	const struct sf_format *fmt = NULL;

	*how = SF_PROBE_NO;
	cd.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cd.dirfd < 0 && !(src && errno == ENOENT))
		return NULL;
	if (sf_cdir_list(&cd, &ls) == 0)
		fmt = sf_format_probe(&ls, how);
	sf_dirlist_free(&ls);
	if (cd.dirfd >= 0)
		close(cd.dirfd);
	return fmt;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* remote: no file of it is in this store (every one is a peer's). */
static void open_one(const char *dir, const char *name, struct sf_source *src,
		     bool remote, sf_store_fn fn, void *arg)
{
	struct sf_ckpt *ck = NULL;
	const struct sf_format *fmt;
	enum sf_probe how;
	char why[512];
	int ret;

	fmt = probe_dir(dir, name, src, &how);
	if (remote && (how != SF_PROBE_YES || fmt->writable)) {
		/* Peers' business: a shardfs checkpoint is on every store once
		 * committed, and one being written is resumed where it is. */
		sf_info("store: %s (on peers only) not shown here", name);
		return;
	}
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
	ret = sf_ckpt_open_src(dir, name, src, &ck, why, sizeof(why));
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

	(void)probe_dir(store, NULL, NULL, &how);
	return how == SF_PROBE_YES;
}

int sf_store_single_vote(const char *store)
{
	const struct sf_format *fmt;
	struct sf_dirlist ls = { 0 };
	enum sf_probe how;
	int fd, n;

	fmt = probe_dir(store, NULL, NULL, &how);
	if (how == SF_PROBE_YES)
		return 2;
	if (how == SF_PROBE_PARTIAL && !fmt->writable)
		return 1;
	fd = open(store, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = sf_dirlist_read(fd, &ls) == 0 && ls.n == 0;
	sf_dirlist_free(&ls);
	close(fd);
	return n ? 1 : 0;
}

/* The names of checkpoints peers hold, collected. */
struct name_list {
	char **names;
	size_t n, cap;
};

static int add_name(void *arg, const char *name)
{
	struct name_list *l = arg;
	int rc = sf_array_grow(&l->names, l->n, &l->cap, sizeof(*l->names), 16,
			       0);

	if (rc)
		return rc;
	l->names[l->n] = strdup(name);
	if (!l->names[l->n])
		return -ENOMEM;
	l->n++;
	return 0;
}

int sf_store_scan_src(const char *store, struct sf_source *src, int single_hint,
		      sf_store_fn fn, void *arg, int *single)
{
	struct name_list peers = { 0 };
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0, nlocal;
	DIR *d;
	int ret = 0;

	*single = 0;
	if (single_hint > 0 || (single_hint < 0 && sf_store_is_single(store))) {
		char *real = realpath(store, NULL);
		const char *base;
		const char *nm;

		if (!real)
			return -errno;
		base = strrchr(real, '/');
		nm = base && base[1] ? base + 1 : real;
		*single = 1;
		open_one(real, nm, src, false, fn, arg);
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
	nlocal = n;
	if (src && src->ops->peer_ckpts) {
		ret = src->ops->peer_ckpts(src->ctx, add_name, &peers);
		if (ret)
			goto out_free_names;
	}
	for (size_t i = 0; i < nlocal; i++) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", store, names[i]);
		open_one(path, names[i], src, false, fn, arg);
	}
	/* Checkpoints of which this store holds nothing. */
	if (peers.n > 1)
		qsort(peers.names, peers.n, sizeof(*peers.names), cmp_names);
	for (size_t i = 0; i < peers.n; i++) {
		char path[4096];

		if ((nlocal && bsearch(&peers.names[i], names, nlocal, sizeof(*names),
				       cmp_names)) ||
		    (i && strcmp(peers.names[i], peers.names[i - 1]) == 0) ||
		    peers.names[i][0] == '.' ||
		    (size_t)snprintf(path, sizeof(path), "%s/%s", store,
				     peers.names[i]) >= sizeof(path))
			continue;
		open_one(path, peers.names[i], src, true, fn, arg);
	}
out_free_names:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	for (size_t i = 0; i < peers.n; i++)
		free(peers.names[i]);
	free(peers.names);
	closedir(d);
	return ret;
}

int sf_store_scan(const char *store, sf_store_fn fn, void *arg, int *single)
{
	return sf_store_scan_src(store, NULL, -1, fn, arg, single);
}
