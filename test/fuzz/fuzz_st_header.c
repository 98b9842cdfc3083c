/*
 * fuzz_st_header.c - libFuzzer target for the safetensors header parser
 * (gpu/sf_st_header.h sf_st_header_parse, CPU-only code).
 *
 * Input: 8 bytes, then the header JSON (json_len = the rest). The 8 bytes
 * are a little-endian v: with its top bit clear the file is
 * 8 + json_len + v bytes (v is the data section, so tilings can match);
 * with it set the file is v without the top bit (headers that do not fit).
 * For any input, sf_st_header_parse either
 *   - fails with -SF_EMANIFEST, -SF_ETOOBIG or -ENOMEM, no header, and
 *     (but for -ENOMEM) a non-empty one-line message; or
 *   - returns a header for which everything sf_st_header.h promises holds:
 *     data_start = 8 + json_len, data_len = file_size - data_start,
 *     n <= SF_MAX_TENSORS, every name 1..SF_MAX_NAME bytes, unique and not
 *     "__metadata__", every dtype known, ndim <= SF_MAX_NDIM,
 *     end - begin = numel * itemsize (no overflow), entries sorted by begin
 *     and tiling [0, data_len) exactly.
 * Any violation aborts. The input is not NUL-terminated, so an over-read
 * shows under ASan.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_model.h"
#include "sf_st_header.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_st_header";

#define ABSOLUTE_SIZE (1ull << 63)

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void check_entry(const struct sf_st_entry *e)
{
	uint64_t numel = 1, nbytes;
	size_t nlen;

	if (!e->name)
		fuzz_die("entry without a name", NULL);
	nlen = strlen(e->name);
	if (nlen == 0 || nlen > SF_MAX_NAME || strcmp(e->name, "__metadata__") == 0)
		fuzz_die("bad entry name", e->name);
	if (sf_dtype_size(e->dtype) == 0)
		fuzz_die("unknown dtype accepted", e->name);
	if (e->ndim > SF_MAX_NDIM)
		fuzz_die("too many dimensions", e->name);
	for (unsigned d = 0; d < e->ndim; d++)
		if (__builtin_mul_overflow(numel, e->shape[d], &numel))
			fuzz_die("shape overflows", e->name);
	if (__builtin_mul_overflow(numel, (uint64_t)sf_dtype_size(e->dtype), &nbytes))
		fuzz_die("size overflows", e->name);
	if (e->end < e->begin || e->end - e->begin != nbytes)
		fuzz_die("data_offsets do not hold the tensor", e->name);
}

static void check_header(const struct sf_st_header *h, uint64_t json_len,
			 uint64_t file_size)
{
	uint64_t pos = 0;

	if (h->data_start != 8 + json_len || h->data_start > file_size ||
	    h->data_len != file_size - h->data_start)
		fuzz_die("data section misplaced", NULL);
	if (h->n > SF_MAX_TENSORS || (h->n && !h->entries))
		fuzz_die("bad entry count", NULL);
	for (size_t i = 0; i < h->n; i++) {
		const struct sf_st_entry *e = &h->entries[i];
		check_entry(e);
		if (i && e->begin < h->entries[i - 1].begin)
			fuzz_die("entries not sorted by begin", e->name);
		if (e->begin != pos)
			fuzz_die("entries do not tile the data section", e->name);
		pos = e->end;
	}
	if (pos != h->data_len)
		fuzz_die("entries do not end at the end of the data section", NULL);

	char **names = malloc((h->n ? h->n : 1) * sizeof(*names));
	if (!names)
		abort();
	for (size_t i = 0; i < h->n; i++)
		names[i] = h->entries[i].name;
	qsort(names, h->n, sizeof(*names), by_name);
	for (size_t i = 1; i < h->n; i++)
		if (strcmp(names[i - 1], names[i]) == 0)
			fuzz_die("duplicate name", names[i]);
	free(names);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sf_st_header *h = (struct sf_st_header *)&h; /* not NULL */
	char err[512];
	uint64_t v, json_len, file_size;

	if (size < 8)
		return 0;
	v = fuzz_le(data, 8);
	json_len = size - 8;
	file_size = (v & ABSOLUTE_SIZE) ? v & ~ABSOLUTE_SIZE : 8 + json_len + v;

	fuzz_poison(err, sizeof(err));
	int rc = sf_st_header_parse((const char *)data + 8, json_len, file_size,
				    &h, err, sizeof(err));
	if (rc < 0) {
		if (h)
			fuzz_die("failed parse returned a header", err);
		if (rc == -ENOMEM)
			return 0;
		if (rc != -SF_EMANIFEST && rc != -SF_ETOOBIG)
			fuzz_die("undocumented error", sf_strerror(rc));
		fuzz_check_message(err, sizeof(err));
		return 0;
	}
	if (rc != 0 || !h)
		fuzz_die("parse returned neither an error nor a header", NULL);
	check_header(h, json_len, file_size);
	sf_st_header_destroy(h);
	return 0;
}
