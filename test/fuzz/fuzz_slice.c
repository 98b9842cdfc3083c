/*
 * fuzz_slice.c - libFuzzer target for the slice path parser
 * (sf_slice_parse, the text after '@' in NAME@START:STOP,...) and its
 * inverse sf_slice_format.
 *
 * Input: byte 0 picks ndim (1..SF_MAX_NDIM), the next ndim bytes pick the
 * shape (see dim_of), the rest is the spec. For any input:
 *   - sf_slice_parse returns 0, -SF_ESLICE or -SF_ERANGE, and exactly what
 *     an independent model of the grammar in sf_box.h says: ndim fields
 *     separated by ','; each is [digits]:[digits] with values that fit in
 *     uint64 (else -SF_ESLICE); an empty START is 0, an empty STOP the
 *     dimension; START > STOP or STOP > dim is -SF_ERANGE;
 *   - on success the box is the model's, lies inside the shape
 *     (sf_box_check), and sf_slice_format of it re-parses to the identical
 *     box and formats identically again;
 *   - sf_slice_format behaves like snprintf: it returns the full length
 *     whatever the size, writes at most `size` bytes, always NUL-terminates
 *     (size > 0) with a prefix of the full text.
 * Any violation aborts. The input is not NUL-terminated, so an over-read
 * shows under ASan.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_box.h"
#include "sf_error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_slice";

/* "N:N" per dimension, 20 digits each, commas and a NUL. */
#define FMT_MAX (SF_MAX_NDIM * 42 + 1)
#define CANARY 0x5a

/* A dimension from one input byte: 0..127 as is, else a large value. */
static uint64_t dim_of(uint8_t b)
{
	static const uint64_t big[16] = {
		255, 256, 1000, 4096, 65535, 65536, 1ull << 31, 1ull << 32,
		(1ull << 32) + 1, 1ull << 53, INT64_MAX, 1ull << 63,
		10000000000000000000ull, UINT64_MAX - 1, UINT64_MAX, 99999,
	};

	return b < 128 ? b : big[b & 15];
}

/* The model: a decimal in [s, e) that fits in uint64; empty is allowed
 * (*present false). */
static bool model_num(const char *s, const char *e, bool *present, uint64_t *v)
{
	*present = s < e;
	*v = 0;
	for (; s < e; s++) {
		unsigned dgt = (unsigned)(*s - '0');
		if (*s < '0' || *s > '9')
			return false;
		if (*v > UINT64_MAX / 10 || *v * 10 > UINT64_MAX - dgt)
			return false;
		*v = *v * 10 + dgt;
	}
	return true;
}

/* The model of sf_slice_parse: syntax over the whole spec first, then
 * ranges. */
static int model_parse(const char *spec, size_t len, unsigned ndim,
		       const uint64_t *shape, struct sf_box *b)
{
	const char *p = spec, *end = spec + len;
	bool range_err = false;

	memset(b, 0, sizeof(*b));
	b->ndim = ndim;
	for (unsigned d = 0; d < ndim; d++) {
		const char *fe = p, *colon = NULL;
		uint64_t lo, hi;
		bool has_lo, has_hi;

		while (fe < end && *fe != ',') {
			if (*fe == ':' && !colon)
				colon = fe;
			fe++;
		}
		if (!colon || (fe < end) != (d + 1 < ndim))
			return -SF_ESLICE;
		if (!model_num(p, colon, &has_lo, &lo) ||
		    !model_num(colon + 1, fe, &has_hi, &hi))
			return -SF_ESLICE;
		if (!has_hi)
			hi = shape[d];
		if (lo > hi || hi > shape[d])
			range_err = true;
		b->off[d] = lo;
		b->len[d] = hi - lo;
		p = fe + 1;
	}
	return range_err ? -SF_ERANGE : 0;
}

static bool box_equal(const struct sf_box *a, const struct sf_box *b)
{
	if (a->ndim != b->ndim)
		return false;
	for (unsigned d = 0; d < a->ndim; d++)
		if (a->off[d] != b->off[d] || a->len[d] != b->len[d])
			return false;
	return true;
}

/* sf_slice_format into a buffer of `cap` bytes (followed by canaries):
 * must return `want`, keep the canaries and leave a NUL-terminated prefix
 * of full. */
static void check_format_size(const struct sf_box *b, size_t cap,
			      const char *full, int want)
{
	char buf[FMT_MAX + 8];

	memset(buf, CANARY, sizeof(buf));
	if (sf_slice_format(b, buf, cap) != want)
		fuzz_die("format length depends on the buffer size", full);
	for (size_t i = cap; i < cap + 8; i++)
		if (buf[i] != CANARY)
			fuzz_die("format wrote past its buffer", full);
	if (cap == 0)
		return;
	size_t n = (size_t)want < cap ? (size_t)want : cap - 1;
	if (buf[n] != '\0' || memcmp(buf, full, n) != 0)
		fuzz_die("truncated format is not a NUL-terminated prefix", full);
}

static void check_roundtrip(const struct sf_box *b, unsigned ndim,
			    const uint64_t *shape)
{
	char f1[FMT_MAX], f2[FMT_MAX];
	struct sf_box b2;

	if (sf_box_check(b, ndim, shape) != 0)
		fuzz_die("parsed box lies outside the shape", NULL);
	int n = sf_slice_format(b, f1, sizeof(f1));
	if (n < 0 || (size_t)n >= sizeof(f1) || strlen(f1) != (size_t)n)
		fuzz_die("format length is wrong", f1);
	/* Parse from an exact-size heap copy so an over-read shows. */
	char *copy = malloc(n ? (size_t)n : 1);
	if (!copy)
		abort();
	memcpy(copy, f1, (size_t)n);
	int rc = sf_slice_parse(copy, (size_t)n, ndim, shape, &b2);
	free(copy);
	if (rc != 0)
		fuzz_die("formatted slice does not re-parse", f1);
	if (!box_equal(b, &b2))
		fuzz_die("parse(format(box)) != box", f1);
	if (sf_slice_format(&b2, f2, sizeof(f2)) != n || strcmp(f1, f2) != 0)
		fuzz_die("second format differs", f1);
	check_format_size(b, 0, f1, n);
	check_format_size(b, 1, f1, n);
	check_format_size(b, (size_t)n / 2 + 1, f1, n);
	check_format_size(b, (size_t)n, f1, n);
	check_format_size(b, (size_t)n + 1, f1, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint64_t shape[SF_MAX_NDIM];
	struct sf_box got, want;
	unsigned ndim;

	if (size < 1)
		return 0;
	ndim = 1 + data[0] % SF_MAX_NDIM;
	if (size < 1 + ndim)
		return 0;
	for (unsigned d = 0; d < ndim; d++)
		shape[d] = dim_of(data[1 + d]);
	const char *spec = (const char *)data + 1 + ndim;
	size_t len = size - 1 - ndim;

	memset(&got, 0, sizeof(got));
	int rc = sf_slice_parse(spec, len, ndim, shape, &got);
	int mrc = model_parse(spec, len, ndim, shape, &want);
	if (rc != 0 && rc != -SF_ESLICE && rc != -SF_ERANGE)
		fuzz_die("undocumented error", sf_strerror(rc));
	if (rc != mrc) {
		char why[128];
		snprintf(why, sizeof(why), "parser says %s, the model %s",
			 sf_strerror(rc), sf_strerror(mrc));
		fuzz_die("parser and model disagree", why);
	}
	if (rc != 0)
		return 0;
	if (!box_equal(&got, &want))
		fuzz_die("parsed box differs from the model's", NULL);
	check_roundtrip(&got, ndim, shape);
	return 0;
}
