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

#endif
