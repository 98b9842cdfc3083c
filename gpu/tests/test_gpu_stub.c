/*
 * test_gpu_stub.c - the no-CUDA build: every sf_gpu.h entry point returns
 * -SF_ENOCUDA, creates nothing, and says shardfs was built without CUDA.
 */
#include <stdio.h>
#include <string.h>

#include "sf_error.h"
#include "sf_gpu.h"

static int failures;

#define CHECK(cond, what)                                                    \
	do {                                                                 \
		if (!(cond)) {                                               \
			failures++;                                          \
			fprintf(stderr, "FAIL %s: %s\n", what, #cond);       \
		} else {                                                     \
			printf("ok   %s\n", what);                           \
		}                                                            \
	} while (0)

int main(void)
{
	struct sf_gpu_loader *l = (void *)&failures; /* must be reset */
	struct sf_gpu_range r = { "/dev/null", 0, SF_GPU_TO_EOF, NULL };
	struct sf_gpu_tensor t = { 0 };
	struct sf_gpu_stats st = { 0 };
	uint64_t diff = 0;
	char err[128] = "";
	int rc;

	rc = sf_gpu_loader_create(NULL, &l, err, sizeof(err));
	CHECK(rc == -SF_ENOCUDA, "create returns -SF_ENOCUDA");
	CHECK(l == NULL, "create leaves no handle");
	CHECK(strstr(err, "built without CUDA") != NULL, "create names the reason");
	CHECK(strstr(sf_gpu_last_error(NULL), "built without CUDA") != NULL,
	      "last_error names the reason");
	CHECK(sf_gpu_load_ranges(NULL, &r, 1, SF_GPU_PER_FILE, &st) == -SF_ENOCUDA,
	      "load_ranges");
	CHECK(sf_gpu_load_file(NULL, "/dev/null", &st) == -SF_ENOCUDA, "load_file");
	CHECK(sf_gpu_load_safetensors(NULL, "/dev/null", SF_GPU_PER_TENSOR, &st) ==
	      -SF_ENOCUDA, "load_safetensors");
	CHECK(sf_gpu_read_only(NULL, &r, 1, &st) == -SF_ENOCUDA, "read_only");
	CHECK(sf_gpu_verify(NULL, &t, &diff) == -SF_ENOCUDA, "verify");
	CHECK(sf_gpu_count(NULL) == 0, "count is 0");
	CHECK(sf_gpu_get(NULL, 0) == NULL, "get is NULL");
	CHECK(st.bytes == 0 && st.chunks == 0, "stats untouched");
	sf_gpu_loader_destroy(NULL);
	CHECK(strstr(sf_strerror(-SF_ENOCUDA), "CUDA") != NULL,
	      "sf_strerror names SF_ENOCUDA");
	if (failures) {
		fprintf(stderr, "%d failure(s)\n", failures);
		return 1;
	}
	return 0;
}
