/*
 * sf_box.c - box math on row-major tensors.
 *
 * Terms: the "fused row" of a box is its run of elements that is contiguous
 * in the flattened tensor. Let k be the smallest dimension such that the box
 * covers every dimension after k fully (offset 0, full length); then one
 * fused row is len[k] * prod(shape[k+1..]) elements, and the box's bytes
 * are prod(len[0..k-1]) fused rows, one after another. Consecutive fused
 * rows are never contiguous in the tensor (dimension k is not full, or k is
 * 0 and there is only one row), so runs built from fused rows are maximal.
 *
 * Invariant for callers: boxes passed in have passed sf_box_check() against
 * the shape, and the shape's byte size fits in uint64_t, so no product
 * below can overflow.
 */
#include "sf_box.h"
#include "sf_error.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

int sf_shape_nbytes(unsigned ndim, const uint64_t *shape, size_t itemsize,
		    uint64_t *nbytes)
{
	uint64_t n = itemsize;

	if (ndim > SF_MAX_NDIM)
		return -SF_ETOOBIG;
	for (unsigned i = 0; i < ndim; i++) {
		if (shape[i] != 0 && n > UINT64_MAX / shape[i])
			return -SF_ETOOBIG;
		n *= shape[i];
	}
	/* A zero dimension makes the product 0 even after an earlier
	 * near-overflow; that is fine: the tensor is empty. */
	*nbytes = n;
	return 0;
}

void sf_box_full(struct sf_box *b, unsigned ndim, const uint64_t *shape)
{
	memset(b, 0, sizeof(*b));
	b->ndim = ndim;
	for (unsigned i = 0; i < ndim; i++)
		b->len[i] = shape[i];
}

int sf_box_check(const struct sf_box *b, unsigned ndim, const uint64_t *shape)
{
	if (b->ndim != ndim || ndim > SF_MAX_NDIM)
		return -SF_ERANGE;
	for (unsigned i = 0; i < ndim; i++) {
		if (b->off[i] > shape[i] || b->len[i] > shape[i] - b->off[i])
			return -SF_ERANGE;
	}
	return 0;
}

uint64_t sf_box_numel(const struct sf_box *b)
{
	uint64_t n = 1;

	for (unsigned i = 0; i < b->ndim; i++)
		n *= b->len[i];
	return n;
}

bool sf_box_intersect(const struct sf_box *a, const struct sf_box *b,
		      struct sf_box *out)
{
	struct sf_box r;

	if (a->ndim != b->ndim)
		return false;
	r.ndim = a->ndim;
	for (unsigned i = 0; i < a->ndim; i++) {
		uint64_t lo = a->off[i] > b->off[i] ? a->off[i] : b->off[i];
		uint64_t ea = a->off[i] + a->len[i], eb = b->off[i] + b->len[i];
		uint64_t hi = ea < eb ? ea : eb;
		if (hi <= lo)
			return false;
		r.off[i] = lo;
		r.len[i] = hi - lo;
	}
	*out = r;
	return true;
}

bool sf_box_contains(const struct sf_box *a, const struct sf_box *b)
{
	if (a->ndim != b->ndim)
		return false;
	for (unsigned i = 0; i < a->ndim; i++) {
		if (b->off[i] < a->off[i] ||
		    b->off[i] + b->len[i] > a->off[i] + a->len[i])
			return false;
	}
	return true;
}

/* Smallest k such that dims after k are covered fully (0 for ndim <= 1). */
static unsigned fused_dim(unsigned ndim, const uint64_t *shape,
			  const struct sf_box *b)
{
	unsigned k = ndim ? ndim - 1 : 0;

	while (k > 0 && b->off[k] == 0 && b->len[k] == shape[k])
		k--;
	return k;
}

/* Element strides of a row-major tensor. */
static void strides_of(unsigned ndim, const uint64_t *shape, uint64_t *st)
{
	uint64_t s = 1;

	for (unsigned i = ndim; i-- > 0;) {
		st[i] = s;
		s *= shape[i];
	}
}

int sf_box_runs(unsigned ndim, const uint64_t *shape, size_t itemsize,
		const struct sf_box *b, uint64_t off, uint64_t len,
		sf_run_fn fn, void *arg)
{
	uint64_t st[SF_MAX_NDIM], idx[SF_MAX_NDIM];
	uint64_t row_bytes, row, within, t_row;
	unsigned k;
	int ret;

	if (len == 0)
		return 0;
	if (ndim == 0)
		return fn(arg, off, off, len);
	strides_of(ndim, shape, st);
	k = fused_dim(ndim, shape, b);
	row_bytes = b->len[k] * st[k] * itemsize;
	if (row_bytes == 0)
		return 0;
	row = off / row_bytes;
	within = off % row_bytes;
	/* Mixed-radix decomposition of the row number over dims 0..k-1. */
	for (unsigned i = k; i-- > 0;) {
		idx[i] = row % b->len[i];
		row /= b->len[i];
	}
	for (;;) {
		uint64_t n;

		t_row = b->off[k] * st[k];
		for (unsigned i = 0; i < k; i++)
			t_row += (b->off[i] + idx[i]) * st[i];
		n = row_bytes - within;
		if (n > len)
			n = len;
		ret = fn(arg, t_row * itemsize + within, off, n);
		if (ret)
			return ret;
		off += n;
		len -= n;
		if (len == 0)
			return 0;
		within = 0;
		for (unsigned i = k; i-- > 0;) {
			if (++idx[i] < b->len[i])
				break;
			idx[i] = 0;
		}
	}
}

bool sf_box_locate(unsigned ndim, const uint64_t *shape, size_t itemsize,
		   const struct sf_box *b, uint64_t tensor_off,
		   uint64_t *box_off, uint64_t *run)
{
	uint64_t st[SF_MAX_NDIM], idx[SF_MAX_NDIM];
	uint64_t e = tensor_off / itemsize, within = tensor_off % itemsize;
	uint64_t local = 0, row_bytes;
	unsigned k, last;

	if (ndim == 0) {
		*box_off = tensor_off;
		*run = itemsize - within;
		return true;
	}
	strides_of(ndim, shape, st);
	for (unsigned i = 0; i < ndim; i++) {
		idx[i] = e / st[i];
		e %= st[i];
	}
	last = ndim - 1;
	for (unsigned i = 0; i < ndim; i++) {
		if (idx[i] >= b->off[i] && idx[i] < b->off[i] + b->len[i])
			continue;
		/* Outside. If only the last dimension misses, and we are before
		 * the box along it, everything up to the box's start is outside;
		 * otherwise the rest of this tensor row along the last dim is. */
		bool only_last = true;
		for (unsigned j = 0; j < last; j++)
			if (idx[j] < b->off[j] || idx[j] >= b->off[j] + b->len[j])
				only_last = false;
		if (only_last && idx[last] < b->off[last])
			*run = (b->off[last] - idx[last]) * itemsize - within;
		else
			*run = (shape[last] - idx[last]) * itemsize - within;
		return false;
	}
	for (unsigned i = 0; i < ndim; i++)
		local = local * b->len[i] + (idx[i] - b->off[i]);
	k = fused_dim(ndim, shape, b);
	row_bytes = b->len[k] * st[k] * itemsize;
	*box_off = local * itemsize + within;
	*run = row_bytes - *box_off % row_bytes;
	return true;
}

bool sf_box_locate_strided(unsigned ndim, const uint64_t *shape,
			   size_t itemsize, const struct sf_box *b,
			   const uint64_t *strides, uint64_t tensor_off,
			   uint64_t *pos, uint64_t *run)
{
	uint64_t box_off, brun, e, within, rem, p = 0, prun, last_idx = 0;

	if (!sf_box_locate(ndim, shape, itemsize, b, tensor_off, &box_off, &brun)) {
		*run = brun;
		return false;
	}
	if (ndim == 0) {
		*pos = box_off;
		*run = brun;
		return true;
	}
	e = box_off / itemsize;
	within = box_off % itemsize;
	rem = e;
	for (unsigned d = ndim; d-- > 0;) {
		uint64_t c = rem % b->len[d];

		rem /= b->len[d];
		if (d == ndim - 1)
			last_idx = c;
		p += c * strides[d];
	}
	*pos = p * itemsize + within;
	/* Contiguous in the payload: along the last dimension when its
	 * stride is one element, else this element only. */
	if (strides[ndim - 1] == 1)
		prun = (b->len[ndim - 1] - last_idx) * itemsize - within;
	else
		prun = itemsize - within;
	*run = brun < prun ? brun : prun;
	return true;
}

/* Parse a decimal uint64 in [s, e); false on empty, non-digit or overflow. */
static bool parse_u64(const char *s, const char *e, uint64_t *out)
{
	uint64_t v = 0;

	if (s == e)
		return false;
	for (; s < e; s++) {
		if (*s < '0' || *s > '9')
			return false;
		if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return true;
}

int sf_slice_parse(const char *spec, size_t len, unsigned ndim,
		   const uint64_t *shape, struct sf_box *out)
{
	const char *p = spec, *end = spec + len;
	struct sf_box b;
	bool range_err = false;

	memset(&b, 0, sizeof(b));
	b.ndim = ndim;
	if (ndim == 0)
		return len == 0 ? (*out = b, 0) : -SF_ESLICE;
	for (unsigned d = 0; d < ndim; d++) {
		const char *comma = memchr(p, ',', (size_t)(end - p));
		const char *fe = comma ? comma : end;
		const char *colon = memchr(p, ':', (size_t)(fe - p));
		uint64_t lo = 0, hi = shape[d];

		if (!colon)
			return -SF_ESLICE;
		if (colon > p && !parse_u64(p, colon, &lo))
			return -SF_ESLICE;
		if (fe > colon + 1 && !parse_u64(colon + 1, fe, &hi))
			return -SF_ESLICE;
		if ((d + 1 < ndim) != (comma != NULL))
			return -SF_ESLICE;
		if (lo > hi || hi > shape[d])
			range_err = true;
		else {
			b.off[d] = lo;
			b.len[d] = hi - lo;
		}
		p = fe + 1;
	}
	if (range_err)
		return -SF_ERANGE;
	*out = b;
	return 0;
}

int sf_slice_format(const struct sf_box *b, char *buf, size_t size)
{
	size_t n = 0;

	if (size)
		buf[0] = '\0';
	for (unsigned i = 0; i < b->ndim; i++) {
		int m = snprintf(n < size ? buf + n : NULL, n < size ? size - n : 0,
				 "%s%llu:%llu", i ? "," : "",
				 (unsigned long long)b->off[i],
				 (unsigned long long)(b->off[i] + b->len[i]));
		if (m < 0)
			return m;
		n += (size_t)m;
	}
	return n > INT_MAX ? INT_MAX : (int)n;
}
