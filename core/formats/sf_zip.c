/*
 * sf_zip.c - the zip reader (sf_zip.h): end record, ZIP64, central
 * directory, local headers; no decompression.
 *
 * Invariants: every entry handed out has a NUL-free name, a local header
 * that matches its central record, and stored data [data_off,
 * data_off + csize) inside the input and before the central directory; no
 * two entries' data overlap. Every read goes through sf_input_read, so no
 * offset in the archive can make it read outside the input.
 */
#include "sf_zip.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_model.h" /* sf_where, sf_fail */

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_Z64_LOC 0x07064b50u
#define SIG_Z64_EOCD 0x06064b50u
#define EOCD_LEN 22
#define Z64_LOC_LEN 20
#define Z64_EOCD_LEN 56
#define CEN_LEN 46
#define LOC_LEN 30
#define MAX_COMMENT 65535
#define DEF_MAX_ENTRIES (1u << 20)
#define DEF_MAX_CD (256ull << 20)

struct sf_zip {
	struct sf_input in;              /* borrowed descriptor or buffer */
	struct sf_zip_entry *e;          /* central directory order */
	size_t n;
	char *names;                     /* every name, NUL-separated (owned) */
};

static uint16_t le16(const unsigned char *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* The central directory's place and size, from the end records. */
struct cd_loc {
	uint64_t off, size, count;
	uint64_t end;                    /* where the end records begin */
};

static int find_end(const struct sf_input *in, struct cd_loc *cd,
		    const struct sf_where *w)
{
	size_t tail = in->size < EOCD_LEN + MAX_COMMENT ? (size_t)in->size :
		      EOCD_LEN + MAX_COMMENT;
	unsigned char *buf, *e = NULL;
	uint64_t base = in->size - tail, eocd_at;
	int rc;

	if (in->size < EOCD_LEN)
		return sf_fail(w, -SF_EFORMAT, "zip: %llu bytes, too short for an archive",
			    (unsigned long long)in->size);
	buf = malloc(tail);
	if (!buf)
		return -ENOMEM;
	rc = sf_input_read(in, buf, tail, base);
	if (rc) {
		free(buf);
		return sf_fail(w, rc, "zip: cannot read the end record");
	}
	for (size_t i = tail - EOCD_LEN + 1; i-- > 0;) {
		/* the comment must end exactly at the input's end */
		if (le32(buf + i) == SIG_EOCD &&
		    i + EOCD_LEN + le16(buf + i + 20) == tail) {
			e = buf + i;
			break;
		}
	}
	if (!e) {
		free(buf);
		return sf_fail(w, -SF_EFORMAT, "zip: no end of central directory record");
	}
	eocd_at = base + (uint64_t)(e - buf);
	if (le16(e + 4) != 0 || le16(e + 6) != 0 || le16(e + 8) != le16(e + 10)) {
		free(buf);
		return sf_fail(w, -SF_EFORMAT, "zip: multi-disk archives are not read");
	}
	cd->count = le16(e + 10);
	cd->size = le32(e + 12);
	cd->off = le32(e + 16);
	cd->end = eocd_at;
	free(buf);
	if (cd->count == 0xFFFF || cd->size == 0xFFFFFFFFu || cd->off == 0xFFFFFFFFu ||
	    eocd_at >= Z64_LOC_LEN) {
		unsigned char loc[Z64_LOC_LEN], z[Z64_EOCD_LEN];
		uint64_t zoff;

		if (eocd_at < Z64_LOC_LEN ||
		    sf_input_read(in, loc, sizeof(loc), eocd_at - Z64_LOC_LEN) ||
		    le32(loc) != SIG_Z64_LOC) {
			if (cd->count == 0xFFFF || cd->size == 0xFFFFFFFFu ||
			    cd->off == 0xFFFFFFFFu)
				return sf_fail(w, -SF_EFORMAT,
					    "zip: ZIP64 values without a ZIP64 locator");
			return 0; /* a plain archive */
		}
		zoff = le64(loc + 8);
		if (le32(loc + 4) != 0 || le32(loc + 16) > 1)
			return sf_fail(w, -SF_EFORMAT, "zip: multi-disk archives are not read");
		if (zoff > eocd_at - Z64_LOC_LEN ||
		    eocd_at - Z64_LOC_LEN - zoff < Z64_EOCD_LEN ||
		    sf_input_read(in, z, sizeof(z), zoff) || le32(z) != SIG_Z64_EOCD)
			return sf_fail(w, -SF_EFORMAT,
				    "zip: the ZIP64 locator points at no ZIP64 end record");
		if (le32(z + 16) != 0 || le32(z + 20) != 0 || le64(z + 24) != le64(z + 32))
			return sf_fail(w, -SF_EFORMAT, "zip: multi-disk archives are not read");
		cd->count = le64(z + 32);
		cd->size = le64(z + 40);
		cd->off = le64(z + 48);
		cd->end = zoff;
	}
	return 0;
}

/* ZIP64 extended information (0x0001) for the fields that hold their
 * 32-bit all-ones marker, in the APPNOTE's order. */
static int zip64_extra(const unsigned char *x, size_t xlen, bool need_size,
		       bool need_csize, bool need_off, uint64_t *size,
		       uint64_t *csize, uint64_t *off)
{
	while (xlen >= 4) {
		uint16_t id = le16(x), len = le16(x + 2);
		size_t at = 4;

		if ((size_t)len > xlen - 4)
			return -1;
		if (id == 0x0001) {
			if (need_size) {
				if (at + 8 > 4u + len)
					return -1;
				*size = le64(x + at);
				at += 8;
			}
			if (need_csize) {
				if (at + 8 > 4u + len)
					return -1;
				*csize = le64(x + at);
				at += 8;
			}
			if (need_off) {
				if (at + 8 > 4u + len)
					return -1;
				*off = le64(x + at);
			}
			return 0;
		}
		x += 4 + len;
		xlen -= 4u + len;
	}
	return need_size || need_csize || need_off ? -1 : 0;
}

static int cmp_data(const void *a, const void *b)
{
	const struct sf_zip_entry *x = *(const struct sf_zip_entry *const *)a;
	const struct sf_zip_entry *y = *(const struct sf_zip_entry *const *)b;

	return x->data_off < y->data_off ? -1 : x->data_off > y->data_off;
}

/* No two entries' data (with their local headers) overlap. */
static int check_overlap(struct sf_zip *z, const struct sf_where *w)
{
	const struct sf_zip_entry **v;
	int rc = 0;

	if (z->n < 2)
		return 0;
	v = malloc(z->n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < z->n; i++)
		v[i] = &z->e[i];
	qsort(v, z->n, sizeof(*v), cmp_data);
	for (size_t i = 1; i < z->n && !rc; i++)
		if (v[i]->header_off < v[i - 1]->data_off + v[i - 1]->csize)
			rc = sf_fail(w, -SF_EFORMAT,
				  "zip: entries %zu and %zu overlap",
				  (size_t)(v[i - 1] - z->e), (size_t)(v[i] - z->e));
	free(v);
	return rc;
}

int sf_zip_open(const struct sf_input *in, const struct sf_zip_opts *opts,
		struct sf_zip **out, char *err, size_t errlen)
{
	uint32_t max_entries = opts && opts->max_entries ? opts->max_entries :
			       DEF_MAX_ENTRIES;
	uint64_t max_cd = opts && opts->max_cd_bytes ? opts->max_cd_bytes : DEF_MAX_CD;
	struct cd_loc cd = { 0 };
	struct sf_where wh, *w = &wh;
	unsigned char *buf = NULL;
	struct sf_zip *z;
	size_t p = 0, namebytes = 0;
	int rc;

	*out = NULL;
	sf_where_init(w, err, errlen); /* one printable line (sf_fail) */
	rc = find_end(in, &cd, w);
	if (rc)
		return rc;
	if (cd.count > max_entries)
		return sf_fail(w, -SF_ETOOBIG, "zip: %llu entries, more than %u",
			    (unsigned long long)cd.count, max_entries);
	if (cd.size > max_cd)
		return sf_fail(w, -SF_ETOOBIG, "zip: central directory of %llu bytes",
			    (unsigned long long)cd.size);
	if (cd.off > cd.end || cd.size > cd.end - cd.off)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: the central directory lies outside the archive");
	if (cd.count > cd.size / CEN_LEN)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: %llu entries cannot fit in %llu bytes",
			    (unsigned long long)cd.count, (unsigned long long)cd.size);
	z = calloc(1, sizeof(*z));
	if (!z)
		return -ENOMEM;
	z->in = *in;
	if (cd.size) {
		buf = malloc((size_t)cd.size);
		if (!buf) {
			rc = -ENOMEM;
			goto out_free_zip;
		}
		rc = sf_input_read(in, buf, (size_t)cd.size, cd.off);
		if (rc) {
			sf_fail(w, rc, "zip: cannot read the central directory");
			goto out_free_buf;
		}
	}
	if (cd.count) {
		z->e = calloc((size_t)cd.count, sizeof(*z->e));
		z->names = malloc((size_t)cd.size); /* names fit: each < its record */
		if (!z->e || !z->names) {
			rc = -ENOMEM;
			goto out_free_buf;
		}
	}
	for (uint64_t i = 0; i < cd.count; i++) {
		struct sf_zip_entry *e = &z->e[i];
		const unsigned char *c = buf + p;
		unsigned char loc[LOC_LEN];
		uint16_t flags, nlen, xlen, clen, lnlen, lxlen;
		char *name;

		if (cd.size - p < CEN_LEN || le32(c) != SIG_CENTRAL) {
			rc = sf_fail(w, -SF_EFORMAT, "zip: central record %llu is malformed",
				  (unsigned long long)i);
			goto out_free_buf;
		}
		flags = le16(c + 8);
		e->method = le16(c + 10);
		e->crc32 = le32(c + 16);
		e->csize = le32(c + 20);
		e->size = le32(c + 24);
		nlen = le16(c + 28);
		xlen = le16(c + 30);
		clen = le16(c + 32);
		e->header_off = le32(c + 42);
		if ((size_t)CEN_LEN + nlen + xlen + clen > cd.size - p) {
			rc = sf_fail(w, -SF_EFORMAT, "zip: central record %llu runs past the directory",
				  (unsigned long long)i);
			goto out_free_buf;
		}
		if (flags & 1) {
			rc = sf_fail(w, -SF_EFORMAT, "zip: entry %llu is encrypted",
				  (unsigned long long)i);
			goto out_free_buf;
		}
		if (le16(c + 34) != 0) {
			rc = sf_fail(w, -SF_EFORMAT, "zip: multi-disk archives are not read");
			goto out_free_buf;
		}
		if (zip64_extra(c + CEN_LEN + nlen, xlen, e->size == 0xFFFFFFFFu,
				e->csize == 0xFFFFFFFFu, e->header_off == 0xFFFFFFFFu,
				&e->size, &e->csize, &e->header_off)) {
			rc = sf_fail(w, -SF_EFORMAT, "zip: entry %llu has a bad ZIP64 extra field",
				  (unsigned long long)i);
			goto out_free_buf;
		}
		name = z->names + namebytes;
		memcpy(name, c + CEN_LEN, nlen);
		name[nlen] = '\0';
		if (memchr(name, '\0', nlen)) {
			rc = sf_fail(w, -SF_EFORMAT, "zip: entry %llu has a NUL in its name",
				  (unsigned long long)i);
			goto out_free_buf;
		}
		namebytes += (size_t)nlen + 1;
		e->name = name;
		/* the local header: same name, data after it */
		if (e->header_off > cd.off || cd.off - e->header_off < LOC_LEN ||
		    sf_input_read(in, loc, LOC_LEN, e->header_off) ||
		    le32(loc) != SIG_LOCAL) {
			rc = sf_fail(w, -SF_EFORMAT, "zip: entry %llu has no local header",
				  (unsigned long long)i);
			goto out_free_buf;
		}
		lnlen = le16(loc + 26);
		lxlen = le16(loc + 28);
		e->data_off = e->header_off + LOC_LEN + lnlen + lxlen;
		if (lnlen != nlen || e->data_off > cd.off ||
		    e->csize > cd.off - e->data_off) {
			rc = sf_fail(w, -SF_EFORMAT,
				  "zip: entry %llu: its local header or data do not fit before the directory",
				  (unsigned long long)i);
			goto out_free_buf;
		}
		if (nlen) {
			char lname[65536];

			if (sf_input_read(in, lname, nlen, e->header_off + LOC_LEN) ||
			    memcmp(lname, name, nlen) != 0) {
				rc = sf_fail(w, -SF_EFORMAT,
					  "zip: entry %llu: local and central names differ",
					  (unsigned long long)i);
				goto out_free_buf;
			}
		}
		p += (size_t)CEN_LEN + nlen + xlen + clen;
		z->n++;
	}
	rc = check_overlap(z, w);
	if (rc)
		goto out_free_buf;
	free(buf);
	*out = z;
	return 0;
out_free_buf:
	free(buf);
out_free_zip:
	sf_zip_close(z);
	return rc;
}

void sf_zip_close(struct sf_zip *z)
{
	if (!z)
		return;
	free(z->e);
	free(z->names);
	free(z);
}

size_t sf_zip_count(const struct sf_zip *z)
{
	return z ? z->n : 0;
}

const struct sf_zip_entry *sf_zip_get(const struct sf_zip *z, size_t i)
{
	return z && i < z->n ? &z->e[i] : NULL;
}

const struct sf_zip_entry *sf_zip_find(const struct sf_zip *z, const char *name)
{
	for (size_t i = 0; z && i < z->n; i++)
		if (strcmp(z->e[i].name, name) == 0)
			return &z->e[i];
	return NULL;
}

int sf_zip_entry_input(const struct sf_zip *z, const struct sf_zip_entry *e,
		       struct sf_input *out)
{
	if (e->method != 0 || e->csize != e->size)
		return -SF_EFORMAT;
	return sf_input_sub(&z->in, e->data_off, e->csize, out);
}
