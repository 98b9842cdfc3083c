/*
 * test_pickle_write.c - the pickle writer (core/formats/sf_pickle_write.c)
 * against the reader: every non-tensor entry of an archive deepspeed
 * 0.19.8 wrote, written as a torch.save archive, decodes (sf_ts_doc_open)
 * to a value that writes to the same bytes again; an entry holding a
 * tensor is refused; scalars at every opcode boundary read back equal;
 * hostile values (a cycle, a wide shared graph, a global off the list, a
 * persistent id) are refused within the caps.
 *
 *   test_pickle_write ARCHIVE.pt [OUTDIR]
 * With OUTDIR, each entry's archive is written there as KEY.pt (what
 * test_pickle_write_torch.py compares with torch.load).
 */
#include "sf_test.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "sf_io.h"
#include "sf_pickle.h"
#include "sf_pickle_write.h"
#include "sf_torchsave.h"

/* The names DeepSpeed's archives use (sf_deepspeed.c's list) and those a
 * torch.save pickle names besides tensors. */
static const struct sf_pk_global allow[] = {
	{ "deepspeed.runtime.zero.config", "ZeroStageEnum" },
	{ "deepspeed.runtime.fp16.loss_scaler", "LossScaler" },
	{ "deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler" },
	{ "torch", "float16" },
	{ "torch", "bfloat16" },
	{ "torch", "float32" },
	{ "deepspeed.utils.tensor_fragment", "fragment_address" },
	{ "torch", "Size" },
	{ "collections", "OrderedDict" },
};
#define NALLOW (sizeof(allow) / sizeof(allow[0]))
#define CAP (1u << 20)

static unsigned char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	unsigned char *b;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	b = malloc(n > 0 ? (size_t)n : 1);
	if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
		free(b);
		b = NULL;
	}
	fclose(f);
	*len = (size_t)n;
	return b;
}

/* v written, read back, written again: the same bytes. */
static void round_trip(const char *key, const struct sf_pk *v, const char *outdir)
{
	unsigned char *a = NULL, *b = NULL;
	size_t alen = 0, blen = 0;
	struct sf_ts_doc *doc = NULL;
	struct sf_input in;
	char err[256];
	int rc;

	rc = sf_pkw_torch_save(v, allow, NALLOW, "archive", CAP, &a, &alen,
			       err, sizeof(err));
	if (!CHECK(rc == 0)) {
		fprintf(stderr, "%s: %d %s\n", key, rc, err);
		return;
	}
	in = sf_input_mem(a, alen);
	rc = sf_ts_doc_open(&in, allow, NALLOW, NULL, &doc, err, sizeof(err));
	if (!CHECK(rc == 0)) {
		fprintf(stderr, "%s: read back: %d %s\n", key, rc, err);
		free(a);
		return;
	}
	rc = sf_pkw_torch_save(sf_ts_doc_root(doc), allow, NALLOW, "archive",
			       CAP, &b, &blen, err, sizeof(err));
	CHECK(rc == 0);
	CHECK(alen == blen && memcmp(a, b, alen) == 0);
	if (outdir) {
		char path[1024];
		FILE *f;

		snprintf(path, sizeof(path), "%s/%s.pt", outdir, key);
		f = fopen(path, "wb");
		CHECK(f && fwrite(a, 1, alen, f) == alen);
		if (f)
			fclose(f);
	}
	sf_ts_doc_free(doc);
	free(a);
	free(b);
}

static void fixture(const char *path, const char *outdir)
{
	size_t len = 0, ntried = 0, nrefused = 0;
	unsigned char *buf = slurp(path, &len);
	struct sf_ts_doc *doc = NULL;
	const struct sf_pk *root;
	struct sf_input in;
	char err[256];

	if (!CHECK(buf != NULL))
		return;
	in = sf_input_mem(buf, len);
	if (!CHECK(sf_ts_doc_open(&in, allow, NALLOW, NULL, &doc, err,
				  sizeof(err)) == 0)) {
		fprintf(stderr, "%s: %s\n", path, err);
		free(buf);
		return;
	}
	root = sf_ts_doc_root(doc);
	CHECK(root && root->kind == SF_PK_DICT);
	for (size_t i = 0; root && root->kind == SF_PK_DICT && i < root->u.dict.n; i++) {
		const char *key = sf_pk_str(root->u.dict.k[i]);
		const struct sf_pk *v = root->u.dict.v[i];
		unsigned char *a = NULL;
		size_t alen;
		int rc;

		if (!CHECK(key != NULL))
			continue;
		rc = sf_pkw_torch_save(v, allow, NALLOW, "archive", CAP, &a,
				       &alen, err, sizeof(err));
		free(a);
		if (strcmp(key, "module") == 0) {
			/* the 16-bit weights: tensors */
			CHECK_EQ(rc, -ENOTSUP);
			CHECK(strstr(err, "tensor") != NULL);
		}
		if (rc == -ENOTSUP) {
			nrefused++;
			continue;
		}
		round_trip(key, v, outdir);
		ntried++;
	}
	CHECK(ntried >= 10);
	CHECK(nrefused >= 1);
	sf_ts_doc_free(doc);
	free(buf);
}

/* Scalars at each opcode's edges, through the plain pickle and the
 * reader. */
static void scalars(void)
{
	static const int64_t ints[] = {
		0, 1, 255, 256, 65535, 65536, -1, -128, -129, INT32_MIN,
		INT32_MAX, (int64_t)INT32_MAX + 1, (int64_t)INT32_MIN - 1,
		(int64_t)1 << 40, -((int64_t)1 << 40), INT64_MAX, INT64_MIN,
	};
	static const double floats[] = { 0.0, -0.0, 1.5, -3.25e300, 5e-324 };
	char err[256];

	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
		struct sf_pk v = { .kind = SF_PK_INT, .u.i = ints[i] };
		unsigned char *p = NULL;
		size_t n = 0;
		struct sf_pickle *pk = NULL;
		struct sf_input in;
		int64_t got = 0;

		CHECK(sf_pkw_pickle(&v, NULL, 0, CAP, &p, &n, err, sizeof(err)) == 0);
		in = sf_input_mem(p, n);
		CHECK(sf_pickle_load(&in, NULL, &pk, err, sizeof(err)) == 0);
		CHECK(sf_pk_int(sf_pickle_root(pk), &got) && got == ints[i]);
		sf_pickle_free(pk);
		free(p);
	}
	for (size_t i = 0; i < sizeof(floats) / sizeof(floats[0]); i++) {
		struct sf_pk v = { .kind = SF_PK_FLOAT, .u.f = floats[i] };
		unsigned char *p = NULL;
		size_t n = 0;
		struct sf_pickle *pk = NULL;
		struct sf_input in;
		const struct sf_pk *r;

		CHECK(sf_pkw_pickle(&v, NULL, 0, CAP, &p, &n, err, sizeof(err)) == 0);
		in = sf_input_mem(p, n);
		CHECK(sf_pickle_load(&in, NULL, &pk, err, sizeof(err)) == 0);
		r = sf_pickle_root(pk);
		CHECK(r && r->kind == SF_PK_FLOAT &&
		      memcmp(&r->u.f, &floats[i], sizeof(double)) == 0);
		sf_pickle_free(pk);
		free(p);
	}
	{
		/* a str with a NUL inside, as protocol 2's latin-1 bytes come */
		struct sf_pk v = { .kind = SF_PK_STR,
				   .u.str = { .s = "a\0\xc3\xa9", .len = 4 } };
		unsigned char *p = NULL;
		size_t n = 0;
		struct sf_pickle *pk = NULL;
		struct sf_input in;
		const struct sf_pk *r;

		CHECK(sf_pkw_pickle(&v, NULL, 0, CAP, &p, &n, err, sizeof(err)) == 0);
		in = sf_input_mem(p, n);
		CHECK(sf_pickle_load(&in, NULL, &pk, err, sizeof(err)) == 0);
		r = sf_pickle_root(pk);
		CHECK(r && r->kind == SF_PK_STR && r->u.str.len == 4 &&
		      memcmp(r->u.str.s, "a\0\xc3\xa9", 4) == 0);
		sf_pickle_free(pk);
		free(p);
	}
}

/* Values a hostile pickle could decode to: refused within the caps. */
static void hostile(void)
{
	struct sf_pk self, *selfp = &self, lv[40], *lp[40][2], g, pid, none;
	unsigned char *p = NULL;
	size_t n = 0;
	char err[256];

	/* a list that holds itself (the memo makes such cycles) */
	self = (struct sf_pk){ .kind = SF_PK_LIST, .u.seq = { &selfp, 1 } };
	CHECK_EQ(sf_pkw_pickle(&self, NULL, 0, CAP, &p, &n, err, sizeof(err)),
		 -SF_ETOOBIG);
	CHECK(p == NULL && strstr(err, "deeper") != NULL);
	/* 2^40 references to one None through 40 shared levels: the cap */
	none = (struct sf_pk){ .kind = SF_PK_NONE };
	for (int i = 0; i < 40; i++) {
		struct sf_pk *below = i ? &lv[i - 1] : &none;

		lp[i][0] = lp[i][1] = below;
		lv[i] = (struct sf_pk){ .kind = SF_PK_LIST, .u.seq = { lp[i], 2 } };
	}
	CHECK_EQ(sf_pkw_pickle(&lv[39], NULL, 0, 4096, &p, &n, err, sizeof(err)),
		 -SF_ETOOBIG);
	CHECK(p == NULL);
	CHECK_EQ(sf_pkw_torch_save(&lv[39], NULL, 0, "a", CAP, &p, &n, err,
				   sizeof(err)), -SF_ETOOBIG);
	/* a global the list does not name */
	g = (struct sf_pk){ .kind = SF_PK_GLOBAL,
			    .u.global = { "os", "system" } };
	CHECK_EQ(sf_pkw_pickle(&g, allow, NALLOW, CAP, &p, &n, err, sizeof(err)),
		 -SF_EREFUSED);
	g.u.global.module = "collections\n";
	CHECK_EQ(sf_pkw_pickle(&g, allow, NALLOW, CAP, &p, &n, err, sizeof(err)),
		 -SF_EREFUSED);
	/* a persistent id: a tensor's storage */
	pid = (struct sf_pk){ .kind = SF_PK_PERSID, .u.persid = &none };
	CHECK_EQ(sf_pkw_pickle(&pid, NULL, 0, CAP, &p, &n, err, sizeof(err)),
		 -ENOTSUP);
	/* an archive name that is a path */
	CHECK_EQ(sf_pkw_torch_save(&none, NULL, 0, "../x", CAP, &p, &n, err,
				   sizeof(err)), -EINVAL);
	/* the whole archive counts against the cap */
	CHECK_EQ(sf_pkw_torch_save(&none, NULL, 0, "a", 64, &p, &n, err,
				   sizeof(err)), -SF_ETOOBIG);
	CHECK(sf_pkw_torch_save(&none, NULL, 0, "a", 1024, &p, &n, err,
				sizeof(err)) == 0 && n < 1024);
	free(p);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s ARCHIVE.pt [OUTDIR]\n", argv[0]);
		return 2;
	}
	scalars();
	hostile();
	fixture(argv[1], argc > 2 ? argv[2] : NULL);
	return sf_test_done("test_pickle_write");
}
