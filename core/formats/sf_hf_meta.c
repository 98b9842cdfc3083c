/*
 * sf_hf_meta.c - strict decoders of the index JSON of sharded Hugging Face
 * weights and of DCP's safetensors __metadata__ (sf_hf_meta.h).
 *
 * Invariants: jansson parses with duplicate keys refused; every count,
 * length and number is bounded before it is stored; a result is returned
 * only whole (on failure nothing is left to free); names are sorted so
 * lookups are binary searches; messages are one printable line (sf_fail).
 */
#include "sf_hf_meta.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "sf_model.h" /* SF_MAX_*, sf_where, sf_fail */

#define HF_MAX_FILES 65536u

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A JSON string of 1..SF_MAX_NAME bytes without NUL, or NULL. */
static const char *short_str(const json_t *v)
{
	size_t n;

	if (!json_is_string(v))
		return NULL;
	n = json_string_length(v);
	if (n == 0 || n > SF_MAX_NAME || strlen(json_string_value(v)) != n)
		return NULL;
	return json_string_value(v);
}

void sf_hf_index_free(struct sf_hf_index *ix)
{
	if (!ix)
		return;
	for (size_t i = 0; i < ix->n; i++)
		free(ix->names[i]);
	for (size_t i = 0; i < ix->nfiles; i++)
		free(ix->ufiles[i]);
	free(ix->names);
	free(ix->files);
	free(ix->ufiles);
	free(ix->metadata);
	free(ix);
}

/* Fill ix->ufiles with the distinct files of wm (sorted). */
static int index_files(struct sf_hf_index *ix, json_t *wm, struct sf_where *w)
{
	const char **all;
	const char *key;
	json_t *v;
	size_t n = 0;

	all = malloc((ix->n ? ix->n : 1) * sizeof(*all));
	if (!all)
		return -ENOMEM;
	json_object_foreach(wm, key, v)
		all[n++] = json_string_value(v);
	qsort(all, n, sizeof(*all), cmp_str);
	ix->ufiles = calloc(n ? n : 1, sizeof(*ix->ufiles));
	if (!ix->ufiles) {
		free(all);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		if (i && strcmp(all[i], all[i - 1]) == 0)
			continue;
		if (ix->nfiles == HF_MAX_FILES) {
			free(all);
			return sf_fail(w, -SF_ETOOBIG, "weight_map names more than %u files",
				       HF_MAX_FILES);
		}
		ix->ufiles[ix->nfiles] = strdup(all[i]);
		if (!ix->ufiles[ix->nfiles]) {
			free(all);
			return -ENOMEM;
		}
		ix->nfiles++;
	}
	free(all);
	return 0;
}

static const char *find_file(const struct sf_hf_index *ix, const char *f)
{
	char *const *p = bsearch(&f, ix->ufiles, ix->nfiles, sizeof(*ix->ufiles),
				 cmp_str);

	return p ? *p : NULL;
}

int sf_hf_index_parse(const char *json, size_t len, struct sf_hf_index **out,
		      char *err, size_t errlen)
{
	struct sf_hf_index *ix = NULL;
	struct sf_where w;
	json_error_t jerr;
	json_t *root, *wm, *md, *v;
	const char *key;
	size_t i = 0;
	int rc;

	*out = NULL;
	sf_where_init(&w, err, errlen);
	if (len > SF_MAX_MANIFEST_BYTES)
		return sf_fail(&w, -SF_ETOOBIG, "index larger than %u bytes",
			       SF_MAX_MANIFEST_BYTES);
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return sf_fail(&w, -SF_EFORMAT, "index JSON: %s (line %d)", jerr.text,
			       jerr.line);
	wm = json_object_get(root, "weight_map");
	md = json_object_get(root, "metadata");
	if (!json_is_object(root) || !json_is_object(wm)) {
		rc = sf_fail(&w, -SF_EFORMAT, "index is not an object with a weight_map object");
		goto out_put;
	}
	if (md && !json_is_object(md) && !json_is_null(md)) {
		rc = sf_fail(&w, -SF_EFORMAT, "index metadata is not an object");
		goto out_put;
	}
	if (json_object_size(wm) > SF_MAX_TENSORS) {
		rc = sf_fail(&w, -SF_ETOOBIG, "weight_map has more than %u entries",
			     SF_MAX_TENSORS);
		goto out_put;
	}
	json_object_foreach(wm, key, v) {
		size_t kl = strlen(key);

		if (kl == 0 || kl > SF_MAX_NAME) {
			rc = sf_fail(&w, -SF_EFORMAT,
				     "weight_map has a name of %zu bytes (1..%d)", kl,
				     SF_MAX_NAME);
			goto out_put;
		}
		if (!short_str(v)) {
			sf_where_set(&w, "tensor", key, kl);
			rc = sf_fail(&w, -SF_EFORMAT,
				     "its weight_map entry is not a file name of 1..%d bytes",
				     SF_MAX_NAME);
			goto out_put;
		}
	}
	rc = -ENOMEM;
	ix = calloc(1, sizeof(*ix));
	if (!ix)
		goto out_put;
	ix->n = json_object_size(wm);
	ix->names = calloc(ix->n ? ix->n : 1, sizeof(*ix->names));
	ix->files = calloc(ix->n ? ix->n : 1, sizeof(*ix->files));
	if (!ix->names || !ix->files)
		goto out_free;
	if (md && json_is_object(md)) {
		ix->metadata = json_dumps(md, JSON_COMPACT | JSON_PRESERVE_ORDER);
		if (!ix->metadata)
			goto out_free;
	}
	rc = index_files(ix, wm, &w);
	if (rc)
		goto out_free;
	/* names sorted, each with its file from ufiles */
	json_object_foreach(wm, key, v) {
		ix->names[i] = strdup(key);
		if (!ix->names[i]) {
			ix->n = i;
			rc = -ENOMEM;
			goto out_free;
		}
		i++;
	}
	qsort(ix->names, ix->n, sizeof(*ix->names), cmp_str);
	for (i = 0; i < ix->n; i++)
		ix->files[i] = find_file(ix, json_string_value(json_object_get(wm, ix->names[i])));
	json_decref(root);
	*out = ix;
	return 0;

out_free:
	sf_hf_index_free(ix);
out_put:
	json_decref(root);
	return rc;
}

const char *sf_hf_index_file(const struct sf_hf_index *ix, const char *name)
{
	char *const *p;

	if (!ix || !ix->n)
		return NULL;
	p = bsearch(&name, ix->names, ix->n, sizeof(*ix->names), cmp_str);
	return p ? ix->files[p - ix->names] : NULL;
}

/* --- DCP's __metadata__ --- */

void sf_hf_dcp_free(struct sf_hf_dcp *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n; i++)
		free(d->offs[i].name);
	free(d->offs);
	free(d);
}

static int cmp_offs(const void *a, const void *b)
{
	return strcmp(((const struct sf_hf_offsets *)a)->name,
		      ((const struct sf_hf_offsets *)b)->name);
}

/* DCP_SHARDING_INFO's text into d->offs. */
static int parse_sharding(struct sf_hf_dcp *d, const char *text, size_t len,
			  struct sf_where *w)
{
	json_error_t jerr;
	json_t *root, *v;
	const char *key;
	int rc = 0;

	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return sf_fail(w, -SF_EFORMAT, "DCP_SHARDING_INFO: %s (line %d)",
			       jerr.text, jerr.line);
	if (!json_is_object(root)) {
		rc = sf_fail(w, -SF_EFORMAT, "DCP_SHARDING_INFO is not an object");
		goto out_put;
	}
	if (json_object_size(root) > SF_MAX_TENSORS) {
		rc = sf_fail(w, -SF_ETOOBIG, "DCP_SHARDING_INFO has more than %u entries",
			     SF_MAX_TENSORS);
		goto out_put;
	}
	d->offs = calloc(json_object_size(root) ? json_object_size(root) : 1,
			 sizeof(*d->offs));
	if (!d->offs) {
		rc = -ENOMEM;
		goto out_put;
	}
	json_object_foreach(root, key, v) {
		struct sf_hf_offsets *o = &d->offs[d->n];
		json_t *so = json_object_get(v, "saved_offsets");
		size_t kl = strlen(key);

		sf_where_set(w, "tensor", key, kl);
		if (kl == 0 || kl > SF_MAX_NAME || !json_is_object(v) ||
		    !json_is_array(so) || json_array_size(so) > SF_MAX_NDIM) {
			rc = sf_fail(w, -SF_EFORMAT,
				     "DCP_SHARDING_INFO entry is not {\"saved_offsets\": [at most %d offsets]}",
				     SF_MAX_NDIM);
			goto out_put;
		}
		o->ndim = (unsigned)json_array_size(so);
		for (unsigned k = 0; k < o->ndim; k++) {
			json_t *x = json_array_get(so, k);

			if (!json_is_integer(x) || json_integer_value(x) < 0) {
				rc = sf_fail(w, -SF_EFORMAT,
					     "saved_offsets[%u] is not a non-negative integer", k);
				goto out_put;
			}
			o->off[k] = (uint64_t)json_integer_value(x);
		}
		o->name = strdup(key);
		if (!o->name) {
			rc = -ENOMEM;
			goto out_put;
		}
		d->n++;
	}
	qsort(d->offs, d->n, sizeof(*d->offs), cmp_offs);
	/* object keys are unique (duplicates refused), so sorted names are */
out_put:
	json_decref(root);
	return rc;
}

int sf_hf_dcp_parse(const char *json, size_t len, struct sf_hf_dcp **out,
		    char *err, size_t errlen)
{
	struct sf_hf_dcp *d;
	struct sf_where w;
	json_error_t jerr;
	json_t *root, *ver, *si;
	int rc = 0;

	*out = NULL;
	sf_where_init(&w, err, errlen);
	if (len > SF_MAX_MANIFEST_BYTES)
		return sf_fail(&w, -SF_ETOOBIG, "__metadata__ larger than %u bytes",
			       SF_MAX_MANIFEST_BYTES);
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return sf_fail(&w, -SF_EFORMAT, "__metadata__: %s (line %d)", jerr.text,
			       jerr.line);
	if (!json_is_object(root)) {
		rc = sf_fail(&w, -SF_EFORMAT, "__metadata__ is not an object");
		goto out_put;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		rc = -ENOMEM;
		goto out_put;
	}
	ver = json_object_get(root, "DCP_VERSION");
	if (json_is_string(ver) && json_string_length(ver) > 0 &&
	    json_string_length(ver) < sizeof(d->version) &&
	    strspn(json_string_value(ver), "0123456789.") == json_string_length(ver))
		memcpy(d->version, json_string_value(ver), json_string_length(ver) + 1);
	si = json_object_get(root, "DCP_SHARDING_INFO");
	if (si) {
		if (!json_is_string(si)) {
			rc = sf_fail(&w, -SF_EFORMAT, "DCP_SHARDING_INFO is not a string");
		} else {
			d->has_sharding = 1;
			rc = parse_sharding(d, json_string_value(si),
					    json_string_length(si), &w);
		}
	}
	if (rc)
		sf_hf_dcp_free(d);
	else
		*out = d;
out_put:
	json_decref(root);
	return rc;
}

const struct sf_hf_offsets *sf_hf_dcp_find(const struct sf_hf_dcp *d,
					   const char *name)
{
	struct sf_hf_offsets key = { .name = (char *)name };

	if (!d || !d->n)
		return NULL;
	return bsearch(&key, d->offs, d->n, sizeof(*d->offs), cmp_offs);
}
