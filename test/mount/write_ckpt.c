/*
 * write_ckpt.c - test helper: write one checkpoint through a shardfs mount
 * from C with nothing but mkdir, open, pwrite, close and setxattr (SPEC
 * section 4), then commit it.
 *
 * usage: write_ckpt MOUNT/CKPT
 *
 * The checkpoint is fixed; test_write.py computes the same values with
 * numpy (keep the two in step: see value_* below and VALUES in the test):
 *   c/w0     F32 [40,24]  dim-0 boxes rows 0:17 and 17:40, written in
 *                         1000-byte pieces;  value(i) = (i*7 % 1009) - 500
 *   c/w1     I16 [10,33]  dim-1 boxes cols 0:11, 11:22, 22:33, written in
 *                         64-byte pieces;    value(i) = (int16)(i*37 + 11)
 *   c/flat   U32 [1000]   flat ranges out of order from two handles open
 *                         at once;           value(i) = i * 2654435761
 *   config.json           the bytes of CONFIG
 * i is the element's index in the row-major flattened tensor.
 *
 * Exit 0 when the commit succeeded and user.shardfs.state reads
 * "committed"; 1 with a message naming the failing call otherwise.
 * Invariants: every buffer is sized from the fixed shapes above, never
 * from input; every fd opened is closed, and a close error fails the run
 * (the daemon reports a dropped shard at close).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define PATH_CAP 4096
#define STATE_CAP 4096

static const char CONFIG[] = "{\"writer\": \"write_ckpt.c\", \"layers\": 1}\n";

static const char *g_ckpt; /* MOUNT/CKPT, from argv */

static int fail(const char *what, const char *path)
{
	fprintf(stderr, "write_ckpt: %s %s: %s\n", what, path, strerror(errno));
	return -errno;
}

/* out = CKPT/rel; -ENAMETOOLONG when it does not fit. */
static int ckpt_path(char *out, const char *rel)
{
	int n = snprintf(out, PATH_CAP, "%s/%s", g_ckpt, rel);

	if (n < 0 || n >= PATH_CAP) {
		fprintf(stderr, "write_ckpt: path too long: %s/%s\n", g_ckpt, rel);
		return -ENAMETOOLONG;
	}
	return 0;
}

/* Write all len bytes at off, in pieces of at most piece bytes. */
static int pwrite_all(int fd, const char *path, const void *buf, size_t len,
		      off_t off, size_t piece)
{
	const char *p = buf;

	while (len > 0) {
		size_t want = len < piece ? len : piece;
		ssize_t n = pwrite(fd, p, want, off);

		if (n < 0)
			return fail("pwrite", path);
		if (n == 0) {
			errno = EIO;
			return fail("pwrite (no progress)", path);
		}
		p += n;
		off += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Create tensors/NAME and set its dtype and shape xattrs. */
static int declare(const char *name, const char *dtype, const char *shape)
{
	char rel[PATH_CAP], path[PATH_CAP];
	int fd, err;

	snprintf(rel, sizeof(rel), "tensors/%s", name);
	err = ckpt_path(path, rel);
	if (err)
		return err;
	fd = open(path, O_WRONLY | O_CREAT, 0644);
	if (fd < 0)
		return fail("create", path);
	if (close(fd) < 0)
		return fail("close", path);
	if (setxattr(path, "user.shardfs.dtype", dtype, strlen(dtype), 0) < 0)
		return fail("setxattr dtype", path);
	if (setxattr(path, "user.shardfs.shape", shape, strlen(shape), 0) < 0)
		return fail("setxattr shape", path);
	return 0;
}

/* Write len bytes into the box file tensors/NAME@spec sequentially. */
static int write_box(const char *name, const char *spec, const void *buf,
		     size_t len, size_t piece)
{
	char rel[PATH_CAP], path[PATH_CAP];
	int fd, err;

	snprintf(rel, sizeof(rel), "tensors/%s@%s", name, spec);
	err = ckpt_path(path, rel);
	if (err)
		return err;
	fd = open(path, O_WRONLY | O_CREAT, 0644);
	if (fd < 0)
		return fail("open box", path);
	err = pwrite_all(fd, path, buf, len, 0, piece);
	if (close(fd) < 0 && !err)
		err = fail("close box", path);
	return err;
}

static float value_w0(uint64_t i)
{
	return (float)(int64_t)(i * 7 % 1009) - 500.0f;
}

static int16_t value_w1(uint64_t i)
{
	return (int16_t)(uint16_t)((i * 37 + 11) & 0xffff);
}

static uint32_t value_flat(uint64_t i)
{
	return (uint32_t)(i * 2654435761u);
}

/* c/w0: two dim-0 boxes (rows 0:17, 17:40) of a [40,24] F32 tensor. */
static int write_w0(void)
{
	enum { ROWS = 40, COLS = 24, CUT = 17 };
	float box[ROWS * COLS];
	int err;

	err = declare("c/w0", "F32", "[40,24]");
	if (err)
		return err;
	for (uint64_t i = 0; i < ROWS * COLS; i++)
		box[i] = value_w0(i);
	/* the rows of a dim-0 box are contiguous in the full tensor */
	err = write_box("c/w0", "17:40,:", box + CUT * COLS,
			(ROWS - CUT) * COLS * sizeof(float), 1000);
	if (err)
		return err;
	return write_box("c/w0", "0:17,:", box, CUT * COLS * sizeof(float),
			 1000);
}

/* c/w1: three dim-1 boxes of a [10,33] I16 tensor. */
static int write_w1(void)
{
	enum { ROWS = 10, COLS = 33, W = 11 };
	int16_t box[ROWS * W];
	char spec[64];
	int err;

	err = declare("c/w1", "I16", "[10,33]");
	if (err)
		return err;
	for (int b = 0; b < COLS / W; b++) {
		for (uint64_t r = 0; r < ROWS; r++)
			for (uint64_t c = 0; c < W; c++)
				box[r * W + c] = value_w1(r * COLS + (uint64_t)b * W + c);
		snprintf(spec, sizeof(spec), ":,%d:%d", b * W, (b + 1) * W);
		err = write_box("c/w1", spec, box, sizeof(box), 64);
		if (err)
			return err;
	}
	return 0;
}

/* c/flat: byte ranges of a [1000] U32 tensor, out of order, from two
 * handles open at the same time. */
static int write_flat(void)
{
	/* {handle, start, stop} in bytes; together they cover [0, 4000) */
	static const int ranges[][3] = {
		{0, 1000, 2000}, {1, 3100, 4000}, {0, 2000, 2600},
		{1, 2600, 3100}, {0, 0, 1000},
	};
	uint32_t data[1000];
	char path[PATH_CAP];
	int fd[2], err;

	err = declare("c/flat", "U32", "[1000]");
	if (err)
		return err;
	for (uint64_t i = 0; i < 1000; i++)
		data[i] = value_flat(i);
	err = ckpt_path(path, "tensors/c/flat");
	if (err)
		return err;
	fd[0] = open(path, O_WRONLY);
	if (fd[0] < 0)
		return fail("open flat", path);
	fd[1] = open(path, O_WRONLY);
	if (fd[1] < 0) {
		err = fail("open flat (second handle)", path);
		goto out_close_fd0;
	}
	for (size_t k = 0; k < sizeof(ranges) / sizeof(ranges[0]); k++) {
		const int *r = ranges[k];

		err = pwrite_all(fd[r[0]], path, (const char *)data + r[1],
				 (size_t)(r[2] - r[1]), r[1], 300);
		if (err)
			break;
	}
	if (close(fd[1]) < 0 && !err)
		err = fail("close flat (second handle)", path);
out_close_fd0:
	if (close(fd[0]) < 0 && !err)
		err = fail("close flat", path);
	return err;
}

static int write_config(void)
{
	char path[PATH_CAP];
	int fd, err;

	err = ckpt_path(path, "config.json");
	if (err)
		return err;
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return fail("create", path);
	err = pwrite_all(fd, path, CONFIG, strlen(CONFIG), 0, 16);
	if (close(fd) < 0 && !err)
		err = fail("close", path);
	return err;
}

static int commit(void)
{
	char state[STATE_CAP];
	ssize_t n;

	if (setxattr(g_ckpt, "user.shardfs.commit", "1", 1, 0) < 0) {
		int err = fail("setxattr commit", g_ckpt);

		n = getxattr(g_ckpt, "user.shardfs.state", state, sizeof(state) - 1);
		if (n >= 0) {
			state[n] = '\0';
			fprintf(stderr, "write_ckpt: state: %s\n", state);
		}
		return err;
	}
	n = getxattr(g_ckpt, "user.shardfs.state", state, sizeof(state) - 1);
	if (n < 0)
		return fail("getxattr state", g_ckpt);
	state[n] = '\0';
	if (strcmp(state, "committed") != 0) {
		fprintf(stderr, "write_ckpt: state after commit is '%s'\n", state);
		return -EIO;
	}
	return 0;
}

/* mkdir CKPT/rel like mkdir -p (an existing directory is fine: a new
 * checkpoint may show tensors/ already), or CKPT itself when rel is NULL
 * (that one must be new). */
static int make_dir(const char *rel)
{
	char path[PATH_CAP];
	int err = rel ? ckpt_path(path, rel) : 0;

	if (err)
		return err;
	if (!rel)
		snprintf(path, sizeof(path), "%s", g_ckpt);
	if (mkdir(path, 0755) < 0 && !(rel && errno == EEXIST))
		return fail("mkdir", path);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: write_ckpt MOUNT/CKPT\n");
		return 2;
	}
	g_ckpt = argv[1];
	if (make_dir(NULL) || make_dir("tensors") || make_dir("tensors/c"))
		return 1;
	if (write_w0() || write_w1() || write_flat() || write_config() ||
	    commit())
		return 1;
	printf("write_ckpt: %s committed\n", g_ckpt);
	return 0;
}
