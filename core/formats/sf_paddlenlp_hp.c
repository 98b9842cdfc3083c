/*
 * sf_paddlenlp_hp.c - the PaddleNLP hybrid-parallel checkpoint adapter
 * (sf_paddlenlp_hp.h).
 *
 * Invariants:
 *  - the probe looks at names only; open reads only the files it lists
 *    (plain names, opened beneath the directory through the registry) and
 *    config.json (at most HP_MAX_CONFIG bytes);
 *  - pickles are decoded by the restricted reader with numpy's array
 *    globals and builtins.tuple (paddle's tensor wrapper) only: a file
 *    naming anything else leaves the checkpoint out with its reason;
 *  - a piece is served only from an array found in its file, inside it,
 *    whose bytes are its shape's (sf_paddle_np_array), C order,
 *    little-endian; every tensor rank must hold a piece of the same dtype
 *    and shape, else the tensor is left out with one line;
 *  - a tensor-parallel axis comes from PaddleNLP's split rules for
 *    config.json's model_type (sf_paddlenlp_tp) only when that type is
 *    known and its tensor_parallel_degree is the files' (else the open
 *    fails: no guessing); an optimizer state
 *    is cut like its parameter only when its local shape is the
 *    parameter's, or, as sharding V2 slices, when its 1-D slices add up,
 *    in sharding-rank order, to exactly the padded size paddle gives the
 *    parameter (else it is left out with one line);
 *  - overlaps: replicated pieces through sf_overlap_rule (tensor rank 0
 *    serves), every tensor covered (sf_cover_check);
 *  - the directory is only ever read.
 */
#include "sf_paddlenlp_hp.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_error.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_paddle.h"
#include "sf_paddlenlp_meta.h"
#include "sf_paddlenlp_tp.h"
#include "sf_pickle.h"

#define HP_MAX_RANK 100u            /* two digits: tpXX, ppYY, shardZZ */
#define HP_MAX_FILES 65536u
#define HP_MAX_CONFIG (1u << 20)
#define HP_MAX_PIECES (SF_MAX_TENSORS * 8u)
#define NAMEMAP "StructuredToParameterName@@"
#define MASTER_SEP "_fp32_master_0_"

static const struct sf_pk_global hp_allow[] = {
	{ "numpy._core.multiarray", "_reconstruct" },
	{ "numpy.core.multiarray", "_reconstruct" },
	{ "numpy", "ndarray" },
	{ "numpy", "dtype" },
	{ "builtins", "tuple" },
};

/* --- names and the probe --- */

enum hp_kind { HP_MODEL, HP_OPT };

/* A file name of the checkpoint: its kind and ranks (-1: not in its
 * suffix). */
struct hp_name {
	enum hp_kind kind;
	int tp, pp, shard;
};

/* "tp07" at s: true with its value, s advanced past it. */
static bool token(const char **s, const char *tag, int *v)
{
	size_t n = strlen(tag);
	const char *p = *s;

	if (strncmp(p, tag, n) != 0 || p[n] < '0' || p[n] > '9' ||
	    p[n + 1] < '0' || p[n + 1] > '9')
		return false;
	*v = (p[n] - '0') * 10 + (p[n + 1] - '0');
	*s = p + n + 2;
	return true;
}

/* model_state[.SUFFIX].pdparams or optimizer[.SUFFIX].pdopt, SUFFIX
 * tpXX, ppYY, shardZZ in that order, each optional (one at least), joined
 * by '_'. */
static bool parse_name(const char *nm, struct hp_name *o)
{
	static const struct { const char *head, *ext; enum hp_kind k; } forms[] = {
		{ "model_state", ".pdparams", HP_MODEL },
		{ "optimizer", ".pdopt", HP_OPT },
	};
	static const char *const tags[3] = { "tp", "pp", "shard" };
	size_t n = strlen(nm);

	for (size_t f = 0; f < 2; f++) {
		size_t h = strlen(forms[f].head), e = strlen(forms[f].ext);
		int *vals[3] = { &o->tp, &o->pp, &o->shard }, t = 0, got = 0;
		const char *s = nm + h, *end = nm + n - e;

		if (n < h + e || strncmp(nm, forms[f].head, h) != 0 ||
		    strcmp(end, forms[f].ext) != 0)
			continue;
		o->kind = forms[f].k;
		o->tp = o->pp = o->shard = -1;
		if (s == end)
			return true; /* one card */
		if (*s++ != '.')
			return false;
		while (s < end) {
			if (got && *s++ != '_')
				return false;
			while (t < 3 && !token(&s, tags[t], vals[t]))
				t++;
			if (t == 3 || s > end)
				return false;
			t++;
			got++;
		}
		return got > 0 && s == end;
	}
	return false;
}

/* What the listing holds: the degrees and which files are there. */
struct hp_plan {
	enum sf_probe how;
	int T, P, Z;                /* 1 when the suffix has no such token */
	bool has_opt;
	bool sh_model;               /* sharded model files (save_sharded_model) */
	bool tp_tok, pp_tok, sh_tok; /* the tokens the names carry */
};

static bool plan_file(const struct sf_dirlist *ls, size_t i, struct hp_name *h)
{
	return !ls->is_dir[i] && parse_name(ls->names[i], h);
}

/* The plan's cell of file h: per (tp, pp) the whole model file (0), the
 * optimizer files (1 + shard) and the model's sharded files
 * (save_sharded_model: 1 + Z + shard). */
static size_t cell_of(const struct hp_plan *p, const struct hp_name *h)
{
	size_t t = h->tp < 0 ? 0 : (size_t)h->tp, q = h->pp < 0 ? 0 : (size_t)h->pp;
	size_t z = 1 + (h->shard < 0 ? 0 : (size_t)h->shard);

	if (h->kind == HP_MODEL)
		z = h->shard < 0 ? 0 : z + (size_t)p->Z;
	return (t * (size_t)p->P + q) * (size_t)(2 * p->Z + 1) + z;
}

static void plan_of(const struct sf_dirlist *ls, struct hp_plan *p)
{
	size_t nmodel = 0, nopt = 0, mixed = 0, cells;
	unsigned char *seen;
	bool first_m = true;
	struct hp_name h;

	memset(p, 0, sizeof(*p));
	p->T = p->P = p->Z = 1;
	p->how = SF_PROBE_NO;
	for (size_t i = 0; i < ls->n; i++) {
		if (!plan_file(ls, i, &h))
			continue;
		if (h.kind == HP_MODEL) {
			if (first_m) {
				p->tp_tok = h.tp >= 0;
				p->pp_tok = h.pp >= 0;
				first_m = false;
			} else if (p->tp_tok != (h.tp >= 0) || p->pp_tok != (h.pp >= 0)) {
				mixed++;
			}
			nmodel++;
			p->sh_model |= h.shard >= 0;
		} else {
			nopt++;
			p->sh_tok |= h.shard >= 0;
		}
		if (h.tp + 1 > p->T)
			p->T = h.tp + 1;
		if (h.pp + 1 > p->P)
			p->P = h.pp + 1;
		if (h.shard + 1 > p->Z)
			p->Z = h.shard + 1;
	}
	if (!nmodel)
		return;
	p->has_opt = nopt > 0;
	cells = (size_t)p->T * (size_t)p->P * (size_t)(2 * p->Z + 1);
	seen = calloc(cells, 1);
	if (!seen) {
		p->how = SF_PROBE_PARTIAL; /* no memory to tell: not shown now */
		return;
	}
	for (size_t i = 0; i < ls->n; i++)
		if (plan_file(ls, i, &h))
			seen[cell_of(p, &h)] = 1;
	/* a shard token only with sharding over 2 ranks or more */
	p->how = mixed || (p->sh_model && p->Z < 2) ? SF_PROBE_PARTIAL : SF_PROBE_YES;
	/* every (tp, pp) needs its model (whole, or every sharding rank's
	 * part when the model was saved sharded) and, with optimizer files,
	 * every sharding rank's optimizer file */
	for (size_t c = 0; c < cells; c++) {
		size_t z = c % (size_t)(2 * p->Z + 1);
		bool need = z == 0 ? !p->sh_model :
			    z <= (size_t)p->Z ? p->has_opt : p->sh_model;

		if (!seen[c] && need)
			p->how = SF_PROBE_PARTIAL;
	}
	free(seen);
}

static enum sf_probe hp_probe(const struct sf_dirlist *ls)
{
	struct hp_plan p;

	plan_of(ls, &p);
	return p.how;
}

/* --- files --- */

/* One array of a file. */
struct hp_arr {
	const char *key;             /* borrowed from the file's pickle */
	bool master;                 /* under master_weights */
	struct sf_paddle_np np;
	const char *bad;             /* why it cannot be served, or NULL */
};

/* structured -> static name (the model file's name table) */
struct hp_pair {
	const char *st, *sn;         /* borrowed from the pickle */
	size_t at;                   /* its place in the table */
};

struct hp_file {
	struct sf_pickle *pk;        /* owned: the strings above live in it */
	struct hp_arr *a;
	size_t n, cap;
	struct hp_pair *map;         /* sorted by static name, then place */
	size_t nmap;
	size_t skipped;              /* values that are no arrays */
};

static int cmp_pair(const void *a, const void *b)
{
	const struct hp_pair *x = a, *y = b;
	int c = strcmp(x->sn, y->sn);

	return c ? c : x->at < y->at ? -1 : x->at > y->at;
}

static void hp_drop(void *p)
{
	struct hp_file *f = p;

	if (!f)
		return;
	sf_pickle_free(f->pk);
	free(f->a);
	free(f->map);
	free(f);
}

/* An array node: a bare numpy array, or paddle's (name, array) wrapper. */
static const struct sf_pk *array_node(const struct sf_pk *v)
{
	if (sf_pk_is_obj(v, "builtins", "tuple")) {
		const struct sf_pk *in = sf_pk_item(v->u.obj.args, 0);

		if (sf_pk_len(in) != 2 || !sf_pk_str(sf_pk_item(in, 0)))
			return NULL;
		return sf_pk_item(in, 1);
	}
	return v;
}

static int add_arr(struct hp_file *f, const char *key, const struct sf_pk *v,
		   bool master, uint64_t fsize)
{
	const struct sf_pk *node = array_node(v);
	struct hp_arr a = { .key = key, .master = master };
	int rc;

	if (!node || (node->kind != SF_PK_OBJ)) {
		f->skipped++;
		return 0;
	}
	a.bad = sf_paddle_np_array(node, fsize, &a.np);
	if (!a.bad && a.np.fortran)
		a.bad = "a Fortran-order array";
	rc = sf_array_grow(&f->a, f->n, &f->cap, sizeof(*f->a), 64, SF_MAX_TENSORS);
	if (rc)
		return rc;
	f->a[f->n++] = a;
	return 0;
}

struct hp;
static struct sf_budget *hp_budget(struct hp *h);
static void hp_refuse(struct hp *h, const char *path, const char *why);

/* The registry's decoder: a model or optimizer pickle into an hp_file. */
static int hp_decode(void *arg, struct sf_fileset_file *e, char *why,
		     size_t whylen)
{
	struct hp *hp = arg;
	struct sf_pickle_opts po = { .allow = hp_allow,
				     .nallow = sizeof(hp_allow) / sizeof(hp_allow[0]),
				     .budget = hp_budget(hp) };
	const struct sf_pk *root, *nm;
	struct hp_file *f = calloc(1, sizeof(*f));
	char r[200] = "";
	int rc;

	if (!f)
		return -ENOMEM;
	e->note = f;
	rc = sf_pickle_load(&e->cf.in, &po, &f->pk, r, sizeof(r));
	if (rc == -ENOMEM || rc == -SF_EBUDGET)
		return rc;
	if (rc == -SF_EREFUSED) { /* names a global not allowed */
		hp_refuse(hp, e->path, r);
		snprintf(why, whylen, "is refused");
		return -SF_EFORMAT;
	}
	if (rc) {
		snprintf(why, whylen, "does not decode: %s", r);
		return -SF_EFORMAT;
	}
	root = sf_pickle_root(f->pk);
	if (!root || root->kind != SF_PK_DICT) {
		snprintf(why, whylen, "is not a pickled dict");
		return -SF_EFORMAT;
	}
	for (size_t i = 0; i < root->u.dict.n && !rc; i++) {
		const char *key = sf_pk_str(root->u.dict.k[i]);
		const struct sf_pk *v = root->u.dict.v[i];

		if (!key) {
			f->skipped++;
			continue;
		}
		if (strcmp(key, NAMEMAP) == 0 || strcmp(key, "LR_Scheduler") == 0)
			continue;
		if (strcmp(key, "master_weights") == 0 && v->kind == SF_PK_DICT) {
			for (size_t j = 0; j < v->u.dict.n && !rc; j++) {
				const char *mk = sf_pk_str(v->u.dict.k[j]);

				if (mk)
					rc = add_arr(f, mk, v->u.dict.v[j], true, e->size);
			}
			continue;
		}
		rc = add_arr(f, key, v, false, e->size);
	}
	nm = sf_pk_get(root, NAMEMAP);
	if (!rc && nm && nm->kind == SF_PK_DICT && nm->u.dict.n) {
		f->map = calloc(nm->u.dict.n, sizeof(*f->map));
		if (!f->map)
			return -ENOMEM;
		for (size_t j = 0; j < nm->u.dict.n; j++) {
			const char *st = sf_pk_str(nm->u.dict.k[j]);
			const char *sn = sf_pk_str(nm->u.dict.v[j]);

			if (st && sn)
				f->map[f->nmap++] = (struct hp_pair){ st, sn, j };
		}
		qsort(f->map, f->nmap, sizeof(*f->map), cmp_pair);
	}
	if (rc == -SF_ETOOBIG)
		snprintf(why, whylen, "holds more than %u arrays", SF_MAX_TENSORS);
	return rc;
}

/* --- the open --- */

/* One piece of one shown tensor: an array of one rank's file. */
struct piece {
	char *name;                  /* owned: the shown name */
	const char *param;           /* borrowed: its parameter's structured name */
	int tp, pp, shard;
	const struct sf_fileset_file *f;
	const struct hp_arr *a;
};

struct hp {
	struct sf_kit k;
	struct sf_model *m;
	struct hp_plan plan;
	struct piece *pc;
	size_t npc, cappc;
	struct sf_pnlp_meta meta;    /* model_meta.json's names (maybe none) */
	bool bf16;
	const struct sf_tp_model *rules; /* config.json's model_type's split rules */
	struct sf_tp_cfg tpc;        /* what they depend on */
	int refused;                 /* -SF_EREFUSED once a pickle named a
				      * global not allowed (reason in k.w) */
};

static struct sf_budget *hp_budget(struct hp *h)
{
	return h->k.b;
}

static void hp_refuse(struct hp *h, const char *path, const char *why)
{
	if (!h->refused)
		h->refused = sf_fail(&h->k.w, -SF_EREFUSED, "%s: %s", SF_QSTR(path), why);
}

static int cmp_piece(const void *a, const void *b)
{
	const struct piece *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	if (c)
		return c;
	if (x->tp != y->tp)
		return x->tp < y->tp ? -1 : 1;
	if (x->pp != y->pp)
		return x->pp < y->pp ? -1 : 1;
	return x->shard < y->shard ? -1 : x->shard > y->shard;
}

static int add_piece(struct hp *h, const char *prefix, const char *state,
		     const char *param, const struct hp_name *hn,
		     const struct sf_fileset_file *f, const struct hp_arr *a)
{
	struct piece p = { .param = param, .tp = hn->tp < 0 ? 0 : hn->tp,
			   .pp = hn->pp < 0 ? 0 : hn->pp,
			   .shard = hn->shard < 0 ? 0 : hn->shard, .f = f, .a = a };
	size_t n = strlen(prefix) + strlen(state) + strlen(param) + 2;
	int rc = sf_array_grow(&h->pc, h->npc, &h->cappc, sizeof(*h->pc), 256,
			       HP_MAX_PIECES);

	if (rc)
		return sf_fail(&h->k.w, rc, "more than %u arrays", HP_MAX_PIECES);
	p.name = malloc(n);
	if (!p.name)
		return -ENOMEM;
	snprintf(p.name, n, "%s%s%s%s", prefix, state, state[0] ? "/" : "", param);
	h->pc[h->npc++] = p;
	return 0;
}

/* The structured name of static name sn in model file mf's table; of a
 * parameter under several names (tied embeddings), the last the table
 * lists, as paddlenlp names its states ({static: struct} over the state
 * dict). */
static const char *struct_of(const struct hp_file *mf, const char *sn)
{
	size_t lo = 0, hi = mf ? mf->nmap : 0;

	while (lo < hi) {            /* the first pair past sn */
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(mf->map[mid].sn, sn) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo && strcmp(mf->map[lo - 1].sn, sn) == 0 ? mf->map[lo - 1].st : NULL;
}

/* paddlenlp's generate_base_static_name: "linear_0.w_0_moment1_0" ->
 * ("linear_0.w_0", "moment1_0"); "..._fp32_master_0_moment1_0" likewise.
 * false when key has neither form. */
static bool split_state(const char *key, char *sn, size_t snlen, const char **state)
{
	const char *m = strstr(key, MASTER_SEP), *dot;

	if (m) {
		if ((size_t)(m - key) >= snlen || !m[strlen(MASTER_SEP)])
			return false;
		memcpy(sn, key, (size_t)(m - key));
		sn[m - key] = '\0';
		*state = m + strlen(MASTER_SEP);
		return true;
	}
	dot = strchr(key, '.');
	if (!dot || strlen(dot + 1) <= 4 || (size_t)(dot - key) + 5 >= snlen)
		return false;
	memcpy(sn, key, (size_t)(dot - key) + 4);
	sn[dot - key + 4] = '\0';
	*state = dot + 5;
	return true;
}

/* File path of the checkpoint, decoded once; a file that cannot be used
 * is logged (log) and its arrays left out. 0, or an error that ends the
 * open (a refused pickle among them). */
static int open_file(struct hp *h, const char *path, bool log,
		     const struct sf_fileset_file **out)
{
	int rc = sf_fileset_get(&h->k.files, path, out);

	if (rc == -SF_ETOOBIG)
		return sf_fail(&h->k.w, rc, "more than %u files", HP_MAX_FILES);
	if (rc)
		return rc;
	if (h->refused)
		return h->refused;
	if ((*out)->err && log) {
		sf_warn("checkpoint %s: %s %s; the tensors it holds are left out",
			SF_QSTR(h->k.name), SF_QSTR(path), sf_fileset_why(*out));
		h->k.left_out++;
	}
	return 0;
}

/* The model file of hn's tensor rank and stage, sharding rank z (-1:
 * the whole model's), into name[len]. */
static void model_name(const struct hp_name *hn, int z, char *name, size_t len)
{
	size_t l = (size_t)snprintf(name, len, "model_state");
	const char *sep = ".";

	if (hn->tp >= 0) {
		l += (size_t)snprintf(name + l, len - l, "%stp%02d", sep, hn->tp);
		sep = "_";
	}
	if (hn->pp >= 0) {
		l += (size_t)snprintf(name + l, len - l, "%spp%02d", sep, hn->pp);
		sep = "_";
	}
	if (z >= 0)
		l += (size_t)snprintf(name + l, len - l, "%sshard%02d", sep, z);
	snprintf(name + l, len - l, ".pdparams");
}

/* Every file of the plan into pieces. */
static int collect(struct hp *h, const struct sf_dirlist *ls)
{
	int rc = 0;

	for (size_t i = 0; i < ls->n && !rc; i++) {
		const struct sf_fileset_file *f, *mfe;
		const struct hp_file *hf, *mf[HP_MAX_RANK + 1];
		struct hp_name hn;
		char mname[64];
		size_t nmf;

		if (!plan_file(ls, i, &hn))
			continue;
		rc = open_file(h, ls->names[i], true, &f);
		if (rc || f->err)
			continue;
		hf = f->note;
		if (hf->skipped)
			sf_info("checkpoint %s: %s: %zu entries that are not arrays are not shown",
				SF_QSTR(h->k.name), SF_QSTR(ls->names[i]), hf->skipped);
		if (hn.kind == HP_MODEL) {
			for (size_t j = 0; j < hf->n && !rc; j++)
				rc = add_piece(h, "", "", hf->a[j].key, &hn, f, &hf->a[j]);
			continue;
		}
		/* the model files of the same tensor rank and stage name them:
		 * the whole one, else the same sharding rank's, then the others */
		nmf = 0;
		for (int z = -1; z < h->plan.Z && !rc; z++) {
			int zz = z < 0 ? -1 : z == 0 ? (hn.shard < 0 ? 0 : hn.shard) :
				 z <= hn.shard ? z - 1 : z;

			model_name(&hn, zz, mname, sizeof(mname));
			rc = open_file(h, mname, false, &mfe);
			if (!rc && !mfe->err)
				mf[nmf++] = mfe->note;
		}
		for (size_t j = 0; j < hf->n && !rc; j++) {
			const struct hp_arr *a = &hf->a[j];
			char sn[SF_MAX_NAME + 1];
			const char *state = "", *param = NULL;
			bool named = a->master || split_state(a->key, sn, sizeof(sn), &state);

			for (size_t m = 0; named && m < nmf && !param; m++)
				param = struct_of(mf[m], a->master ? a->key : sn);
			if (!param && named) /* a parameter its model files leave out */
				param = sf_pnlp_meta_struct(&h->meta, hn.tp, hn.pp,
							    a->master ? a->key : sn);
			if (!param) {
				sf_kit_leave_out(&h->k, a->key, "%s names a parameter neither its stage's model files nor model_meta.json do",
						 SF_QSTR(ls->names[i]));
				continue;
			}
			rc = add_piece(h, a->master ? "master_weights/" : "optimizer/",
				       state, param, &hn, f, a);
		}
	}
	return rc;
}

/* --- tensor-parallel rules (sf_paddlenlp_tp: per model_type) --- */

static enum sf_tp_axis rule_of(const struct hp *h, const char *param)
{
	return sf_tp_axis_of(h->rules, &h->tpc, param);
}

/* The parts a fused axis cuts each into T (rank r holds part r of each),
 * else 1. */
static unsigned parts_of(enum sf_tp_axis ax)
{
	return ax == SF_TP_COL2 ? 2 : ax == SF_TP_COL3 ? 3 : 1;
}

static enum sf_dtype dtype_of(const struct hp *h, const char *code)
{
	static const struct { const char *c; enum sf_dtype dt; } t[] = {
		{ "f4", SF_DT_F32 }, { "f2", SF_DT_F16 }, { "f8", SF_DT_F64 },
		{ "i8", SF_DT_I64 }, { "i4", SF_DT_I32 }, { "i2", SF_DT_I16 },
		{ "i1", SF_DT_I8 }, { "u1", SF_DT_U8 }, { "b1", SF_DT_BOOL },
	};

	if (strcmp(code, "u2") == 0)
		return h->bf16 ? SF_DT_BF16 : SF_DT_U16;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (strcmp(code, t[i].c) == 0)
			return t[i].dt;
	return SF_DT_INVALID;
}

/* The piece of the model weight param on tensor rank tp, or NULL. */
static const struct piece *weight_piece(const struct hp *h, const char *param, int tp)
{
	size_t lo = 0, hi = h->npc;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(h->pc[mid].name, param) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < h->npc && strcmp(h->pc[lo].name, param) == 0; lo++)
		if (h->pc[lo].tp == tp)
			return &h->pc[lo];
	return NULL;
}

static int add_shard(struct hp *h, struct sf_tensor *t, const struct piece *p,
		     const uint64_t *off, const uint64_t *len, uint64_t *strides,
		     uint64_t skip, uint64_t nbytes)
{
	struct sf_shard s = { 0 };

	s.off = off;
	s.len = len;
	s.strides = strides;
	s.file = p->f->path;
	s.file_offset = p->a->np.off + skip;
	s.nbytes = nbytes;
	return sf_tensor_add_shard(h->m, t, &s);
}

/* Tensor t (the model's last, named name) once its shards are added (rc:
 * how that went): the overlap rule and the cover check; a tensor they
 * refuse is dropped and left out with one line. 0 or an error that ends
 * the open. */
static int finish_tensor(struct hp *h, struct sf_tensor *t, const char *name, int rc)
{
	if (!rc)
		rc = sf_overlap_rule(&h->k.w, t);
	if (!rc)
		rc = sf_cover_check(&h->k.w, t);
	if (rc && rc != -ENOMEM && rc != -SF_EBUDGET) {
		char why[512];

		snprintf(why, sizeof(why), "%s", h->k.w.err && h->k.w.err[0] ?
			 h->k.w.err : sf_model_why(h->m));
		sf_kit_clear_err(&h->k);
		sf_model_drop_last(h->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&h->k, name, "%s", why[0] ? why : sf_strerror(rc));
		return 0;
	}
	return rc;
}

/* --- sharding stage 1 V2 (DygraphShardingOptimizerV2, split_param) ---
 *
 * Each parameter owns [index, index + padded) of its comm buffer, padded =
 * numel rounded up to (256 bytes / the parameter's element size) x Z
 * elements (paddle's tensor_fusion_helper: build_reduce_scatter_buffer);
 * sharding rank z holds the buffer's z-th equal part, so its optimizer
 * file holds, per state, the 1-D slice where that part meets the
 * parameter's range. Put back in sharding-rank order, the slices are the
 * flattened state followed by padding (PaddleNLP's reshard/sharding_v2
 * merge_tensors concatenates and cuts to numel). The files carry no slice
 * bounds (paddlenlp 2.8.1's model_meta.json records only "ShardingV2"), so
 * the slices must themselves be consistent: consecutive sharding ranks of
 * one stage, all 1-D of one dtype, the inner ones (whole parts) equal and
 * no shorter than the outer two, adding up to exactly the padded size. */

#define V2_ALIGN_BYTES 256u         /* tensor_fusion_helper's alignment */

/* The boxes of flat range [lo, hi) of a C-order array of shape sh[nd]:
 * at most 2 nd - 1 of them, each off/len. Returns the count. */
static unsigned flat_boxes(const uint64_t *sh, unsigned nd, uint64_t lo, uint64_t hi,
			   uint64_t off[][SF_MAX_NDIM], uint64_t len[][SF_MAX_NDIM])
{
	uint64_t unit[SF_MAX_NDIM];
	unsigned n = 0;

	unit[nd - 1] = 1;
	for (unsigned k = nd - 1; k > 0; k--)
		unit[k - 1] = unit[k] * sh[k];
	while (lo < hi && n < 2 * SF_MAX_NDIM) {
		unsigned k = 0;
		uint64_t c, left;

		while (lo % unit[k] || lo + unit[k] > hi)
			k++;                 /* unit[nd - 1] == 1 always fits */
		left = sh[k] - (lo / unit[k]) % sh[k];
		c = (hi - lo) / unit[k];
		if (c > left)
			c = left;
		for (unsigned j = 0; j < nd; j++) {
			off[n][j] = (lo / unit[j]) % sh[j];
			len[n][j] = j < k ? 1 : j == k ? c : sh[j];
		}
		n++;
		lo += c * unit[k];
	}
	return n;
}

/* One box of tensor rank r's local array (shape sh, C order, flat start
 * base in piece p, which starts at flat pstart) placed in whole tensor t
 * by axis ax along dimension d. */
static int v2_box(struct hp *h, struct sf_tensor *t, const struct piece *p,
		  const uint64_t *sh, unsigned nd, enum sf_tp_axis ax, unsigned d, int r,
		  const uint64_t *boff, const uint64_t *blen, uint64_t pstart, uint64_t isz)
{
	uint64_t st[SF_MAX_NDIM], off[SF_MAX_NDIM], len[SF_MAX_NDIM];
	int rc = 0;

	st[nd - 1] = 1;
	for (unsigned k = nd - 1; k > 0; k--)
		st[k - 1] = st[k] * sh[k];
	for (unsigned half = 0, np = parts_of(ax); half < np && !rc; half++) {
		uint64_t lo = boff[d], hi = boff[d] + blen[d], first = 0, span = 1;

		memcpy(off, boff, sizeof(off));
		memcpy(len, blen, sizeof(len));
		if (np > 1) {             /* [gate_r, up_r]: parts of dim d */
			uint64_t hw = sh[d] / np, hlo = (uint64_t)half * hw;

			lo = lo > hlo ? lo : hlo;
			hi = hi < hlo + hw ? hi : hlo + hw;
			if (lo >= hi)
				continue;
			off[d] = lo;
			len[d] = hi - lo;
		}
		for (unsigned k = 0; k < nd; k++) {
			first += off[k] * st[k];
			span += (len[k] - 1) * st[k];
		}
		if (ax == SF_TP_COL || ax == SF_TP_ROW)
			off[d] += (uint64_t)r * sh[d];
		else if (np > 1)
			off[d] = (uint64_t)half * (sh[d] / np * (uint64_t)h->plan.T) +
				 (uint64_t)r * (sh[d] / np) + (off[d] - (uint64_t)half * (sh[d] / np));
		rc = add_shard(h, t, p, off, len, st, (first - pstart) * isz, span * isz);
	}
	return rc;
}

/* Why the slices pc[a..b) of tensor rank r (sorted by stage, shard) do
 * not make padded elements, or NULL. */
static const char *v2_lie(const struct piece *pc, size_t n, const char *code,
			  uint64_t isz, uint64_t padded)
{
	uint64_t sum = 0, inner = 0;

	for (size_t i = 0; i < n; i++) {
		const struct sf_paddle_np *np = &pc[i].a->np;

		if (pc[i].a->bad)
			return pc[i].a->bad;
		if (np->ndim != 1 || strcmp(np->code, code) != 0 ||
		    np->shape[0] > UINT64_MAX / isz || np->len != np->shape[0] * isz)
			return "its slices differ in dtype or are not 1-D";
		if (i && (pc[i].pp != pc[0].pp || pc[i].shard != pc[i - 1].shard + 1))
			return "its slices are not on consecutive sharding ranks of one stage (a gap or an overlap)";
		if (np->shape[0] == 0 || np->shape[0] > padded - sum)
			return "its slices run beyond its padded buffer range";
		sum += np->shape[0];
		if (i && i + 1 < n) {
			if (inner && np->shape[0] != inner)
				return "its inner slices differ in length (the buffer's parts are equal)";
			inner = np->shape[0];
		}
	}
	if (inner && (pc[0].a->np.shape[0] > inner || pc[n - 1].a->np.shape[0] > inner))
		return "an outer slice is longer than a whole part of the buffer";
	return sum == padded ? NULL : "its slices do not add up to its padded size";
}

/* Sharding V2: the state pc[a..b) of parameter param, whose weight pieces
 * give each tensor rank's local shape. */
static int add_tensor_v2(struct hp *h, size_t a, size_t b)
{
	const char *name = h->pc[a].name, *why = NULL;
	const struct piece *w0 = weight_piece(h, h->pc[a].param, 0);
	const struct sf_paddle_np *wn = &w0->a->np;
	uint64_t shape[SF_MAX_NDIM], numel = 1, padded, unit, isz, wsz;
	enum sf_dtype dt, wdt;
	enum sf_tp_axis ax;
	struct sf_tensor *t;
	int T = h->plan.T, rc = 0;
	unsigned d, nd = wn->ndim;
	size_t i = a, a0 = a;

	if (w0->a->bad) {
		sf_kit_leave_out(&h->k, name, "%s: %s", w0->f->path, w0->a->bad);
		return 0;
	}
	wdt = dtype_of(h, wn->code);
	dt = dtype_of(h, h->pc[a].a->np.code);
	wsz = wdt == SF_DT_INVALID ? 0 : sf_dtype_size(wdt);
	if (dt == SF_DT_INVALID || (wsz != 2 && wsz != 4) || nd == 0) {
		sf_kit_leave_out(&h->k, name, "a sharding V2 slice of a dtype paddle does not fuse");
		return 0;
	}
	isz = sf_dtype_size(dt);
	for (d = 0; d < nd; d++)
		if (__builtin_mul_overflow(numel, wn->shape[d], &numel))
			numel = UINT64_MAX;
	unit = V2_ALIGN_BYTES / wsz * (uint64_t)h->plan.Z;
	if (numel > UINT64_MAX / 2 - unit) {
		sf_kit_leave_out(&h->k, name, "its size overflows");
		return 0;
	}
	padded = (numel + unit - 1) / unit * unit;
	for (int r = 0; r < T; r++) {
		const struct piece *w = weight_piece(h, h->pc[a].param, r);
		size_t j = i;

		while (j < b && h->pc[j].tp == r)
			j++;
		if (i == j || !w || w->a->bad || w->a->np.ndim != nd ||
		    memcmp(w->a->np.shape, wn->shape, nd * sizeof(*wn->shape)) != 0)
			why = "a tensor rank holds no slice of it, or its weight pieces differ";
		else
			why = v2_lie(&h->pc[i], j - i, h->pc[a].a->np.code, isz, padded);
		if (why) {
			sf_kit_leave_out(&h->k, name, "sharding V2 slices on tensor rank %d: %s",
					 r, why);
			return 0;
		}
		i = j;
	}
	if (i != b) {
		sf_kit_leave_out(&h->k, name, "a tensor rank beyond the files' %d holds a slice", T);
		return 0;
	}
	ax = rule_of(h, h->pc[a].param);
	d = ax == SF_TP_ROW ? 0 : nd - 1;
	if (parts_of(ax) > 1 && wn->shape[d] % parts_of(ax)) {
		sf_kit_leave_out(&h->k, name, "a fused piece whose width its %u parts do not divide",
				 parts_of(ax));
		return 0;
	}
	memcpy(shape, wn->shape, sizeof(shape));
	if (ax != SF_TP_NONE && __builtin_mul_overflow(shape[d], (uint64_t)T, &shape[d])) {
		sf_kit_leave_out(&h->k, name, "its whole shape overflows");
		return 0;
	}
	rc = sf_model_add_tensor(h->m, false, name, dt, nd, shape, &t);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_kit_leave_out(&h->k, name, "%s", sf_model_why(h->m));
		return 0;
	}
	for (uint64_t pstart = 0, hi = 0; a < b && !rc; a++, pstart = hi) {
		const struct piece *p = &h->pc[a];
		uint64_t off[2 * SF_MAX_NDIM][SF_MAX_NDIM], len[2 * SF_MAX_NDIM][SF_MAX_NDIM];
		unsigned nb;

		if (a > a0 && h->pc[a - 1].tp != p->tp)
			pstart = 0;          /* the next tensor rank's first slice */
		hi = pstart + p->a->np.shape[0];
		if (pstart >= numel || (ax == SF_TP_NONE && p->tp > 0))
			continue;            /* padding only; a replica (checked above) */
		nb = flat_boxes(wn->shape, nd, pstart, hi < numel ? hi : numel, off, len);
		for (unsigned k = 0; k < nb && !rc; k++)
			rc = v2_box(h, t, p, wn->shape, nd, ax, d,
				    p->tp, off[k], len[k], pstart, isz);
	}
	return finish_tensor(h, t, name, rc);
}

/* Pieces pc[a..b) (one shown name, sorted by tensor rank, stage, shard)
 * as one tensor, or one log line why not. */
static int add_tensor(struct hp *h, size_t a, size_t b)
{
	const struct piece *use[HP_MAX_RANK] = { NULL };
	const char *name = h->pc[a].name;
	const struct sf_paddle_np *n0;
	uint64_t shape[SF_MAX_NDIM], numel = 1, isz;
	enum sf_tp_axis ax;
	enum sf_dtype dt;
	struct sf_tensor *t;
	int T = h->plan.T, rc = 0;
	unsigned d;

	for (size_t i = a; i < b; i++) /* the first stage's, the lowest shard's */
		if (!use[h->pc[i].tp])
			use[h->pc[i].tp] = &h->pc[i];
	for (int r = 0; r < T; r++) {
		if (!use[r]) {
			sf_kit_leave_out(&h->k, name, "tensor rank %d holds no piece of it", r);
			return 0;
		}
		if (use[r]->a->bad) {
			sf_kit_leave_out(&h->k, name, "%s: %s", use[r]->f->path, use[r]->a->bad);
			return 0;
		}
	}
	n0 = &use[0]->a->np;
	for (int r = 1; r < T; r++) {
		const struct sf_paddle_np *nr = &use[r]->a->np;

		if (strcmp(nr->code, n0->code) != 0 || nr->ndim != n0->ndim ||
		    memcmp(nr->shape, n0->shape, n0->ndim * sizeof(*n0->shape)) != 0) {
			sf_kit_leave_out(&h->k, name, "its pieces on tensor ranks 0 and %d differ in dtype or shape", r);
			return 0;
		}
	}
	dt = dtype_of(h, n0->code);
	if (dt == SF_DT_INVALID) {
		sf_kit_leave_out(&h->k, name, "a numpy type shardfs does not serve");
		return 0;
	}
	isz = sf_dtype_size(dt);
	for (d = 0; d < n0->ndim; d++)
		if (__builtin_mul_overflow(numel, n0->shape[d], &numel))
			numel = UINT64_MAX;
	if (numel > n0->len || numel * isz != n0->len) {
		sf_kit_leave_out(&h->k, name, "its array holds %llu bytes for %llu elements",
				 (unsigned long long)n0->len, (unsigned long long)numel);
		return 0;
	}
	if (strcmp(name, use[0]->param) != 0 && n0->ndim == 1 && numel > 1) {
		/* a 1-D state: a sharding V2 slice when its weight is not 1-D of
		 * its length or another sharding rank holds a piece too */
		const struct piece *w = weight_piece(h, use[0]->param, 0);
		bool v2 = b - a > (size_t)T;

		if (w && !w->a->bad && (w->a->np.ndim != 1 || w->a->np.shape[0] != n0->shape[0]))
			v2 = true;
		if (v2 && !w) {
			sf_kit_leave_out(&h->k, name, "a sharding V2 slice of a parameter no model file holds");
			return 0;
		}
		if (v2)
			return add_tensor_v2(h, a, b);
	}
	ax = rule_of(h, use[0]->param);
	if (ax != SF_TP_NONE && strcmp(name, use[0]->param) != 0) {
		/* an optimizer state or master weight: cut like its weight only
		 * when it has the weight's local shape */
		const struct piece *w = weight_piece(h, use[0]->param, 0);

		if (!w && numel > 1 && n0->ndim == 1) {
			sf_kit_leave_out(&h->k, name, "a 1-D state of a parameter cut by tensor parallelism that no model file holds (its shape is not known)");
			return 0;
		}
		/* a weight not stored (save_sharded_model in bf16): a V1 state
		 * has its parameter's local shape */
		if (w ? w->a->bad || w->a->np.ndim != n0->ndim ||
			memcmp(w->a->np.shape, n0->shape, n0->ndim * sizeof(*n0->shape)) != 0 :
			numel <= 1)
			ax = SF_TP_NONE;
	}
	if (ax != SF_TP_NONE && n0->ndim == 0)
		ax = SF_TP_NONE;
	memcpy(shape, n0->shape, sizeof(shape));
	d = ax == SF_TP_ROW ? 0 : n0->ndim - 1;
	if (parts_of(ax) > 1 && n0->shape[d] % parts_of(ax)) {
		sf_kit_leave_out(&h->k, name, "a fused piece whose width its %u parts do not divide",
				 parts_of(ax));
		return 0;
	}
	if (ax != SF_TP_NONE && __builtin_mul_overflow(shape[d], (uint64_t)T, &shape[d])) {
		sf_kit_leave_out(&h->k, name, "its whole shape overflows");
		return 0;
	}
	rc = sf_model_add_tensor(h->m, false, name, dt, n0->ndim, shape, &t);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_kit_leave_out(&h->k, name, "%s", sf_model_why(h->m));
		return 0;
	}
	for (int r = 0; r < T && !rc && numel; r++) {
		const struct piece *p = use[r];
		uint64_t off[SF_MAX_NDIM] = { 0 }, len[SF_MAX_NDIM], st[SF_MAX_NDIM];

		memcpy(len, n0->shape, sizeof(len));
		if (ax == SF_TP_COL || ax == SF_TP_ROW)
			off[d] = (uint64_t)r * n0->shape[d];
		if (parts_of(ax) == 1) {
			rc = add_shard(h, t, p, off, len, NULL, 0, n0->len);
			continue;
		}
		/* [gate_r, up_r] ([q_r, k_r, v_r]): each part a strided box of
		 * the local array */
		len[d] = n0->shape[d] / parts_of(ax);
		st[n0->ndim - 1] = 1;
		for (unsigned k = n0->ndim - 1; k > 0; k--)
			st[k - 1] = st[k] * n0->shape[k];
		for (unsigned half = 0; half < parts_of(ax) && !rc; half++) {
			uint64_t span = 1;

			off[d] = (uint64_t)half * (shape[d] / parts_of(ax)) + (uint64_t)r * len[d];
			for (unsigned k = 0; k < n0->ndim; k++)
				span += (len[k] - 1) * st[k];
			rc = add_shard(h, t, p, off, len, st,
				       (uint64_t)half * len[d] * isz, span * isz);
		}
	}
	return finish_tensor(h, t, name, rc);
}

static int build_tensors(struct hp *h)
{
	int rc = 0;

	if (h->npc > 1)
		qsort(h->pc, h->npc, sizeof(*h->pc), cmp_piece);
	for (size_t a = 0, b; a < h->npc && !rc; a = b) {
		for (b = a + 1; b < h->npc && strcmp(h->pc[b].name, h->pc[a].name) == 0; b++)
			;
		rc = sf_budget_check(h->k.b);
		if (!rc && !sf_name_valid(h->pc[a].name))
			sf_kit_leave_out(&h->k, h->pc[a].name, "not a name shardfs can show");
		else if (!rc)
			rc = add_tensor(h, a, b);
	}
	return rc;
}

/* config.json: dtype, model_type, vocab_size, num_key_value_heads,
 * tie_word_embeddings and tensor_parallel_degree; with tensor parallelism
 * it must be there, name a model_type sf_paddlenlp_tp knows and agree
 * with the files. */
static int read_config(struct hp *h)
{
	struct sf_cfile cf;
	char *text = NULL;
	size_t len = 0;
	json_t *root;
	const char *mt;
	json_int_t tpd;
	int rc = sf_cfile_open(h->k.cd, "config.json", &cf);

	if (!rc) {
		rc = sf_cfile_read_all(&cf, HP_MAX_CONFIG, &text, &len);
		sf_cfile_close(&cf);
	}
	root = rc ? NULL : json_loadb(text, len, 0, NULL);
	free(text);
	if (!json_is_object(root)) {
		json_decref(root);
		if (h->plan.T > 1)
			return sf_fail(&h->k.w, -SF_EFORMAT, "tensor parallel over %d ranks, and no readable config.json to say how its tensors were cut",
				       h->plan.T);
		return 0;
	}
	mt = json_string_value(json_object_get(root, "dtype"));
	h->bf16 = mt && strcmp(mt, "bfloat16") == 0;
	mt = json_string_value(json_object_get(root, "model_type"));
	h->rules = sf_tp_model_find(mt);
	h->tpc.degree = h->plan.T;
	h->tpc.vocab = (uint64_t)json_integer_value(json_object_get(root, "vocab_size"));
	h->tpc.kv_heads = (uint64_t)json_integer_value(json_object_get(root, "num_key_value_heads"));
	if (!h->tpc.kv_heads)
		h->tpc.kv_heads = (uint64_t)json_integer_value(json_object_get(root, "num_attention_heads"));
	h->tpc.tied = json_is_true(json_object_get(root, "tie_word_embeddings"));
	tpd = json_integer_value(json_object_get(root, "tensor_parallel_degree"));
	rc = 0;
	if (h->plan.T > 1 && !h->rules)
		rc = sf_fail(&h->k.w, -SF_EFORMAT, "tensor parallel over %d ranks: how PaddleNLP cuts model_type %s is not known to shardfs (it knows %s)",
			     h->plan.T, mt ? mt : "(none)", sf_tp_model_types());
	else if (h->plan.T > 1 && tpd != h->plan.T)
		rc = sf_fail(&h->k.w, -SF_EFORMAT, "config.json's tensor_parallel_degree (%lld) is not the files' %d",
			     (long long)tpd, h->plan.T);
	else if (h->plan.T > 1 && (!h->tpc.vocab || !h->tpc.kv_heads))
		rc = sf_fail(&h->k.w, -SF_EFORMAT, "config.json lacks vocab_size or the head counts");
	json_decref(root);
	return rc;
}

static bool own_file(void *arg, const char *name)
{
	struct hp_name hn;

	(void)arg;
	return parse_name(name, &hn);
}

static int hp_open(const struct sf_cdir *cd, struct sf_format_result *out,
		   char *err, size_t errlen)
{
	struct hp h = { 0 };
	struct sf_dirlist ls = { 0 };
	struct sf_fileset_decoder dec = { .decode = hp_decode, .drop = hp_drop,
					  .close = true };
	int rc;

	sf_kit_init(&h.k, cd, err, errlen);
	rc = sf_cdir_list(cd, &ls);
	if (rc)
		return sf_fail(&h.k.w, rc, "cannot list the directory: %s", sf_strerror(rc));
	plan_of(&ls, &h.plan);
	if (h.plan.how != SF_PROBE_YES) {
		rc = sf_fail(&h.k.w, -SF_EFORMAT, "no complete PaddleNLP hybrid-parallel checkpoint here");
		goto out_ls;
	}
	rc = sf_kit_start(&h.k, HP_MAX_FILES, &h.m);
	if (!rc) {
		dec.arg = &h;
		sf_fileset_set_decoder(&h.k.files, &dec);
		rc = read_config(&h);
	}
	if (!rc) {
		char why[256] = "";

		rc = sf_pnlp_meta_load(cd, &h.meta, why, sizeof(why));
		if (rc == -SF_EFORMAT || rc == -SF_ETOOBIG || rc == -EXDEV || rc == -EINVAL) {
			sf_warn("checkpoint %s: %s; the model files alone name the optimizer's states",
				SF_QSTR(h.k.name), why[0] ? why : sf_strerror(rc));
			sf_pnlp_meta_free(&h.meta);
			rc = 0;
		}
	}
	if (!rc) {
		sf_kit_set_format(h.m, "%s tp%d pp%d sharding%d", SF_PADDLENLP_HP_FORMAT,
				  h.plan.T, h.plan.P, h.plan.Z);
		rc = collect(&h, &ls);
	}
	if (!rc)
		rc = build_tensors(&h);
	if (!rc)
		rc = sf_kit_add_root_files(&h.k, h.m, own_file, &h);
	if (!rc)
		rc = sf_kit_finish(&h.k, h.m);
	rc = sf_kit_end(&h.k, rc, h.m, out);
	for (size_t i = 0; i < h.npc; i++)
		free(h.pc[i].name);
	free(h.pc);
	sf_pnlp_meta_free(&h.meta);
out_ls:
	sf_dirlist_free(&ls);
	return rc;
}

const struct sf_format sf_format_paddlenlp_hp = {
	.name = SF_PADDLENLP_HP_FORMAT,
	.writable = false,
	.probe = hp_probe,
	.open = hp_open,
};
