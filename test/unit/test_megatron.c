/*
 * test_megatron.c - the Megatron-Core adapter's decoders (sf_megatron.h)
 * against naive models.
 *
 * sf_mcore_flat_boxes: for random blocks (1..5 axes, sides 1..5, at a
 * random origin) and EVERY flat range [start, start + len) of the block,
 * the boxes, walked each in its own row-major order one after the other,
 * must visit exactly the block elements start, start + 1, ... in order
 * (element coordinates computed naively from the flat index), lie inside
 * the block, number at most 2n - 1, and have no empty axis. Ranges that
 * are empty or leave the block, n = 0 and a block whose size overflows
 * must fail.
 *
 * megatron-core 0.17 names (with FIXTURES, test/fixtures, as argv[1]):
 * the committed 0.17.1 checkpoints opened by the Megatron adapter against
 * the naive model of the same directory opened as plain DCP: every
 * `optimizer.distributed.X.STATE` bucket of DCP is `optimizer/STATE/X`
 * with the same shards, no `_w`/`_v` key remains, and each joined KEY is
 * KEY_w's shards as they are plus KEY_v's moved by KEY_w's rows on axis 0
 * (same files and offsets), with the shape of both; the other tensors
 * are DCP's unchanged.
 *
 * sf_mcore_config_parse: the metadata.json megatron-core 0.16.1 wrote,
 * byte for byte, and variants: version absent (1), other backends
 * (zarr), and every way to be no Megatron config (foreign: not JSON, not
 * an object, no sharded_backend) or a broken one (not foreign: wrong
 * types, bad names, versions out of range), over the size cap.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "sf_dcp.h"
#include "sf_error.h"
#include "sf_format.h"
#include "sf_megatron.h"
#include "sf_model.h"
#include "sf_test.h"

#define PROG "test_megatron"

/* ---- flat ranges as boxes ---- */

/* Block coordinates of flat element f of a block of shape blk (n axes). */
static void coords_of(unsigned n, const uint64_t *blk, uint64_t f, uint64_t *c)
{
	for (unsigned i = n; i-- > 0;) {
		c[i] = f % blk[i];
		f /= blk[i];
	}
}

/* Walk box b in row-major order, checking each element is the next flat
 * element *f of the block (origin org). false on the first mismatch. */
static bool walk_box(unsigned n, const uint64_t *org, const uint64_t *blk,
		     const struct sf_box *b, uint64_t *f)
{
	uint64_t idx[SF_MAX_NDIM] = { 0 }, want[SF_MAX_NDIM];
	uint64_t numel = 1;

	for (unsigned i = 0; i < n; i++)
		numel *= b->len[i];
	for (uint64_t k = 0; k < numel; k++) {
		coords_of(n, blk, *f, want);
		for (unsigned i = 0; i < n; i++)
			if (b->off[i] + idx[i] != org[i] + want[i])
				return false;
		(*f)++;
		for (unsigned i = n; i-- > 0;) { /* next index, row-major */
			if (++idx[i] < b->len[i])
				break;
			idx[i] = 0;
		}
	}
	return true;
}

static void test_flat_boxes_block(unsigned n, const uint64_t *org,
				  const uint64_t *blk)
{
	struct sf_box out[SF_MCORE_MAX_BOXES(SF_MAX_NDIM)];
	uint64_t total = 1;

	for (unsigned i = 0; i < n; i++)
		total *= blk[i];
	for (uint64_t start = 0; start < total; start++) {
		for (uint64_t len = 1; start + len <= total; len++) {
			size_t nb = 99;
			uint64_t f = start;
			bool ok = true;
			int rc = sf_mcore_flat_boxes(n, org, blk, start, len, out, &nb);

			if (!CHECK_EQ(rc, 0))
				return;
			ok = CHECK(nb >= 1 && nb <= SF_MCORE_MAX_BOXES(n));
			for (size_t k = 0; k < nb && ok; k++) {
				ok = CHECK_EQ(out[k].ndim, n);
				for (unsigned i = 0; i < n && ok; i++)
					ok = CHECK(out[k].len[i] >= 1 &&
						   out[k].off[i] >= org[i] &&
						   out[k].off[i] + out[k].len[i] <= org[i] + blk[i]);
				if (ok)
					ok = CHECK(walk_box(n, org, blk, &out[k], &f));
			}
			if (ok)
				ok = CHECK_EQ(f, start + len);
			if (!ok) {
				fprintf(stderr, "  n %u start %llu len %llu\n", n,
					(unsigned long long)start, (unsigned long long)len);
				return;
			}
		}
	}
}

static void test_flat_boxes(void)
{
	struct sf_box out[SF_MCORE_MAX_BOXES(SF_MAX_NDIM)];
	uint64_t org[SF_MAX_NDIM], blk[SF_MAX_NDIM];
	size_t nb;

	/* the whole block is one box; a range of one element is one box */
	blk[0] = 3, blk[1] = 4;
	org[0] = 6, org[1] = 8;
	CHECK_EQ(sf_mcore_flat_boxes(2, org, blk, 0, 12, out, &nb), 0);
	CHECK(nb == 1 && out[0].off[0] == 6 && out[0].len[0] == 3 &&
	      out[0].off[1] == 8 && out[0].len[1] == 4);
	CHECK_EQ(sf_mcore_flat_boxes(2, org, blk, 5, 1, out, &nb), 0);
	CHECK(nb == 1 && out[0].off[0] == 7 && out[0].len[0] == 1 &&
	      out[0].off[1] == 9 && out[0].len[1] == 1);
	/* [1, 11): a row's tail, a whole row, a row's head */
	CHECK_EQ(sf_mcore_flat_boxes(2, org, blk, 1, 10, out, &nb), 0);
	CHECK_EQ(nb, 3);

	for (int r = 0; r < 300; r++) {
		unsigned n = (unsigned)sf_rand_range(1, 5);

		for (unsigned i = 0; i < n; i++) {
			blk[i] = sf_rand_range(1, n > 3 ? 3 : 5);
			org[i] = sf_rand_below(4) * blk[i];
		}
		test_flat_boxes_block(n, org, blk);
	}

	/* refused: empty, past the end, no axes, overflow */
	blk[0] = 3, blk[1] = 4;
	org[0] = org[1] = 0;
	CHECK_EQ(sf_mcore_flat_boxes(2, org, blk, 0, 0, out, &nb), -SF_ERANGE);
	CHECK_EQ(sf_mcore_flat_boxes(2, org, blk, 11, 2, out, &nb), -SF_ERANGE);
	CHECK_EQ(sf_mcore_flat_boxes(2, org, blk, 12, 1, out, &nb), -SF_ERANGE);
	CHECK_EQ(sf_mcore_flat_boxes(2, org, blk, UINT64_MAX, 2, out, &nb), -SF_ERANGE);
	CHECK_EQ(sf_mcore_flat_boxes(0, org, blk, 0, 1, out, &nb), -SF_ERANGE);
	blk[0] = blk[1] = 1ull << 33;
	CHECK_EQ(sf_mcore_flat_boxes(2, org, blk, 0, 1, out, &nb), -SF_ETOOBIG);
}

/* ---- metadata.json ---- */

static int parse(const char *text, struct sf_mcore_config *c, bool *foreign,
		 char *err, size_t errlen)
{
	memset(c, 0x5a, sizeof(*c));
	*foreign = !*foreign; /* must be set either way */
	err[0] = '\0';
	return sf_mcore_config_parse(text, strlen(text), c, foreign, err, errlen);
}

static void test_config(void)
{
	/* as megatron-core 0.16.1 wrote it (test/fixtures/megatron/) */
	static const char real[] =
		"{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1, "
		"\"common_backend\": \"torch\", \"common_backend_version\": 1}";
	static const char *const foreign[] = {
		"", "not json", "[1, 2]", "\"torch_dist\"", "{}", "{\"step\": 5}",
		"{\"sharded_backend\": \"torch_dist\"", "null",
	};
	static const char *const broken[] = {
		"{\"sharded_backend\": 5}",
		"{\"sharded_backend\": null}",
		"{\"sharded_backend\": \"\"}",
		"{\"sharded_backend\": \"torch dist\"}",
		"{\"sharded_backend\": \"a/b\"}",
		"{\"sharded_backend\": \"tor\\nch\"}",
		"{\"sharded_backend\": \"0123456789012345678901234567890123\"}",
		"{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": \"1\"}",
		"{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": -1}",
		"{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1.5}",
		"{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 4294967296}",
		"{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": null}",
	};
	static const char nul[] = "{\"sharded_backend\": \"t\0\"}";
	struct sf_mcore_config c;
	bool fgn = false;
	char err[256];
	static char big[SF_MCORE_CONFIG_MAX + 2];

	CHECK_EQ(parse(real, &c, &fgn, err, sizeof(err)), 0);
	CHECK(strcmp(c.backend, "torch_dist") == 0);
	CHECK_EQ(c.version, 1);
	CHECK(!fgn);
	CHECK_EQ(parse("{\"sharded_backend\": \"zarr\", \"sharded_backend_version\": 7}",
		       &c, &fgn, err, sizeof(err)), 0);
	CHECK(strcmp(c.backend, "zarr") == 0 && c.version == 7);
	CHECK_EQ(parse("{\"sharded_backend\": \"torch_dist\"}", &c, &fgn, err,
		       sizeof(err)), 0);
	CHECK_EQ(c.version, 1); /* megatron's default */
	/* repeated keys: the last, as Python's json keeps it */
	CHECK_EQ(parse("{\"sharded_backend\": \"zarr\", \"sharded_backend\": \"torch_dist\"}",
		       &c, &fgn, err, sizeof(err)), 0);
	CHECK(strcmp(c.backend, "torch_dist") == 0);
	for (size_t i = 0; i < sizeof(foreign) / sizeof(foreign[0]); i++) {
		fgn = false;
		CHECK_EQ(parse(foreign[i], &c, &fgn, err, sizeof(err)), -SF_EFORMAT);
		CHECK(fgn);
		CHECK(err[0] != '\0' && !strchr(err, '\n'));
	}
	for (size_t i = 0; i < sizeof(broken) / sizeof(broken[0]); i++) {
		fgn = true;
		if (!CHECK_EQ(parse(broken[i], &c, &fgn, err, sizeof(err)), -SF_EFORMAT))
			fprintf(stderr, "  accepted %s\n", broken[i]);
		CHECK(!fgn);
		CHECK(err[0] != '\0' && !strchr(err, '\n'));
	}
	/* NUL inside the text: not JSON */
	fgn = false;
	CHECK_EQ(sf_mcore_config_parse(nul, sizeof(nul) - 1, &c, &fgn, err,
				       sizeof(err)), -SF_EFORMAT);
	/* over the cap, whatever it holds */
	memset(big, ' ', sizeof(big));
	memcpy(big, real, sizeof(real) - 1);
	fgn = false;
	CHECK_EQ(sf_mcore_config_parse(big, SF_MCORE_CONFIG_MAX + 1, &c, &fgn, err,
				       sizeof(err)), -SF_ETOOBIG);
	CHECK(fgn);
	CHECK_EQ(sf_mcore_config_parse(big, SF_MCORE_CONFIG_MAX, &c, &fgn, err,
				       sizeof(err)), 0);
	/* no room for a reason: still the code */
	CHECK_EQ(sf_mcore_config_parse("x", 1, &c, &fgn, NULL, 0), -SF_EFORMAT);
}

/* ---- megatron-core 0.17 names against plain DCP ---- */

static int open_with(const struct sf_format *f, const char *dir,
		     struct sf_format_result *res)
{
	struct sf_cdir cd = { .dir = dir, .name = "ck", .ref = { .dir = dir, .name = "ck" } };
	char err[512] = "";
	int rc;

	cd.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (!CHECK(cd.dirfd >= 0))
		return -errno;
	rc = f->open(&cd, res, err, sizeof(err));
	if (rc)
		fprintf(stderr, "  %s: %s: %s\n", f->name, dir, err);
	close(cd.dirfd);
	return rc;
}

/* Does t hold a shard equal to s with axis 0 moved by shift? */
static bool has_shard(const struct sf_tensor *t, const struct sf_shard *s,
		      unsigned ndim, uint64_t shift)
{
	for (size_t i = 0; i < t->nshards; i++) {
		const struct sf_shard *x = &t->shards[i];
		bool same = strcmp(x->file, s->file) == 0 &&
			    x->file_offset == s->file_offset && x->nbytes == s->nbytes &&
			    !x->flat && !s->flat;

		for (unsigned d = 0; same && d < ndim; d++)
			same = x->off[d] == s->off[d] + (d == 0 ? shift : 0) &&
			       x->len[d] == s->len[d];
		if (same)
			return true;
	}
	return false;
}

static void check_017(const char *dir, unsigned *nbuckets, unsigned *npairs)
{
	struct sf_format_result mc = { 0 }, dcp = { 0 };
	size_t shown = 0;

	if (!CHECK_EQ(open_with(&sf_format_megatron, dir, &mc), 0) ||
	    !CHECK_EQ(open_with(&sf_format_dcp, dir, &dcp), 0))
		goto out_clear;
	for (size_t i = 0; i < dcp.model->ntensors; i++) {
		const struct sf_tensor *t = &dcp.model->tensors[i], *m;
		const char *name = t->name, *st;
		size_t len = strlen(name);
		char want[1024];

		if (strncmp(name, "optimizer.distributed.", 22) == 0 &&
		    (st = strrchr(name, '.')) != NULL) {
			snprintf(want, sizeof(want), "optimizer/%s/%.*s", st + 1,
				 (int)(st - name - 22), name + 22);
			(*nbuckets)++;
		} else if (len > 2 && (strcmp(name + len - 2, "_w") == 0 ||
				       strcmp(name + len - 2, "_v") == 0)) {
			const struct sf_tensor *w;
			uint64_t shift = 0;

			snprintf(want, sizeof(want), "%.*s", (int)(len - 2), name);
			m = sf_model_find(mc.model, want);
			if (!CHECK(m != NULL) || !CHECK(sf_model_find(mc.model, name) == NULL))
				continue;
			if (name[len - 1] == 'v') {
				char wn[sizeof(want) + 2];

				snprintf(wn, sizeof(wn), "%s_w", want);
				w = sf_model_find(dcp.model, wn);
				if (!CHECK(w != NULL))
					continue;
				shift = w->shape[0];
				CHECK_EQ(m->shape[0], w->shape[0] + t->shape[0]);
				(*npairs)++;
			}
			CHECK_EQ(m->dtype, t->dtype);
			CHECK_EQ(m->ndim, t->ndim);
			for (unsigned d = 1; d < t->ndim; d++)
				CHECK_EQ(m->shape[d], t->shape[d]);
			for (size_t k = 0; k < t->nshards; k++)
				CHECK(has_shard(m, &t->shards[k], t->ndim, shift));
			continue;
		} else {
			snprintf(want, sizeof(want), "%s", name);
		}
		m = sf_model_find(mc.model, want);
		if (!CHECK(m != NULL)) {
			fprintf(stderr, "  %s: %s not shown as %s\n", dir, name, want);
			continue;
		}
		shown++;
		CHECK_EQ(m->dtype, t->dtype);
		CHECK_EQ(m->ndim, t->ndim);
		CHECK_EQ(m->nshards, t->nshards);
		for (unsigned d = 0; d < t->ndim; d++)
			CHECK_EQ(m->shape[d], t->shape[d]);
		for (size_t k = 0; k < t->nshards; k++)
			CHECK(has_shard(m, &t->shards[k], t->ndim, 0));
	}
	/* nothing else: DCP's count less one per joined pair */
	CHECK_EQ(mc.model->ntensors + *npairs, dcp.model->ntensors);
	CHECK(shown > 0);
out_clear:
	sf_format_result_clear(&mc);
	sf_format_result_clear(&dcp);
}

static void test_017(const char *fixtures)
{
	char dir[1024];
	unsigned nb = 0, np = 0;

	snprintf(dir, sizeof(dir), "%s/megatron-0.17/mcore-0.17.1/gpt_tp2dp2", fixtures);
	check_017(dir, &nb, &np);
	CHECK_EQ(nb, 6u); /* 2 DP groups x param, exp_avg, exp_avg_sq */
	CHECK_EQ(np, 0u);
	nb = np = 0;
	snprintf(dir, sizeof(dir), "%s/megatron-0.17/mcore-0.17.1/gpt_tp2dp2_singleton",
		 fixtures);
	check_017(dir, &nb, &np);
	CHECK_EQ(nb, 6u);
	CHECK_EQ(np, 4u); /* fc1 weight and bias of 2 layers */
}

int main(int argc, char **argv)
{
	sf_test_seed(PROG, 13);
	test_flat_boxes();
	test_config();
	if (argc > 1)
		test_017(argv[1]);
	else
		fprintf(stderr, PROG ": no FIXTURES argument: the 0.17 names not checked\n");
	return sf_test_done(PROG);
}
