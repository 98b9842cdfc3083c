/*
 * sf_st_header.c - strict safetensors header parser (see sf_st_header.h),
 * for the GPU loader and the format adapters of safetensors files.
 *
 * Invariants: nothing from the file is trusted. The header length is bounded
 * by SF_MAX_ST_HEADER and the file size before any allocation; entries are
 * capped at SF_MAX_TENSORS and names at SF_MAX_NAME bytes; every offset and
 * size is checked without overflow; a header is returned only when its
 * entries tile the data section exactly, so a loader may trust
 * [data_start + begin, data_start + end) to lie inside the file.
 */
#include "sf_st_header.h"
#include "sf_io.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_error.h"
#include "sf_model.h"

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
		/* Names and jansson's "near '...'" quote the input, which may
		 * hold newlines and other control bytes: keep the message one
		 * printable line (found by test/fuzz/fuzz_st_header). */
		for (char *p = err; *p; p++)
			if ((unsigned char)*p < 0x20 || *p == 0x7f)
				*p = '?';
	}
	return rc;
}

/* A JSON integer that is a non-negative uint64 (jansson holds json_int_t,
 * a signed 64-bit value, so the range is [0, INT64_MAX]). */
static int get_u64(const json_t *v, uint64_t *out)
{
	json_int_t x;

	if (!json_is_integer(v))
		return -1;
	x = json_integer_value(v);
	if (x < 0)
		return -1;
	*out = (uint64_t)x;
	return 0;
}

/* Short printable form of a name for error messages. */
static const char *shown(const char *name)
{
	return strlen(name) <= 64 ? name : "(long name)";
}

static int parse_entry(const char *name, const json_t *v,
		       struct sf_st_entry *e, char *err, size_t errlen)
{
	const json_t *dt, *shape, *offs;
	uint64_t numel = 1, nbytes, d;
	size_t i, nd;
	const char *dname;

	if (!json_is_object(v))
		return fail(err, errlen, -SF_EMANIFEST,
			    "tensor %s: entry is not an object", shown(name));
	dt = json_object_get(v, "dtype");
	shape = json_object_get(v, "shape");
	offs = json_object_get(v, "data_offsets");
	if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs))
		return fail(err, errlen, -SF_EMANIFEST,
			    "tensor %s: needs dtype, shape and data_offsets",
			    shown(name));
	dname = json_string_value(dt);
	e->dtype = sf_dtype_from_name(dname, json_string_length(dt));
	if (e->dtype == SF_DT_INVALID)
		return fail(err, errlen, -SF_EMANIFEST,
			    "tensor %s: unknown dtype", shown(name));
	nd = json_array_size(shape);
	if (nd > SF_MAX_NDIM)
		return fail(err, errlen, -SF_ETOOBIG,
			    "tensor %s: %zu dimensions (max %d)", shown(name),
			    nd, SF_MAX_NDIM);
	e->ndim = (unsigned)nd;
	for (i = 0; i < nd; i++) {
		if (get_u64(json_array_get(shape, i), &d))
			return fail(err, errlen, -SF_EMANIFEST,
				    "tensor %s: shape[%zu] is not a non-negative integer",
				    shown(name), i);
		e->shape[i] = d;
		if (__builtin_mul_overflow(numel, d, &numel))
			return fail(err, errlen, -SF_EMANIFEST,
				    "tensor %s: shape overflows", shown(name));
	}
	if (__builtin_mul_overflow(numel, (uint64_t)sf_dtype_size(e->dtype),
				   &nbytes))
		return fail(err, errlen, -SF_EMANIFEST,
			    "tensor %s: size overflows", shown(name));
	if (json_array_size(offs) != 2 ||
	    get_u64(json_array_get(offs, 0), &e->begin) ||
	    get_u64(json_array_get(offs, 1), &e->end))
		return fail(err, errlen, -SF_EMANIFEST,
			    "tensor %s: data_offsets must be [begin, end]",
			    shown(name));
	if (e->end < e->begin || e->end - e->begin != nbytes)
		return fail(err, errlen, -SF_EMANIFEST,
			    "tensor %s: data_offsets [%llu, %llu] do not hold %llu bytes",
			    shown(name), (unsigned long long)e->begin,
			    (unsigned long long)e->end,
			    (unsigned long long)nbytes);
	return 0;
}

static int by_begin(const void *a, const void *b)
{
	const struct sf_st_entry *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	/* empty tensors share a begin with their neighbour: order by end */
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

void sf_st_header_destroy(struct sf_st_header *h)
{
	size_t i;

	if (!h)
		return;
	for (i = 0; i < h->n; i++)
		free(h->entries[i].name);
	free(h->entries);
	free(h->metadata);
	free(h);
}

int sf_st_header_parse(const char *json, uint64_t json_len,
		       uint64_t file_size, struct sf_st_header **out,
		       char *err, size_t errlen)
{
	struct sf_st_header *h;
	json_error_t jerr;
	json_t *root, *v;
	const char *key;
	uint64_t pos;
	size_t count, i;
	int rc;

	*out = NULL;
	if (json_len < 2 || json_len > SF_MAX_ST_HEADER)
		return fail(err, errlen, -SF_EMANIFEST,
			    "header length %llu outside [2, %u]",
			    (unsigned long long)json_len, SF_MAX_ST_HEADER);
	if (file_size < 8 || json_len > file_size - 8)
		return fail(err, errlen, -SF_EMANIFEST,
			    "header length %llu exceeds the file (%llu bytes)",
			    (unsigned long long)json_len,
			    (unsigned long long)file_size);
	root = json_loadb(json, (size_t)json_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fail(err, errlen, -SF_EMANIFEST, "header JSON: %s (line %d)",
			    jerr.text, jerr.line);
	if (!json_is_object(root)) {
		rc = fail(err, errlen, -SF_EMANIFEST, "header is not a JSON object");
		goto out_put_root;
	}
	count = json_object_size(root);
	if (json_object_get(root, "__metadata__")) {
		if (!json_is_object(json_object_get(root, "__metadata__"))) {
			rc = fail(err, errlen, -SF_EMANIFEST,
				  "__metadata__ is not an object");
			goto out_put_root;
		}
		count--;
	}
	if (count > SF_MAX_TENSORS) {
		rc = fail(err, errlen, -SF_ETOOBIG, "%zu tensors (max %u)", count,
			  SF_MAX_TENSORS);
		goto out_put_root;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		rc = -ENOMEM;
		goto out_put_root;
	}
	h->entries = calloc(count ? count : 1, sizeof(*h->entries));
	if (!h->entries) {
		rc = -ENOMEM;
		goto out_destroy_h;
	}
	h->data_start = 8 + json_len;
	h->data_len = file_size - h->data_start;
	v = json_object_get(root, "__metadata__");
	if (v) {
		h->metadata = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
		if (!h->metadata) {
			rc = -ENOMEM;
			goto out_destroy_h;
		}
	}
	json_object_foreach(root, key, v) {
		struct sf_st_entry *e;
		size_t klen = strlen(key);

		if (!strcmp(key, "__metadata__"))
			continue;
		if (klen == 0 || klen > SF_MAX_NAME) {
			rc = fail(err, errlen, -SF_EMANIFEST,
				  "tensor name of %zu bytes (1..%d)", klen,
				  SF_MAX_NAME);
			goto out_destroy_h;
		}
		e = &h->entries[h->n];
		e->name = strdup(key);
		if (!e->name) {
			rc = -ENOMEM;
			goto out_destroy_h;
		}
		h->n++;
		rc = parse_entry(key, v, e, err, errlen);
		if (rc)
			goto out_destroy_h;
	}
	qsort(h->entries, h->n, sizeof(*h->entries), by_begin);
	pos = 0;
	for (i = 0; i < h->n; i++) {
		if (h->entries[i].begin != pos) {
			rc = fail(err, errlen, -SF_EMANIFEST,
				  "tensor %s: begins at %llu, expected %llu (%s)",
				  shown(h->entries[i].name),
				  (unsigned long long)h->entries[i].begin,
				  (unsigned long long)pos,
				  h->entries[i].begin < pos ? "overlap" : "hole");
			goto out_destroy_h;
		}
		pos = h->entries[i].end;
	}
	if (pos != h->data_len) {
		rc = fail(err, errlen, -SF_EMANIFEST,
			  "tensors end at %llu but the data section holds %llu bytes",
			  (unsigned long long)pos,
			  (unsigned long long)h->data_len);
		goto out_destroy_h;
	}
	json_decref(root);
	*out = h;
	return 0;

out_destroy_h:
	sf_st_header_destroy(h);
out_put_root:
	json_decref(root);
	return rc;
}

int sf_st_header_read_input(const struct sf_input *in, struct sf_st_header **out,
			    char *err, size_t errlen)
{
	unsigned char lenbuf[8];
	uint64_t n = 0, size = in->size;
	char *json;
	int i, rc;

	*out = NULL;
	if (size < 8)
		return fail(err, errlen, -SF_EMANIFEST,
			    "file of %llu bytes has no header length",
			    (unsigned long long)size);
	rc = sf_input_read(in, lenbuf, 8, 0);
	if (rc)
		return fail(err, errlen, rc == -SF_ESHORT ? -SF_ESHORT : rc,
			    "reading the header length: %s", sf_strerror(rc));
	for (i = 7; i >= 0; i--)
		n = (n << 8) | lenbuf[i];
	/* bound before allocating */
	if (n < 2 || n > SF_MAX_ST_HEADER || n > size - 8)
		return fail(err, errlen, -SF_EMANIFEST,
			    "header length %llu invalid for a file of %llu bytes",
			    (unsigned long long)n, (unsigned long long)size);
	json = malloc((size_t)n);
	if (!json)
		return -ENOMEM;
	rc = sf_input_read(in, json, (size_t)n, 8);
	if (rc) {
		rc = fail(err, errlen, rc, "reading the header: %s",
			  rc == -SF_ESHORT ? "short file" : sf_strerror(rc));
		goto out_free_json;
	}
	rc = sf_st_header_parse(json, n, size, out, err, errlen);
out_free_json:
	free(json);
	return rc;
}

int sf_st_header_read(int fd, struct sf_st_header **out, char *err,
		      size_t errlen)
{
	struct sf_input in;
	struct stat sb;

	*out = NULL;
	if (fstat(fd, &sb))
		return fail(err, errlen, -errno, "fstat: %s", strerror(errno));
	in = sf_input_fd(fd, 0, (uint64_t)sb.st_size);
	return sf_st_header_read_input(&in, out, err, errlen);
}
