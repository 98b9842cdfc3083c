/*
 * sf_model.c - the checkpoint model: building, validating and finding
 * entries (see sf_model.h); coverage is in sf_cover.c.
 *
 * Invariants of a model that left sf_model_finish() successfully:
 *   - every name and path passed sf_name_problem() (valid UTF-8, no
 *     control characters, no NUL, no empty/"."/".." components, bounded
 *     lengths);
 *   - tensors[], files[] and objects[] are each sorted by strcmp(name)
 *     without duplicates, and no tensor (or object) name is a directory
 *     prefix of another ("a", "a/b");
 *   - every entry's nbytes fits in off_t, and so do every shape entry,
 *     box, flat range and file_offset + nbytes, so every number dumps as a
 *     JSON integer and every payload range can be pread(); so do the
 *     tensors' bytes together plus the largest safetensors header, so
 *     stat can show model.safetensors and every npy/ file;
 *   - every shard lies inside its entry, its nbytes equals the bytes of its
 *     box or flat range (or, with strides, their span), and it carries
 *     sf_nblocks(nbytes, block_size) checksums or none;
 *   - every byte of every entry is covered by at least one shard.
 * The builder checks the per-entry and per-shard rules as it goes; the
 * global ones (order, duplicates, prefixes, coverage) wait for finish.
 *
 * Error messages are one line and name the field: the entry, the shard
 * index and the key (e.g. `tensor "wq": shard 3: "lengths"[1] ...`).
 * Names from the input are quoted with escapes and truncated before they
 * reach a message, so messages stay printable and bounded.
 */
#include "sf_model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"

#define STR_(x) #x
#define STR(x) STR_(x)

/* Largest value of off_t: bound for sizes and payload ranges. */
#define SF_MAX_OFF ((uint64_t)INT64_MAX)

/* ------------------------------------------------------------------ */
/* names                                                               */

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF),
 * the same rule jansson applies, so every accepted name can be dumped. */
static bool utf8_valid(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + len;
	while (p < end) {
		unsigned c = *p++;
		unsigned need;
		uint32_t cp;
		if (c < 0x80)
			continue;
		if (c >= 0xc2 && c <= 0xdf) {
			need = 1;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			cp = c & 0x07;
		} else {
			return false;
		}
		if ((size_t)(end - p) < need)
			return false;
		for (unsigned i = 0; i < need; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (p[i] & 0x3f);
		}
		p += need;
		if ((need == 2 && cp < 0x800) || (need == 3 && cp < 0x10000) ||
		    cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
	}
	return true;
}

/* Names are '/'-separated components; single: exactly one component;
 * allow_at: '@' is allowed (it is reserved for slices in tensor names). */
const char *sf_name_problem(const char *s, size_t len, bool single,
			    bool allow_at)
{
	if (len == 0)
		return "is empty";
	if (len > SF_MAX_NAME)
		return "is longer than " STR(SF_MAX_NAME) " bytes";
	size_t start = 0;
	for (size_t i = 0; i <= len; i++) {
		if (i < len) {
			unsigned char c = (unsigned char)s[i];
			if (c == '\0')
				return "contains a NUL byte";
			if (c < 0x20 || c == 0x7f)
				return "contains a control character";
			if (c == '@' && !allow_at)
				return "contains '@' (reserved for slices)";
			if (c != '/')
				continue;
			if (single)
				return "contains '/'";
		}
		size_t clen = i - start;
		if (clen == 0)
			return "has an empty component";
		if ((clen == 1 && s[start] == '.') ||
		    (clen == 2 && s[start] == '.' && s[start + 1] == '.'))
			return "has a \".\" or \"..\" component";
		if (clen > SF_MAX_COMPONENT)
			return "has a component longer than " STR(SF_MAX_COMPONENT) " bytes";
		start = i + 1;
	}
	if (!utf8_valid(s, len))
		return "is not valid UTF-8";
	return NULL;
}

/* Names a root file may not take: the views the mount shows beside it
 * (SF_VIEW_*) and hidden names. */
static const char *file_name_problem(const char *s, size_t len)
{
	const char *why = sf_name_problem(s, len, true, true);

	if (why)
		return why;
	if (sf_view_name_reserved(s, len))
		return "is reserved for a view of the mount";
	if (s[0] == '.')
		return "starts with '.'";
	return NULL;
}

bool sf_name_valid(const char *name)
{
	return name && !sf_name_problem(name, strnlen(name, SF_MAX_NAME + 1),
				     false, false);
}

bool sf_relpath_valid(const char *path)
{
	return path && !sf_name_problem(path, strnlen(path, SF_MAX_NAME + 1),
				     false, true);
}


/* ------------------------------------------------------------------ */
/* memory: the pool the shards point into                              */

/*
 * Bump allocation in chunks that never move (a shard's pointers stay
 * valid), doubling from POOL_FIRST to POOL_MAX bytes; file names interned
 * in an open-addressing table, so the shards of one file share its string
 * (and its name is checked once). Freed only with the model.
 */
#define POOL_FIRST (16u << 10)
#define POOL_MAX (8u << 20)

struct pool_chunk {
	struct pool_chunk *next;
	size_t used, cap;         /* bytes of data */
	uint64_t data[];          /* 8-byte aligned */
};

struct pool_name {
	uint64_t hash;
	const char *s;            /* in the pool, NUL-terminated */
};

struct sf_model_pool {
	struct pool_chunk *head;  /* the chunk being filled, then older ones */
	size_t next_cap;          /* bytes of the next chunk */
	struct pool_name *names;  /* interned file names; NULL s: free */
	size_t nnames, nslots;    /* nslots: 0 or a power of two >= 2 nnames */
};

static void pool_free(struct sf_model_pool *p)
{
	if (!p)
		return;
	while (p->head) {
		struct pool_chunk *c = p->head;

		p->head = c->next;
		free(c);
	}
	free(p->names);
	free(p);
}

/* n bytes, 8-byte aligned, from m's pool; NULL on ENOMEM. */
static void *pool_alloc(struct sf_model *m, size_t n)
{
	struct sf_model_pool *p = m->pool;
	struct pool_chunk *c;
	size_t need = (n + 7) & ~(size_t)7, cap;

	if (!p) {
		p = m->pool = calloc(1, sizeof(*p));
		if (!p)
			return NULL;
		p->next_cap = POOL_FIRST;
	}
	c = p->head;
	if (!c || c->cap - c->used < need) {
		if (need > SIZE_MAX / 2 - sizeof(*c))
			return NULL;
		cap = p->next_cap > need ? p->next_cap : need;
		c = malloc(sizeof(*c) + cap);
		if (!c)
			return NULL;
		c->used = 0;
		c->cap = cap;
		c->next = p->head;
		p->head = c;
		if (p->next_cap < POOL_MAX)
			p->next_cap *= 2;
	}
	void *r = (char *)c->data + c->used;

	c->used += need;
	return r;
}

static const uint64_t *pool_u64s(struct sf_model *m, const uint64_t *v, size_t n)
{
	uint64_t *d;

	if (n > SIZE_MAX / sizeof(*d) || !(d = pool_alloc(m, n ? n * sizeof(*d) : 1)))
		return NULL;
	memcpy(d, v, n * sizeof(*d));
	return d;
}

/* The slot of name s (hash h) in p's table: its entry, or the free slot
 * where it would go. nslots > 0. */
static struct pool_name *name_slot(const struct sf_model_pool *p, uint64_t h,
				   const char *s)
{
	size_t mask = p->nslots - 1, at = (size_t)h & mask;

	while (p->names[at].s &&
	       (p->names[at].hash != h || strcmp(p->names[at].s, s) != 0))
		at = (at + 1) & mask;
	return &p->names[at];
}

bool sf_model_has_file(const struct sf_model *m, const char *s)
{
	const struct sf_model_pool *p = m->pool;

	return p && p->nslots && name_slot(p, sf_xxh3(s, strlen(s)), s)->s;
}

/* s interned in m's pool; NULL on ENOMEM. */
static char *pool_name(struct sf_model *m, const char *s)
{
	struct sf_model_pool *p;
	size_t len = strlen(s);
	uint64_t h = sf_xxh3(s, len);
	struct pool_name *e;
	char *d;

	if (!m->pool && !pool_alloc(m, 0))
		return NULL;
	p = m->pool;
	if (2 * (p->nnames + 1) > p->nslots) {
		size_t ns = p->nslots ? 2 * p->nslots : 16;
		struct pool_name *old = p->names, *t = calloc(ns, sizeof(*t));

		if (!t)
			return NULL;
		p->names = t;
		for (size_t i = 0, on = p->nslots; i < on; i++)
			if (old[i].s) {
				p->nslots = ns;
				*name_slot(p, old[i].hash, old[i].s) = old[i];
			}
		p->nslots = ns;
		free(old);
	}
	e = name_slot(p, h, s);
	if (e->s)
		return (char *)e->s;
	d = pool_alloc(m, len + 1);
	if (!d)
		return NULL;
	memcpy(d, s, len + 1);
	e->hash = h;
	e->s = d;
	p->nnames++;
	return d;
}

void sf_shard_clear(struct sf_shard *s)
{
	free(s->file);
	free(s->strides);
	free(s->xxh3);
	free((void *)s->off);
	s->file = NULL;
	s->strides = NULL;
	s->xxh3 = NULL;
	s->off = s->len = NULL;
}

int sf_shard_set_box(struct sf_shard *s, const struct sf_box *b)
{
	uint64_t *v = malloc((b->ndim ? 2 * b->ndim : 1) * sizeof(*v));

	if (!v)
		return -ENOMEM;
	memcpy(v, b->off, b->ndim * sizeof(*v));
	memcpy(v + b->ndim, b->len, b->ndim * sizeof(*v));
	free((void *)s->off);
	s->flat = false;
	s->off = v;
	s->len = v + b->ndim;
	return 0;
}

uint64_t *sf_model_copy_sums(struct sf_model *m, const uint64_t *sums,
			     uint64_t n)
{
	return n <= SIZE_MAX / sizeof(uint64_t) ?
	       (uint64_t *)pool_u64s(m, sums, (size_t)n) : NULL;
}

void sf_model_free_shards(struct sf_shard *shards, size_t n)
{
	(void)n; /* a model's shards own nothing: their data is the pool's */
	free(shards);
}

static void tensor_free(struct sf_tensor *t)
{
	sf_model_free_shards(t->shards, t->nshards);
	free(t->replicas);
	free(t->name);
}

static void entries_free(struct sf_tensor *arr, size_t n)
{
	for (size_t i = 0; i < n; i++)
		tensor_free(&arr[i]);
	free(arr);
}

void sf_model_destroy(struct sf_model *m)
{
	if (!m)
		return;
	entries_free(m->tensors, m->ntensors);
	entries_free(m->files, m->nfiles);
	entries_free(m->objects, m->nobjects);
	pool_free(m->pool);
	free(m->name);
	free(m);
}

/* ------------------------------------------------------------------ */
/* validation                                                          */

static const char *const kind_names[] = {
	[SF_ENTRY_TENSOR] = "tensor",
	[SF_ENTRY_FILE] = "file",
	[SF_ENTRY_OBJECT] = "object",
};

const char *sf_entry_kind_name(enum sf_entry_kind kind)
{
	return kind_names[kind];
}

/* Check an entry's name, dtype and shape; on success *nbytes is its byte
 * size. -SF_EMANIFEST, -SF_ETOOBIG. */
static int entry_validate(const struct sf_where *w, enum sf_entry_kind kind,
			  const char *name, size_t len, enum sf_dtype dtype,
			  unsigned ndim, const uint64_t *shape,
			  uint64_t *nbytes)
{
	const char *why = kind == SF_ENTRY_FILE ? file_name_problem(name, len)
						: sf_name_problem(name, len, false, false);
	if (why)
		return sf_fail(w, -SF_EMANIFEST, "name %s", why);
	if (sf_dtype_size(dtype) == 0)
		return sf_fail(w, -SF_EMANIFEST, "invalid dtype");
	if (ndim > SF_MAX_NDIM)
		return sf_fail(w, -SF_ETOOBIG, "\"shape\" has %u dimensions, more than %d",
			       ndim, SF_MAX_NDIM);
	if (kind != SF_ENTRY_TENSOR && (dtype != SF_DT_U8 || ndim != 1))
		return sf_fail(w, -SF_EMANIFEST,
			       "a %s must have \"dtype\" U8 and one dimension",
			       kind == SF_ENTRY_FILE ? "root file" : "object");
	for (unsigned d = 0; d < ndim; d++)
		if (shape[d] > SF_MAX_OFF)
			return sf_fail(w, -SF_ETOOBIG, "\"shape\"[%u] = %" PRIu64 " is too large",
				       d, shape[d]);
	if (sf_shape_nbytes(ndim, shape, sf_dtype_size(dtype), nbytes) < 0 ||
	    *nbytes > SF_MAX_OFF)
		return sf_fail(w, -SF_ETOOBIG,
			       "\"shape\" has more bytes than the largest file (2^63-1)");
	return 0;
}

int sf_strided_span(unsigned ndim, const uint64_t *len, const uint64_t *strides,
		    size_t itemsize, uint64_t *out)
{
	uint64_t last = 0;

	for (unsigned d = 0; d < ndim; d++) {
		uint64_t step;

		if (len[d] == 0) {
			*out = 0;
			return 0;
		}
		if (strides[d] && len[d] - 1 > UINT64_MAX / strides[d])
			return -SF_ETOOBIG;
		step = (len[d] - 1) * strides[d];
		if (step > UINT64_MAX - last)
			return -SF_ETOOBIG;
		last += step;
	}
	if (itemsize == 0 || last >= UINT64_MAX / itemsize)
		return -SF_ETOOBIG;
	*out = (last + 1) * itemsize;
	return 0;
}

/*
 * Check one shard of entry t in model m: rank, box or flat range inside
 * the entry, strides, payload path and range, byte and checksum counts.
 * Returns 0, -SF_ERANGE (outside the entry), -SF_ETOOBIG or -SF_EMANIFEST.
 */
int sf_shard_check(const struct sf_where *w, const struct sf_model *m,
		   const struct sf_tensor *t, const struct sf_shard *s)
{
	uint64_t expect;

	if (s->rank >= m->world_size)
		return sf_fail(w, -SF_EMANIFEST,
			       "\"rank\" = %" PRIu32 " is not below \"world_size\" = %" PRIu32,
			       s->rank, m->world_size);
	if (s->flat) {
		if (s->strides)
			return sf_fail(w, -SF_EMANIFEST, "a flat range has no \"strides\"");
		if (s->flat_off > t->nbytes || s->flat_len > t->nbytes - s->flat_off)
			return sf_fail(w, -SF_ERANGE,
				       "\"flat\" [%" PRIu64 ", %" PRIu64 "] exceeds the tensor's %" PRIu64 " bytes",
				       s->flat_off, s->flat_len, t->nbytes);
		expect = s->flat_len;
	} else {
		uint64_t numel = 1;

		if (t->ndim && (!s->off || !s->len))
			return sf_fail(w, -SF_EMANIFEST,
				       "box has no offsets and lengths for %u dimensions",
				       t->ndim);
		for (unsigned d = 0; d < t->ndim; d++)
			if (s->off[d] > t->shape[d] ||
			    s->len[d] > t->shape[d] - s->off[d])
				return sf_fail(w, -SF_ERANGE,
					       "\"offsets\"[%u] + \"lengths\"[%u] = %" PRIu64 " + %" PRIu64
					       " exceeds shape[%u] = %" PRIu64,
					       d, d, s->off[d], s->len[d], d, t->shape[d]);
		/* inside a shape whose bytes fit in 64 bits: no overflow */
		for (unsigned d = 0; d < t->ndim; d++)
			numel *= s->len[d];
		if (s->strides) {
			if (sf_strided_span(t->ndim, s->len, s->strides,
					    sf_dtype_size(t->dtype), &expect) < 0)
				return sf_fail(w, -SF_ETOOBIG, "\"strides\" reach past 2^64 bytes");
		} else {
			expect = numel * sf_dtype_size(t->dtype);
		}
	}
	if (!s->file)
		return sf_fail(w, -SF_EMANIFEST, "missing \"file\"");
	/* a name m holds already passed this check when it was added */
	const char *why = sf_model_has_file(m, s->file) ? NULL :
		sf_name_problem(s->file, strnlen(s->file, SF_MAX_NAME + 1), false, true);
	if (why)
		return sf_fail(w, -SF_EMANIFEST, "\"file\" %s", why);
	if (s->file_offset > SF_MAX_OFF || s->nbytes > SF_MAX_OFF - s->file_offset)
		return sf_fail(w, -SF_ETOOBIG,
			       "\"file_offset\" + \"nbytes\" = %" PRIu64 " + %" PRIu64
			       " exceeds the largest file offset",
			       s->file_offset, s->nbytes);
	if (s->nbytes != expect)
		return sf_fail(w, -SF_EMANIFEST,
			       "\"nbytes\" = %" PRIu64 " but its %s holds %" PRIu64 " bytes",
			       s->nbytes, s->flat ? "\"flat\" range" : "box", expect);
	if (s->codec == SF_CODEC_ZSTD) {
		if (s->stored_len > SF_MAX_STORED || s->decoded_len > SF_MAX_DECODED ||
		    s->file_offset > SF_MAX_OFF - s->stored_len)
			return sf_fail(w, -SF_ETOOBIG,
				       "coded stream of %" PRIu64 " bytes decoding to %" PRIu64
				       " exceeds the limits", s->stored_len, s->decoded_len);
		if (s->decoded_off > s->decoded_len ||
		    s->nbytes > s->decoded_len - s->decoded_off)
			return sf_fail(w, -SF_ERANGE,
				       "payload %" PRIu64 "+%" PRIu64 " lies past the %" PRIu64
				       " decoded bytes", s->decoded_off, s->nbytes,
				       s->decoded_len);
	} else if (s->codec != SF_CODEC_NONE && s->codec != SF_CODEC_UNREADABLE) {
		return sf_fail(w, -SF_EMANIFEST, "unknown codec %d", (int)s->codec);
	}
	if (!s->xxh3 && s->nblocks == 0)
		return 0; /* no checksums: served unverified */
	uint64_t nblocks = sf_nblocks(s->nbytes, m->block_size);
	if (s->nblocks != nblocks)
		return sf_fail(w, -SF_EMANIFEST,
			       "\"xxh3\" has %" PRIu64 " checksums, expected %" PRIu64
			       " (%" PRIu64 " bytes in blocks of %" PRIu64 ")",
			       s->nblocks, nblocks, s->nbytes, m->block_size);
	if (nblocks && !s->xxh3)
		return sf_fail(w, -SF_EMANIFEST, "\"xxh3\" is missing");
	return 0;
}

/* The list of m that entries of kind go to. */
static void entry_list(struct sf_model *m, enum sf_entry_kind kind,
		       struct sf_tensor ***arr, size_t **n, size_t **cap)
{
	switch (kind) {
	case SF_ENTRY_FILE:
		*arr = &m->files;
		*n = &m->nfiles;
		*cap = &m->cap_files;
		break;
	case SF_ENTRY_OBJECT:
		*arr = &m->objects;
		*n = &m->nobjects;
		*cap = &m->cap_objects;
		break;
	default:
		*arr = &m->tensors;
		*n = &m->ntensors;
		*cap = &m->cap_tensors;
		break;
	}
}

/* Append an entry (already validated) to its list. *out points into the
 * array, valid until the next append. */
static int entry_append(struct sf_model *m, enum sf_entry_kind kind,
			const char *name, size_t len, enum sf_dtype dtype,
			unsigned ndim, const uint64_t *shape, uint64_t nbytes,
			struct sf_tensor **out)
{
	struct sf_tensor **arr;
	size_t *n, *cap;

	if (m->ntensors + m->nfiles + m->nobjects >= SF_MAX_TENSORS)
		return -SF_ETOOBIG;
	entry_list(m, kind, &arr, &n, &cap);
	int rc = sf_array_grow(arr, *n, cap, sizeof(**arr), 8, SF_MAX_TENSORS);
	if (rc < 0)
		return rc;
	struct sf_tensor *t = &(*arr)[*n];
	memset(t, 0, sizeof(*t));
	t->name = strndup(name, len);
	if (!t->name)
		return -ENOMEM;
	t->dtype = dtype;
	t->ndim = ndim;
	if (ndim)
		memcpy(t->shape, shape, ndim * sizeof(shape[0]));
	t->nbytes = nbytes;
	(*n)++;
	*out = t;
	return 0;
}

int sf_model_append_checked(struct sf_model *m, const struct sf_where *w,
			    enum sf_entry_kind kind, const char *name,
			    size_t len, enum sf_dtype dtype, unsigned ndim,
			    const uint64_t *shape, struct sf_tensor **out)
{
	uint64_t nbytes;
	int rc = entry_validate(w, kind, name, len, dtype, ndim, shape, &nbytes);

	if (rc < 0)
		return rc;
	rc = entry_append(m, kind, name, len, dtype, ndim, shape, nbytes, out);
	if (rc == -SF_ETOOBIG)
		return sf_fail(w, rc, "more than %u tensors, files and objects",
			       SF_MAX_TENSORS);
	return rc;
}

/* ------------------------------------------------------------------ */
/* builder                                                             */

/* The builder keeps the reason in m->why and returns errnos a POSIX
 * caller understands. */
static int builder_code(int rc)
{
	return rc == -SF_EMANIFEST ? -EINVAL : rc;
}

struct sf_model *sf_model_new(const char *name, uint32_t world_size,
			      uint64_t block_size)
{
	if (!name || sf_name_problem(name, strnlen(name, SF_MAX_NAME + 1), true, true) ||
	    world_size < 1 || world_size > SF_MAX_WORLD ||
	    block_size < SF_MIN_BLOCK_SIZE || block_size > SF_MAX_BLOCK_SIZE)
		return NULL;
	struct sf_model *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->name = strdup(name);
	if (!m->name) {
		free(m);
		return NULL;
	}
	sf_model_set_format(m, "shardfs/1");
	m->world_size = world_size;
	m->block_size = block_size;
	return m;
}

void sf_model_set_format(struct sf_model *m, const char *format)
{
	snprintf(m->format, sizeof(m->format), "%s", format);
}

const char *sf_model_why(const struct sf_model *m)
{
	return m->why;
}

static int add_entry(struct sf_model *m, enum sf_entry_kind kind,
		     const char *name, enum sf_dtype dtype, unsigned ndim,
		     const uint64_t *shape, struct sf_tensor **out)
{
	struct sf_where w;
	struct sf_tensor *t;

	if (!m || !name || (ndim && !shape))
		return -EINVAL;
	sf_where_init(&w, m->why, sizeof(m->why));
	size_t len = strnlen(name, SF_MAX_NAME + 1);
	sf_where_set(&w, kind_names[kind], name, len);
	int rc = sf_model_append_checked(m, &w, kind, name, len, dtype, ndim,
					 shape, &t);
	if (rc < 0)
		return builder_code(rc);
	if (out)
		*out = t;
	return 0;
}

int sf_model_entry_check(bool is_file, const char *name, enum sf_dtype dtype,
			 unsigned ndim, const uint64_t *shape)
{
	enum sf_entry_kind kind = is_file ? SF_ENTRY_FILE : SF_ENTRY_TENSOR;
	char why[256];
	struct sf_where w;
	uint64_t nbytes;

	if (!name || (ndim && !shape))
		return -EINVAL;
	sf_where_init(&w, why, sizeof(why));
	size_t len = strnlen(name, SF_MAX_NAME + 1);
	sf_where_set(&w, kind_names[kind], name, len);
	return builder_code(entry_validate(&w, kind, name, len, dtype, ndim,
					   shape, &nbytes));
}

int sf_model_add_tensor(struct sf_model *m, bool is_file, const char *name,
			enum sf_dtype dtype, unsigned ndim,
			const uint64_t *shape, struct sf_tensor **out)
{
	return add_entry(m, is_file ? SF_ENTRY_FILE : SF_ENTRY_TENSOR, name,
			 dtype, ndim, shape, out);
}

int sf_model_add_object(struct sf_model *m, const char *name, uint64_t nbytes,
			struct sf_tensor **out)
{
	return add_entry(m, SF_ENTRY_OBJECT, name, SF_DT_U8, 1, &nbytes, out);
}

void sf_model_drop_last(struct sf_model *m, enum sf_entry_kind kind)
{
	struct sf_tensor **arr;
	size_t *n, *cap;

	entry_list(m, kind, &arr, &n, &cap);
	if (*n == 0)
		return;
	tensor_free(&(*arr)[--*n]);
}

/* The kind of entry t of m (by the list it lies in). */
static enum sf_entry_kind kind_of(const struct sf_model *m,
				  const struct sf_tensor *t)
{
	if (m->files && t >= m->files && t < m->files + m->nfiles)
		return SF_ENTRY_FILE;
	if (m->objects && t >= m->objects && t < m->objects + m->nobjects)
		return SF_ENTRY_OBJECT;
	return SF_ENTRY_TENSOR;
}

/* Copy checked shard s of t into m's pool as *out. 0 or -ENOMEM. */
static int shard_store(struct sf_model *m, const struct sf_tensor *t,
		       const struct sf_shard *s, struct sf_shard *out)
{
	*out = *s;
	out->off = out->len = NULL;
	out->strides = NULL;
	out->xxh3 = NULL;
	out->file = pool_name(m, s->file);
	if (!out->file)
		return -ENOMEM;
	if (!s->flat && t->ndim) {
		uint64_t *v = pool_alloc(m, 2 * t->ndim * sizeof(*v));

		if (!v)
			return -ENOMEM;
		memcpy(v, s->off, t->ndim * sizeof(*v));
		memcpy(v + t->ndim, s->len, t->ndim * sizeof(*v));
		out->off = v;
		out->len = v + t->ndim;
	}
	if (s->strides &&
	    !(out->strides = (uint64_t *)pool_u64s(m, s->strides, t->ndim)))
		return -ENOMEM;
	/* never NULL when given: a shard with an empty list is verified */
	if (s->xxh3 &&
	    !(out->xxh3 = (uint64_t *)pool_u64s(m, s->xxh3, (size_t)s->nblocks)))
		return -ENOMEM;
	return 0;
}

int sf_tensor_add_shard(struct sf_model *m, struct sf_tensor *t,
			const struct sf_shard *s)
{
	struct sf_where w;
	struct sf_shard c;

	if (!m || !t || !s)
		return -EINVAL;
	sf_where_init(&w, m->why, sizeof(m->why));
	sf_where_set(&w, kind_names[kind_of(m, t)], t->name, strlen(t->name));
	w.shard = (long)t->nshards;
	int rc = sf_shard_check(&w, m, t, s);
	if (rc < 0)
		return builder_code(rc);
	rc = sf_array_grow(&t->shards, t->nshards, &t->cap_shards,
			   sizeof(*t->shards), 8, SF_MAX_SHARDS);
	if (rc == -SF_ETOOBIG)
		sf_fail(&w, rc, "more than %u shards", SF_MAX_SHARDS);
	if (rc < 0)
		return rc;
	rc = shard_store(m, t, s, &c);
	if (rc < 0)
		return rc;
	t->shards[t->nshards++] = c;
	return 0;
}

int sf_model_put_shard(struct sf_model *m, struct sf_tensor *t,
		       const struct sf_shard *s)
{
	struct sf_shard c;
	int rc = sf_array_grow(&t->shards, t->nshards, &t->cap_shards,
			       sizeof(*t->shards), 8, SF_MAX_SHARDS);

	if (rc == -SF_ETOOBIG)
		snprintf(m->why, sizeof(m->why), "more than %u shards", SF_MAX_SHARDS);
	if (rc < 0)
		return rc;
	rc = shard_store(m, t, s, &c);
	if (rc < 0)
		return rc;
	t->shards[t->nshards++] = c;
	return 0;
}

bool sf_model_verified(const struct sf_model *m)
{
	const struct sf_tensor *lists[] = { m->tensors, m->files, m->objects };
	const size_t counts[] = { m->ntensors, m->nfiles, m->nobjects };

	for (size_t l = 0; l < 3; l++)
		for (size_t i = 0; i < counts[l]; i++)
			for (size_t k = 0; k < lists[l][i].nshards; k++)
				if (!lists[l][i].shards[k].xxh3 &&
				    lists[l][i].shards[k].nbytes)
					return false;
	return true;
}

/* ------------------------------------------------------------------ */
/* finish, find                                                        */

static int tensor_cmp(const void *a, const void *b)
{
	return strcmp(((const struct sf_tensor *)a)->name,
		      ((const struct sf_tensor *)b)->name);
}

static int name_cmp(const void *key, const void *elem)
{
	return strcmp(key, ((const struct sf_tensor *)elem)->name);
}

static const struct sf_tensor *find_in(const struct sf_tensor *arr, size_t n,
				       const char *name)
{
	if (!arr || !name)
		return NULL;
	return bsearch(name, arr, n, sizeof(*arr), name_cmp);
}

const struct sf_tensor *sf_model_find(const struct sf_model *m,
				      const char *name)
{
	return m ? find_in(m->tensors, m->ntensors, name) : NULL;
}

const struct sf_tensor *sf_model_find_file(const struct sf_model *m,
					   const char *name)
{
	return m ? find_in(m->files, m->nfiles, name) : NULL;
}

const struct sf_tensor *sf_model_find_object(const struct sf_model *m,
					     const char *name)
{
	return m ? find_in(m->objects, m->nobjects, name) : NULL;
}

/* Sort one array and reject duplicates. */
static int sort_unique(const struct sf_where *w, const char *kind,
		       struct sf_tensor *arr, size_t n)
{
	size_t i = 1;

	/* parsed manifests come sorted (the dump writes them so) */
	while (i < n && strcmp(arr[i - 1].name, arr[i].name) < 0)
		i++;
	if (i < n)
		qsort(arr, n, sizeof(*arr), tensor_cmp);
	for (i = 1; i < n; i++)
		if (strcmp(arr[i - 1].name, arr[i].name) == 0) {
			char q[sizeof(w->qname)];
			sf_quote_name(q, arr[i].name, strlen(arr[i].name));
			return sf_fail(w, -SF_EMANIFEST, "duplicate %s name %s", kind, q);
		}
	return 0;
}

/* Reject an entry whose name is a directory of another in the same list:
 * for every '/' in a name, the part before it must not be an entry. */
static int check_prefixes(const struct sf_where *w, const char *kind,
			  const struct sf_tensor *arr, size_t n)
{
	char buf[SF_MAX_NAME + 1];
	for (size_t i = 0; i < n; i++) {
		const char *name = arr[i].name;
		for (const char *p = strchr(name, '/'); p; p = strchr(p + 1, '/')) {
			size_t len = (size_t)(p - name);
			if (len > SF_MAX_NAME)
				break;
			memcpy(buf, name, len);
			buf[len] = '\0';
			if (find_in(arr, n, buf)) {
				char q1[sizeof(w->qname)], q2[sizeof(w->qname)];
				sf_quote_name(q1, buf, len);
				sf_quote_name(q2, name, strlen(name));
				return sf_fail(w, -SF_EMANIFEST,
					       "%s %s is also a directory of %s %s",
					       kind, q1, kind, q2);
			}
		}
	}
	return 0;
}

/*
 * The mount shows every tensor at once in model.safetensors, and each in
 * npy/ behind a header: their sizes must fit in off_t, or stat could not
 * show them (the kernel would answer EIO). The tensors' bytes together,
 * plus the largest header either view can have, fit in off_t.
 */
static int check_st_total(const struct sf_where *w, const struct sf_model *m)
{
	const uint64_t room = SF_MAX_OFF - SF_MAX_ST_HEADER - 8;
	uint64_t total = 0;

	for (size_t i = 0; i < m->ntensors; i++) {
		if (m->tensors[i].nbytes > room - total)
			return sf_fail(w, -EOVERFLOW,
				       "the tensors hold more than %llu bytes together: model.safetensors would be past the largest size stat can show (2^63-1 bytes)",
				       (unsigned long long)room);
		total += m->tensors[i].nbytes;
	}
	return 0;
}

/* Sort, check names and (unless partial) coverage: every list sorted and
 * its duplicates refused first, then prefixes, then coverage (and, for a
 * foreign format, that no two shards overlap), then the sizes the views
 * show. */
static int finish_impl(struct sf_model *m, bool partial, char *err,
		       size_t errlen)
{
	struct sf_tensor **arr;
	size_t *n, *cap;
	struct sf_where w;
	unsigned k;
	bool foreign;
	int rc;

	if (!m)
		return -EINVAL;
	foreign = strcmp(m->format, "shardfs/1") != 0;
	sf_where_init(&w, err, errlen);
	for (k = 0; k < 3; k++) {
		entry_list(m, (enum sf_entry_kind)k, &arr, &n, &cap);
		rc = sort_unique(&w, kind_names[k], *arr, *n);
		if (rc < 0)
			return rc;
	}
	for (k = 0; k < 3; k++) {
		if (k == SF_ENTRY_FILE)
			continue; /* one component each */
		entry_list(m, (enum sf_entry_kind)k, &arr, &n, &cap);
		rc = check_prefixes(&w, kind_names[k], *arr, *n);
		if (rc < 0)
			return rc;
	}
	for (k = 0; !partial && k < 3; k++) {
		entry_list(m, (enum sf_entry_kind)k, &arr, &n, &cap);
		for (size_t i = 0; i < *n; i++) {
			const struct sf_tensor *t = &(*arr)[i];

			sf_where_set(&w, kind_names[k], t->name, strlen(t->name));
			rc = sf_cover_check(&w, t);
			if (rc < 0)
				return rc;
			/* foreign: covered, so disjoint iff the bytes add up
			 * (sf_overlap_rule); no read ever mixes two shards */
			if (foreign && sf_tensor_shard_bytes(t) != t->nbytes)
				return sf_fail(&w, -SF_ECONFLICT,
					       "shards overlap (a foreign format's adapter must apply the overlap rule)");
		}
	}
	if (partial)
		return 0;
	sf_where_init(&w, err, errlen); /* the whole model: no entry named */
	return check_st_total(&w, m);
}

int sf_model_finish(struct sf_model *m, char *err, size_t errlen)
{
	return finish_impl(m, false, err, errlen);
}

int sf_model_finish_part(struct sf_model *m, char *err, size_t errlen)
{
	return finish_impl(m, true, err, errlen);
}

bool sf_view_name_reserved(const char *name, size_t len)
{
	static const char *const views[] = {
		SF_VIEW_TENSORS, SF_VIEW_NPY, SF_VIEW_OBJECTS,
		SF_VIEW_SAFETENSORS, SF_VIEW_MANIFEST,
	};

	for (size_t i = 0; i < sizeof(views) / sizeof(views[0]); i++)
		if (len == strlen(views[i]) && memcmp(name, views[i], len) == 0)
			return true;
	return false;
}
