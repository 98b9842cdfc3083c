/*
 * sf_engine_ra.c - where tensor bytes lie in a shard's payload
 * (sf_shard_locate), and the engine's read-ahead (sf_engine_ra.h).
 *
 * Read-ahead follows readers the way the kernel's does, one level up,
 * where tensors and shards are visible. A small table of streams (under
 * ra->lock) keeps, per (checkpoint, tensor, view) recently read, the
 * furthest byte read and how far the payload behind it was advised. A
 * read at the start of a view, or one that goes on from the last read
 * (within a window back: FUSE workers answer out of order), moves the
 * window past the furthest byte read once less than half of it is left;
 * the window grows from the first read's size (at least two blocks) to
 * ra->win. The view bytes of the new part of the window are walked shard
 * by shard (sf_box_runs, then the same first-covering-shard rule as the
 * engine's reads) into payload block ranges, merged per shard and
 * advised: every shard file of a tensor is asked for at once. A first
 * read elsewhere in a view only starts following it.
 *
 * Chaining: a reader that finished tensor i of the model (read its last
 * byte, whole view) and then starts tensor i+1 (the next with bytes) goes
 * through the tensors in model order, as a listing of tensors/ or a read
 * of model.safetensors does; for such a stream the part of the window past
 * the end of its tensor is advised into the next tensors (at most
 * RA_CHAIN, with their streams created ahead), again in steps of at least
 * half a window. Slices chain too: a reader that finished the view of a
 * shard's own box (a slice path naming it) and starts the view of the
 * next box shard (the tensor's next shard; after its last, the first of
 * the next tensor in model order split along the same dimensions: a
 * reader of dim-1 slices goes on to dim-1 slices) is advised on into the
 * box shards after it. Whole-tensor streams and their chains are dense
 * readers (SF_ADVISE_DENSE: the source may read around the range); a
 * view's stream and the box chain are sparse (the range and little more:
 * a slice's neighbours in the payload are other tensors' bytes).
 *
 * Invariants: advice only names block ranges inside a shard's payload
 * (for a coded shard, its stored stream), starting on a block boundary of
 * the shard and ending at one or at the payload's end, with the block
 * size as its unit (0 for a coded stream, read in other pieces); it moves bytes into the page
 * cache and never decides what is served: every byte a reader gets is
 * read and verified through the engine's block cache as before. Stream
 * keys are compared, never dereferenced, so a stale one costs at most a
 * wrong hint.
 */
#include "sf_engine_ra.h"
#include "sf_box.h"
#include "sf_dtype.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define RA_STREAMS 32           /* sequential readers followed at once */
#define RA_CHAIN 16             /* next tensors one step may advise into */
#define RA_GROUP 16             /* shard ranges merged before advising */

/*
 * A reader followed for read-ahead: the last reads of one view of one
 * tensor. Keys are compared, never dereferenced (a stale key only costs a
 * wrong hint).
 */
struct ra_stream {
	const struct sf_ckpt_ref *ck;   /* key; NULL: a free slot */
	const struct sf_tensor *t;      /* key */
	const struct sf_box *view;      /* key; NULL: the whole tensor */
	uint64_t next;                  /* view offset past the furthest read */
	uint64_t ahead;                 /* view bytes [0, ahead) were advised
					 * (or needed no advice) */
	uint64_t win;                   /* current window, bytes: grows to
					 * ra->win while the reader follows */
	uint64_t tick;                  /* last use */
	uint64_t chained;               /* chain: bytes past the end advised */
	const struct sf_shard *box;     /* the box shard (never a flat one:
					 * its off and len are NULL) whose own
					 * box the view is (sf_shard_of_view),
					 * or NULL */
	bool chain;                     /* the reader goes through the tensors
					 * in model order (a whole view), or
					 * through the box shards (box): advise
					 * into the next ones near the end of
					 * this one */
};

struct sf_ra {
	pthread_mutex_t lock;           /* protects st, tick, done_* */
	const struct sf_source *src;    /* borrowed; advise() set */
	uint64_t win;                   /* the largest window, bytes */
	struct ra_stream st[RA_STREAMS]; /* followed readers (ck NULL: free) */
	uint64_t tick;                  /* use counter, for replacement */
	const struct sf_ckpt_ref *done_ck; /* the last tensor read to its */
	const struct sf_tensor *done_t;    /* end (whole view), or NULL */
	const struct sf_tensor *done_bt;   /* or the last shard box read to */
	const struct sf_shard *done_s;     /* its end (its tensor), or NULL */
};

int sf_ra_create(uint64_t win, const struct sf_source *src, struct sf_ra **out)
{
	struct sf_ra *ra = calloc(1, sizeof(*ra));

	if (!ra)
		return -ENOMEM;
	pthread_mutex_init(&ra->lock, NULL);
	ra->src = src;
	ra->win = win;
	*out = ra;
	return 0;
}

void sf_ra_destroy(struct sf_ra *ra)
{
	if (!ra)
		return;
	pthread_mutex_destroy(&ra->lock);
	free(ra);
}

bool sf_shard_locate(const struct sf_tensor *t, const struct sf_shard *s,
		     uint64_t p, uint64_t *pos, uint64_t *run)
{
	if (s->flat) {
		if (p < s->flat_off || p - s->flat_off >= s->flat_len)
			return false;
		*pos = p - s->flat_off;
		*run = s->flat_len - *pos;
		return true;
	}
	struct sf_box b;

	sf_shard_box(s, t->ndim, &b);
	if (s->strides)
		return sf_box_locate_strided(t->ndim, t->shape,
					     sf_dtype_size(t->dtype), &b,
					     s->strides, p, pos, run);
	return sf_box_locate(t->ndim, t->shape, sf_dtype_size(t->dtype),
			     &b, p, pos, run);
}

const struct sf_shard *sf_shard_of_view(const struct sf_tensor *t,
					const struct sf_box *view)
{
	bool whole = true;

	if (view) {
		if (view->ndim != t->ndim)
			return NULL;
		for (unsigned d = 0; d < t->ndim; d++)
			whole = whole && view->off[d] == 0 &&
				view->len[d] == t->shape[d];
	}
	for (size_t i = 0; i < t->nshards; i++) {
		const struct sf_shard *s = &t->shards[i];
		bool same = true;

		if (s->flat) {
			if (whole && s->flat_off == 0 && s->flat_len == t->nbytes)
				return s;
			continue;
		}
		if (s->strides)
			continue;
		for (unsigned d = 0; d < t->ndim && same; d++)
			same = view ? s->off[d] == view->off[d] &&
				      s->len[d] == view->len[d] :
				      s->off[d] == 0 && s->len[d] == t->shape[d];
		if (same)
			return s;
	}
	return NULL;
}

/* Payload block ranges a walk found, merged per shard, then advised. */
struct ra_walk {
	const struct sf_source *src;
	const struct sf_ckpt_ref *ck;
	const struct sf_tensor *t;
	uint64_t bs;                    /* the model's block size */
	unsigned flags;                 /* advise() flags (SF_ADVISE_DENSE) */
	size_t last;                    /* index of the last shard found */
	struct ra_range {
		const struct sf_shard *s;
		uint64_t lo, hi;        /* payload blocks [lo, hi) */
	} r[RA_GROUP];
	unsigned n;
};

static void ra_flush(struct ra_walk *w)
{
	const struct sf_source *src = w->src;

	for (unsigned i = 0; i < w->n; i++) {
		const struct sf_shard *s = w->r[i].s;
		uint64_t lo = w->r[i].lo * w->bs, hi = w->r[i].hi * w->bs;

		if (s->codec == SF_CODEC_UNREADABLE)
			continue;
		if (s->codec != SF_CODEC_NONE) {
			/* decoded whole on its first block: advise the stream once */
			if (lo == 0)
				src->ops->advise(src->ctx, w->ck, s->rank, s->file,
						 s->file_offset, s->stored_len, 0,
						 w->flags);
			continue;
		}
		if (hi > s->nbytes)
			hi = s->nbytes;
		if (lo < hi)
			src->ops->advise(src->ctx, w->ck, s->rank, s->file,
					 s->file_offset + lo, hi - lo, w->bs,
					 w->flags);
	}
	w->n = 0;
}

static void ra_add(struct ra_walk *w, const struct sf_shard *s, uint64_t lo,
		   uint64_t hi)
{
	for (unsigned i = 0; i < w->n; i++) {
		struct ra_range *r = &w->r[i];

		if (r->s == s && lo <= r->hi && hi >= r->lo) {
			r->lo = lo < r->lo ? lo : r->lo;
			r->hi = hi > r->hi ? hi : r->hi;
			return;
		}
	}
	if (w->n == RA_GROUP)
		ra_flush(w);
	w->r[w->n].s = s;
	w->r[w->n].lo = lo;
	w->r[w->n++].hi = hi;
}

/* sf_box_runs callback: the blocks of the shards covering a segment. */
static int ra_segment(void *arg, uint64_t toff, uint64_t voff, uint64_t len)
{
	struct ra_walk *w = arg;
	const struct sf_tensor *t = w->t;
	uint64_t p = toff, end = toff + len;

	(void)voff;
	while (p < end) {
		uint64_t pos = 0, run = 0, n;
		size_t i = 0, k;

		for (k = 0; k < t->nshards; k++) {
			i = (w->last + k) % t->nshards;
			if (sf_shard_locate(t, &t->shards[i], p, &pos, &run))
				break;
		}
		if (k == t->nshards || run == 0)
			return 1; /* a gap: the read itself reports it */
		w->last = i;
		n = run < end - p ? run : end - p;
		ra_add(w, &t->shards[i], pos / w->bs, (pos + n - 1) / w->bs + 1);
		p += n;
	}
	return 0;
}

/* Advise the payload blocks behind bytes [from, to) of view of t (when
 * shard is set: of that shard's payload, which the view is, in order). No
 * lock held. */
static void ra_advise(struct sf_ra *ra, const struct sf_ckpt_ref *ck,
		      const struct sf_model *m, const struct sf_tensor *t,
		      const struct sf_box *view, const struct sf_shard *shard,
		      uint64_t from, uint64_t to, unsigned flags)
{
	struct ra_walk w = { .src = ra->src, .ck = ck, .t = t, .bs = m->block_size,
			     .flags = flags };
	struct sf_box full;

	if (from >= to || t->nshards == 0)
		return;
	if (!shard)
		shard = sf_shard_of_view(t, view);
	if (shard && to <= shard->nbytes) {
		/* the view is one shard's payload, in order */
		ra_add(&w, shard, from / w.bs, (to - 1) / w.bs + 1);
		ra_flush(&w);
		return;
	}
	if (!view) {
		sf_box_full(&full, t->ndim, t->shape);
		view = &full;
	}
	(void)sf_box_runs(t->ndim, t->shape, sf_dtype_size(t->dtype), view,
			  from, to - from, ra_segment, &w);
	ra_flush(&w);
}

/* The stream of (ck, t, view): found (*found), or a slot taken for it (a
 * free one, else the least recently used), keyed and zeroed. Locked
 * (ra_lock). */
static struct ra_stream *ra_slot(struct sf_ra *ra,
				 const struct sf_ckpt_ref *ck,
				 const struct sf_tensor *t,
				 const struct sf_box *view, bool *found)
{
	struct ra_stream *old = &ra->st[0];

	for (unsigned i = 0; i < RA_STREAMS; i++) {
		struct ra_stream *st = &ra->st[i];

		if (st->ck == ck && st->t == t && st->view == view) {
			*found = true;
			return st;
		}
		if (!st->ck || (old->ck && st->tick < old->tick))
			old = st;
	}
	*found = false;
	memset(old, 0, sizeof(*old));
	old->ck = ck;
	old->t = t;
	old->view = view;
	return old;
}

/* Is tensor idx of m the first one with bytes after tensor done? */
static bool ra_follows(const struct sf_model *m, size_t idx,
		       const struct sf_tensor *done)
{
	if (idx >= m->ntensors || !done)
		return false;
	for (size_t k = 1; k <= RA_CHAIN && k <= idx; k++) {
		if (&m->tensors[idx - k] == done)
			return true;
		if (m->tensors[idx - k].nbytes)
			return false;
	}
	return false;
}

struct ra_plan {
	const struct sf_tensor *t;
	const struct sf_box *view;      /* NULL: the whole tensor */
	const struct sf_shard *shard;   /* box chain: the shard whose own box
					 * is advised (view unused), or NULL */
	unsigned flags;                 /* advise() flags */
	uint64_t from, to;              /* view bytes to advise */
};

/* Is shard j of t one a reader reads as the view of its own box: a
 * row-major box, the first shard with that box (sf_shard_of_view gives it
 * back; a replica of an earlier box is never read so)? */
static bool ra_box_shard(const struct sf_tensor *t, size_t j)
{
	const struct sf_shard *s = &t->shards[j];
	struct sf_box b;

	if (s->flat || s->strides || s->codec == SF_CODEC_UNREADABLE ||
	    s->nbytes == 0)
		return false;
	sf_shard_box(s, t->ndim, &b);
	return sf_shard_of_view(t, &b) == s;
}

/* Is box b of tensor tb split along the same dimensions as box a of ta
 * (the dims each covers whole are the same)? A reader of one tensor's
 * dim-1 slices reads the next tensor's dim-1 slices, not its dim-0 ones. */
static bool ra_same_split(const struct sf_tensor *ta, const struct sf_shard *a,
			  const struct sf_tensor *tb, const struct sf_shard *b)
{
	if (ta->ndim != tb->ndim)
		return false;
	for (unsigned d = 0; d < ta->ndim; d++)
		if ((a->len[d] == ta->shape[d]) != (b->len[d] == tb->shape[d]))
			return false;
	return true;
}

/* The box shard after shard *sj of tensor *ti: the next of that tensor,
 * else the first of the next tensors in model order split as shard *sj
 * of tensor *ti is (ra_same_split). Looks at RA_SCAN shards at most;
 * false when none was found by then or past the last. */
#define RA_SCAN 256
static bool ra_next_box(const struct sf_model *m, size_t *ti, size_t *sj)
{
	const struct sf_tensor *rt = &m->tensors[*ti];
	const struct sf_shard *rs = &rt->shards[*sj];
	size_t i = *ti, j = *sj + 1;
	unsigned seen = 0;

	if (rs->flat)
		return false; /* only box shards start a box chain */

	for (; i < m->ntensors; i++, j = 0) {
		const struct sf_tensor *t = &m->tensors[i];

		for (; j < t->nshards; j++) {
			if (++seen > RA_SCAN)
				return false;
			if (ra_box_shard(t, j) &&
			    (t == rt || ra_same_split(rt, rs, t, &t->shards[j]))) {
				*ti = i;
				*sj = j;
				return true;
			}
		}
		if (++seen > RA_SCAN)
			return false;
	}
	return false;
}

/* Did the last shard box read to its end come at most RA_CHAIN box
 * shards before shard j of tensor idx? Locked. */
static bool ra_box_follows(const struct sf_ra *ra, const struct sf_model *m,
			   size_t idx, size_t j)
{
	uintptr_t tp = (uintptr_t)ra->done_bt, t0 = (uintptr_t)m->tensors;
	size_t ti, sj;

	if (!ra->done_s || tp < t0 || (tp - t0) / sizeof(*m->tensors) >= m->ntensors)
		return false;
	ti = (tp - t0) / sizeof(*m->tensors);
	sj = (size_t)(ra->done_s - ra->done_bt->shards);
	for (unsigned k = 0; k < RA_CHAIN && ra_next_box(m, &ti, &sj); k++)
		if (ti == idx && sj == j)
			return true;
	return false;
}

/*
 * Note a read of [off, off+len) of view of t, and advise the source of
 * what a sequential reader reads next (the kernel's read-ahead, one level
 * up: it sees tensors, so it can ask for every shard file at once). A read
 * at the start of a view, or one that goes on from the last, moves the
 * window (growing from the first read's size to ra->win) past the
 * furthest read; a read elsewhere only starts following. A reader that
 * finished tensor i of the model and starts tensor i+1 (tensors/ in
 * listing order, or model.safetensors) is advised on into the next
 * tensors when the window passes the end of this one. No lock held.
 */
void sf_ra_note(struct sf_ra *ra, const struct sf_ckpt_ref *ck,
		const struct sf_model *m, const struct sf_tensor *t,
		    const struct sf_box *view, uint64_t off, size_t len)
{
	struct ra_plan plan[1 + RA_CHAIN];
	uint64_t vlen, end = off + len, bs = m->block_size, init, budget;
	uintptr_t tp = (uintptr_t)t, t0 = (uintptr_t)m->tensors;
	size_t idx = tp >= t0 ? (tp - t0) / sizeof(*t) : SIZE_MAX;
	struct ra_stream *st;
	unsigned np = 0;
	bool found;

	vlen = view ? sf_box_numel(view) * sf_dtype_size(t->dtype) : t->nbytes;
	init = 4 * (uint64_t)len > 2 * bs ? 4 * (uint64_t)len : 2 * bs;
	if (init > ra->win)
		init = ra->win;
	pthread_mutex_lock(&ra->lock);
	st = ra_slot(ra, ck, t, view, &found);
	st->tick = ++ra->tick;
	if (found && off <= st->ahead && end + st->win >= st->next) {
		if (end > st->next)
			st->next = end; /* goes on: workers may answer out of order */
	} else if (off < bs) {
		/* a reader at the start */
		st->next = end;
		st->ahead = 0;
		st->win = init;
		st->chained = 0;
		st->box = view && idx < m->ntensors ? sf_shard_of_view(t, view) : NULL;
		if (st->box && st->box->flat)
			st->box = NULL; /* a whole view of a flat shard: no box */
		if (st->box)
			st->chain = ra->done_ck == ck &&
				    ra_box_follows(ra, m, idx,
						   (size_t)(st->box - t->shards));
		else
			st->chain = !view && ra->done_ck == ck &&
				    ra_follows(m, idx, ra->done_t);
	} else {
		/* somewhere else: follow, advise once it goes on */
		st->next = st->ahead = end;
		st->win = init;
		st->chained = 0;
		st->box = NULL;
		st->chain = false;
		goto out_unlock;
	}
	if (st->ahead < vlen && st->ahead < st->next + st->win / 2) {
		uint64_t to = vlen - st->next > st->win ? st->next + st->win : vlen;

		plan[np].t = t;
		plan[np].view = view;
		plan[np].shard = st->box;
		plan[np].flags = view ? 0 : SF_ADVISE_DENSE;
		plan[np].from = st->ahead;
		plan[np++].to = to;
		st->ahead = to;
		st->win = 2 * st->win < ra->win ? 2 * st->win : ra->win;
	}
	if (!view && st->next >= vlen) {
		ra->done_ck = ck;
		ra->done_t = t;
		ra->done_s = NULL;
	} else if (st->box && st->next >= vlen) {
		ra->done_ck = ck;
		ra->done_t = NULL;
		ra->done_bt = t;
		ra->done_s = st->box;
	}
	/* Past the end, the window goes on into the next tensors. */
	budget = st->next + st->win > vlen ? st->next + st->win - vlen : 0;
	/* in steps of half a window, like the window itself */
	if (!st->chain || st->ahead < vlen || idx >= m->ntensors ||
	    (st->chained && budget < st->chained + st->win / 2))
		budget = 0;
	if (budget && st->box) {
		/* the box shards after this one, as one run of bytes: advise
		 * its part [st->chained, budget) */
		size_t ti = idx, sj = (size_t)(st->box - t->shards);
		uint64_t pos = 0, from = st->chained;

		st->chained = budget;
		while (np < 1 + RA_CHAIN && pos < budget &&
		       ra_next_box(m, &ti, &sj)) {
			const struct sf_tensor *t2 = &m->tensors[ti];
			const struct sf_shard *s2 = &t2->shards[sj];
			uint64_t a = from > pos ? from - pos : 0;
			uint64_t b = budget - pos < s2->nbytes ? budget - pos : s2->nbytes;

			if (a < b) {
				plan[np].t = t2;
				plan[np].view = NULL;
				plan[np].shard = s2;
				plan[np].flags = 0; /* slices: sparse */
				plan[np].from = a;
				plan[np++].to = b;
			}
			pos += s2->nbytes;
		}
		budget = 0;
	}
	if (budget)
		st->chained = budget;
	for (size_t k = 1; budget && k <= RA_CHAIN && idx + k < m->ntensors; k++) {
		const struct sf_tensor *t2 = &m->tensors[idx + k];
		uint64_t n2 = t2->nbytes < budget ? t2->nbytes : budget;
		struct ra_stream *s2 = ra_slot(ra, ck, t2, NULL, &found);

		if (!found) {
			s2->win = ra->win;
			s2->chain = true;
		}
		s2->tick = ++ra->tick;
		if (s2->ahead < n2) {
			plan[np].t = t2;
			plan[np].view = NULL;
			plan[np].shard = NULL;
			plan[np].flags = SF_ADVISE_DENSE;
			plan[np].from = s2->ahead;
			plan[np++].to = n2;
			s2->ahead = n2;
		}
		budget -= n2;
	}
out_unlock:
	pthread_mutex_unlock(&ra->lock);
	for (unsigned i = 0; i < np; i++)
		ra_advise(ra, ck, m, plan[i].t, plan[i].view, plan[i].shard,
			  plan[i].from, plan[i].to, plan[i].flags);
}

/* Forget the streams of checkpoint ck. */
void sf_ra_forget(struct sf_ra *ra, const struct sf_ckpt_ref *ck)
{
	pthread_mutex_lock(&ra->lock);
	for (unsigned i = 0; i < RA_STREAMS; i++)
		if (ra->st[i].ck == ck)
			memset(&ra->st[i], 0, sizeof(ra->st[i]));
	if (ra->done_ck == ck) {
		ra->done_ck = NULL;
		ra->done_t = NULL;
		ra->done_bt = NULL;
		ra->done_s = NULL;
	}
	pthread_mutex_unlock(&ra->lock);
}

