/*
 * st_testfiles.c - writers of generated test inputs (see st_testfiles.h).
 * Deterministic: the same seed gives the same bytes.
 */
#include "st_testfiles.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct st_spec gen_st_tensors[] = {
	{ "model.layers.0.wq", "BF16", 2, { 96, 130 }, 2 },
	{ "model.embed", "F32", 2, { 257, 64 }, 4 },
	{ "empty", "F16", 2, { 0, 7 }, 2 },
	{ "scalar", "I64", 0, { 0 }, 8 },
	{ "norm/weight", "F32", 1, { 130 }, 4 },
	{ "mask", "BOOL", 3, { 3, 5, 7 }, 1 },
};
const size_t gen_st_ntensors = sizeof(gen_st_tensors) / sizeof(gen_st_tensors[0]);

static uint32_t next(uint32_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 17;
	*x ^= *x << 5;
	return *x;
}

static int put_random(FILE *f, uint64_t n, uint32_t *x)
{
	unsigned char buf[4096];
	size_t k, i;

	while (n) {
		k = n < sizeof(buf) ? (size_t)n : sizeof(buf);
		for (i = 0; i < k; i++)
			buf[i] = (unsigned char)next(x);
		if (fwrite(buf, 1, k, f) != k)
			return -EIO;
		n -= k;
	}
	return 0;
}

static int put_le64(FILE *f, uint64_t v)
{
	unsigned char b[8];
	int i;

	for (i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	return fwrite(b, 1, 8, f) == 8 ? 0 : -EIO;
}

int gen_random_file(const char *path, uint64_t size, uint32_t seed)
{
	uint32_t x = seed ? seed : 1;
	FILE *f = fopen(path, "wb");
	int rc;

	if (!f)
		return -errno;
	rc = put_random(f, size, &x);
	if (fclose(f) && !rc)
		rc = -EIO;
	return rc;
}

int gen_safetensors(const char *path, uint32_t seed)
{
	char json[4096];
	size_t len = 0, i;
	uint64_t off = 0, nb, total = 0, pad;
	uint32_t x = seed ? seed : 1;
	unsigned d;
	FILE *f;
	int rc;

	len += (size_t)snprintf(json + len, sizeof(json) - len,
				"{\"__metadata__\":{\"format\":\"pt\"}");
	for (i = 0; i < gen_st_ntensors; i++) {
		const struct st_spec *t = &gen_st_tensors[i];

		nb = t->itemsize;
		for (d = 0; d < t->ndim; d++)
			nb *= t->shape[d];
		len += (size_t)snprintf(json + len, sizeof(json) - len,
					",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
					t->name, t->dtype);
		for (d = 0; d < t->ndim; d++)
			len += (size_t)snprintf(json + len, sizeof(json) - len,
						"%s%llu", d ? "," : "",
						(unsigned long long)t->shape[d]);
		len += (size_t)snprintf(json + len, sizeof(json) - len,
					"],\"data_offsets\":[%llu,%llu]}",
					(unsigned long long)off,
					(unsigned long long)(off + nb));
		off += nb;
	}
	total = off;
	len += (size_t)snprintf(json + len, sizeof(json) - len, "}");
	pad = (8 - (len % 8)) % 8;
	f = fopen(path, "wb");
	if (!f)
		return -errno;
	rc = put_le64(f, len + pad);
	if (!rc && fwrite(json, 1, len, f) != len)
		rc = -EIO;
	for (i = 0; !rc && i < pad; i++)
		rc = fputc(' ', f) == ' ' ? 0 : -EIO;
	if (!rc)
		rc = put_random(f, total, &x);
	if (fclose(f) && !rc)
		rc = -EIO;
	return rc;
}

int gen_raw_st(const char *path, uint64_t hdr_len, const char *json,
	       uint64_t data_len)
{
	FILE *f = fopen(path, "wb");
	uint64_t i;
	int rc;

	if (!f)
		return -errno;
	rc = put_le64(f, hdr_len);
	if (!rc && fwrite(json, 1, strlen(json), f) != strlen(json))
		rc = -EIO;
	for (i = 0; !rc && i < data_len; i++)
		rc = fputc(0, f) == 0 ? 0 : -EIO;
	if (fclose(f) && !rc)
		rc = -EIO;
	return rc;
}
