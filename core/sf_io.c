/*
 * sf_io.c - exact preads and bounded whole-file reads (see sf_io.h).
 * Invariant: a caller never sees a partial buffer reported as success.
 */
#include "sf_io.h"
#include "sf_error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int sf_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	unsigned char *p = buf;

	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -EIO;
		}
		if (n == 0)
			return -SF_ESHORT;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

int sf_read_file(const char *path, size_t max, char **out, size_t *len)
{
	struct stat sb;
	char *buf;
	int fd, ret;

	/* O_NONBLOCK: a FIFO must not block; it then fails S_ISREG. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) < 0) {
		ret = -errno;
		goto out_close_fd;
	}
	if (!S_ISREG(sb.st_mode)) {
		ret = -EINVAL;
		goto out_close_fd;
	}
	fcntl(fd, F_SETFL, 0);
	if ((uint64_t)sb.st_size > max) {
		ret = -SF_ETOOBIG;
		goto out_close_fd;
	}
	buf = malloc((size_t)sb.st_size + 1);
	if (!buf) {
		ret = -ENOMEM;
		goto out_close_fd;
	}
	ret = sf_pread_full(fd, buf, (size_t)sb.st_size, 0);
	if (ret) {
		free(buf);
		ret = -EIO;
		goto out_close_fd;
	}
	buf[sb.st_size] = '\0';
	*out = buf;
	*len = (size_t)sb.st_size;
out_close_fd:
	close(fd);
	return ret;
}
