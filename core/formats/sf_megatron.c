/*
 * sf_megatron.c - the Megatron-Core adapter (sf_megatron.h): metadata.json,
 * the torch_dist backend through the DCP adapter (sf_dcp_open_ex),
 * flattened-range tensors shown in their real shape, and 0.15+ names
 * (dp_reshardable buckets, singleton_local_shards pairs).
 *
 * Invariants:
 *  - metadata.json is read beneath the checkpoint (sf_cfile_open), at
 *    most SF_MCORE_CONFIG_MAX bytes, and only its two sharded_backend
 *    fields are used; common.pt is never opened (it is a root file the
 *    DCP machinery serves as it is);
 *  - a reformulated tensor is reshaped only when .metadata's numbers agree
 *    exactly (X_i = F_i * b_i, prod(b) = the stored last axis, every chunk
 *    a flat range of one block); otherwise that tensor alone is left out
 *    with one log line. Its new shards are the same bytes as DCP's, cut
 *    into boxes, so coverage and bounds are checked by the model as for
 *    any adapter;
 *  - renaming (dp_reshardable buckets) and joining (singleton pairs) keep
 *    the shards' bytes: a joined tensor's shards are its parts' shards,
 *    the second part's moved along axis 0 by the first's rows, added
 *    through sf_tensor_add_shard (bounds checked); a pair that cannot be
 *    joined stays as stored with one log line;
 *  - the directory is only ever read.
 */
#include "sf_megatron.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_array.h"
#include "sf_dcp.h"
#include "sf_error.h"
#include "sf_io.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_model.h"
#include "sf_pickle.h"

#define MCORE_TORCH_MOD "megatron.core.dist_checkpointing.strategies.torch"
#define ORIG_SHAPE "nd_reformulated_orig_global_shape"

static const struct sf_pk_global mcore_globals[] = {
	{ MCORE_TORCH_MOD, "MCoreMetadata" },   /* 0.15: .metadata's root */
	{ MCORE_TORCH_MOD, "MCoreSavePlan" },   /* in all_local_plans */
};

/* --- metadata.json --- */

static bool backend_ok(const char *s, size_t n)
{
	if (n == 0 || n >= SF_MCORE_BACKEND_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
			return false;
	}
	return true;
}

int sf_mcore_config_parse(const char *text, size_t len,
			  struct sf_mcore_config *out, bool *foreign,
			  char *err, size_t errlen)
{
	struct sf_where w;
	json_error_t je;
	json_t *root, *b, *v;
	int rc = 0;

	sf_where_init(&w, err, errlen);
	*foreign = true;
	if (len > SF_MCORE_CONFIG_MAX)
		return sf_fail(&w, -SF_ETOOBIG, SF_MCORE_CONFIG ": larger than %u bytes",
			       SF_MCORE_CONFIG_MAX);
	root = json_loadb(text, len, 0, &je);
	if (!root)
		return sf_fail(&w, -SF_EFORMAT, SF_MCORE_CONFIG ": not JSON (line %d)",
			       je.line);
	b = json_is_object(root) ? json_object_get(root, "sharded_backend") : NULL;
	if (!b) {
		rc = sf_fail(&w, -SF_EFORMAT, SF_MCORE_CONFIG ": no sharded_backend");
		goto out_decref;
	}
	*foreign = false;
	if (!json_is_string(b) || !backend_ok(json_string_value(b), json_string_length(b))) {
		rc = sf_fail(&w, -SF_EFORMAT,
			     SF_MCORE_CONFIG ": sharded_backend is not a short name");
		goto out_decref;
	}
	memcpy(out->backend, json_string_value(b), json_string_length(b) + 1);
	out->version = 1;
	v = json_object_get(root, "sharded_backend_version");
	if (v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > INT32_MAX) {
			rc = sf_fail(&w, -SF_EFORMAT,
				     SF_MCORE_CONFIG ": sharded_backend_version is not a small integer");
			goto out_decref;
		}
		out->version = json_integer_value(v);
	}
out_decref:
	json_decref(root);
	return rc;
}

/* --- flat ranges of a block as boxes --- */

int sf_mcore_flat_boxes(unsigned n, const uint64_t *org, const uint64_t *blk,
			uint64_t start, uint64_t len, struct sf_box *out,
			size_t *nout)
{
	uint64_t S[SF_MAX_NDIM + 1]; /* S[k]: elements in the last k axes */
	uint64_t a = start, e;
	size_t nb = 0;

	*nout = 0;
	if (n == 0 || n > SF_MAX_NDIM)
		return -SF_ERANGE;
	S[0] = 1;
	for (unsigned k = 1; k <= n; k++)
		if (__builtin_mul_overflow(S[k - 1], blk[n - k], &S[k]))
			return -SF_ETOOBIG;
	if (len == 0 || __builtin_add_overflow(start, len, &e) || e > S[n])
		return -SF_ERANGE;
	while (a < e) {
		struct sf_box *bx;
		unsigned k = n, j;
		uint64_t cnt;

		/* the most trailing axes a whole run of which starts at a */
		while (k > 0 && (a % S[k] != 0 || e - a < S[k]))
			k--;
		if (nb == SF_MCORE_MAX_BOXES(n))
			return -SF_ERANGE; /* cannot happen: the bound is exact */
		bx = &out[nb++];
		bx->ndim = n;
		if (k == n) { /* the whole block */
			for (unsigned i = 0; i < n; i++) {
				bx->off[i] = org[i];
				bx->len[i] = blk[i];
			}
			a = e;
			continue;
		}
		j = n - 1 - k; /* the axis the run steps along */
		for (unsigned i = 0; i < j; i++) {
			bx->off[i] = org[i] + (a / S[n - 1 - i]) % blk[i];
			bx->len[i] = 1;
		}
		bx->off[j] = (a / S[k]) % blk[j];
		cnt = (e - a) / S[k];
		if (cnt > blk[j] - bx->off[j])
			cnt = blk[j] - bx->off[j];
		bx->off[j] += org[j];
		bx->len[j] = cnt;
		for (unsigned i = j + 1; i < n; i++) {
			bx->off[i] = org[i];
			bx->len[i] = blk[i];
		}
		a += cnt * S[k];
	}
	*nout = nb;
	return 0;
}

/* --- reformulated tensors --- */

struct mcore {
	const char *name;            /* the checkpoint's, for log lines */
	size_t *bad;                 /* owned: indices into m->tensors of the
				      * tensors to leave out, distinct */
	size_t nbad, capbad;
};

/* A torch.Size(...), tuple or list of non-negative ints, at most max dims. */
static bool shape_of(const struct sf_pk *v, uint64_t *out, unsigned *ndim,
		     unsigned max)
{
	return sf_pk_uints(v, SF_PK_UINTS_SIZE | SF_PK_UINTS_LIST, out, max, ndim);
}


/* The new shards of t (shape X now) for old shard s of the reformulated
 * tensor (blocks blk). 0 or an error with the reason in why. */
static int add_flat_chunk(struct sf_model *m, struct sf_tensor *t,
			  const struct sf_shard *s, const uint64_t *blk,
			  char *why, size_t whylen)
{
	unsigned n = t->ndim;
	size_t isz = sf_dtype_size(t->dtype), nb;
	struct sf_box boxes[SF_MCORE_MAX_BOXES(SF_MAX_NDIM)];
	uint64_t org[SF_MAX_NDIM], pos;
	int rc;

	/* s is a shard of t as DCP built it: n + 1 dimensions */
	if (s->flat || (s->strides && s->strides[n] != 1)) {
		snprintf(why, whylen, "a chunk is not a flat range of one block");
		return -SF_EFORMAT;
	}
	for (unsigned i = 0; i < n; i++) {
		if (s->len[i] != 1) {
			snprintf(why, whylen, "a chunk spans several blocks");
			return -SF_EFORMAT;
		}
		org[i] = s->off[i] * blk[i]; /* <= X_i: the box lies inside */
	}
	rc = sf_mcore_flat_boxes(n, org, blk, s->off[n], s->len[n],
				 boxes, &nb);
	if (rc) {
		snprintf(why, whylen, "a chunk's flat range lies outside its block");
		return rc;
	}
	pos = s->off[n];
	for (size_t i = 0; i < nb; i++) {
		struct sf_shard ns = { .rank = s->rank, .off = boxes[i].off,
				       .len = boxes[i].len, .file = s->file };
		uint64_t numel = sf_box_numel(&boxes[i]);

		ns.file_offset = s->file_offset + (pos - s->off[n]) * isz;
		ns.nbytes = numel * isz;
		rc = sf_tensor_add_shard(m, t, &ns);
		if (rc) {
			snprintf(why, whylen, "%s", sf_model_why(m));
			return rc;
		}
		pos += numel;
	}
	return 0;
}

/* Show t, stored reformulated, with its original shape X (n dims). 0, or
 * an error with the reason in why; t is then as it was. */
static int unflatten(struct sf_model *m, struct sf_tensor *t, unsigned n,
		     const uint64_t *X, char *why, size_t whylen)
{
	uint64_t blk[SF_MAX_NDIM], L = 1, numel = 1;
	struct sf_shard *old = t->shards;
	size_t nold = t->nshards, capold = t->cap_shards;
	unsigned oldn = t->ndim;
	uint64_t oldshape[SF_MAX_NDIM];
	int rc = 0;

	if (n == 0 || t->ndim != n + 1) {
		snprintf(why, whylen, "its stored shape has %u axes, not %u + 1", t->ndim, n);
		return -SF_EFORMAT;
	}
	for (unsigned i = 0; i < n; i++) {
		if (t->shape[i] == 0 || X[i] % t->shape[i] != 0) {
			snprintf(why, whylen, "axis %u: %llu is not split into %llu blocks",
				 i, (unsigned long long)X[i], (unsigned long long)t->shape[i]);
			return -SF_EFORMAT;
		}
		blk[i] = X[i] / t->shape[i];
		if (__builtin_mul_overflow(L, blk[i], &L) ||
		    __builtin_mul_overflow(numel, X[i], &numel)) {
			snprintf(why, whylen, "its shape overflows");
			return -SF_ETOOBIG;
		}
	}
	if (L != t->shape[n]) {
		snprintf(why, whylen, "blocks of %llu elements stored as %llu",
			 (unsigned long long)L, (unsigned long long)t->shape[n]);
		return -SF_EFORMAT;
	}
	memcpy(oldshape, t->shape, sizeof(oldshape));
	t->shards = NULL;
	t->nshards = t->cap_shards = 0;
	t->ndim = n;
	memset(t->shape, 0, sizeof(t->shape));
	memcpy(t->shape, X, n * sizeof(*X)); /* same numel: nbytes holds */
	for (size_t i = 0; i < nold && !rc; i++)
		rc = add_flat_chunk(m, t, &old[i], blk, why, whylen);
	if (rc) { /* put t back as DCP built it */
		sf_model_free_shards(t->shards, t->nshards);
		t->shards = old;
		t->nshards = nold;
		t->cap_shards = capold;
		t->ndim = oldn;
		memcpy(t->shape, oldshape, sizeof(oldshape));
		return rc;
	}
	sf_model_free_shards(old, nold);
	return 0;
}

static int cmp_tensor_name(const void *a, const void *b)
{
	const struct sf_tensor *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

static int cmp_key_tensor(const void *key, const void *elem)
{
	return strcmp(key, (*(struct sf_tensor *const *)elem)->name);
}

static int cmp_size_desc(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

/* Reshape tensor t as mcore_data's entry v says; a tensor whose numbers
 * disagree is logged and recorded in mc->bad. 0, -SF_EFORMAT (v is
 * malformed: the checkpoint is refused), -ENOMEM. */
static int adjust_one(struct mcore *mc, struct sf_model *m, struct sf_tensor *t,
		      const struct sf_pk *v, const struct sf_where *w)
{
	const struct sf_pk *orig;
	uint64_t X[SF_MAX_NDIM];
	char why[256] = "";
	unsigned n;
	int rc;

	if (v->kind != SF_PK_DICT)
		return sf_fail(w, -SF_EFORMAT, ".metadata: mcore_data of %s is not a dict",
			       t->name);
	orig = sf_pk_get(v, ORIG_SHAPE);
	if (!orig)
		return 0; /* saved as it is */
	if (!shape_of(orig, X, &n, SF_MAX_NDIM - 1)) {
		snprintf(why, sizeof(why), ORIG_SHAPE " is not a shape");
		rc = -SF_EFORMAT;
	} else {
		rc = unflatten(m, t, n, X, why, sizeof(why));
	}
	if (rc == 0 || rc == -ENOMEM)
		return rc;
	sf_kit_log_left_out(mc->name, t->name, "stored as flattened ranges: %s", why);
	rc = sf_array_grow(&mc->bad, mc->nbad, &mc->capbad, sizeof(*mc->bad), 16,
			   SF_MAX_TENSORS);
	if (rc)
		return rc;
	mc->bad[mc->nbad++] = (size_t)(t - m->tensors);
	return 0;
}

/* --- megatron-core 0.17 layouts: dp_reshardable buckets, singleton pairs --- */

#define BUCKET_PREFIX "optimizer.distributed."
#define MAX_NAME 4096 /* bytes of a renamed or merged tensor's name */

/* Is name BUCKET_PREFIX "dp_group_idx_G.gbuf_idx_B.dtype_D.bucket_idx_K.STATE"
 * (the distributed optimizer's dp_reshardable state, megatron-core 0.15+)?
 * Then *bucket (into name) and *blen say "dp_group_idx_G...bucket_idx_K",
 * *state the STATE after it ([A-Za-z0-9_]+). */
static bool bucket_key(const char *name, const char **bucket, size_t *blen,
		       const char **state)
{
	const char *b = name + strlen(BUCKET_PREFIX), *k, *st;

	if (strncmp(name, BUCKET_PREFIX, strlen(BUCKET_PREFIX)) != 0 ||
	    strncmp(b, "dp_group_idx_", 13) != 0 || !strstr(b, ".gbuf_idx_") ||
	    !strstr(b, ".dtype_"))
		return false;
	k = strstr(b, ".bucket_idx_");
	if (!k)
		return false;
	k += strlen(".bucket_idx_");
	if (*k < '0' || *k > '9')
		return false;
	while (*k >= '0' && *k <= '9')
		k++;
	if (*k != '.' || !k[1])
		return false;
	for (st = k + 1; *st; st++)
		if (!((*st >= 'a' && *st <= 'z') || (*st >= 'A' && *st <= 'Z') ||
		      (*st >= '0' && *st <= '9') || *st == '_'))
			return false;
	*bucket = b;
	*blen = (size_t)(k - b);
	*state = k + 1;
	return true;
}

/* Rename every dp_reshardable bucket tensor to optimizer/STATE/BUCKET (SPEC
 * 7's optimizer/ names); *n counts them. 0 or -ENOMEM; a name that would
 * not be valid stays as stored. */
static int rename_buckets(struct sf_model *m, size_t *n)
{
	char buf[MAX_NAME];

	*n = 0;
	for (size_t i = 0; i < m->ntensors; i++) {
		struct sf_tensor *t = &m->tensors[i];
		const char *bucket, *state;
		size_t blen;
		char *nn;
		int len;

		if (!bucket_key(t->name, &bucket, &blen, &state))
			continue;
		len = snprintf(buf, sizeof(buf), "optimizer/%s/%.*s", state,
			       (int)blen, bucket);
		if (len < 0 || (size_t)len >= sizeof(buf) || !sf_name_valid(buf))
			continue;
		nn = strdup(buf);
		if (!nn)
			return -ENOMEM;
		free(t->name);
		t->name = nn;
		(*n)++;
	}
	return 0;
}

static struct sf_tensor *find_tensor(struct sf_model *m, const char *name,
				     size_t *at)
{
	for (size_t i = 0; i < m->ntensors; i++)
		if (strcmp(m->tensors[i].name, name) == 0) {
			*at = i;
			return &m->tensors[i];
		}
	return NULL;
}

/* Add KEY = cat(w, v) on axis 0 (the tensors at iw and iv) to m: w's shards
 * as they are, v's moved by w's rows. 0, 1 when the two cannot be joined
 * (m unchanged), -ENOMEM or another builder error (logged by the caller). */
static int join_pair(struct sf_model *m, const char *key, size_t iw, size_t iv,
		     char *why, size_t whylen)
{
	struct sf_tensor *w = &m->tensors[iw], *v = &m->tensors[iv], *t;
	uint64_t shape[SF_MAX_NDIM], off[SF_MAX_NDIM];
	size_t nt = m->ntensors;
	int rc;

	if (w->dtype != v->dtype || w->ndim != v->ndim || w->ndim == 0)
		return 1;
	for (unsigned i = 1; i < w->ndim; i++)
		if (w->shape[i] != v->shape[i])
			return 1;
	memcpy(shape, w->shape, sizeof(shape));
	if (__builtin_add_overflow(w->shape[0], v->shape[0], &shape[0]))
		return 1;
	rc = sf_model_add_tensor(m, false, key, w->dtype, w->ndim, shape, &t);
	if (rc) {
		snprintf(why, whylen, "%s", sf_model_why(m));
		return rc == -ENOMEM ? rc : 1;
	}
	w = &m->tensors[iw]; /* the add may have moved them */
	v = &m->tensors[iv];
	for (int part = 0; part < 2 && !rc; part++) {
		const struct sf_tensor *src = part ? v : w;

		for (size_t j = 0; j < src->nshards && !rc; j++) {
			struct sf_shard ns = src->shards[j];

			if (ns.flat) {
				rc = 1; /* DCP's shards are boxes */
				break;
			}
			memcpy(off, ns.off, src->ndim * sizeof(*off));
			if (part)
				off[0] += w->shape[0];
			ns.off = off;
			rc = sf_tensor_add_shard(m, t, &ns);
			if (rc)
				snprintf(why, whylen, "%s", sf_model_why(m));
		}
	}
	if (rc) {
		if (m->ntensors > nt)
			sf_model_drop_last(m, SF_ENTRY_TENSOR);
		return rc == -ENOMEM ? rc : 1;
	}
	return 0;
}

/* Drop the tensor at index k (swapped to the end first). */
static void drop_at(struct sf_model *m, size_t k)
{
	size_t last = m->ntensors - 1;

	if (k != last) {
		struct sf_tensor tmp = m->tensors[k];

		m->tensors[k] = m->tensors[last];
		m->tensors[last] = tmp;
	}
	sf_model_drop_last(m, SF_ENTRY_TENSOR);
}

/* singleton_local_shards (megatron-core 0.14+): a gated linear unit's fc1
 * saved as KEY_w and KEY_v is shown as KEY = cat(KEY_w, KEY_v) on axis 0,
 * what the same model saves as KEY without it. Only when KEY itself is not
 * stored and both parts agree in dtype and every axis but the first;
 * otherwise both are shown as stored. *n counts the joined pairs. */
static int join_singletons(struct mcore *mc, struct sf_model *m, size_t *n)
{
	char vname[MAX_NAME], why[256];
	char **keys = NULL; /* owned: the KEYs of the pairs found */
	size_t nkeys = 0, capkeys = 0;
	int rc = 0;

	*n = 0;
	for (size_t i = 0; i < m->ntensors && !rc; i++) {
		const char *name = m->tensors[i].name;
		size_t len = strlen(name), at;
		char *key;

		if (len < 3 || len >= sizeof(vname) || strcmp(name + len - 2, "_w") != 0)
			continue;
		memcpy(vname, name, len + 1);
		vname[len - 1] = 'v';
		if (!find_tensor(m, vname, &at))
			continue;
		key = strndup(name, len - 2);
		if (!key) {
			rc = -ENOMEM;
			break;
		}
		if (find_tensor(m, key, &at)) {
			free(key);
			continue;
		}
		rc = sf_array_grow(&keys, nkeys, &capkeys, sizeof(*keys), 8, SF_MAX_TENSORS);
		if (rc)
			free(key);
		else
			keys[nkeys++] = key;
	}
	for (size_t k = 0; k < nkeys && !rc; k++) {
		size_t len = strlen(keys[k]), iw, iv;

		snprintf(vname, sizeof(vname), "%s_w", keys[k]);
		if (!find_tensor(m, vname, &iw))
			continue;
		vname[len + 1] = 'v';
		if (!find_tensor(m, vname, &iv))
			continue;
		why[0] = '\0';
		rc = join_pair(m, keys[k], iw, iv, why, sizeof(why));
		if (rc > 0) {
			sf_info("checkpoint %s: %s_w and %s_v shown as stored (not "
				"joined into %s%s%s)", SF_QSTR(mc->name), keys[k],
				keys[k], keys[k], why[0] ? ": " : "", why);
			rc = 0;
			continue;
		}
		if (rc)
			break;
		/* drop the parts, the higher index first (the new tensor is last
		 * and stays: it is beyond both) */
		drop_at(m, iw > iv ? iw : iv);
		drop_at(m, iw > iv ? iv : iw);
		(*n)++;
	}
	for (size_t k = 0; k < nkeys; k++)
		free(keys[k]);
	free(keys);
	return rc;
}

/* megatron-core 0.15+ names (0.17's defaults): see sf_megatron.h. */
static int mcore_names(struct mcore *mc, struct sf_model *m)
{
	size_t nb, nj;
	int rc;

	rc = rename_buckets(m, &nb);
	if (!rc)
		rc = join_singletons(mc, m, &nj);
	if (rc)
		return rc;
	if (nb)
		sf_info("checkpoint %s: the distributed optimizer's state is saved "
			"dp_reshardable: %zu bucket tensors shown whole as "
			"optimizer/STATE/BUCKET; which parameter lies where in a "
			"bucket is not in the files, so no per-parameter view",
			SF_QSTR(mc->name), nb);
	if (nj)
		sf_info("checkpoint %s: %zu singleton_local_shards pairs KEY_w, "
			"KEY_v shown as KEY", SF_QSTR(mc->name), nj);
	return 0;
}

/* The DCP adapter's adjust hook: reshape every tensor mcore_data says was
 * reformulated; leave out those whose numbers disagree. */
static int mcore_adjust(void *arg, struct sf_model *m, const struct sf_pk *root,
			const struct sf_where *w)
{
	const struct sf_pk *md = sf_pk_attr(root, "mcore_data");
	struct mcore *mc = arg;
	struct sf_tensor **idx;
	bool *done;
	size_t nt = m->ntensors;
	int rc = 0;

	if (!md || md->kind == SF_PK_NONE)
		return mcore_names(mc, m);
	if (md->kind != SF_PK_DICT)
		return sf_fail(w, -SF_EFORMAT, ".metadata: mcore_data is not a dict");
	if (nt == 0)
		return mcore_names(mc, m);
	/* the model is not finished (unsorted): a sorted index to find keys */
	idx = malloc(nt * sizeof(*idx));
	done = calloc(nt, sizeof(*done));
	if (!idx || !done) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0; i < nt; i++)
		idx[i] = &m->tensors[i];
	qsort(idx, nt, sizeof(*idx), cmp_tensor_name);
	/* last entry first: of repeated keys the last counts, as in Python */
	for (size_t i = md->u.dict.n; i-- > 0 && !rc;) {
		const char *key = sf_pk_str(md->u.dict.k[i]);
		struct sf_tensor **p;

		if (!key) {
			rc = sf_fail(w, -SF_EFORMAT, ".metadata: a mcore_data key is not a string");
			break;
		}
		p = bsearch(key, idx, nt, sizeof(*idx), cmp_key_tensor);
		if (!p || done[p - idx])
			continue; /* left out by DCP, or a repeated key */
		done[p - idx] = true;
		rc = adjust_one(mc, m, *p, md->u.dict.v[i], w);
	}
	if (rc)
		goto out_free;
	/* leave out the bad ones: last index first, each swapped to the end */
	if (mc->nbad > 1)
		qsort(mc->bad, mc->nbad, sizeof(*mc->bad), cmp_size_desc);
	for (size_t i = 0; i < mc->nbad; i++) {
		size_t k = mc->bad[i], last = m->ntensors - 1;

		if (k != last) {
			struct sf_tensor tmp = m->tensors[k];

			m->tensors[k] = m->tensors[last];
			m->tensors[last] = tmp;
		}
		sf_model_drop_last(m, SF_ENTRY_TENSOR);
	}
	rc = mcore_names(mc, m);
out_free:
	free(done);
	free(idx);
	return rc;
}

/* --- the adapter --- */

static enum sf_probe mcore_probe(const struct sf_dirlist *ls)
{
	enum sf_probe p;

	if (!sf_dirlist_has(ls, SF_MCORE_CONFIG, false))
		return SF_PROBE_NO;
	p = sf_format_dcp.probe(ls);
	if (p != SF_PROBE_NO)
		return p;
	/* another backend (zarr): open says it is not read */
	return sf_dirlist_has(ls, SF_MCORE_COMMON, false) ? SF_PROBE_YES :
	       SF_PROBE_NO;
}

/* Does cd hold a complete DCP checkpoint? */
static bool has_dcp(const struct sf_cdir *cd)
{
	struct sf_dirlist ls = { 0 };
	bool yes;

	if (sf_cdir_list(cd, &ls) != 0)
		return false;
	yes = sf_format_dcp.probe(&ls) == SF_PROBE_YES;
	sf_dirlist_free(&ls);
	return yes;
}

static int read_config(const struct sf_cdir *cd, struct sf_mcore_config *cfg,
		       bool *foreign, char *err, size_t errlen)
{
	struct sf_cfile f;
	struct sf_where w;
	char *text = NULL;
	size_t len = 0;
	int rc;

	sf_where_init(&w, err, errlen);
	*foreign = true;
	rc = sf_cfile_open(cd, SF_MCORE_CONFIG, &f);
	if (rc)
		return sf_fail(&w, rc, SF_MCORE_CONFIG ": %s", rc == -EXDEV ?
			       "leads out of the checkpoint" :
			       rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
	rc = sf_cfile_read_all(&f, SF_MCORE_CONFIG_MAX, &text, &len);
	sf_cfile_close(&f);
	if (rc)
		return sf_fail(&w, rc, SF_MCORE_CONFIG ": %s",
			       rc == -SF_ETOOBIG ? "larger than 64 KiB" :
			       rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
	rc = sf_mcore_config_parse(text, len, cfg, foreign, err, errlen);
	free(text);
	return rc;
}

static int mcore_open(const struct sf_cdir *cd, struct sf_format_result *out,
		      char *err, size_t errlen)
{
	struct sf_mcore_config cfg = { 0 };
	struct mcore mc = { .name = cd->name };
	struct sf_dcp_ext ext = {
		.allow = mcore_globals,
		.nallow = sizeof(mcore_globals) / sizeof(mcore_globals[0]),
		.meta_module = MCORE_TORCH_MOD,
		.meta_class = "MCoreMetadata",
		.adjust = mcore_adjust,
		.arg = &mc,
	};
	char fmt[SF_MAX_FORMAT];
	struct sf_where w;
	bool foreign;
	int rc;

	sf_where_init(&w, err, errlen);
	rc = read_config(cd, &cfg, &foreign, err, errlen);
	if (rc == -ENOMEM || rc == -SF_EBUDGET)
		return rc;
	if (rc && foreign && has_dcp(cd)) {
		sf_warn("checkpoint %s: %s; not Megatron-Core's: shown as plain DCP",
			SF_QSTR(cd->name), err);
		if (err && errlen)
			err[0] = '\0';
		return sf_format_dcp.open(cd, out, err, errlen);
	}
	if (rc)
		return rc;
	if (strcmp(cfg.backend, "torch_dist") != 0)
		return sf_fail(&w, -SF_EREFUSED,
			       "a Megatron-Core %s checkpoint (" SF_MCORE_CONFIG
			       "'s sharded_backend): shardfs reads only torch_dist",
			       cfg.backend);
	snprintf(fmt, sizeof(fmt), SF_MCORE_FORMAT " %lld", (long long)cfg.version);
	ext.format = fmt;
	rc = sf_dcp_open_ex(cd, &ext, out, err, errlen);
	free(mc.bad);
	return rc;
}

const struct sf_format sf_format_megatron = {
	.name = SF_MCORE_FORMAT,
	.writable = false,
	.probe = mcore_probe,
	.open = mcore_open,
};
