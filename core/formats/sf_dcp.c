/*
 * sf_dcp.c - the PyTorch DCP adapter (sf_dcp.h): the metadata documents,
 * decoded under an allowlist; DCP's file names (the probe, the format's own
 * files); merging the documents' keys; the open and its entry points. Each
 * merged key becomes a tensor or an object in sf_dcp_entry.c.
 *
 * Invariants:
 *  - nothing a file names is imported, called or followed out of the
 *    checkpoint: every metadata document is decoded with an allowlist of
 *    DCP's classes, torch.Size, the layout and memory-format helpers and
 *    the dtypes (and the globals an extension adds), at most
 *    SF_MAX_MANIFEST_BYTES over all documents; chunk files are opened
 *    only through the kit's registry (sf_dcp_entry.c);
 *  - per-rank metadata (`__R.metadata`, no `.metadata`) is merged: every
 *    rank's keys, each tensor's chunks from every rank, the lowest rank's
 *    entry where two ranks stored the same chunk or byte item; the open
 *    reads them only when every rank from 0 to the highest named has its
 *    document;
 *  - a key shardfs cannot show (its name) is left out alone with one line
 *    (sf_kit_leave_out); a malformed document leaves the checkpoint out
 *    with one reason;
 *  - the directory is only ever read.
 */
#include "sf_dcp.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_array.h"
#include "sf_dcp_entry.h"
#include "sf_error.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_pickle.h"

#define DCP_MAX_ITEMS (16u * SF_MAX_TENSORS) /* keys over all documents */

/* --- the allowlist of .metadata --- */

static const char *const dcp_classes[] = {
	"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
	"ChunkStorageMetadata", "MetadataIndex", "TensorProperties",
	"StorageMeta", "_MEM_FORMAT_ENCODING",
};
static const char *const torch_dtypes[] = {
	"float64", "float32", "float16", "bfloat16", "float8_e4m3fn",
	"float8_e5m2", "int64", "int32", "int16", "int8", "uint64", "uint32",
	"uint16", "uint8", "bool", "complex64", "complex128",
};
static const struct sf_pk_global other_globals[] = {
	{ "torch.distributed._shard.checkpoint.filesystem", "_StorageInfo" },
	{ "torch.distributed.checkpoint.filesystem", "_StorageInfo" },
	{ "torch.distributed._shard.sharded_tensor.metadata", "TensorProperties" },
	{ "torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING" },
	{ "torch.distributed.checkpoint.planner", "SavePlan" },
	{ "torch.distributed.checkpoint.planner", "WriteItem" },
	{ "torch.distributed.checkpoint.planner", "WriteItemType" },
	{ "torch.distributed.checkpoint.planner", "TensorWriteData" },
	{ "torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING" },
	{ "torch.serialization", "_get_layout" },
	{ "torch", "Size" },
	{ "builtins", "getattr" },
	{ "pathlib", "PosixPath" },
	{ "collections", "OrderedDict" },
};
#define N_CLASSES (sizeof(dcp_classes) / sizeof(dcp_classes[0]))
#define N_DTYPES (sizeof(torch_dtypes) / sizeof(torch_dtypes[0]))
#define N_OTHER (sizeof(other_globals) / sizeof(other_globals[0]))
static struct sf_pk_global allow[2 * N_CLASSES + N_DTYPES + N_OTHER];
static size_t nallow;
static pthread_once_t allow_once = PTHREAD_ONCE_INIT;

static void allow_build(void)
{
	size_t n = 0;

	for (size_t i = 0; i < N_CLASSES; i++) {
		allow[n++] = (struct sf_pk_global){ MOD113, dcp_classes[i] };
		allow[n++] = (struct sf_pk_global){ MOD2, dcp_classes[i] };
	}
	for (size_t i = 0; i < N_DTYPES; i++)
		allow[n++] = (struct sf_pk_global){ "torch", torch_dtypes[i] };
	for (size_t i = 0; i < N_OTHER; i++)
		allow[n++] = other_globals[i];
	nallow = n;
}

/* One metadata document: the global .metadata, or rank R's __R.metadata. */
struct mdoc {
	struct sf_pickle *pk;        /* owned */
	const struct sf_pk *root;    /* borrowed from pk */
};

/* The name of document rank's file, for messages. */
static const char *doc_name(const struct dcp *d, uint32_t rank, char *buf,
			    size_t n)
{
	if (!d->per_rank)
		return SF_DCP_METADATA;
	snprintf(buf, n, "__%u%s", rank, SF_DCP_METADATA);
	return buf;
}

/* --- names --- */

/* A rank: decimal, no leading zero, below SF_MAX_WORLD. */
static bool parse_rank(const char *s, size_t len, uint32_t *out)
{
	uint32_t v = 0;

	if (len == 0 || len > 5 || (len > 1 && s[0] == '0'))
		return false;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (uint32_t)(s[i] - '0');
	}
	if (v >= SF_MAX_WORLD)
		return false;
	*out = v;
	return true;
}

static bool ends_with(const char *name, const char *suffix)
{
	size_t n = strlen(name), ns = strlen(suffix);

	return n >= ns && strcmp(name + n - ns, suffix) == 0;
}

/* "__R.metadata" (with a suffix: "__R.metadata.tmp"): rank R's metadata. */
static bool rank_md_name(const char *name, const char *suffix, uint32_t *rank)
{
	size_t n = strlen(name), ns = sizeof(SF_DCP_METADATA) - 1 + strlen(suffix);

	return n > 2 + ns && strncmp(name, "__", 2) == 0 &&
	       strncmp(name + n - ns, SF_DCP_METADATA, sizeof(SF_DCP_METADATA) - 1) == 0 &&
	       strcmp(name + n - strlen(suffix), suffix) == 0 &&
	       parse_rank(name + 2, n - 2 - ns, rank);
}

static bool is_distcp(const char *name)
{
	size_t n = strlen(name), ns = sizeof(SF_DCP_SUFFIX) - 1;

	return strncmp(name, "__", 2) == 0 && n > ns + 2 &&
	       strcmp(name + n - ns, SF_DCP_SUFFIX) == 0;
}

/* Is name one of DCP's own files (sf_kit_add_root_files' own)? */
static bool dcp_own(void *arg, const char *name)
{
	uint32_t r;

	(void)arg;
	return strcmp(name, SF_DCP_METADATA) == 0 || ends_with(name, SF_DCP_SUFFIX) ||
	       rank_md_name(name, "", &r) || rank_md_name(name, ".tmp", &r);
}

/* What a directory's names say about DCP metadata. */
struct dcp_scan {
	bool any_distcp;            /* some __*.distcp */
	bool global;                /* .metadata */
	size_t nranks;              /* __R.metadata files */
	uint32_t top;               /* highest rank named by either */
};

static void scan_names(const struct sf_dirlist *ls, struct dcp_scan *sc)
{
	memset(sc, 0, sizeof(*sc));
	for (size_t i = 0; i < ls->n; i++) {
		const char *nm = ls->names[i];
		uint32_t r;

		if (ls->is_dir[i])
			continue;
		if (strcmp(nm, SF_DCP_METADATA) == 0) {
			sc->global = true;
		} else if (rank_md_name(nm, "", &r)) {
			sc->nranks++;
			sc->top = r > sc->top ? r : sc->top;
		} else if (is_distcp(nm)) {
			const char *us = strchr(nm + 2, '_');

			sc->any_distcp = true;
			if (us && parse_rank(nm + 2, (size_t)(us - nm - 2), &r))
				sc->top = r > sc->top ? r : sc->top;
		}
	}
}

/*
 * Per-rank metadata is complete when every rank from 0 to the highest
 * rank any DCP file names has its __R.metadata (each rank renames it into
 * place after its chunk files are written). A highest rank that has
 * written nothing at all cannot be seen; its chunks are then missing and
 * the coverage check refuses the checkpoint.
 */
static bool ranks_complete(const struct dcp_scan *sc)
{
	return sc->nranks > 0 && sc->nranks == (size_t)sc->top + 1;
}

/* The format string: the layout's torch generation, and the version the
 * metadata records when it does. */
static void set_format(struct dcp *d, const struct sf_dcp_ext *ext,
		       const struct sf_pk *md)
{
	const char *ver = sf_pk_str(sf_pk_attr(md, "version"));

	if (ext && ext->format)
		sf_kit_set_format(d->m, "%s", ext->format);
	else if (sf_pk_is_obj(md, MOD113, "Metadata"))
		sf_kit_set_format(d->m, "%s torch-1.13", SF_DCP_FORMAT);
	else if (ver && strlen(ver) < 16 && strspn(ver, "0123456789.") == strlen(ver))
		sf_kit_set_format(d->m, "%s %s", SF_DCP_FORMAT, ver);
	else
		sf_kit_set_format(d->m, "%s", SF_DCP_FORMAT);
}

/* Keys, then ranks, then (in one document) the last entry first. */
static int cmp_item(const void *a, const void *b)
{
	const struct item *x = a, *y = b;
	int c = strcmp(x->key, y->key);

	if (c)
		return c;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return x->seq == y->seq ? 0 : x->seq > y->seq ? -1 : 1;
}

/* --- merging the documents' keys --- */

/* The model of docs[0..n): one global document, or rank i's in docs[i]. */
static int build(struct dcp *d, const struct sf_dcp_ext *ext,
		 const struct mdoc *docs, size_t n)
{
	struct item *its = NULL, *kept = NULL;
	size_t nit = 0, cap = 0;
	int rc = 0;

	for (size_t r = 0; r < n && !rc; r++) {
		const struct sf_pk *md = docs[r].root;
		const struct sf_pk *sdm = sf_pk_attr(md, "state_dict_metadata");
		char nb[32];

		bool ext_md = ext && ext->meta_class &&
			      sf_pk_is_obj(md, ext->meta_module, ext->meta_class);

		if ((!sf_dcp_is(md, "Metadata") && !ext_md) || !sdm || sdm->kind != SF_PK_DICT) {
			rc = sf_fail(&d->k.w, -SF_EFORMAT,
				     "%s: not a DCP Metadata with a state_dict_metadata dict",
				     doc_name(d, (uint32_t)r, nb, sizeof(nb)));
			break;
		}
		rc = sf_dcp_read_storage(d, sf_pk_attr(md, "storage_data"), (uint32_t)r,
					 doc_name(d, (uint32_t)r, nb, sizeof(nb)));
		for (size_t i = 0; i < sdm->u.dict.n && !rc; i++) {
			struct item it = { sf_pk_str(sdm->u.dict.k[i]), sdm->u.dict.v[i],
					   (uint32_t)r, (uint32_t)i };

			if (!it.key) {
				rc = sf_fail(&d->k.w, -SF_EFORMAT, "metadata: a key is not a string");
				break;
			}
			rc = sf_array_grow(&its, nit, &cap, sizeof(*its), 64, DCP_MAX_ITEMS);
			if (rc)
				sf_fail(&d->k.w, rc, "metadata: too many keys");
			else
				its[nit++] = it;
		}
	}
	if (rc)
		goto out_free;
	sf_dcp_sort_storage(d);
	set_format(d, ext, docs[0].root);
	if (nit > 1)
		qsort(its, nit, sizeof(*its), cmp_item);
	kept = malloc((n ? n : 1) * sizeof(*kept));
	if (!kept) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0, j; i < nit && !rc; i = j) {
		size_t nk = 0;

		/* one key: the first entry of each rank (its last in the file) */
		for (j = i; j < nit && strcmp(its[j].key, its[i].key) == 0; j++)
			if (nk == 0 || kept[nk - 1].rank != its[j].rank)
				kept[nk++] = its[j];
		if (!sf_name_valid(its[i].key)) {
			sf_kit_leave_out(&d->k, its[i].key, "not a name shardfs can show");
			continue;
		}
		rc = sf_dcp_add_key(d, kept, nk);
	}
	if (!rc)
		rc = sf_kit_add_root_files(&d->k, d->m, dcp_own, NULL);
out_free:
	free(kept);
	free(its);
	return rc;
}

/* --- opening --- */

/* Decode one metadata document from in (what names it, for messages). */
static int load_doc(struct dcp *d, const struct sf_input *in, const char *what,
		    struct mdoc *doc)
{
	struct sf_pickle_opts po = { 0 };
	char why[256] = "";
	int rc;

	po.allow = d->allow;
	po.nallow = d->nallow;
	po.budget = d->k.cd ? d->k.cd->budget : NULL;
	rc = sf_pickle_load(in, &po, &doc->pk, why, sizeof(why));
	if (rc)
		return sf_fail(&d->k.w, rc, "%s: %s", what, why);
	doc->root = sf_pickle_root(doc->pk);
	return 0;
}

/* Open and decode the metadata file fname; *total counts the bytes of
 * every document, bounded by SF_MAX_MANIFEST_BYTES. */
static int load_file(struct dcp *d, const char *fname, struct mdoc *doc,
		     uint64_t *total)
{
	struct sf_cfile f;
	int rc;

	rc = sf_cfile_open(d->k.cd, fname, &f);
	if (rc == -EINVAL)
		return sf_fail(&d->k.w, -SF_EFORMAT, "%s: not a regular file", fname);
	if (rc)
		return sf_fail(&d->k.w, rc, "%s: %s", fname, sf_strerror(rc));
	*total += f.size;
	if (f.size > SF_MAX_MANIFEST_BYTES || *total > SF_MAX_MANIFEST_BYTES) {
		rc = sf_fail(&d->k.w, -SF_ETOOBIG, "%s: metadata larger than %u bytes",
			     fname, SF_MAX_MANIFEST_BYTES);
		goto out_close;
	}
	rc = load_doc(d, &f.in, fname, doc);
out_close:
	sf_cfile_close(&f);
	return rc;
}

/* Build from the loaded documents into out, and free what d holds. */
static int finish_open(struct dcp *d, const struct sf_dcp_ext *ext,
		       struct mdoc *docs, size_t n, struct sf_format_result *out)
{
	int rc;

	rc = sf_kit_start(&d->k, DCP_MAX_FILES, &d->m);
	if (!rc)
		rc = build(d, ext, docs, n);
	if (!rc && ext && ext->adjust)
		rc = ext->adjust(ext->arg, d->m, docs[0].root, &d->k.w);
	if (!rc)
		rc = sf_kit_finish(&d->k, d->m);
	rc = sf_kit_end(&d->k, rc, d->m, out);
	free(d->si);
	return rc;
}

static void free_docs(struct mdoc *docs, size_t n)
{
	for (size_t i = 0; docs && i < n; i++)
		sf_pickle_free(docs[i].pk);
	free(docs);
}

/* The globals metadata may name: DCP's, and ext's on top (merged into
 * *merged, which the caller frees). 0, or an error with the reason. */
static int setup_allow(struct dcp *d, const struct sf_dcp_ext *ext,
		       struct sf_pk_global **merged)
{
	pthread_once(&allow_once, allow_build);
	*merged = NULL;
	d->allow = allow;
	d->nallow = nallow;
	if (!ext || !ext->nallow)
		return 0;
	if (ext->nallow > SF_DCP_EXT_MAX_ALLOW)
		return sf_fail(&d->k.w, -EINVAL, "too many extra globals");
	*merged = malloc((nallow + ext->nallow) * sizeof(**merged));
	if (!*merged)
		return -ENOMEM;
	memcpy(*merged, allow, nallow * sizeof(**merged));
	memcpy(*merged + nallow, ext->allow, ext->nallow * sizeof(**merged));
	d->allow = *merged;
	d->nallow = nallow + ext->nallow;
	return 0;
}

int sf_dcp_open_ex(const struct sf_cdir *cd, const struct sf_dcp_ext *ext,
		   struct sf_format_result *out, char *err, size_t errlen)
{
	struct dcp d = { 0 };
	struct sf_pk_global *merged = NULL;
	struct sf_dirlist ls = { 0 };
	struct dcp_scan sc;
	struct mdoc *docs = NULL;
	uint64_t total = 0;
	size_t n = 1;
	int rc;

	sf_kit_init(&d.k, cd, err, errlen);
	rc = sf_cdir_list(cd, &ls);
	if (rc)
		return sf_fail(&d.k.w, rc, "cannot list the directory: %s", sf_strerror(rc));
	scan_names(&ls, &sc);
	sf_dirlist_free(&ls);
	if (!sc.global) {
		/* torch reads a global .metadata when there is one; else each
		 * rank its own, and together they are the checkpoint */
		if (!ranks_complete(&sc))
			return sf_fail(&d.k.w, -SF_EFORMAT,
				       "no .metadata, and not every rank's __R.metadata");
		n = sc.nranks;
		d.per_rank = true;
	}
	rc = setup_allow(&d, ext, &merged);
	if (rc)
		return rc;
	docs = calloc(n, sizeof(*docs));
	if (!docs) {
		free(merged);
		return -ENOMEM;
	}
	for (size_t r = 0; r < n && !rc; r++) {
		char fname[32];

		if (sc.global)
			snprintf(fname, sizeof(fname), "%s", SF_DCP_METADATA);
		else
			snprintf(fname, sizeof(fname), "__%zu%s", r, SF_DCP_METADATA);
		rc = load_file(&d, fname, &docs[r], &total);
	}
	if (!rc)
		rc = finish_open(&d, ext, docs, n, out);
	free_docs(docs, n);
	free(merged);
	return rc;
}

static int dcp_open(const struct sf_cdir *cd, struct sf_format_result *out,
		    char *err, size_t errlen)
{
	return sf_dcp_open_ex(cd, NULL, out, err, errlen);
}

struct sf_dcp_docs {
	struct mdoc *docs;           /* n, owned */
	size_t n;
};

void sf_dcp_docs_free(struct sf_dcp_docs *dd)
{
	if (!dd)
		return;
	free_docs(dd->docs, dd->n);
	free(dd);
}

int sf_dcp_docs_load(const struct sf_dcp_doc *in, size_t n,
		     struct sf_dcp_docs **out, char *err, size_t errlen)
{
	struct dcp d = { .per_rank = n > 1 };
	struct sf_pk_global *merged = NULL;
	struct sf_dcp_docs *dd;
	int rc = 0;

	*out = NULL;
	sf_kit_init(&d.k, NULL, err, errlen);
	if (n == 0 || n > SF_MAX_WORLD)
		return sf_fail(&d.k.w, -EINVAL, "%zu metadata documents", n);
	rc = setup_allow(&d, NULL, &merged);
	if (rc)
		return rc;
	dd = calloc(1, sizeof(*dd));
	if (!dd)
		return -ENOMEM;
	dd->docs = calloc(n, sizeof(*dd->docs));
	if (!dd->docs) {
		free(dd);
		return -ENOMEM;
	}
	dd->n = n;
	for (size_t r = 0; r < n && !rc; r++) {
		struct sf_input si = sf_input_mem(in[r].buf, in[r].len);
		char nb[32];

		rc = load_doc(&d, &si, doc_name(&d, (uint32_t)r, nb, sizeof(nb)),
			      &dd->docs[r]);
	}
	if (rc) {
		sf_dcp_docs_free(dd);
		return rc;
	}
	*out = dd;
	return 0;
}

int sf_dcp_docs_open(const struct sf_dcp_docs *dd, int dirfd, const char *name,
		     struct sf_budget *budget, struct sf_format_result *out,
		     char *err, size_t errlen)
{
	struct sf_cdir cd = { .dirfd = dirfd, .name = name, .ref = { .name = name },
			      .budget = budget };
	struct dcp d = { .per_rank = dd->n > 1 };

	sf_kit_init(&d.k, &cd, err, errlen);
	return finish_open(&d, NULL, dd->docs, dd->n, out);
}

int sf_dcp_open_docs(int dirfd, const char *name, const struct sf_dcp_doc *in,
		     size_t n, struct sf_format_result *out, char *err,
		     size_t errlen)
{
	struct sf_dcp_docs *dd;
	int rc;

	rc = sf_dcp_docs_load(in, n, &dd, err, errlen);
	if (rc)
		return rc;
	rc = sf_dcp_docs_open(dd, dirfd, name, NULL, out, err, errlen);
	sf_dcp_docs_free(dd);
	return rc;
}

static enum sf_probe dcp_probe(const struct sf_dirlist *ls)
{
	struct dcp_scan sc;

	scan_names(ls, &sc);
	if (!sc.any_distcp)
		return SF_PROBE_NO;
	return sc.global || ranks_complete(&sc) ? SF_PROBE_YES : SF_PROBE_PARTIAL;
}

const struct sf_format sf_format_dcp = {
	.name = SF_DCP_FORMAT,
	.writable = false,
	.probe = dcp_probe,
	.open = dcp_open,
};
