/*
 * sf_deepspeed.c - DeepSpeed ZeRO checkpoints (stages 1, 2, 3; bf16 or
 * fp16 with fp32 master weights; tensor parallel; universal
 * checkpoints), read in place (sf_deepspeed.h).
 *
 * What lies on disk (deepspeed 0.19; docs/FORMAT.md): DIR/latest names the
 * tag directory TAG/ (the HF Trainer's checkpoint-N/global_stepN/), which
 * holds per data-parallel rank R a torch.save archive
 * [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt and the model states
 * (stage 1/2: one mp_rank_00_model_states.pt; stage 3: one
 * zero_pp_rank_R_mp_rank_00_model_states.pt per rank). The model states
 * name the parameters in order with their shapes (param_shapes: a list per
 * parameter group of OrderedDicts name -> torch.Size) and the buffers;
 * the optimizer states hold each rank's flat fp32 partition per group
 * (stage 1/2: single_partition_of_fp32_groups; stage 3: fp32_flat_groups)
 * and Adam's exp_avg and exp_avg_sq over the same partition.
 *
 * What is shown, exactly as DeepSpeed's zero_to_fp32 reconstructs it:
 *   tensors NAME                 the fp32 master weight: stage 1/2, the
 *       group's partitions concatenated over ranks, each parameter the
 *       next numel elements (plus param_alignment_paddings); stage 3, per
 *       parameter ceil(numel / world) elements of every rank's flat
 *       groups (concatenated), the ranks' pieces concatenated, the padding
 *       dropped. A tensor is a list of flat-range shards pointing into the
 *       archives' storage entries: nothing is consolidated in memory.
 *   optimizer/exp_avg/NAME, optimizer/exp_avg_sq/NAME   the same ranges
 *       of the moments (which cover the same partitions);
 *   module/NAME                  stage 1/2: the 16-bit weights of the
 *       module state dict (stage 3 stores none: placeholders of 0 elements);
 *   NAME for a buffer            as zero_to_fp32: from the module state
 *       dict; a 16-bit buffer (which it converts to fp32) is left out.
 *   NAME for a shared parameter  the fp32 weight of the one it is tied to.
 *   NAME for a frozen parameter  as stored (16-bit), as zero_to_fp32
 *       gives it: stage 1/2 whole in frozen_param_fragments, stage 3 each
 *       rank's fragment (every rank's model states), padding dropped.
 * With tensor parallel (mp_rank_XX up to NN), every mp rank is read as a
 * ZeRO checkpoint of its own and its tensors are shown under
 * mp_rank_XX/ (the split axis is in no file: nothing is merged).
 * The other tags beside the one latest names are not this adapter's: the
 * store shows each as a checkpoint "DIR@TAG", a bare tag directory
 * (sf_dstags.h); here one info line counts them. The non-tensor entries
 * of mp rank 0's model states and rank 0's optimizer states (step counts,
 * the loss scaler, ds_config, ...) are manifest.json's "deepspeed" key
 * (sf_deepspeed_obj.h) and objects/KEY, objects/optim_states/KEY (and
 * optim_states/optimizer_state_dict/KEY): each value re-written at open
 * as a torch.save archive of its own (sf_pickle_write.h; they lie inside
 * data.pkl, with no byte range of their own), held in memory, capped;
 * entries that hold tensors are not among them.
 *
 * Universal checkpoints (deepspeed.checkpoint.ds_to_universal):
 * DIR/latest_universal names TAG (or the directory is TAG, holding zero/);
 * TAG/zero/PARAM/{fp32,exp_avg,exp_avg_sq}.pt each a torch.save of
 * {"param": the whole tensor[, "cat_dim"]}: tensors PARAM,
 * optimizer/exp_avg/PARAM, optimizer/exp_avg_sq/PARAM, each one shard.
 *
 * Invariants: the pickles are decoded with the torch tensor names plus
 * exactly the DeepSpeed classes below (nothing executed); every range
 * served lies inside its archive's storage entry (checked per shard, so a
 * partition shorter than the shapes claim leaves the tensor out); every
 * file is opened beneath the checkpoint directory (TAG is one plain name)
 * with sf_cfile_open; the kit's file registry is not used (its paths are
 * one plain name, DeepSpeed's lie in TAG/). Subdirectories (TAG/,
 * TAG/zero/) are listed locally: under MPI a tag directory this daemon
 * does not hold leaves the checkpoint out with a line.
 */
#include "sf_deepspeed.h"
#include "sf_deepspeed_obj.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sf_error.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_pickle.h"
#include "sf_torchsave.h"

#define DS_MAX_RANKS 4096
#define DS_MAX_GROUPS 1024
#define DS_MAX_LATEST 1024

/* The classes DeepSpeed's archives name beyond a tensor's (deepspeed
 * 0.19.8, ZeRO 1/2/3, bf16 and fp16): inert data here. */
static const struct sf_pk_global ds_allow[] = {
	{ "deepspeed.runtime.zero.config", "ZeroStageEnum" },
	{ "deepspeed.runtime.fp16.loss_scaler", "LossScaler" },
	{ "deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler" },
	{ "torch", "float16" },  /* DynamicLossScaler's dtype (fp16) */
	{ "torch", "bfloat16" },
	{ "torch", "float32" },
	{ "deepspeed.utils.tensor_fragment", "fragment_address" },
	{ "torch", "Size" },
	{ "torch._tensor", "_rebuild_from_type_v2" },
	{ "torch", "Tensor" },
	{ "collections", "OrderedDict" }, /* torch's too: objects/ write it */
};
#define NDS_ALLOW (sizeof(ds_allow) / sizeof(ds_allow[0]))

enum { K_FP32, K_AVG, K_AVGSQ, NKIND };
static const char *const kind_prefix[NKIND] = {
	"", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"
};

/* One flat fp32 vector in an archive: numel elements at file_off. */
struct seg {
	const char *file;
	uint64_t file_off;
	uint64_t numel;
	bool ok;                 /* found and checked */
};

struct ds_file {
	char *path;              /* "TAG/NAME" */
	struct sf_cfile cf;
	struct sf_ts_doc *doc;
	const struct sf_pk *osd; /* optim: root["optimizer_state_dict"] */
};

struct ds {
	struct sf_kit k;
	struct sf_model *m;
	char tag[256];           /* "" when the directory is the tag */
	bool universal;          /* a universal checkpoint (TAG/zero/PARAM/) */
	unsigned mp, nmp;        /* the mp rank being read, of nmp */
	char pfx[24];            /* "mp_rank_XX/" with nmp > 1, else "" */
	int stage;
	unsigned world;
	unsigned ngroups;
	struct ds_file *opt;     /* world of them, by rank */
	struct ds_file model;    /* the (rank 0) model states */
	struct ds_file *mfr;     /* stage 3: every rank's model states (frozen
				  * fragments), nmfr of them, [0] unused */
	unsigned nmfr;
	struct seg *seg;         /* [kind][rank][group] */
	char ver[32];
	json_t *extra;           /* manifest.json's "deepspeed" (owned) */
	struct sf_ds_held held;  /* objects/ (owned until handed over) */
};

static struct seg *seg_at(struct ds *d, int kind, unsigned r, unsigned g)
{
	return &d->seg[((size_t)kind * d->world + r) * d->ngroups + g];
}

/* --- probe --- */

static bool ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);

	return a >= b && strcmp(s + a - b, suf) == 0;
}

static enum sf_probe ds_probe(const struct sf_dirlist *ls)
{
	bool optim = false, model = false, dir = false;

	for (size_t i = 0; i < ls->n; i++) {
		if (ls->is_dir[i]) {
			dir = true;
			continue;
		}
		optim |= ends_with(ls->names[i], "_optim_states.pt");
		model |= ends_with(ls->names[i], "_model_states.pt");
	}
	if ((sf_dirlist_has(ls, "latest", false) ||
	     sf_dirlist_has(ls, "latest_universal", false)) && dir)
		return SF_PROBE_YES;
	if (optim && model)
		return SF_PROBE_YES;
	if (model && sf_dirlist_has(ls, "zero", true))
		return SF_PROBE_YES; /* a universal checkpoint's tag directory */
	return SF_PROBE_NO;
}

/* --- files --- */

static int open_file(struct ds *d, const char *name, struct ds_file *f)
{
	char why[256];
	int rc;

	if (asprintf(&f->path, "%s%s%s", d->tag, d->tag[0] ? "/" : "", name) < 0) {
		f->path = NULL;
		return -ENOMEM;
	}
	rc = sf_cfile_open(d->k.cd, f->path, &f->cf);
	if (rc)
		return sf_fail(&d->k.w, rc, "%s: %s", SF_QSTR(f->path),
			       sf_strerror(rc));
	rc = sf_ts_doc_open(&f->cf.in, ds_allow, NDS_ALLOW, d->k.b, &f->doc,
			    why, sizeof(why));
	if (rc)
		return sf_fail(&d->k.w, rc, "%s: %s", SF_QSTR(f->path), why);
	return 0;
}

static void close_file(struct ds_file *f)
{
	sf_ts_doc_free(f->doc);
	sf_cfile_close(&f->cf);
	free(f->path);
	memset(f, 0, sizeof(*f));
}

/* A dict's value, an OrderedDict's too. */
static const struct sf_pk *dict_of(const struct sf_pk *v)
{
	if (v && v->kind == SF_PK_OBJ &&
	    sf_pk_is_obj(v, "collections", "OrderedDict"))
		return v->u.obj.items;
	return v && v->kind == SF_PK_DICT ? v : NULL;
}

static const struct sf_pk *get(const struct sf_pk *v, const char *key)
{
	return sf_pk_get(dict_of(v), key);
}

/* The value under int key in a dict (the optimizer's state by group). */
static const struct sf_pk *get_int(const struct sf_pk *v, int64_t key)
{
	const struct sf_pk *dd = dict_of(v);
	int64_t x;

	for (size_t i = 0; dd && i < dd->u.dict.n; i++)
		if (sf_pk_int(dd->u.dict.k[i], &x) && x == key)
			return dd->u.dict.v[i];
	return NULL;
}

/* Rank R of "[bf16_]zero_pp_rank_R_mp_rank_MM_optim_states.pt": 0 and
 * *r, *mp; -1 for another name. */
static int optim_rank(const char *name, unsigned long *r, unsigned long *mp)
{
	const char *p = strstr(name, "zero_pp_rank_");
	char *e;

	if (!p || !ends_with(name, "_optim_states.pt"))
		return -1;
	p += strlen("zero_pp_rank_");
	if (*p < '0' || *p > '9')
		return -1;
	*r = strtoul(p, &e, 10);
	if (strncmp(e, "_mp_rank_", 9) != 0 || e[9] < '0' || e[9] > '9')
		return -1;
	*mp = strtoul(e + 9, &e, 10);
	return strcmp(e, "_optim_states.pt") == 0 ? 0 : -1;
}

/* The tag `latest` (or a universal checkpoint's `latest_universal`)
 * names into d->tag (one plain name); without either the directory is
 * the tag (a universal one when it holds zero/). */
static int read_latest(struct ds *d, const struct sf_dirlist *ls)
{
	const char *lname = "latest";
	struct sf_cfile cf = { 0 };
	char *txt = NULL;
	size_t len = 0;
	int rc;

	if (sf_dirlist_has(ls, "latest_universal", false)) {
		lname = "latest_universal";
		d->universal = true;
	} else if (!sf_dirlist_has(ls, "latest", false)) {
		d->universal = sf_dirlist_has(ls, "zero", true);
		return 0;
	}
	rc = sf_cfile_open(d->k.cd, lname, &cf);
	if (!rc)
		rc = sf_cfile_read_all(&cf, DS_MAX_LATEST, &txt, &len);
	sf_cfile_close(&cf);
	if (rc)
		return sf_fail(&d->k.w, rc, "%s: %s", lname, sf_strerror(rc));
	while (len && (txt[len - 1] == '\n' || txt[len - 1] == '\r' ||
		       txt[len - 1] == ' ' || txt[len - 1] == '\t'))
		txt[--len] = '\0';
	if (sf_name_problem(txt, len, true, true) || len >= sizeof(d->tag)) {
		rc = sf_fail(&d->k.w, -SF_EFORMAT,
			     "%s names %s, not a directory of the checkpoint", lname,
			     sf_quote_name((char[SF_QNAME_SIZE]){ 0 }, txt, len));
		free(txt);
		return rc;
	}
	memcpy(d->tag, txt, len + 1);
	free(txt);
	return 0;
}

/* List directory sub (a relative path; "" for the checkpoint's own) of
 * the checkpoint, local only. */
static int list_dir(struct ds *d, const char *sub, struct sf_dirlist *out)
{
	int fd, rc;

	if (!sub[0])
		return sf_cdir_list(d->k.cd, out);
	if (d->k.cd->dirfd < 0)
		return sf_fail(&d->k.w, -ENOENT,
			       "the directory %s is on no local store", SF_QSTR(sub));
	fd = sf_open_beneath(d->k.cd->dirfd, sub, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return sf_fail(&d->k.w, fd, "%s: %s", SF_QSTR(sub), sf_strerror(fd));
	rc = sf_dirlist_read(fd, out);
	close(fd);
	if (rc)
		return sf_fail(&d->k.w, rc, "cannot list %s: %s", SF_QSTR(sub),
			       sf_strerror(rc));
	return 0;
}

static int list_tag(struct ds *d, struct sf_dirlist *out)
{
	return list_dir(d, d->tag, out);
}

/* Open every rank's optimizer states (exactly world of them, ranks 0 to
 * world - 1 once each, all of mp rank 0), and learn stage and world. */
static int open_optim(struct ds *d, const struct sf_dirlist *ls)
{
	const struct sf_pk *pc, *zs;
	size_t n = 0, first = SIZE_MAX;
	unsigned long r, mp;
	int64_t x;
	int rc;

	for (size_t i = 0; i < ls->n; i++) {
		if (ls->is_dir[i] || optim_rank(ls->names[i], &r, &mp) ||
		    mp != d->mp)
			continue;
		if (r == 0)
			first = i;
		n++;
	}
	if (first == SIZE_MAX)
		return sf_fail(&d->k.w, -SF_EFORMAT,
			       "no rank 0 *_mp_rank_%02u_optim_states.pt%s%s", d->mp,
			       d->tag[0] ? " in " : "", d->tag[0] ? SF_QSTR(d->tag) : "");
	if (n > DS_MAX_RANKS)
		return sf_fail(&d->k.w, -SF_ETOOBIG, "more than %d ranks",
			       DS_MAX_RANKS);
	d->opt = calloc(n, sizeof(*d->opt));
	if (!d->opt)
		return -ENOMEM;
	rc = open_file(d, ls->names[first], &d->opt[0]);
	if (rc)
		return rc;
	d->opt[0].osd = get(sf_ts_doc_root(d->opt[0].doc), "optimizer_state_dict");
	zs = get(d->opt[0].osd, "zero_stage");
	if (zs && zs->kind == SF_PK_OBJ)
		zs = sf_pk_item(zs->u.obj.args, 0);
	if (!sf_pk_int(zs, &x) || x < 1 || x > 3)
		return sf_fail(&d->k.w, -SF_EFORMAT, "%s: no ZeRO stage 1, 2 or 3",
			       SF_QSTR(d->opt[0].path));
	d->stage = (int)x;
	pc = get(d->opt[0].osd, "partition_count");
	if (pc && pc->kind == SF_PK_LIST) { /* stage 1/2: per group; the max */
		int64_t mx = 0;

		for (size_t i = 0; i < sf_pk_len(pc); i++)
			if (sf_pk_int(sf_pk_item(pc, i), &x) && x > mx)
				mx = x;
		x = mx;
	} else if (!sf_pk_int(pc, &x)) {
		x = 0;
	}
	if (x < 1 || (uint64_t)x != n)
		return sf_fail(&d->k.w, -SF_EFORMAT,
			       "partition_count says %lld ranks, %zu *_optim_states.pt found",
			       (long long)x, n);
	d->world = (unsigned)n;
	for (size_t i = 0; i < ls->n; i++) {
		if (ls->is_dir[i] || optim_rank(ls->names[i], &r, &mp) || r == 0 ||
		    mp != d->mp)
			continue;
		if (r >= n || d->opt[r].path)
			return sf_fail(&d->k.w, -SF_EFORMAT,
				       "%s: rank %lu repeated or out of 0..%zu",
				       SF_QSTR(ls->names[i]), r, n - 1);
		rc = open_file(d, ls->names[i], &d->opt[r]);
		if (rc)
			return rc;
		d->opt[r].osd = get(sf_ts_doc_root(d->opt[r].doc), "optimizer_state_dict");
	}
	return 0;
}

/* v as a 1-D contiguous fp32 tensor of f into *s. 0, or a reason. */
static int seg_of(struct ds *d, struct ds_file *f, const struct sf_pk *v,
		  const char *what, struct seg *s)
{
	struct sf_ts_tensor t;
	char why[256];
	int rc = sf_ts_doc_tensor(f->doc, v, what, &t, why, sizeof(why));

	if (rc == 1)
		return sf_fail(&d->k.w, -SF_EFORMAT, "%s: %s is not a tensor",
			       SF_QSTR(f->path), what);
	if (rc)
		return sf_fail(&d->k.w, rc, "%s: %s", SF_QSTR(f->path), why);
	if (t.dtype != SF_DT_F32 || t.ndim != 1 || !t.contiguous)
		return sf_fail(&d->k.w, -SF_EFORMAT,
			       "%s: %s is not a flat fp32 vector",
			       SF_QSTR(f->path), what);
	s->file = f->path;
	s->file_off = t.data_off + t.storage_offset * 4;
	s->numel = t.shape[0];
	s->ok = true;
	return 0;
}

/* Each rank's flat fp32 groups and moments. The moments are optional: a
 * rank without them leaves the optimizer tensors out. */
static int read_segs(struct ds *d)
{
	const char *key = d->stage <= 2 ? "single_partition_of_fp32_groups" :
			  "fp32_flat_groups";
	const struct sf_pk *g0 = get(d->opt[0].osd, key);
	int rc;

	if (!g0 || g0->kind != SF_PK_LIST || sf_pk_len(g0) == 0 ||
	    sf_pk_len(g0) > DS_MAX_GROUPS)
		return sf_fail(&d->k.w, -SF_EFORMAT, "%s: no %s",
			       SF_QSTR(d->opt[0].path), key);
	d->ngroups = (unsigned)sf_pk_len(g0);
	d->seg = calloc((size_t)NKIND * d->world * d->ngroups, sizeof(*d->seg));
	if (!d->seg)
		return -ENOMEM;
	for (unsigned r = 0; r < d->world; r++) {
		struct ds_file *f = &d->opt[r];
		const struct sf_pk *gl = get(f->osd, key), *st;
		char what[64];

		if (!gl || gl->kind != SF_PK_LIST || sf_pk_len(gl) != d->ngroups)
			return sf_fail(&d->k.w, -SF_EFORMAT,
				       "%s: %s has not %u groups", SF_QSTR(f->path),
				       key, d->ngroups);
		st = d->stage <= 2 ? get(get(f->osd, "base_optimizer_state"), "state") :
		     get(get(f->osd, "optimizer_state_dict"), "state");
		for (unsigned g = 0; g < d->ngroups; g++) {
			const struct sf_pk *gs = get_int(st, g);

			snprintf(what, sizeof(what), "%s[%u]", key, g);
			rc = seg_of(d, f, sf_pk_item(gl, g), what, seg_at(d, K_FP32, r, g));
			if (rc)
				return rc;
			/* the moments: optional; a bad one leaves them out */
			if (seg_of(d, f, get(gs, "exp_avg"), "exp_avg", seg_at(d, K_AVG, r, g)) ||
			    seg_of(d, f, get(gs, "exp_avg_sq"), "exp_avg_sq", seg_at(d, K_AVGSQ, r, g))) {
				seg_at(d, K_AVG, r, g)->ok = false;
				seg_at(d, K_AVGSQ, r, g)->ok = false;
				sf_kit_clear_err(&d->k);
			}
			/* the moments cover the partition (and its padding) */
			for (int kind = K_AVG; kind < NKIND; kind++)
				if (seg_at(d, kind, r, g)->numel > seg_at(d, K_FP32, r, g)->numel)
					seg_at(d, kind, r, g)->numel = seg_at(d, K_FP32, r, g)->numel;
		}
	}
	if (d->stage == 3) /* every rank's groups are rank 0's sizes */
		for (unsigned r = 1; r < d->world; r++)
			for (unsigned g = 0; g < d->ngroups; g++)
				if (seg_at(d, K_FP32, r, g)->numel !=
				    seg_at(d, K_FP32, 0, g)->numel)
					return sf_fail(&d->k.w, -SF_EFORMAT,
						       "%s: fp32_flat_groups[%u] is not rank 0's size",
						       SF_QSTR(d->opt[r].path), g);
	return 0;
}

/* --- building tensors --- */

/* Elements [start, start + count) of the concatenation of segs[0..n) (each
 * stride apart in the seg array) as flat shards of t from element *pos.
 * 0; -SF_ERANGE when the range passes the segments' end or a segment is
 * missing (reason in why); -ENOMEM. */
static int emit(struct ds *d, struct sf_tensor *t, struct seg *segs,
		size_t stride, size_t n, uint64_t start, uint64_t count,
		uint64_t *pos, char *why, size_t whylen)
{
	uint64_t base = 0;

	for (size_t i = 0; i < n && count; i++) {
		const struct seg *s = &segs[i * stride];
		uint64_t lo, take;
		struct sf_shard sh = { 0 };
		int rc;

		if (!s->ok) {
			snprintf(why, whylen, "a partition is missing");
			return -SF_ERANGE;
		}
		if (start >= base + s->numel) {
			base += s->numel;
			continue;
		}
		lo = start - base;
		take = s->numel - lo < count ? s->numel - lo : count;
		sh.flat = true;
		sh.flat_off = *pos * 4;
		sh.flat_len = take * 4;
		sh.nbytes = take * 4;
		sh.file = (char *)s->file;
		sh.file_offset = s->file_off + lo * 4;
		rc = sf_tensor_add_shard(d->m, t, &sh);
		if (rc) {
			snprintf(why, whylen, "%s", sf_model_why(d->m));
			return rc;
		}
		*pos += take;
		start += take;
		count -= take;
		base += s->numel;
	}
	if (count) {
		snprintf(why, whylen, "its partitions hold fewer elements than its shape");
		return -SF_ERANGE;
	}
	return 0;
}

/* One parameter of one kind: a tensor of shape, its elements from the
 * flat vectors (stage 1/2: group g's merged vector from off; stage 3:
 * every rank's groups from off, pn elements each). 0 or -ENOMEM; any
 * other failure leaves the tensor out with a line. */
static int add_param(struct ds *d, int kind, const char *name, unsigned g,
		     const uint64_t *shape, unsigned ndim, uint64_t numel,
		     uint64_t off, uint64_t pn)
{
	char full[SF_MAX_NAME + 32], why[256] = "";
	struct sf_tensor *t;
	uint64_t pos = 0;
	int rc;

	snprintf(full, sizeof(full), "%s%s%s", d->pfx, kind_prefix[kind], name);
	rc = sf_model_add_tensor(d->m, false, full, SF_DT_F32, ndim, shape, &t);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_kit_leave_out(&d->k, full, "%s", sf_model_why(d->m));
		return 0;
	}
	if (d->stage <= 2) {
		rc = emit(d, t, seg_at(d, kind, 0, g), d->ngroups, d->world, off,
			  numel, &pos, why, sizeof(why));
	} else {
		for (unsigned r = 0; r < d->world && !rc && pos < numel; r++) {
			uint64_t c = numel - pos < pn ? numel - pos : pn;

			rc = emit(d, t, seg_at(d, kind, r, 0), 1, d->ngroups, off,
				  c, &pos, why, sizeof(why));
		}
	}
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&d->k, full, "%s", why);
	}
	return 0;
}

/* Every parameter of param_shapes, in zero_to_fp32's order and offsets. */
static int build_params(struct ds *d, const struct sf_pk *shapes,
			const struct sf_pk *pads)
{
	uint64_t off3 = 0, avail3 = 0;
	int rc = 0;

	if (!shapes || shapes->kind != SF_PK_LIST ||
	    (d->stage <= 2 && sf_pk_len(shapes) != d->ngroups))
		return sf_fail(&d->k.w, -SF_EFORMAT,
			       "param_shapes is not a list of one dict per group");
	for (unsigned g = 0; g < d->ngroups; g++)
		avail3 += seg_at(d, K_FP32, 0, g)->numel;
	for (size_t g = 0; g < sf_pk_len(shapes) && !rc; g++) {
		const struct sf_pk *dd = dict_of(sf_pk_item(shapes, g));
		const struct sf_pk *gp = pads ? sf_pk_item(pads, g) : NULL;
		uint64_t off = 0;

		if (!dd)
			return sf_fail(&d->k.w, -SF_EFORMAT,
				       "param_shapes[%zu] is not a dict", g);
		for (size_t i = 0; i < dd->u.dict.n && !rc; i++) {
			const char *name = sf_pk_str(dd->u.dict.k[i]);
			uint64_t shape[SF_MAX_NDIM], numel = 1, pn;
			unsigned ndim;
			int64_t pad = 0;

			if (!name || !sf_pk_uints(dd->u.dict.v[i],
						  SF_PK_UINTS_SIZE | SF_PK_UINTS_LIST,
						  shape, SF_MAX_NDIM, &ndim))
				return sf_fail(&d->k.w, -SF_EFORMAT,
					       "param_shapes[%zu]: entry %zu is not a name and a shape",
					       g, i);
			for (unsigned k = 0; k < ndim; k++)
				if (__builtin_mul_overflow(numel, shape[k], &numel))
					return sf_fail(&d->k.w, -SF_EFORMAT,
						       "param_shapes: %s too large", SF_QSTR(name));
			pn = (numel + d->world - 1) / d->world;
			for (int kind = 0; kind < NKIND && !rc; kind++)
				rc = add_param(d, kind, name, (unsigned)g, shape, ndim,
					       numel, d->stage <= 2 ? off : off3, pn);
			if (gp && sf_pk_int(sf_pk_item(gp, i), &pad) && pad > 0)
				off += (uint64_t)pad;
			if (__builtin_add_overflow(off, numel, &off) ||
			    __builtin_add_overflow(off3, pn, &off3))
				return sf_fail(&d->k.w, -SF_EFORMAT, "param_shapes: offsets overflow");
		}
	}
	if (!rc && d->stage == 3 && off3 != avail3)
		return sf_fail(&d->k.w, -SF_EFORMAT,
			       "the parameters take %llu elements per rank, the flat groups hold %llu",
			       (unsigned long long)off3, (unsigned long long)avail3);
	return rc;
}

/* A tensor of the module state dict (16-bit weights or a buffer), served
 * as stored. 0 or -ENOMEM; else left out with a line. */
static int add_stored(struct ds *d, const char *full, const struct sf_pk *v)
{
	struct sf_ts_tensor t;
	struct sf_tensor *mt;
	struct sf_shard sh = { 0 };
	char why[256];
	int rc = sf_ts_doc_tensor(d->model.doc, v, full, &t, why, sizeof(why));

	if (rc == 1) {
		sf_kit_leave_out(&d->k, full, "not a tensor");
		return 0;
	}
	if (rc) {
		sf_kit_leave_out(&d->k, full, "%s", why);
		return 0;
	}
	if (!t.contiguous) {
		sf_kit_leave_out(&d->k, full, "not stored contiguous");
		return 0;
	}
	rc = sf_model_add_tensor(d->m, false, full, t.dtype, t.ndim, t.shape, &mt);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_kit_leave_out(&d->k, full, "%s", sf_model_why(d->m));
		return 0;
	}
	if (mt->nbytes == 0)
		return 0;
	sh.flat = true;
	sh.flat_len = mt->nbytes;
	sh.nbytes = mt->nbytes;
	sh.file = d->model.path;
	sh.file_offset = t.data_off + t.storage_offset * sf_dtype_size(t.dtype);
	rc = sf_tensor_add_shard(d->m, mt, &sh);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&d->k, full, "%s", sf_model_why(d->m));
	}
	return 0;
}

/* The rank's fragment of frozen parameter name in the model states of
 * rank r (stage 3; r 0 is d->model), opened once into d->mfr[r]. NULL
 * (and a reason in why) when it is missing. */
static const struct sf_pk *frozen_fragment(struct ds *d, unsigned r,
					   const char *name, char *why,
					   size_t whylen)
{
	char mname[96];

	if (r > 0 && !d->mfr[r].doc) {
		snprintf(mname, sizeof(mname),
			 "zero_pp_rank_%u_mp_rank_%02u_model_states.pt", r, d->mp);
		if (d->mfr[r].path || open_file(d, mname, &d->mfr[r])) {
			snprintf(why, whylen, "rank %u's model states do not open", r);
			sf_kit_clear_err(&d->k);
			return NULL;
		}
	}
	return get(get(sf_ts_doc_root(r ? d->mfr[r].doc : d->model.doc),
		       "frozen_param_fragments"), name);
}

/* A frozen parameter (requires_grad off: LoRA's base weights), which
 * zero_to_fp32 gives as stored (16-bit): stage 1/2 the whole tensor in
 * frozen_param_fragments; stage 3 each rank's ceil(numel / world)
 * elements, concatenated and cut to numel. 0 or -ENOMEM; else left out
 * with a line. */
static int add_frozen(struct ds *d, const struct sf_pk *kn,
		      const struct sf_pk *vn)
{
	char full[SF_MAX_NAME + 32], why[256] = "";
	uint64_t shape[SF_MAX_NDIM], numel = 1, pos = 0, pn;
	enum sf_dtype dt = SF_DT_INVALID;
	struct sf_tensor *t = NULL;
	unsigned ndim, nr = d->stage <= 2 ? 1 : d->world;
	int rc = 0;

	if (!sf_pk_str(kn))
		return 0;
	snprintf(full, sizeof(full), "%s%s", d->pfx, sf_pk_str(kn));
	if (!sf_pk_uints(vn, SF_PK_UINTS_SIZE | SF_PK_UINTS_LIST, shape,
			 SF_MAX_NDIM, &ndim)) {
		sf_kit_leave_out(&d->k, full, "frozen_param_shapes: not a shape");
		return 0;
	}
	for (unsigned k = 0; k < ndim; k++)
		if (__builtin_mul_overflow(numel, shape[k], &numel)) {
			sf_kit_leave_out(&d->k, full, "its shape is too large");
			return 0;
		}
	pn = d->stage <= 2 ? numel : (numel + d->world - 1) / d->world;
	for (unsigned r = 0; r < nr && !rc && pos < numel; r++) {
		const struct sf_pk *v = frozen_fragment(d, r, sf_pk_str(kn), why,
							sizeof(why));
		struct ds_file *f = r ? &d->mfr[r] : &d->model;
		struct sf_ts_tensor tt;
		struct sf_shard sh = { 0 };
		uint64_t take = numel - pos < pn ? numel - pos : pn, fnumel = 1;

		if (!v) {
			if (!why[0])
				snprintf(why, sizeof(why), "rank %u has no fragment of it", r);
			rc = -SF_EFORMAT;
			break;
		}
		rc = sf_ts_doc_tensor(f->doc, v, full, &tt, why, sizeof(why));
		if (rc == 1)
			snprintf(why, sizeof(why), "rank %u's fragment is not a tensor", r);
		if (rc)
			break;
		for (unsigned k = 0; k < tt.ndim; k++)
			fnumel *= tt.shape[k]; /* inside its storage: checked */
		if (!tt.contiguous || fnumel < take || (dt && tt.dtype != dt)) {
			snprintf(why, sizeof(why), "rank %u's fragment is not %llu contiguous elements of one type",
				 r, (unsigned long long)take);
			rc = -SF_EFORMAT;
			break;
		}
		if (!t) {
			dt = tt.dtype;
			rc = sf_model_add_tensor(d->m, false, full, dt, ndim, shape, &t);
			if (rc) {
				snprintf(why, sizeof(why), "%s", sf_model_why(d->m));
				if (rc == -ENOMEM)
					return rc;
				sf_kit_leave_out(&d->k, full, "%s", why);
				return 0;
			}
		}
		if (!take)
			continue;
		sh.flat = true;
		sh.flat_off = pos * sf_dtype_size(dt);
		sh.flat_len = sh.nbytes = take * sf_dtype_size(dt);
		sh.file = f->path;
		sh.file_offset = tt.data_off + tt.storage_offset * sf_dtype_size(dt);
		rc = sf_tensor_add_shard(d->m, t, &sh);
		if (rc)
			snprintf(why, sizeof(why), "%s", sf_model_why(d->m));
		pos += take;
	}
	if (rc == -ENOMEM)
		return rc;
	if (!rc && pos < numel) {
		snprintf(why, sizeof(why), "its fragments hold fewer elements than its shape");
		rc = -SF_ERANGE;
	}
	if (rc) {
		if (t)
			sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&d->k, full, "%s", why);
	}
	return 0;
}

/* A shared parameter (tied weights: shared_params maps NAME to the
 * parameter OTHER it is): as zero_to_fp32, NAME is OTHER's fp32 weight,
 * the same shards under a second name. 0 or -ENOMEM; else left out with a
 * line. */
static int add_shared(struct ds *d, const struct sf_pk *kn,
		      const struct sf_pk *vn)
{
	const char *other = sf_pk_str(vn);
	char name[SF_MAX_NAME + 32], oname[SF_MAX_NAME + 32];
	struct sf_tensor *t;
	size_t src = SIZE_MAX;
	int rc;

	if (!sf_pk_str(kn))
		return 0;
	snprintf(name, sizeof(name), "%s%s", d->pfx, sf_pk_str(kn));
	snprintf(oname, sizeof(oname), "%s%s", d->pfx, other ? other : "");
	for (size_t i = 0; other && i < d->m->ntensors; i++)
		if (strcmp(d->m->tensors[i].name, oname) == 0)
			src = i;
	if (src == SIZE_MAX) {
		sf_kit_leave_out(&d->k, name, "shared with %s, which is not shown",
				 other ? SF_QSTR(other) : "no parameter");
		return 0;
	}
	rc = sf_model_add_tensor(d->m, false, name, d->m->tensors[src].dtype,
				 d->m->tensors[src].ndim, d->m->tensors[src].shape, &t);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_kit_leave_out(&d->k, name, "%s", sf_model_why(d->m));
		return 0;
	}
	/* adding t may have moved the array: src is found again by index */
	for (size_t j = 0; j < d->m->tensors[src].nshards && !rc; j++)
		rc = sf_tensor_add_shard(d->m, t, &d->m->tensors[src].shards[j]);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&d->k, name, "%s", sf_model_why(d->m));
	}
	return 0;
}

static bool in_list(const struct sf_pk *l, const char *s)
{
	for (size_t i = 0; i < sf_pk_len(l); i++) {
		const char *x = sf_pk_str(sf_pk_item(l, i));

		if (x && strcmp(x, s) == 0)
			return true;
	}
	return false;
}

/* The module state dict: buffers as NAME (fp32 or non-float as stored),
 * stage 1/2 weights as module/NAME; shared parameters as the parameter
 * they are; frozen parameters are left out with a line. */
static int build_module(struct ds *d, const struct sf_pk *root)
{
	const struct sf_pk *mod = dict_of(get(root, "module"));
	const struct sf_pk *bn = get(root, "buffer_names");
	const struct sf_pk *sp = dict_of(get(root, "shared_params"));
	const struct sf_pk *fz = dict_of(get(root, "frozen_param_shapes"));
	char full[SF_MAX_NAME + 32];
	int rc = 0;

	for (size_t i = 0; sp && i < sp->u.dict.n && !rc; i++)
		rc = add_shared(d, sp->u.dict.k[i], sp->u.dict.v[i]);
	for (size_t i = 0; fz && i < fz->u.dict.n && !rc; i++)
		rc = add_frozen(d, fz->u.dict.k[i], fz->u.dict.v[i]);
	for (size_t i = 0; mod && i < mod->u.dict.n && !rc; i++) {
		const char *name = sf_pk_str(mod->u.dict.k[i]);
		struct sf_ts_tensor t;
		char why[256];

		if (!name)
			continue;
		snprintf(full, sizeof(full), "%s%s", d->pfx, name);
		if (in_list(bn, name)) {
			if (sf_ts_doc_tensor(d->model.doc, mod->u.dict.v[i], name, &t,
					     why, sizeof(why)) == 0 &&
			    t.dtype >= SF_DT_F64 && t.dtype <= SF_DT_F8_E5M2 &&
			    t.dtype != SF_DT_F32) {
				sf_kit_leave_out(&d->k, full,
						 "a %s buffer (zero_to_fp32 converts it to fp32)",
						 sf_dtype_name(t.dtype));
				continue;
			}
			rc = add_stored(d, full, mod->u.dict.v[i]);
		} else if (d->stage <= 2) {
			snprintf(full, sizeof(full), "%smodule/%s", d->pfx, name);
			rc = add_stored(d, full, mod->u.dict.v[i]);
		}
	}
	return rc;
}

/* --- universal checkpoints (ds_to_universal) --- */

/* TAG/zero/PARAM/FILE.pt: a torch.save of {"param": tensor[, "cat_dim"]},
 * the whole (fp32) state of one parameter: tensor NAME (prefix + PARAM)
 * served in place. No file: nothing (a buffer has no moments). 0 or
 * -ENOMEM; else left out with a line. */
static int add_universal(struct ds *d, const char *param, const char *file,
			 const char *prefix)
{
	char path[SF_MAX_NAME + 300], full[SF_MAX_NAME + 32], why[256];
	struct sf_torchsave *ts = NULL;
	const struct sf_ts_tensor *t = NULL;
	struct sf_cfile cf = { 0 };
	struct sf_tensor *mt;
	struct sf_shard sh = { 0 };
	uint64_t size;
	int rc;

	snprintf(path, sizeof(path), "%s%szero/%s/%s", d->tag,
		 d->tag[0] ? "/" : "", param, file);
	snprintf(full, sizeof(full), "%s%s", prefix, param);
	rc = sf_cdir_stat(d->k.cd, path, &size);
	if (rc == -ENOENT)
		return 0;
	if (!rc)
		rc = sf_cfile_open(d->k.cd, path, &cf);
	if (rc) {
		sf_kit_leave_out(&d->k, full, "%s: %s", SF_QSTR(path), sf_strerror(rc));
		return rc == -ENOMEM || rc == -SF_EBUDGET ? rc : 0;
	}
	rc = sf_torchsave_open(&cf.in, &ts, why, sizeof(why));
	for (size_t i = 0; !rc && i < ts->n; i++)
		if (strcmp(ts->t[i].key, "param") == 0)
			t = &ts->t[i];
	if (rc || !t || !t->contiguous) {
		if (rc != -ENOMEM)
			sf_kit_leave_out(&d->k, full, "%s: %s", SF_QSTR(path),
					 rc ? why : "no contiguous \"param\" tensor");
		goto out_close;
	}
	rc = sf_model_add_tensor(d->m, false, full, t->dtype, t->ndim, t->shape, &mt);
	if (rc && rc != -ENOMEM)
		sf_kit_leave_out(&d->k, full, "%s", sf_model_why(d->m));
	if (rc || mt->nbytes == 0)
		goto out_close;
	sh.flat = true;
	sh.flat_len = sh.nbytes = mt->nbytes;
	sh.file = path;
	sh.file_offset = t->data_off + t->storage_offset * sf_dtype_size(t->dtype);
	rc = sf_tensor_add_shard(d->m, mt, &sh);
	if (rc && rc != -ENOMEM) {
		sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&d->k, full, "%s", sf_model_why(d->m));
	}
out_close:
	sf_torchsave_free(ts);
	sf_cfile_close(&cf);
	return rc == -ENOMEM || rc == -SF_EBUDGET ? rc : 0;
}

static int build_universal(struct ds *d)
{
	static const char *const files[NKIND] = {
		"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt"
	};
	struct sf_dirlist ls = { 0 };
	char sub[300];
	int rc;

	snprintf(sub, sizeof(sub), "%s%szero", d->tag, d->tag[0] ? "/" : "");
	rc = list_dir(d, sub, &ls);
	for (size_t i = 0; !rc && i < ls.n; i++) {
		if (!ls.is_dir[i])
			continue;
		if (sf_name_problem(ls.names[i], strlen(ls.names[i]), true, false)) {
			sf_kit_leave_out(&d->k, ls.names[i], "not a name shardfs can show");
			continue;
		}
		for (int kind = 0; kind < NKIND && !rc; kind++)
			rc = add_universal(d, ls.names[i], files[kind], kind_prefix[kind]);
	}
	sf_dirlist_free(&ls);
	if (!rc)
		sf_kit_set_format(d->m, "%s universal", SF_DEEPSPEED_FORMAT);
	return rc;
}

/* Drop what one mp rank's read held (the model keeps what it needs). */
static void close_mp(struct ds *d)
{
	for (unsigned r = 0; d->opt && r < d->world; r++)
		close_file(&d->opt[r]);
	if (d->opt && !d->world)
		close_file(&d->opt[0]);
	free(d->opt);
	d->opt = NULL;
	d->world = 0;
	close_file(&d->model);
	free(d->seg);
	d->seg = NULL;
	for (unsigned r = 0; d->mfr && r < d->nmfr; r++)
		close_file(&d->mfr[r]);
	free(d->mfr);
	d->mfr = NULL;
	d->nmfr = 0;
}

/* The non-tensor entries of mp rank 0's model states and rank 0's
 * optimizer states (step counts, the loss scaler, ds_config, ...), as
 * manifest.json's "deepspeed": {"tag", "model_states", "optim_states"}
 * (sf_deepspeed_obj.h; decoded by the pickle reader, nothing run) and as
 * objects/ (d->held). 0 or -ENOMEM. */
static int add_objects(struct ds *d, const struct sf_pk *root)
{
	static const char *const skip_model[] = {
		"module", "frozen_param_fragments", NULL /* tensors: shown */
	};
	json_t *ms = sf_ds_obj_json(d->model.doc, root, skip_model);
	json_t *os = sf_ds_obj_json(d->opt[0].doc, sf_ts_doc_root(d->opt[0].doc),
				    NULL);

	int rc;

	d->extra = json_pack("{s:{s:s*, s:o*, s:o*}}", SF_DEEPSPEED_FORMAT,
			     "tag", d->tag[0] ? d->tag : NULL,
			     "model_states", ms, "optim_states", os);
	if (!d->extra)
		return -ENOMEM;
	/* and as objects/KEY, objects/optim_states/KEY: torch.save archives */
	rc = sf_ds_obj_held(&d->k, root, "", false, ds_allow, NDS_ALLOW, &d->held);
	if (!rc)
		rc = sf_ds_obj_held(&d->k, sf_ts_doc_root(d->opt[0].doc),
				    "optim_states/", true, ds_allow, NDS_ALLOW,
				    &d->held);
	if (!rc)
		sf_ds_held_finish(&d->k, &d->held);
	if (!rc && d->held.tensors)
		sf_info("checkpoint %s: %zu entr%s of the model and optimizer states not in objects/: they hold tensors",
			SF_QSTR(d->k.name), d->held.tensors,
			d->held.tensors == 1 ? "y" : "ies");
	return rc;
}

/* One mp rank's tensors (d->mp, d->pfx set). */
static int build_mp(struct ds *d, const struct sf_dirlist *ls)
{
	const struct sf_pk *root, *v;
	char mname[64];
	int rc;

	rc = open_optim(d, ls);
	if (!rc)
		rc = read_segs(d);
	if (rc)
		return rc;
	d->mfr = calloc(d->world, sizeof(*d->mfr));
	if (!d->mfr)
		return -ENOMEM;
	d->nmfr = d->world;
	if (d->stage <= 2)
		snprintf(mname, sizeof(mname), "mp_rank_%02u_model_states.pt", d->mp);
	else
		snprintf(mname, sizeof(mname), "zero_pp_rank_0_mp_rank_%02u_model_states.pt",
			 d->mp);
	rc = open_file(d, mname, &d->model);
	if (rc)
		return rc;
	root = sf_ts_doc_root(d->model.doc);
	v = get(root, "ds_version");
	snprintf(d->ver, sizeof(d->ver), "%s", sf_pk_str(v) ? sf_pk_str(v) : "");
	rc = build_params(d, get(root, "param_shapes"),
			  d->stage <= 2 ? get(d->opt[0].osd, "param_alignment_paddings") : NULL);
	if (!rc)
		rc = build_module(d, root);
	if (!rc && d->mp == 0)
		rc = add_objects(d, root);
	return rc;
}

/* The mp ranks (tensor parallel) of the tag: 0..nmp-1, each read as a
 * ZeRO checkpoint of its own; with more than one, each under
 * mp_rank_XX/ (the split axis is in no file: nothing is merged). */
static int build(struct ds *d)
{
	struct sf_dirlist ls = { 0 };
	unsigned long r, mp, maxmp = 0;
	int rc, stage = 0;

	if (d->universal)
		return build_universal(d);
	rc = list_tag(d, &ls);
	for (size_t i = 0; !rc && i < ls.n; i++)
		if (!ls.is_dir[i] && !optim_rank(ls.names[i], &r, &mp) && mp > maxmp)
			maxmp = mp;
	if (!rc && maxmp >= DS_MAX_RANKS)
		rc = sf_fail(&d->k.w, -SF_ETOOBIG, "more than %d mp ranks", DS_MAX_RANKS);
	d->nmp = (unsigned)maxmp + 1;
	for (unsigned m = 0; !rc && m < d->nmp; m++) {
		d->mp = m;
		if (d->nmp > 1)
			snprintf(d->pfx, sizeof(d->pfx), "mp_rank_%02u/", m);
		rc = build_mp(d, &ls);
		if (!rc && m > 0 && d->stage != stage)
			rc = sf_fail(&d->k.w, -SF_EFORMAT,
				     "mp rank %u is ZeRO stage %d, mp rank 0 stage %d",
				     m, d->stage, stage);
		stage = d->stage;
		close_mp(d);
	}
	sf_dirlist_free(&ls);
	if (rc)
		return rc;
	sf_kit_set_format(d->m, "%s zero-%d%s%s", SF_DEEPSPEED_FORMAT, d->stage,
			  d->ver[0] ? " " : "", d->ver);
	return 0;
}

/* The format's own top-level names: latest, and (bare) the archives. */
static bool own_name(void *arg, const char *name)
{
	(void)arg;
	return strcmp(name, "latest") == 0 ||
	       strcmp(name, "latest_universal") == 0 ||
	       ends_with(name, "_optim_states.pt") ||
	       ends_with(name, "_model_states.pt");
}

/* One info line when directories lie beside the tag latest names (other
 * global_stepN/: a store shows each as DIR@TAG, sf_dstags.h). */
static void note_other_tags(struct ds *d, const struct sf_dirlist *ls)
{
	size_t n = 0;

	if (!d->tag[0])
		return;
	for (size_t i = 0; i < ls->n; i++)
		n += ls->is_dir[i] && strcmp(ls->names[i], d->tag) != 0;
	if (n)
		sf_info("checkpoint %s: %s shown (latest names it); %zu other director%s beside it, a store lists each tag as NAME@TAG",
			SF_QSTR(d->k.name), SF_QSTR(d->tag), n, n == 1 ? "y" : "ies");
}

static int ds_open(const struct sf_cdir *cd, struct sf_format_result *out,
		   char *err, size_t errlen)
{
	struct ds d = { 0 };
	struct sf_dirlist ls = { 0 };
	int rc;

	sf_kit_init(&d.k, cd, err, errlen);
	rc = sf_cdir_list(cd, &ls);
	if (rc)
		return sf_fail(&d.k.w, rc, "cannot list the directory: %s",
			       sf_strerror(rc));
	rc = sf_kit_start(&d.k, 0, &d.m);
	if (!rc)
		rc = read_latest(&d, &ls);
	if (!rc)
		note_other_tags(&d, &ls);
	if (!rc)
		rc = build(&d);
	if (!rc)
		rc = sf_kit_add_root_files(&d.k, d.m, own_name, &d);
	if (!rc)
		rc = sf_kit_finish(&d.k, d.m);
	if (!rc) {
		out->extra = d.extra;
		d.extra = NULL;
		out->held = d.held.v;
		out->nheld = d.held.n;
		d.held.v = NULL;
		d.held.n = 0;
	}
	json_decref(d.extra);
	sf_held_free(d.held.v, d.held.n);
	/* the model copies the file names it keeps: the archives can go */
	rc = sf_kit_end(&d.k, rc, d.m, out);
	close_mp(&d);
	sf_dirlist_free(&ls);
	return rc;
}

const struct sf_format sf_format_deepspeed = {
	.name = SF_DEEPSPEED_FORMAT,
	.writable = false,
	.probe = ds_probe,
	.open = ds_open,
};
