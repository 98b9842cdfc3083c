/*
 * sf_cover.c - the coverage check of the model's validator: does every
 * byte of an entry lie in some shard? And the overlap rule of the foreign
 * formats (sf_overlap_rule): exact replicas folded to one copy, partial
 * overlaps refused. (sf_model.h)
 *
 * Exact and bounded: shards become byte boxes (a box shard one, a flat
 * range at most 2k-1), sorted by low corner; the whole tensor is then
 * subtracted box by box on an explicit stack of regions, so the first
 * uncovered byte is found or none is. Work is capped at COVER_MAX_STEPS
 * box tests and regions and memory at COVER_MAX_BYTES per entry; past
 * either the answer is -SF_ETOOBIG, never a guess.
 *
 * The overlap rule never builds byte boxes: replicas are found by sorting
 * the shards by their box (O(n log n)), and shards that cover a tensor are
 * disjoint iff their byte counts add up to its size (a byte held twice
 * would leave another uncovered). Only to name two overlapping shards in
 * its message does it test pairs, at most OVERLAP_MAX_PAIRS of them.
 */
#include "sf_model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_error.h"

/* Coverage work bound: box tests plus regions examined, per tensor. */
#define COVER_MAX_STEPS (1u << 22)
/* Coverage memory bound: byte boxes plus the region stack, per tensor. */
#define COVER_MAX_BYTES (64u << 20)

/* Advance *n by the result r of an snprintf into a buffer of size cap. */
static void advance(size_t *n, int r, size_t cap)
{
	if (r < 0)
		return;
	*n += (size_t)r;
	if (*n >= cap)
		*n = cap - 1;
}

/*
 * The tensor in byte coordinates: k dimensions, the last one in bytes
 * (shape[n-1] * itemsize), so box shards and flat ranges are both unions
 * of byte boxes. A byte box is stored as 2k uint64: lo[0..k), hi[0..k)
 * (half-open). A region on the work stack is 2k + 1 uint64: its box and
 * the index of the first byte box that may still intersect it.
 */
struct cover {
	unsigned k;                     /* 1..SF_MAX_NDIM */
	uint64_t dim[SF_MAX_NDIM];      /* byte-coordinate shape */
	uint64_t stride[SF_MAX_NDIM];   /* bytes per step in each dimension */
	uint64_t *boxes;                /* nboxes * 2k, owned */
	size_t nboxes, cap_boxes;       /* in boxes */
	uint64_t *stack;                /* nstack * (2k + 1), owned */
	size_t nstack, cap_stack;       /* in regions */
	uint64_t steps;                 /* box tests + regions, <= COVER_MAX_STEPS */
};

/* Reserve room for one more record of `words` uint64 in *arr (n records,
 * *cap capacity), within COVER_MAX_BYTES together with `other` bytes. */
static int cover_grow(uint64_t **arr, size_t n, size_t *cap, size_t words,
		      size_t other)
{
	size_t rec = words * sizeof(uint64_t);
	size_t max = other < COVER_MAX_BYTES ? (COVER_MAX_BYTES - other) / rec : 0;

	if (n < *cap)
		return 0;
	if (!max)
		return -SF_ETOOBIG;
	return sf_array_grow(arr, n, cap, rec, 64, max);
}

static int cover_add_box(struct cover *c, const uint64_t *lo, const uint64_t *hi)
{
	unsigned k = c->k;
	for (unsigned d = 0; d < k; d++)
		if (lo[d] >= hi[d])
			return 0; /* empty: covers nothing */
	int rc = cover_grow(&c->boxes, c->nboxes, &c->cap_boxes, 2 * k,
			    c->cap_stack * (2 * k + 1) * sizeof(uint64_t));
	if (rc < 0)
		return rc;
	uint64_t *b = c->boxes + c->nboxes * 2 * k;
	memcpy(b, lo, k * sizeof(*lo));
	memcpy(b + k, hi, k * sizeof(*hi));
	c->nboxes++;
	return 0;
}

/*
 * Add the bytes [lo, hi) of the sub-tensor at dimension i (whose indices
 * for dimensions < i are fixed in prefix[]) as at most 2(k-i)-1 byte
 * boxes: a partial head row, a run of whole rows, a partial tail row.
 * Recursion depth <= k.
 */
static int cover_add_flat(struct cover *c, unsigned i, uint64_t *prefix,
			  uint64_t lo, uint64_t hi)
{
	uint64_t blo[SF_MAX_NDIM], bhi[SF_MAX_NDIM];
	unsigned k = c->k;
	int rc;

	if (lo >= hi)
		return 0;
	for (unsigned d = 0; d < i; d++) {
		blo[d] = prefix[d];
		bhi[d] = prefix[d] + 1;
	}
	if (i == k - 1) {
		blo[i] = lo;
		bhi[i] = hi;
		return cover_add_box(c, blo, bhi);
	}
	uint64_t st = c->stride[i];
	uint64_t a = lo / st, ra = lo % st, b = hi / st, rb = hi % st;
	if (a == b) {
		prefix[i] = a;
		return cover_add_flat(c, i + 1, prefix, ra, rb);
	}
	if (ra) {
		prefix[i] = a;
		rc = cover_add_flat(c, i + 1, prefix, ra, st);
		if (rc < 0)
			return rc;
		a++;
	}
	if (a < b) {
		blo[i] = a;
		bhi[i] = b;
		for (unsigned d = i + 1; d < k; d++) {
			blo[d] = 0;
			bhi[d] = c->dim[d];
		}
		rc = cover_add_box(c, blo, bhi);
		if (rc < 0)
			return rc;
	}
	if (rb) {
		prefix[i] = b;
		return cover_add_flat(c, i + 1, prefix, 0, rb);
	}
	return 0;
}

static int cover_push(struct cover *c, const uint64_t *lo, const uint64_t *hi,
		      uint64_t next)
{
	unsigned k = c->k;
	int rc = cover_grow(&c->stack, c->nstack, &c->cap_stack, 2 * k + 1,
			    c->cap_boxes * 2 * k * sizeof(uint64_t));
	if (rc < 0)
		return rc;
	uint64_t *r = c->stack + c->nstack * (2 * k + 1);
	memcpy(r, lo, k * sizeof(*lo));
	memcpy(r + k, hi, k * sizeof(*hi));
	r[2 * k] = next;
	c->nstack++;
	return 0;
}

/* Byte offset of a byte-coordinate point in the flattened tensor. */
static uint64_t cover_flat(const struct cover *c, const uint64_t *pt)
{
	uint64_t off = 0;
	for (unsigned d = 0; d < c->k; d++)
		off += pt[d] * c->stride[d];
	return off;
}

/* Row-major order of byte boxes by their low corner (qsort_r). */
static int cover_cmp(const void *a, const void *b, void *arg)
{
	const uint64_t *x = a, *y = b;
	unsigned k = *(const unsigned *)arg;
	for (unsigned d = 0; d < k; d++)
		if (x[d] != y[d])
			return x[d] < y[d] ? -1 : 1;
	return 0;
}

/*
 * Recursive subtraction on an explicit stack. A region [lo, hi) with
 * start index j is known to miss boxes before j. Take the first box from
 * j that intersects it: none means the region is uncovered; containing it
 * means it is covered; otherwise region minus box splits into at most 2k
 * disjoint regions, all of which miss boxes up to that one. Boxes are
 * sorted by low corner, so the scan stops at the first box that starts
 * past the region in dimension 0. Regions whose
 * low corner lies past the lowest gap found so far are skipped, so *gap
 * ends as the first uncovered byte (UINT64_MAX if none).
 */
static int cover_run(struct cover *c, uint64_t *gap)
{
	unsigned k = c->k;
	uint64_t lo[SF_MAX_NDIM], hi[SF_MAX_NDIM];
	/* pieces of region minus box, in row-major order of low corners */
	uint64_t plo[2 * SF_MAX_NDIM][SF_MAX_NDIM], phi[2 * SF_MAX_NDIM][SF_MAX_NDIM];
	int rc;

	*gap = UINT64_MAX;
	for (unsigned d = 0; d < k; d++) {
		lo[d] = 0;
		hi[d] = c->dim[d];
	}
	rc = cover_push(c, lo, hi, 0);
	if (rc < 0)
		return rc;
	while (c->nstack) {
		const uint64_t *r = c->stack + --c->nstack * (2 * k + 1);
		memcpy(lo, r, k * sizeof(*lo));
		memcpy(hi, r + k, k * sizeof(*hi));
		uint64_t j = r[2 * k];
		if (++c->steps > COVER_MAX_STEPS)
			return -SF_ETOOBIG;
		if (cover_flat(c, lo) >= *gap)
			continue;

		const uint64_t *b = NULL;
		for (; j < c->nboxes; j++) {
			if (++c->steps > COVER_MAX_STEPS)
				return -SF_ETOOBIG;
			const uint64_t *x = c->boxes + j * 2 * k;
			if (x[0] >= hi[0])
				break; /* sorted by x[0]: no later box reaches in */
			unsigned d = 0;
			while (d < k && x[d] < hi[d] && lo[d] < x[k + d])
				d++;
			if (d == k) {
				b = x;
				break;
			}
		}
		if (!b) {
			*gap = cover_flat(c, lo);
			continue;
		}

		/* Split: below and above the box in dimension d, with
		 * dimensions < d narrowed to the box. Order of low corners:
		 * below0 < below1 < ... < above1 < above0. */
		unsigned nbelow = 0, nabove = 0;
		uint64_t above_lo[SF_MAX_NDIM][SF_MAX_NDIM], above_hi[SF_MAX_NDIM][SF_MAX_NDIM];
		for (unsigned d = 0; d < k; d++) {
			uint64_t ilo = b[d] > lo[d] ? b[d] : lo[d];
			uint64_t ihi = b[k + d] < hi[d] ? b[k + d] : hi[d];
			if (lo[d] < ilo) {
				memcpy(plo[nbelow], lo, k * sizeof(*lo));
				memcpy(phi[nbelow], hi, k * sizeof(*hi));
				phi[nbelow][d] = ilo;
				nbelow++;
			}
			if (ihi < hi[d]) {
				memcpy(above_lo[nabove], lo, k * sizeof(*lo));
				memcpy(above_hi[nabove], hi, k * sizeof(*hi));
				above_lo[nabove][d] = ihi;
				nabove++;
			}
			lo[d] = ilo;
			hi[d] = ihi;
		}
		/* Push in reverse order so the lowest piece is popped first. */
		for (unsigned p = 0; p < nabove; p++) {
			rc = cover_push(c, above_lo[p], above_hi[p], j + 1);
			if (rc < 0)
				return rc;
		}
		for (unsigned p = nbelow; p-- > 0;) {
			rc = cover_push(c, plo[p], phi[p], j + 1);
			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

/* Elements of the box of shard s of t (inside t: no overflow that
 * matters, see sf_shard_check). */
static uint64_t box_numel(const struct sf_tensor *t, const struct sf_shard *s)
{
	uint64_t n = 1;

	for (unsigned d = 0; d < t->ndim; d++)
		n *= s->len[d];
	return n;
}

/* Is some single shard the whole tensor? (The common replicated case,
 * decided without building boxes.) */
static bool cover_trivial(const struct sf_tensor *t)
{
	for (size_t i = 0; i < t->nshards; i++) {
		const struct sf_shard *s = &t->shards[i];
		if (s->flat ? (s->flat_off == 0 && s->flat_len == t->nbytes)
			    : box_numel(t, s) * sf_dtype_size(t->dtype) == t->nbytes)
			return true;
	}
	return false;
}

static int range_cmp(const void *a, const void *b)
{
	const uint64_t *x = a, *y = b;

	return x[0] < y[0] ? -1 : x[0] > y[0];
}

/*
 * The common sharded case, decided without byte boxes: when every shard
 * is one contiguous byte range of the flattened tensor (a flat range, or
 * a box whole in every dimension but the first: row splits), the shards
 * cover the tensor iff their sorted ranges leave no hole, and the first
 * hole is the first uncovered byte. Returns 1 with that byte in *gap
 * (UINT64_MAX: none), or 0 when some shard is another shape (the general
 * check decides).
 */
static int cover_ranges(const struct sf_tensor *t, uint64_t *gap)
{
	uint64_t local[2 * 64], *r = local, row, cur = 0;
	size_t n = 0;
	bool sorted = true;

	if (t->ndim == 0 || t->shape[0] == 0)
		return 0;
	row = t->nbytes / t->shape[0];
	for (size_t i = 0; i < t->nshards; i++) {
		const struct sf_shard *s = &t->shards[i];

		if (s->flat)
			continue;
		for (unsigned d = 1; d < t->ndim; d++)
			if (s->off[d] != 0 || s->len[d] != t->shape[d])
				return 0;
	}
	if (t->nshards > 64 && !(r = malloc(2 * t->nshards * sizeof(*r))))
		return 0; /* the general check reports ENOMEM its own way */
	for (size_t i = 0; i < t->nshards; i++) {
		const struct sf_shard *s = &t->shards[i];
		uint64_t lo = s->flat ? s->flat_off : s->off[0] * row;
		uint64_t hi = s->flat ? s->flat_off + s->flat_len :
			      (s->off[0] + s->len[0]) * row;

		if (lo == hi)
			continue;
		if (n && lo < r[2 * n - 2])
			sorted = false;
		r[2 * n] = lo;
		r[2 * n + 1] = hi;
		n++;
	}
	if (!sorted)
		qsort(r, n, 2 * sizeof(*r), range_cmp);
	for (size_t i = 0; i < n && cur < t->nbytes; i++) {
		if (r[2 * i] > cur)
			break;
		if (r[2 * i + 1] > cur)
			cur = r[2 * i + 1];
	}
	if (r != local)
		free(r);
	*gap = cur < t->nbytes ? cur : UINT64_MAX;
	return 1;
}

/* Report the first uncovered byte as its element, flat and per dimension.
 * Returns -SF_EGAP. */
static int gap_message(const struct sf_where *w, const struct sf_tensor *t,
		       uint64_t gap, bool cut_short)
{
	char idx[SF_MAX_NDIM * 22 + 4];
	size_t n = 0;
	uint64_t e = gap / sf_dtype_size(t->dtype), rest = e, at[SF_MAX_NDIM];

	for (unsigned d = t->ndim; d-- > 0;) {
		at[d] = rest % t->shape[d];
		rest /= t->shape[d];
	}
	idx[n++] = '[';
	idx[n] = '\0';
	for (unsigned d = 0; d < t->ndim; d++)
		advance(&n, snprintf(idx + n, sizeof(idx) - n, "%s%" PRIu64,
				     d ? ", " : "", at[d]), sizeof(idx));
	snprintf(idx + n, sizeof(idx) - n, "]");
	return sf_fail(w, -SF_EGAP,
		    "gap in coverage: element %" PRIu64 " %s is not covered by any shard%s",
		    e, idx, cut_short ? " (search cut short; an earlier gap may exist)" : "");
}

int sf_cover_check(const struct sf_where *w, const struct sf_tensor *t)
{
	struct cover c = { 0 };
	size_t isz = sf_dtype_size(t->dtype);
	uint64_t lo[SF_MAX_NDIM], hi[SF_MAX_NDIM], prefix[SF_MAX_NDIM] = { 0 };
	uint64_t gap = UINT64_MAX;
	int rc = 0;

	if (t->nbytes == 0 || cover_trivial(t))
		return 0;
	if (cover_ranges(t, &gap))
		return gap == UINT64_MAX ? 0 : gap_message(w, t, gap, false);
	c.k = t->ndim ? t->ndim : 1;
	for (unsigned d = 0; d < c.k; d++)
		c.dim[d] = t->ndim ? t->shape[d] : 1;
	c.dim[c.k - 1] *= isz;
	c.stride[c.k - 1] = 1;
	for (unsigned d = c.k - 1; d-- > 0;)
		c.stride[d] = c.stride[d + 1] * c.dim[d + 1];

	for (size_t i = 0; i < t->nshards; i++) {
		const struct sf_shard *s = &t->shards[i];
		if (s->flat) {
			rc = cover_add_flat(&c, 0, prefix, s->flat_off,
					    s->flat_off + s->flat_len);
		} else {
			for (unsigned d = 0; d < c.k; d++) {
				lo[d] = t->ndim ? s->off[d] : 0;
				hi[d] = t->ndim ? s->off[d] + s->len[d] : 1;
			}
			lo[c.k - 1] *= isz;
			hi[c.k - 1] *= isz;
			rc = cover_add_box(&c, lo, hi);
		}
		if (rc == -SF_ETOOBIG) {
			rc = sf_fail(w, rc, "too many shard pieces to check coverage");
			goto out_free;
		}
		if (rc < 0)
			goto out_free;
	}
	unsigned k = c.k;
	if (c.nboxes > 1)
		qsort_r(c.boxes, c.nboxes, 2 * k * sizeof(uint64_t), cover_cmp, &k);

	rc = cover_run(&c, &gap);
	if (gap != UINT64_MAX)
		rc = gap_message(w, t, gap, rc == -SF_ETOOBIG);
	else if (rc == -SF_ETOOBIG)
		rc = sf_fail(w, rc, "shard arrangement too complex to check coverage (%zu pieces)",
			  c.nboxes);
out_free:
	free(c.boxes);
	free(c.stack);
	return rc;
}

int sf_tensor_check_coverage(const struct sf_tensor *t, char *err,
			     size_t errlen)
{
	struct sf_where w;
	if (!t)
		return -EINVAL;
	sf_where_init(&w, err, errlen);
	sf_where_set(&w, "tensor", t->name, strlen(t->name));
	return sf_cover_check(&w, t);
}


/* --- the overlap rule (foreign formats) --- */

/* Pairs of shards tested to name two that overlap, per tensor. */
#define OVERLAP_MAX_PAIRS (1u << 16)

/* Bytes shard s of t holds of t (its box's or flat range's, not the span
 * a strided payload reaches). */
static uint64_t shard_bytes(const struct sf_tensor *t, const struct sf_shard *s)
{
	return s->flat ? s->flat_len : box_numel(t, s) * sf_dtype_size(t->dtype);
}

uint64_t sf_tensor_shard_bytes(const struct sf_tensor *t)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < t->nshards; i++)
		if (__builtin_add_overflow(sum, shard_bytes(t, &t->shards[i]), &sum))
			return UINT64_MAX;
	return sum;
}

/* Order of shards by box (flat ranges after boxes), then by position:
 * qsort_r over indices into t->shards. */
static int box_cmp(const void *a, const void *b, void *arg)
{
	const struct sf_tensor *t = arg;
	size_t i = *(const size_t *)a, j = *(const size_t *)b;
	const struct sf_shard *x = &t->shards[i], *y = &t->shards[j];

	if (x->flat != y->flat)
		return x->flat ? 1 : -1;
	if (x->flat) {
		if (x->flat_off != y->flat_off)
			return x->flat_off < y->flat_off ? -1 : 1;
		if (x->flat_len != y->flat_len)
			return x->flat_len < y->flat_len ? -1 : 1;
	} else {
		for (unsigned d = 0; d < t->ndim; d++) {
			if (x->off[d] != y->off[d])
				return x->off[d] < y->off[d] ? -1 : 1;
			if (x->len[d] != y->len[d])
				return x->len[d] < y->len[d] ? -1 : 1;
		}
	}
	return i == j ? 0 : i < j ? -1 : 1;
}

static bool same_box(const struct sf_tensor *t, const struct sf_shard *x,
		     const struct sf_shard *y)
{
	if (x->flat != y->flat)
		return false;
	if (x->flat)
		return x->flat_off == y->flat_off && x->flat_len == y->flat_len;
	for (unsigned d = 0; d < t->ndim; d++)
		if (x->off[d] != y->off[d] || x->len[d] != y->len[d])
			return false;
	return true;
}

/* Do x and y name the very same stored bytes (one copy listed twice)? */
static bool same_bytes(const struct sf_tensor *t, const struct sf_shard *x,
		       const struct sf_shard *y)
{
	bool strided = x->strides || y->strides;

	if (strcmp(x->file, y->file) != 0 || x->file_offset != y->file_offset ||
	    x->nbytes != y->nbytes || x->codec != y->codec ||
	    x->stored_len != y->stored_len || x->decoded_off != y->decoded_off)
		return false;
	if (strided && (!x->strides || !y->strides ||
			memcmp(x->strides, y->strides, t->ndim * sizeof(uint64_t)) != 0))
		return false;
	return true;
}

/* Do two shards of t share a byte? Box against box only (a flat range
 * against anything: unknown, false). */
static bool boxes_meet(const struct sf_tensor *t, const struct sf_shard *x,
		       const struct sf_shard *y)
{
	if (x->flat || y->flat)
		return x->flat && y->flat && x->flat_off < y->flat_off + y->flat_len &&
		       y->flat_off < x->flat_off + x->flat_len;
	for (unsigned d = 0; d < t->ndim; d++)
		if (x->off[d] >= y->off[d] + y->len[d] || y->off[d] >= x->off[d] + x->len[d])
			return false;
	return true;
}

/* Refuse t, whose shards hold sum bytes for its nbytes: name the first
 * two shards found to overlap, within OVERLAP_MAX_PAIRS tests. */
static int overlap_message(const struct sf_where *w, const struct sf_tensor *t,
			   uint64_t sum)
{
	uint64_t tests = 0;

	for (size_t i = 0; i < t->nshards; i++)
		for (size_t j = i + 1; j < t->nshards; j++) {
			if (++tests > OVERLAP_MAX_PAIRS)
				goto out_counts;
			if (shard_bytes(t, &t->shards[i]) && shard_bytes(t, &t->shards[j]) &&
			    boxes_meet(t, &t->shards[i], &t->shards[j]))
				return sf_fail(w, -SF_ECONFLICT,
					       "chunks overlap partially (shards %zu and %zu, in %s and %s): which bytes a reader gets there depends on its read order",
					       i, j, t->shards[i].file, t->shards[j].file);
		}
out_counts:
	return sf_fail(w, -SF_ECONFLICT,
		       "chunks overlap partially (%" PRIu64 " bytes stored for %" PRIu64 ")",
		       sum, t->nbytes);
}

int sf_overlap_rule(const struct sf_where *w, struct sf_tensor *t)
{
	size_t n = t->nshards, *ix, k = 0;
	bool *drop;
	uint64_t sum;
	int rc = 0;

	if (n < 2)
		return 0;
	ix = malloc(n * sizeof(*ix));
	drop = calloc(n, sizeof(*drop));
	if (!ix || !drop) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0; i < n; i++)
		ix[i] = i;
	qsort_r(ix, n, sizeof(*ix), box_cmp, t);
	for (size_t g = 0, e; g < n; g = e) {
		const struct sf_shard *kept = &t->shards[ix[g]];

		for (e = g + 1; e < n && same_box(t, kept, &t->shards[ix[e]]); e++) {
			const struct sf_shard *c = &t->shards[ix[e]];

			drop[ix[e]] = true;
			if (same_bytes(t, kept, c))
				continue;
			rc = sf_array_grow(&t->replicas, t->nreplicas, &t->cap_replicas,
					   sizeof(*t->replicas), 4, SF_MAX_SHARDS);
			if (rc == -SF_ETOOBIG)
				rc = sf_fail(w, rc, "more than %u replicas", SF_MAX_SHARDS);
			if (rc < 0)
				goto out_free;
			t->replicas[t->nreplicas].kept = *kept;
			t->replicas[t->nreplicas].copy = *c;
			t->nreplicas++;
		}
	}
	for (size_t i = 0; i < n; i++)
		if (!drop[i])
			t->shards[k++] = t->shards[i];
	t->nshards = k;
	sum = sf_tensor_shard_bytes(t);
	if (sum > t->nbytes)
		rc = overlap_message(w, t, sum);
out_free:
	free(drop);
	free(ix);
	return rc;
}
