/*
 * test_gpu_load.c - the loader end to end: whole files, ranges (packed per
 * file and per range), safetensors per file and per tensor, read-only
 * passes, verify (including that it catches a difference), and errors that
 * must leave the loader usable and its results unchanged.
 *
 * On a real build it needs a CUDA device: without one (or in a stub build)
 * it prints "SKIP: no CUDA device (<reason>)" and exits 77. With --mock it
 * is linked against mock_cudart.c and must never skip; it also injects CUDA
 * faults and checks nothing leaks.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_testfiles.h"
#include "sf_error.h"
#include "sf_gpu.h"

static int failures;
static bool mock;

#define CHECK(cond, ...)                                                     \
	do {                                                                 \
		if (!(cond)) {                                               \
			failures++;                                          \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__,        \
				__LINE__, #cond);                            \
			fprintf(stderr, __VA_ARGS__);                        \
			fputc('\n', stderr);                                 \
		}                                                            \
	} while (0)

/* Provided by mock_cudart.c in the --mock build only. */
long mock_cuda_live(void) __attribute__((weak));

static void verify_all(struct sf_gpu_loader *l, size_t from, const char *what)
{
	uint64_t diff;
	size_t i;
	int rc;

	for (i = from; i < sf_gpu_count(l); i++) {
		rc = sf_gpu_verify(l, sf_gpu_get(l, i), &diff);
		CHECK(rc == 0, "%s: verify %s: %s", what, sf_gpu_get(l, i)->name,
		      sf_gpu_last_error(l));
	}
}

static void test_whole_and_ranges(struct sf_gpu_loader *l, const char *dir)
{
	char a[4096], b[4096];
	const uint64_t asize = 3 * 65536 + 4321, bsize = 100000;
	struct sf_gpu_stats st = { 0 };
	const struct sf_gpu_tensor *t;
	size_t before;
	int rc;

	snprintf(a, sizeof(a), "%s/a.bin", dir);
	snprintf(b, sizeof(b), "%s/b.bin", dir);
	CHECK(gen_random_file(a, asize, 11) == 0, "write a");
	CHECK(gen_random_file(b, bsize, 12) == 0, "write b");

	before = sf_gpu_count(l);
	rc = sf_gpu_load_file(l, a, &st);
	CHECK(rc == 1, "load_file: %d %s", rc, sf_gpu_last_error(l));
	t = sf_gpu_get(l, before);
	CHECK(t && t->nbytes == asize && t->dtype == SF_DT_U8 && t->ndim == 1 &&
	      t->shape[0] == asize, "whole-file result");
	CHECK(st.bytes == asize, "stats bytes %llu", (unsigned long long)st.bytes);
	CHECK(st.chunks == 4, "chunks %llu (64 KiB staging)",
	      (unsigned long long)st.chunks);
	CHECK(st.total_s >= 0 && st.read_busy_s >= 0, "times");
	verify_all(l, before, "whole file");

	struct sf_gpu_range r[] = {
		{ a, 0, 1000, "a.head" },
		{ a, 60000, 65536 * 2, NULL },
		{ a, asize - 17, SF_GPU_TO_EOF, "a.tail" },
		{ b, 5, 0, "b.empty" },
		{ b, 99999, 1, "b.last" },
	};
	const size_t nr = sizeof(r) / sizeof(r[0]);
	enum sf_gpu_alloc modes[] = { SF_GPU_PER_FILE, SF_GPU_PER_TENSOR };
	size_t m, i;

	for (m = 0; m < 2; m++) {
		memset(&st, 0, sizeof(st));
		before = sf_gpu_count(l);
		rc = sf_gpu_load_ranges(l, r, nr, modes[m], &st);
		CHECK(rc == (int)nr, "load_ranges mode %zu: %d %s", m, rc,
		      sf_gpu_last_error(l));
		CHECK(st.bytes == 1000 + 65536 * 2 + 17 + 0 + 1, "range bytes %llu",
		      (unsigned long long)st.bytes);
		for (i = 0; rc == (int)nr && i < nr; i++) {
			t = sf_gpu_get(l, before + i);
			CHECK(t->file_offset == r[i].offset, "range %zu offset", i);
			CHECK(!r[i].name || !strcmp(t->name, r[i].name),
			      "range %zu name %s", i, t->name);
		}
		if (rc != (int)nr)
			continue;
		CHECK(strstr(sf_gpu_get(l, before + 1)->name, "@60000+131072") != NULL,
		      "default name %s", sf_gpu_get(l, before + 1)->name);
		CHECK(sf_gpu_get(l, before + 2)->nbytes == 17, "TO_EOF length");
		verify_all(l, before, "ranges");
	}

	/* read-only pass: same bytes, no results */
	memset(&st, 0, sizeof(st));
	before = sf_gpu_count(l);
	rc = sf_gpu_read_only(l, r, nr, &st);
	CHECK(rc == 0 && sf_gpu_count(l) == before, "read_only: %d %s", rc,
	      sf_gpu_last_error(l));
	CHECK(st.bytes == 1000 + 65536 * 2 + 17 + 1, "read-only bytes");

	/* errors leave the loader and its results as they were */
	struct sf_gpu_range past = { a, asize - 10, 11, "past" };
	struct sf_gpu_range off = { a, asize + 1, SF_GPU_TO_EOF, "off" };
	struct sf_gpu_range missing[] = { { a, 0, 10, "ok" },
					  { "/nonexistent/x", 0, 1, "no" } };

	rc = sf_gpu_load_ranges(l, &past, 1, SF_GPU_PER_FILE, NULL);
	CHECK(rc == -SF_ERANGE, "range past EOF: %d", rc);
	rc = sf_gpu_load_ranges(l, &off, 1, SF_GPU_PER_FILE, NULL);
	CHECK(rc == -SF_ERANGE, "offset past EOF: %d", rc);
	rc = sf_gpu_load_ranges(l, missing, 2, SF_GPU_PER_FILE, NULL);
	CHECK(rc == -ENOENT, "missing file: %d (%s)", rc, sf_gpu_last_error(l));
	CHECK(strstr(sf_gpu_last_error(l), "/nonexistent/x") != NULL,
	      "error names the file: %s", sf_gpu_last_error(l));
	CHECK(sf_gpu_count(l) == before, "failed loads added results");

	/* verify catches a changed byte */
	FILE *f = fopen(a, "r+b");
	uint64_t diff = 0;
	size_t whole = 0;

	for (i = 0; i < sf_gpu_count(l); i++)
		if (!strcmp(sf_gpu_get(l, i)->name, a))
			whole = i;
	CHECK(f && fseek(f, 123457, SEEK_SET) == 0, "seek");
	if (f) {
		int c = fgetc(f);

		fseek(f, 123457, SEEK_SET);
		fputc(c ^ 0x40, f);
		fclose(f);
	}
	rc = sf_gpu_verify(l, sf_gpu_get(l, whole), &diff);
	CHECK(rc == -EBADMSG && diff == 123457, "verify after change: %d at %llu",
	      rc, (unsigned long long)diff);
}

static void test_safetensors(struct sf_gpu_loader *l, const char *dir)
{
	enum sf_gpu_alloc modes[] = { SF_GPU_PER_FILE, SF_GPU_PER_TENSOR };
	const struct sf_gpu_tensor *t;
	char p[4096], bad[4096];
	size_t m, i, k, before;
	int rc;

	snprintf(p, sizeof(p), "%s/m.safetensors", dir);
	CHECK(gen_safetensors(p, 5) == 0, "write safetensors");
	for (m = 0; m < 2; m++) {
		before = sf_gpu_count(l);
		rc = sf_gpu_load_safetensors(l, p, modes[m], NULL);
		CHECK(rc == (int)gen_st_ntensors, "load_safetensors mode %zu: %d %s",
		      m, rc, sf_gpu_last_error(l));
		if (rc != (int)gen_st_ntensors)
			continue;
		/* results come in file order, which is gen_st_tensors order */
		for (i = 0; i < gen_st_ntensors; i++) {
			const struct st_spec *s = &gen_st_tensors[i];
			uint64_t nb = s->itemsize;

			t = sf_gpu_get(l, before + i);
			CHECK(!strcmp(t->name, s->name), "name %s vs %s", t->name,
			      s->name);
			CHECK(t->ndim == s->ndim, "%s ndim", s->name);
			for (k = 0; k < s->ndim; k++) {
				CHECK(t->shape[k] == s->shape[k], "%s shape", s->name);
				nb *= s->shape[k];
			}
			CHECK(t->nbytes == nb, "%s nbytes", s->name);
			CHECK(t->dtype == sf_dtype_from_name(s->dtype, strlen(s->dtype)),
			      "%s dtype", s->name);
		}
		verify_all(l, before, "safetensors");
	}
	snprintf(bad, sizeof(bad), "%s/bad.safetensors", dir);
	CHECK(gen_raw_st(bad, 40, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"", 4) == 0,
	      "write bad");
	before = sf_gpu_count(l);
	rc = sf_gpu_load_safetensors(l, bad, SF_GPU_PER_TENSOR, NULL);
	CHECK(rc == -SF_EMANIFEST, "bad safetensors: %d %s", rc,
	      sf_gpu_last_error(l));
	CHECK(sf_gpu_count(l) == before, "bad safetensors added results");
}

/* Mock only: CUDA failures mid-load are reported and undone. */
static void test_faults(struct sf_gpu_loader *l, const char *dir)
{
	const char *calls[] = { "cudaMemcpyAsync:3", "cudaEventSynchronize:2",
				"cudaMalloc:2", "cudaEventRecord:1" };
	char p[4096];
	size_t i, before;
	long live;
	int rc;

	snprintf(p, sizeof(p), "%s/m.safetensors", dir);
	for (i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
		before = sf_gpu_count(l);
		live = mock_cuda_live();
		setenv("SF_MOCK_CUDA_FAIL", calls[i], 1);
		rc = sf_gpu_load_safetensors(l, p, SF_GPU_PER_TENSOR, NULL);
		unsetenv("SF_MOCK_CUDA_FAIL");
		CHECK(rc == -SF_ECUDA, "%s: rc %d", calls[i], rc);
		CHECK(strncmp(sf_gpu_last_error(l), calls[i],
			      strcspn(calls[i], ":")) == 0,
		      "%s: last error %s", calls[i], sf_gpu_last_error(l));
		CHECK(sf_gpu_count(l) == before, "%s: results added", calls[i]);
		CHECK(mock_cuda_live() == live, "%s: %ld allocations leaked",
		      calls[i], mock_cuda_live() - live);
		/* and the loader still works */
		rc = sf_gpu_load_safetensors(l, p, SF_GPU_PER_FILE, NULL);
		CHECK(rc == (int)gen_st_ntensors, "%s: reload %d %s", calls[i], rc,
		      sf_gpu_last_error(l));
		verify_all(l, before, "after fault");
	}
	printf("ok   injected CUDA faults\n");
}

int main(int argc, char **argv)
{
	struct sf_gpu_opts o = { .device = 0, .staging_bytes = 65536,
				 .depth = 3, .readers = 2 };
	char dir[] = "/tmp/sf_gpu_load.XXXXXX";
	struct sf_gpu_loader *l = NULL;
	char err[256] = "", cmd[128];
	int rc;

	mock = argc > 1 && !strcmp(argv[1], "--mock");
	if (mock) {
		setenv("SF_MOCK_CUDA_NODEV", "1", 1);
		rc = sf_gpu_loader_create(&o, &l, err, sizeof(err));
		CHECK(rc == -SF_ECUDA && !l && !strncmp(err, "no CUDA device: ", 16),
		      "no device: rc %d err %s", rc, err);
		unsetenv("SF_MOCK_CUDA_NODEV");
		o.depth = SF_GPU_MAX_DEPTH + 1;
		rc = sf_gpu_loader_create(&o, &l, err, sizeof(err));
		CHECK(rc == -EINVAL && !l, "depth over the cap: rc %d", rc);
		o.depth = 3;
		setenv("SF_MOCK_CUDA_FAIL", "cudaMallocHost:2", 1);
		rc = sf_gpu_loader_create(&o, &l, err, sizeof(err));
		unsetenv("SF_MOCK_CUDA_FAIL");
		CHECK(rc == -SF_ECUDA && !l && strstr(err, "cudaMallocHost"),
		      "staging failure: rc %d err %s", rc, err);
		CHECK(mock_cuda_live() == 0, "failed create leaked %ld",
		      mock_cuda_live());
	}
	rc = sf_gpu_loader_create(&o, &l, err, sizeof(err));
	if (rc && !mock) {
		printf("SKIP: no CUDA device (%s)\n", err);
		return 77;
	}
	CHECK(rc == 0, "create: %d %s", rc, err);
	if (rc)
		return 1;
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		sf_gpu_loader_destroy(l);
		return 1;
	}
	test_whole_and_ranges(l, dir);
	test_safetensors(l, dir);
	if (mock)
		test_faults(l, dir);
	sf_gpu_loader_destroy(l);
	if (mock)
		CHECK(mock_cuda_live() == 0, "destroy leaked %ld", mock_cuda_live());
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "warning: could not remove %s\n", dir);
	if (failures) {
		fprintf(stderr, "%d failure(s)\n", failures);
		return 1;
	}
	printf("all loader checks passed%s\n", mock ? " (mock CUDA runtime)" : "");
	return 0;
}
