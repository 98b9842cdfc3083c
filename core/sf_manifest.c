/*
 * sf_manifest.c - the "shardfs/1" manifest: parse, validate, build, dump,
 * and the coverage check that proves every byte of a tensor has a shard.
 *
 * Invariants of a manifest that left sf_manifest_parse() or
 * sf_manifest_finish() successfully:
 *   - every name and path passed name_problem() (valid UTF-8, no control
 *     characters, no NUL, no empty/"."/".." components, bounded lengths);
 *   - tensors[] and files[] are sorted by strcmp(name) without duplicates,
 *     and no tensor name is a directory prefix of another ("a", "a/b");
 *   - every tensor's nbytes fits in off_t, and so do every shape entry,
 *     box, flat range and file_offset + nbytes, so every number dumps as a
 *     JSON integer and every payload range can be pread();
 *   - every shard lies inside its tensor, its nbytes equals the bytes of
 *     its box or flat range, and it carries sf_nblocks(nbytes, block_size)
 *     checksums;
 *   - every byte of every tensor is covered by at least one shard.
 * The builder checks the same per-tensor and per-shard rules as it goes;
 * the global ones (order, duplicates, prefixes, coverage) wait for finish.
 *
 * Error messages are one line and name the field: the tensor or file, the
 * shard index and the JSON key (e.g. `tensor "wq": shard 3: "lengths"[1]
 * ...`). Names from the input are quoted with escapes and truncated before
 * they reach a message, so messages stay printable and bounded.
 */
#include "sf_manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_log.h"

#define STR_(x) #x
#define STR(x) STR_(x)

/* Largest value of off_t: bound for sizes and payload ranges. */
#define SF_MAX_OFF ((uint64_t)INT64_MAX)
/* Bytes of an input name shown in an error message before "...". */
#define QNAME_MAX 64
/* Coverage work bound: box tests plus regions examined, per tensor. */
#define COVER_MAX_STEPS (1u << 22)
/* Coverage memory bound: byte boxes plus the region stack, per tensor. */
#define COVER_MAX_BYTES (64u << 20)

/* ------------------------------------------------------------------ */
/* error context                                                       */

/*
 * Where a problem is: prefixes every message. Lives on the stack of the
 * parse or builder call; err/errlen are the caller's buffer (may be
 * NULL/0).
 */
struct where {
	const char *kind;              /* "tensor", "file" or NULL (top level) */
	char qname[4 * QNAME_MAX + 8]; /* quoted, escaped name of kind */
	long shard;                    /* shard index, or -1 */
	char *err;
	size_t errlen;
};

/* Quote s (len bytes, may hold anything) into out as "..." with \xNN
 * escapes for control bytes, quotes and backslashes; at most QNAME_MAX
 * input bytes, then "...". out must hold 4 * QNAME_MAX + 8 bytes. */
static void quote_name(char *out, const char *s, size_t len)
{
	size_t n = 0;
	out[n++] = '"';
	for (size_t i = 0; i < len && i < QNAME_MAX; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
			n += (size_t)sprintf(out + n, "\\x%02x", c);
		else
			out[n++] = (char)c;
	}
	out[n++] = '"';
	if (len > QNAME_MAX) {
		memcpy(out + n, "...", 3);
		n += 3;
	}
	out[n] = '\0';
}

static void where_set(struct where *w, const char *kind, const char *name,
		      size_t len)
{
	w->kind = kind;
	w->shard = -1;
	quote_name(w->qname, name, len);
}

/* Advance *n by the result r of an snprintf into a buffer of size cap. */
static void advance(size_t *n, int r, size_t cap)
{
	if (r < 0)
		return;
	*n += (size_t)r;
	if (*n >= cap)
		*n = cap - 1;
}

/* Write "kind NAME: shard I: <message>" into w->err (one line, control
 * bytes replaced by '?') and return code. */
__attribute__((format(printf, 3, 4)))
static int fail(const struct where *w, int code, const char *fmt, ...)
{
	if (!w->err || w->errlen == 0)
		return code;
	size_t n = 0;
	w->err[0] = '\0';
	if (w->kind)
		advance(&n, snprintf(w->err + n, w->errlen - n, "%s %s: ",
				     w->kind, w->qname), w->errlen);
	if (w->shard >= 0)
		advance(&n, snprintf(w->err + n, w->errlen - n, "shard %ld: ",
				     w->shard), w->errlen);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(w->err + n, w->errlen - n, fmt, ap);
	va_end(ap);
	/* Text quoted from the input (jansson's "near '...'") may hold
	 * control bytes: keep the message one printable line. */
	for (char *p = w->err; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	return code;
}

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

/*
 * Why s (len bytes) is not an acceptable name, or NULL if it is. Names
 * are '/'-separated components; single: exactly one component;
 * allow_at: '@' is allowed (it is reserved for slices in tensor names).
 * Returns a static string.
 */
static const char *name_problem(const char *s, size_t len, bool single,
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

/* Names a root file may not take: the mount's own entries and the
 * store's payload directories and temporaries. */
static const char *file_name_problem(const char *s, size_t len)
{
	static const char *const reserved[] = {
		"tensors", "npy", "model.safetensors", "manifest.json",
	};
	const char *why = name_problem(s, len, true, true);
	if (why)
		return why;
	for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
		if (len == strlen(reserved[i]) && memcmp(s, reserved[i], len) == 0)
			return "is reserved";
	if (s[0] == '.')
		return "starts with '.'";
	if (len >= 5 && memcmp(s, "rank-", 5) == 0)
		return "starts with \"rank-\" (payload directories)";
	return NULL;
}

bool sf_name_valid(const char *name)
{
	return name && !name_problem(name, strnlen(name, SF_MAX_NAME + 1),
				     false, false);
}

bool sf_relpath_valid(const char *path)
{
	return path && !name_problem(path, strnlen(path, SF_MAX_NAME + 1),
				     false, true);
}

/* ------------------------------------------------------------------ */
/* memory                                                              */

static void shard_free(struct sf_shard *s)
{
	free(s->file);
	free(s->xxh3);
	s->file = NULL;
	s->xxh3 = NULL;
}

static void tensor_free(struct sf_tensor *t)
{
	for (size_t i = 0; i < t->nshards; i++)
		shard_free(&t->shards[i]);
	free(t->shards);
	free(t->name);
}

void sf_manifest_destroy(struct sf_manifest *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->ntensors; i++)
		tensor_free(&m->tensors[i]);
	for (size_t i = 0; i < m->nfiles; i++)
		tensor_free(&m->files[i]);
	free(m->tensors);
	free(m->files);
	free(m->name);
	free(m);
}

/* ------------------------------------------------------------------ */
/* validation shared by the parser and the builder                     */

static bool manifest_args_valid(const char *name, size_t len,
				uint32_t world_size, uint64_t block_size)
{
	return !name_problem(name, len, true, true) && world_size >= 1 &&
	       world_size <= SF_MAX_WORLD && block_size >= SF_MIN_BLOCK_SIZE &&
	       block_size <= SF_MAX_BLOCK_SIZE;
}

/* Check a tensor's name, dtype and shape; on success *nbytes is its byte
 * size. -SF_EMANIFEST, -SF_ETOOBIG. */
static int tensor_validate(const struct where *w, bool is_file,
			   const char *name, size_t len, enum sf_dtype dtype,
			   unsigned ndim, const uint64_t *shape,
			   uint64_t *nbytes)
{
	const char *why = is_file ? file_name_problem(name, len)
				  : name_problem(name, len, false, false);
	if (why)
		return fail(w, -SF_EMANIFEST, "name %s", why);
	if (sf_dtype_size(dtype) == 0)
		return fail(w, -SF_EMANIFEST, "invalid dtype");
	if (ndim > SF_MAX_NDIM)
		return fail(w, -SF_ETOOBIG, "\"shape\" has %u dimensions, more than %d",
			    ndim, SF_MAX_NDIM);
	if (is_file && (dtype != SF_DT_U8 || ndim != 1))
		return fail(w, -SF_EMANIFEST,
			    "a root file must have \"dtype\" U8 and one dimension");
	for (unsigned d = 0; d < ndim; d++)
		if (shape[d] > SF_MAX_OFF)
			return fail(w, -SF_ETOOBIG, "\"shape\"[%u] = %" PRIu64 " is too large",
				    d, shape[d]);
	if (sf_shape_nbytes(ndim, shape, sf_dtype_size(dtype), nbytes) < 0 ||
	    *nbytes > SF_MAX_OFF)
		return fail(w, -SF_ETOOBIG,
			    "\"shape\" has more bytes than the largest file (2^63-1)");
	return 0;
}

/*
 * Check one shard of tensor t in manifest m: rank, box or flat range
 * inside the tensor, payload path and range, byte and checksum counts.
 * Returns 0, -SF_ERANGE (outside the tensor), -SF_ETOOBIG or -SF_EMANIFEST.
 */
static int shard_validate(const struct where *w, const struct sf_manifest *m,
			  const struct sf_tensor *t, const struct sf_shard *s)
{
	uint64_t expect;
	if (s->rank >= m->world_size)
		return fail(w, -SF_EMANIFEST,
			    "\"rank\" = %" PRIu32 " is not below \"world_size\" = %" PRIu32,
			    s->rank, m->world_size);
	if (s->flat) {
		if (s->flat_off > t->nbytes || s->flat_len > t->nbytes - s->flat_off)
			return fail(w, -SF_ERANGE,
				    "\"flat\" [%" PRIu64 ", %" PRIu64 "] exceeds the tensor's %" PRIu64 " bytes",
				    s->flat_off, s->flat_len, t->nbytes);
		expect = s->flat_len;
	} else {
		if (s->box.ndim != t->ndim)
			return fail(w, -SF_EMANIFEST,
				    "box has %u dimensions, the tensor has %u",
				    s->box.ndim, t->ndim);
		for (unsigned d = 0; d < t->ndim; d++)
			if (s->box.off[d] > t->shape[d] ||
			    s->box.len[d] > t->shape[d] - s->box.off[d])
				return fail(w, -SF_ERANGE,
					    "\"offsets\"[%u] + \"lengths\"[%u] = %" PRIu64 " + %" PRIu64
					    " exceeds shape[%u] = %" PRIu64,
					    d, d, s->box.off[d], s->box.len[d], d, t->shape[d]);
		if (sf_box_check(&s->box, t->ndim, t->shape) < 0)
			return fail(w, -SF_ERANGE, "box lies outside the tensor");
		expect = sf_box_numel(&s->box) * sf_dtype_size(t->dtype);
	}
	if (!s->file)
		return fail(w, -SF_EMANIFEST, "missing \"file\"");
	const char *why = name_problem(s->file, strnlen(s->file, SF_MAX_NAME + 1),
				       false, true);
	if (why)
		return fail(w, -SF_EMANIFEST, "\"file\" %s", why);
	if (s->file_offset > SF_MAX_OFF || s->nbytes > SF_MAX_OFF - s->file_offset)
		return fail(w, -SF_ETOOBIG,
			    "\"file_offset\" + \"nbytes\" = %" PRIu64 " + %" PRIu64
			    " exceeds the largest file offset",
			    s->file_offset, s->nbytes);
	if (s->nbytes != expect)
		return fail(w, -SF_EMANIFEST,
			    "\"nbytes\" = %" PRIu64 " but its %s holds %" PRIu64 " bytes",
			    s->nbytes, s->flat ? "\"flat\" range" : "box", expect);
	uint64_t nblocks = sf_nblocks(s->nbytes, m->block_size);
	if (s->nblocks != nblocks)
		return fail(w, -SF_EMANIFEST,
			    "\"xxh3\" has %" PRIu64 " checksums, expected %" PRIu64
			    " (%" PRIu64 " bytes in blocks of %" PRIu64 ")",
			    s->nblocks, nblocks, s->nbytes, m->block_size);
	if (nblocks && !s->xxh3)
		return fail(w, -SF_EMANIFEST, "\"xxh3\" is missing");
	return 0;
}

/* Append a tensor (already validated) to m->tensors or m->files. *out
 * points into the array, valid until the next append. */
static int tensor_append(struct sf_manifest *m, bool is_file, const char *name,
			 size_t len, enum sf_dtype dtype, unsigned ndim,
			 const uint64_t *shape, uint64_t nbytes,
			 struct sf_tensor **out)
{
	struct sf_tensor **arr = is_file ? &m->files : &m->tensors;
	size_t *n = is_file ? &m->nfiles : &m->ntensors;
	size_t *cap = is_file ? &m->cap_files : &m->cap_tensors;

	if (m->ntensors + m->nfiles >= SF_MAX_TENSORS)
		return -SF_ETOOBIG;
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

/* ------------------------------------------------------------------ */
/* builder                                                             */

/* The builder has no error buffer: rejections are logged at debug level
 * and returned as errnos a POSIX caller understands. */
static int builder_code(const struct where *w, int rc)
{
	if (w->err && w->err[0])
		sf_debug("manifest builder: %s", w->err);
	return rc == -SF_EMANIFEST ? -EINVAL : rc;
}

struct sf_manifest *sf_manifest_new(const char *name, uint32_t world_size,
				    uint64_t block_size)
{
	if (!name || !manifest_args_valid(name, strnlen(name, SF_MAX_NAME + 1),
					  world_size, block_size))
		return NULL;
	struct sf_manifest *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->name = strdup(name);
	if (!m->name) {
		free(m);
		return NULL;
	}
	m->world_size = world_size;
	m->block_size = block_size;
	return m;
}

int sf_manifest_add_tensor(struct sf_manifest *m, bool is_file,
			   const char *name, enum sf_dtype dtype,
			   unsigned ndim, const uint64_t *shape,
			   struct sf_tensor **out)
{
	char msg[256] = "";
	struct where w = { .shard = -1, .err = msg, .errlen = sizeof(msg) };
	uint64_t nbytes;

	if (!m || !name || (ndim && !shape))
		return -EINVAL;
	size_t len = strnlen(name, SF_MAX_NAME + 1);
	where_set(&w, is_file ? "file" : "tensor", name, len);
	int rc = tensor_validate(&w, is_file, name, len, dtype, ndim, shape, &nbytes);
	if (rc < 0)
		return builder_code(&w, rc);
	struct sf_tensor *t;
	rc = tensor_append(m, is_file, name, len, dtype, ndim, shape, nbytes, &t);
	if (rc < 0)
		return rc;
	if (out)
		*out = t;
	return 0;
}

int sf_tensor_add_shard(const struct sf_manifest *m, struct sf_tensor *t,
			const struct sf_shard *s)
{
	char msg[256] = "";
	struct where w = { .shard = -1, .err = msg, .errlen = sizeof(msg) };

	if (!m || !t || !s)
		return -EINVAL;
	where_set(&w, "tensor", t->name, strlen(t->name));
	w.shard = (long)t->nshards;
	int rc = shard_validate(&w, m, t, s);
	if (rc < 0)
		return builder_code(&w, rc);
	rc = sf_array_grow(&t->shards, t->nshards, &t->cap_shards,
			   sizeof(*t->shards), 8, SF_MAX_SHARDS);
	if (rc < 0)
		return rc;

	struct sf_shard c = *s;
	c.file = strdup(s->file);
	c.xxh3 = NULL;
	if (!c.file)
		return -ENOMEM;
	if (s->nblocks) {
		c.xxh3 = malloc(s->nblocks * sizeof(*c.xxh3));
		if (!c.xxh3)
			goto out_free_copy;
		memcpy(c.xxh3, s->xxh3, s->nblocks * sizeof(*c.xxh3));
	}
	t->shards[t->nshards++] = c;
	return 0;

out_free_copy:
	shard_free(&c);
	return -ENOMEM;
}

/* ------------------------------------------------------------------ */
/* coverage                                                            */

/*
 * The tensor in byte coordinates: k dimensions, the last one in bytes
 * (shape[n-1] * itemsize), so box shards and flat ranges are both unions
 * of byte boxes. A byte box is stored as 2k uint64: lo[0..k), hi[0..k)
 * (half-open). A region on the work stack is 2k + 1 uint64: its box and
 * the index of the first byte box that may still intersect it.
 */
struct cover {
	unsigned k;                     /* 1..SF_MAX_NDIM */
	uint64_t dim[SF_MAX_NDIM];      /* byte-coordinate shape */
	uint64_t stride[SF_MAX_NDIM];   /* bytes per step in each dimension */
	uint64_t *boxes;                /* nboxes * 2k, owned */
	size_t nboxes, cap_boxes;       /* in boxes */
	uint64_t *stack;                /* nstack * (2k + 1), owned */
	size_t nstack, cap_stack;       /* in regions */
	uint64_t steps;                 /* box tests + regions, <= COVER_MAX_STEPS */
};

/* Reserve room for one more record of `words` uint64 in *arr (n records,
 * *cap capacity), within COVER_MAX_BYTES together with `other` bytes. */
static int cover_grow(uint64_t **arr, size_t n, size_t *cap, size_t words,
		      size_t other)
{
	size_t rec = words * sizeof(uint64_t);
	size_t max = other < COVER_MAX_BYTES ? (COVER_MAX_BYTES - other) / rec : 0;

	if (n < *cap)
		return 0;
	if (!max)
		return -SF_ETOOBIG;
	return sf_array_grow(arr, n, cap, rec, 64, max);
}

static int cover_add_box(struct cover *c, const uint64_t *lo, const uint64_t *hi)
{
	unsigned k = c->k;
	for (unsigned d = 0; d < k; d++)
		if (lo[d] >= hi[d])
			return 0; /* empty: covers nothing */
	int rc = cover_grow(&c->boxes, c->nboxes, &c->cap_boxes, 2 * k,
			    c->cap_stack * (2 * k + 1) * sizeof(uint64_t));
	if (rc < 0)
		return rc;
	uint64_t *b = c->boxes + c->nboxes * 2 * k;
	memcpy(b, lo, k * sizeof(*lo));
	memcpy(b + k, hi, k * sizeof(*hi));
	c->nboxes++;
	return 0;
}

/*
 * Add the bytes [lo, hi) of the sub-tensor at dimension i (whose indices
 * for dimensions < i are fixed in prefix[]) as at most 2(k-i)-1 byte
 * boxes: a partial head row, a run of whole rows, a partial tail row.
 * Recursion depth <= k.
 */
static int cover_add_flat(struct cover *c, unsigned i, uint64_t *prefix,
			  uint64_t lo, uint64_t hi)
{
	uint64_t blo[SF_MAX_NDIM], bhi[SF_MAX_NDIM];
	unsigned k = c->k;
	int rc;

	if (lo >= hi)
		return 0;
	for (unsigned d = 0; d < i; d++) {
		blo[d] = prefix[d];
		bhi[d] = prefix[d] + 1;
	}
	if (i == k - 1) {
		blo[i] = lo;
		bhi[i] = hi;
		return cover_add_box(c, blo, bhi);
	}
	uint64_t st = c->stride[i];
	uint64_t a = lo / st, ra = lo % st, b = hi / st, rb = hi % st;
	if (a == b) {
		prefix[i] = a;
		return cover_add_flat(c, i + 1, prefix, ra, rb);
	}
	if (ra) {
		prefix[i] = a;
		rc = cover_add_flat(c, i + 1, prefix, ra, st);
		if (rc < 0)
			return rc;
		a++;
	}
	if (a < b) {
		blo[i] = a;
		bhi[i] = b;
		for (unsigned d = i + 1; d < k; d++) {
			blo[d] = 0;
			bhi[d] = c->dim[d];
		}
		rc = cover_add_box(c, blo, bhi);
		if (rc < 0)
			return rc;
	}
	if (rb) {
		prefix[i] = b;
		return cover_add_flat(c, i + 1, prefix, 0, rb);
	}
	return 0;
}

static int cover_push(struct cover *c, const uint64_t *lo, const uint64_t *hi,
		      uint64_t next)
{
	unsigned k = c->k;
	int rc = cover_grow(&c->stack, c->nstack, &c->cap_stack, 2 * k + 1,
			    c->cap_boxes * 2 * k * sizeof(uint64_t));
	if (rc < 0)
		return rc;
	uint64_t *r = c->stack + c->nstack * (2 * k + 1);
	memcpy(r, lo, k * sizeof(*lo));
	memcpy(r + k, hi, k * sizeof(*hi));
	r[2 * k] = next;
	c->nstack++;
	return 0;
}

/* Byte offset of a byte-coordinate point in the flattened tensor. */
static uint64_t cover_flat(const struct cover *c, const uint64_t *pt)
{
	uint64_t off = 0;
	for (unsigned d = 0; d < c->k; d++)
		off += pt[d] * c->stride[d];
	return off;
}

/* Row-major order of byte boxes by their low corner (qsort_r). */
static int cover_cmp(const void *a, const void *b, void *arg)
{
	const uint64_t *x = a, *y = b;
	unsigned k = *(const unsigned *)arg;
	for (unsigned d = 0; d < k; d++)
		if (x[d] != y[d])
			return x[d] < y[d] ? -1 : 1;
	return 0;
}

/*
 * Recursive subtraction on an explicit stack. A region [lo, hi) with
 * start index j is known to miss boxes before j. Take the first box from
 * j that intersects it: none means the region is uncovered; containing it
 * means it is covered; otherwise region minus box splits into at most 2k
 * disjoint regions, all of which miss boxes up to that one. Boxes are
 * sorted by low corner, so the scan stops at the first box that starts
 * past the region in dimension 0. Regions whose
 * low corner lies past the lowest gap found so far are skipped, so *gap
 * ends as the first uncovered byte (UINT64_MAX if none).
 */
static int cover_run(struct cover *c, uint64_t *gap)
{
	unsigned k = c->k;
	uint64_t lo[SF_MAX_NDIM], hi[SF_MAX_NDIM];
	/* pieces of region minus box, in row-major order of low corners */
	uint64_t plo[2 * SF_MAX_NDIM][SF_MAX_NDIM], phi[2 * SF_MAX_NDIM][SF_MAX_NDIM];
	int rc;

	*gap = UINT64_MAX;
	for (unsigned d = 0; d < k; d++) {
		lo[d] = 0;
		hi[d] = c->dim[d];
	}
	rc = cover_push(c, lo, hi, 0);
	if (rc < 0)
		return rc;
	while (c->nstack) {
		const uint64_t *r = c->stack + --c->nstack * (2 * k + 1);
		memcpy(lo, r, k * sizeof(*lo));
		memcpy(hi, r + k, k * sizeof(*hi));
		uint64_t j = r[2 * k];
		if (++c->steps > COVER_MAX_STEPS)
			return -SF_ETOOBIG;
		if (cover_flat(c, lo) >= *gap)
			continue;

		const uint64_t *b = NULL;
		for (; j < c->nboxes; j++) {
			if (++c->steps > COVER_MAX_STEPS)
				return -SF_ETOOBIG;
			const uint64_t *x = c->boxes + j * 2 * k;
			if (x[0] >= hi[0])
				break; /* sorted by x[0]: no later box reaches in */
			unsigned d = 0;
			while (d < k && x[d] < hi[d] && lo[d] < x[k + d])
				d++;
			if (d == k) {
				b = x;
				break;
			}
		}
		if (!b) {
			*gap = cover_flat(c, lo);
			continue;
		}

		/* Split: below and above the box in dimension d, with
		 * dimensions < d narrowed to the box. Order of low corners:
		 * below0 < below1 < ... < above1 < above0. */
		unsigned nbelow = 0, nabove = 0;
		uint64_t above_lo[SF_MAX_NDIM][SF_MAX_NDIM], above_hi[SF_MAX_NDIM][SF_MAX_NDIM];
		for (unsigned d = 0; d < k; d++) {
			uint64_t ilo = b[d] > lo[d] ? b[d] : lo[d];
			uint64_t ihi = b[k + d] < hi[d] ? b[k + d] : hi[d];
			if (lo[d] < ilo) {
				memcpy(plo[nbelow], lo, k * sizeof(*lo));
				memcpy(phi[nbelow], hi, k * sizeof(*hi));
				phi[nbelow][d] = ilo;
				nbelow++;
			}
			if (ihi < hi[d]) {
				memcpy(above_lo[nabove], lo, k * sizeof(*lo));
				memcpy(above_hi[nabove], hi, k * sizeof(*hi));
				above_lo[nabove][d] = ihi;
				nabove++;
			}
			lo[d] = ilo;
			hi[d] = ihi;
		}
		/* Push in reverse order so the lowest piece is popped first. */
		for (unsigned p = 0; p < nabove; p++) {
			rc = cover_push(c, above_lo[p], above_hi[p], j + 1);
			if (rc < 0)
				return rc;
		}
		for (unsigned p = nbelow; p-- > 0;) {
			rc = cover_push(c, plo[p], phi[p], j + 1);
			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

/* Is some single shard the whole tensor? (The common replicated case,
 * decided without building boxes.) */
static bool cover_trivial(const struct sf_tensor *t)
{
	for (size_t i = 0; i < t->nshards; i++) {
		const struct sf_shard *s = &t->shards[i];
		if (s->flat ? (s->flat_off == 0 && s->flat_len == t->nbytes)
			    : sf_box_numel(&s->box) * sf_dtype_size(t->dtype) == t->nbytes)
			return true;
	}
	return false;
}

/* Report the first uncovered byte as its element, flat and per dimension.
 * Returns -SF_EGAP. */
static int gap_message(const struct where *w, const struct sf_tensor *t,
		       uint64_t gap, bool cut_short)
{
	char idx[SF_MAX_NDIM * 22 + 4];
	size_t n = 0;
	uint64_t e = gap / sf_dtype_size(t->dtype), rest = e, at[SF_MAX_NDIM];

	for (unsigned d = t->ndim; d-- > 0;) {
		at[d] = rest % t->shape[d];
		rest /= t->shape[d];
	}
	idx[n++] = '[';
	idx[n] = '\0';
	for (unsigned d = 0; d < t->ndim; d++)
		advance(&n, snprintf(idx + n, sizeof(idx) - n, "%s%" PRIu64,
				     d ? ", " : "", at[d]), sizeof(idx));
	snprintf(idx + n, sizeof(idx) - n, "]");
	return fail(w, -SF_EGAP,
		    "gap in coverage: element %" PRIu64 " %s is not covered by any shard%s",
		    e, idx, cut_short ? " (search cut short; an earlier gap may exist)" : "");
}

/* Coverage with messages prefixed by w. */
static int cover_check(const struct where *w, const struct sf_tensor *t)
{
	struct cover c = { 0 };
	size_t isz = sf_dtype_size(t->dtype);
	uint64_t lo[SF_MAX_NDIM], hi[SF_MAX_NDIM], prefix[SF_MAX_NDIM] = { 0 };
	uint64_t gap = UINT64_MAX;
	int rc = 0;

	if (t->nbytes == 0 || cover_trivial(t))
		return 0;
	c.k = t->ndim ? t->ndim : 1;
	for (unsigned d = 0; d < c.k; d++)
		c.dim[d] = t->ndim ? t->shape[d] : 1;
	c.dim[c.k - 1] *= isz;
	c.stride[c.k - 1] = 1;
	for (unsigned d = c.k - 1; d-- > 0;)
		c.stride[d] = c.stride[d + 1] * c.dim[d + 1];

	for (size_t i = 0; i < t->nshards; i++) {
		const struct sf_shard *s = &t->shards[i];
		if (s->flat) {
			rc = cover_add_flat(&c, 0, prefix, s->flat_off,
					    s->flat_off + s->flat_len);
		} else {
			for (unsigned d = 0; d < c.k; d++) {
				lo[d] = t->ndim ? s->box.off[d] : 0;
				hi[d] = t->ndim ? s->box.off[d] + s->box.len[d] : 1;
			}
			lo[c.k - 1] *= isz;
			hi[c.k - 1] *= isz;
			rc = cover_add_box(&c, lo, hi);
		}
		if (rc == -SF_ETOOBIG) {
			rc = fail(w, rc, "too many shard pieces to check coverage");
			goto out_free;
		}
		if (rc < 0)
			goto out_free;
	}
	unsigned k = c.k;
	if (c.nboxes > 1)
		qsort_r(c.boxes, c.nboxes, 2 * k * sizeof(uint64_t), cover_cmp, &k);

	rc = cover_run(&c, &gap);
	if (gap != UINT64_MAX)
		rc = gap_message(w, t, gap, rc == -SF_ETOOBIG);
	else if (rc == -SF_ETOOBIG)
		rc = fail(w, rc, "shard arrangement too complex to check coverage (%zu pieces)",
			  c.nboxes);
out_free:
	free(c.boxes);
	free(c.stack);
	return rc;
}

int sf_tensor_check_coverage(const struct sf_tensor *t, char *err,
			     size_t errlen)
{
	struct where w = { .shard = -1, .err = err, .errlen = errlen };
	if (!t)
		return -EINVAL;
	if (err && errlen)
		err[0] = '\0';
	where_set(&w, "tensor", t->name, strlen(t->name));
	return cover_check(&w, t);
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

const struct sf_tensor *sf_manifest_find(const struct sf_manifest *m,
					 const char *name)
{
	return m ? find_in(m->tensors, m->ntensors, name) : NULL;
}

const struct sf_tensor *sf_manifest_find_file(const struct sf_manifest *m,
					      const char *name)
{
	return m ? find_in(m->files, m->nfiles, name) : NULL;
}

/* Sort one array and reject duplicates. */
static int sort_unique(const struct where *w, const char *kind,
		       struct sf_tensor *arr, size_t n)
{
	if (n > 1)
		qsort(arr, n, sizeof(*arr), tensor_cmp);
	for (size_t i = 1; i < n; i++)
		if (strcmp(arr[i - 1].name, arr[i].name) == 0) {
			char q[sizeof(w->qname)];
			quote_name(q, arr[i].name, strlen(arr[i].name));
			return fail(w, -SF_EMANIFEST, "duplicate %s name %s", kind, q);
		}
	return 0;
}

/* Reject a tensor whose name is a directory of another tensor: for every
 * '/' in a name, the part before it must not be a tensor. */
static int check_prefixes(const struct where *w, const struct sf_manifest *m)
{
	char buf[SF_MAX_NAME + 1];
	for (size_t i = 0; i < m->ntensors; i++) {
		const char *name = m->tensors[i].name;
		for (const char *p = strchr(name, '/'); p; p = strchr(p + 1, '/')) {
			size_t len = (size_t)(p - name);
			if (len > SF_MAX_NAME)
				break;
			memcpy(buf, name, len);
			buf[len] = '\0';
			if (find_in(m->tensors, m->ntensors, buf)) {
				char q1[sizeof(w->qname)], q2[sizeof(w->qname)];
				quote_name(q1, buf, len);
				quote_name(q2, name, strlen(name));
				return fail(w, -SF_EMANIFEST,
					    "tensor %s is also a directory of tensor %s",
					    q1, q2);
			}
		}
	}
	return 0;
}

/* Sort, check names and (unless partial) coverage. */
static int finish_impl(struct sf_manifest *m, bool partial, char *err,
		       size_t errlen)
{
	struct where w = { .shard = -1, .err = err, .errlen = errlen };
	int rc;

	if (!m)
		return -EINVAL;
	if (err && errlen)
		err[0] = '\0';
	rc = sort_unique(&w, "tensor", m->tensors, m->ntensors);
	if (rc < 0)
		return rc;
	rc = sort_unique(&w, "file", m->files, m->nfiles);
	if (rc < 0)
		return rc;
	rc = check_prefixes(&w, m);
	if (rc < 0)
		return rc;
	for (size_t i = 0; !partial && i < m->ntensors + m->nfiles; i++) {
		bool is_file = i >= m->ntensors;
		const struct sf_tensor *t = is_file ? &m->files[i - m->ntensors]
						    : &m->tensors[i];
		where_set(&w, is_file ? "file" : "tensor", t->name, strlen(t->name));
		rc = cover_check(&w, t);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int sf_manifest_finish(struct sf_manifest *m, char *err, size_t errlen)
{
	return finish_impl(m, false, err, errlen);
}

/* ------------------------------------------------------------------ */
/* parse                                                               */

/* A JSON value as a non-negative integer; label names it in messages. */
static int json_u64(const struct where *w, const json_t *v, const char *label,
		    uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return fail(w, -SF_EMANIFEST, "%s must be a non-negative integer", label);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int get_u64(const struct where *w, const json_t *obj, const char *key,
		   uint64_t *out)
{
	char label[48];
	const json_t *v = json_object_get(obj, key);
	if (!v)
		return fail(w, -SF_EMANIFEST, "missing \"%s\"", key);
	snprintf(label, sizeof(label), "\"%s\"", key);
	return json_u64(w, v, label, out);
}

/* A required string member without NUL bytes (borrowed from obj). */
static int get_string(const struct where *w, const json_t *obj, const char *key,
		      const char **s, size_t *len)
{
	const json_t *v = json_object_get(obj, key);
	if (!v)
		return fail(w, -SF_EMANIFEST, "missing \"%s\"", key);
	if (!json_is_string(v))
		return fail(w, -SF_EMANIFEST, "\"%s\" must be a string", key);
	*s = json_string_value(v);
	*len = json_string_length(v);
	if (memchr(*s, '\0', *len))
		return fail(w, -SF_EMANIFEST, "\"%s\" contains a NUL byte", key);
	return 0;
}

/* Read a JSON array of exactly n non-negative integers into out. */
static int get_u64_array(const struct where *w, const json_t *v, const char *key,
			 size_t n, const char *what, uint64_t *out)
{
	char label[48];
	if (!json_is_array(v))
		return fail(w, -SF_EMANIFEST, "\"%s\" must be an array", key);
	if (json_array_size(v) != n)
		return fail(w, -SF_EMANIFEST, "\"%s\" has %zu entries, expected %zu (%s)",
			    key, json_array_size(v), n, what);
	for (size_t i = 0; i < n; i++) {
		snprintf(label, sizeof(label), "\"%s\"[%zu]", key, i);
		int rc = json_u64(w, json_array_get(v, i), label, &out[i]);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* Parse shard object o of tensor t into *s (zeroed by the caller; on
 * failure the caller frees what *s holds). */
static int parse_shard(const struct where *w, const struct sf_manifest *m,
		       const struct sf_tensor *t, const json_t *o,
		       struct sf_shard *s)
{
	uint64_t v;
	int rc;

	if (!json_is_object(o))
		return fail(w, -SF_EMANIFEST, "must be an object");
	rc = get_u64(w, o, "rank", &v);
	if (rc < 0)
		return rc;
	if (v >= m->world_size)
		return fail(w, -SF_EMANIFEST,
			    "\"rank\" = %" PRIu64 " is not below \"world_size\" = %" PRIu32,
			    v, m->world_size);
	s->rank = (uint32_t)v;

	const json_t *offs = json_object_get(o, "offsets");
	const json_t *lens = json_object_get(o, "lengths");
	const json_t *flat = json_object_get(o, "flat");
	if (flat && (offs || lens))
		return fail(w, -SF_EMANIFEST,
			    "has both \"flat\" and \"offsets\"/\"lengths\"");
	if (!flat && !(offs && lens))
		return fail(w, -SF_EMANIFEST,
			    "needs \"offsets\" and \"lengths\", or \"flat\"");
	if (flat) {
		uint64_t fl[2];
		rc = get_u64_array(w, flat, "flat", 2, "byte offset, byte length", fl);
		if (rc < 0)
			return rc;
		s->flat = true;
		s->flat_off = fl[0];
		s->flat_len = fl[1];
	} else {
		s->box.ndim = t->ndim;
		rc = get_u64_array(w, offs, "offsets", t->ndim, "one per dimension",
				   s->box.off);
		if (rc < 0)
			return rc;
		rc = get_u64_array(w, lens, "lengths", t->ndim, "one per dimension",
				   s->box.len);
		if (rc < 0)
			return rc;
	}

	const char *file;
	size_t flen;
	rc = get_string(w, o, "file", &file, &flen);
	if (rc < 0)
		return rc;
	const char *why = name_problem(file, flen, false, true);
	if (why)
		return fail(w, -SF_EMANIFEST, "\"file\" %s", why);
	s->file = strndup(file, flen);
	if (!s->file)
		return -ENOMEM;
	rc = get_u64(w, o, "file_offset", &s->file_offset);
	if (rc < 0)
		return rc;
	rc = get_u64(w, o, "nbytes", &s->nbytes);
	if (rc < 0)
		return rc;

	const json_t *sums = json_object_get(o, "xxh3");
	if (!sums)
		return fail(w, -SF_EMANIFEST, "missing \"xxh3\"");
	if (!json_is_array(sums))
		return fail(w, -SF_EMANIFEST, "\"xxh3\" must be an array");
	/* The count is bounded by the input size; shard_validate checks it
	 * against nbytes. */
	s->nblocks = json_array_size(sums);
	if (s->nblocks) {
		s->xxh3 = calloc(s->nblocks, sizeof(*s->xxh3));
		if (!s->xxh3)
			return -ENOMEM;
	}
	for (size_t i = 0; i < s->nblocks; i++) {
		const json_t *h = json_array_get(sums, i);
		if (!json_is_string(h) ||
		    sf_xxh3_parse(json_string_value(h), json_string_length(h),
				  &s->xxh3[i]) < 0)
			return fail(w, -SF_EMANIFEST,
				    "\"xxh3\"[%zu] must be 16 lowercase hex digits", i);
	}
	rc = shard_validate(w, m, t, s);
	return rc == -SF_ERANGE ? -SF_EMANIFEST : rc;
}

/* Parse one entry of "tensors" or "files". */
static int parse_tensor(struct where *w, struct sf_manifest *m, bool is_file,
			const char *name, size_t len, const json_t *o)
{
	uint64_t shape[SF_MAX_NDIM], nbytes;
	struct sf_tensor *t;
	const char *dt;
	size_t dtlen;
	int rc;

	where_set(w, is_file ? "file" : "tensor", name, len);
	if (!json_is_object(o))
		return fail(w, -SF_EMANIFEST, "must be an object");
	rc = get_string(w, o, "dtype", &dt, &dtlen);
	if (rc < 0)
		return rc;
	enum sf_dtype dtype = sf_dtype_from_name(dt, dtlen);
	if (dtype == SF_DT_INVALID) {
		char q[sizeof(w->qname)];
		quote_name(q, dt, dtlen);
		return fail(w, -SF_EMANIFEST, "unknown \"dtype\" %s", q);
	}
	const json_t *js = json_object_get(o, "shape");
	if (!js)
		return fail(w, -SF_EMANIFEST, "missing \"shape\"");
	if (!json_is_array(js))
		return fail(w, -SF_EMANIFEST, "\"shape\" must be an array");
	if (json_array_size(js) > SF_MAX_NDIM)
		return fail(w, -SF_ETOOBIG, "\"shape\" has %zu dimensions, more than %d",
			    json_array_size(js), SF_MAX_NDIM);
	unsigned ndim = (unsigned)json_array_size(js);
	rc = get_u64_array(w, js, "shape", ndim, "", shape);
	if (rc < 0)
		return rc;
	rc = tensor_validate(w, is_file, name, len, dtype, ndim, shape, &nbytes);
	if (rc < 0)
		return rc;

	const json_t *jsh = json_object_get(o, "shards");
	if (!jsh)
		return fail(w, -SF_EMANIFEST, "missing \"shards\"");
	if (!json_is_array(jsh))
		return fail(w, -SF_EMANIFEST, "\"shards\" must be an array");
	size_t nsh = json_array_size(jsh);
	if (nsh > SF_MAX_SHARDS)
		return fail(w, -SF_ETOOBIG, "%zu shards, more than %u", nsh, SF_MAX_SHARDS);

	rc = tensor_append(m, is_file, name, len, dtype, ndim, shape, nbytes, &t);
	if (rc == -SF_ETOOBIG)
		return fail(w, rc, "more than %u tensors and files", SF_MAX_TENSORS);
	if (rc < 0)
		return rc;
	if (nsh) {
		t->shards = calloc(nsh, sizeof(*t->shards));
		if (!t->shards)
			return -ENOMEM;
		t->cap_shards = nsh;
	}
	for (size_t i = 0; i < nsh; i++) {
		struct sf_shard s = { 0 };
		w->shard = (long)i;
		rc = parse_shard(w, m, t, json_array_get(jsh, i), &s);
		if (rc < 0) {
			shard_free(&s);
			return rc;
		}
		t->shards[t->nshards++] = s;
	}
	w->shard = -1;
	return 0;
}

/* Parse every entry of a "tensors" or "files" object. */
static int parse_section(struct where *w, struct sf_manifest *m, bool is_file,
			 const json_t *obj)
{
	const char *key;
	size_t klen;
	json_t *v;

	json_object_keylen_foreach((json_t *)obj, key, klen, v) {
		int rc = parse_tensor(w, m, is_file, key, klen, v);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int parse_impl(const char *json, size_t len, bool partial,
		      struct sf_manifest **out, char *err, size_t errlen)
{
	struct where w = { .shard = -1, .err = err, .errlen = errlen };
	struct sf_manifest *m = NULL;
	json_error_t jerr;
	const char *s;
	size_t slen;
	uint64_t world, bsize;
	int rc;

	if (err && errlen)
		err[0] = '\0';
	if (!out || (!json && len))
		return -EINVAL;
	*out = NULL;
	if (len > SF_MAX_MANIFEST_BYTES)
		return fail(&w, -SF_ETOOBIG, "manifest is %zu bytes, more than the limit of %u",
			    len, SF_MAX_MANIFEST_BYTES);
	json_t *root = json_loadb(json ? json : "", len,
				  JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!root)
		return fail(&w, -SF_EMANIFEST, "invalid JSON at line %d column %d: %s",
			    jerr.line, jerr.column, jerr.text);
	if (!json_is_object(root)) {
		rc = fail(&w, -SF_EMANIFEST, "the manifest must be a JSON object");
		goto out_decref;
	}

	rc = get_string(&w, root, "format", &s, &slen);
	if (rc < 0)
		goto out_decref;
	if (slen != strlen(SF_FORMAT) || memcmp(s, SF_FORMAT, slen) != 0) {
		char q[sizeof(w.qname)];
		quote_name(q, s, slen);
		rc = fail(&w, -SF_EMANIFEST, "\"format\" is %s, expected \"" SF_FORMAT "\"", q);
		goto out_decref;
	}
	rc = get_string(&w, root, "name", &s, &slen);
	if (rc < 0)
		goto out_decref;
	const char *why = name_problem(s, slen, true, true);
	if (why) {
		rc = fail(&w, -SF_EMANIFEST, "\"name\" %s", why);
		goto out_decref;
	}
	rc = get_u64(&w, root, "world_size", &world);
	if (rc < 0)
		goto out_decref;
	if (world < 1 || world > SF_MAX_WORLD) {
		rc = fail(&w, -SF_EMANIFEST, "\"world_size\" = %" PRIu64 " is not in 1..%u",
			  world, SF_MAX_WORLD);
		goto out_decref;
	}
	rc = get_u64(&w, root, "block_size", &bsize);
	if (rc < 0)
		goto out_decref;
	if (bsize < SF_MIN_BLOCK_SIZE || bsize > SF_MAX_BLOCK_SIZE) {
		rc = fail(&w, -SF_EMANIFEST, "\"block_size\" = %" PRIu64 " is not in %u..%u",
			  bsize, SF_MIN_BLOCK_SIZE, SF_MAX_BLOCK_SIZE);
		goto out_decref;
	}

	const json_t *tens = json_object_get(root, "tensors");
	const json_t *files = json_object_get(root, "files");
	if (!tens || !json_is_object(tens)) {
		rc = fail(&w, -SF_EMANIFEST, "\"tensors\" must be an object");
		goto out_decref;
	}
	if (files && !json_is_object(files)) {
		rc = fail(&w, -SF_EMANIFEST, "\"files\" must be an object");
		goto out_decref;
	}
	size_t nt = json_object_size(tens), nf = files ? json_object_size(files) : 0;
	if (nt + nf > SF_MAX_TENSORS) {
		rc = fail(&w, -SF_ETOOBIG, "%zu tensors and files, more than %u",
			  nt + nf, SF_MAX_TENSORS);
		goto out_decref;
	}

	/* s points into root, which outlives this copy. */
	char name[SF_MAX_NAME + 1];
	memcpy(name, s, slen);
	name[slen] = '\0';
	rc = -ENOMEM;
	m = sf_manifest_new(name, (uint32_t)world, bsize);
	if (!m)
		goto out_decref;
	if (nt && !(m->tensors = calloc(nt, sizeof(*m->tensors))))
		goto out_destroy;
	m->cap_tensors = nt;
	if (nf && !(m->files = calloc(nf, sizeof(*m->files))))
		goto out_destroy;
	m->cap_files = nf;

	rc = parse_section(&w, m, false, tens);
	if (rc < 0)
		goto out_destroy;
	if (files) {
		rc = parse_section(&w, m, true, files);
		if (rc < 0)
			goto out_destroy;
	}
	rc = finish_impl(m, partial, err, errlen);
	if (rc < 0)
		goto out_destroy;
	json_decref(root);
	*out = m;
	return 0;

out_destroy:
	sf_manifest_destroy(m);
out_decref:
	json_decref(root);
	return rc;
}

int sf_manifest_parse(const char *json, size_t len, struct sf_manifest **out,
		      char *err, size_t errlen)
{
	return parse_impl(json, len, false, out, err, errlen);
}

int sf_manifest_parse_part(const char *json, size_t len,
			   struct sf_manifest **out, char *err, size_t errlen)
{
	return parse_impl(json, len, true, out, err, errlen);
}

/* ------------------------------------------------------------------ */
/* dump                                                                */

/*
 * The dump writes JSON text straight into one growing buffer instead of
 * building a jansson tree first: a 10,000-tensor manifest is ~10 MB and
 * ~10^6 values, and the tree's allocations were most of a commit's time.
 * Every string written came through name_problem() or is ours (dtype
 * names, hex digests), but jw_str still escapes '"', '\\' and control
 * characters, so the output is valid JSON whatever it is given.
 *
 * Layout: the manifest has one key per line and one shard per line
 * ("pretty"); the shards xattr is compact (no spaces), as before.
 */
struct jw {
	char *buf;      /* malloc'd, NUL-terminated when done */
	size_t len;     /* bytes written */
	size_t cap;     /* bytes allocated, <= SF_MAX_MANIFEST_BYTES + 1 */
	bool pretty;    /* ", " and ": " separators, line breaks */
	int err;        /* first error (-ENOMEM, -SF_ETOOBIG); sticky */
};

static bool jw_reserve(struct jw *w, size_t n)
{
	if (w->err)
		return false;
	if (n > SF_MAX_MANIFEST_BYTES - w->len) {
		w->err = -SF_ETOOBIG;
		return false;
	}
	if (w->len + n + 1 > w->cap) {
		size_t cap = w->cap ? w->cap : 4096;
		while (cap < w->len + n + 1)
			cap *= 2;
		if (cap > (size_t)SF_MAX_MANIFEST_BYTES + 1)
			cap = (size_t)SF_MAX_MANIFEST_BYTES + 1;
		char *b = realloc(w->buf, cap);
		if (!b) {
			w->err = -ENOMEM;
			return false;
		}
		w->buf = b;
		w->cap = cap;
	}
	return true;
}

static void jw_mem(struct jw *w, const char *p, size_t n)
{
	if (jw_reserve(w, n)) {
		memcpy(w->buf + w->len, p, n);
		w->len += n;
	}
}

static void jw_lit(struct jw *w, const char *p)
{
	jw_mem(w, p, strlen(p));
}

/* Separator between members or elements: "," plus a space when pretty. */
static void jw_comma(struct jw *w)
{
	jw_mem(w, ", ", w->pretty ? 2 : 1);
}

static void jw_u64(struct jw *w, uint64_t v)
{
	char tmp[20];
	size_t n = 0;

	do {
		tmp[sizeof(tmp) - 1 - n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	jw_mem(w, tmp + sizeof(tmp) - n, n);
}

static void jw_str(struct jw *w, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	size_t run = 0, n = strlen(s);

	jw_mem(w, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		char esc[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		jw_mem(w, s + run, i - run);
		if (c == '"' || c == '\\') {
			esc[1] = (char)c;
			jw_mem(w, esc, 2);
		} else {
			jw_mem(w, esc, 6);
		}
		run = i + 1;
	}
	jw_mem(w, s + run, n - run);
	jw_mem(w, "\"", 1);
}

/* "key": (with the space when pretty) */
static void jw_key(struct jw *w, const char *key)
{
	jw_str(w, key);
	jw_mem(w, ": ", w->pretty ? 2 : 1);
}

static void jw_u64_array(struct jw *w, const uint64_t *v, size_t n)
{
	jw_mem(w, "[", 1);
	for (size_t i = 0; i < n; i++) {
		if (i)
			jw_comma(w);
		jw_u64(w, v[i]);
	}
	jw_mem(w, "]", 1);
}

static void jw_shard(struct jw *w, const struct sf_tensor *t,
		     const struct sf_shard *s, bool with_sums)
{
	jw_mem(w, "{", 1);
	jw_key(w, "rank");
	jw_u64(w, s->rank);
	jw_comma(w);
	if (s->flat) {
		uint64_t fl[2] = { s->flat_off, s->flat_len };

		jw_key(w, "flat");
		jw_u64_array(w, fl, 2);
	} else {
		jw_key(w, "offsets");
		jw_u64_array(w, s->box.off, t->ndim);
		jw_comma(w);
		jw_key(w, "lengths");
		jw_u64_array(w, s->box.len, t->ndim);
	}
	jw_comma(w);
	jw_key(w, "file");
	jw_str(w, s->file);
	jw_comma(w);
	jw_key(w, "file_offset");
	jw_u64(w, s->file_offset);
	jw_comma(w);
	jw_key(w, "nbytes");
	jw_u64(w, s->nbytes);
	if (with_sums) {
		jw_comma(w);
		jw_key(w, "xxh3");
		jw_mem(w, "[", 1);
		for (uint64_t i = 0; i < s->nblocks; i++) {
			char hex[19];

			hex[0] = '"';
			sf_xxh3_hex(s->xxh3[i], hex + 1);
			hex[17] = '"';
			if (i)
				jw_comma(w);
			jw_mem(w, hex, 18);
		}
		jw_mem(w, "]", 1);
	}
	jw_mem(w, "}", 1);
}

static void jw_shards(struct jw *w, const struct sf_tensor *t, bool with_sums,
		      const char *indent)
{
	jw_mem(w, "[", 1);
	for (size_t i = 0; i < t->nshards; i++) {
		if (i)
			jw_mem(w, ",", 1);
		if (w->pretty) {
			jw_mem(w, "\n", 1);
			jw_lit(w, indent);
		}
		jw_shard(w, t, &t->shards[i], with_sums);
	}
	jw_mem(w, "]", 1);
}

static void jw_tensors(struct jw *w, const struct sf_tensor *arr, size_t n)
{
	jw_mem(w, "{", 1);
	for (size_t i = 0; i < n; i++) {
		const struct sf_tensor *t = &arr[i];

		jw_lit(w, i ? ",\n  " : "\n  ");
		jw_key(w, t->name);
		jw_mem(w, "{", 1);
		jw_key(w, "dtype");
		jw_str(w, sf_dtype_name(t->dtype));
		jw_comma(w);
		jw_key(w, "shape");
		jw_u64_array(w, t->shape, t->ndim);
		jw_comma(w);
		jw_key(w, "shards");
		jw_shards(w, t, true, "   ");
		jw_mem(w, "}", 1);
	}
	jw_lit(w, n ? "\n }" : "}");
}

/* Hand the text to the caller (NUL-terminated, malloc'd), or free it and
 * return the first error. */
static int jw_finish(struct jw *w, char **out, size_t *len)
{
	jw_reserve(w, 0); /* room for the NUL, also when nothing was written */
	if (w->err) {
		free(w->buf);
		return w->err;
	}
	w->buf[w->len] = '\0';
	*out = w->buf;
	if (len)
		*len = w->len;
	return 0;
}

int sf_manifest_dump(const struct sf_manifest *m, char **out, size_t *len)
{
	struct jw w = { .pretty = true };

	if (!m || !out)
		return -EINVAL;
	*out = NULL;
	jw_lit(&w, "{\n ");
	jw_key(&w, "format");
	jw_str(&w, SF_FORMAT);
	jw_lit(&w, ",\n ");
	jw_key(&w, "name");
	jw_str(&w, m->name);
	jw_lit(&w, ",\n ");
	jw_key(&w, "world_size");
	jw_u64(&w, m->world_size);
	jw_lit(&w, ",\n ");
	jw_key(&w, "block_size");
	jw_u64(&w, m->block_size);
	jw_lit(&w, ",\n ");
	jw_key(&w, "tensors");
	jw_tensors(&w, m->tensors, m->ntensors);
	jw_lit(&w, ",\n ");
	jw_key(&w, "files");
	jw_tensors(&w, m->files, m->nfiles);
	jw_lit(&w, "\n}\n");
	return jw_finish(&w, out, len);
}

int sf_tensor_shards_json(const struct sf_tensor *t, char **out, size_t *len)
{
	struct jw w = { .pretty = false };

	if (!t || !out)
		return -EINVAL;
	*out = NULL;
	jw_shards(&w, t, false, "");
	return jw_finish(&w, out, len);
}
