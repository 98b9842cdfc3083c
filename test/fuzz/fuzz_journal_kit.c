/*
 * fuzz_journal_kit.c - the fuzz_journal checkpoint directory: the payload
 * pattern, temp directories, file writes and removal (see
 * fuzz_journal_kit.h).
 */
#include "fuzz_journal_kit.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_writer.h"

void fj_fill(void *buf, uint64_t off, size_t len)
{
	uint8_t *p = buf;

	/* Period 65536 > FJ_PAYLOAD_LEN: no two blocks hold the same bytes. */
	for (size_t i = 0; i < len; i++, off++)
		p[i] = (uint8_t)(off * 131 + (off >> 8) * 7 + 17);
}

int fj_mkdtemp(const char *prefix, char *out, size_t size)
{
	const char *bases[] = { "/dev/shm", getenv("TMPDIR"), "/tmp" };

	for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
		if (!bases[i] || !*bases[i])
			continue;
		if ((size_t)snprintf(out, size, "%s/%s-XXXXXX", bases[i], prefix) >= size)
			return -ENAMETOOLONG;
		if (mkdtemp(out))
			return 0;
	}
	return -errno;
}

int fj_write_file(const char *ckpt, const char *rel, const void *buf, size_t len)
{
	char path[4096];
	int fd, ret = 0;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", ckpt, rel) >= sizeof(path))
		return -ENAMETOOLONG;
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (len && write(fd, buf, len) != (ssize_t)len)
		ret = -EIO;
	close(fd);
	return ret;
}

int fj_write_payload(const char *ckpt)
{
	static uint8_t pattern[FJ_PAYLOAD_LEN];
	static int filled;
	char rankdir[4096];
	int ret;

	if (!filled) {
		fj_fill(pattern, 0, sizeof(pattern));
		filled = 1;
	}
	if ((size_t)snprintf(rankdir, sizeof(rankdir), "%s/" FJ_RANKDIR, ckpt) >=
	    sizeof(rankdir))
		return -ENAMETOOLONG;
	ret = sf_mkdir_p(rankdir);
	if (ret)
		return ret;
	return fj_write_file(ckpt, FJ_RANKDIR "/data-0.bin", pattern, sizeof(pattern));
}

static int rm_one(const char *path, const struct stat *st, int type,
		  struct FTW *ftw)
{
	return remove(path) ? -errno : 0;
}

int fj_rm_tree(const char *path)
{
	int ret = nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);

	if (ret == -1)
		return errno == ENOENT ? 0 : -errno;
	return ret;
}
