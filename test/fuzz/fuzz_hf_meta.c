/*
 * fuzz_hf_meta.c - libFuzzer target for the JSON decoders of Hugging Face
 * weights (core/formats/sf_hf_meta.h).
 *
 * Input: byte 0 picks the decoder ('d': a safetensors __metadata__ for
 * DCP's keys; anything else: an index), the rest is the JSON text (seeds:
 * the indexes and __metadata__ of test/fixtures/hf). For any input the
 * decoder either fails with -SF_EFORMAT, -SF_ETOOBIG or -ENOMEM, a
 * one-line message (but for -ENOMEM) and no result, or gives a result
 * whose every invariant holds: an index's names sorted, unique, 1 to
 * SF_MAX_NAME bytes, each with a file that is one of ufiles (sorted,
 * unique), each found again by sf_hf_index_file; DCP offsets sorted by
 * unique name, at most SF_MAX_NDIM each, each found by sf_hf_dcp_find,
 * a version of digits and dots. Any violation aborts.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_hf_meta.h"
#include "sf_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_hf_meta";

static void check_code(int rc, const char *err, size_t errlen)
{
	if (rc != -ENOMEM && rc != -SF_EFORMAT && rc != -SF_ETOOBIG)
		fuzz_die("unexpected error code", sf_strerror(rc));
	if (rc != -ENOMEM)
		fuzz_check_message(err, errlen);
}

static void check_index(const struct sf_hf_index *ix)
{
	for (size_t i = 0; i < ix->nfiles; i++) {
		if (!ix->ufiles[i] || !ix->ufiles[i][0])
			fuzz_die("empty file name", NULL);
		if (i && strcmp(ix->ufiles[i - 1], ix->ufiles[i]) >= 0)
			fuzz_die("files not sorted and unique", ix->ufiles[i]);
	}
	for (size_t i = 0; i < ix->n; i++) {
		size_t len = strlen(ix->names[i]), k;

		if (len == 0 || len > SF_MAX_NAME)
			fuzz_die("name length", NULL);
		if (i && strcmp(ix->names[i - 1], ix->names[i]) >= 0)
			fuzz_die("names not sorted and unique", ix->names[i]);
		for (k = 0; k < ix->nfiles && ix->files[i] != ix->ufiles[k]; k++)
			;
		if (k == ix->nfiles)
			fuzz_die("a name's file is not one of ufiles", ix->names[i]);
		if (sf_hf_index_file(ix, ix->names[i]) != ix->files[i])
			fuzz_die("lookup misses a name", ix->names[i]);
	}
	if (ix->n == 0 && ix->nfiles != 0)
		fuzz_die("files without names", NULL);
}

static void check_dcp(const struct sf_hf_dcp *d)
{
	size_t vl = strnlen(d->version, sizeof(d->version));

	if (vl == sizeof(d->version) || strspn(d->version, "0123456789.") != vl)
		fuzz_die("version not digits and dots", NULL);
	if (d->n && !d->has_sharding)
		fuzz_die("offsets without DCP_SHARDING_INFO", NULL);
	for (size_t i = 0; i < d->n; i++) {
		if (!d->offs[i].name || !d->offs[i].name[0] ||
		    strlen(d->offs[i].name) > SF_MAX_NAME)
			fuzz_die("offsets name", NULL);
		if (d->offs[i].ndim > SF_MAX_NDIM)
			fuzz_die("too many offsets", d->offs[i].name);
		if (i && strcmp(d->offs[i - 1].name, d->offs[i].name) >= 0)
			fuzz_die("offsets not sorted and unique", d->offs[i].name);
		if (sf_hf_dcp_find(d, d->offs[i].name) != &d->offs[i])
			fuzz_die("lookup misses a name", d->offs[i].name);
		for (unsigned k = 0; k < d->offs[i].ndim; k++)
			if (d->offs[i].off[k] > (uint64_t)INT64_MAX)
				fuzz_die("offset out of range", d->offs[i].name);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *json = (const char *)data + 1;
	char err[256];
	int rc;

	if (size < 1)
		return 0;
	fuzz_poison(err, sizeof(err));
	if (data[0] == 'd') {
		struct sf_hf_dcp *d = (void *)1;

		rc = sf_hf_dcp_parse(json, size - 1, &d, err, sizeof(err));
		if (rc) {
			if (d)
				fuzz_die("result on failure", NULL);
			check_code(rc, err, sizeof(err));
			return 0;
		}
		check_dcp(d);
		sf_hf_dcp_free(d);
	} else {
		struct sf_hf_index *ix = (void *)1;

		rc = sf_hf_index_parse(json, size - 1, &ix, err, sizeof(err));
		if (rc) {
			if (ix)
				fuzz_die("result on failure", NULL);
			check_code(rc, err, sizeof(err));
			return 0;
		}
		check_index(ix);
		sf_hf_index_free(ix);
	}
	return 0;
}
