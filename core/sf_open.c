/*
 * sf_open.c - opening files strictly beneath a directory: a file of a
 * checkpoint (sf_open_beneath, and the payload files the payload sources
 * read: sf_open_payload*) and a checkpoint's own directory in its store
 * (sf_open_ckpt_dir). Below the format seam and the engine: adapters,
 * the index, the local and MPI payload sources all open through here.
 *
 * Invariants: sf_open_beneath never returns a descriptor of a file
 * outside dirfd's tree; sf_open_hub none outside it but a regular file
 * of the repository's blobs/, reached by one link read by shardfs itself
 * (the kernel follows none); a payload descriptor is a regular file with
 * blocking reads; a checkpoint directory is never reached through a
 * symlink. Every descriptor is O_CLOEXEC and the caller's to close.
 */
#include "sf_open.h"
#include "sf_error.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int sf_open_beneath(int dirfd, const char *path, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));

	return fd < 0 ? -errno : (int)fd;
}

int sf_open_payload(const char *dir, const char *file)
{
	int dfd, fd;

	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errno == ENOENT || errno == ENOTDIR ? -SF_ESHORT : -EIO;
	fd = sf_open_payload_at(dfd, file);
	close(dfd);
	return fd;
}

int sf_open_payload_ref(const struct sf_ckpt_ref *ck, const char *file)
{
	struct stat sb;
	int fd;

	if (!ck->pinned)
		return sf_open_payload(ck->dir, file);
	/* pinned without a directory: none of it is here (MPI peers') */
	if (ck->dirfd < 0)
		return -SF_ESHORT;
	if (!ck->hub)
		return sf_open_payload_at(ck->dirfd, file);
	fd = sf_open_hub(ck->dirfd, ck->blobsfd, file,
			 O_RDONLY | O_NOCTTY | O_NONBLOCK, NULL, 0);
	if (fd < 0)
		return fd == -ENOENT || fd == -ENOTDIR ? -SF_ESHORT : -EIO;
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return -EIO;
	}
	fcntl(fd, F_SETFL, 0);
	return fd;
}

/* Is target (a link's text) what huggingface_hub writes for a file up
 * levels below the repository: "../" up times, "blobs/", one component?
 * The component, or NULL. */
static const char *hub_blob_name(const char *target, unsigned up)
{
	const char *p = target, *name;

	for (unsigned i = 0; i < up; i++, p += 3)
		if (strncmp(p, "../", 3) != 0)
			return NULL;
	if (strncmp(p, "blobs/", 6) != 0)
		return NULL;
	name = p + 6;
	if (!name[0] || strchr(name, '/') || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0)
		return NULL;
	return name;
}

int sf_open_hub(int dirfd, int blobsfd, const char *path, int flags,
		char *target, size_t tlen)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_NOFOLLOW | O_CLOEXEC),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
			   RESOLVE_NO_MAGICLINKS,
	};
	char link[512], parent[4096];
	const char *slash, *base, *name;
	unsigned up = 2; /* snapshots/REV/ */
	struct stat sb;
	long fd;
	ssize_t n;
	int pfd, rc;

	if (target && tlen)
		target[0] = '\0';
	fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	if (fd >= 0 || errno != ELOOP)
		return fd < 0 ? -errno : (int)fd;
	/* a symlink on the way: only a last component may be one */
	slash = strrchr(path, '/');
	base = slash ? slash + 1 : path;
	for (const char *p = path; p < base; p++)
		up += *p == '/';
	if (slash) {
		struct open_how dh = {
			.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
			.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
				   RESOLVE_NO_MAGICLINKS,
		};

		if ((size_t)(slash - path) >= sizeof(parent))
			return -ENAMETOOLONG;
		memcpy(parent, path, (size_t)(slash - path));
		parent[slash - path] = '\0';
		fd = syscall(SYS_openat2, dirfd, parent, &dh, sizeof(dh));
		if (fd < 0)
			return errno == ELOOP ? -EXDEV : -errno;
		pfd = (int)fd;
	} else {
		pfd = dirfd;
	}
	n = readlinkat(pfd, base, link, sizeof(link) - 1);
	rc = n < 0 ? -errno : 0;
	if (slash)
		close(pfd);
	if (n < 0 || (size_t)n >= sizeof(link))
		return rc == -EINVAL ? -ELOOP : rc ? rc : -EXDEV; /* not a link: swapped meanwhile */
	link[n] = '\0';
	if (target && tlen)
		snprintf(target, tlen, "%s", link);
	name = (size_t)n == sizeof(link) - 1 ? NULL : hub_blob_name(link, up);
	if (!name)
		return -EXDEV;
	/* the blob itself: never through a symlink, never a FIFO's wait */
	fd = openat(blobsfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat((int)fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		close((int)fd);
		return -EINVAL;
	}
	if (!(flags & O_NONBLOCK))
		fcntl((int)fd, F_SETFL, 0); /* blocking reads, as asked */
	return (int)fd;
}

int sf_open_ckpt_dir(int storefd, const char *name, uint64_t *dev,
		     uint64_t *ino)
{
	struct stat sb;
	int fd, rc;

	if (!name[0] || strchr(name, '/') || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0)
		return -EINVAL;
	/* O_NOFOLLOW with O_DIRECTORY: a symlink gives ELOOP, and O_NONBLOCK
	 * keeps a FIFO of that name from blocking the open. */
	fd = openat(storefd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
		    O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) != 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	if (dev)
		*dev = (uint64_t)sb.st_dev;
	if (ino)
		*ino = (uint64_t)sb.st_ino;
	return fd;
}

int sf_open_payload_at(int dirfd, const char *file)
{
	struct stat sb;
	int fd;

	fd = sf_open_beneath(dirfd, file, O_RDONLY | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return fd == -ENOENT || fd == -ENOTDIR ? -SF_ESHORT : -EIO;
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		close(fd);
		return -EIO;
	}
	fcntl(fd, F_SETFL, 0);
	return fd;
}

int sf_open_dir_at(int at, const char *name)
{
	int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
			O_NONBLOCK | O_CLOEXEC);
	struct stat sb;

	if (fd >= 0)
		return fd;
	fd = -errno;
	/* O_DIRECTORY may say ENOTDIR for a symlink: say what it is */
	if (fd == -ENOTDIR && fstatat(at, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
	    S_ISLNK(sb.st_mode))
		fd = -ELOOP;
	return fd;
}

DIR *sf_opendir_copy(int dirfd)
{
	int fd = dirfd >= 0 ? openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	DIR *d;

	if (fd < 0)
		return NULL;
	d = fdopendir(fd);
	if (!d)
		close(fd);
	return d;
}
