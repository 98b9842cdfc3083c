/*
 * sf_dstags.c - a DeepSpeed checkpoint's other tags as entries of a store
 * (see sf_dstags.h): DIR is the tag `latest` names (the adapter's), each
 * other tag directory TAG is shown as "DIR@TAG" and opened as a bare tag
 * directory, as the hub cache's snapshots are (sf_hub.c).
 *
 * Invariants:
 *  - DIR, latest and TAG are each opened beneath the one before with
 *    O_NOFOLLOW (DIR and TAG also O_DIRECTORY): a symlink on the way
 *    fails (ELOOP), nothing outside the store is reached;
 *  - latest is read as at most SF_DSTAGS_LATEST_MAX bytes of a regular
 *    file and must name one plain component (no '/', not "." or "..");
 *    otherwise no DIR@TAG is listed (the adapter leaves DIR out with its
 *    line);
 *  - only tags without '@' are listed (the last '@' of a shown name
 *    splits it), and only names of at most 255 bytes (one FUSE entry);
 *  - listing costs one openat of DIR/latest per store entry; the tag
 *    directories are read only where latest exists;
 *  - a directory with a valid latest is identified by the tag directory
 *    latest names (sf_dstags_latest_ident): the live store opens DIR
 *    again when latest names another tag.
 */
#include "sf_dstags.h"
#include "sf_open.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MODEL_SUFFIX "_model_states.pt"
#define TAG_SCAN_MAX 10000 /* entries looked at per tag directory */

/* One plain component: not hidden, no '/', '@' or control character. */
static bool tag_ok(const char *s, size_t n)
{
	if (n == 0 || n > 255 || s[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++)
		if (s[i] == '/' || s[i] == '@' || (unsigned char)s[i] < 0x20 ||
		    s[i] == 0x7f)
			return false;
	return true;
}

/* The tag dir/latest names (dirfd: DIR) into tag: 0, -ENOENT (none), or
 * -EINVAL (not a regular file, too long, not one plain component). */
static int read_latest(int dirfd, char *tag, size_t len)
{
	char buf[SF_DSTAGS_LATEST_MAX + 1];
	struct stat sb;
	ssize_t n;
	int fd;

	fd = openat(dirfd, "latest", O_RDONLY | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? -ENOENT : -EINVAL;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	n = pread(fd, buf, sizeof(buf), 0);
	close(fd);
	if (n <= 0 || n > SF_DSTAGS_LATEST_MAX)
		return -EINVAL;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' ||
			 buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		n--;
	buf[n] = '\0';
	if (n == 0 || (size_t)n >= len || memchr(buf, '/', (size_t)n) ||
	    strcmp(buf, ".") == 0 || strcmp(buf, "..") == 0)
		return -EINVAL;
	memcpy(tag, buf, (size_t)n + 1);
	return 0;
}

static bool ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);

	return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Does directory tagfd hold a *_model_states.pt (a DeepSpeed tag)? */
static bool holds_model_states(int tagfd)
{
	unsigned budget = TAG_SCAN_MAX;
	struct dirent *de;
	bool yes = false;
	DIR *d;

	d = sf_opendir_copy(tagfd);
	if (!d)
		return false;
	while (!yes && budget-- > 0 && (de = readdir(d)))
		yes = de->d_name[0] != '.' && ends_with(de->d_name, MODEL_SUFFIX);
	closedir(d);
	return yes;
}

int sf_dstags_list(int storefd, const char *dir, sf_dstags_fn fn, void *arg)
{
	char latest[SF_DSTAGS_LATEST_MAX + 1], name[520];
	unsigned count = 0;
	struct dirent *de;
	int dirfd, rc = 0;
	DIR *d;

	dirfd = sf_open_dir_at(storefd, dir);
	if (dirfd < 0)
		return 0;
	if (read_latest(dirfd, latest, sizeof(latest))) {
		close(dirfd);
		return 0; /* no latest, or one the adapter refuses: no tags */
	}
	d = fdopendir(dirfd);
	if (!d) {
		close(dirfd);
		return errno == ENOMEM ? -ENOMEM : 0;
	}
	while (!rc && count < SF_DSTAGS_MAX && (de = readdir(d))) {
		struct stat sb;
		int tagfd;
		bool tag;

		if (!tag_ok(de->d_name, strlen(de->d_name)) ||
		    strcmp(de->d_name, latest) == 0)
			continue;
		if ((size_t)snprintf(name, sizeof(name), "%s@%s", dir,
				     de->d_name) > 255)
			continue;
		if (fstatat(dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !S_ISDIR(sb.st_mode))
			continue;
		/* an entry of the store by that name itself is shown as it is */
		if (fstatat(storefd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0)
			continue;
		tagfd = sf_open_dir_at(dirfd, de->d_name);
		if (tagfd < 0)
			continue;
		tag = holds_model_states(tagfd);
		if (tag && fstat(tagfd, &sb) == 0) {
			count++;
			rc = fn(arg, name, &sb.st_mtim);
		}
		close(tagfd);
	}
	closedir(d);
	return rc;
}

int sf_dstags_open(int storefd, const char *name, struct sf_dstags_tag *out)
{
	char dir[256], latest[SF_DSTAGS_LATEST_MAX + 1];
	const char *at = strrchr(name, '@'), *tag;
	struct stat sb;
	size_t dn;
	int dirfd, fd, rc;

	out->dirfd = -1;
	if (!at || strchr(name, '/') || strlen(name) > 255)
		return -ENOENT;
	dn = (size_t)(at - name);
	tag = at + 1;
	if (dn == 0 || dn >= sizeof(dir) || !tag_ok(tag, strlen(tag)))
		return -ENOENT;
	memcpy(dir, name, dn);
	dir[dn] = '\0';
	if (dir[0] == '.')
		return -ENOENT; /* hidden: shardfs's own, never listed */
	dirfd = sf_open_ckpt_dir(storefd, dir, NULL, NULL);
	if (dirfd < 0)
		return dirfd == -ENOTDIR || dirfd == -EINVAL ? -ENOENT : dirfd;
	rc = read_latest(dirfd, latest, sizeof(latest));
	if (rc || strcmp(latest, tag) == 0) {
		close(dirfd);
		return -ENOENT; /* the one latest names is shown as DIR */
	}
	fd = sf_open_dir_at(dirfd, tag);
	close(dirfd);
	if (fd < 0)
		return fd == -ENOTDIR ? -ENOENT : fd;
	if (!holds_model_states(fd) || fstat(fd, &sb) != 0) {
		close(fd);
		return -ENOENT;
	}
	out->dirfd = fd;
	out->dev = (uint64_t)sb.st_dev;
	out->ino = (uint64_t)sb.st_ino;
	out->mtime = sb.st_mtim;
	snprintf(out->rel, sizeof(out->rel), "%s/%s", dir, tag);
	return 0;
}

int sf_dstags_latest_ident(int dirfd, uint64_t *dev, uint64_t *ino)
{
	char latest[SF_DSTAGS_LATEST_MAX + 1];
	struct stat sb;

	if (read_latest(dirfd, latest, sizeof(latest)) ||
	    fstatat(dirfd, latest, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
	    !S_ISDIR(sb.st_mode))
		return -ENOENT;
	*dev = (uint64_t)sb.st_dev;
	*ino = (uint64_t)sb.st_ino;
	return 0;
}
