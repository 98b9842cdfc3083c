/*
 * sf_paddlenlp.c - the PaddleNLP unified checkpoint adapter
 * (sf_paddlenlp.h).
 *
 * Invariants:
 *  - the probe looks at names only; open reads only files inside the
 *    checkpoint: every file an index names must be a plain name and is
 *    opened beneath the directory (sf_fileset over sf_cfile_open), so
 *    `..`, absolute paths and symlinks that lead out are refused, and
 *    only the tensors the index puts there are left out (one line per
 *    file);
 *  - a tensor is shown only as its index names it, from the file the
 *    index names, where that file's safetensors header (checked by
 *    sf_st_header: its runs inside the file, their byte counts the
 *    shape's) holds it; a tensor the index puts in a file that lacks it
 *    is left out with one line;
 *  - the three indexes are decoded by sf_hf_index_parse (bounded, no
 *    duplicate keys); a malformed one leaves the checkpoint out with its
 *    reason; config.json is read only for its dtype (at most
 *    PN_MAX_CONFIG bytes; unreadable: no conversion, one line);
 *  - U16 becomes BF16 only when config.json says bfloat16; nothing else
 *    about a tensor's bytes is reinterpreted;
 *  - the directory is only ever read.
 */
#include "sf_paddlenlp.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "sf_hf_meta.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_st_header.h"

#define PN_MAX_FILES SF_MAX_TENSORS   /* weight files of all three sets */
#define PN_MAX_CONFIG (1u << 20)      /* bytes of config.json read */
#define ST_EXT ".safetensors"
#define INDEX_SUFFIX ".safetensors.index.json"

/* The three sets of files a unified checkpoint holds, in the order they
 * are shown. */
enum pn_set { PN_MODEL, PN_OPT, PN_MW, PN_NSETS };

static const struct {
	const char *prefix;   /* of the index and the numbered files */
	const char *shown;    /* the tensors' names begin with it */
} sets[PN_NSETS] = {
	[PN_MODEL] = { "model", "" },
	[PN_OPT] = { "optimizer", "optimizer/" },
	[PN_MW] = { "master_weights", "master_weights/" },
};

/* --- names and the probe --- */

/* name is PREFIX-XXXXX-of-YYYYY.safetensors (5 digits each, as PaddleNLP
 * names them, X in 1..Y): true with X and Y. */
static bool numbered(const char *name, const char *prefix, unsigned *x,
		     unsigned *y)
{
	static const char pat[] = "-#####-of-#####" ST_EXT;
	size_t p = strlen(prefix);
	const char *s = name + p;

	if (strncmp(name, prefix, p) != 0 || strlen(s) != sizeof(pat) - 1)
		return false;
	*x = *y = 0;
	for (size_t i = 0; pat[i]; i++) {
		unsigned *v = i < 7 ? x : y;

		if (pat[i] != '#') {
			if (s[i] != pat[i])
				return false;
			continue;
		}
		if (s[i] < '0' || s[i] > '9')
			return false;
		*v = *v * 10 + (unsigned)(s[i] - '0');
	}
	return *x >= 1 && *x <= *y;
}

struct pn_plan {
	enum sf_probe how;
	bool has_index[PN_NSETS];
};

static void index_name(enum pn_set s, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s", sets[s].prefix, INDEX_SUFFIX);
}

static void plan_of(const struct sf_dirlist *ls, struct pn_plan *p)
{
	unsigned count[PN_NSETS] = { 0 }, total[PN_NSETS] = { 0 };
	bool mixed[PN_NSETS] = { false };
	char ix[64];

	memset(p, 0, sizeof(*p));
	for (int s = 0; s < PN_NSETS; s++) {
		index_name(s, ix, sizeof(ix));
		p->has_index[s] = sf_dirlist_has(ls, ix, false);
	}
	for (size_t i = 0; i < ls->n; i++) {
		unsigned x, y;

		if (ls->is_dir[i])
			continue;
		for (int s = 0; s < PN_NSETS; s++) {
			if (!numbered(ls->names[i], sets[s].prefix, &x, &y))
				continue;
			if (total[s] && total[s] != y)
				mixed[s] = true;
			total[s] = y;
			count[s]++;
		}
	}
	if (!p->has_index[PN_OPT] && !p->has_index[PN_MW] && !count[PN_OPT] &&
	    !count[PN_MW]) {
		p->how = SF_PROBE_NO; /* Hugging Face weights, or nothing */
		return;
	}
	p->how = SF_PROBE_YES;
	if (!p->has_index[PN_MODEL])
		p->how = SF_PROBE_PARTIAL;
	for (int s = 0; s < PN_NSETS; s++)
		if ((count[s] && (mixed[s] || count[s] != total[s])) ||
		    (count[s] && !p->has_index[s]))
			p->how = SF_PROBE_PARTIAL; /* names are unique: 1..Y all there */
}

static enum sf_probe pn_probe(const struct sf_dirlist *ls)
{
	struct pn_plan p;

	plan_of(ls, &p);
	return p.how;
}

/* --- the open --- */

/* What a weight file holds (its registry note): the header and its
 * entries sorted by name. */
struct pnfile {
	struct sf_st_header *st;        /* owned */
	const struct sf_st_entry **by_name; /* owned array, borrowed entries */
};

struct pn {
	struct sf_kit k;                /* the open: directory, err, budget,
					 * the weight files (notes: pnfile) */
	struct sf_model *m;             /* made by sf_kit_start; sf_kit_end's */
	struct sf_hf_index *ix[PN_NSETS]; /* owned; NULL: that set is absent */
	bool bf16;                      /* config.json says bfloat16 */
};

static int cmp_entry(const void *a, const void *b)
{
	const struct sf_st_entry *x = *(const struct sf_st_entry *const *)a;
	const struct sf_st_entry *y = *(const struct sf_st_entry *const *)b;

	return strcmp(x->name, y->name);
}

static void pn_drop(void *p)
{
	struct pnfile *f = p;

	if (!f)
		return;
	sf_st_header_destroy(f->st);
	free(f->by_name);
	free(f);
}

/* The registry's decoder: file f's safetensors header into a pnfile. */
static int pn_decode(void *arg, struct sf_fileset_file *f, char *why,
		     size_t whylen)
{
	struct pnfile *n = calloc(1, sizeof(*n));
	char msg[256] = "";
	int rc;

	(void)arg;
	if (!n)
		return -ENOMEM;
	f->note = n;
	rc = sf_st_header_read_input(&f->cf.in, &n->st, msg, sizeof(msg));
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		snprintf(why, whylen, "does not decode: safetensors header: %s",
			 msg[0] ? msg : sf_strerror(rc));
		return -SF_EFORMAT;
	}
	n->by_name = calloc(n->st->n ? n->st->n : 1, sizeof(*n->by_name));
	if (!n->by_name)
		return -ENOMEM;
	for (size_t i = 0; i < n->st->n; i++)
		n->by_name[i] = &n->st->entries[i];
	if (n->st->n > 1)
		qsort(n->by_name, n->st->n, sizeof(*n->by_name), cmp_entry);
	return 0;
}

static const struct sf_st_entry *find_entry(const struct pnfile *f,
					    const char *name)
{
	struct sf_st_entry k = { .name = (char *)name };
	const struct sf_st_entry *kp = &k, *const *e;

	if (!f || !f->st || !f->st->n)
		return NULL;
	e = bsearch(&kp, f->by_name, f->st->n, sizeof(*f->by_name), cmp_entry);
	return e ? *e : NULL;
}

/* Read a small JSON file of the checkpoint whole (at most max bytes). */
static int read_small(struct pn *p, const char *path, size_t max, char **text,
		      size_t *len)
{
	struct sf_cfile cf;
	int rc = sf_cfile_open(p->k.cd, path, &cf);

	if (rc)
		return sf_fail(&p->k.w, rc, "%s: %s", path,
			       rc == -EXDEV ? "leads out of the checkpoint" :
			       rc == -EINVAL ? "not a regular file" : sf_strerror(rc));
	rc = sf_cfile_read_all(&cf, max, text, len);
	sf_cfile_close(&cf);
	if (rc)
		return sf_fail(&p->k.w, rc, "%s: %s", path, sf_strerror(rc));
	return 0;
}

static int read_index(struct pn *p, enum pn_set s)
{
	char name[64], why[256] = "", *text = NULL;
	size_t len = 0;
	int rc;

	index_name(s, name, sizeof(name));
	rc = read_small(p, name, SF_MAX_MANIFEST_BYTES, &text, &len);
	if (rc)
		return rc;
	rc = sf_hf_index_parse(text, len, &p->ix[s], why, sizeof(why));
	free(text);
	if (rc)
		return sf_fail(&p->k.w, rc, "%s: %s", name, why);
	return 0;
}

/* config.json's dtype: bfloat16 or not. A config.json that cannot be read
 * converts nothing (one line when it is there but unreadable). */
static void read_config(struct pn *p)
{
	char *text = NULL;
	size_t len = 0;
	json_t *root, *dt;
	uint64_t size;

	if (sf_cdir_stat(p->k.cd, "config.json", &size) == -ENOENT)
		return;
	if (read_small(p, "config.json", PN_MAX_CONFIG, &text, &len)) {
		sf_warn("checkpoint %s: config.json unreadable (%s): U16 tensors stay U16",
			SF_QSTR(p->k.name), p->k.w.err ? p->k.w.err : "");
		sf_kit_clear_err(&p->k);
		return;
	}
	root = json_loadb(text, len, 0, NULL);
	free(text);
	dt = json_object_get(root, "dtype");
	if (!json_is_string(dt))
		dt = json_object_get(root, "torch_dtype");
	p->bf16 = json_is_string(dt) && strcmp(json_string_value(dt), "bfloat16") == 0;
	json_decref(root);
}

/* The name tensor key of set s is shown under, into buf; false (with why)
 * when it has none. */
static bool shown_name(enum pn_set s, const char *key, char *buf, size_t len,
		       const char **why)
{
	const char *slash;
	int n;

	if (s == PN_OPT) {
		slash = strrchr(key, '/');
		if (!slash || slash == key || !slash[1]) {
			*why = "an optimizer state not named PARAM/STATE";
			return false;
		}
		n = snprintf(buf, len, "%s%s/%.*s", sets[s].shown, slash + 1,
			     (int)(slash - key), key);
	} else {
		n = snprintf(buf, len, "%s%s", sets[s].shown, key);
	}
	if (n < 0 || (size_t)n >= len || !sf_name_valid(buf)) {
		*why = "not a name shardfs can show";
		return false;
	}
	return true;
}

/* Index entry i of set s (its file f, decoded) as one tensor, or one log
 * line why not. */
static int add_tensor(struct pn *p, enum pn_set s, size_t i,
		      const struct sf_fileset_file *f)
{
	const char *key = p->ix[s]->names[i], *why = NULL;
	const struct sf_st_entry *e = find_entry(f->note, key);
	char name[SF_MAX_NAME + 64];
	uint64_t off[SF_MAX_NDIM] = { 0 };
	enum sf_dtype dt;
	struct sf_shard sh = { 0 };
	struct sf_tensor *t;
	int rc;

	if (!shown_name(s, key, name, sizeof(name), &why)) {
		sf_kit_leave_out(&p->k, key, "%s", why);
		return 0;
	}
	if (!e) {
		sf_kit_leave_out(&p->k, name, "the index puts it in %s, which does not hold it",
				 SF_QSTR(f->path));
		return 0;
	}
	dt = e->dtype == SF_DT_U16 && p->bf16 ? SF_DT_BF16 : e->dtype;
	rc = sf_model_add_tensor(p->m, false, name, dt, e->ndim, e->shape, &t);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_kit_leave_out(&p->k, name, "%s", sf_model_why(p->m));
		return 0;
	}
	if (t->nbytes == 0)
		return 0; /* holds no element: covered */
	sh.off = off;
	sh.len = e->shape;
	sh.file = f->path;
	sh.file_offset = f->note ? ((const struct pnfile *)f->note)->st->data_start + e->begin : 0;
	sh.nbytes = e->end - e->begin;
	rc = sf_tensor_add_shard(p->m, t, &sh);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		char whyb[512];

		snprintf(whyb, sizeof(whyb), "%s", sf_model_why(p->m));
		sf_model_drop_last(p->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&p->k, name, "%s", whyb);
	}
	return 0;
}

/* Set s: its files into the registry (a bad one logged once, with the
 * count of the tensors left out with it), then its tensors. */
static int add_set(struct pn *p, enum pn_set s)
{
	const struct sf_hf_index *ix = p->ix[s];
	int rc = 0;

	for (size_t u = 0; u < ix->nfiles && !rc; u++) {
		const struct sf_fileset_file *f;
		size_t count = 0;

		rc = sf_fileset_get(&p->k.files, ix->ufiles[u], &f);
		if (rc == -SF_ETOOBIG)
			return sf_fail(&p->k.w, rc, "more than %u weight files", PN_MAX_FILES);
		if (rc)
			return rc;
		if (!f->err)
			continue;
		for (size_t i = 0; i < ix->n; i++)
			count += strcmp(ix->files[i], ix->ufiles[u]) == 0;
		p->k.left_out += count;
		sf_warn("checkpoint %s: %s file %s %s; the tensors its index puts in it (%zu) are left out",
			SF_QSTR(p->k.name), sets[s].prefix, SF_QSTR(f->path),
			sf_fileset_why(f), count);
	}
	for (size_t i = 0; i < ix->n && !rc; i++) {
		const struct sf_fileset_file *f;

		rc = sf_budget_check(p->k.b);
		if (!rc)
			rc = sf_fileset_get(&p->k.files, ix->files[i], &f);
		if (!rc && !f->err)
			rc = add_tensor(p, s, i, f);
	}
	return rc;
}

static bool own_file(void *arg, const char *name)
{
	const struct pn *p = arg;
	char ix[64];

	for (int s = 0; s < PN_NSETS; s++) {
		index_name(s, ix, sizeof(ix));
		if (strcmp(name, ix) == 0)
			return true;
		for (size_t u = 0; p->ix[s] && u < p->ix[s]->nfiles; u++)
			if (strcmp(name, p->ix[s]->ufiles[u]) == 0)
				return true;
	}
	return false;
}

static int extra_json(const struct pn *p, json_t **out)
{
	json_t *o = json_pack("{s:{s:b,s:b,s:b}}", "paddlenlp",
			      "u16_as_bf16", p->bf16,
			      "optimizer", p->ix[PN_OPT] != NULL,
			      "master_weights", p->ix[PN_MW] != NULL);

	*out = o;
	return o ? 0 : -ENOMEM;
}

static int build(struct pn *p, const struct pn_plan *plan)
{
	static const struct sf_fileset_decoder dec = {
		.decode = pn_decode, .drop = pn_drop, .close = true,
	};
	int rc = 0;

	sf_fileset_set_decoder(&p->k.files, &dec);
	for (int s = 0; s < PN_NSETS && !rc; s++)
		if (plan->has_index[s])
			rc = read_index(p, s);
	if (rc)
		return rc;
	read_config(p);
	sf_kit_set_format(p->m, "%s", SF_PADDLENLP_FORMAT);
	for (int s = 0; s < PN_NSETS && !rc; s++)
		if (p->ix[s])
			rc = add_set(p, s);
	if (!rc)
		rc = sf_kit_add_root_files(&p->k, p->m, own_file, p);
	return rc;
}

static int pn_open(const struct sf_cdir *cd, struct sf_format_result *out,
		   char *err, size_t errlen)
{
	struct pn p = { 0 };
	struct sf_dirlist ls = { 0 };
	struct pn_plan plan;
	int rc;

	sf_kit_init(&p.k, cd, err, errlen);
	rc = sf_cdir_list(cd, &ls);
	if (rc)
		return sf_fail(&p.k.w, rc, "cannot list the directory: %s", sf_strerror(rc));
	plan_of(&ls, &plan);
	sf_dirlist_free(&ls);
	if (plan.how != SF_PROBE_YES)
		return sf_fail(&p.k.w, -SF_EFORMAT, "no complete PaddleNLP unified checkpoint here");
	rc = sf_kit_start(&p.k, PN_MAX_FILES, &p.m);
	if (!rc)
		rc = build(&p, &plan);
	if (!rc)
		rc = sf_kit_finish(&p.k, p.m);
	if (!rc)
		rc = extra_json(&p, &out->extra);
	rc = sf_kit_end(&p.k, rc, p.m, out);
	if (rc) {
		json_decref(out->extra);
		out->extra = NULL;
	}
	for (int s = 0; s < PN_NSETS; s++)
		sf_hf_index_free(p.ix[s]);
	return rc;
}

const struct sf_format sf_format_paddlenlp = {
	.name = SF_PADDLENLP_FORMAT,
	.writable = false,
	.probe = pn_probe,
	.open = pn_open,
};
