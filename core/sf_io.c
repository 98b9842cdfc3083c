/*
 * sf_io.c - exact preads and bounded whole-file reads (see sf_io.h).
 * Invariant: a caller never sees a partial buffer reported as success.
 */
#include "sf_io.h"
#include "sf_error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
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

int sf_read_fd(int fd, size_t max, char **out, size_t *len)
{
	struct stat sb;
	char *buf;
	int ret;

	if (fstat(fd, &sb) < 0)
		return -errno;
	if (!S_ISREG(sb.st_mode))
		return -EINVAL;
	if ((uint64_t)sb.st_size > max)
		return -SF_ETOOBIG;
	buf = malloc((size_t)sb.st_size + 1);
	if (!buf)
		return -ENOMEM;
	ret = sf_pread_full(fd, buf, (size_t)sb.st_size, 0);
	if (ret) {
		free(buf);
		return -EIO;
	}
	buf[sb.st_size] = '\0';
	*out = buf;
	*len = (size_t)sb.st_size;
	return 0;
}

int sf_read_file(const char *path, size_t max, char **out, size_t *len)
{
	int fd, ret;

	/* O_NONBLOCK: a FIFO must not block; it then fails S_ISREG. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	ret = sf_read_fd(fd, max, out, len);
	close(fd);
	return ret;
}

struct sf_input sf_input_mem(const void *buf, size_t len)
{
	struct sf_input in = { .mem = buf, .fd = -1, .base = 0, .size = len };

	return in;
}

struct sf_input sf_input_fd(int fd, uint64_t base, uint64_t size)
{
	struct sf_input in = { .mem = NULL, .fd = fd, .base = base, .size = size };

	return in;
}

struct sf_input sf_input_cb(sf_input_read_fn fn, void *ctx, uint64_t base,
			    uint64_t size)
{
	struct sf_input in = { .fd = -1, .fn = fn, .ctx = ctx, .base = base,
			       .size = size };

	return in;
}

int sf_input_read(const struct sf_input *in, void *buf, size_t len,
		  uint64_t off)
{
	if (off > in->size || len > in->size - off)
		return -SF_ESHORT;
	if (len == 0)
		return 0;
	if (in->mem) {
		memcpy(buf, in->mem + off, len);
		return 0;
	}
	if (in->base > UINT64_MAX - off)
		return -SF_ESHORT;
	if (in->fn)
		return in->fn(in->ctx, buf, len, in->base + off);
	return sf_pread_full(in->fd, buf, len, in->base + off);
}

int sf_input_sub(const struct sf_input *in, uint64_t off, uint64_t len,
		 struct sf_input *out)
{
	if (off > in->size || len > in->size - off)
		return -SF_ESHORT;
	*out = *in;
	if (in->mem)
		out->mem = in->mem + off;
	else
		out->base = in->base + off;
	out->size = len;
	return 0;
}
