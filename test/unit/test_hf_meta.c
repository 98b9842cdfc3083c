/*
 * test_hf_meta.c - the decoders of Hugging Face index JSON and DCP's
 * safetensors __metadata__ (core/formats/sf_hf_meta.h), on the real files
 * of test/fixtures/hf (argv[1]) and on hand-written edge cases: what must
 * be accepted, what must be refused and with which code, lookups.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sf_error.h"
#include "sf_format.h"
#include "sf_formats.h"
#include "sf_hf_meta.h"
#include "sf_io.h"
#include "sf_model.h"
#include "sf_st_header.h"
#include "sf_test.h"

static int index_of(const char *json, struct sf_hf_index **ix, char *err)
{
	return sf_hf_index_parse(json, strlen(json), ix, err, 256);
}

static void test_index_valid(void)
{
	struct sf_hf_index *ix = NULL;
	char err[256];

	CHECK_EQ(index_of("{\"metadata\": {\"total_size\": 12}, \"weight_map\": "
			  "{\"b.w\": \"f2.safetensors\", \"a.w\": \"f1.safetensors\", "
			  "\"c\": \"f1.safetensors\"}}", &ix, err), 0);
	if (!CHECK(ix))
		return;
	CHECK_EQ(ix->n, 3);
	CHECK_EQ(ix->nfiles, 2);
	CHECK(strcmp(ix->names[0], "a.w") == 0 && strcmp(ix->names[2], "c") == 0);
	CHECK(strcmp(ix->ufiles[0], "f1.safetensors") == 0);
	CHECK(strcmp(sf_hf_index_file(ix, "b.w"), "f2.safetensors") == 0);
	CHECK(sf_hf_index_file(ix, "c") == ix->ufiles[0]);
	CHECK(sf_hf_index_file(ix, "zz") == NULL);
	CHECK(ix->metadata && strcmp(ix->metadata, "{\"total_size\":12}") == 0);
	sf_hf_index_free(ix);

	/* no metadata, null metadata, empty map */
	CHECK_EQ(index_of("{\"weight_map\": {}}", &ix, err), 0);
	CHECK(ix && ix->n == 0 && ix->nfiles == 0 && !ix->metadata);
	CHECK(sf_hf_index_file(ix, "a") == NULL);
	sf_hf_index_free(ix);
	CHECK_EQ(index_of("{\"metadata\": null, \"weight_map\": {\"x\": \"y\"}}", &ix, err), 0);
	CHECK(ix && !ix->metadata);
	sf_hf_index_free(ix);
	sf_hf_index_free(NULL);
}

static void test_index_refused(void)
{
	static const char *const bad[] = {
		"",
		"[]",
		"{\"weight_map\": []}",
		"{\"metadata\": {}}",
		"{\"metadata\": 3, \"weight_map\": {}}",
		"{\"weight_map\": {\"a\": 1}}",
		"{\"weight_map\": {\"a\": \"\"}}",
		"{\"weight_map\": {\"\": \"f\"}}",
		"{\"weight_map\": {\"a\": \"f\", \"a\": \"g\"}}",
		"{\"weight_map\": {\"a\": \"f\\u0000g\"}}",
		"{\"weight_map\": {\"a\": \"f\"}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct sf_hf_index *ix = (void *)1;
		char err[256] = "";
		int rc = index_of(bad[i], &ix, err);

		if (!CHECK_EQ(rc, -SF_EFORMAT))
			fprintf(stderr, "  case %zu: %s\n", i, bad[i]);
		CHECK(ix == NULL);
		CHECK(err[0] && !strchr(err, '\n'));
	}
	{
		/* a name longer than SF_MAX_NAME */
		size_t n = SF_MAX_NAME + 1;
		char *j = malloc(n + 64), err[256];
		struct sf_hf_index *ix;

		strcpy(j, "{\"weight_map\": {\"");
		memset(j + strlen(j), 'a', n);
		strcpy(j + 17 + n, "\": \"f\"}}");
		CHECK_EQ(index_of(j, &ix, err), -SF_EFORMAT);
		free(j);
	}
}

static int dcp_of(const char *json, struct sf_hf_dcp **d, char *err)
{
	return sf_hf_dcp_parse(json, strlen(json), d, err, 256);
}

static void test_dcp(void)
{
	struct sf_hf_dcp *d = NULL;
	const struct sf_hf_offsets *o;
	char err[256];

	CHECK_EQ(dcp_of("{\"format\":\"pt\"}", &d, err), 0);
	CHECK(d && !d->has_sharding && d->n == 0 && !d->version[0]);
	CHECK(sf_hf_dcp_find(d, "a") == NULL);
	sf_hf_dcp_free(d);
	CHECK_EQ(dcp_of("{\"DCP_VERSION\":\"1.0\",\"DCP_SHARDING_INFO\":"
			"\"{\\\"w\\\": {\\\"saved_offsets\\\": [19, 0]}, "
			"\\\"b\\\": {\\\"saved_offsets\\\": [5]}, "
			"\\\"s\\\": {\\\"saved_offsets\\\": []}}\"}", &d, err), 0);
	if (CHECK(d)) {
		CHECK(strcmp(d->version, "1.0") == 0 && d->has_sharding && d->n == 3);
		o = sf_hf_dcp_find(d, "w");
		CHECK(o && o->ndim == 2 && o->off[0] == 19 && o->off[1] == 0);
		o = sf_hf_dcp_find(d, "s");
		CHECK(o && o->ndim == 0);
		CHECK(sf_hf_dcp_find(d, "x") == NULL);
	}
	sf_hf_dcp_free(d);
	/* a version that is not digits and dots is not kept */
	CHECK_EQ(dcp_of("{\"DCP_VERSION\":\"1.0; rm -rf\"}", &d, err), 0);
	CHECK(d && !d->version[0]);
	sf_hf_dcp_free(d);
	sf_hf_dcp_free(NULL);

	static const char *const bad[] = {
		"[]",
		"{\"DCP_SHARDING_INFO\": 3}",
		"{\"DCP_SHARDING_INFO\": \"[]\"}",
		"{\"DCP_SHARDING_INFO\": \"{\\\"w\\\": 1}\"}",
		"{\"DCP_SHARDING_INFO\": \"{\\\"w\\\": {}}\"}",
		"{\"DCP_SHARDING_INFO\": \"{\\\"w\\\": {\\\"saved_offsets\\\": [-1]}}\"}",
		"{\"DCP_SHARDING_INFO\": \"{\\\"w\\\": {\\\"saved_offsets\\\": [1.5]}}\"}",
		"{\"DCP_SHARDING_INFO\": \"{\\\"w\\\": {\\\"saved_offsets\\\": "
		"[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}}\"}",
		"{\"DCP_SHARDING_INFO\": \"{\\\"w\\\": 1, \\\"w\\\": 2}\"}",
		"{\"DCP_SHARDING_INFO\": \"{\"}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char e[256] = "";

		d = (void *)1;
		if (!CHECK_EQ(dcp_of(bad[i], &d, e), -SF_EFORMAT))
			fprintf(stderr, "  case %zu: %s\n", i, bad[i]);
		CHECK(d == NULL);
		CHECK(e[0] && !strchr(e, '\n'));
	}
}

/* The real files: every index parses and names files that exist; every
 * safetensors header DCP wrote has offsets for each of its tensors. */
static void test_fixtures(const char *dir)
{
	static const char *const idx[] = {
		"transformers-5.24/llama-st/model.safetensors.index.json",
		"transformers-4.46/llama-st/model.safetensors.index.json",
		"transformers-4.46/llama-bin/pytorch_model.bin.index.json",
		"torch-2.15/dcp-hf-one/model.safetensors.index.json",
		"torch-2.15/dcp-hf-cons2/model.safetensors.index.json",
	};
	static const char *const dist[] = {
		"torch-2.15/dcp-hf-dist2/shard-00001-model-00001-of-00001.safetensors",
		"torch-2.15/dcp-hf-dist2/shard-00002-model-00001-of-00001.safetensors",
	};
	char path[4096], err[256];

	for (size_t i = 0; i < sizeof(idx) / sizeof(idx[0]); i++) {
		struct sf_hf_index *ix = NULL;
		char *text = NULL;
		size_t len = 0;

		snprintf(path, sizeof(path), "%s/%s", dir, idx[i]);
		if (!CHECK_EQ(sf_read_file(path, 1 << 20, &text, &len), 0))
			continue;
		CHECK_EQ(sf_hf_index_parse(text, len, &ix, err, sizeof(err)), 0);
		if (CHECK(ix)) {
			CHECK(ix->n >= 4 && ix->nfiles >= 1 && ix->metadata &&
			      strstr(ix->metadata, "total_size"));
			for (size_t k = 0; k < ix->nfiles; k++) {
				char p2[4096];

				snprintf(p2, sizeof(p2), "%s/%s", dir, idx[i]);
				*strrchr(p2, '/') = '\0';
				strcat(p2, "/");
				strcat(p2, ix->ufiles[k]);
				CHECK(access(p2, R_OK) == 0);
			}
		}
		sf_hf_index_free(ix);
		free(text);
	}
	for (size_t i = 0; i < sizeof(dist) / sizeof(dist[0]); i++) {
		struct sf_st_header *h = NULL;
		struct sf_hf_dcp *d = NULL;
		int fd;

		snprintf(path, sizeof(path), "%s/%s", dir, dist[i]);
		fd = open(path, O_RDONLY);
		if (!CHECK(fd >= 0))
			continue;
		CHECK_EQ(sf_st_header_read(fd, &h, err, sizeof(err)), 0);
		close(fd);
		if (!CHECK(h && h->metadata))
			goto next;
		CHECK_EQ(sf_hf_dcp_parse(h->metadata, strlen(h->metadata), &d, err,
					 sizeof(err)), 0);
		if (!CHECK(d))
			goto next;
		CHECK(strcmp(d->version, "1.0") == 0 && d->has_sharding);
		CHECK_EQ(d->n, h->n);
		for (size_t k = 0; k < h->n; k++) {
			const struct sf_hf_offsets *o = sf_hf_dcp_find(d, h->entries[k].name);

			CHECK(o && o->ndim == h->entries[k].ndim);
		}
next:
		sf_hf_dcp_free(d);
		sf_st_header_destroy(h);
	}
}

/* The adapter's probe on listings (names only): which layouts are
 * complete, which are a save still running, which are not its. A name
 * ending in '/' is a directory. */
struct lname {
	char name[96];
	bool dir;
};

static int cmp_lname(const void *a, const void *b)
{
	return strcmp(((const struct lname *)a)->name, ((const struct lname *)b)->name);
}

static enum sf_probe probe(const char *const *names)
{
	const struct sf_format *f = sf_format_find("hf");
	struct sf_dirlist ls = { 0 };
	struct lname l[8];
	char *v[8];
	bool d[8];

	while (ls.n < 8 && names[ls.n]) {
		size_t n = strlen(names[ls.n]);

		snprintf(l[ls.n].name, sizeof(l[ls.n].name), "%s", names[ls.n]);
		l[ls.n].dir = n && names[ls.n][n - 1] == '/';
		if (l[ls.n].dir)
			l[ls.n].name[n - 1] = '\0';
		ls.n++;
	}
	qsort(l, ls.n, sizeof(*l), cmp_lname);
	for (size_t i = 0; i < ls.n; i++) {
		v[i] = l[i].name;
		d[i] = l[i].dir;
	}
	ls.names = v;
	ls.is_dir = d;
	return f ? f->probe(&ls) : (enum sf_probe)-1;
}

static void test_probe(void)
{
	static const struct {
		enum sf_probe want;
		const char *names[8];
	} cases[] = {
		{ SF_PROBE_YES, { "config.json", "model.safetensors" } },
		{ SF_PROBE_YES, { "pytorch_model.bin" } },
		{ SF_PROBE_YES, { "model.safetensors.index.json", "model-00001-of-00002.safetensors",
				  "model-00002-of-00002.safetensors" } },
		{ SF_PROBE_PARTIAL, { "model.safetensors.index.json", "model-00001-of-00003.safetensors",
				      "model-00003-of-00003.safetensors" } },
		{ SF_PROBE_PARTIAL, { "model-00001-of-00002.safetensors",
				      "model-00002-of-00002.safetensors" } },
		{ SF_PROBE_PARTIAL, { "pytorch_model-00001-of-00002.bin" } },
		{ SF_PROBE_YES, { "pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin",
				  "pytorch_model-00002-of-00002.bin" } },
		/* an index over shards named otherwise: open decides */
		{ SF_PROBE_YES, { "diffusion_pytorch_model.safetensors.index.json", "a.safetensors" } },
		/* a stale shard of an older save beside a complete set */
		{ SF_PROBE_YES, { "model.safetensors.index.json", "model-00001-of-00001.safetensors",
				  "model-00002-of-00003.safetensors" } },
		{ SF_PROBE_YES, { "shard-00001-model-00001-of-00001.safetensors",
				  "shard-00002-model-00001-of-00001.safetensors" } },
		{ SF_PROBE_NO, { "config.json", "tokenizer.json" } },
		{ SF_PROBE_NO, { "model.safetensors/", "x.safetensors" } },
		{ SF_PROBE_NO, { ".metadata", "__0_0.distcp" } },
		{ SF_PROBE_NO, { "model-0001-of-0002.safetensors" } },
		{ SF_PROBE_NO, { NULL } }, /* an empty directory */
		/* transformers' variant (save_pretrained(variant="fp16")) */
		{ SF_PROBE_YES, { "model.safetensors.index.fp16.json",
				  "model.fp16-00001-of-00002.safetensors",
				  "model.fp16-00002-of-00002.safetensors" } },
		{ SF_PROBE_NO, { ".safetensors.index.json" } },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (!CHECK_EQ(probe(cases[i].names), cases[i].want))
			fprintf(stderr, "  probe case %zu\n", i);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: test_hf_meta FIXTURES_HF_DIR\n");
		return 2;
	}
	test_index_valid();
	test_index_refused();
	test_dcp();
	test_probe();
	test_fixtures(argv[1]);
	return sf_test_done("test_hf_meta");
}
