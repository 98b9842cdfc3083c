/*
 * fuzz_replay.c - run LLVMFuzzerTestOneInput over saved inputs without
 * libFuzzer, so the fuzz corpus replays as an ordinary test with any
 * compiler.
 *
 * Usage: fuzz_NAME_replay PATH...   (files, or directories walked
 * recursively up to MAX_DEPTH levels; names starting with '.' skipped).
 * Each input is read whole (at most REPLAY_MAX_INPUT bytes, larger files are
 * skipped with a note) into a buffer of exactly its size, so over-reads
 * show under ASan. A crash or abort in the target fails the test; so does
 * finding no input at all.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_DEPTH 4
#define REPLAY_MAX_INPUT (16u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned long replayed;

static int replay_file(const char *path, const struct stat *st)
{
	if (st->st_size > REPLAY_MAX_INPUT) {
		fprintf(stderr, "skip %s: larger than %u bytes\n", path, REPLAY_MAX_INPUT);
		return 0;
	}
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		return -errno;
	}
	int rc = 0;
	size_t size = (size_t)st->st_size;
	/* malloc(0) may return NULL; keep a valid pointer for empty inputs. */
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out_close;
	}
	if (fread(buf, 1, size, f) != size) {
		fprintf(stderr, "%s: short read\n", path);
		rc = -EIO;
		goto out_free_buf;
	}
	LLVMFuzzerTestOneInput(buf, size);
	replayed++;
out_free_buf:
	free(buf);
out_close:
	fclose(f);
	return rc;
}

static int replay_path(const char *path, int depth)
{
	struct stat st;
	if (stat(path, &st) != 0) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		return -errno;
	}
	if (S_ISREG(st.st_mode))
		return replay_file(path, &st);
	if (!S_ISDIR(st.st_mode) || depth >= MAX_DEPTH)
		return 0;
	DIR *d = opendir(path);
	if (!d) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		return -errno;
	}
	int rc = 0;
	struct dirent *e;
	while (rc == 0 && (e = readdir(d))) {
		char sub[4096];
		if (e->d_name[0] == '.')
			continue;
		if ((size_t)snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name) >= sizeof(sub))
			continue;
		rc = replay_path(sub, depth + 1);
	}
	closedir(d);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++)
		if (replay_path(argv[i], 0) < 0)
			return 1;
	printf("replayed %lu inputs\n", replayed);
	return replayed ? 0 : 1;
}
