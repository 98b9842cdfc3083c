/*
 * sf_confine.c - the daemon's own file operations never leave its store
 * (see sf_confine.h).
 *
 * Invariants:
 *  - g_root/g_rootfd are set once by sf_confine_store before any thread
 *    calls in, and cleared after the last has stopped: read without a lock;
 *  - a path under g_root is split into its parent (opened O_PATH beneath
 *    g_rootfd with no symlink in any component) and its last component,
 *    which every call acts on with *at() and without following it; the
 *    parent descriptor is closed before the call returns;
 *  - nothing here follows a symlink under the store, ever: the daemon
 *    writes only directories and files it made, which are no symlinks.
 */
#include "sf_confine.h"
#include "sf_log.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SF_CONFINE_DEPTH_MAX 64   /* levels sf_c_remove_tree descends */

static char *g_root;      /* owned; NULL: nothing registered */
static size_t g_rootlen;
static int g_rootfd = -1; /* owned */

int sf_confine_store(const char *root, int rootfd)
{
	char *r = strdup(root);
	int fd;

	if (!r)
		return -ENOMEM;
	fd = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0) {
		fd = -errno;
		free(r);
		return fd;
	}
	sf_confine_clear();
	g_rootlen = strlen(r);
	while (g_rootlen > 1 && r[g_rootlen - 1] == '/')
		r[--g_rootlen] = '\0';
	g_root = r;
	g_rootfd = fd;
	return 0;
}

void sf_confine_clear(void)
{
	free(g_root);
	g_root = NULL;
	g_rootlen = 0;
	if (g_rootfd >= 0)
		close(g_rootfd);
	g_rootfd = -1;
}

/*
 * Where path lies: *dirfd and *base to give an *at() call. AT_FDCWD and
 * path itself when path is not under the registered store (1: nothing to
 * close); else a descriptor of its parent (the caller closes it; 0) and
 * its last component ("." for the store itself). -1 with errno set when
 * the parent cannot be reached without following a symlink.
 */
static int locate(const char *path, int *dirfd, const char **base,
		  char *buf, size_t buflen)
{
	struct open_how how = {
		.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
			   RESOLVE_NO_MAGICLINKS,
	};
	const char *rel, *slash;
	long fd;

	if (!g_root || strncmp(path, g_root, g_rootlen) != 0 ||
	    (path[g_rootlen] != '/' && path[g_rootlen] != '\0') ||
	    (g_rootlen == 1 && path[0] != '/')) {
		*dirfd = AT_FDCWD;
		*base = path;
		return 1;
	}
	rel = path + g_rootlen;
	while (*rel == '/')
		rel++;
	if (!*rel) {
		*base = ".";
		rel = ".";
	}
	slash = strrchr(rel, '/');
	if (!slash) {
		/* a name in the store itself: its descriptor, duplicated so
		 * that the caller may close it alike */
		fd = fcntl(g_rootfd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			return -1;
		*dirfd = (int)fd;
		*base = rel;
		return 0;
	}
	if (!slash[1] || (size_t)(slash - rel) >= buflen) {
		errno = slash[1] ? ENAMETOOLONG : EINVAL;
		return -1;
	}
	memcpy(buf, rel, (size_t)(slash - rel));
	buf[slash - rel] = '\0';
	fd = syscall(SYS_openat2, g_rootfd, buf, &how, sizeof(how));
	if (fd < 0)
		return -1;
	*dirfd = (int)fd;
	*base = slash + 1;
	return 0;
}

/* Run the *at() call expr with dirfd and base set, keeping its errno. */
#define CONFINED(path, expr, failval)                                     \
	do {                                                              \
		char buf_[4096];                                          \
		const char *base;                                         \
		int dirfd, rc_, own_, e_;                                 \
		own_ = locate((path), &dirfd, &base, buf_, sizeof(buf_)); \
		if (own_ < 0)                                             \
			return failval;                                   \
		rc_ = (expr);                                             \
		e_ = errno;                                               \
		if (own_ == 0)                                            \
			close(dirfd);                                     \
		errno = e_;                                               \
		return rc_;                                               \
	} while (0)

int sf_c_open(const char *path, int flags, mode_t mode)
{
	CONFINED(path, openat(dirfd, base, flags | (own_ == 0 ? O_NOFOLLOW : 0),
			      mode), -1);
}

int sf_c_mkdir(const char *path, mode_t mode)
{
	CONFINED(path, mkdirat(dirfd, base, mode), -1);
}

int sf_c_unlink(const char *path)
{
	CONFINED(path, unlinkat(dirfd, base, 0), -1);
}

int sf_c_rmdir(const char *path)
{
	CONFINED(path, unlinkat(dirfd, base, AT_REMOVEDIR), -1);
}

int sf_c_lstat(const char *path, struct stat *sb)
{
	CONFINED(path, fstatat(dirfd, base, sb, AT_SYMLINK_NOFOLLOW), -1);
}

int sf_c_exists(const char *path)
{
	struct stat sb;

	return sf_c_lstat(path, &sb) == 0;
}

int sf_c_rename(const char *from, const char *to, unsigned flags)
{
	char fbuf[4096], tbuf[4096];
	const char *fbase, *tbase;
	int fdir, tdir, fown, town, rc, e;

	fown = locate(from, &fdir, &fbase, fbuf, sizeof(fbuf));
	if (fown < 0)
		return -1;
	town = locate(to, &tdir, &tbase, tbuf, sizeof(tbuf));
	if (town < 0) {
		e = errno;
		if (fown == 0)
			close(fdir);
		errno = e;
		return -1;
	}
	rc = renameat2(fdir, fbase, tdir, tbase, flags);
	e = errno;
	if (fown == 0)
		close(fdir);
	if (town == 0)
		close(tdir);
	errno = e;
	return rc;
}

DIR *sf_c_opendir(const char *path)
{
	DIR *d;
	int fd, e;

	fd = sf_c_open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	if (fd < 0)
		return NULL;
	d = fdopendir(fd);
	if (!d) {
		e = errno;
		close(fd);
		errno = e;
	}
	return d;
}

/* Empty directory fd (whose name, for logs, is path), depth levels left;
 * closes fd. */
static void remove_below(int fd, const char *path, dev_t dev, int depth)
{
	struct dirent *de;
	DIR *d = fdopendir(fd);

	if (!d) {
		close(fd);
		return;
	}
	while ((de = readdir(d))) {
		struct stat sb;
		int sub;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (fstatat(fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		if (S_ISDIR(sb.st_mode) && sb.st_dev == dev && depth > 0) {
			sub = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY |
				     O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0)
				remove_below(sub, path, dev, depth - 1);
		}
		if (unlinkat(fd, de->d_name,
			     S_ISDIR(sb.st_mode) ? AT_REMOVEDIR : 0) != 0)
			sf_warn("delete: %s/.../%s: %s", path, de->d_name,
				strerror(errno));
	}
	closedir(d);
}

int sf_c_remove_tree(const char *path)
{
	struct stat sb;
	int fd;

	fd = sf_c_open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) != 0) {
		close(fd);
		return -errno;
	}
	remove_below(fd, path, sb.st_dev, SF_CONFINE_DEPTH_MAX);
	if (sf_c_rmdir(path) != 0)
		sf_warn("delete: %s: %s", path, strerror(errno));
	return 0;
}
