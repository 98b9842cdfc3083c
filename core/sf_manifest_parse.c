/*
 * sf_manifest_parse.c - the manifest parser of "shardfs/1": JSON text
 * (a buffer, or a file read through a window) straight into a validated
 * model, with no JSON tree in between (sf_jr.h).
 *
 * Every rule the format and the model's validator have is checked, in the
 * order the tree-based parser checked them, and with its messages: the
 * values of one object are gathered first (keys may come in any order),
 * then judged. A section ("tensors", "files", "objects") met before the
 * top-level fields it depends on ("format", "name", "world_size",
 * "block_size"), and an entry's "shards" met before its "dtype" and
 * "shape", are checked for syntax as they pass and parsed again from
 * their offset once those are known; the manifests shardfs writes put
 * them first, so they are read once.
 *
 * Bounds: the text (SF_MAX_MANIFEST_BYTES), entries (SF_MAX_TENSORS),
 * shards per entry (SF_MAX_SHARDS), dimensions (SF_MAX_NDIM); checksum
 * lists are bounded by the text. Duplicate keys are refused anywhere.
 */
#include "sf_manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_codec.h"
#include "sf_error.h"
#include "sf_jr.h"

bool sf_manifest_file_name_ok(const char *name, size_t len)
{
	size_t pl = sizeof(SF_SHARDFS_RANK_PREFIX) - 1;

	return !(len >= pl && memcmp(name, SF_SHARDFS_RANK_PREFIX, pl) == 0);
}

/* ------------------------------------------------------------------ */
/* gathered values                                                     */

enum raw_state { RAW_MISSING = 0, RAW_OK, RAW_BAD };

/* A value that must be a non-negative integer. */
struct raw_int {
	enum raw_state state;    /* RAW_BAD: present, something else */
	uint64_t v;
};

/* A value that must be an array of non-negative integers. */
struct raw_arr {
	enum raw_state state;    /* RAW_BAD: present, not an array */
	size_t n;                /* elements */
	size_t bad;              /* first element that is not one, or SIZE_MAX */
	uint64_t v[SF_MAX_NDIM]; /* the first SF_MAX_NDIM elements */
};

/* A value that must be a string (a copy, owned by the parse). */
struct raw_str {
	enum raw_state state;
	char *s;                 /* RAW_OK: len bytes (NUL-terminated) */
	size_t len, cap;
};

/* The checksum list of a shard. */
struct raw_sums {
	enum raw_state state;    /* RAW_BAD: present, not an array */
	size_t n;
	size_t bad;              /* first entry that is not 16 lowercase hex */
	uint64_t *v;             /* owned, reused: n entries */
	size_t cap;
};

/* One shard object. */
struct raw_shard {
	struct raw_int rank, file_offset, nbytes;
	struct raw_arr offsets, lengths, flat, strides;
	struct raw_str file;
	struct raw_sums sums;
	/* a shown manifest's coded shard only (sf_manifest_put_shard) */
	struct raw_str codec;
	struct raw_int stored_nbytes, decoded_offset, decoded_nbytes;
};

/* Scratch of a parse, reused from shard to shard and entry to entry. */
struct parse {
	struct sf_jr *r;
	struct sf_where *w;
	struct sf_model *m;
	bool partial;            /* one rank's part: no coverage check */
	bool shown;              /* a mount's manifest.json of any format:
	                          * checksums optional, codec fields read */
	struct raw_shard sh;
	struct raw_str dtype;
	struct raw_arr shape;
};

static void raw_str_free(struct raw_str *s)
{
	free(s->s);
	memset(s, 0, sizeof(*s));
}

static int raw_str_set(struct raw_str *d, const struct sf_jr_str *s)
{
	if (s->len + 1 > d->cap) {
		size_t cap = s->len + 1 < 64 ? 64 : s->len + 1;
		char *p = realloc(d->s, cap);

		if (!p)
			return -ENOMEM;
		d->s = p;
		d->cap = cap;
	}
	memcpy(d->s, s->s, s->len);
	d->s[s->len] = '\0';
	d->len = s->len;
	d->state = RAW_OK;
	return 0;
}

/* A non-negative JSON integer (jansson's json_integer_value >= 0). */
static bool num_u64(const struct sf_jr_num *n, uint64_t *out)
{
	if (!n->integer || (n->neg && n->u != 0))
		return false;
	*out = n->u;
	return true;
}

/* Read the next value into an integer field. */
static int read_int(struct sf_jr *r, struct raw_int *d)
{
	struct sf_jr_num n;
	int k = sf_jr_peek(r);

	if (k < 0)
		return k;
	if (k != SF_JR_NUMBER) {
		d->state = RAW_BAD;
		return sf_jr_skip(r);
	}
	if (sf_jr_number(r, &n))
		return r->err;
	d->state = num_u64(&n, &d->v) ? RAW_OK : RAW_BAD;
	return 0;
}

/* Read the next value into an array-of-integers field. */
static int read_arr(struct sf_jr *r, struct raw_arr *d)
{
	struct sf_jr_it it;
	int k = sf_jr_peek(r), rc;

	d->n = 0;
	d->bad = SIZE_MAX;
	if (k < 0)
		return k;
	if (k != SF_JR_ARRAY) {
		d->state = RAW_BAD;
		return sf_jr_skip(r);
	}
	d->state = RAW_OK;
	rc = sf_jr_arr_begin(r, &it);
	while (rc == 0 && (rc = sf_jr_arr_next(r, &it)) == 1) {
		struct sf_jr_num n;
		uint64_t v = 0;

		k = sf_jr_peek(r);
		if (k < 0)
			return k;
		if (k == SF_JR_NUMBER) {
			rc = sf_jr_number(r, &n);
			if (!rc && !num_u64(&n, &v) && d->bad == SIZE_MAX)
				d->bad = d->n;
		} else {
			rc = sf_jr_skip(r);
			if (d->bad == SIZE_MAX)
				d->bad = d->n;
		}
		if (d->n < SF_MAX_NDIM)
			d->v[d->n] = v;
		d->n++;
	}
	return rc;
}

/* Read the next value into a string field. */
static int read_str(struct sf_jr *r, struct raw_str *d)
{
	struct sf_jr_str s;
	int k = sf_jr_peek(r);

	if (k < 0)
		return k;
	if (k != SF_JR_STRING) {
		d->state = RAW_BAD;
		return sf_jr_skip(r);
	}
	if (sf_jr_string(r, &s))
		return r->err;
	return raw_str_set(d, &s) ? (r->err = -ENOMEM) : 0;
}

/* Read the next value into the checksum list. */
static int read_sums(struct sf_jr *r, struct raw_sums *d)
{
	struct sf_jr_it it;
	uint64_t v;
	int k = sf_jr_peek(r), rc;

	d->n = 0;
	d->bad = SIZE_MAX;
	if (k < 0)
		return k;
	if (k != SF_JR_ARRAY) {
		d->state = RAW_BAD;
		return sf_jr_skip(r);
	}
	d->state = RAW_OK;
	rc = sf_jr_arr_begin(r, &it);
	while (rc == 0) {
		struct sf_jr_str s;
		size_t got;

		/* bounded by the text: each entry takes at least 2 bytes */
		if (d->n == d->cap &&
		    sf_array_grow(&d->v, d->n, &d->cap, sizeof(*d->v), 16, 0))
			return r->err = -ENOMEM;
		/* the common case: runs of well-formed checksums */
		got = sf_jr_arr_hex64s(r, &it, d->v + d->n, d->cap - d->n);
		d->n += got;
		if (got)
			continue;
		rc = sf_jr_arr_next(r, &it);
		if (rc <= 0)
			break;
		rc = 0;
		v = 0;
		k = sf_jr_peek(r);
		if (k < 0)
			return k;
		if (k == SF_JR_STRING) {
			rc = sf_jr_string(r, &s);
			if (!rc && sf_xxh3_parse(s.s, s.len, &v) < 0 && d->bad == SIZE_MAX)
				d->bad = d->n;
		} else {
			rc = sf_jr_skip(r);
			if (d->bad == SIZE_MAX)
				d->bad = d->n;
		}
		if (rc)
			return rc;
		d->v[d->n++] = v;
	}
	return rc;
}

/* A known key (bit) seen twice, or an unknown key (bit < 0) seen twice in
 * keys: duplicate. */
static int key_seen(struct parse *p, struct sf_jr_keys *keys, unsigned *seen,
		    int bit, const struct sf_jr_str *key)
{
	if (bit >= 0) {
		if (*seen & (1u << bit))
			return sf_jr_fail(p->r, "duplicate object key");
		*seen |= 1u << bit;
		return 0;
	}
	switch (sf_jr_keys_add(keys, key->s, key->len)) {
	case 0:
		return 0;
	case 1:
		return sf_jr_fail(p->r, "duplicate object key");
	default:
		return p->r->err = -ENOMEM;
	}
}

#define KEY_IS(k, lit) ((k)->len == sizeof(lit) - 1 && \
			  memcmp((k)->s, lit, sizeof(lit) - 1) == 0)
static bool key_is(const struct sf_jr_str *k, const char *name)
{
	size_t n = strlen(name);

	return k->len == n && memcmp(k->s, name, n) == 0;
}

/* ------------------------------------------------------------------ */
/* judging gathered values (the tree parser's checks and messages)     */

static int want_int(const struct sf_where *w, const struct raw_int *v,
		    const char *key)
{
	if (v->state == RAW_MISSING)
		return sf_fail(w, -SF_EMANIFEST, "missing \"%s\"", key);
	if (v->state == RAW_BAD)
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" must be a non-negative integer", key);
	return 0;
}

static int want_arr(const struct sf_where *w, const struct raw_arr *v,
		    const char *key, size_t n, const char *what)
{
	if (v->state == RAW_BAD)
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" must be an array", key);
	if (v->n != n)
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" has %zu entries, expected %zu (%s)",
			       key, v->n, n, what);
	if (v->bad < n)
		return sf_fail(w, -SF_EMANIFEST, "\"%s\"[%zu] must be a non-negative integer",
			       key, v->bad);
	return 0;
}

static int want_str(const struct sf_where *w, const struct raw_str *v,
		    const char *key)
{
	if (v->state == RAW_MISSING)
		return sf_fail(w, -SF_EMANIFEST, "missing \"%s\"", key);
	if (v->state == RAW_BAD)
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" must be a string", key);
	if (memchr(v->s, '\0', v->len))
		return sf_fail(w, -SF_EMANIFEST, "\"%s\" contains a NUL byte", key);
	return 0;
}

/* A shown manifest's coded shard: "codec", "stored_nbytes",
 * "decoded_offset" and "decoded_nbytes" into *s; nothing without "codec". */
static int shard_codec(const struct sf_where *w, struct raw_shard *r,
		       struct sf_shard *s)
{
	static const enum sf_codec codecs[] = { SF_CODEC_ZSTD, SF_CODEC_UNREADABLE };
	int rc;

	if (r->codec.state == RAW_MISSING)
		return 0;
	rc = want_str(w, &r->codec, "codec");
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < sizeof(codecs) / sizeof(codecs[0]); i++)
		if (strcmp(r->codec.s, sf_codec_name(codecs[i])) == 0)
			s->codec = codecs[i];
	if (s->codec == SF_CODEC_NONE)
		return sf_fail(w, -SF_EMANIFEST, "unknown \"codec\"");
	rc = want_int(w, &r->stored_nbytes, "stored_nbytes");
	if (rc == 0)
		rc = want_int(w, &r->decoded_offset, "decoded_offset");
	if (rc == 0)
		rc = want_int(w, &r->decoded_nbytes, "decoded_nbytes");
	if (rc < 0)
		return rc;
	s->stored_len = r->stored_nbytes.v;
	s->decoded_off = r->decoded_offset.v;
	s->decoded_len = r->decoded_nbytes.v;
	return 0;
}

/* Judge the gathered shard of t and append it. */
static int shard_finish(struct parse *p, struct sf_tensor *t)
{
	const struct sf_where *w = p->w;
	struct raw_shard *r = &p->sh;
	struct sf_shard s = { 0 };
	uint64_t none = 0;
	const char *why;
	int rc;

	rc = want_int(w, &r->rank, "rank");
	if (rc < 0)
		return rc;
	if (r->rank.v >= p->m->world_size)
		return sf_fail(w, -SF_EMANIFEST,
			       "\"rank\" = %" PRIu64 " is not below \"world_size\" = %" PRIu32,
			       r->rank.v, p->m->world_size);
	s.rank = (uint32_t)r->rank.v;
	if (r->flat.state && (r->offsets.state || r->lengths.state))
		return sf_fail(w, -SF_EMANIFEST,
			       "has both \"flat\" and \"offsets\"/\"lengths\"");
	if (!r->flat.state && !(r->offsets.state && r->lengths.state))
		return sf_fail(w, -SF_EMANIFEST,
			       "needs \"offsets\" and \"lengths\", or \"flat\"");
	if (r->flat.state) {
		rc = want_arr(w, &r->flat, "flat", 2, "byte offset, byte length");
		if (rc < 0)
			return rc;
		s.flat = true;
		s.flat_off = r->flat.v[0];
		s.flat_len = r->flat.v[1];
	} else {
		rc = want_arr(w, &r->offsets, "offsets", t->ndim, "one per dimension");
		if (rc < 0)
			return rc;
		rc = want_arr(w, &r->lengths, "lengths", t->ndim, "one per dimension");
		if (rc < 0)
			return rc;
		s.off = r->offsets.v;
		s.len = r->lengths.v;
	}
	rc = want_str(w, &r->file, "file");
	if (rc < 0)
		return rc;
	why = sf_model_has_file(p->m, r->file.s) ? NULL :
	      sf_name_problem(r->file.s, r->file.len, false, true);
	if (why)
		return sf_fail(w, -SF_EMANIFEST, "\"file\" %s", why);
	s.file = r->file.s;
	rc = want_int(w, &r->file_offset, "file_offset");
	if (rc < 0)
		return rc;
	s.file_offset = r->file_offset.v;
	rc = want_int(w, &r->nbytes, "nbytes");
	if (rc < 0)
		return rc;
	s.nbytes = r->nbytes.v;
	if (r->strides.state) {
		if (s.flat)
			return sf_fail(w, -SF_EMANIFEST, "a flat range has no \"strides\"");
		rc = want_arr(w, &r->strides, "strides", t->ndim, "one per dimension");
		if (rc < 0)
			return rc;
		s.strides = r->strides.v;
	}
	if (p->shown) {
		rc = shard_codec(w, r, &s);
		if (rc < 0)
			return rc;
	}
	if (r->sums.state == RAW_MISSING && !p->partial && !p->shown)
		return sf_fail(w, -SF_EMANIFEST, "missing \"xxh3\"");
	if (r->sums.state == RAW_BAD)
		return sf_fail(w, -SF_EMANIFEST, "\"xxh3\" must be an array");
	if (r->sums.state == RAW_OK) {
		if (r->sums.bad < r->sums.n)
			return sf_fail(w, -SF_EMANIFEST,
				       "\"xxh3\"[%zu] must be 16 lowercase hex digits",
				       r->sums.bad);
		/* never NULL: a shard with "xxh3" is verified, even an empty
		 * list (which the count check refuses for a non-empty payload) */
		s.nblocks = r->sums.n;
		s.xxh3 = r->sums.n ? r->sums.v : &none;
	}
	rc = sf_shard_check(w, p->m, t, &s);
	if (rc < 0)
		return rc == -SF_ERANGE ? -SF_EMANIFEST : rc;
	return sf_model_put_shard(p->m, t, &s);
}

/* ------------------------------------------------------------------ */
/* shards, entries, sections                                           */

enum { K_RANK, K_OFFSETS, K_LENGTHS, K_FLAT, K_FILE, K_FILE_OFFSET, K_NBYTES,
       K_STRIDES, K_XXH3, K_CODEC, K_STORED_NBYTES, K_DECODED_OFFSET,
       K_DECODED_NBYTES };

/* The K_ of a shard object's key, or -1. */
static int shard_key(const struct sf_jr_str *k)
{
	switch (k->len) {
	case 4:
		return KEY_IS(k, "rank") ? K_RANK : KEY_IS(k, "flat") ? K_FLAT :
		       KEY_IS(k, "file") ? K_FILE : KEY_IS(k, "xxh3") ? K_XXH3 : -1;
	case 6:
		return KEY_IS(k, "nbytes") ? K_NBYTES : -1;
	case 7:
		return KEY_IS(k, "offsets") ? K_OFFSETS : KEY_IS(k, "lengths") ?
		       K_LENGTHS : KEY_IS(k, "strides") ? K_STRIDES : -1;
	case 5:
		return KEY_IS(k, "codec") ? K_CODEC : -1;
	case 11:
		return KEY_IS(k, "file_offset") ? K_FILE_OFFSET : -1;
	case 13:
		return KEY_IS(k, "stored_nbytes") ? K_STORED_NBYTES : -1;
	case 14:
		return KEY_IS(k, "decoded_offset") ? K_DECODED_OFFSET :
		       KEY_IS(k, "decoded_nbytes") ? K_DECODED_NBYTES : -1;
	default:
		return -1;
	}
}

/* Parse one shard object of t (its index in w->shard). */
static int parse_shard(struct parse *p, struct sf_tensor *t)
{
	struct sf_jr *r = p->r;
	struct raw_shard *sh = &p->sh;
	struct sf_jr_keys other = { 0 };
	struct sf_jr_str key;
	struct sf_jr_it it;
	unsigned seen = 0;
	int k, rc;

	k = sf_jr_peek(r);
	if (k < 0)
		return k;
	if (k != SF_JR_OBJECT)
		return sf_fail(p->w, -SF_EMANIFEST, "must be an object");
	sh->rank.state = sh->file_offset.state = sh->nbytes.state = RAW_MISSING;
	sh->offsets.state = sh->lengths.state = sh->flat.state = RAW_MISSING;
	sh->strides.state = sh->file.state = sh->sums.state = RAW_MISSING;
	sh->codec.state = sh->stored_nbytes.state = RAW_MISSING;
	sh->decoded_offset.state = sh->decoded_nbytes.state = RAW_MISSING;
	rc = sf_jr_obj_begin(r, &it);
	while (rc == 0 && (rc = sf_jr_obj_next(r, &it, &key)) == 1) {
		int f = shard_key(&key);

		rc = key_seen(p, &other, &seen, f, &key);
		if (rc)
			break;
		switch (f) {
		case K_RANK: rc = read_int(r, &sh->rank); break;
		case K_FILE_OFFSET: rc = read_int(r, &sh->file_offset); break;
		case K_NBYTES: rc = read_int(r, &sh->nbytes); break;
		case K_OFFSETS: rc = read_arr(r, &sh->offsets); break;
		case K_LENGTHS: rc = read_arr(r, &sh->lengths); break;
		case K_FLAT: rc = read_arr(r, &sh->flat); break;
		case K_STRIDES: rc = read_arr(r, &sh->strides); break;
		case K_FILE: rc = read_str(r, &sh->file); break;
		case K_XXH3: rc = read_sums(r, &sh->sums); break;
		/* the codec fields only mean something in a shown manifest */
		case K_CODEC:
			rc = p->shown ? read_str(r, &sh->codec) : sf_jr_skip(r);
			break;
		case K_STORED_NBYTES:
			rc = p->shown ? read_int(r, &sh->stored_nbytes) : sf_jr_skip(r);
			break;
		case K_DECODED_OFFSET:
			rc = p->shown ? read_int(r, &sh->decoded_offset) : sf_jr_skip(r);
			break;
		case K_DECODED_NBYTES:
			rc = p->shown ? read_int(r, &sh->decoded_nbytes) : sf_jr_skip(r);
			break;
		default: rc = sf_jr_skip(r); break;
		}
	}
	sf_jr_keys_free(&other);
	if (rc < 0)
		return rc;
	return shard_finish(p, t);
}

/* Parse the "shards" array of t at the reader's position. */
static int parse_shards(struct parse *p, struct sf_tensor *t)
{
	struct sf_jr_it it;
	size_t i = 0;
	int k = sf_jr_peek(p->r), rc;

	if (k < 0)
		return k;
	if (k != SF_JR_ARRAY)
		return sf_fail(p->w, -SF_EMANIFEST, "\"shards\" must be an array");
	rc = sf_jr_arr_begin(p->r, &it);
	while (rc == 0 && (rc = sf_jr_arr_next(p->r, &it)) == 1) {
		if (i >= SF_MAX_SHARDS)
			return sf_fail(p->w, -SF_ETOOBIG, "more than %u shards",
				       SF_MAX_SHARDS);
		p->w->shard = (long)i++;
		rc = parse_shard(p, t);
	}
	p->w->shard = -1;
	/* the array grew by doubling: give back what it will never use */
	if (rc == 0 && t->cap_shards > t->nshards) {
		struct sf_shard *s = t->nshards ?
			realloc(t->shards, t->nshards * sizeof(*s)) : NULL;

		if (s || !t->nshards) {
			if (!t->nshards)
				free(t->shards);
			t->shards = s;
			t->cap_shards = t->nshards;
		}
	}
	return rc;
}

/* The entry's checks once "dtype" and "shape" are gathered: append it. */
static int entry_start(struct parse *p, enum sf_entry_kind kind,
		       const char *name, size_t len, struct sf_tensor **t)
{
	const struct sf_where *w = p->w;
	enum sf_dtype dtype;
	unsigned ndim;
	int rc;

	rc = want_str(w, &p->dtype, "dtype");
	if (rc < 0)
		return rc;
	dtype = sf_dtype_from_name(p->dtype.s, p->dtype.len);
	if (dtype == SF_DT_INVALID) {
		char q[sizeof(w->qname)];

		sf_quote_name(q, p->dtype.s, p->dtype.len);
		return sf_fail(w, -SF_EMANIFEST, "unknown \"dtype\" %s", q);
	}
	if (p->shape.state == RAW_MISSING)
		return sf_fail(w, -SF_EMANIFEST, "missing \"shape\"");
	if (p->shape.state == RAW_BAD)
		return sf_fail(w, -SF_EMANIFEST, "\"shape\" must be an array");
	if (p->shape.n > SF_MAX_NDIM)
		return sf_fail(w, -SF_ETOOBIG, "\"shape\" has %zu dimensions, more than %d",
			       p->shape.n, SF_MAX_NDIM);
	ndim = (unsigned)p->shape.n;
	rc = want_arr(w, &p->shape, "shape", ndim, "");
	if (rc < 0)
		return rc;
	if (kind == SF_ENTRY_FILE && !p->shown && !sf_manifest_file_name_ok(name, len))
		return sf_fail(w, -SF_EMANIFEST,
			       "name starts with \"" SF_SHARDFS_RANK_PREFIX "\" (payload directories)");
	return sf_model_append_checked(p->m, w, kind, name, len, dtype, ndim,
				       p->shape.v, t);
}

/* Parse the shards of t from a copy of the reader positioned at off. */
static int parse_shards_at(struct parse *p, struct sf_tensor *t, uint64_t off)
{
	struct sf_jr sub, *top = p->r;
	struct sf_input in;
	int rc;

	rc = sf_input_sub(&top->in, off, top->in.size - off, &in);
	if (rc)
		return rc;
	rc = sf_jr_init(&sub, &in, top->msg, top->msglen);
	if (rc)
		return rc;
	p->r = &sub;
	rc = parse_shards(p, t);
	p->r = top;
	sf_jr_free(&sub);
	return rc;
}

enum { E_DTYPE, E_SHAPE, E_SHARDS };

/* Parse one entry: key name (len bytes, copied), value at the reader. */
static int parse_entry(struct parse *p, enum sf_entry_kind kind,
		       const char *name, size_t len)
{
	struct sf_jr *r = p->r;
	struct sf_tensor *t = NULL;
	struct sf_jr_keys other = { 0 };
	struct sf_jr_str key;
	struct sf_jr_it it;
	uint64_t shards_at = 0;
	unsigned seen = 0;
	int k, rc;

	sf_where_set(p->w, sf_entry_kind_name(kind), name, len);
	k = sf_jr_peek(r);
	if (k < 0)
		return k;
	if (k != SF_JR_OBJECT)
		return sf_fail(p->w, -SF_EMANIFEST, "must be an object");
	p->dtype.state = RAW_MISSING;
	p->shape.state = RAW_MISSING;
	rc = sf_jr_obj_begin(r, &it);
	while (rc == 0 && (rc = sf_jr_obj_next(r, &it, &key)) == 1) {
		int f = key_is(&key, "dtype") ? E_DTYPE : key_is(&key, "shape") ?
			E_SHAPE : key_is(&key, "shards") ? E_SHARDS : -1;

		rc = key_seen(p, &other, &seen, f, &key);
		if (rc)
			break;
		if (f == E_DTYPE) {
			rc = read_str(r, &p->dtype);
		} else if (f == E_SHAPE) {
			rc = read_arr(r, &p->shape);
		} else if (f == E_SHARDS && (seen & 3u) == 3u) {
			/* the usual order: judge the entry, read its shards */
			rc = entry_start(p, kind, name, len, &t);
			if (!rc)
				rc = parse_shards(p, t);
		} else if (f == E_SHARDS) {
			k = sf_jr_peek(r);
			shards_at = sf_jr_offset(r);
			rc = k < 0 ? k : sf_jr_skip(r);
		} else {
			rc = sf_jr_skip(r);
		}
	}
	sf_jr_keys_free(&other);
	if (rc < 0)
		return rc;
	if (!t) {
		rc = entry_start(p, kind, name, len, &t);
		if (rc < 0)
			return rc;
		if (!(seen & (1u << E_SHARDS)))
			return sf_fail(p->w, -SF_EMANIFEST, "missing \"shards\"");
		rc = parse_shards_at(p, t, shards_at);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* Parse every entry of a section object at the reader's position. Its
 * keys are not checked for duplicates here: the model's names are (see
 * names_unique), without a second copy of 10^5 names. */
static int parse_section(struct parse *p, enum sf_entry_kind kind)
{
	struct sf_jr_str key;
	struct sf_jr_it it;
	int rc;

	rc = sf_jr_obj_begin(p->r, &it);
	while (rc == 0 && (rc = sf_jr_obj_next(p->r, &it, &key)) == 1) {
		char *name;
		size_t len = key.len;

		if (!(name = malloc(len + 1))) {
			rc = p->r->err = -ENOMEM;
			break;
		}
		memcpy(name, key.s, len);
		name[len] = '\0';
		rc = parse_entry(p, kind, name, len);
		free(name);
	}
	return rc;
}

static int entry_cmp(const void *a, const void *b)
{
	return strcmp(((const struct sf_tensor *)a)->name,
		      ((const struct sf_tensor *)b)->name);
}

/* Are the names of one list distinct (sorting it, as finish would)? A
 * name twice is a key twice in one section object: invalid JSON. */
static bool names_unique(struct sf_tensor *arr, size_t n)
{
	size_t i = 1;

	while (i < n && strcmp(arr[i - 1].name, arr[i].name) < 0)
		i++;
	if (i >= n)
		return true;
	qsort(arr, n, sizeof(*arr), entry_cmp);
	for (i = 1; i < n; i++)
		if (strcmp(arr[i - 1].name, arr[i].name) == 0)
			return false;
	return true;
}

/* Parse a section again from its offset (it came before the fields its
 * entries depend on). */
static int parse_section_at(struct parse *p, enum sf_entry_kind kind,
			    uint64_t off)
{
	struct sf_jr sub, *top = p->r;
	struct sf_input in;
	int rc;

	rc = sf_input_sub(&top->in, off, top->in.size - off, &in);
	if (rc)
		return rc;
	rc = sf_jr_init(&sub, &in, top->msg, top->msglen);
	if (rc)
		return rc;
	p->r = &sub;
	rc = parse_section(p, kind);
	p->r = top;
	sf_jr_free(&sub);
	return rc;
}

/* ------------------------------------------------------------------ */
/* the top level                                                       */

struct top {
	struct raw_str format, name;
	struct raw_int world, bsize;
	enum raw_state sec[3];   /* tensors, files, objects: RAW_BAD not an object */
	bool sec_later[3];       /* met before the header: parse from sec_at */
	uint64_t sec_at[3];
	bool header_done;        /* the header was judged and the model made */
};

/* Judge the header (format, name, world_size, block_size) and make the
 * model. */
static int header_finish(struct parse *p, struct top *tp)
{
	const struct sf_where *w = p->w;
	const char *why;
	int rc;

	rc = want_str(w, &tp->format, "format");
	if (rc < 0)
		return rc;
	if (p->shown) {
		/* a mount shows any format's name here */
		bool ok = tp->format.len && tp->format.len < SF_MAX_FORMAT;

		for (size_t i = 0; ok && i < tp->format.len; i++)
			ok = (unsigned char)tp->format.s[i] >= 0x20 &&
			     tp->format.s[i] != 0x7f;
		if (!ok)
			return sf_fail(w, -SF_EMANIFEST,
				       "\"format\" must be 1..%d printable bytes",
				       SF_MAX_FORMAT - 1);
	} else if (tp->format.len != strlen(SF_SHARDFS_FORMAT) ||
	    memcmp(tp->format.s, SF_SHARDFS_FORMAT, tp->format.len) != 0) {
		char q[sizeof(w->qname)];

		sf_quote_name(q, tp->format.s, tp->format.len);
		return sf_fail(w, -SF_EMANIFEST,
			       "\"format\" is %s, expected \"" SF_SHARDFS_FORMAT "\"", q);
	}
	rc = want_str(w, &tp->name, "name");
	if (rc < 0)
		return rc;
	why = sf_name_problem(tp->name.s, tp->name.len, true, true);
	if (why)
		return sf_fail(w, -SF_EMANIFEST, "\"name\" %s", why);
	rc = want_int(w, &tp->world, "world_size");
	if (rc < 0)
		return rc;
	if (tp->world.v < 1 || tp->world.v > SF_MAX_WORLD)
		return sf_fail(w, -SF_EMANIFEST, "\"world_size\" = %" PRIu64 " is not in 1..%u",
			       tp->world.v, SF_MAX_WORLD);
	rc = want_int(w, &tp->bsize, "block_size");
	if (rc < 0)
		return rc;
	if (tp->bsize.v < SF_MIN_BLOCK_SIZE || tp->bsize.v > SF_MAX_BLOCK_SIZE)
		return sf_fail(w, -SF_EMANIFEST, "\"block_size\" = %" PRIu64 " is not in %u..%u",
			       tp->bsize.v, SF_MIN_BLOCK_SIZE, SF_MAX_BLOCK_SIZE);
	p->m = sf_model_new(tp->name.s, (uint32_t)tp->world.v, tp->bsize.v);
	if (!p->m)
		return -ENOMEM;
	if (p->shown)
		sf_model_set_format(p->m, tp->format.s);
	tp->header_done = true;
	return 0;
}

static const char *const sec_names[3] = { "tensors", "files", "objects" };
static const enum sf_entry_kind sec_kinds[3] = {
	SF_ENTRY_TENSOR, SF_ENTRY_FILE, SF_ENTRY_OBJECT,
};

/* The top-level object, its header and the sections met in order. */
static int parse_top(struct parse *p, struct top *tp)
{
	struct sf_jr *r = p->r;
	struct sf_jr_keys keys = { 0 };
	struct sf_jr_str key;
	struct sf_jr_it it;
	int rc;

	rc = sf_jr_obj_begin(r, &it);
	while (rc == 0 && (rc = sf_jr_obj_next(r, &it, &key)) == 1) {
		int sec = -1, k;

		rc = sf_jr_keys_add(&keys, key.s, key.len);
		if (rc) {
			rc = rc == 1 ? sf_jr_fail(r, "duplicate object key") :
			     (r->err = -ENOMEM);
			break;
		}
		for (int i = 0; i < 3; i++)
			if (key_is(&key, sec_names[i]))
				sec = i;
		if (key_is(&key, "format")) {
			rc = read_str(r, &tp->format);
		} else if (key_is(&key, "name")) {
			rc = read_str(r, &tp->name);
		} else if (key_is(&key, "world_size")) {
			rc = read_int(r, &tp->world);
		} else if (key_is(&key, "block_size")) {
			rc = read_int(r, &tp->bsize);
		} else if (sec < 0) {
			rc = sf_jr_skip(r);
		} else if ((k = sf_jr_peek(r)) < 0) {
			rc = k;
		} else if (k != SF_JR_OBJECT) {
			tp->sec[sec] = RAW_BAD;
			rc = sf_jr_skip(r);
		} else if (tp->header_done ||
			   (tp->format.state && tp->name.state && tp->world.state &&
			    tp->bsize.state && (sec == 0 || tp->sec[0] == RAW_OK))) {
			/* the usual order: header, then tensors first */
			tp->sec[sec] = RAW_OK;
			rc = tp->header_done ? 0 : header_finish(p, tp);
			if (!rc)
				rc = parse_section(p, sec_kinds[sec]);
		} else {
			tp->sec[sec] = RAW_OK;
			tp->sec_later[sec] = true;
			tp->sec_at[sec] = sf_jr_offset(r);
			rc = sf_jr_skip(r);
		}
	}
	sf_jr_keys_free(&keys);
	return rc;
}

/*
 * A parse stopped at rc, a fault of an entry, before the reader saw the
 * whole text. The tree parser read all of it first, so invalid JSON later
 * on was the reason it gave: check the whole text for that now (only on
 * failure, so a good manifest is read once), else keep rc and its message.
 */
static int syntax_first(const struct sf_input *in, int rc, char *err,
			size_t errlen)
{
	char saved[512] = "";
	struct sf_jr r;
	int k;

	if (err && errlen)
		snprintf(saved, sizeof(saved), "%s", err);
	if (sf_jr_init(&r, in, err, errlen))
		return -ENOMEM;
	k = sf_jr_top(&r);
	if (k >= 0)
		k = sf_jr_skip(&r);
	if (k >= 0)
		k = sf_jr_end(&r);
	sf_jr_free(&r);
	if (k < 0)
		return k;
	if (err && errlen)
		snprintf(err, errlen, "%s", saved);
	return rc;
}

/* How parse_input reads its input. */
enum parse_mode {
	PARSE_MANIFEST,        /* a shardfs/1 manifest.json */
	PARSE_PART,            /* one rank's part: no coverage check */
	PARSE_SHOWN,           /* a mount's manifest.json, of any format */
};

static int parse_input(const struct sf_input *in, enum parse_mode mode,
		       struct sf_model **out, char *err, size_t errlen)
{
	struct top tp = { 0 };
	struct sf_where w;
	struct sf_jr r;
	bool partial = mode == PARSE_PART;
	struct parse p = { .r = &r, .w = &w, .partial = partial,
			   .shown = mode == PARSE_SHOWN };
	int rc, k;

	sf_where_init(&w, err, errlen);
	if (!out || !in)
		return -EINVAL;
	*out = NULL;
	if (in->size > SF_MAX_MANIFEST_BYTES)
		return sf_fail(&w, -SF_ETOOBIG, "manifest is %" PRIu64
			       " bytes, more than the limit of %u",
			       in->size, SF_MAX_MANIFEST_BYTES);
	rc = sf_jr_init(&r, in, err, errlen);
	if (rc)
		return rc;
	k = sf_jr_top(&r);
	if (k < 0) {
		rc = k;
		goto out_free;
	}
	if (k == SF_JR_ARRAY) {
		rc = sf_jr_skip(&r);
		if (!rc)
			rc = sf_jr_end(&r);
		if (!rc)
			rc = sf_fail(&w, -SF_EMANIFEST, "the manifest must be a JSON object");
		goto out_free;
	}
	rc = parse_top(&p, &tp);
	if (rc == 0)
		rc = sf_jr_end(&r);
	if (rc < 0) {
		/* a JSON error anywhere wins over what the entries broke */
		if (!r.err && rc != -ENOMEM)
			rc = syntax_first(in, rc, err, errlen);
		goto out_free;
	}
	if (!tp.header_done) {
		rc = header_finish(&p, &tp);
		if (rc < 0)
			goto out_free;
	}
	if (tp.sec[0] != RAW_OK) {
		rc = sf_fail(&w, -SF_EMANIFEST, "\"tensors\" must be an object");
		goto out_free;
	}
	for (int i = 1; i < 3; i++)
		if (tp.sec[i] == RAW_BAD) {
			rc = sf_fail(&w, -SF_EMANIFEST, "\"%s\" must be an object",
				     sec_names[i]);
			goto out_free;
		}
	for (int i = 0; i < 3; i++) {
		if (!tp.sec_later[i])
			continue;
		rc = parse_section_at(&p, sec_kinds[i], tp.sec_at[i]);
		if (rc < 0)
			goto out_free;
	}
	if (!names_unique(p.m->tensors, p.m->ntensors) ||
	    !names_unique(p.m->files, p.m->nfiles) ||
	    !names_unique(p.m->objects, p.m->nobjects)) {
		/* the reader's full check finds the key and says where */
		rc = syntax_first(in, sf_fail(&w, -SF_EMANIFEST, "duplicate object key"),
				  err, errlen);
		goto out_free;
	}
	rc = partial ? sf_model_finish_part(p.m, err, errlen) :
		       sf_model_finish(p.m, err, errlen);
	if (rc < 0)
		goto out_free;
	*out = p.m;
	p.m = NULL;

out_free:
	sf_model_destroy(p.m);
	sf_jr_free(&r);
	raw_str_free(&tp.format);
	raw_str_free(&tp.name);
	raw_str_free(&p.sh.file);
	raw_str_free(&p.sh.codec);
	raw_str_free(&p.dtype);
	free(p.sh.sums.v);
	return rc;
}

int sf_manifest_parse_input(const struct sf_input *in, bool partial,
			    struct sf_model **out, char *err, size_t errlen)
{
	return parse_input(in, partial ? PARSE_PART : PARSE_MANIFEST, out, err,
			   errlen);
}

int sf_manifest_parse(const char *json, size_t len, struct sf_model **out,
		      char *err, size_t errlen)
{
	struct sf_input in = sf_input_mem(json ? json : "", len);

	if (!json && len)
		return -EINVAL;
	return parse_input(&in, PARSE_MANIFEST, out, err, errlen);
}

int sf_manifest_parse_part(const char *json, size_t len,
			   struct sf_model **out, char *err, size_t errlen)
{
	struct sf_input in = sf_input_mem(json ? json : "", len);

	if (!json && len)
		return -EINVAL;
	return parse_input(&in, PARSE_PART, out, err, errlen);
}

int sf_manifest_parse_shown(const char *json, size_t len, struct sf_model **out,
			    char *err, size_t errlen)
{
	struct sf_input in = sf_input_mem(json ? json : "", len);

	if (!json && len)
		return -EINVAL;
	return parse_input(&in, PARSE_SHOWN, out, err, errlen);
}
