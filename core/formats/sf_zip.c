/*
 * sf_zip.c - the zip reader of sf_zip.h: one archive that fills an input
 * (torch.save's zips, Python zipfile's), read from its central directory.
 *
 * Learned from the PKWARE APPNOTE (6.3.x): end of central directory record
 * (4.3.16), ZIP64 end record and locator (4.3.14, 4.3.15), central file
 * header (4.3.12), local file header (4.3.7), ZIP64 extra field (4.5.3).
 *
 * Invariants:
 * - Every byte is read through sf_input_read, and every offset or size is
 *   checked against the input (overflow-checked) before the read, so a
 *   hostile archive can never make us read outside the input.
 * - The end record is the last one whose comment ends exactly at the
 *   input's end; the central directory ends exactly where the ZIP64 end
 *   record (if any) or the end record begins; every entry's local header
 *   and data lie before the central directory's start.
 * - An entry is returned only when its local header has the signature and
 *   the same name, and [header_off, data_off + csize) overlaps no other
 *   entry's; no two entries have one name (ASCII case folded, as torch's
 *   reader looks names up), checked once at open on the sorted names;
 *   counts are capped (sf_zip_opts) before any allocation sized
 *   by them; arrays grow through sf_array_grow.
 * - Offsets are relative to the input's start (a region of a .distcp is
 *   its own archive); no "prepended data" guessing as zip tools do.
 * - Every failure says why through sf_fail (one printable line); names
 *   from the archive are quoted with escapes (sf_quote_name).
 */
#include "sf_zip.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_model.h" /* sf_where, sf_fail, sf_quote_name */

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_Z64_EOCD 0x06064b50u
#define SIG_Z64_LOC 0x07064b50u

#define EOCD_LEN 22u      /* fixed part of the end record */
#define Z64_LOC_LEN 20u   /* ZIP64 end record locator */
#define Z64_EOCD_LEN 56u  /* fixed part of the ZIP64 end record */
#define CEN_LEN 46u       /* fixed part of a central file header */
#define LOC_LEN 30u       /* fixed part of a local file header */
#define MAX_COMMENT 65535u

#define FLAG_ENCRYPTED 0x0001u
#define FLAG_STRONG_ENC 0x0040u
#define FLAG_CD_ENC 0x2000u

#define DEFAULT_MAX_ENTRIES (1u << 20)
#define DEFAULT_MAX_CD (256ull << 20)

struct sf_zip {
	struct sf_input in;          /* borrowed source (a copy of the value) */
	struct sf_zip_entry *e;      /* n entries, central directory order */
	size_t n, cap;               /* cap: slots of e (sf_array_grow) */
	char *names;                 /* all names, NUL-terminated, owned */
	const struct sf_zip_entry **by_name; /* n, sorted by (name, index) */
};

static uint16_t le16(const unsigned char *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t le32(const unsigned char *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}

static uint64_t le64(const unsigned char *p)
{
	return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32);
}

/* sf_input_read, with a region that is inside the input by its size but
 * not in the file (a descriptor shorter than the region says) reported
 * as a malformed archive. */
static int rd(const struct sf_input *in, void *buf, size_t len, uint64_t off,
	      const struct sf_where *w, const char *what)
{
	int rc = sf_input_read(in, buf, len, off);

	if (rc == -SF_ESHORT)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: %s at %llu+%zu lies past the end of the input",
			    what, (unsigned long long)off, len);
	if (rc < 0)
		return sf_fail(w, rc, "zip: reading the %s at %llu: %s",
			    what, (unsigned long long)off, sf_strerror(rc));
	return 0;
}

/* A name from the archive for a message: quoted by sf_quote_name
 * (control bytes, quotes and backslashes escaped; at most SF_QNAME_MAX
 * bytes shown). */
struct qname {
	char s[4 * SF_QNAME_MAX + 8];
};

static const char *qname(struct qname *q, const char *name)
{
	sf_quote_name(q->s, name, strlen(name));
	return q->s;
}

/* The archive's end: where the central directory is and how many entries
 * it holds, from the end record and, where present, the ZIP64 ones. */
struct zip_end {
	uint64_t count;    /* entries */
	uint64_t cd_off;   /* central directory start */
	uint64_t cd_size;  /* its bytes */
	uint64_t limit;    /* the central directory must end by here */
};

/* Find the end record: scan back from the input's end over at most
 * 65535 + 22 bytes for a signature whose comment ends at the input's end. */
static int find_eocd(const struct sf_input *in, unsigned char *eocd,
		     uint64_t *pos, const struct sf_where *w)
{
	uint64_t size = in->size, tail_len, tail_off;
	unsigned char *tail;
	int rc;

	if (size < EOCD_LEN)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: %llu bytes is too short for an end record",
			    (unsigned long long)size);
	tail_len = size < EOCD_LEN + MAX_COMMENT ? size : EOCD_LEN + MAX_COMMENT;
	tail_off = size - tail_len;
	tail = malloc(tail_len);
	if (!tail)
		return sf_fail(w, -ENOMEM, "zip: out of memory");
	rc = rd(in, tail, tail_len, tail_off, w, "end of the archive");
	if (rc < 0)
		goto out_free_tail;
	for (uint64_t i = tail_len - EOCD_LEN + 1; i-- > 0;) {
		const unsigned char *p = tail + i;
		if (le32(p) != SIG_EOCD)
			continue;
		if (i + EOCD_LEN + le16(p + 20) != tail_len)
			continue; /* a signature inside a comment */
		memcpy(eocd, p, EOCD_LEN);
		*pos = tail_off + i;
		rc = 0;
		goto out_free_tail;
	}
	rc = sf_fail(w, -SF_EFORMAT,
		  "zip: no end of central directory record (not a zip archive, or truncated)");
out_free_tail:
	free(tail);
	return rc;
}

static int read_end(const struct sf_input *in, struct zip_end *end,
		    const struct sf_where *w)
{
	unsigned char eocd[EOCD_LEN] = { 0 }, loc[Z64_LOC_LEN], z64[Z64_EOCD_LEN];
	uint64_t eocd_pos = 0, z64_pos, z64_len;
	uint32_t disk, cd_disk;
	uint64_t disk_count, count, cd_size, cd_off;
	int rc, maxed;

	rc = find_eocd(in, eocd, &eocd_pos, w);
	if (rc < 0)
		return rc;
	disk = le16(eocd + 4);
	cd_disk = le16(eocd + 6);
	disk_count = le16(eocd + 8);
	count = le16(eocd + 10);
	cd_size = le32(eocd + 12);
	cd_off = le32(eocd + 16);
	end->limit = eocd_pos;
	maxed = disk == 0xFFFF || cd_disk == 0xFFFF || disk_count == 0xFFFF ||
		count == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu;

	/* A ZIP64 locator right before the end record. Writers put one there
	 * whenever they write ZIP64 end records, even with no field maxed
	 * (Python's zipfile, torch); its record then has to agree. */
	if (eocd_pos >= Z64_LOC_LEN) {
		rc = rd(in, loc, sizeof(loc), eocd_pos - Z64_LOC_LEN, w,
			"ZIP64 locator");
		if (rc < 0)
			return rc;
	}
	if (eocd_pos < Z64_LOC_LEN || le32(loc) != SIG_Z64_LOC) {
		if (maxed)
			return sf_fail(w, -SF_EFORMAT,
				    "zip: the end record needs ZIP64 values but has no ZIP64 locator");
		goto have_values;
	}
	if (le32(loc + 4) != 0 || le32(loc + 16) > 1)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: multi-disk archive (ZIP64 locator names disk %u of %u)",
			    (unsigned)le32(loc + 4), (unsigned)le32(loc + 16));
	z64_pos = le64(loc + 8);
	if (z64_pos > eocd_pos - Z64_LOC_LEN ||
	    eocd_pos - Z64_LOC_LEN - z64_pos < Z64_EOCD_LEN)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: the ZIP64 locator points outside the archive (%llu)",
			    (unsigned long long)z64_pos);
	rc = rd(in, z64, sizeof(z64), z64_pos, w, "ZIP64 end record");
	if (rc < 0)
		return rc;
	z64_len = le64(z64 + 4);
	if (le32(z64) != SIG_Z64_EOCD)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: no ZIP64 end record where the locator points (%llu)",
			    (unsigned long long)z64_pos);
	/* The record (with its extensible data) ends where the locator
	 * begins (APPNOTE 4.3.6); a locator pointing further back is one of
	 * another archive (torch.save zips back to back, opened whole). */
	if (z64_len != eocd_pos - Z64_LOC_LEN - z64_pos - 12)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: ZIP64 end record at %llu (%llu bytes) does not end at its locator (%llu)",
			    (unsigned long long)z64_pos, (unsigned long long)z64_len,
			    (unsigned long long)(eocd_pos - Z64_LOC_LEN));
	{
		uint32_t d64 = le32(z64 + 16), cdd64 = le32(z64 + 20);
		uint64_t dc64 = le64(z64 + 24), c64 = le64(z64 + 32);
		uint64_t cs64 = le64(z64 + 40), co64 = le64(z64 + 48);

		if ((disk != 0xFFFF && disk != d64) ||
		    (cd_disk != 0xFFFF && cd_disk != cdd64) ||
		    (disk_count != 0xFFFF && disk_count != dc64) ||
		    (count != 0xFFFF && count != c64) ||
		    (cd_size != 0xFFFFFFFFu && cd_size != cs64) ||
		    (cd_off != 0xFFFFFFFFu && cd_off != co64))
			return sf_fail(w, -SF_EFORMAT,
				    "zip: the end record and the ZIP64 end record disagree");
		disk = d64;
		cd_disk = cdd64;
		disk_count = dc64;
		count = c64;
		cd_size = cs64;
		cd_off = co64;
	}
	end->limit = z64_pos;

have_values:
	if (disk != 0 || cd_disk != 0 || disk_count != count)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: multi-disk archive (disk %u, central directory on disk %u, %llu of %llu entries here)",
			    (unsigned)disk, (unsigned)cd_disk,
			    (unsigned long long)disk_count, (unsigned long long)count);
	/* Exactly at: a gap would be data no entry accounts for, and it is
	 * what an archive opened at the wrong offset looks like (a region
	 * of a .distcp that does not start at its archive). */
	if (cd_off > end->limit || cd_size != end->limit - cd_off)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: central directory %llu+%llu does not end at the end record (%llu)",
			    (unsigned long long)cd_off, (unsigned long long)cd_size,
			    (unsigned long long)end->limit);
	end->count = count;
	end->cd_off = cd_off;
	end->cd_size = cd_size;
	return 0;
}

/* The values of the ZIP64 extra field (id 0x0001) for the central fields
 * that are maxed, in APPNOTE order: size, csize, header offset, disk. */
static int zip64_extra(const unsigned char *x, size_t xlen, struct sf_zip_entry *e,
		       uint32_t *disk, const char *name, const struct sf_where *w)
{
	int need_size = e->size == 0xFFFFFFFFu, need_csize = e->csize == 0xFFFFFFFFu;
	int need_off = e->header_off == 0xFFFFFFFFu, need_disk = *disk == 0xFFFF;
	struct qname q;
	size_t pos = 0;

	while (xlen - pos >= 4) {
		uint16_t id = le16(x + pos), len = le16(x + pos + 2);
		const unsigned char *d = x + pos + 4;
		size_t want;

		if (len > xlen - pos - 4)
			return sf_fail(w, -SF_EFORMAT,
				    "zip: entry %s: extra field 0x%04x of %u bytes overruns its %zu",
				    qname(&q, name), id, len, xlen);
		pos += 4 + (size_t)len;
		if (id != 0x0001)
			continue;
		want = 8u * (size_t)(need_size + need_csize + need_off) + 4u * (size_t)need_disk;
		if (len < want)
			return sf_fail(w, -SF_EFORMAT,
				    "zip: entry %s: ZIP64 extra field has %u bytes, needs %zu",
				    qname(&q, name), len, want);
		if (need_size) {
			e->size = le64(d);
			d += 8;
		}
		if (need_csize) {
			e->csize = le64(d);
			d += 8;
		}
		if (need_off) {
			e->header_off = le64(d);
			d += 8;
		}
		if (need_disk)
			*disk = le32(d);
		return 0;
	}
	if (need_size || need_csize || need_off || need_disk)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: entry %s: maxed sizes but no ZIP64 extra field",
			    qname(&q, name));
	return 0;
}

/* Check entry e's local header; set its data_off. buf: 30 + 65535 bytes. */
static int check_local(const struct sf_zip *z, struct sf_zip_entry *e,
		       size_t nlen, uint64_t cd_off, unsigned char *buf,
		       const struct sf_where *w)
{
	struct qname q;
	uint64_t data_off;
	int rc;

	if (e->header_off > cd_off || cd_off - e->header_off < LOC_LEN + nlen)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: entry %s: local header at %llu does not lie before the central directory (%llu)",
			    qname(&q, e->name), (unsigned long long)e->header_off,
			    (unsigned long long)cd_off);
	rc = rd(&z->in, buf, LOC_LEN + nlen, e->header_off, w,
		"local header");
	if (rc < 0)
		return rc;
	if (le32(buf) != SIG_LOCAL)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: entry %s: no local header signature at %llu",
			    qname(&q, e->name), (unsigned long long)e->header_off);
	if (le16(buf + 26) != nlen || memcmp(buf + LOC_LEN, e->name, nlen) != 0)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: entry %s: the local header names another entry",
			    qname(&q, e->name));
	data_off = e->header_off + LOC_LEN + nlen + le16(buf + 28);
	if (data_off > cd_off || e->csize > cd_off - data_off)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: entry %s: data %llu+%llu does not end before the central directory (%llu)",
			    qname(&q, e->name), (unsigned long long)data_off,
			    (unsigned long long)e->csize, (unsigned long long)cd_off);
	e->data_off = data_off;
	return 0;
}

/* Parse the central directory cd (cd_size bytes) into z. */
static int parse_cd(struct sf_zip *z, const unsigned char *cd, uint64_t cd_size,
		    const struct zip_end *end, uint32_t max_entries,
		    const struct sf_where *w)
{
	unsigned char *lbuf;
	char *name_at = z->names;
	struct qname q;
	uint64_t pos = 0;
	int rc = 0;

	lbuf = malloc(LOC_LEN + 65535u);
	if (!lbuf)
		return sf_fail(w, -ENOMEM, "zip: out of memory");
	for (uint64_t i = 0; i < end->count; i++) {
		struct sf_zip_entry *e;
		const unsigned char *h = cd + pos;
		size_t nlen, xlen, clen;
		uint16_t flags;
		uint32_t disk;

		if (cd_size - pos < CEN_LEN || le32(h) != SIG_CENTRAL) {
			rc = sf_fail(w, -SF_EFORMAT,
				  "zip: central directory holds %llu entries, not the %llu the end record says",
				  (unsigned long long)i, (unsigned long long)end->count);
			goto out_free_lbuf;
		}
		nlen = le16(h + 28);
		xlen = le16(h + 30);
		clen = le16(h + 32);
		if (cd_size - pos - CEN_LEN < (uint64_t)nlen + xlen + clen) {
			rc = sf_fail(w, -SF_EFORMAT,
				  "zip: central header %llu overruns the central directory",
				  (unsigned long long)i);
			goto out_free_lbuf;
		}
		rc = sf_array_grow(&z->e, z->n, &z->cap, sizeof(*z->e), 16, max_entries);
		if (rc < 0) {
			if (rc == -SF_ETOOBIG)
				rc = sf_fail(w, rc, "zip: more than %u entries",
					  (unsigned)max_entries);
			else
				rc = sf_fail(w, rc, "zip: out of memory");
			goto out_free_lbuf;
		}
		e = &z->e[z->n];
		memset(e, 0, sizeof(*e));
		memcpy(name_at, h + CEN_LEN, nlen);
		name_at[nlen] = '\0';
		e->name = name_at;
		name_at += nlen + 1;
		if (memchr(h + CEN_LEN, 0, nlen)) {
			rc = sf_fail(w, -SF_EFORMAT,
				  "zip: entry %llu: its name holds a NUL byte",
				  (unsigned long long)i);
			goto out_free_lbuf;
		}
		flags = le16(h + 8);
		if (flags & (FLAG_ENCRYPTED | FLAG_STRONG_ENC | FLAG_CD_ENC)) {
			rc = sf_fail(w, -SF_EFORMAT,
				  "zip: entry %s: encrypted (flags 0x%04x)",
				  qname(&q, e->name), flags);
			goto out_free_lbuf;
		}
		e->method = le16(h + 10);
		e->crc32 = le32(h + 16);
		e->csize = le32(h + 20);
		e->size = le32(h + 24);
		disk = le16(h + 34);
		e->header_off = le32(h + 42);
		rc = zip64_extra(h + CEN_LEN + nlen, xlen, e, &disk, e->name, w);
		if (rc < 0)
			goto out_free_lbuf;
		if (disk != 0) {
			rc = sf_fail(w, -SF_EFORMAT,
				  "zip: entry %s: starts on disk %u (multi-disk archive)",
				  qname(&q, e->name), (unsigned)disk);
			goto out_free_lbuf;
		}
		rc = check_local(z, e, nlen, end->cd_off, lbuf, w);
		if (rc < 0)
			goto out_free_lbuf;
		z->n++;
		pos += CEN_LEN + nlen + xlen + clen;
	}
	if (pos != cd_size)
		rc = sf_fail(w, -SF_EFORMAT,
			  "zip: %llu bytes of the central directory follow its %llu entries",
			  (unsigned long long)(cd_size - pos), (unsigned long long)end->count);
out_free_lbuf:
	free(lbuf);
	return rc;
}

struct span {
	uint64_t begin, end; /* [header_off, data_off + csize) */
	size_t i;
};

static int by_begin(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->i < y->i ? -1 : x->i > y->i;
}

/* No two entries share a byte of [header_off, data_off + csize). */
static int check_overlap(const struct sf_zip *z, const struct sf_where *w)
{
	struct qname qa, qb;
	struct span *s;
	int rc = 0;

	if (z->n < 2)
		return 0;
	s = malloc(z->n * sizeof(*s));
	if (!s)
		return sf_fail(w, -ENOMEM, "zip: out of memory");
	for (size_t i = 0; i < z->n; i++) {
		s[i].begin = z->e[i].header_off;
		s[i].end = z->e[i].data_off + z->e[i].csize; /* checked < cd_off */
		s[i].i = i;
	}
	qsort(s, z->n, sizeof(*s), by_begin);
	for (size_t i = 1; i < z->n; i++)
		if (s[i].begin < s[i - 1].end) {
			rc = sf_fail(w, -SF_EFORMAT,
				  "zip: entries %s and %s overlap",
				  qname(&qa, z->e[s[i - 1].i].name),
				  qname(&qb, z->e[s[i].i].name));
			break;
		}
	free(s);
	return rc;
}

/* Names compared as torch's zip reader (miniz) finds them: bytes, with
 * ASCII letters folded to lower case (never the locale's). */
static int fold_cmp(const char *a, const char *b)
{
	for (;; a++, b++) {
		unsigned char x = (unsigned char)*a, y = (unsigned char)*b;

		if (x >= 'A' && x <= 'Z')
			x = (unsigned char)(x - 'A' + 'a');
		if (y >= 'A' && y <= 'Z')
			y = (unsigned char)(y - 'A' + 'a');
		if (x != y || !x)
			return x < y ? -1 : x > y;
	}
}

/* Entries by folded name, then by name, then by their place in the one
 * array z->e (pointers into the same array compare as their indices). */
static int by_name(const void *a, const void *b)
{
	const struct sf_zip_entry *x = *(const struct sf_zip_entry *const *)a;
	const struct sf_zip_entry *y = *(const struct sf_zip_entry *const *)b;
	int c = fold_cmp(x->name, y->name);

	if (!c)
		c = strcmp(x->name, y->name);
	if (c)
		return c;
	return x < y ? -1 : x > y;
}

/* Sort z->by_name and refuse two entries of one name. Readers disagree on
 * which of them a name means (Python's zipfile: the last; miniz, torch's:
 * whichever its binary search meets, ignoring ASCII case), so an archive
 * that names one entry twice is refused whole: both spellings of a name
 * that differ only in ASCII case count as the same. */
static int index_names(struct sf_zip *z, const struct sf_where *w)
{
	struct qname qa, qb;

	z->by_name = malloc(z->n * sizeof(*z->by_name));
	if (!z->by_name)
		return sf_fail(w, -ENOMEM, "zip: out of memory");
	for (size_t i = 0; i < z->n; i++)
		z->by_name[i] = &z->e[i];
	qsort(z->by_name, z->n, sizeof(*z->by_name), by_name);
	for (size_t i = 1; i < z->n; i++) {
		const struct sf_zip_entry *x = z->by_name[i - 1], *y = z->by_name[i];

		if (fold_cmp(x->name, y->name) != 0)
			continue;
		if (x > y) { /* name them in central directory order */
			const struct sf_zip_entry *t = x;
			x = y;
			y = t;
		}
		if (strcmp(x->name, y->name) == 0)
			return sf_fail(w, -SF_EFORMAT,
				    "zip: entry %s is in the archive twice (entries %zu and %zu)",
				    qname(&qa, x->name), (size_t)(x - z->e),
				    (size_t)(y - z->e));
		return sf_fail(w, -SF_EFORMAT,
			    "zip: entries %s and %s differ only in case (torch's reader takes them for one)",
			    qname(&qa, x->name), qname(&qb, y->name));
	}
	return 0;
}

int sf_zip_open(const struct sf_input *in, const struct sf_zip_opts *opts,
		struct sf_zip **out, char *err, size_t errlen)
{
	uint32_t max_entries = opts && opts->max_entries ? opts->max_entries
							  : DEFAULT_MAX_ENTRIES;
	uint64_t max_cd = opts && opts->max_cd_bytes ? opts->max_cd_bytes
						     : DEFAULT_MAX_CD;
	struct zip_end end = { 0 };
	struct sf_where wh, *w = &wh;
	struct sf_zip *z;
	unsigned char *cd;
	int rc;

	*out = NULL;
	sf_where_init(w, err, errlen); /* one printable line (sf_fail) */
	rc = read_end(in, &end, w);
	if (rc < 0)
		return rc;
	if (end.cd_size > max_cd)
		return sf_fail(w, -SF_ETOOBIG,
			    "zip: central directory of %llu bytes exceeds the cap of %llu",
			    (unsigned long long)end.cd_size, (unsigned long long)max_cd);
	if (end.count > max_entries)
		return sf_fail(w, -SF_ETOOBIG,
			    "zip: %llu entries exceed the cap of %u",
			    (unsigned long long)end.count, (unsigned)max_entries);
	if (end.count > end.cd_size / CEN_LEN)
		return sf_fail(w, -SF_EFORMAT,
			    "zip: %llu entries cannot fit in a central directory of %llu bytes",
			    (unsigned long long)end.count, (unsigned long long)end.cd_size);

	z = calloc(1, sizeof(*z));
	if (!z)
		return sf_fail(w, -ENOMEM, "zip: out of memory");
	z->in = *in;
	/* cd_size <= max_cd (a size_t-sized cap on 64-bit hosts); +1 so
	 * that an empty directory still allocates. */
	if (end.cd_size > SIZE_MAX - 1) {
		rc = sf_fail(w, -SF_ETOOBIG, "zip: central directory too big");
		goto out_close;
	}
	cd = malloc((size_t)end.cd_size + 1);
	/* names: at most cd_size bytes, plus a NUL each (count <= cd_size / 46) */
	z->names = malloc((size_t)end.cd_size + (size_t)end.count + 1);
	if (!cd || !z->names) {
		rc = sf_fail(w, -ENOMEM, "zip: out of memory");
		goto out_free_cd;
	}
	rc = rd(in, cd, (size_t)end.cd_size, end.cd_off, w,
		"central directory");
	if (rc < 0)
		goto out_free_cd;
	rc = parse_cd(z, cd, end.cd_size, &end, max_entries, w);
	if (rc < 0)
		goto out_free_cd;
	rc = check_overlap(z, w);
	if (rc < 0)
		goto out_free_cd;
	if (z->n) {
		rc = index_names(z, w);
		if (rc < 0)
			goto out_free_cd;
	}
	free(cd);
	*out = z;
	return 0;

out_free_cd:
	free(cd);
out_close:
	sf_zip_close(z);
	return rc;
}

void sf_zip_close(struct sf_zip *z)
{
	if (!z)
		return;
	free(z->by_name);
	free(z->names);
	free(z->e);
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

const struct sf_zip_entry *sf_zip_find(const struct sf_zip *z,
				       const char *name)
{
	size_t lo = 0, hi;

	if (!z || !name)
		return NULL;
	hi = z->n;
	/* the first index whose folded name is >= name's: names are unique
	 * folded (index_names), so it is the only candidate */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (fold_cmp(z->by_name[mid]->name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < z->n && strcmp(z->by_name[lo]->name, name) == 0)
		return z->by_name[lo];
	return NULL;
}

int sf_zip_entry_input(const struct sf_zip *z, const struct sf_zip_entry *e,
		       struct sf_input *out)
{
	if (e->method != 0 || e->csize != e->size)
		return -SF_EFORMAT;
	/* inside z->in by sf_zip_open's checks; sf_input_sub checks again */
	return sf_input_sub(&z->in, e->data_off, e->csize, out);
}
