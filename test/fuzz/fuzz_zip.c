/*
 * fuzz_zip.c - libFuzzer target for the zip reader (core/formats/sf_zip.c).
 *
 * Input: the archive, whole. For any input, sf_zip_open either
 *   - fails with -SF_EFORMAT, -SF_ETOOBIG or -ENOMEM, no archive, and a
 *     non-empty one-line message without control bytes (sf_fail's
 *     promise; quoted names may carry UTF-8); or
 *   - returns an archive for which everything sf_zip.h promises holds:
 *     every name is a NUL-free string whose local header (signature
 *     PK\3\4, the same name, checked here on the raw bytes) lies at
 *     header_off, header_off + 30 + name length <= data_off, the data
 *     [data_off, data_off + csize) lies inside the input, no two entries'
 *     [header_off, data_off + csize) overlap, no two entries have one
 *     name (ASCII case folded: torch's reader looks names up so; such
 *     archives fail), sf_zip_find gives each entry for its name, and
 *     sf_zip_entry_input gives exactly the stored bytes (read through sf_input_read and compared with the input) or
 *     -SF_EFORMAT for a compressed entry or one whose csize != size.
 * The same input with small caps (4 entries, 4 KiB of central directory)
 * gives the same result or -SF_ETOOBIG. Any violation aborts. The input
 * is not NUL-terminated, so an over-read shows under ASan.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_zip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_zip";

struct span {
	uint64_t begin, end;
};

static int by_begin(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static void check_failure(int rc, const struct sf_zip *z, const char *err,
			  size_t errlen)
{
	if (z)
		fuzz_die("failed open returned an archive", err);
	if (rc != -SF_EFORMAT && rc != -SF_ETOOBIG && rc != -ENOMEM)
		fuzz_die("undocumented error", sf_strerror(rc));
	fuzz_check_message(err, errlen);
	for (const char *p = err; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
			fuzz_die("error message has a control byte", err);
}

/* a and b are equal with ASCII letters folded (as torch's miniz looks
 * names up); written here independently of the reader's own. */
static int fold_eq(const char *a, const char *b)
{
	size_t n = strlen(a);

	if (strlen(b) != n)
		return 0;
	for (size_t i = 0; i < n; i++) {
		int x = (unsigned char)a[i], y = (unsigned char)b[i];

		if (x < 0x80 && y < 0x80 && isupper(x))
			x = tolower(x);
		if (x < 0x80 && y < 0x80 && isupper(y))
			y = tolower(y);
		if (x != y)
			return 0;
	}
	return 1;
}

static void check_archive(const struct sf_zip *z, const struct sf_input *in,
			  const uint8_t *data, size_t size)
{
	size_t n = sf_zip_count(z);
	struct span *s = malloc((n ? n : 1) * sizeof(*s));
	unsigned char *buf = NULL;

	if (!s)
		abort();
	if (sf_zip_get(z, n))
		fuzz_die("an entry past the count", NULL);
	for (size_t i = 0; i < n; i++) {
		const struct sf_zip_entry *e = sf_zip_get(z, i), *f;
		struct sf_input ein;
		size_t nlen;
		int rc;

		if (!e || !e->name)
			fuzz_die("missing entry or name", NULL);
		nlen = strlen(e->name);
		if (e->header_off > size || size - e->header_off < 30 + (uint64_t)nlen)
			fuzz_die("local header outside the input", e->name);
		if (memcmp(data + e->header_off, "PK\3\4", 4) != 0)
			fuzz_die("no local header signature", e->name);
		if (fuzz_le(data + e->header_off + 26, 2) != nlen ||
		    memcmp(data + e->header_off + 30, e->name, nlen) != 0)
			fuzz_die("local header names another entry", e->name);
		if (e->data_off < e->header_off + 30 + nlen)
			fuzz_die("data before the end of the local header", e->name);
		if (e->data_off > size || e->csize > size - e->data_off)
			fuzz_die("data outside the input", e->name);
		s[i].begin = e->header_off;
		s[i].end = e->data_off + e->csize;

		f = sf_zip_find(z, e->name);
		if (f != e)
			fuzz_die("find does not give the entry of the name", e->name);
		/* no two entries share a name, ASCII case folded (issue 30:
		 * readers disagree on which a repeated name means) */
		for (size_t j = 0; j < i; j++)
			if (fold_eq(sf_zip_get(z, j)->name, e->name))
				fuzz_die("two entries of one name accepted", e->name);

		rc = sf_zip_entry_input(z, e, &ein);
		if (e->method != 0 || e->csize != e->size) {
			if (rc != -SF_EFORMAT)
				fuzz_die("compressed entry served", e->name);
			continue;
		}
		if (rc != 0 || ein.size != e->csize)
			fuzz_die("stored entry not served", e->name);
		buf = realloc(buf, ein.size ? ein.size : 1);
		if (!buf)
			abort();
		if (sf_input_read(&ein, buf, ein.size, 0) != 0 ||
		    memcmp(buf, data + e->data_off, ein.size) != 0)
			fuzz_die("entry bytes differ from the input", e->name);
		if (sf_input_read(&ein, buf, 1, ein.size) != -SF_ESHORT)
			fuzz_die("entry input reads past its data", e->name);
	}
	qsort(s, n, sizeof(*s), by_begin);
	for (size_t i = 1; i < n; i++)
		if (s[i].begin < s[i - 1].end)
			fuzz_die("entries overlap", NULL);
	(void)in;
	free(buf);
	free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sf_input in = sf_input_mem(data, size);
	struct sf_zip_opts small = { .max_entries = 4, .max_cd_bytes = 4096 };
	struct sf_zip *z = (struct sf_zip *)&z, *zs = (struct sf_zip *)&zs;
	char err[256], errs[256];
	int rc, rcs;

	fuzz_poison(err, sizeof(err));
	rc = sf_zip_open(&in, NULL, &z, err, sizeof(err));
	if (rc < 0) {
		check_failure(rc, z, err, sizeof(err));
	} else {
		if (rc != 0 || !z)
			fuzz_die("open returned neither an error nor an archive", NULL);
		check_archive(z, &in, data, size);
	}

	fuzz_poison(errs, sizeof(errs));
	rcs = sf_zip_open(&in, &small, &zs, errs, sizeof(errs));
	if (rcs < 0)
		check_failure(rcs, zs, errs, sizeof(errs));
	if (rcs != rc && rcs != -SF_ETOOBIG && rc != -ENOMEM && rcs != -ENOMEM)
		fuzz_die("small caps change the outcome", errs);
	if (rcs == 0) {
		if (sf_zip_count(zs) != sf_zip_count(z) || sf_zip_count(zs) > 4)
			fuzz_die("small caps change the entries", NULL);
		sf_zip_close(zs);
	}
	if (rc == 0)
		sf_zip_close(z);
	return 0;
}
