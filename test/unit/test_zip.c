/*
 * test_zip.c - the zip reader against archives Python and torch wrote
 * (test/corpus/zip, made by zip_cases.py).
 *
 *   test_zip CORPUS_DIR
 *
 * valid/CASE: every entry (name, method, size, csize, data_off) equals the
 * line Python computed; every stored entry reads back through
 * sf_zip_entry_input, a deflated one is refused. invalid/CASE: the open
 * fails with the code and a reason holding the substring in `error`.
 * region/: the second of two torch.save archives after junk, opened as a
 * region of the file, gives the tensor's bytes at its data entry. And for
 * every valid archive, every prefix and every suffix-cut opened as an
 * input of its own either fails or gives entries that lie inside it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corpus_case.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_test.h"
#include "sf_zip.h"

/* One line per entry, as zip_cases.py writes them. */
static void dump(const struct sf_zip *z, char *out, size_t cap)
{
	size_t at = 0;

	out[0] = '\0';
	for (size_t i = 0; i < sf_zip_count(z) && at < cap; i++) {
		const struct sf_zip_entry *e = sf_zip_get(z, i);

		at += (size_t)snprintf(out + at, cap - at, "%s %u %llu %llu %llu\n",
				       e->name, e->method, (unsigned long long)e->size,
				       (unsigned long long)e->csize,
				       (unsigned long long)e->data_off);
	}
}

static void check_entries_read(const struct sf_zip *z, const struct sf_input *in)
{
	for (size_t i = 0; i < sf_zip_count(z); i++) {
		const struct sf_zip_entry *e = sf_zip_get(z, i);
		struct sf_input sub;
		int rc = sf_zip_entry_input(z, e, &sub);

		if (e->method != 0) {
			CHECK_EQ(rc, -SF_EFORMAT);
			continue;
		}
		CHECK_EQ(rc, 0);
		if (rc)
			continue;
		CHECK(e->data_off + e->csize <= in->size);
		if (sub.size) {
			unsigned char *b = malloc(sub.size);

			CHECK(b && sf_input_read(&sub, b, sub.size, 0) == 0);
			free(b);
		}
	}
}

/* Every cut of an archive: never a crash, never an entry outside it. */
static void cuts(const char *buf, size_t len)
{
	size_t step = len > 4000 ? len / 400 : 1;

	for (size_t cut = 0; cut < len; cut += step) {
		struct sf_input full = sf_input_mem(buf, len), in;
		struct sf_zip *z = NULL;
		char err[256];

		for (int side = 0; side < 2; side++) {
			CHECK(sf_input_sub(&full, side ? cut : 0,
					   side ? len - cut : cut, &in) == 0);
			if (sf_zip_open(&in, NULL, &z, err, sizeof(err)) == 0) {
				for (size_t i = 0; i < sf_zip_count(z); i++) {
					const struct sf_zip_entry *e = sf_zip_get(z, i);

					CHECK(e->data_off <= in.size &&
					      e->csize <= in.size - e->data_off);
				}
				sf_zip_close(z);
			} else {
				CHECK(err[0] != '\0');
			}
		}
	}
}

static void valid_case(struct corpus_case *c, void *arg)
{
	struct sf_input inp = sf_input_mem(c->input, c->len);
	char err[256], got[65536];
	struct sf_zip *z = NULL;

	(void)arg;
	if (!CHECK(sf_zip_open(&inp, NULL, &z, err, sizeof(err)) == 0)) {
		printf("  %s: %s\n", c->name, err);
	} else {
		dump(z, got, sizeof(got));
		if (!CHECK(strcmp(got, c->want) == 0))
			printf("  %s: got\n%s  want\n%s", c->name, got, c->want);
		check_entries_read(z, &inp);
		sf_zip_close(z);
	}
	cuts(c->input, c->len);
}

static void invalid_case(struct corpus_case *c, void *arg)
{
	struct sf_input inp = sf_input_mem(c->input, c->len);
	struct sf_zip *z = NULL;
	char err[256];
	int rc;

	(void)arg;
	rc = sf_zip_open(&inp, NULL, &z, err, sizeof(err));
	CHECK(rc != 0);
	if (rc == 0)
		sf_zip_close(z);
	if (!CHECK(corpus_code_is(c->code, rc)) ||
	    !CHECK(strstr(err, c->sub) != NULL))
		printf("  %s: error \"%s\" (%s), want %s \"%s\"\n", c->name,
		       err, sf_strerror(rc), c->code, c->sub);
}

static void run_region(const char *top)
{
	char dir[4096], err[256], got[4096];
	char *blob, *reg, *tensor, *want;
	size_t blen = 0, tlen = 0;
	unsigned long long off, len;
	struct sf_input full, in, data;
	struct sf_zip *z = NULL;
	const struct sf_zip_entry *e;

	snprintf(dir, sizeof(dir), "%s/region", top);
	blob = corpus_slurp(dir, "input.bin", &blen);
	reg = corpus_slurp(dir, "region.txt", NULL);
	tensor = corpus_slurp(dir, "tensor.bin", &tlen);
	want = corpus_slurp(dir, "expected.txt", NULL);
	if (!CHECK(blob && reg && tensor && want) ||
	    !CHECK(sscanf(reg, "%llu %llu", &off, &len) == 2))
		goto out;
	full = sf_input_mem(blob, blen);
	CHECK(sf_input_sub(&full, off, len, &in) == 0);
	if (!CHECK(sf_zip_open(&in, NULL, &z, err, sizeof(err)) == 0))
		goto out;
	dump(z, got, sizeof(got));
	CHECK(strcmp(got, want) == 0);
	e = sf_zip_find(z, "archive/data/0");
	if (CHECK(e != NULL) && CHECK(sf_zip_entry_input(z, e, &data) == 0) &&
	    CHECK(data.size == tlen)) {
		char *b = malloc(tlen);

		CHECK(b && sf_input_read(&data, b, tlen, 0) == 0 &&
		      memcmp(b, tensor, tlen) == 0);
		/* and at the file offset the region gives */
		CHECK(memcmp(blob + off + e->data_off, tensor, tlen) == 0);
		free(b);
	}
	sf_zip_close(z);
out:
	free(blob);
	free(reg);
	free(tensor);
	free(want);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: test_zip CORPUS_DIR\n");
		return 2;
	}
	CHECK(corpus_walk(argv[1], "valid", "input.zip", valid_case, NULL) >= 8);
	CHECK(corpus_walk(argv[1], "invalid", "input.zip", invalid_case, NULL) >= 8);
	run_region(argv[1]);
	return sf_test_done("test_zip");
}
