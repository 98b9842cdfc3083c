/*
 * fuzz_adapter.c - the checks every file-writing adapter fuzz target
 * shares (see fuzz_adapter.h). Aborts (fuzz_die) on the first broken
 * rule; reads at most two bytes per shard.
 */
#include "fuzz_adapter.h"
#include "fuzz_util.h"

#include "sf_error.h"
#include "sf_model.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fuzz_scratch_dir(char *dir, size_t size)
{
	const char *bases[] = { "/dev/shm", getenv("TMPDIR"), "/tmp" };
	int fd;

	dir[0] = '\0';
	for (size_t i = 0; i < 3 && !dir[0]; i++) {
		if (!bases[i])
			continue;
		snprintf(dir, size, "%s/%s.XXXXXX", bases[i], fuzz_target);
		if (!mkdtemp(dir))
			dir[0] = '\0';
	}
	if (!dir[0])
		fuzz_die("no temporary directory", NULL);
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		fuzz_die("cannot open the directory", dir);
	return fd;
}

bool fuzz_adapter_opened(int rc, const struct sf_format_result *res,
			 const char *err, size_t errlen, const char *format)
{
	size_t n = strlen(format);

	if (rc) {
		if (res->model || res->meta)
			fuzz_die("result on failure", NULL);
		if (rc != -ENOMEM && rc != -SF_EFORMAT && rc != -SF_EREFUSED &&
		    rc != -SF_ETOOBIG && rc != -SF_ESHORT && rc != -ENOENT &&
		    rc != -SF_EMANIFEST && rc != -SF_EGAP && rc != -SF_ERANGE)
			fuzz_die("unexpected error code", sf_strerror(rc));
		if (rc != -ENOMEM)
			fuzz_check_message(err, errlen);
		return false;
	}
	if (!res->model || res->meta || strncmp(res->model->format, format, n) != 0 ||
	    (res->model->format[n] != '\0' && res->model->format[n] != ' '))
		fuzz_die("success without the format's model, or with a dump (the seam's)",
			 format);
	return true;
}

static void check_shard(int fd, const struct sf_tensor *t,
			const struct sf_shard *s, const char *what)
{
	struct stat sb;
	unsigned char b;

	if (fstat(fd, &sb) != 0)
		fuzz_die("cannot stat a part", s->file);
	if (s->file_offset > (uint64_t)sb.st_size ||
	    s->nbytes > (uint64_t)sb.st_size - s->file_offset)
		fuzz_die("a shard lies past its file's end", t->name);
	if (s->xxh3)
		fuzz_die("a shard with checksums", what);
	if (s->nbytes == 0)
		return;
	if (pread(fd, &b, 1, (off_t)s->file_offset) != 1 ||
	    pread(fd, &b, 1, (off_t)(s->file_offset + s->nbytes - 1)) != 1)
		fuzz_die("a shard's bytes are unreadable", t->name);
}

void fuzz_adapter_check_model(struct sf_format_result *res, fuzz_fd_of_fn fd_of,
			      void *ctx, const char *what)
{
	int rc = sf_format_result_dump(res); /* over SF_MAX_MANIFEST_BYTES: refused */

	if (rc ? rc != -SF_ETOOBIG : !res->meta)
		fuzz_die("the model does not dump", sf_strerror(rc));
	for (size_t i = 0; i < res->model->ntensors; i++) {
		const struct sf_tensor *t = &res->model->tensors[i];
		char why[256];

		for (size_t j = 0; j < t->nshards; j++)
			check_shard(fd_of(ctx, t->shards[j].file), t, &t->shards[j], what);
		if (sf_tensor_check_coverage(t, why, sizeof(why)) != 0)
			fuzz_die("a tensor not covered", t->name);
		if (sf_tensor_shard_bytes(t) != t->nbytes)
			fuzz_die("a tensor's shards overlap", t->name);
		for (size_t j = 0; j < t->nreplicas; j++) {
			const struct sf_replica *r = &t->replicas[j];

			check_shard(fd_of(ctx, r->copy.file), t, &r->copy, what);
			for (unsigned d = 0; d < t->ndim; d++)
				if (r->copy.flat || r->kept.flat ||
				    r->copy.off[d] != r->kept.off[d] ||
				    r->copy.len[d] != r->kept.len[d])
					fuzz_die("a replica of another box", t->name);
		}
	}
	sf_format_result_clear(res);
}

void fuzz_adapter_run(const struct sf_format *f, int dfd, const char *dir,
		      const char *format, fuzz_result_fn look,
		      fuzz_fd_of_fn fd_of, void *ctx, const char *what)
{
	struct sf_cdir cd = { .dirfd = dfd, .dir = dir, .name = "fz",
			      .ref = { .dir = dir, .name = "fz" } };
	struct sf_format_result res = { 0 };
	char err[256];
	int rc;

	fuzz_poison(err, sizeof(err));
	rc = f->open(&cd, &res, err, sizeof(err));
	if (!fuzz_adapter_opened(rc, &res, err, sizeof(err), format))
		return;
	if (look)
		look(&res);
	fuzz_adapter_check_model(&res, fd_of, ctx, what);
}

void fuzz_parts_write(struct fuzz_parts *pt, const uint8_t *data, size_t size, int max,
		      fuzz_part_name_fn name)
{
	char next[FUZZ_MAX_PARTS][FUZZ_PART_NAME];
	size_t offs[FUZZ_MAX_PARTS], lens[FUZZ_MAX_PARTS], at = 0;
	int n = 0;

	if (max > FUZZ_MAX_PARTS)
		max = FUZZ_MAX_PARTS;
	while (n < max && size - at >= 4) {
		size_t len = (size_t)fuzz_le(data + at, 4);

		at += 4;
		if (len > size - at)
			len = size - at;
		offs[n] = at;
		lens[n++] = len;
		at += len;
	}
	for (int i = 0; i < n; i++)
		name(i, n, next[i], sizeof(next[i]));
	/* the previous input's files this one does not write again go */
	for (int k = 0; k < pt->n; k++) {
		int again = 0;

		for (int i = 0; i < n && !again; i++)
			again = strcmp(pt->names[k], next[i]) == 0;
		if (!again && unlinkat(pt->dfd, pt->names[k], 0) != 0)
			fuzz_die("cannot remove a part", pt->names[k]);
	}
	for (int i = 0; i < n; i++) {
		int fd;

		memcpy(pt->names[i], next[i], sizeof(next[i]));
		fd = openat(pt->dfd, next[i], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0 || (lens[i] && write(fd, data + offs[i], lens[i]) != (ssize_t)lens[i]))
			fuzz_die("cannot write a part", next[i]);
		pt->fds[i] = fd;
	}
	pt->n = n;
}

void fuzz_parts_close(struct fuzz_parts *pt)
{
	for (int i = 0; i < pt->n; i++) {
		close(pt->fds[i]);
		pt->fds[i] = -1;
	}
}

static struct fuzz_parts *exit_parts; /* fuzz_parts_begin's, removed at exit */
static const char *exit_dir;

static void parts_remove(void)
{
	for (int i = 0; i < exit_parts->n; i++)
		unlinkat(exit_parts->dfd, exit_parts->names[i], 0);
	close(exit_parts->dfd);
	rmdir(exit_dir);
}

void fuzz_parts_begin(struct fuzz_parts *pt, char *dir, size_t size)
{
	if (dir[0])
		return;
	pt->dfd = fuzz_scratch_dir(dir, size);
	exit_parts = pt;
	exit_dir = dir;
	atexit(parts_remove);
}

int fuzz_parts_fd_of(void *ctx, const char *file)
{
	const struct fuzz_parts *pt = ctx;

	for (int i = 0; i < pt->n; i++)
		if (strcmp(file, pt->names[i]) == 0)
			return pt->fds[i];
	fuzz_die("a shard names a file not written", file);
	return -1;
}
