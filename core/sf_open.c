/*
 * sf_open.c - opening files strictly beneath a directory: a file of a
 * checkpoint (sf_open_beneath, and the payload files the payload sources
 * read: sf_open_payload*) and a checkpoint's own directory in its store
 * (sf_open_ckpt_dir). Below the format seam and the engine: adapters,
 * the index, the local and MPI payload sources all open through here.
 *
 * Invariants: sf_open_beneath never returns a descriptor of a file
 * outside dirfd's tree; a payload descriptor is a regular file with
 * blocking reads; a checkpoint directory is never reached through a
 * symlink. Every descriptor is O_CLOEXEC and the caller's to close.
 */
#include "sf_open.h"
#include "sf_error.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
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
	if (!ck->pinned)
		return sf_open_payload(ck->dir, file);
	/* pinned without a directory: none of it is here (MPI peers') */
	return ck->dirfd < 0 ? -SF_ESHORT : sf_open_payload_at(ck->dirfd, file);
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
