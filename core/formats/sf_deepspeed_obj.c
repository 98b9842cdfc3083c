/*
 * sf_deepspeed_obj.c - the non-tensor entries of DeepSpeed's archives as
 * JSON, for manifest.json's "deepspeed" key (sf_deepspeed_obj.h).
 *
 * A value decoded by the restricted pickle reader (nothing executed, the
 * adapter's allowlist) is rendered: None, bools, ints, strings as
 * themselves; a float as a number (a non-finite one as the string
 * "inf", "-inf", "nan"); bytes as {"bytes": N}; tuples, lists and sets as
 * arrays; dicts and OrderedDicts as objects (a key that is no string as
 * its JSON text, "null" for others); a tensor as {"tensor": DTYPE,
 * "shape": [...]} (never its data); torch.Size as its list; another
 * object as {"class": "module.name", "args": [...], "state": ...} (what
 * the pickle says, e.g. DeepSpeed's LossScaler with its cur_scale);
 * a global as {"global": "module.name"}.
 *
 * Invariants: at most SF_DS_JSON_MAX_NODES values per call and
 * SF_DS_JSON_MAX_DEPTH levels (deeper: null; past the count: the object
 * gets "truncated": true); strings are the reader's (valid UTF-8, no NUL:
 * sf_pk_str) or left as {"bytes": N}.
 *
 * The same entries as objects/KEY (sf_ds_obj_held): each value written
 * back as a torch.save archive (sf_pickle_write.h), held in memory, at
 * most SF_DS_OBJ_MAX bytes each, SF_DS_OBJ_TOTAL and SF_DS_OBJ_COUNT in
 * all; every name checked as an object's (sf_model_entry_check) and
 * unique, none a directory of another.
 */
#include "sf_deepspeed_obj.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_dtype.h"
#include "sf_error.h"
#include "sf_model.h"
#include "sf_pickle.h"
#include "sf_pickle_write.h"

struct render {
	struct sf_ts_doc *doc;
	unsigned left;          /* values still allowed */
	bool truncated;
};

static json_t *render(struct render *r, const struct sf_pk *v, unsigned depth);

static json_t *global_name(const struct sf_pk *g)
{
	char buf[512];

	if (!g || g->kind != SF_PK_GLOBAL)
		return json_null();
	snprintf(buf, sizeof(buf), "%s.%s", g->u.global.module, g->u.global.name);
	return json_string(buf);
}

static json_t *seq(struct render *r, const struct sf_pk *v, unsigned depth)
{
	json_t *a = json_array();

	for (size_t i = 0; a && v && i < sf_pk_len(v); i++)
		if (json_array_append_new(a, render(r, sf_pk_item(v, i), depth + 1))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

static json_t *dict(struct render *r, const struct sf_pk *v, unsigned depth)
{
	json_t *o = json_object();

	for (size_t i = 0; o && i < v->u.dict.n; i++) {
		const struct sf_pk *k = v->u.dict.k[i];
		char kb[64];
		const char *key = sf_pk_str(k);
		int64_t x;

		if (!key && sf_pk_int(k, &x)) {
			snprintf(kb, sizeof(kb), "%lld", (long long)x);
			key = kb;
		}
		if (!key)
			key = "null";
		if (json_object_set_new(o, key, render(r, v->u.dict.v[i], depth + 1))) {
			json_decref(o);
			return NULL;
		}
	}
	return o;
}

static json_t *tensor(struct render *r, const struct sf_pk *v)
{
	struct sf_ts_tensor t;
	char why[128];
	json_t *o, *shape;

	if (sf_ts_doc_tensor(r->doc, v, "", &t, why, sizeof(why)) != 0)
		return NULL;
	shape = json_array();
	for (unsigned i = 0; shape && i < t.ndim; i++)
		json_array_append_new(shape, json_integer((json_int_t)t.shape[i]));
	o = json_pack("{s:s, s:o*}", "tensor", sf_dtype_name(t.dtype), "shape",
		      shape);
	return o ? o : json_null();
}

static json_t *object(struct render *r, const struct sf_pk *v, unsigned depth)
{
	const struct sf_pk *c = v->u.obj.callable;
	json_t *o, *t;

	if (sf_pk_is_obj(v, "collections", "OrderedDict")) {
		if (v->u.obj.items && v->u.obj.items->kind == SF_PK_DICT)
			return dict(r, v->u.obj.items, depth);
		if (!v->u.obj.items && !v->u.obj.state)
			return json_object(); /* an empty one */
	}
	if (sf_pk_is_obj(v, "torch", "Size"))
		return render(r, sf_pk_item(v->u.obj.args, 0), depth);
	t = tensor(r, v);
	if (t)
		return t;
	o = json_pack("{s:o*}", "class", global_name(c));
	if (o && v->u.obj.args && sf_pk_len(v->u.obj.args))
		json_object_set_new(o, "args", seq(r, v->u.obj.args, depth));
	if (o && v->u.obj.state)
		json_object_set_new(o, "state", render(r, v->u.obj.state, depth + 1));
	if (o && v->u.obj.items)
		json_object_set_new(o, "items", render(r, v->u.obj.items, depth + 1));
	if (o && v->u.obj.elems)
		json_object_set_new(o, "elems", render(r, v->u.obj.elems, depth + 1));
	return o;
}

static json_t *render(struct render *r, const struct sf_pk *v, unsigned depth)
{
	const char *s;

	if (!v || depth > SF_DS_JSON_MAX_DEPTH)
		return json_null();
	if (!r->left) {
		r->truncated = true;
		return json_null();
	}
	r->left--;
	switch (v->kind) {
	case SF_PK_NONE:
		return json_null();
	case SF_PK_BOOL:
		return json_boolean(v->u.b);
	case SF_PK_INT:
		return json_integer((json_int_t)v->u.i);
	case SF_PK_FLOAT:
		if (isnan(v->u.f))
			return json_string("nan");
		if (isinf(v->u.f))
			return json_string(v->u.f > 0 ? "inf" : "-inf");
		return json_real(v->u.f);
	case SF_PK_STR:
		s = sf_pk_str(v);
		return s ? json_string(s) :
		       json_pack("{s:I}", "bytes", (json_int_t)v->u.str.len);
	case SF_PK_BYTES:
		return json_pack("{s:I}", "bytes", (json_int_t)v->u.bytes.len);
	case SF_PK_TUPLE:
	case SF_PK_LIST:
		return seq(r, v, depth);
	case SF_PK_DICT:
		return dict(r, v, depth);
	case SF_PK_GLOBAL:
		return json_pack("{s:o*}", "global", global_name(v));
	case SF_PK_OBJ:
		return object(r, v, depth);
	case SF_PK_PERSID:
		return json_null();
	}
	return json_null();
}

json_t *sf_ds_obj_json(struct sf_ts_doc *doc, const struct sf_pk *root,
		       const char *const *skip)
{
	struct render r = { .doc = doc, .left = SF_DS_JSON_MAX_NODES };
	const struct sf_pk *d = root;
	json_t *o;

	if (d && d->kind == SF_PK_OBJ && sf_pk_is_obj(d, "collections", "OrderedDict"))
		d = d->u.obj.items;
	if (!d || d->kind != SF_PK_DICT)
		return NULL;
	o = json_object();
	for (size_t i = 0; o && i < d->u.dict.n; i++) {
		const char *key = sf_pk_str(d->u.dict.k[i]);
		bool skipped = false;
		json_t *v;

		if (!key)
			continue;
		for (size_t j = 0; skip && skip[j] && !skipped; j++)
			skipped = strcmp(skip[j], key) == 0;
		if (skipped)
			continue;
		v = render(&r, d->u.dict.v[i], 1);
		if (!v || json_object_set_new(o, key, v)) {
			json_decref(o);
			return NULL;
		}
	}
	if (o && r.truncated)
		json_object_set_new(o, "truncated", json_true());
	return o;
}

/* Does v hold a tensor (a tensor call or a storage reference)? Bounded
 * by depth; a value deeper than the writer takes counts as none (the
 * writer then refuses it by depth). */
static bool holds_tensor(const struct sf_pk *v, unsigned depth, unsigned *left)
{
	if (!v || depth >= SF_PKW_MAX_DEPTH || !*left)
		return false;
	(*left)--;
	switch (v->kind) {
	case SF_PK_PERSID:
		return true;
	case SF_PK_TUPLE:
	case SF_PK_LIST:
		for (size_t i = 0; i < v->u.seq.n; i++)
			if (holds_tensor(v->u.seq.v[i], depth + 1, left))
				return true;
		return false;
	case SF_PK_DICT:
		for (size_t i = 0; i < v->u.dict.n; i++)
			if (holds_tensor(v->u.dict.k[i], depth + 1, left) ||
			    holds_tensor(v->u.dict.v[i], depth + 1, left))
				return true;
		return false;
	case SF_PK_OBJ:
		return holds_tensor(v->u.obj.callable, depth + 1, left) ||
		       holds_tensor(v->u.obj.args, depth + 1, left) ||
		       holds_tensor(v->u.obj.kwargs, depth + 1, left) ||
		       holds_tensor(v->u.obj.state, depth + 1, left) ||
		       holds_tensor(v->u.obj.items, depth + 1, left) ||
		       holds_tensor(v->u.obj.elems, depth + 1, left);
	default:
		return false;
	}
}

static int held_one(struct sf_kit *k, const char *name, const struct sf_pk *v,
		    const struct sf_pk_global *allow, size_t nallow,
		    struct sf_ds_held *h)
{
	uint64_t shape = 1;
	unsigned char *buf = NULL;
	size_t len = 0, cap = SF_DS_OBJ_MAX;
	char why[160];
	int rc;

	if (sf_model_entry_check(false, name, SF_DT_U8, 1, &shape) != 0) {
		sf_kit_leave_out(k, name, "objects/: no name an object may have");
		return 0;
	}
	if (h->n >= SF_DS_OBJ_COUNT) {
		sf_kit_leave_out(k, name, "objects/: more than %u objects",
				 SF_DS_OBJ_COUNT);
		return 0;
	}
	if (SF_DS_OBJ_TOTAL - h->bytes < cap)
		cap = SF_DS_OBJ_TOTAL - h->bytes;
	rc = sf_pkw_torch_save(v, allow, nallow, "archive", cap, &buf, &len,
			       why, sizeof(why));
	if (rc == -ENOMEM)
		return rc;
	if (rc == -SF_ETOOBIG && cap < SF_DS_OBJ_MAX) {
		sf_kit_leave_out(k, name, "objects/: past %u bytes in all",
				 SF_DS_OBJ_TOTAL);
		return 0;
	}
	if (rc) {
		sf_kit_leave_out(k, name, "objects/: %s", why);
		return 0;
	}
	rc = sf_array_grow(&h->v, h->n, &h->cap, sizeof(*h->v), 16, 0);
	if (rc) {
		free(buf);
		return -ENOMEM;
	}
	h->v[h->n].name = strdup(name);
	if (!h->v[h->n].name) {
		free(buf);
		return -ENOMEM;
	}
	h->v[h->n].data = buf;
	h->v[h->n].len = len;
	h->n++;
	h->bytes += len;
	return 0;
}

int sf_ds_obj_held(struct sf_kit *k, const struct sf_pk *root,
		   const char *prefix, bool descend,
		   const struct sf_pk_global *allow, size_t nallow,
		   struct sf_ds_held *h)
{
	const struct sf_pk *items = root;
	int rc = 0;

	if (root && root->kind == SF_PK_OBJ)      /* an OrderedDict */
		items = root->u.obj.items;
	if (!items || items->kind != SF_PK_DICT)
		return 0;
	for (size_t i = 0; !rc && i < items->u.dict.n; i++) {
		const char *key = sf_pk_str(items->u.dict.k[i]);
		const struct sf_pk *v = items->u.dict.v[i];
		unsigned left = 1u << 20;
		char name[SF_MAX_NAME];

		if (!key)
			continue; /* manifest.json's "deepspeed" shows it */
		if (snprintf(name, sizeof(name), "%s%s", prefix, key) >=
		    (int)sizeof(name) || strchr(key, '/')) {
			sf_kit_leave_out(k, key, "objects/: no name an object may have");
			continue;
		}
		if (!holds_tensor(v, 0, &left)) {
			rc = held_one(k, name, v, allow, nallow, h);
			continue;
		}
		if (descend && (v->kind == SF_PK_DICT || v->kind == SF_PK_OBJ) &&
		    strlen(name) + 2 < sizeof(name)) {
			strcat(name, "/");
			rc = sf_ds_obj_held(k, v, name, false, allow, nallow, h);
			continue;
		}
		h->tensors++;
	}
	return rc;
}

static int held_cmp(const void *a, const void *b)
{
	return strcmp(((const struct sf_held *)a)->name,
		      ((const struct sf_held *)b)->name);
}

static int held_find(const struct sf_ds_held *h, const char *name, size_t len)
{
	size_t lo = 0, hi = h->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strncmp(h->v[mid].name, name, len);

		if (c == 0 && h->v[mid].name[len] != '\0')
			c = 1;
		if (c == 0)
			return (int)mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

void sf_ds_held_finish(struct sf_kit *k, struct sf_ds_held *h)
{
	bool *drop = h->n ? calloc(h->n, sizeof(*drop)) : NULL;
	size_t j = 0;

	if (h->n > 1)
		qsort(h->v, h->n, sizeof(*h->v), held_cmp);
	for (size_t i = 0; drop && i < h->n; i++) {
		const char *a = h->v[i].name;

		if (i > 0 && strcmp(h->v[i - 1].name, a) == 0)
			drop[i] = drop[i - 1] = true;
		for (const char *s = strchr(a, '/'); s; s = strchr(s + 1, '/')) {
			int f = held_find(h, a, (size_t)(s - a));

			if (f >= 0)
				drop[f] = true;
		}
	}
	for (size_t i = 0; i < h->n; i++) {
		if (!drop || drop[i]) {
			sf_kit_leave_out(k, h->v[i].name,
					 drop ? "objects/: another object takes its name" :
						"objects/: out of memory");
			h->bytes -= h->v[i].len;
			free(h->v[i].name);
			free(h->v[i].data);
			continue;
		}
		h->v[j++] = h->v[i];
	}
	h->n = j;
	free(drop);
}
