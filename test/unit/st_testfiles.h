/*
 * st_testfiles.h - generated inputs for the safetensors header tests and
 * the gpu/ tests: files of pseudo-random bytes and small safetensors files
 * with known tensors.
 */
#ifndef ST_TESTFILES_H
#define ST_TESTFILES_H

#include <stddef.h>
#include <stdint.h>

struct st_spec {
	const char *name;
	const char *dtype;
	unsigned ndim;
	uint64_t shape[4];
	size_t itemsize;
};

/* The tensors of gen_safetensors(), in header order (not sorted). */
extern const struct st_spec gen_st_tensors[];
extern const size_t gen_st_ntensors;

/* Write size pseudo-random bytes (from seed) to path. 0 or -errno. */
int gen_random_file(const char *path, uint64_t size, uint32_t seed);

/* Write a valid safetensors file of gen_st_tensors with random data. */
int gen_safetensors(const char *path, uint32_t seed);

/* Write a file holding a raw 8-byte LE length and then `json` (for
 * malformed-header cases; the length is as given, not strlen(json)), and
 * `data_len` zero bytes after it. */
int gen_raw_st(const char *path, uint64_t hdr_len, const char *json,
	       uint64_t data_len);

#endif
