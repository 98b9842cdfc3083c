/*
 * test_box.c - sf_box.h against naive models.
 *
 * The model of a box is element-by-element: a bitmap of the tensor elements
 * it covers (for intersect/contains) and, for the byte maps, an array that
 * gives for every byte of the box's own row-major bytes its byte position in
 * the flattened tensor (and the inverse array over tensor bytes). Expected
 * values come only from these arrays and from sf_box.h's contract, never
 * from core's code. Shapes are small (ndim 0..5, dims 0..7) so the arrays
 * stay tiny and thousands of random cases run in a second or two.
 *
 * Contract points that the header leaves open are not asserted: whether an
 * empty box is "contained" anywhere, how a 0-d box formats, and whether a
 * shape with a zero dimension after an overflowing prefix overflows.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_box.h"
#include "sf_error.h"
#include "sf_test.h"

#define PROG "test_box"
#define MAX_TEST_NDIM 5
#define MAX_TEST_DIM 7

/* ---- random shapes and boxes ---- */

static unsigned rand_shape(uint64_t *shape, unsigned max_ndim, unsigned max_dim)
{
	unsigned ndim = (unsigned)sf_rand_below(max_ndim + 1);

	for (unsigned d = 0; d < ndim; d++)
		shape[d] = sf_rand_below(8) == 0 ? 0 : sf_rand_range(1, max_dim);
	return ndim;
}

static size_t rand_itemsize(void)
{
	static const size_t sizes[] = { 1, 2, 4, 8 };

	return sizes[sf_rand_below(4)];
}

/* A box inside shape; non-empty in every dimension where that is possible,
 * except now and then. */
static void rand_box(struct sf_box *b, unsigned ndim, const uint64_t *shape)
{
	bool allow_empty = sf_rand_below(6) == 0;

	memset(b, 0, sizeof(*b));
	b->ndim = ndim;
	for (unsigned d = 0; d < ndim; d++) {
		if (shape[d] == 0 || allow_empty) {
			b->off[d] = sf_rand_below(shape[d] + 1);
			b->len[d] = sf_rand_below(shape[d] - b->off[d] + 1);
		} else {
			b->off[d] = sf_rand_below(shape[d]);
			b->len[d] = sf_rand_range(1, shape[d] - b->off[d]);
		}
	}
}

static uint64_t numel_of(unsigned ndim, const uint64_t *shape)
{
	uint64_t n = 1;

	for (unsigned d = 0; d < ndim; d++)
		n *= shape[d];
	return n;
}

/* Element bitmap of box b in shape: set[i] for tensor element i. */
static void box_set(unsigned ndim, const uint64_t *shape, const struct sf_box *b,
		    unsigned char *set)
{
	uint64_t n = numel_of(ndim, shape);

	for (uint64_t i = 0; i < n; i++) {
		uint64_t rem = i;
		bool in = true;

		for (unsigned d = ndim; d-- > 0;) {
			uint64_t c = rem % shape[d];

			rem /= shape[d];
			if (c < b->off[d] || c >= b->off[d] + b->len[d])
				in = false;
		}
		set[i] = in;
	}
}

/*
 * The byte map of box b: map[j] = tensor byte of box byte j, for
 * j < box bytes. inv[t] = box byte of tensor byte t, or -1.
 */
static void box_maps(unsigned ndim, const uint64_t *shape, size_t itemsize,
		     const struct sf_box *b, int64_t *map, int64_t *inv)
{
	uint64_t tnbytes = numel_of(ndim, shape) * itemsize;
	uint64_t bnumel = numel_of(ndim, b->len);

	for (uint64_t t = 0; t < tnbytes; t++)
		inv[t] = -1;
	for (uint64_t e = 0; e < bnumel; e++) {
		uint64_t rem = e, tidx = 0, stride = 1;

		for (unsigned d = ndim; d-- > 0;) {
			uint64_t c = rem % b->len[d];

			rem /= b->len[d];
			tidx += (b->off[d] + c) * stride;
			stride *= shape[d];
		}
		for (size_t r = 0; r < itemsize; r++) {
			uint64_t j = e * itemsize + r;
			uint64_t t = tidx * itemsize + r;

			map[j] = (int64_t)t;
			inv[t] = (int64_t)j;
		}
	}
}

/* ---- sf_shape_nbytes ---- */

static void test_shape_nbytes(void)
{
	uint64_t shape[SF_MAX_NDIM + 1] = { 0 }, nb;

	/* Fixed edges. */
	CHECK_EQ(sf_shape_nbytes(0, shape, 4, &nb), 0);
	CHECK_EQ(nb, 4);
	for (unsigned d = 0; d <= SF_MAX_NDIM; d++)
		shape[d] = 1;
	CHECK_EQ(sf_shape_nbytes(SF_MAX_NDIM, shape, 8, &nb), 0);
	CHECK_EQ(nb, 8);
	CHECK_EQ(sf_shape_nbytes(SF_MAX_NDIM + 1, shape, 8, &nb), -SF_ETOOBIG);
	CHECK_EQ(sf_shape_nbytes(100, shape, 8, &nb), -SF_ETOOBIG);

	shape[0] = 1ull << 32;
	shape[1] = 1ull << 32;
	CHECK_EQ(sf_shape_nbytes(2, shape, 1, &nb), -SF_ETOOBIG);
	shape[1] = (1ull << 32) - 1;
	CHECK_EQ(sf_shape_nbytes(2, shape, 1, &nb), 0);
	CHECK(nb == (1ull << 32) * ((1ull << 32) - 1));
	shape[1] = 1ull << 31;
	CHECK_EQ(sf_shape_nbytes(2, shape, 1, &nb), 0);
	CHECK(nb == 1ull << 63);
	CHECK_EQ(sf_shape_nbytes(2, shape, 2, &nb), -SF_ETOOBIG);
	shape[0] = UINT64_MAX;
	CHECK_EQ(sf_shape_nbytes(1, shape, 1, &nb), 0);
	CHECK(nb == UINT64_MAX);
	CHECK_EQ(sf_shape_nbytes(1, shape, 2, &nb), -SF_ETOOBIG);
	/* The itemsize alone pushes it over. */
	shape[0] = (UINT64_MAX / 8) + 1;
	CHECK_EQ(sf_shape_nbytes(1, shape, 8, &nb), -SF_ETOOBIG);
	shape[0] = UINT64_MAX / 8;
	CHECK_EQ(sf_shape_nbytes(1, shape, 8, &nb), 0);
	CHECK(nb == (UINT64_MAX / 8) * 8);
	/* A zero dimension with small others is simply empty. */
	shape[0] = 5;
	shape[1] = 0;
	shape[2] = 7;
	CHECK_EQ(sf_shape_nbytes(3, shape, 4, &nb), 0);
	CHECK_EQ(nb, 0);

	/* Random shapes of random bit widths, exact product in 128 bits. */
	for (int iter = 0; iter < 20000; iter++) {
		unsigned ndim = (unsigned)sf_rand_below(SF_MAX_NDIM + 1);
		size_t itemsize = rand_itemsize();
		unsigned __int128 prod = itemsize;
		bool over = false, ambiguous = false;

		for (unsigned d = 0; d < ndim; d++) {
			unsigned bits = (unsigned)sf_rand_below(ndim <= 2 ? 64 : 24);

			shape[d] = sf_rand() >> (63 - bits);
			if (sf_rand_below(30) == 0)
				shape[d] = 0;
		}
		for (unsigned d = 0; d < ndim; d++) {
			if (shape[d] == 0) {
				ambiguous = over; /* overflowing prefix, then 0 */
				over = false;
				prod = 0;
				break;
			}
			prod *= shape[d];
			if (prod > UINT64_MAX) {
				over = true;
				prod = (unsigned __int128)UINT64_MAX + 1; /* saturate */
			}
		}
		if (ambiguous)
			continue;
		nb = 12345;
		int rc = sf_shape_nbytes(ndim, shape, itemsize, &nb);
		if (over) {
			CHECK_EQ(rc, -SF_ETOOBIG);
		} else {
			CHECK_EQ(rc, 0);
			CHECK(nb == (uint64_t)prod);
		}
	}
}

/* ---- sf_box_full, sf_box_check, sf_box_numel ---- */

static void test_box_check_numel(void)
{
	uint64_t shape[SF_MAX_NDIM];
	struct sf_box b;

	for (int iter = 0; iter < 20000; iter++) {
		unsigned ndim = rand_shape(shape, MAX_TEST_NDIM, MAX_TEST_DIM);

		sf_box_full(&b, ndim, shape);
		CHECK_EQ(b.ndim, ndim);
		for (unsigned d = 0; d < ndim; d++) {
			CHECK_EQ(b.off[d], 0);
			CHECK_EQ(b.len[d], shape[d]);
		}
		CHECK_EQ(sf_box_check(&b, ndim, shape), 0);
		CHECK_EQ(sf_box_numel(&b), numel_of(ndim, shape));

		rand_box(&b, ndim, shape);
		CHECK_EQ(sf_box_check(&b, ndim, shape), 0);
		CHECK_EQ(sf_box_numel(&b), numel_of(ndim, b.len));

		/* Wrong ndim. */
		if (ndim < SF_MAX_NDIM) {
			struct sf_box w = b;

			w.ndim = ndim + 1;
			w.off[ndim] = 0;
			w.len[ndim] = 1;
			CHECK_EQ(sf_box_check(&w, ndim, shape), -SF_ERANGE);
		}
		if (ndim == 0)
			continue;
		unsigned d = (unsigned)sf_rand_below(ndim);
		struct sf_box o = b;

		/* One past the end, by offset or by length. */
		if (sf_rand_below(2))
			o.off[d] = shape[d] - o.len[d] + 1;
		else
			o.len[d] = shape[d] - o.off[d] + 1;
		CHECK_EQ(sf_box_check(&o, ndim, shape), -SF_ERANGE);
		/* off + len wraps around uint64_t. */
		o = b;
		o.off[d] = UINT64_MAX - 1;
		o.len[d] = 3;
		CHECK_EQ(sf_box_check(&o, ndim, shape), -SF_ERANGE);
		o = b;
		o.off[d] = 1;
		o.len[d] = UINT64_MAX;
		CHECK_EQ(sf_box_check(&o, ndim, shape), -SF_ERANGE);
	}
	/* Overflow checks even against a huge shape. */
	shape[0] = UINT64_MAX;
	b.ndim = 1;
	b.off[0] = 10;
	b.len[0] = UINT64_MAX - 5;
	CHECK_EQ(sf_box_check(&b, 1, shape), -SF_ERANGE);
	b.len[0] = UINT64_MAX - 10;
	CHECK_EQ(sf_box_check(&b, 1, shape), 0);
	/* A scalar is one element. */
	b.ndim = 0;
	CHECK_EQ(sf_box_numel(&b), 1);
	CHECK_EQ(sf_box_check(&b, 0, shape), 0);
}

/* ---- sf_box_intersect, sf_box_contains ---- */

static void test_intersect_contains(void)
{
	uint64_t shape[SF_MAX_NDIM];
	unsigned char *sa = malloc(20000), *sb = malloc(20000),
		      *so = malloc(20000);
	unsigned long nonempty = 0, contained = 0;

	if (!sa || !sb || !so) {
		CHECK(!"out of memory");
		goto out_free_sets;
	}
	for (int iter = 0; iter < 20000; iter++) {
		unsigned ndim = rand_shape(shape, MAX_TEST_NDIM, MAX_TEST_DIM);
		uint64_t n = numel_of(ndim, shape);
		struct sf_box a, b, out;
		bool any = false, b_in_a = true, b_empty = true;

		rand_box(&a, ndim, shape);
		rand_box(&b, ndim, shape);
		if (sf_rand_below(8) == 0)
			b = a;  /* equal boxes */
		box_set(ndim, shape, &a, sa);
		box_set(ndim, shape, &b, sb);
		for (uint64_t i = 0; i < n; i++) {
			if (sa[i] && sb[i])
				any = true;
			if (sb[i]) {
				b_empty = false;
				if (!sa[i])
					b_in_a = false;
			}
		}
		memset(&out, 0xa5, sizeof(out));
		bool got = sf_box_intersect(&a, &b, &out);
		if (!CHECK_EQ(got, any))
			continue;
		if (got) {
			nonempty++;
			CHECK_EQ(out.ndim, ndim);
			if (!CHECK_EQ(sf_box_check(&out, ndim, shape), 0))
				continue;
			box_set(ndim, shape, &out, so);
			bool same = true;
			for (uint64_t i = 0; i < n; i++)
				if (so[i] != (sa[i] && sb[i]))
					same = false;
			CHECK(same);
		}
		/* Empty b: whether it is "contained" is not defined. */
		if (!b_empty) {
			CHECK_EQ(sf_box_contains(&a, &b), b_in_a);
			contained += b_in_a;
		}
		CHECK(sf_box_contains(&a, &a) || sf_box_numel(&a) == 0);
	}
	/* The random cases must have exercised both outcomes. */
	CHECK(nonempty > 1000);
	CHECK(contained > 100);
out_free_sets:
	free(sa);
	free(sb);
	free(so);
}

/* ---- sf_box_runs ---- */

struct run {
	uint64_t tensor_off, box_off, len;
};

struct run_list {
	struct run *v;
	size_t n, cap;
	int stop_after;  /* return 42 after this many calls (0: never) */
};

static int collect_run(void *arg, uint64_t tensor_off, uint64_t box_off,
		       uint64_t len)
{
	struct run_list *l = arg;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct run *v = realloc(l->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = (struct run){ tensor_off, box_off, len };
	if (l->stop_after && (int)l->n >= l->stop_after)
		return 42;
	return 0;
}

/* Expected runs of box bytes [off, off+len): maximal segments of map. */
static size_t naive_runs(const int64_t *map, uint64_t off, uint64_t len,
			 struct run *out)
{
	size_t n = 0;

	for (uint64_t j = off; j < off + len; j++) {
		if (n && out[n - 1].box_off + out[n - 1].len == j &&
		    (int64_t)(out[n - 1].tensor_off + out[n - 1].len) == map[j]) {
			out[n - 1].len++;
			continue;
		}
		out[n++] = (struct run){ (uint64_t)map[j], j, 1 };
	}
	return n;
}

/* ---- sf_box_runs and sf_box_locate ---- */

static void test_runs_locate(void)
{
	size_t cap = 7 * 7 * 7 * 7 * 7 * 8;
	int64_t *map = malloc(cap * sizeof(*map));
	int64_t *inv = malloc(cap * sizeof(*inv));
	struct run *want = malloc(cap * sizeof(*want));
	struct run_list got = { 0 };
	uint64_t shape[SF_MAX_NDIM];
	unsigned long multi = 0, misaligned = 0;

	if (!map || !inv || !want) {
		CHECK(!"out of memory");
		goto out_free_maps;
	}
	for (int iter = 0; iter < 6000; iter++) {
		unsigned ndim = rand_shape(shape, MAX_TEST_NDIM, MAX_TEST_DIM);
		size_t itemsize = rand_itemsize();
		uint64_t tnbytes = numel_of(ndim, shape) * itemsize;
		struct sf_box b;

		rand_box(&b, ndim, shape);
		uint64_t bnbytes = sf_box_numel(&b) * itemsize;
		box_maps(ndim, shape, itemsize, &b, map, inv);

		/* Whole box, then random (often unaligned) sub-ranges. */
		for (int r = 0; r < 8; r++) {
			uint64_t off = 0, len = bnbytes;

			if (r > 0) {
				off = sf_rand_below(bnbytes + 1);
				len = sf_rand_below(bnbytes - off + 1);
			}
			if (off % itemsize || len % itemsize)
				misaligned++;
			got.n = 0;
			got.stop_after = 0;
			int rc = sf_box_runs(ndim, shape, itemsize, &b, off, len,
					     collect_run, &got);
			CHECK_EQ(rc, 0);
			size_t nwant = naive_runs(map, off, len, want);
			if (!CHECK_EQ(got.n, nwant))
				continue;
			multi += nwant > 1;
			bool same = true;
			for (size_t i = 0; i < nwant; i++)
				if (got.v[i].tensor_off != want[i].tensor_off ||
				    got.v[i].box_off != want[i].box_off ||
				    got.v[i].len != want[i].len)
					same = false;
			CHECK(same);
			/* A non-zero callback return stops the walk. */
			if (nwant >= 2) {
				got.n = 0;
				got.stop_after = 1;
				rc = sf_box_runs(ndim, shape, itemsize, &b, off,
						 len, collect_run, &got);
				CHECK_EQ(rc, 42);
				CHECK_EQ(got.n, 1);
			}
		}

		/* Every tensor byte against the inverse map. */
		for (uint64_t t = 0; t < tnbytes; t++) {
			uint64_t box_off = UINT64_MAX, run = 0;
			bool in = sf_box_locate(ndim, shape, itemsize, &b, t,
						&box_off, &run);

			if (!CHECK_EQ(in, inv[t] >= 0))
				break;
			if (in) {
				uint64_t want_run = 1;

				while (t + want_run < tnbytes &&
				       inv[t + want_run] == inv[t] + (int64_t)want_run)
					want_run++;
				if (!CHECK_EQ(box_off, inv[t]) ||
				    !CHECK_EQ(run, want_run))
					break;
			} else {
				bool outside = run >= 1;

				for (uint64_t k = 0; k < run && t + k < tnbytes; k++)
					if (inv[t + k] >= 0)
						outside = false;
				if (!CHECK(outside))
					break;
			}
		}
	}
	/* The random cases must have exercised the interesting paths. */
	CHECK(multi > 1000);
	CHECK(misaligned > 1000);
out_free_maps:
	free(got.v);
	free(map);
	free(inv);
	free(want);
}

/* ---- sf_slice_parse, sf_slice_format ---- */

struct slice_case {
	const char *spec;
	int rc;
	uint64_t off[3], len[3];
};

static void test_slice_parse_table(void)
{
	static const uint64_t shape[3] = { 10, 20, 30 };
	static const struct slice_case cases[] = {
		{ ":,:,:", 0, { 0, 0, 0 }, { 10, 20, 30 } },
		{ "1:3,:5,2:", 0, { 1, 0, 2 }, { 2, 5, 28 } },
		{ ":10,:20,:30", 0, { 0, 0, 0 }, { 10, 20, 30 } },
		{ "0:10,0:20,0:30", 0, { 0, 0, 0 }, { 10, 20, 30 } },
		{ "9:10,19:,29:30", 0, { 9, 19, 29 }, { 1, 1, 1 } },
		{ "4:4,:,:", 0, { 4, 0, 0 }, { 0, 20, 30 } },
		{ "10:10,20:,30:", 0, { 10, 20, 30 }, { 0, 0, 0 } },
		{ "3:1,:,:", -SF_ERANGE, { 0 }, { 0 } },
		{ ":11,:,:", -SF_ERANGE, { 0 }, { 0 } },
		{ "11:,:,:", -SF_ERANGE, { 0 }, { 0 } },
		{ ":,:,5:31", -SF_ERANGE, { 0 }, { 0 } },
		{ ":,:,31:", -SF_ERANGE, { 0 }, { 0 } },
		{ ":,:,1000000:", -SF_ERANGE, { 0 }, { 0 } },
		{ "", -SF_ESLICE, { 0 }, { 0 } },
		{ ":,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "1:3", -SF_ESLICE, { 0 }, { 0 } },
		{ ":,:,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ ":,:,:,", -SF_ESLICE, { 0 }, { 0 } },
		{ ",:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ ":,,:", -SF_ESLICE, { 0 }, { 0 } },
		{ " 1:3,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "1 :3,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "1: 3,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "1:3 ,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "1:3,:,:\n", -SF_ESLICE, { 0 }, { 0 } },
		{ "1:3,\t:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "-1:3,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "1:-3,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "+1:3,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "a:3,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "1:3x,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "0x1:3,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "1,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "1:2:3,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "1;3,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "18446744073709551616:,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ ":18446744073709551617,:,:", -SF_ESLICE, { 0 }, { 0 } },
		{ "99999999999999999999999999:,:,:", -SF_ESLICE, { 0 }, { 0 } },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct slice_case *c = &cases[i];
		struct sf_box b;
		int rc = sf_slice_parse(c->spec, strlen(c->spec), 3, shape, &b);

		if (!CHECK_EQ(rc, c->rc)) {
			fprintf(stderr, "  slice \"%s\"\n", c->spec);
			continue;
		}
		if (rc)
			continue;
		bool same = b.ndim == 3;
		for (unsigned d = 0; d < 3; d++)
			if (b.off[d] != c->off[d] || b.len[d] != c->len[d])
				same = false;
		if (!CHECK(same))
			fprintf(stderr, "  slice \"%s\"\n", c->spec);
	}

	/* The spec is `len` bytes, not NUL-terminated: what follows is
	 * ignored. */
	{
		const char text[] = "1:3,:,:7@garbage";
		struct sf_box b;

		CHECK_EQ(sf_slice_parse(text, 7, 3, shape, &b), 0);
		CHECK(b.off[0] == 1 && b.len[0] == 2 && b.len[2] == 30);
		CHECK_EQ(sf_slice_parse(text, 8, 3, shape, &b), 0);
		CHECK(b.off[2] == 0 && b.len[2] == 7);
		CHECK_EQ(sf_slice_parse(text, 9, 3, shape, &b), -SF_ESLICE);
	}
	/* One dimension. */
	{
		uint64_t s1 = 5;
		struct sf_box b;

		CHECK_EQ(sf_slice_parse("2:5", 3, 1, &s1, &b), 0);
		CHECK(b.ndim == 1 && b.off[0] == 2 && b.len[0] == 3);
		CHECK_EQ(sf_slice_parse(":", 1, 1, &s1, &b), 0);
		CHECK(b.ndim == 1 && b.off[0] == 0 && b.len[0] == 5);
		CHECK_EQ(sf_slice_parse("", 0, 1, &s1, &b), -SF_ESLICE);
		CHECK_EQ(sf_slice_parse("::", 2, 1, &s1, &b), -SF_ESLICE);
	}
}

static void test_slice_roundtrip(void)
{
	uint64_t shape[SF_MAX_NDIM];
	char buf[SF_MAX_NDIM * 42 + 1], want[SF_MAX_NDIM * 42 + 1];

	for (int iter = 0; iter < 20000; iter++) {
		unsigned ndim = 1 + (unsigned)sf_rand_below(SF_MAX_NDIM);
		struct sf_box b, p;

		for (unsigned d = 0; d < ndim; d++) {
			unsigned bits = (unsigned)sf_rand_below(64);

			shape[d] = sf_rand() >> (63 - bits);
		}
		rand_box(&b, ndim, shape);
		/* The expected text, straight from the header's "S:E,S:E". */
		size_t wl = 0;
		for (unsigned d = 0; d < ndim; d++)
			wl += (size_t)snprintf(want + wl, sizeof(want) - wl,
					       "%s%llu:%llu", d ? "," : "",
					       (unsigned long long)b.off[d],
					       (unsigned long long)(b.off[d] + b.len[d]));
		int n = sf_slice_format(&b, buf, sizeof(buf));
		if (!CHECK_EQ(n, wl) || !CHECK(strcmp(buf, want) == 0)) {
			fprintf(stderr, "  got \"%s\" want \"%s\"\n", buf, want);
			continue;
		}
		CHECK_EQ(sf_slice_parse(buf, (size_t)n, ndim, shape, &p), 0);
		bool same = p.ndim == ndim;
		for (unsigned d = 0; d < ndim; d++)
			if (p.off[d] != b.off[d] || p.len[d] != b.len[d])
				same = false;
		CHECK(same);

		/* Truncation: like snprintf, NUL-terminated, full length. */
		size_t small = sf_rand_below(wl + 1);
		char tiny[SF_MAX_NDIM * 42 + 1];
		memset(tiny, 'Z', sizeof(tiny));
		if (small > 0) {
			CHECK_EQ(sf_slice_format(&b, tiny, small), wl);
			CHECK_EQ(strlen(tiny), small - 1);
			CHECK(strncmp(tiny, want, small - 1) == 0);
			CHECK_EQ(tiny[small], 'Z');
		}
	}
}

int main(void)
{
	sf_test_seed(PROG, 20240601);
	test_shape_nbytes();
	test_box_check_numel();
	test_intersect_contains();
	test_runs_locate();
	test_slice_parse_table();
	test_slice_roundtrip();
	return sf_test_done(PROG);
}
