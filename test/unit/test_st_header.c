/*
 * test_st_parse.c - the safetensors header parser accepts well-formed
 * headers with the right entries and rejects malformed ones (bad lengths,
 * unknown dtypes, bad shapes, offsets out of range, holes, overlaps,
 * duplicates). CPU-only: runs on every machine.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_testfiles.h"
#include "sf_error.h"
#include "sf_st_header.h"
#include "sf_views.h"

static int failures;

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

/* Parse json as a header followed by data_len bytes of data. */
static int parse(const char *json, uint64_t data_len, struct sf_st_header **h,
		 char *err, size_t errlen)
{
	uint64_t n = strlen(json);

	err[0] = 0;
	return sf_st_header_parse(json, n, 8 + n + data_len, h, err, errlen);
}

static void expect_reject(const char *what, const char *json, uint64_t data_len,
			  int want)
{
	struct sf_st_header *h = (void *)1;
	char err[256];
	int rc = parse(json, data_len, &h, err, sizeof(err));

	CHECK(rc == want, "%s: rc %d (%s), want %d", what, rc, sf_strerror(rc),
	      want);
	CHECK(h == NULL, "%s: header returned on failure", what);
	CHECK(err[0] != 0, "%s: no reason given", what);
	if (rc == want)
		printf("ok   reject %-28s %s\n", what, err);
}

static void test_valid(void)
{
	struct sf_st_header *h;
	char err[256];
	int rc;

	rc = parse("{\"__metadata__\":{\"k\":\"v\"},"
		   "\"b\":{\"dtype\":\"BF16\",\"shape\":[3,2],\"data_offsets\":[8,20]},"
		   "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		   "\"e\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[20,20]},"
		   "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[20,21]}}",
		   21, &h, err, sizeof(err));
	CHECK(rc == 0, "valid header rejected: %s", err);
	if (rc)
		return;
	CHECK(h->n == 4, "n = %zu", h->n);
	CHECK(!strcmp(h->entries[0].name, "a") && h->entries[0].dtype == SF_DT_F32,
	      "entry 0 is %s", h->entries[0].name);
	CHECK(!strcmp(h->entries[1].name, "b") && h->entries[1].ndim == 2 &&
	      h->entries[1].shape[0] == 3 && h->entries[1].shape[1] == 2 &&
	      h->entries[1].dtype == SF_DT_BF16, "entry 1 wrong");
	CHECK(!strcmp(h->entries[2].name, "e") && h->entries[2].begin == 20 &&
	      h->entries[2].end == 20, "entry 2 wrong");
	CHECK(!strcmp(h->entries[3].name, "s") && h->entries[3].ndim == 0,
	      "entry 3 wrong");
	CHECK(h->data_len == 21, "data_len %llu", (unsigned long long)h->data_len);
	sf_st_header_destroy(h);
	sf_st_header_destroy(NULL);
	printf("ok   valid header\n");
}

static void test_rejects(void)
{
	const char *ok1 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
	char big[512];
	int i, n;

	expect_reject("truncated JSON", "{\"a\":", 0, -SF_EMANIFEST);
	expect_reject("not an object", "[1,2]", 0, -SF_EMANIFEST);
	expect_reject("entry not an object", "{\"a\":5}", 0, -SF_EMANIFEST);
	expect_reject("metadata not an object", "{\"__metadata__\":[1]}", 0,
		      -SF_EMANIFEST);
	expect_reject("missing data_offsets",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, -SF_EMANIFEST);
	expect_reject("unknown dtype",
		      "{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		      8, -SF_EMANIFEST);
	expect_reject("lowercase dtype",
		      "{\"a\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		      8, -SF_EMANIFEST);
	expect_reject("negative dim",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
		      8, -SF_EMANIFEST);
	expect_reject("fractional dim",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}",
		      8, -SF_EMANIFEST);
	expect_reject("shape overflow",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,8]}}",
		      8, -SF_EMANIFEST);
	n = snprintf(big, sizeof(big), "{\"a\":{\"dtype\":\"U8\",\"shape\":[");
	for (i = 0; i < SF_MAX_NDIM + 1; i++)
		n += snprintf(big + n, sizeof(big) - (size_t)n, "%s1", i ? "," : "");
	snprintf(big + n, sizeof(big) - (size_t)n, "],\"data_offsets\":[0,1]}}");
	expect_reject("too many dims", big, 1, -SF_ETOOBIG);
	expect_reject("one offset",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}",
		      8, -SF_EMANIFEST);
	expect_reject("end before begin",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}",
		      8, -SF_EMANIFEST);
	expect_reject("size mismatch",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}",
		      8, -SF_EMANIFEST);
	expect_reject("negative offset",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}",
		      8, -SF_EMANIFEST);
	expect_reject("offsets past the data", ok1, 4, -SF_EMANIFEST);
	expect_reject("does not start at 0",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
		      16, -SF_EMANIFEST);
	expect_reject("hole between tensors",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
		      20, -SF_EMANIFEST);
	expect_reject("overlapping tensors",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
		      12, -SF_EMANIFEST);
	expect_reject("trailing data", ok1, 16, -SF_EMANIFEST);
	expect_reject("duplicate name",
		      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
		      16, -SF_EMANIFEST);
	expect_reject("NUL in a name",
		      "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		      8, -SF_EMANIFEST);
}

static void test_lengths(void)
{
	struct sf_st_header *h;
	char err[256];
	int rc;

	rc = sf_st_header_parse("{}", 1, 100, &h, err, sizeof(err));
	CHECK(rc == -SF_EMANIFEST, "length 1 accepted (%d)", rc);
	rc = sf_st_header_parse("{}", 2, 9, &h, err, sizeof(err));
	CHECK(rc == -SF_EMANIFEST, "length past the file accepted (%d)", rc);
	rc = sf_st_header_parse("{}", (uint64_t)SF_MAX_ST_HEADER + 1,
				(uint64_t)SF_MAX_ST_HEADER + 100, &h, err,
				sizeof(err));
	CHECK(rc == -SF_EMANIFEST, "length over SF_MAX_ST_HEADER accepted (%d)", rc);
	rc = sf_st_header_parse("{}", 2, 10, &h, err, sizeof(err));
	CHECK(rc == 0 && h && h->n == 0, "empty header rejected: %s", err);
	sf_st_header_destroy(h);
	printf("ok   header length bounds\n");
}

/* Files: sf_st_header_read on a generated valid file and bad lengths. */
static void test_files(const char *dir)
{
	struct {
		const char *what;
		uint64_t hdr_len;
		const char *json;
		uint64_t data;
	} bad[] = {
		{ "length 0", 0, "", 16 },
		{ "length past EOF", 1000, "{}", 0 },
		{ "length 2^63", 1ull << 63, "{}", 0 },
		{ "length over the cap", (uint64_t)SF_MAX_ST_HEADER + 8, "{}", 0 },
	};
	struct sf_st_header *h;
	char path[4096], err[256];
	size_t i;
	int fd, rc;

	snprintf(path, sizeof(path), "%s/ok.safetensors", dir);
	CHECK(gen_safetensors(path, 7) == 0, "writing %s", path);
	fd = open(path, O_RDONLY);
	CHECK(fd >= 0, "open %s", path);
	rc = sf_st_header_read(fd, &h, err, sizeof(err));
	CHECK(rc == 0, "generated file rejected: %s", err);
	if (!rc) {
		CHECK(h->n == gen_st_ntensors, "n = %zu", h->n);
		CHECK(h->data_start % 8 == 0, "data_start %llu not aligned",
		      (unsigned long long)h->data_start);
		sf_st_header_destroy(h);
	}
	close(fd);
	snprintf(path, sizeof(path), "%s/short", dir);
	CHECK(gen_random_file(path, 5, 1) == 0, "writing %s", path);
	fd = open(path, O_RDONLY);
	rc = sf_st_header_read(fd, &h, err, sizeof(err));
	CHECK(rc == -SF_EMANIFEST, "5-byte file: rc %d", rc);
	close(fd);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(path, sizeof(path), "%s/bad%zu", dir, i);
		CHECK(gen_raw_st(path, bad[i].hdr_len, bad[i].json, bad[i].data) == 0,
		      "writing %s", path);
		fd = open(path, O_RDONLY);
		h = NULL;
		rc = sf_st_header_read(fd, &h, err, sizeof(err));
		CHECK(rc == -SF_EMANIFEST && !h, "%s: rc %d", bad[i].what, rc);
		close(fd);
		if (rc == -SF_EMANIFEST)
			printf("ok   reject file %-23s %s\n", bad[i].what, err);
	}
}

int main(void)
{
	char dir[] = "/tmp/sf_st_header.XXXXXX";
	char cmd[128];

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	test_valid();
	test_rejects();
	test_lengths();
	test_files(dir);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "warning: could not remove %s\n", dir);
	if (failures) {
		fprintf(stderr, "%d failure(s)\n", failures);
		return 1;
	}
	printf("all safetensors header checks passed\n");
	return 0;
}
