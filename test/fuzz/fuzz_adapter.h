/*
 * fuzz_adapter.h - what the fuzz targets of foreign-format adapters that
 * open files the target wrote (paddle, deepspeed, dtensor) check alike:
 * an open's outcome against the seam's contract, and a model's every
 * shard, replica and tensor against the files and the model's rules.
 * A helper file of those targets (shardfs_fuzz_target HELPERS).
 */
#ifndef FUZZ_ADAPTER_H
#define FUZZ_ADAPTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_format.h"

/* Make the target's scratch directory (TARGET.XXXXXX under /dev/shm,
 * $TMPDIR or /tmp, the first that works) into dir (size bytes) and open
 * it: the descriptor, kept for the process's life; fuzz_die on failure.
 * The target removes what it wrote there at exit. */
int fuzz_scratch_dir(char *dir, size_t size);

/*
 * After adapter open returned rc with res and err (errlen bytes, poisoned
 * before the call): on failure, no result, an expected error code and a
 * one-line message (fuzz_die otherwise), false; on success, a model and
 * no dump (the seam dumps), true. format: the model's format must begin
 * with it (followed by nothing or a space).
 */
bool fuzz_adapter_opened(int rc, const struct sf_format_result *res,
			 const char *err, size_t errlen, const char *format);

/* The descriptor of the file a shard names, or fuzz_die (the target's:
 * it knows the files it wrote). */
typedef int (*fuzz_fd_of_fn)(void *ctx, const char *file);

/*
 * Check the model of a successful open: it dumps (or is refused past
 * SF_MAX_MANIFEST_BYTES); every shard and replica copy lies inside its
 * file, carries no checksums (what: the format, for the message) and its
 * first and last bytes read; every tensor is covered exactly once;
 * replicas are copies of the same box. Clears res.
 */
void fuzz_adapter_check_model(struct sf_format_result *res, fuzz_fd_of_fn fd_of,
			      void *ctx, const char *what);

/* A target's own look at a successful open's result (may be NULL). */
typedef void (*fuzz_result_fn)(const struct sf_format_result *res);

/*
 * Open the scratch directory dir (descriptor dfd, shown as checkpoint
 * "fz") with adapter f, the error buffer poisoned first; then
 * fuzz_adapter_opened with format and, on success, look (if given) and
 * fuzz_adapter_check_model with fd_of, ctx and what.
 */
void fuzz_adapter_run(const struct sf_format *f, int dfd, const char *dir,
		      const char *format, fuzz_result_fn look,
		      fuzz_fd_of_fn fd_of, void *ctx, const char *what);

/*
 * An input's parts, as the file-writing targets read them: each a 4-byte
 * little-endian length, then that many bytes (a length past the end
 * takes what is left), at most max (<= FUZZ_MAX_PARTS) of them; part i is
 * written as the file name(i, n) of the scratch directory and kept open.
 * Before the files of an input are written, the previous input's that it
 * does not write again are removed, so the directory holds exactly this
 * input's parts.
 */
#define FUZZ_MAX_PARTS 32
#define FUZZ_PART_NAME 64

/* Part i's file name of an input of n parts, into name (size bytes). */
typedef void (*fuzz_part_name_fn)(int i, int n, char *name, size_t size);

struct fuzz_parts {
	int dfd;                                       /* the scratch directory (the target's) */
	char names[FUZZ_MAX_PARTS][FUZZ_PART_NAME];    /* names[0..n): this input's files */
	int fds[FUZZ_MAX_PARTS];                       /* fds[i]: names[i], open; until fuzz_parts_close */
	int n;                                         /* parts of this input */
};

/* Once per process (when dir[0] is still '\0'): make the scratch
 * directory into dir (fuzz_scratch_dir) as pt->dfd, and at exit remove
 * the parts written there and the directory (a target that writes other
 * files there removes them in its own atexit handler, registered after
 * this call). One struct fuzz_parts per process. */
void fuzz_parts_begin(struct fuzz_parts *pt, char *dir, size_t size);

/* Write data's parts into pt->dfd as above (fuzz_die on failure). */
void fuzz_parts_write(struct fuzz_parts *pt, const uint8_t *data, size_t size, int max,
		      fuzz_part_name_fn name);

/* Close this input's descriptors (the files stay for the next input). */
void fuzz_parts_close(struct fuzz_parts *pt);

/* fuzz_fd_of_fn over a struct fuzz_parts: the part named file, or
 * fuzz_die when this input wrote none of that name. */
int fuzz_parts_fd_of(void *ctx, const char *file);

#endif
