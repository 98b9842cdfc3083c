/*
 * sf_st_header.h - a strict parser for safetensors headers, CPU-only so it
 * is tested on machines without a GPU.
 *
 * A safetensors file is: an 8-byte little-endian header length N, N bytes of
 * JSON, then the data section. Each JSON entry other than "__metadata__" is
 * {"dtype": NAME, "shape": [d...], "data_offsets": [begin, end]} with
 * offsets relative to the data section. Accepted only when N is in
 * [2, SF_MAX_ST_HEADER] and fits in the file, the JSON is an object without
 * duplicate keys, every dtype is known, every shape has at most SF_MAX_NDIM
 * dimensions, end - begin equals numel * itemsize (overflow-checked), and the
 * entries sorted by begin tile the data section exactly: the first begins at
 * 0, each begins where the previous ended, the last ends at the file's end.
 */
#ifndef SF_ST_HEADER_H
#define SF_ST_HEADER_H

#include <stddef.h>
#include <stdint.h>

#include "sf_box.h"
#include "sf_dtype.h"

struct sf_st_entry {
	char *name;             /* owned by the header; <= SF_MAX_NAME bytes */
	enum sf_dtype dtype;
	unsigned ndim;          /* <= SF_MAX_NDIM */
	uint64_t shape[SF_MAX_NDIM];
	uint64_t begin, end;    /* bytes, relative to data_start */
};

struct sf_st_header {
	struct sf_st_entry *entries; /* sorted by begin; owned */
	size_t n;                    /* <= SF_MAX_TENSORS */
	uint64_t data_start;         /* 8 + N: absolute offset of the data */
	uint64_t data_len;           /* file size - data_start */
	char *metadata;              /* "__metadata__" as compact JSON text
				      * (owned), NULL when the header has none */
};

/*
 * Parse `json_len` bytes of header JSON of a file of `file_size` bytes
 * (json_len is the N from the file's first 8 bytes). On success *out is a
 * new header (caller destroys). On failure returns -SF_EMANIFEST (or
 * -SF_ETOOBIG, -ENOMEM) with a one-line reason in err (may be NULL).
 */
int sf_st_header_parse(const char *json, uint64_t json_len,
		       uint64_t file_size, struct sf_st_header **out,
		       char *err, size_t errlen);

/* Read and parse the header of the open file fd (size from fstat). */
int sf_st_header_read(int fd, struct sf_st_header **out, char *err,
		      size_t errlen);
/* The same for a whole file given as an input (its size is in->size). */
struct sf_input;
int sf_st_header_read_input(const struct sf_input *in, struct sf_st_header **out,
			    char *err, size_t errlen);

void sf_st_header_destroy(struct sf_st_header *h); /* accepts NULL */

#endif
