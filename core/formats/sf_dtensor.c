/*
 * sf_dtensor.c - per-rank torch.save pickles of DTensor state dicts, read
 * in place (sf_dtensor.h).
 *
 * What lies on disk (torch 2.15; docs/FORMAT.md): DIR/model_world_size_W_
 * rank_R.pt for R in 0..W-1, each torch.save(state_dict) on rank R. A
 * DTensor value is pickled as
 *   _rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor,
 *       (DTensor, dtype, global size, stride, offset, layout, device, rg),
 *       (None, {"_local_tensor": this rank's shard (_rebuild_tensor_v2),
 *               "_spec": DTensorSpec}))
 * the spec (NEWOBJ + BUILD) holding mesh (DeviceMesh: _layout, a
 * _MeshLayout of one _FlatLayout per mesh dimension, _rank,
 * _coordinate_on_dim, _flatten_rank_map), placements (one per mesh
 * dimension: Shard(dim), _StridedShard(dim, split_factor), Replicate,
 * Partial), tensor_meta (TensorMeta(Size, stride, dtype)) and shard_order.
 *
 * What is shown: tensors/KEY for every DTensor KEY of rank 0's dict, whole:
 * each rank's local tensor is the box (or, for _StridedShard, the boxes)
 * torch's own chunking gives its mesh coordinate, applied left to right
 * over the mesh dimensions as torch's _compute_local_shape_and_global_
 * offset does: Shard(d) chunks the current extent of dim d as torch.chunk
 * (ceil-sized chunks, the last ones shorter or empty) and keeps chunk
 * coord; _StridedShard(d, sf) chunks it into sf pieces, each piece into
 * mesh-size chunks, and keeps chunk coord of every piece, in order;
 * Replicate keeps the extent. Each box is a shard pointing into the
 * rank's storage entry (stored, uncompressed; with the local tensor's
 * strides when it is not row-major contiguous); replicas go through
 * sf_overlap_rule (the lowest rank serves, the others are kept for
 * verify) and the boxes must cover the tensor (sf_cover_check). A plain
 * tensor equal (dtype, shape, bytes) on every rank is shown once (rank
 * 0's); one that differs is left out with a line. Non-tensor values are
 * counted in one info line (objects/ for pickled values: not yet).
 *
 * ShardedTensor values (FSDP1's SHARDED_STATE_DICT, and LOCAL_STATE_DICT's
 * `_flat_param`, torch.save'd per rank the same way) are
 *   _rebuild_from_type_v2(_rebuild_wrapper_subclass, ShardedTensor,
 *       (ShardedTensor, dtype, global size, ...),
 *       (local shards, ShardedTensorMetadata, ProcessGroupState, spec, rrefs))
 * each local Shard holding its tensor and a ShardMetadata (shard_offsets,
 * shard_sizes, placement: a _remote_device with _rank): each local shard
 * is the box its metadata gives, the same rules after (overlap rule,
 * coverage). The process group's global_rank and every local shard's
 * placement must be the file's rank (else the checkpoint is left out).
 *
 * Left out with one line (that tensor alone): Partial placements
 * (unreduced sums), a shard_order other than torch's default (mesh
 * dimensions in ascending order per tensor dimension), a key that is not
 * a DTensor on every rank or whose mesh, placements, shape or dtype
 * differ between ranks, a local tensor whose shape is not the one its
 * coordinate gives, boxes that leave a gap. The checkpoint is left out
 * when a file is missing, a file's pickle names a global outside the
 * allowlist, or a DTensor's mesh says another rank than the file's name
 * (_rank), or a coordinate that is not that rank's place in the mesh.
 *
 * Invariants: the pickles are decoded with the torch tensor names plus
 * exactly the DTensor and ShardedTensor classes below (nothing executed); every shard lies
 * inside its rank's storage entry (sf_ts_doc_tensor checks the view, each
 * box is inside the view); every file is one plain name, opened beneath the
 * checkpoint directory with sf_cfile_open.
 */
#include "sf_dtensor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sf_error.h"
#include "sf_kit.h"
#include "sf_log.h"
#include "sf_pickle.h"
#include "sf_torchsave.h"

#define DT_MAX_WORLD 4096
#define DT_MAX_MESH_NDIM 8
#define DT_MAX_RUNS 1024        /* index runs per tensor dimension per rank */
#define DT_MAX_BOXES 4096       /* boxes per rank per tensor */
#define DT_CMP_CHUNK (1u << 20) /* plain tensors compared this much a time */

#define PT "torch.distributed.tensor.placement_types"
#define SPEC "torch.distributed.tensor._dtensor_spec"
#define ST "torch.distributed._shard.sharded_tensor"

/* The classes a DTensor state dict names beyond a tensor's (torch 2.15):
 * inert data here, never resolved. */
static const struct sf_pk_global dt_allow[] = {
	{ "torch._tensor", "_rebuild_from_type_v2" },
	{ "torch._utils", "_rebuild_wrapper_subclass" },
	{ "torch", "Tensor" },
	{ "torch", "Size" },
	{ "torch", "device" },
	{ "torch.serialization", "_get_layout" },
	{ "torch.distributed.tensor", "DTensor" },
	{ "torch.distributed.tensor._api", "DTensor" },
	{ SPEC, "DTensorSpec" },
	{ SPEC, "TensorMeta" },
	{ SPEC, "ShardOrderEntry" },
	{ "torch.distributed.device_mesh", "DeviceMesh" },
	{ "torch.distributed._mesh_layout", "_MeshLayout" },
	{ "torch.distributed._mesh_layout", "_FlatLayout" },
	{ PT, "Shard" },
	{ PT, "Replicate" },
	{ PT, "_StridedShard" },
	{ PT, "Partial" },
	/* ShardedTensor (FSDP1's SHARDED_STATE_DICT and LOCAL_STATE_DICT) */
	{ ST ".api", "ShardedTensor" },
	{ ST ".shard", "Shard" },
	{ ST ".metadata", "ShardedTensorMetadata" },
	{ ST ".metadata", "TensorProperties" },
	{ ST ".metadata", "MEM_FORMAT_ENCODING" },
	{ "torch.distributed._shard.metadata", "ShardMetadata" },
	{ "torch.distributed._shard.sharding_spec.chunk_sharding_spec", "ChunkShardingSpec" },
	{ "torch.distributed.remote_device", "_remote_device" },
	/* ShardedTensor.ProcessGroupState is pickled as getattr(ShardedTensor,
	 * "ProcessGroupState"): a name here, never called */
	{ "__builtin__", "getattr" },
};
#define NDT_ALLOW (sizeof(dt_allow) / sizeof(dt_allow[0]))

struct dt_file {
	char name[64];           /* model_world_size_W_rank_R.pt */
	struct sf_cfile cf;
	struct sf_ts_doc *doc;
	const struct sf_pk *root; /* the state dict (a DICT) */
};

struct dt {
	struct sf_kit k;
	struct sf_model *m;
	unsigned world;
	struct dt_file *f;       /* world of them, by rank */
	size_t nobjects;         /* non-tensor values of rank 0 (not shown) */
};

/* One placement of a mesh dimension. */
enum pl_kind { PL_REPLICATE, PL_SHARD, PL_STRIDED, PL_PARTIAL };
struct placement {
	enum pl_kind kind;
	int64_t dim;
	int64_t sf;              /* _StridedShard's split_factor */
};

/* One rank's DTensor, as its pickle says. */
struct dtv {
	enum sf_dtype dtype;
	unsigned ndim;
	uint64_t shape[SF_MAX_NDIM];
	unsigned mdim;            /* mesh dimensions */
	uint64_t msize[DT_MAX_MESH_NDIM];
	uint64_t coord[DT_MAX_MESH_NDIM];
	struct placement pl[DT_MAX_MESH_NDIM];
	struct sf_ts_tensor local;
};

/* A run of global indices along one tensor dimension. */
struct run {
	uint64_t start, len;
};

/* Scratch of one tensor's box computation (heap: about SF_MAX_NDIM * 16
 * KiB). */
struct scratch {
	struct run runs[SF_MAX_NDIM][DT_MAX_RUNS];
	struct run tmp[DT_MAX_RUNS];
};

/* --- probe --- */

/* W and R of "model_world_size_W_rank_R.pt": 0, or -1 for another name. */
static int parse_name(const char *s, unsigned long *w, unsigned long *r)
{
	static const char pre[] = "model_world_size_";
	char *e;

	if (strncmp(s, pre, sizeof(pre) - 1) != 0)
		return -1;
	s += sizeof(pre) - 1;
	if (*s < '0' || *s > '9')
		return -1;
	*w = strtoul(s, &e, 10);
	if (strncmp(e, "_rank_", 6) != 0 || e[6] < '0' || e[6] > '9')
		return -1;
	*r = strtoul(e + 6, &e, 10);
	return strcmp(e, ".pt") == 0 ? 0 : -1;
}

static enum sf_probe dt_probe(const struct sf_dirlist *ls)
{
	unsigned long w, r;

	for (size_t i = 0; i < ls->n; i++)
		if (!ls->is_dir[i] && !parse_name(ls->names[i], &w, &r) && r == 0)
			return SF_PROBE_YES;
	return SF_PROBE_NO;
}

/* --- pickle helpers --- */

static const struct sf_pk *dict_of(const struct sf_pk *v)
{
	if (v && v->kind == SF_PK_OBJ &&
	    sf_pk_is_obj(v, "collections", "OrderedDict"))
		return v->u.obj.items;
	return v && v->kind == SF_PK_DICT ? v : NULL;
}

/* The state dict of an object reduced with (None, dict) or dict state. */
static const struct sf_pk *state_dict(const struct sf_pk *st)
{
	if (st && st->kind == SF_PK_TUPLE && sf_pk_len(st) == 2)
		st = sf_pk_item(st, 1);
	return dict_of(st);
}

static bool int_attr(const struct sf_pk *o, const char *name, int64_t *out)
{
	return sf_pk_int(sf_pk_attr(o, name), out);
}

/* v is a call that rebuilds a DTensor (whatever its arguments hold). */
static bool is_dtensor(const struct sf_pk *v)
{
	const struct sf_pk *c;

	if (!sf_pk_is_obj(v, "torch._tensor", "_rebuild_from_type_v2"))
		return false;
	c = sf_pk_item(v->u.obj.args, 1);
	return sf_pk_is_global(c, "torch.distributed.tensor", "DTensor") ||
	       sf_pk_is_global(c, "torch.distributed.tensor._api", "DTensor");
}

/* A DTensor's (None, state) dict, or NULL (no DTensor, or not one as
 * torch 2.x pickles it). */
static const struct sf_pk *dtensor_state(const struct sf_pk *v)
{
	const struct sf_pk *a;

	if (!is_dtensor(v))
		return NULL;
	a = v->u.obj.args;
	if (sf_pk_len(a) != 4 ||
	    !sf_pk_is_global(sf_pk_item(a, 0), "torch._utils", "_rebuild_wrapper_subclass"))
		return NULL;
	return state_dict(sf_pk_item(a, 3));
}

/* The mesh: sizes from _layout, _coordinate_on_dim, and _rank checked
 * against rank (the file's). 0; 1 with why (the tensor is left out); or
 * -SF_EFORMAT with the reason in the kit (the checkpoint is). */
static int read_mesh(struct dt *d, unsigned rank, const struct sf_pk *mesh,
		     struct dtv *t, char *why, size_t wl)
{
	const struct sf_pk *axes = sf_pk_attr(sf_pk_attr(mesh, "_layout"), "axes");
	const struct sf_pk *rmap = sf_pk_attr(mesh, "_flatten_rank_map");
	uint64_t stride[DT_MAX_MESH_NDIM], total = 1, idx = 0, x0;
	unsigned nc;
	int64_t r = -1, x;

	if (!sf_pk_is_obj(mesh, "torch.distributed.device_mesh", "DeviceMesh") ||
	    !axes || axes->kind != SF_PK_TUPLE || sf_pk_len(axes) == 0 ||
	    sf_pk_len(axes) > DT_MAX_MESH_NDIM) {
		snprintf(why, wl, "a device mesh shardfs does not read");
		return 1;
	}
	t->mdim = (unsigned)sf_pk_len(axes);
	for (unsigned i = 0; i < t->mdim; i++) {
		const struct sf_pk *fl = sf_pk_item(axes, i);
		uint64_t sh[SF_MAX_NDIM], st[SF_MAX_NDIM];
		unsigned ns, nst;

		if (!sf_pk_is_obj(fl, "torch.distributed._mesh_layout", "_FlatLayout") ||
		    !sf_pk_uints(sf_pk_attr(fl, "shape"), SF_PK_UINTS_LIST, sh, SF_MAX_NDIM, &ns) ||
		    !sf_pk_uints(sf_pk_attr(fl, "stride"), SF_PK_UINTS_LIST, st, SF_MAX_NDIM, &nst) ||
		    ns != 1 || nst != 1 || sh[0] == 0 || sh[0] > DT_MAX_WORLD) {
			snprintf(why, wl, "mesh dimension %u: a layout shardfs does not read", i);
			return 1;
		}
		t->msize[i] = sh[0];
		stride[i] = st[0];
		total *= sh[0];
		if (total > DT_MAX_WORLD) {
			snprintf(why, wl, "a mesh of more than %d ranks", DT_MAX_WORLD);
			return 1;
		}
	}
	if (!sf_pk_uints(sf_pk_attr(mesh, "_coordinate_on_dim"), SF_PK_UINTS_LIST,
			 t->coord, DT_MAX_MESH_NDIM, &nc) || nc != t->mdim)
		return sf_fail(&d->k.w, -SF_EFORMAT,
			       "%s: a mesh with no coordinate of this rank",
			       d->f[rank].name);
	if (!int_attr(mesh, "_rank", &r) || r != (int64_t)rank)
		return sf_fail(&d->k.w, -SF_EFORMAT,
			       "%s: its mesh says rank %lld",
			       d->f[rank].name, (long long)r);
	for (unsigned i = 0; i < t->mdim; i++) {
		if (t->coord[i] >= t->msize[i])
			return sf_fail(&d->k.w, -SF_EFORMAT,
				       "%s: mesh coordinate %llu of a dimension of %llu",
				       d->f[rank].name, (unsigned long long)t->coord[i],
				       (unsigned long long)t->msize[i]);
		if (__builtin_mul_overflow(t->coord[i], stride[i], &x0) ||
		    __builtin_add_overflow(idx, x0, &idx))
			idx = UINT64_MAX;
	}
	/* a whole mesh: the rank map at the coordinate is the rank (a
	 * submesh's map is its root's: the rank must be in it) */
	if (sf_pk_len(rmap) == total) {
		if (idx >= total || !sf_pk_int(sf_pk_item(rmap, idx), &x) || x != r)
			return sf_fail(&d->k.w, -SF_EFORMAT,
				       "%s: its mesh coordinate is not rank %lld's place in the mesh",
				       d->f[rank].name, (long long)r);
	} else {
		bool found = false;

		for (size_t i = 0; i < sf_pk_len(rmap) && !found; i++)
			found = sf_pk_int(sf_pk_item(rmap, i), &x) && x == r;
		if (!found)
			return sf_fail(&d->k.w, -SF_EFORMAT,
				       "%s: rank %lld is not in its mesh",
				       d->f[rank].name, (long long)r);
	}
	return 0;
}

static int read_placements(const struct sf_pk *pls, struct dtv *t, char *why,
			   size_t wl)
{
	if (!pls || pls->kind != SF_PK_TUPLE || sf_pk_len(pls) != t->mdim) {
		snprintf(why, wl, "placements are not one per mesh dimension");
		return 1;
	}
	for (unsigned i = 0; i < t->mdim; i++) {
		const struct sf_pk *p = sf_pk_item(pls, i);
		struct placement *q = &t->pl[i];

		memset(q, 0, sizeof(*q));
		if (sf_pk_is_obj(p, PT, "Replicate")) {
			q->kind = PL_REPLICATE;
		} else if (sf_pk_is_obj(p, PT, "Partial")) {
			snprintf(why, wl, "a Partial placement (unreduced sums) on mesh dimension %u", i);
			return 1;
		} else if (sf_pk_is_obj(p, PT, "Shard") || sf_pk_is_obj(p, PT, "_StridedShard")) {
			q->kind = sf_pk_is_obj(p, PT, "Shard") ? PL_SHARD : PL_STRIDED;
			q->sf = 1;
			if (!int_attr(p, "dim", &q->dim) || q->dim < 0 ||
			    q->dim >= (int64_t)t->ndim ||
			    (q->kind == PL_STRIDED &&
			     (!int_attr(p, "split_factor", &q->sf) || q->sf < 1 ||
			      q->sf > DT_MAX_RUNS))) {
				snprintf(why, wl, "mesh dimension %u: a shard placement with a bad dim or split factor", i);
				return 1;
			}
		} else {
			snprintf(why, wl, "mesh dimension %u: a placement shardfs does not know", i);
			return 1;
		}
	}
	return 0;
}

/* shard_order: None, or torch's default (each tensor dimension's mesh
 * dimensions ascending). 0, or 1 with why. */
static int check_shard_order(const struct sf_pk *so, char *why, size_t wl)
{
	if (!so || so->kind == SF_PK_NONE)
		return 0;
	if (so->kind != SF_PK_TUPLE && so->kind != SF_PK_LIST)
		goto out_bad;
	for (size_t i = 0; i < sf_pk_len(so); i++) {
		const struct sf_pk *e = sf_pk_item(so, i);
		uint64_t md[DT_MAX_MESH_NDIM];
		unsigned n;

		if (!sf_pk_is_obj(e, SPEC, "ShardOrderEntry") ||
		    !sf_pk_uints(sf_pk_item(e->u.obj.args, 1), SF_PK_UINTS_LIST,
				 md, DT_MAX_MESH_NDIM, &n))
			goto out_bad;
		for (unsigned j = 1; j < n; j++)
			if (md[j] <= md[j - 1]) {
				snprintf(why, wl, "a shard order other than torch's default (mesh dimensions out of order)");
				return 1;
			}
	}
	return 0;
out_bad:
	snprintf(why, wl, "a shard order shardfs does not read");
	return 1;
}

/* Rank rank's value v as a DTensor into *t. 0; 1 with why (the tensor is
 * left out); 2 when v is no DTensor; or a checkpoint error (reason in
 * the kit). */
static int read_dtensor(struct dt *d, unsigned rank, const char *key,
			const struct sf_pk *v, struct dtv *t, char *why, size_t wl)
{
	const struct sf_pk *st = dtensor_state(v), *spec, *meta, *wargs;
	uint64_t wshape[SF_MAX_NDIM];
	unsigned wn;
	int rc;

	memset(t, 0, sizeof(*t));
	if (!is_dtensor(v))
		return 2;
	if (!st) {
		snprintf(why, wl, "rank %u: a DTensor pickled in a way shardfs does not read", rank);
		return 1;
	}
	spec = sf_pk_get(st, "_spec");
	meta = sf_pk_attr(spec, "tensor_meta");
	wargs = sf_pk_item(v->u.obj.args, 2);
	if (!sf_pk_is_obj(spec, SPEC, "DTensorSpec") ||
	    !sf_pk_is_obj(meta, SPEC, "TensorMeta") ||
	    !sf_pk_uints(sf_pk_item(meta->u.obj.args, 0), SF_PK_UINTS_SIZE,
			 t->shape, SF_MAX_NDIM, &t->ndim)) {
		snprintf(why, wl, "a DTensor with no tensor_meta shardfs reads");
		return 1;
	}
	{
		const struct sf_pk *g = sf_pk_item(meta->u.obj.args, 2);

		t->dtype = g && g->kind == SF_PK_GLOBAL &&
			   strcmp(g->u.global.module, "torch") == 0 ?
			   sf_torch_dtype(g->u.global.name) : SF_DT_INVALID;
	}
	if (t->dtype == SF_DT_INVALID) {
		snprintf(why, wl, "a dtype shardfs does not serve");
		return 1;
	}
	/* the wrapper's own size must be tensor_meta's */
	if (!sf_pk_uints(sf_pk_item(wargs, 2), SF_PK_UINTS_SIZE | SF_PK_UINTS_LIST,
			 wshape, SF_MAX_NDIM, &wn) || wn != t->ndim ||
	    memcmp(wshape, t->shape, wn * sizeof(*wshape)) != 0) {
		snprintf(why, wl, "its size and its tensor_meta's shape differ");
		return 1;
	}
	rc = read_mesh(d, rank, sf_pk_attr(spec, "mesh"), t, why, wl);
	if (!rc)
		rc = read_placements(sf_pk_attr(spec, "placements"), t, why, wl);
	if (!rc)
		rc = check_shard_order(sf_pk_attr(spec, "shard_order"), why, wl);
	if (rc)
		return rc;
	rc = sf_ts_doc_tensor(d->f[rank].doc, sf_pk_get(st, "_local_tensor"), key,
			      &t->local, why, wl);
	if (rc == 1)
		snprintf(why, wl, "rank %u: its local tensor is no tensor", rank);
	if (rc)
		return 1;
	if (t->local.dtype != t->dtype || t->local.ndim != t->ndim) {
		snprintf(why, wl, "rank %u: its local tensor is %s of %u dimensions, the DTensor %s of %u",
			 rank, sf_dtype_name(t->local.dtype), t->local.ndim,
			 sf_dtype_name(t->dtype), t->ndim);
		return 1;
	}
	return 0;
}

/* --- boxes --- */

/* The sub-list of runs r[0..n) at local positions [lo, lo + len), appended
 * to out[*no] (at most DT_MAX_RUNS). 0 or -1 when too many. */
static int take(const struct run *r, size_t n, uint64_t lo, uint64_t len,
		struct run *out, size_t *no)
{
	uint64_t pos = 0;

	for (size_t i = 0; i < n && len; i++) {
		uint64_t a, b;

		if (lo >= pos + r[i].len) {
			pos += r[i].len;
			continue;
		}
		a = lo - pos;
		b = r[i].len - a < len ? r[i].len - a : len;
		if (*no >= DT_MAX_RUNS)
			return -1;
		out[(*no)++] = (struct run){ r[i].start + a, b };
		lo += b;
		len -= b;
		pos += r[i].len;
	}
	return 0;
}

/* torch.chunk's chunk i of n over an extent of L: [*lo, *lo + *len). */
static void chunk(uint64_t L, uint64_t n, uint64_t i, uint64_t *lo, uint64_t *len)
{
	uint64_t cs = (L + n - 1) / n;
	uint64_t a = i * cs < L ? i * cs : L, b = (i + 1) * cs < L ? (i + 1) * cs : L;

	*lo = a;
	*len = b - a;
}

/* The runs of every tensor dimension this rank holds (runs[d], nruns[d]),
 * torch's placements applied left to right. 0 or 1 with why. */
static int rank_runs(const struct dtv *t, struct scratch *sc, size_t *nruns,
		     char *why, size_t wl)
{
	struct run (*runs)[DT_MAX_RUNS] = sc->runs, *tmp = sc->tmp;

	for (unsigned d = 0; d < t->ndim; d++) {
		runs[d][0] = (struct run){ 0, t->shape[d] };
		nruns[d] = 1;
	}
	for (unsigned i = 0; i < t->mdim; i++) {
		const struct placement *p = &t->pl[i];
		unsigned d = (unsigned)p->dim;
		uint64_t L = 0, lo, len;
		size_t nt = 0;

		if (p->kind == PL_REPLICATE)
			continue;
		for (size_t j = 0; j < nruns[d]; j++)
			L += runs[d][j].len;
		if (p->kind == PL_SHARD) {
			chunk(L, t->msize[i], t->coord[i], &lo, &len);
			if (take(runs[d], nruns[d], lo, len, tmp, &nt))
				goto out_many;
		} else {
			for (uint64_t j = 0; j < (uint64_t)p->sf; j++) {
				uint64_t plo, plen;

				chunk(L, (uint64_t)p->sf, j, &plo, &plen);
				chunk(plen, t->msize[i], t->coord[i], &lo, &len);
				if (take(runs[d], nruns[d], plo + lo, len, tmp, &nt))
					goto out_many;
			}
		}
		memcpy(runs[d], tmp, nt * sizeof(*tmp));
		nruns[d] = nt;
	}
	return 0;
out_many:
	snprintf(why, wl, "its placements cut a dimension into more than %d runs", DT_MAX_RUNS);
	return 1;
}

/* The box off/len (of local's ndim dimensions, none empty) of rank
 * rank's local tensor, from its element loc (relative to its storage
 * offset), as a shard of mt: row-major when the local strides make it so,
 * else strided. 0, 1 with why, -ENOMEM. */
static int add_box(struct dt *d, unsigned rank, const struct sf_ts_tensor *local,
		   const uint64_t *off, const uint64_t *len, uint64_t loc,
		   struct sf_tensor *mt, char *why, size_t wl)
{
	size_t isz = sf_dtype_size(local->dtype);
	struct sf_shard sh = { 0 };
	uint64_t expect = 1;
	bool contig = true;
	int rc;

	for (unsigned k = local->ndim; k-- > 0;) {
		if (len[k] > 1 && local->stride[k] != expect)
			contig = false;
		expect *= len[k];
	}
	sh.off = local->ndim ? off : NULL;
	sh.len = local->ndim ? len : NULL;
	sh.file = d->f[rank].name;
	sh.file_offset = local->data_off + (local->storage_offset + loc) * isz;
	if (contig) {
		sh.nbytes = expect * isz;
	} else {
		sh.strides = (uint64_t *)local->stride;
		if (sf_strided_span(local->ndim, len, local->stride, isz, &sh.nbytes)) {
			snprintf(why, wl, "rank %u: a box too large", rank);
			return 1;
		}
	}
	rc = sf_tensor_add_shard(d->m, mt, &sh);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		snprintf(why, wl, "rank %u: %s", rank, sf_model_why(d->m));
		return 1;
	}
	return 0;
}

/* Every box of rank rank's local tensor t into the tensor mt: the
 * cartesian product of its runs, each pointing into the rank's storage.
 * 0, 1 with why, -ENOMEM. */
static int add_boxes(struct dt *d, unsigned rank, const struct dtv *t,
		     struct sf_tensor *mt, struct scratch *sc, char *why,
		     size_t wl)
{
	struct run (*runs)[DT_MAX_RUNS] = sc->runs;
	size_t nruns[SF_MAX_NDIM], at[SF_MAX_NDIM] = { 0 }, nbox = 1;
	int rc;

	if (rank_runs(t, sc, nruns, why, wl))
		return 1;
	for (unsigned k = 0; k < t->ndim; k++) {
		uint64_t sum = 0;

		for (size_t j = 0; j < nruns[k]; j++)
			sum += runs[k][j].len;
		if (sum != t->local.shape[k]) {
			snprintf(why, wl, "rank %u: its local tensor has %llu elements along dimension %u, its placements give %llu",
				 rank, (unsigned long long)t->local.shape[k], k,
				 (unsigned long long)sum);
			return 1;
		}
		nbox *= nruns[k];
		if (nbox == 0)
			return 0; /* an empty chunk: nothing of the tensor here */
		if (nbox > DT_MAX_BOXES) {
			snprintf(why, wl, "more than %d boxes on rank %u", DT_MAX_BOXES, rank);
			return 1;
		}
	}
	for (;;) {
		uint64_t off[SF_MAX_NDIM], len[SF_MAX_NDIM], loc = 0;
		bool empty = false;
		unsigned k;

		for (k = 0; k < t->ndim; k++) {
			uint64_t lo = 0;

			for (size_t j = 0; j < at[k]; j++)
				lo += runs[k][j].len;
			off[k] = runs[k][at[k]].start;
			len[k] = runs[k][at[k]].len;
			empty |= len[k] == 0;
			loc += lo * t->local.stride[k];
		}
		if (!empty) {
			rc = add_box(d, rank, &t->local, off, len, loc, mt, why, wl);
			if (rc)
				return rc;
		}
		/* the next box (odometer over the dimensions, last fastest) */
		for (k = t->ndim; k-- > 0;) {
			if (++at[k] < nruns[k])
				break;
			at[k] = 0;
		}
		if (k == (unsigned)-1 || t->ndim == 0)
			break;
	}
	return 0;
}

static bool same_layout(const struct dtv *a, const struct dtv *b)
{
	if (a->dtype != b->dtype || a->ndim != b->ndim || a->mdim != b->mdim ||
	    memcmp(a->shape, b->shape, a->ndim * sizeof(a->shape[0])) != 0 ||
	    memcmp(a->msize, b->msize, a->mdim * sizeof(a->msize[0])) != 0)
		return false;
	for (unsigned i = 0; i < a->mdim; i++)
		if (a->pl[i].kind != b->pl[i].kind || a->pl[i].dim != b->pl[i].dim ||
		    a->pl[i].sf != b->pl[i].sf)
			return false;
	return true;
}


/* End one tensor's walk over the ranks: rc 0 with a model entry mt,
 * the overlap rule and the coverage check on it (a failure leaves the
 * tensor out with the reason); rc 1, the tensor left out with why (its
 * entry, if made, dropped). 0, or an error that stops the open. */
static int finish_tensor(struct dt *d, const char *key, struct sf_tensor *mt,
			 int rc, const char *why)
{
	if (!rc && mt) {
		rc = sf_overlap_rule(&d->k.w, mt);
		if (!rc)
			rc = sf_cover_check(&d->k.w, mt);
		if (rc && rc != -ENOMEM && rc != -SF_EBUDGET) {
			sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
			sf_kit_leave_out_err(&d->k, key, rc);
			return 0;
		}
		return rc;
	}
	if (rc == 1) {
		if (mt)
			sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&d->k, key, "%s", why);
		return 0;
	}
	return rc;
}

/* DTensor key (rank 0's value v0): every rank's boxes. 0, -ENOMEM,
 * -SF_EBUDGET or a checkpoint error; any other failure leaves it out. */
static int add_dtensor(struct dt *d, const char *key)
{
	struct dtv *t = NULL, t0;
	struct scratch *sc;
	struct sf_tensor *mt = NULL;
	char why[512] = "";
	int rc = 0;

	t = malloc(sizeof(*t));
	sc = malloc(sizeof(*sc));
	if (!t || !sc) {
		free(t);
		free(sc);
		return -ENOMEM;
	}
	for (unsigned r = 0; r < d->world; r++) {
		const struct sf_pk *v = sf_pk_get(d->f[r].root, key);

		rc = read_dtensor(d, r, key, v, r ? t : &t0, why, sizeof(why));
		if (rc == 2) {
			snprintf(why, sizeof(why), "not a DTensor on rank %u", r);
			rc = 1;
		}
		if (rc)
			break;
		if (r == 0) {
			rc = sf_model_add_tensor(d->m, false, key, t0.dtype, t0.ndim,
						 t0.shape, &mt);
			if (rc == -ENOMEM)
				break;
			if (rc) {
				snprintf(why, sizeof(why), "%s", sf_model_why(d->m));
				rc = 1;
				break;
			}
			rc = add_boxes(d, 0, &t0, mt, sc, why, sizeof(why));
		} else if (!same_layout(&t0, t)) {
			snprintf(why, sizeof(why), "rank %u has another shape, dtype, mesh or placements than rank 0", r);
			rc = 1;
		} else {
			rc = add_boxes(d, r, t, mt, sc, why, sizeof(why));
		}
		if (rc)
			break;
		rc = sf_budget_check(d->k.b);
		if (rc)
			break;
	}
	rc = finish_tensor(d, key, mt, rc, why);
	free(sc);
	free(t);
	return rc;
}

/* --- ShardedTensor --- */

/* v is a call that rebuilds a ShardedTensor. */
static bool is_sharded(const struct sf_pk *v)
{
	return sf_pk_is_obj(v, "torch._tensor", "_rebuild_from_type_v2") &&
	       sf_pk_is_global(sf_pk_item(v->u.obj.args, 1), ST ".api", "ShardedTensor");
}

/* The dtype a wrapper's arguments name (torch.<dtype>), or INVALID. */
static enum sf_dtype wrapper_dtype(const struct sf_pk *wargs)
{
	const struct sf_pk *g = sf_pk_item(wargs, 1);

	return g && g->kind == SF_PK_GLOBAL && strcmp(g->u.global.module, "torch") == 0 ?
	       sf_torch_dtype(g->u.global.name) : SF_DT_INVALID;
}

/* Rank rank's ShardedTensor v: its global shape and dtype into *t (for
 * r > 0 checked against *t0), its local shards into mt. 0, 1 with why,
 * -ENOMEM, or a checkpoint error (a shard or process group of another
 * rank than the file's). */
static int sharded_rank(struct dt *d, unsigned rank, const char *key,
			const struct sf_pk *v, struct dtv *t, const struct dtv *t0,
			struct sf_tensor **mt, char *why, size_t wl)
{
	const struct sf_pk *a = v->u.obj.args, *wargs = sf_pk_item(a, 2);
	const struct sf_pk *st = sf_pk_item(a, 3), *shards, *meta, *pg;
	uint64_t wshape[SF_MAX_NDIM];
	unsigned wn;
	int64_t x = -1;
	int rc;

	memset(t, 0, sizeof(*t));
	shards = sf_pk_item(st, 0);
	meta = sf_pk_item(st, 1);
	pg = sf_pk_item(st, 2);
	if (!st || st->kind != SF_PK_TUPLE || !shards || shards->kind != SF_PK_LIST ||
	    !sf_pk_is_obj(meta, ST ".metadata", "ShardedTensorMetadata") ||
	    !sf_pk_uints(sf_pk_attr(meta, "size"), SF_PK_UINTS_SIZE, t->shape,
			 SF_MAX_NDIM, &t->ndim)) {
		snprintf(why, wl, "rank %u: a ShardedTensor pickled in a way shardfs does not read", rank);
		return 1;
	}
	t->dtype = wrapper_dtype(wargs);
	if (t->dtype == SF_DT_INVALID) {
		snprintf(why, wl, "a dtype shardfs does not serve");
		return 1;
	}
	if (!sf_pk_uints(sf_pk_item(wargs, 2), SF_PK_UINTS_SIZE | SF_PK_UINTS_LIST,
			 wshape, SF_MAX_NDIM, &wn) || wn != t->ndim ||
	    memcmp(wshape, t->shape, wn * sizeof(*wshape)) != 0) {
		snprintf(why, wl, "its size and its metadata's size differ");
		return 1;
	}
	if (pg && pg->kind != SF_PK_NONE &&
	    (!int_attr(pg, "global_rank", &x) || x != (int64_t)rank))
		return sf_fail(&d->k.w, -SF_EFORMAT, "%s: its process group says rank %lld",
			       d->f[rank].name, (long long)x);
	if (rank == 0) {
		rc = sf_model_add_tensor(d->m, false, key, t->dtype, t->ndim, t->shape, mt);
		if (rc == -ENOMEM)
			return rc;
		if (rc) {
			snprintf(why, wl, "%s", sf_model_why(d->m));
			return 1;
		}
	} else if (t->dtype != t0->dtype || t->ndim != t0->ndim ||
		   memcmp(t->shape, t0->shape, t->ndim * sizeof(t->shape[0])) != 0) {
		snprintf(why, wl, "rank %u has another shape or dtype than rank 0", rank);
		return 1;
	}
	if (sf_pk_len(shards) > DT_MAX_BOXES) {
		snprintf(why, wl, "more than %d shards on rank %u", DT_MAX_BOXES, rank);
		return 1;
	}
	for (size_t i = 0; i < sf_pk_len(shards); i++) {
		const struct sf_pk *sh = sf_pk_item(shards, i);
		const struct sf_pk *md = sf_pk_attr(sh, "metadata");
		uint64_t off[SF_MAX_NDIM], len[SF_MAX_NDIM];
		unsigned no, nl;
		bool empty = false;

		if (!sf_pk_is_obj(sh, ST ".shard", "Shard") ||
		    !sf_pk_is_obj(md, "torch.distributed._shard.metadata", "ShardMetadata") ||
		    !sf_pk_uints(sf_pk_attr(md, "shard_offsets"), SF_PK_UINTS_LIST, off,
				 SF_MAX_NDIM, &no) ||
		    !sf_pk_uints(sf_pk_attr(md, "shard_sizes"), SF_PK_UINTS_LIST, len,
				 SF_MAX_NDIM, &nl) || no != t->ndim || nl != t->ndim) {
			snprintf(why, wl, "rank %u: shard %zu: no offsets and sizes shardfs reads", rank, i);
			return 1;
		}
		x = -1;
		if (!int_attr(sf_pk_attr(md, "placement"), "_rank", &x) || x != (int64_t)rank)
			return sf_fail(&d->k.w, -SF_EFORMAT,
				       "%s: %s: a local shard placed on rank %lld",
				       d->f[rank].name, SF_QSTR(key), (long long)x);
		rc = sf_ts_doc_tensor(d->f[rank].doc, sf_pk_attr(sh, "tensor"), key,
				      &t->local, why, wl);
		if (rc == 1)
			snprintf(why, wl, "rank %u: shard %zu holds no tensor", rank, i);
		if (rc)
			return 1;
		if (t->local.dtype != t->dtype || t->local.ndim != t->ndim ||
		    memcmp(t->local.shape, len, t->ndim * sizeof(len[0])) != 0) {
			snprintf(why, wl, "rank %u: shard %zu: its tensor is not of its metadata's sizes and the dtype",
				 rank, i);
			return 1;
		}
		for (unsigned k = 0; k < t->ndim; k++)
			empty |= len[k] == 0;
		if (empty)
			continue;
		rc = add_box(d, rank, &t->local, off, len, 0, *mt, why, wl);
		if (rc)
			return rc;
	}
	return sf_budget_check(d->k.b);
}

/* ShardedTensor key: every rank's local shards, each a box its metadata
 * places. 0, -ENOMEM, -SF_EBUDGET or a checkpoint error; any other
 * failure leaves it out with a line. */
static int add_sharded(struct dt *d, const char *key)
{
	struct dtv *t = malloc(2 * sizeof(*t));
	struct sf_tensor *mt = NULL;
	char why[512] = "";
	int rc = 0;

	if (!t)
		return -ENOMEM;
	for (unsigned r = 0; r < d->world && !rc; r++) {
		const struct sf_pk *v = sf_pk_get(d->f[r].root, key);

		if (!is_sharded(v)) {
			snprintf(why, sizeof(why), "not a ShardedTensor on rank %u", r);
			rc = 1;
			break;
		}
		rc = sharded_rank(d, r, key, v, r ? &t[1] : &t[0], &t[0], &mt, why,
				  sizeof(why));
	}
	rc = finish_tensor(d, key, mt, rc, why);
	free(t);
	return rc;
}

/* --- plain tensors --- */

/* The bytes of a contiguous tensor of rank r and of rank 0 are equal. 0
 * (equal), 1 (not), -ENOMEM, -EIO. */
static int same_bytes(struct dt *d, unsigned r, const struct sf_ts_tensor *a,
		      const struct sf_ts_tensor *b, uint64_t n)
{
	size_t isz = sf_dtype_size(a->dtype);
	uint64_t oa = a->data_off + a->storage_offset * isz;
	uint64_t ob = b->data_off + b->storage_offset * isz;
	char *x = malloc(DT_CMP_CHUNK), *y = malloc(DT_CMP_CHUNK);
	int rc = 0;

	if (!x || !y) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (uint64_t at = 0; at < n && !rc; at += DT_CMP_CHUNK) {
		size_t c = n - at < DT_CMP_CHUNK ? (size_t)(n - at) : DT_CMP_CHUNK;

		rc = sf_input_read(&d->f[0].cf.in, x, c, oa + at);
		if (!rc)
			rc = sf_input_read(&d->f[r].cf.in, y, c, ob + at);
		if (!rc && memcmp(x, y, c) != 0)
			rc = 1;
	}
out_free:
	free(x);
	free(y);
	return rc;
}

/* A plain tensor key: shown once (rank 0's) when every rank holds the
 * same one. 0 or -ENOMEM, -SF_EBUDGET; else left out with a line. */
static int add_plain(struct dt *d, const char *key, const struct sf_ts_tensor *t0)
{
	struct sf_tensor *mt;
	struct sf_shard sh = { 0 };
	char why[512] = "";
	int rc;

	if (!t0->contiguous) {
		sf_kit_leave_out(&d->k, key, "a plain tensor not stored contiguous");
		return 0;
	}
	rc = sf_model_add_tensor(d->m, false, key, t0->dtype, t0->ndim, t0->shape, &mt);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_kit_leave_out(&d->k, key, "%s", sf_model_why(d->m));
		return 0;
	}
	for (unsigned r = 1; r < d->world; r++) {
		struct sf_ts_tensor t;

		rc = sf_ts_doc_tensor(d->f[r].doc, sf_pk_get(d->f[r].root, key), key,
				      &t, why, sizeof(why));
		if (rc == 0 && (t.dtype != t0->dtype || t.ndim != t0->ndim ||
				!t.contiguous ||
				memcmp(t.shape, t0->shape, t.ndim * sizeof(t.shape[0]))))
			rc = 1;
		if (rc == 0)
			rc = same_bytes(d, r, t0, &t, mt->nbytes);
		if (!rc)
			rc = sf_budget_check(d->k.b);
		if (rc == -ENOMEM || rc == -SF_EBUDGET)
			return rc;
		if (rc) {
			sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
			sf_kit_leave_out(&d->k, key, "a plain tensor that differs between ranks (rank %u)", r);
			return 0;
		}
	}
	if (mt->nbytes == 0)
		return 0;
	sh.flat = true;
	sh.flat_len = mt->nbytes;
	sh.nbytes = mt->nbytes;
	sh.file = d->f[0].name;
	sh.file_offset = t0->data_off + t0->storage_offset * sf_dtype_size(t0->dtype);
	rc = sf_tensor_add_shard(d->m, mt, &sh);
	if (rc == -ENOMEM)
		return rc;
	if (rc) {
		sf_model_drop_last(d->m, SF_ENTRY_TENSOR);
		sf_kit_leave_out(&d->k, key, "%s", sf_model_why(d->m));
	}
	return 0;
}

/* --- the checkpoint --- */

static int open_files(struct dt *d, const struct sf_dirlist *ls)
{
	unsigned long w, r, world = 0;
	char why[512];
	int rc;

	for (size_t i = 0; i < ls->n; i++) {
		if (ls->is_dir[i] || parse_name(ls->names[i], &w, &r))
			continue;
		if (world && w != world)
			return sf_fail(&d->k.w, -SF_EFORMAT,
				       "files of world sizes %lu and %lu", world, w);
		world = w;
	}
	if (world == 0 || world > DT_MAX_WORLD)
		return sf_fail(&d->k.w, -SF_EFORMAT, "a world size of %lu", world);
	d->world = (unsigned)world;
	d->f = calloc(world, sizeof(*d->f));
	if (!d->f)
		return -ENOMEM;
	for (unsigned i = 0; i < d->world; i++) {
		struct dt_file *f = &d->f[i];

		snprintf(f->name, sizeof(f->name), "model_world_size_%u_rank_%u.pt",
			 d->world, i);
		if (!sf_dirlist_has(ls, f->name, false))
			return sf_fail(&d->k.w, -SF_EFORMAT, "%s is missing", f->name);
		rc = sf_cfile_open(d->k.cd, f->name, &f->cf);
		if (rc)
			return sf_fail(&d->k.w, rc, "%s: %s", f->name, sf_strerror(rc));
		rc = sf_ts_doc_open(&f->cf.in, dt_allow, NDT_ALLOW, d->k.b, &f->doc,
				    why, sizeof(why));
		if (rc)
			return sf_fail(&d->k.w, rc, "%s: %s", f->name, why);
		f->root = dict_of(sf_ts_doc_root(f->doc));
		if (!f->root)
			return sf_fail(&d->k.w, -SF_EFORMAT, "%s: not a dict", f->name);
	}
	return 0;
}

static void close_files(struct dt *d)
{
	for (unsigned i = 0; d->f && i < d->world; i++) {
		sf_ts_doc_free(d->f[i].doc);
		sf_cfile_close(&d->f[i].cf);
	}
	free(d->f);
	d->f = NULL;
}

/* Every key of rank 0's dict; keys only other ranks hold are left out. */
static int build(struct dt *d)
{
	const struct sf_pk *root = d->f[0].root;
	int rc = 0;

	for (size_t i = 0; i < root->u.dict.n && !rc; i++) {
		const char *key = sf_pk_str(root->u.dict.k[i]);
		const struct sf_pk *v = root->u.dict.v[i];
		struct sf_ts_tensor t;
		char why[512];

		if (!key) {
			d->nobjects++;
			continue;
		}
		if (is_dtensor(v)) {
			rc = add_dtensor(d, key);
			continue;
		}
		if (is_sharded(v)) {
			rc = add_sharded(d, key);
			continue;
		}
		rc = sf_ts_doc_tensor(d->f[0].doc, v, key, &t, why, sizeof(why));
		if (rc == 1) {
			d->nobjects++;
			rc = 0;
		} else if (rc) {
			sf_kit_leave_out(&d->k, key, "%s", why);
			rc = 0;
		} else {
			rc = add_plain(d, key, &t);
		}
	}
	for (unsigned r = 1; r < d->world && !rc; r++) {
		const struct sf_pk *dr = d->f[r].root;

		for (size_t i = 0; i < dr->u.dict.n; i++) {
			const char *key = sf_pk_str(dr->u.dict.k[i]);

			if (key && !sf_pk_get(root, key))
				sf_kit_leave_out(&d->k, key, "held by rank %u, not by rank 0", r);
		}
	}
	if (!rc && d->nobjects)
		sf_info("checkpoint %s: %zu non-tensor entr%s of rank 0's state dict not shown",
			SF_QSTR(d->k.name), d->nobjects, d->nobjects == 1 ? "y" : "ies");
	return rc;
}

static bool own_name(void *arg, const char *name)
{
	const struct dt *d = arg;
	unsigned long w, r;

	return !parse_name(name, &w, &r) && w == d->world && r < d->world;
}

static int dt_open(const struct sf_cdir *cd, struct sf_format_result *out,
		   char *err, size_t errlen)
{
	struct dt d = { 0 };
	struct sf_dirlist ls = { 0 };
	int rc;

	sf_kit_init(&d.k, cd, err, errlen);
	rc = sf_cdir_list(cd, &ls);
	if (rc)
		return sf_fail(&d.k.w, rc, "cannot list the directory: %s",
			       sf_strerror(rc));
	rc = sf_kit_start(&d.k, 0, &d.m);
	if (!rc)
		rc = open_files(&d, &ls);
	if (!rc)
		rc = build(&d);
	if (!rc)
		sf_kit_set_format(d.m, "%s", SF_DTENSOR_FORMAT);
	if (!rc)
		rc = sf_kit_add_root_files(&d.k, d.m, own_name, &d);
	if (!rc)
		rc = sf_kit_finish(&d.k, d.m);
	/* the model copies the file names it keeps: the archives can go */
	rc = sf_kit_end(&d.k, rc, d.m, out);
	close_files(&d);
	sf_dirlist_free(&ls);
	return rc;
}

const struct sf_format sf_format_dtensor = {
	.name = SF_DTENSOR_FORMAT,
	.writable = false,
	.probe = dt_probe,
	.open = dt_open,
};
