/*
 * sf_hub.c - the Hugging Face hub cache as a store (see sf_hub.h): which
 * entries of a store are model repositories, the names their snapshots
 * are shown by, and opening a snapshot with its repository's blobs/.
 *
 * Invariants:
 *  - every directory (the repository, snapshots/, REV, blobs/) is opened
 *    beneath the one before it with O_NOFOLLOW | O_DIRECTORY: a symlink on
 *    the way fails (ELOOP), nothing outside the store is reached; only a
 *    store the user named as a snapshot reaches up to its ../../blobs;
 *  - refs/main is read beneath the repository, O_NOFOLLOW, at most
 *    SF_HUB_REF_MAX bytes, and must name one plain component;
 *  - the links inside a snapshot are never followed here; sf_open_hub
 *    (sf_open.c) reads them when a file is opened.
 */
#include "sf_hub.h"
#include "sf_open.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SF_HUB_REF_MAX 255
#define MODELS "models--"

/* One part of a shown name: a component, not hidden, no '@' (the
 * revision's mark), nothing the mount could not show. */
static bool part_ok(const char *s, size_t n)
{
	if (n == 0 || n > 255 || s[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++)
		if (s[i] == '/' || s[i] == '@' || (unsigned char)s[i] < 0x20 ||
		    s[i] == 0x7f)
			return false;
	return true;
}

static bool rev_ok(const char *s)
{
	return part_ok(s, strlen(s));
}

bool sf_hub_repo_name(const char *name, char *shown, size_t len)
{
	const char *rest, *sep;

	if (strncmp(name, MODELS, sizeof(MODELS) - 1) != 0)
		return false;
	rest = name + sizeof(MODELS) - 1;
	sep = strstr(rest, "--");
	if (!sep)
		return part_ok(rest, strlen(rest)) &&
		       (size_t)snprintf(shown, len, "%s", rest) < len;
	/* huggingface_hub refuses "--" inside a repo id: one separator */
	if (!part_ok(rest, (size_t)(sep - rest)) ||
	    !part_ok(sep + 2, strlen(sep + 2)) || strstr(sep + 2, "--"))
		return false;
	return (size_t)snprintf(shown, len, "%.*s/%s", (int)(sep - rest), rest,
				sep + 2) < len;
}

bool sf_hub_other_repo(const char *name)
{
	return strncmp(name, "datasets--", 10) == 0 ||
	       strncmp(name, "spaces--", 8) == 0;
}

/* refs/main of the repository repofd into rev: 0, -ENOENT, -EINVAL,
 * -EAGAIN while it is empty (being rewritten). */
static int read_main(int repofd, char *rev, size_t len, struct timespec *mt)
{
	char buf[SF_HUB_REF_MAX + 1];
	struct stat sb;
	ssize_t n;
	int fd, rc = 0;

	fd = sf_open_beneath(repofd, "refs/main", O_RDONLY | O_NOFOLLOW |
			     O_NONBLOCK);
	if (fd < 0)
		return fd == -ENOTDIR ? -ENOENT : fd;
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	if (mt)
		*mt = sb.st_mtim;
	n = pread(fd, buf, sizeof(buf), 0);
	close(fd);
	if (n == 0)
		return -EAGAIN; /* huggingface_hub truncates, then writes it */
	if (n < 0 || n > SF_HUB_REF_MAX)
		return -EINVAL;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' ||
			 buf[n - 1] == '\r'))
		n--;
	buf[n] = '\0';
	if (!rev_ok(buf) || (size_t)n >= len)
		rc = -EINVAL;
	else
		memcpy(rev, buf, (size_t)n + 1);
	return rc;
}

static bool later(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec > b->tv_sec ||
	       (a->tv_sec == b->tv_sec && a->tv_nsec > b->tv_nsec);
}

int sf_hub_list(int storefd, const char *repo, sf_hub_fn fn, void *arg)
{
	char shown[600], name[900], main_rev[SF_HUB_REF_MAX + 1] = "";
	struct timespec main_mt = { 0 };
	struct dirent *de;
	unsigned count = 0;
	int repofd, sfd, rc = 0;
	DIR *d;

	if (!sf_hub_repo_name(repo, shown, sizeof(shown)))
		return -EINVAL;
	repofd = sf_open_dir_at(storefd, repo);
	if (repofd < 0)
		return repofd;
	rc = read_main(repofd, main_rev, sizeof(main_rev), &main_mt);
	if (rc == -EAGAIN) {
		close(repofd); /* looked at again next time */
		return rc;
	}
	rc = 0;
	if (main_rev[0] && !rev_ok(main_rev))
		main_rev[0] = '\0';
	sfd = sf_open_dir_at(repofd, "snapshots");
	close(repofd);
	if (sfd < 0)
		return sfd == -ENOENT ? 0 : sfd;
	d = fdopendir(sfd);
	if (!d) {
		close(sfd);
		return -errno;
	}
	while (!rc && count < SF_HUB_MAX_SNAPSHOTS && (de = readdir(d))) {
		struct timespec mt;
		struct stat sb;
		bool is_main;

		if (de->d_name[0] == '.' || !rev_ok(de->d_name))
			continue;
		if (fstatat(sfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !S_ISDIR(sb.st_mode))
			continue;
		count++;
		is_main = strcmp(de->d_name, main_rev) == 0;
		mt = sb.st_mtim;
		if (is_main && later(&main_mt, &mt))
			mt = main_mt;
		if (is_main)
			snprintf(name, sizeof(name), "%s", shown);
		else
			snprintf(name, sizeof(name), "%s@%s", shown, de->d_name);
		rc = fn(arg, name, &mt);
	}
	closedir(d);
	return rc;
}

/* Shown name -> repository directory and revision (NUL when refs/main
 * says). 0 or -ENOENT. */
static int parse_name(const char *name, char *repo, size_t rlen, char *rev,
		      size_t vlen)
{
	const char *at = strchr(name, '@'), *slash = strchr(name, '/');
	size_t base = at ? (size_t)(at - name) : strlen(name);

	rev[0] = '\0';
	if (at && (!rev_ok(at + 1) || strlen(at + 1) >= vlen))
		return -ENOENT;
	if (at)
		memcpy(rev, at + 1, strlen(at + 1) + 1);
	if (slash && (size_t)(slash - name) < base) {
		size_t org = (size_t)(slash - name);

		if (!part_ok(name, org) ||
		    !part_ok(slash + 1, base - org - 1) ||
		    (size_t)snprintf(repo, rlen, MODELS "%.*s--%.*s", (int)org,
				     name, (int)(base - org - 1), slash + 1) >= rlen)
			return -ENOENT;
		return 0;
	}
	if (!part_ok(name, base) ||
	    (size_t)snprintf(repo, rlen, MODELS "%.*s", (int)base, name) >= rlen)
		return -ENOENT;
	return 0;
}

int sf_hub_open(int storefd, const char *name, struct sf_hub_snap *out)
{
	char repo[300], rev[SF_HUB_REF_MAX + 1], shown[600];
	struct timespec main_mt = { 0 };
	struct stat sb;
	int repofd, sfd = -1, rc;

	out->dirfd = out->blobsfd = -1;
	if (parse_name(name, repo, sizeof(repo), rev, sizeof(rev)) ||
	    !sf_hub_repo_name(repo, shown, sizeof(shown)))
		return -ENOENT;
	/* the one name the repository is shown by ("o--n" is not "o/n") */
	if (strncmp(shown, name, strlen(shown)) != 0 ||
	    (name[strlen(shown)] != '\0' && name[strlen(shown)] != '@'))
		return -ENOENT;
	repofd = sf_open_dir_at(storefd, repo);
	if (repofd < 0)
		return repofd;
	out->is_main = !rev[0];
	if (!rev[0]) {
		rc = read_main(repofd, rev, sizeof(rev), &main_mt);
		if (rc) {
			if (rc != -EAGAIN) /* a refs/main being rewritten: not gone */
				rc = -ENOENT;
			goto out_close;
		}
	} else {
		char main_rev[SF_HUB_REF_MAX + 1];

		out->is_main = read_main(repofd, main_rev, sizeof(main_rev),
					 NULL) == 0 && strcmp(main_rev, rev) == 0;
	}
	rc = sfd = sf_open_dir_at(repofd, "snapshots");
	if (rc < 0)
		goto out_close;
	rc = out->dirfd = sf_open_dir_at(sfd, rev);
	if (rc < 0)
		goto out_close;
	rc = out->blobsfd = sf_open_dir_at(repofd, "blobs");
	if (rc < 0)
		goto out_close;
	if (fstat(out->dirfd, &sb) != 0) {
		rc = -errno;
		goto out_close;
	}
	out->dev = (uint64_t)sb.st_dev;
	out->ino = (uint64_t)sb.st_ino;
	out->mtime = sb.st_mtim;
	if (!strchr(name, '@') && later(&main_mt, &out->mtime))
		out->mtime = main_mt;
	snprintf(out->rel, sizeof(out->rel), "%s/snapshots/%s", repo, rev);
	rc = 0;
out_close:
	if (rc) {
		if (out->dirfd >= 0)
			close(out->dirfd);
		if (out->blobsfd >= 0)
			close(out->blobsfd);
		out->dirfd = out->blobsfd = -1;
	}
	if (sfd >= 0)
		close(sfd);
	close(repofd);
	return rc;
}

int sf_hub_store_blobs(int storefd, const char *store)
{
	char shown[600];
	const char *end = store + strlen(store), *b1, *b2;
	struct stat sb;
	int fd;

	/* store: .../models--X/snapshots/REV (realpath'd, no trailing '/') */
	for (b1 = end; b1 > store && b1[-1] != '/'; b1--)
		;
	if (b1 == store || b1 - 1 - store < 10 ||
	    strncmp(b1 - 11, "/snapshots/", 11) != 0)
		return -ENOENT;
	for (b2 = b1 - 11; b2 > store && b2[-1] != '/'; b2--)
		;
	{
		char repo[300];
		size_t n = (size_t)(b1 - 11 - b2);

		if (n >= sizeof(repo))
			return -ENOENT;
		memcpy(repo, b2, n);
		repo[n] = '\0';
		if (!sf_hub_repo_name(repo, shown, sizeof(shown)))
			return -ENOENT;
	}
	/* the user named the snapshot: its ../../blobs is the repository's */
	fd = openat(storefd, "../../blobs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
		    O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -ENOENT;
	if (fstat(fd, &sb) != 0) {
		close(fd);
		return -ENOENT;
	}
	return fd;
}

/* The entries of listfd, the directory rel of snapshot dirfd. */
static bool incomplete_at(int dirfd, int listfd, int blobsfd, const char *rel,
			  int depth, unsigned *budget)
{
	struct dirent *de;
	bool bad = false;
	DIR *d;
	int fd;

	d = sf_opendir_copy(listfd);
	if (!d)
		return false;
	fd = listfd; /* the same directory */
	while (!bad && *budget > 0 && (de = readdir(d))) {
		char path[1024];
		struct stat sb;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		(*budget)--;
		if (fstatat(fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		if ((size_t)snprintf(path, sizeof(path), "%s%s%s", rel,
				     rel[0] ? "/" : "", de->d_name) >= sizeof(path))
			continue;
		if (S_ISLNK(sb.st_mode)) {
			int f = sf_open_hub(dirfd, blobsfd, path, O_RDONLY | O_NONBLOCK,
					    NULL, 0);

			if (f >= 0)
				close(f);
			bad = f == -ENOENT;
		} else if (S_ISDIR(sb.st_mode) && depth > 0) {
			int sub = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY |
					 O_NOFOLLOW | O_CLOEXEC);

			if (sub >= 0) {
				bad = incomplete_at(dirfd, sub, blobsfd, path,
						    depth - 1, budget);
				close(sub);
			}
		}
	}
	closedir(d);
	return bad;
}

bool sf_hub_incomplete(int dirfd, int blobsfd)
{
	unsigned budget = 10000;

	return incomplete_at(dirfd, dirfd, blobsfd, "", 3, &budget);
}
