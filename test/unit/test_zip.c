/*
 * test_zip.c - the zip reader (core/formats/sf_zip.c) on archives that
 * Python's zipfile and torch.save wrote, and on broken ones.
 *
 * Usage: test_zip CORPUS_DIR (test/corpus/zip, made by zip_cases.py;
 * walked by corpus_case.h).
 *   valid/CASE:   input.zip and expected.txt (entries computed in Python
 *                 from zipfile.ZipInfo and its own parse of the local
 *                 headers; format in zip_cases.py). Each is opened from
 *                 memory and from a descriptor (the region, if given), its
 *                 entries compared field by field, found by name (and
 *                 not by the same name in another case), and the
 *                 stored bytes read through sf_zip_entry_input compared
 *                 with the files Python wrote.
 *   invalid/CASE: input.zip and error ("CODE SUBSTRING"): the open fails
 *                 (among them names given twice, or twice but for ASCII
 *                 case, in zipfile's and real torch.save archives)
 *                 with that code and a one-line reason holding SUBSTRING;
 *                 every prefix and suffix fails cleanly too.
 * Beside the corpus: every prefix and suffix of every valid input, and
 * random byte flips (seeded), either fail with a documented code and a
 * one-line reason or give entries that lie inside the input and read;
 * the caps of sf_zip_opts give -SF_ETOOBIG.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corpus_case.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_test.h"
#include "sf_zip.h"

#define PROG "test_zip"
#define MAX_EXPECT 64

struct expect_entry {
	char name[200];
	unsigned method;
	unsigned long long size, csize, header_off, data_off;
};

struct expect_data {
	char file[64];
	char name[200];
};

struct expect {
	int has_region;
	unsigned long long region_off, region_len;
	size_t count;
	size_t ne, nd;
	struct expect_entry e[MAX_EXPECT];
	struct expect_data d[MAX_EXPECT];
};

/* expected.txt's text (modified in place) into x. */
static int parse_expected(const char *name, char *text, struct expect *x)
{
	char *line, *save = NULL;

	memset(x, 0, sizeof(*x));
	for (line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		int n = 0;

		if (sscanf(line, "region %llu %llu", &x->region_off, &x->region_len) == 2) {
			x->has_region = 1;
		} else if (sscanf(line, "count %zu", &x->count) == 1) {
		} else if (strncmp(line, "entry ", 6) == 0 && x->ne < MAX_EXPECT) {
			struct expect_entry *e = &x->e[x->ne++];
			if (sscanf(line, "entry %u %llu %llu %llu %llu %n", &e->method,
				   &e->size, &e->csize, &e->header_off, &e->data_off, &n) != 5 ||
			    n == 0)
				return -1;
			snprintf(e->name, sizeof(e->name), "%s", line + n);
		} else if (strncmp(line, "data ", 5) == 0 && x->nd < MAX_EXPECT) {
			struct expect_data *d = &x->d[x->nd++];
			if (sscanf(line, "data %63s %n", d->file, &n) != 1 || n == 0)
				return -1;
			snprintf(d->name, sizeof(d->name), "%s", line + n);
		} else {
			fprintf(stderr, "%s: %s: bad line: %s\n", PROG, name, line);
			return -1;
		}
	}
	return 0;
}

/* err holds one non-empty line without control bytes (sf_fail's
 * promise; names from the archive may carry UTF-8). */
static int one_line(const char *err)
{
	if (!err[0])
		return 0;
	for (const char *p = err; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f)
			return 0;
	return 1;
}

static int documented(int rc)
{
	return rc == -SF_EFORMAT || rc == -SF_ETOOBIG || rc == -ENOMEM || rc == -EIO;
}

/* Whatever an archive gave: every entry lies inside the input, before
 * the others, and a stored one reads. Returns the number of entries. */
static size_t check_sane(const struct sf_input *in, const struct sf_zip *z)
{
	size_t n = sf_zip_count(z);
	unsigned char buf[4096];

	for (size_t i = 0; i < n; i++) {
		const struct sf_zip_entry *e = sf_zip_get(z, i);
		struct sf_input ein;

		if (!CHECK(e && e->name))
			return n;
		CHECK(e->header_off <= e->data_off);
		CHECK(e->data_off <= in->size && e->csize <= in->size - e->data_off);
		CHECK(memchr(e->name, 0, strlen(e->name) + 1) == e->name + strlen(e->name));
		CHECK(sf_zip_find(z, e->name) != NULL);
		if (e->method == 0 && e->csize == e->size) {
			if (!CHECK(sf_zip_entry_input(z, e, &ein) == 0))
				continue;
			CHECK_EQ(ein.size, e->csize);
			for (uint64_t off = 0; off < ein.size; off += sizeof(buf)) {
				size_t len = ein.size - off < sizeof(buf) ? ein.size - off : sizeof(buf);
				CHECK_EQ(sf_input_read(&ein, buf, len, off), 0);
			}
		} else {
			CHECK_EQ(sf_zip_entry_input(z, e, &ein), -SF_EFORMAT);
		}
	}
	CHECK(sf_zip_get(z, n) == NULL);
	return n;
}

/* Open in, which must either fail cleanly or be sane. */
static void open_any(const struct sf_input *in)
{
	struct sf_zip *z = (struct sf_zip *)&z;
	char err[256];
	int rc;

	memset(err, 'x', sizeof(err));
	rc = sf_zip_open(in, NULL, &z, err, sizeof(err));
	if (rc < 0) {
		CHECK(z == NULL);
		CHECK(documented(rc));
		CHECK(one_line(err));
		return;
	}
	CHECK_EQ(rc, 0);
	check_sane(in, z);
	sf_zip_close(z);
}

static void check_valid(const char *dir, const char *name,
			const struct expect *x, const struct sf_input *in)
{
	struct sf_zip *z = NULL;
	char err[256];
	int rc;

	rc = sf_zip_open(in, NULL, &z, err, sizeof(err));
	if (!CHECK_EQ(rc, 0)) {
		fprintf(stderr, "%s: %s: %s\n", PROG, name, err);
		return;
	}
	CHECK_EQ(sf_zip_count(z), x->count);
	CHECK_EQ(x->ne, x->count);
	for (size_t i = 0; i < x->ne && i < sf_zip_count(z); i++) {
		const struct sf_zip_entry *e = sf_zip_get(z, i);
		const struct expect_entry *w = &x->e[i];
		if (!CHECK(strcmp(e->name, w->name) == 0))
			fprintf(stderr, "%s: %s: entry %zu is '%s', not '%s'\n",
				PROG, name, i, e->name, w->name);
		CHECK_EQ(e->method, w->method);
		CHECK_EQ(e->size, w->size);
		CHECK_EQ(e->csize, w->csize);
		CHECK_EQ(e->header_off, w->header_off);
		CHECK_EQ(e->data_off, w->data_off);
		CHECK(sf_zip_find(z, w->name) == e);
	}
	CHECK(sf_zip_find(z, "no such entry") == NULL);
	/* find is exact: a name in another case is no entry (names that
	 * fold to one another never coexist: issue 30) */
	for (size_t i = 0; i < sf_zip_count(z); i++) {
		char other[200];
		size_t k;

		snprintf(other, sizeof(other), "%s", sf_zip_get(z, i)->name);
		for (k = 0; other[k] && !((other[k] >= 'a' && other[k] <= 'z') ||
					  (other[k] >= 'A' && other[k] <= 'Z')); k++)
			;
		if (!other[k])
			continue;
		other[k] ^= 0x20;
		CHECK(sf_zip_find(z, other) == NULL);
	}
	check_sane(in, z);

	for (size_t i = 0; i < x->nd; i++) {
		const struct sf_zip_entry *e = sf_zip_find(z, x->d[i].name);
		struct sf_input ein;
		char *want, *got;
		size_t wlen;

		if (!CHECK(e != NULL))
			continue;
		want = corpus_slurp(dir, x->d[i].file, &wlen);
		if (!CHECK(want != NULL))
			continue;
		if (CHECK_EQ(sf_zip_entry_input(z, e, &ein), 0) &&
		    CHECK_EQ(ein.size, wlen)) {
			got = malloc(wlen + 1);
			if (CHECK(got)) {
				CHECK_EQ(sf_input_read(&ein, got, wlen, 0), 0);
				if (!CHECK(memcmp(got, want, wlen) == 0))
					fprintf(stderr, "%s: %s: bytes of %s differ from %s\n",
						PROG, name, x->d[i].name, x->d[i].file);
				/* the entry's input ends at its data */
				CHECK_EQ(sf_input_read(&ein, got, 1, wlen), -SF_ESHORT);
				free(got);
			}
		}
		free(want);
	}
	sf_zip_close(z);
}

/* Every prefix and suffix of in (all of them up to 4096 bytes, a spread
 * beyond). */
static void truncations(const struct sf_input *in)
{
	uint64_t size = in->size, step = size <= 4096 ? 1 : size / 4096 + 1;

	for (uint64_t k = 0; k < size; k += step) {
		struct sf_input sub;

		if (CHECK_EQ(sf_input_sub(in, 0, k, &sub), 0))
			open_any(&sub);
		if (CHECK_EQ(sf_input_sub(in, k + 1, size - k - 1, &sub), 0))
			open_any(&sub);
	}
}

/* Random byte flips; most fail, all must be clean. */
static void flips(const unsigned char *buf, size_t len, unsigned rounds)
{
	unsigned char *copy = malloc(len ? len : 1);

	if (!CHECK(copy))
		return;
	for (unsigned r = 0; r < rounds; r++) {
		struct sf_input in = sf_input_mem(copy, len);
		unsigned nflip = 1 + (unsigned)sf_rand_below(4);

		memcpy(copy, buf, len);
		for (unsigned f = 0; f < nflip && len; f++) {
			size_t at = sf_rand_below(len);
			/* bias toward the tail, where the records are */
			if (sf_rand_below(2) && len > 128)
				at = len - 1 - sf_rand_below(128);
			copy[at] = (unsigned char)sf_rand();
		}
		open_any(&in);
	}
	free(copy);
}

struct tally {
	unsigned valid, invalid;
};

static void valid_case(struct corpus_case *c, void *arg)
{
	static struct expect x;
	struct tally *t = arg;
	struct sf_input whole, in;
	char path[8448];
	int fd;

	if (!CHECK(parse_expected(c->name, c->want, &x) == 0))
		return;
	t->valid++;
	whole = sf_input_mem(c->input, c->len);
	in = whole;
	if (x.has_region) {
		char err[256];
		struct sf_zip *z = NULL;
		int rc;

		if (!CHECK_EQ(sf_input_sub(&whole, x.region_off, x.region_len, &in), 0))
			return;
		/* offsets are the region's: the whole file is no archive */
		rc = sf_zip_open(&whole, NULL, &z, err, sizeof(err));
		CHECK_EQ(rc, -SF_EFORMAT);
		CHECK(z == NULL);
		sf_zip_close(z);
	}
	check_valid(c->dir, c->name, &x, &in);

	/* the same through a descriptor */
	snprintf(path, sizeof(path), "%s/input.zip", c->dir);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (CHECK(fd >= 0)) {
		struct sf_input fin = sf_input_fd(fd, x.has_region ? x.region_off : 0,
						  in.size);
		check_valid(c->dir, c->name, &x, &fin);
		/* a region longer than the file: fails, never reads beyond */
		fin.size += 100;
		open_any(&fin);
		close(fd);
	}

	truncations(&in);
	flips(in.mem, in.size, 2000);

	/* caps */
	if (x.count > 1) {
		struct sf_zip_opts o = { .max_entries = (uint32_t)x.count - 1 };
		struct sf_zip *z = NULL;
		char err[256];
		CHECK_EQ(sf_zip_open(&in, &o, &z, err, sizeof(err)), -SF_ETOOBIG);
		CHECK(one_line(err));
		o.max_entries = (uint32_t)x.count;
		o.max_cd_bytes = 46;
		CHECK_EQ(sf_zip_open(&in, &o, &z, err, sizeof(err)), -SF_ETOOBIG);
		CHECK(z == NULL);
		o.max_cd_bytes = 1 << 20;
		if (CHECK_EQ(sf_zip_open(&in, &o, &z, err, sizeof(err)), 0))
			CHECK_EQ(sf_zip_count(z), x.count);
		sf_zip_close(z);
	}
}

static void invalid_case(struct corpus_case *c, void *arg)
{
	struct sf_zip *z = (struct sf_zip *)&z;
	struct tally *t = arg;
	struct sf_input in = sf_input_mem(c->input, c->len);
	char err[256];
	int rc;

	t->invalid++;
	memset(err, 'x', sizeof(err));
	rc = sf_zip_open(&in, NULL, &z, err, sizeof(err));
	if (!CHECK(corpus_code_is(c->code, rc)) || !CHECK(strstr(err, c->sub)))
		fprintf(stderr, "%s: %s: got %s '%s', want %s '%s'\n", PROG,
			c->name, sf_strerror(rc), rc < 0 ? err : "", c->code, c->sub);
	CHECK(z == NULL || rc == 0);
	CHECK(rc == 0 || one_line(err));
	if (rc == 0)
		sf_zip_close(z);
	truncations(&in);
}

int main(int argc, char **argv)
{
	struct tally t = { 0 };

	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", PROG);
		return 2;
	}
	sf_test_seed(PROG, 20261124);
	sf_zip_close(NULL);
	CHECK_EQ(sf_zip_count(NULL), 0);
	corpus_walk(argv[1], "valid", "input.zip", valid_case, &t);
	corpus_walk(argv[1], "invalid", "input.zip", invalid_case, &t);
	printf("%s: %u valid and %u invalid archives\n", PROG, t.valid, t.invalid);
	CHECK(t.valid >= 10);
	CHECK(t.invalid >= 15);
	return sf_test_done(PROG);
}
