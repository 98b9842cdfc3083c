/*
 * sf_engine.c - assembling tensor bytes from shards through a cache of
 * verified checksum blocks.
 *
 * A read of bytes [off, off+len) of a view (a box of a tensor) is walked as
 * tensor-contiguous segments (sf_box_runs). Each byte position p of a
 * segment is served by the first shard that covers it (the last shard used
 * is tried first, so runs of one shard stay cheap); the covering shard's
 * maximal run from p is copied out of whole payload blocks (or, for a
 * zero-copy read, handed out as iovecs into them). Blocks are the
 * manifest's checksum blocks: a block enters the cache only after its XXH3
 * matched (when verify is on), so every byte served was verified once.
 *
 * Cache invariants (all under e->lock):
 *  - a block is in the hash table while it is LOADING or READY; a failed or
 *    evicted block is unlinked at once and freed when its last pin goes;
 *  - refs counts pins (readers copying from it or waiting for it, and
 *    zero-copy holds until sf_engine_release); only
 *    blocks with refs == 0 are evicted, least recently used first;
 *  - cached counts the buffer bytes (cap) of blocks linked in the table;
 *    room is made (unpinned blocks evicted) before a new block is added,
 *    so it exceeds the cache bound only while pins hold it up, and is
 *    brought back under it whenever a pin is dropped.
 * Fetching and hashing happen outside the lock; concurrent readers of a
 * LOADING block wait on e->cond instead of fetching it twice.
 *
 * Block buffers of POOL_MIN bytes or more come from a pool (under e->lock):
 * a freed block's buffer is kept on a free list and handed to the next
 * block it fits (smallest first), so steady-state reads never page-fault.
 * Pool buffers are mmap'd, 2 MiB aligned with MADV_HUGEPAGE when they are
 * at least that large, and pre-faulted once (MADV_POPULATE_WRITE).
 * pool_bytes (buffers in blocks plus free ones) is kept at or under the
 * cache bound except for buffers pinned beyond it: a buffer freed while
 * the pool is over the bound is unmapped, not kept.
 *
 * A coded shard (sf_codec.h: stored compressed) is fetched by decoding its
 * whole stream once (shared by every shard of the checkpoint naming the
 * same file, offset and length) into a small cache of decoded streams (under
 * e->dec_lock, least recently used dropped first, bounded by dec_cap plus
 * the one stream being served) and copying blocks out of it; its blocks
 * then live in the block cache like any other. A stream that fails to
 * decode, or decodes to another size than the model says, fails the read
 * with EIO and one log line; an unreadable shard fails every read so.
 *
 * Verified-block maps (when the source has file_id() and verify is on):
 * per shard read, a bit per block that matched its XXH3, with the file's
 * identity when it did (sf_engine_vmap.c: its own lock, never held with
 * e->lock). A bit is set only when the identity read before the fetch equals the one
 * read after it, and trusted only while the identity read after a later
 * fetch still equals it; any change of identity clears the shard's map.
 * So a block evicted from the cache and fetched again is copied but not
 * hashed again, while its file stays as it was. A plain payload's maps
 * only (a coded shard's blocks come from memory); at most SF_VMAPS_MAX shards
 * get one, the rest are hashed on every fetch as before.
 *
 * Unverified blocks (no checksum, or verify off) of a source with
 * file_id(): nothing else would notice their file changing (a framework
 * re-saving a step over a mounted foreign checkpoint), so each keeps the
 * file's identity read before it was fetched (b->fid; a coded shard's
 * decoded stream likewise, d->fid), and a lookup that finds the identity
 * changed drops it (or the stream) and fetches it anew: after a rewrite
 * every read gives the file's new bytes or fails (a short file: EIO),
 * never cached old bytes mixed with new ones. The identity is read before
 * e->lock is taken (one fstat per lookup of such a shard's block); a read
 * that races with the writer may still see either.
 *
 * Mapped blocks (when the source has map(), unless no_map): a plain
 * (uncoded) block of map_min bytes or more of a checkpoint in the format
 * shardfs writes (shardfs/1: immutable once committed, never rewritten by
 * a framework; native()), or an unverified one of a framework's files
 * (mapped without a lease, map_live: its bytes follow the file, the copy
 * out of it is guarded, and its fid drops it as above), is not copied into a pool
 * buffer but mapped by the source (the local source: a leased MAP_SHARED
 * view of the payload's page cache whose bytes stay as they were when it
 * was mapped, sf_local_source.c), hashed there under a SIGBUS guard
 * (sf_engine_map.c) unless the verified-block map trusts it, and only
 * then made READY: the same rule as a copied block, so no byte of it is
 * served before it matched. Its cap counts in cached like a buffer's (the
 * cache bound covers mapped blocks too, not the pool); its mapping is
 * dropped through the source when the block is freed; a cached mapped
 * block the source calls stale (map_stale: its bytes may have changed
 * since they were verified) is dropped at its next lookup and fetched and
 * verified anew. A block the source
 * will not map, or whose hash faulted (the file shrank, an I/O error), is
 * copied instead, which then reports what is wrong with the file.
 *
 * Read-ahead (sf_engine_ra.c), when the source has advise(): every read is
 * noted before its blocks are pinned, so the payload a sequential reader
 * needs next is on its way (into the page cache) while this read waits.
 */
#include "sf_engine.h"
#include "sf_checksum.h"
#include "sf_engine_map.h"
#include "sf_engine_ra.h"
#include "sf_engine_vmap.h"
#include "sf_error.h"
#include "sf_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>

#define PINS 8                  /* blocks one read keeps pinned at a time */
#define POOL_MIN (64u << 10)    /* smaller blocks use plain malloc */
#define POOL_GRAIN (64u << 10)  /* size classes below HUGE_SZ */
#define HUGE_SZ (2u << 20)      /* size classes (and alignment) above */
#define DEC_CAP_MAX (256ull << 20) /* decoded streams kept, at most */
#define DEC_READ (4u << 20)     /* source reads of a coded stream, at most */

enum blk_state { BLK_LOADING, BLK_READY, BLK_FAILED };

struct sf_block {
	const struct sf_ckpt_ref *ck;   /* key: checkpoint */
	const struct sf_shard *shard;   /* key: shard (address) */
	uint64_t idx;                   /* key: block index in the shard */
	unsigned char *data;            /* len bytes used of cap; owned (pool
					 * buffer when cap >= POOL_MIN), or,
					 * with map_token, inside a source
					 * mapping (read-only) */
	void *map_token;                /* non-NULL: data lies in a source
					 * mapping, dropped (src unmap) when
					 * the block is freed */
	uint64_t fid;                   /* fid_ok: the identity of its file
					 * read before it was fetched (an
					 * unverified block: kept only while
					 * the file keeps it) */
	bool fid_ok;
	bool live;                      /* map_token from map_live: no lease,
					 * copies out of it guarded */
	size_t len;                     /* payload bytes */
	size_t cap;                     /* buffer bytes, as accounted */
	enum blk_state state;
	int err;                        /* when FAILED */
	unsigned refs;                  /* pins, under e->lock */
	bool linked;                    /* in the hash table (and LRU if READY) */
	struct sf_block *hnext;         /* hash chain */
	struct sf_block *prev, *next;   /* LRU list, most recent first */
};

/* One decoded stream of a coded shard, kept for the next blocks. */
struct dec_ent {
	const struct sf_ckpt_ref *ck;   /* key: checkpoint */
	const struct sf_shard *shard;   /* key: shard (address) */
	unsigned char *data;            /* len bytes; owned */
	uint64_t len;                   /* the shard's decoded_len */
	uint64_t fid;                   /* fid_ok: its file's identity read
					 * before it was read (unverified) */
	bool fid_ok;
	struct dec_ent *next;           /* most recently used first */
};

/* A free pool buffer; the header lives in the buffer's first bytes. */
struct pool_free {
	struct pool_free *next;
	size_t cap;                     /* the buffer's size class */
};

struct sf_engine {
	pthread_mutex_t lock;           /* protects everything below */
	pthread_cond_t cond;            /* signalled when a LOADING block settles */
	struct sf_source *src;          /* borrowed */
	bool verify;
	uint64_t cap;                   /* cache bound, bytes */
	uint64_t cached;                /* bytes (cap) of linked blocks */
	struct sf_block **buckets;
	size_t nbuckets;                /* power of two */
	struct sf_block lru;            /* sentinel */
	struct pool_free *free_bufs;    /* pool buffers ready for reuse */
	uint64_t pool_bytes;            /* all pool buffers: in blocks, free or
					 * being allocated */
	struct sf_engine_stats st;
	pthread_mutex_t dec_lock;       /* protects dec, dec_bytes; taken
					 * without e->lock held */
	struct dec_ent *dec;            /* decoded streams, MRU first */
	uint64_t dec_bytes;             /* their decoded bytes */
	uint64_t dec_cap;               /* bound on dec_bytes beyond the MRU one */
	struct sf_ra *ra;               /* read-ahead (own lock); NULL: none */
	struct sf_vmaps *vmaps;         /* verified blocks (own lock); NULL
					 * when the source has no file_id or
					 * verify is off */
	bool map;                       /* blocks may be source mappings */
	size_t map_min;                 /* ... when they have this many bytes */
};

static size_t hash_key(const struct sf_engine *e, const void *ck,
		       const void *shard, uint64_t idx)
{
	uint64_t h = (uint64_t)(uintptr_t)ck * 0x9E3779B97F4A7C15ull;
	h ^= (uint64_t)(uintptr_t)shard * 0xC2B2AE3D27D4EB4Full;
	h ^= idx * 0x165667B19E3779F9ull;
	h ^= h >> 29;
	return (size_t)h & (e->nbuckets - 1);
}

int sf_engine_create(const struct sf_engine_opts *opts, struct sf_source *src,
		     struct sf_engine **out)
{
	struct sf_engine *e;
	uint64_t cap = opts && opts->cache_bytes ? opts->cache_bytes :
		       SF_ENGINE_CACHE_DEFAULT;
	size_t nb = 1024;

	if (!src || !src->ops || !src->ops->read)
		return -EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	while (nb < (cap / (1u << 20)) * 4 && nb < (1u << 20))
		nb <<= 1;
	e->buckets = calloc(nb, sizeof(*e->buckets));
	if (!e->buckets) {
		free(e);
		return -ENOMEM;
	}
	e->nbuckets = nb;
	e->src = src;
	e->verify = opts ? opts->verify : true;
	e->cap = cap;
	e->lru.prev = e->lru.next = &e->lru;
	e->dec_cap = cap / 4 < DEC_CAP_MAX ? cap / 4 : DEC_CAP_MAX;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->cond, NULL);
	pthread_mutex_init(&e->dec_lock, NULL);
	e->map = src->ops->map && src->ops->unmap &&
		 !(opts && opts->no_map) && sf_map_guard_init() == 0;
	e->map_min = opts && opts->map_min ? opts->map_min : SF_ENGINE_MAP_MIN;
	if (src->ops->file_id && e->verify && sf_vmaps_create(&e->vmaps)) {
		sf_engine_destroy(e);
		return -ENOMEM;
	}
	if (src->ops->advise && !(opts && opts->no_readahead) &&
	    sf_ra_create(opts && opts->readahead_bytes ? opts->readahead_bytes :
			 SF_ENGINE_RA_DEFAULT, src, &e->ra)) {
		sf_engine_destroy(e);
		return -ENOMEM;
	}
	*out = e;
	return 0;
}

/* --- the buffer pool --- */

/* The bytes a block of len payload bytes is accounted (and allocated) as. */
static size_t buf_class(size_t len)
{
	if (len < POOL_MIN)
		return len ? len : 1;
	if (len < HUGE_SZ)
		return (len + POOL_GRAIN - 1) / POOL_GRAIN * POOL_GRAIN;
	return (len + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ;
}

/*
 * Map a fresh pool buffer of class cap (no lock held): 2 MiB aligned and
 * huge-page backed when it is that large, and pre-faulted so the first
 * fetch into it does not take a fault per page. Returns NULL when out of
 * memory.
 */
static unsigned char *pool_map(size_t cap)
{
	size_t align = cap >= HUGE_SZ ? HUGE_SZ : 0;
	unsigned char *p = mmap(NULL, cap + align, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	if (align) {
		size_t head = (HUGE_SZ - (uintptr_t)p % HUGE_SZ) % HUGE_SZ;

		if (head)
			munmap(p, head);
		if (align - head)
			munmap(p + head + cap, align - head);
		p += head;
		/* Advice only: without THP the buffer is still usable. */
		madvise(p, cap, MADV_HUGEPAGE);
	}
	madvise(p, cap, MADV_POPULATE_WRITE);
	return p;
}

/* Take the smallest free buffer of at least `need` bytes, or NULL; *cap
 * is set to its size. Taking a larger buffer than the class asks for
 * wastes some of the bound but saves mapping a fresh one. Locked. */
static unsigned char *pool_take(struct sf_engine *e, size_t need, size_t *cap)
{
	struct pool_free **best = NULL;

	for (struct pool_free **pp = &e->free_bufs; *pp; pp = &(*pp)->next) {
		if ((*pp)->cap < need || (best && (*best)->cap <= (*pp)->cap))
			continue;
		best = pp;
		if ((*pp)->cap == need)
			break;
	}
	if (!best)
		return NULL;
	struct pool_free *f = *best;
	*best = f->next;
	*cap = f->cap;
	return (unsigned char *)f;
}

/* Unmap free buffers until the pool fits `limit` or none is free. Locked
 * (munmap under the lock only happens when the pool is over its bound). */
static void pool_trim(struct sf_engine *e, uint64_t limit)
{
	while (e->pool_bytes > limit && e->free_bufs) {
		struct pool_free *f = e->free_bufs;

		e->free_bufs = f->next;
		e->pool_bytes -= f->cap;
		munmap(f, f->cap);
	}
}

/* Give a pool buffer back: kept for reuse while the pool is within the
 * cache bound, unmapped otherwise. Locked. */
static void pool_put(struct sf_engine *e, unsigned char *p, size_t cap)
{
	struct pool_free *f = (struct pool_free *)p;

	if (e->pool_bytes > e->cap) {
		e->pool_bytes -= cap;
		munmap(p, cap);
		return;
	}
	f->cap = cap;
	f->next = e->free_bufs;
	e->free_bufs = f;
}

/* Free a block and its buffer. Locked (or the engine is being destroyed). */
static void blk_free(struct sf_engine *e, struct sf_block *b)
{
	if (b->map_token)
		e->src->ops->unmap(e->src->ctx, b->map_token);
	else if (b->data && b->cap >= POOL_MIN)
		pool_put(e, b->data, b->cap);
	else
		free(b->data);
	free(b);
}

/* --- the block table --- */

static void lru_unlink(struct sf_block *b)
{
	b->prev->next = b->next;
	b->next->prev = b->prev;
	b->prev = b->next = NULL;
}

static void lru_push_front(struct sf_engine *e, struct sf_block *b)
{
	b->next = e->lru.next;
	b->prev = &e->lru;
	e->lru.next->prev = b;
	e->lru.next = b;
}

/* Remove b from the table (and LRU). Caller holds the lock. */
static void blk_unlink(struct sf_engine *e, struct sf_block *b)
{
	struct sf_block **pp = &e->buckets[hash_key(e, b->ck, b->shard, b->idx)];

	while (*pp && *pp != b)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = b->hnext;
	if (b->prev)
		lru_unlink(b);
	b->linked = false;
	e->cached -= b->cap;
}

/* Evict unpinned blocks, oldest first, until cached <= limit. Locked. */
static void evict_to(struct sf_engine *e, uint64_t limit)
{
	struct sf_block *b = e->lru.prev;

	while (e->cached > limit && b != &e->lru) {
		struct sf_block *prev = b->prev;
		if (b->refs == 0) {
			blk_unlink(e, b);
			blk_free(e, b);
		}
		b = prev;
	}
}

/* Drop one pin; with the cache or the pool over the bound, bring them
 * back under it. Locked. */
static void unpin_locked(struct sf_engine *e, struct sf_block *b)
{
	if (--b->refs == 0 && !b->linked)
		blk_free(e, b);
	else if (e->cached > e->cap)
		evict_to(e, e->cap);
	if (e->pool_bytes > e->cap)
		pool_trim(e, e->cap);
}

/* --- reads --- */

struct read_ctx {
	struct sf_engine *e;
	const struct sf_ckpt_ref *ck;
	const struct sf_model *m;
	const struct sf_tensor *t;
	unsigned char *buf;
	uint64_t base;                  /* view offset of buf[0] */
	size_t last;                    /* index of the last shard used */
	struct sf_block **pins;         /* npins slots: pinned blocks */
	unsigned npins;
	unsigned next_pin;              /* slot the next pin takes */
	bool keep;                      /* zero-copy: pins are never dropped
					 * (full slots: -E2BIG); pieces go to
					 * iov instead of buf */
	struct iovec *iov;              /* keep: pieces so far, niov of maxiov */
	unsigned niov, maxiov;
};

/* Failed reads: one line per checkpoint, tensor, payload file and cause
 * in a window (the kernel reads a failed page again, readers retry), at
 * most READ_FAIL_BURST lines a window in all. */
#define READ_FAIL_BURST 100
static struct sf_log_limit read_fail_lim = { .burst = READ_FAIL_BURST };

static void log_block_error(const struct read_ctx *c, const struct sf_shard *s,
			    uint64_t idx, int err)
{
	char qt[SF_QNAME_SIZE], qf[SF_QNAME_SIZE];

	sf_log_once(&read_fail_lim,
		    sf_log_key(c->ck->name, c->t->name, s->file, err), SF_LOG_ERROR,
		    "checkpoint %s: tensor %s: shard %zu (rank %u, file %s) block %llu: %s",
		    SF_QSTR(c->ck->name), sf_quote_str(qt, c->t->name),
		    (size_t)(s - c->t->shards), s->rank, sf_quote_str(qf, s->file),
		    (unsigned long long)idx, sf_strerror(err));
}

/* Drop the decoded streams past the bound, keeping the first. Locked
 * (dec_lock). */
static void dec_trim(struct sf_engine *e)
{
	struct dec_ent **pp = &e->dec;
	uint64_t kept = 0;

	if (!*pp)
		return;
	kept = (*pp)->len;
	pp = &(*pp)->next;
	while (*pp) {
		struct dec_ent *d = *pp;

		if (kept + d->len <= e->dec_cap) {
			kept += d->len;
			pp = &d->next;
			continue;
		}
		*pp = d->next;
		e->dec_bytes -= d->len;
		free(d->data);
		free(d);
	}
}

/* Read and decode the stream of coded shard s into a new entry. No lock
 * held. Logs its reason. */
static int dec_load(struct read_ctx *c, const struct sf_shard *s,
		    struct dec_ent **out)
{
	struct sf_engine *e = c->e;
	unsigned char *stored = malloc(s->stored_len ? s->stored_len : 1);
	struct dec_ent *d = calloc(1, sizeof(*d));
	char why[192] = "";
	size_t got = 0;
	int ret = -ENOMEM;

	if (!stored || !d ||
	    !(d->data = malloc(s->decoded_len ? s->decoded_len : 1)))
		goto out_free;
	/* in pieces no larger than a big block: a peer serves any of them */
	for (uint64_t done = 0; done < s->stored_len; done += DEC_READ) {
		uint64_t k = s->stored_len - done < DEC_READ ?
			     s->stored_len - done : DEC_READ;

		ret = e->src->ops->read(e->src->ctx, c->ck, s->rank, s->file,
					s->file_offset + done, stored + done,
					(size_t)k);
		if (ret < 0)
			goto out_free;
	}
	ret = sf_codec_decode(s->codec, stored, s->stored_len, d->data,
			      s->decoded_len, &got, why, sizeof(why));
	if (ret == 0 && got != s->decoded_len) {
		snprintf(why, sizeof(why), "decodes to %zu bytes, not %llu",
			 got, (unsigned long long)s->decoded_len);
		ret = -EIO;
	}
	if (ret < 0) {
		char qt[SF_QNAME_SIZE], qf[SF_QNAME_SIZE];

		ret = -EIO;
		sf_log_once(&read_fail_lim,
			    sf_log_key(c->ck->name, c->t->name, s->file, -EILSEQ),
			    SF_LOG_ERROR,
			    "checkpoint %s: tensor %s: shard %zu (rank %u, file %s, %s stream at %llu): %s",
			    SF_QSTR(c->ck->name), sf_quote_str(qt, c->t->name),
			    (size_t)(s - c->t->shards), s->rank,
			    sf_quote_str(qf, s->file), sf_codec_name(s->codec),
			    (unsigned long long)s->file_offset, why);
		goto out_free;
	}
	d->ck = c->ck;
	d->shard = s;
	d->len = s->decoded_len;
	free(stored);
	*out = d;
	return 0;

out_free:
	if (d)
		free(d->data);
	free(d);
	free(stored);
	return ret;
}

/* Do coded shards a and b (of one checkpoint) name the same stream? Then
 * one decode serves both (entries of a DCP checkpoint may share one). */
static bool same_stream(const struct sf_shard *a, const struct sf_shard *b)
{
	return a == b ||
	       (a->rank == b->rank && a->codec == b->codec &&
		a->file_offset == b->file_offset && a->stored_len == b->stored_len &&
		a->decoded_len == b->decoded_len && strcmp(a->file, b->file) == 0);
}

/* Copy block idx of coded shard s out of its decoded stream. A stream
 * decoded before its (unverified) file's identity changed from b->fid is
 * decoded anew. No lock held. */
static int fetch_coded(struct read_ctx *c, const struct sf_shard *s,
		       uint64_t idx, struct sf_block *b)
{
	struct sf_engine *e = c->e;
	struct dec_ent **pp, *d = NULL;
	int ret = 0;

	if (s->codec == SF_CODEC_UNREADABLE)
		return -EIO;
	pthread_mutex_lock(&e->dec_lock);
	for (pp = &e->dec; *pp; pp = &(*pp)->next)
		if ((*pp)->ck == c->ck && same_stream((*pp)->shard, s))
			break;
	if (*pp) {
		d = *pp;
		*pp = d->next;
		if (b->fid_ok && (!d->fid_ok || d->fid != b->fid)) {
			/* decoded before its file changed: decoded anew */
			e->dec_bytes -= d->len;
			free(d->data);
			free(d);
			d = NULL;
		}
	}
	if (!d) {
		/* decoded under the lock: one stream at a time, never twice */
		ret = dec_load(c, s, &d);
		if (ret == 0) {
			e->dec_bytes += s->decoded_len;
			d->fid = b->fid;
			d->fid_ok = b->fid_ok;
		}
	}
	if (d) {
		d->next = e->dec;
		e->dec = d;
		memcpy(b->data, d->data + s->decoded_off + idx * c->m->block_size,
		       b->len);
		dec_trim(e);
	}
	pthread_mutex_unlock(&e->dec_lock);
	return ret;
}

/*
 * The identity of the file of shard s into *id, when the map of verified
 * blocks covers block idx: a plain payload's block with a checksum (a
 * coded one's bytes are decoded in memory, not the file's). Called before
 * a fetch and again after it; a block is trusted, or noted verified, only
 * when both calls succeed (and, to be noted, agree). No lock held.
 */
static bool vmap_id(const struct read_ctx *c, const struct sf_shard *s,
		    uint64_t idx, uint64_t *id)
{
	const struct sf_source *src = c->e->src;

	return c->e->vmaps && s->xxh3 && s->codec == SF_CODEC_NONE &&
	       idx < s->nblocks &&
	       src->ops->file_id(src->ctx, c->ck, s->rank, s->file, id) == 0;
}

/*
 * The identity of the file of shard s into *id when its blocks are served
 * unverified (no checksum, or verify off) and the source names identities
 * (the top of this file: such a block is kept only while its file keeps
 * the identity read before it was fetched). No lock held.
 */
static bool unverified_id(const struct read_ctx *c, const struct sf_shard *s,
			  uint64_t *id)
{
	const struct sf_source *src = c->e->src;

	return (!c->e->verify || !s->xxh3) && src->ops->file_id &&
	       src->ops->file_id(src->ctx, c->ck, s->rank, s->file, id) == 0;
}

/* Whether blocks of model m may be leased source mappings: the format
 * shardfs writes only (immutable once committed). A foreign checkpoint's
 * files are its framework's, which may rewrite them at any time (a re-save
 * of the same step): a lease delays the framework's open for writing or
 * truncation until it is broken and fails its O_NONBLOCK open with EAGAIN
 * (issue 30, 7); its unverified blocks are mapped without one (map_live),
 * its verified ones copied (hashed bytes must stay the served ones). */
static bool native(const struct sf_model *m)
{
	return strcmp(m->format, "shardfs/1") == 0;
}

/*
 * Fetch a block's bytes into b->data and check them; *hashed is set when
 * its XXH3 was computed, *trusted when the map of verified blocks made
 * that unnecessary. No lock held.
 */
static int fetch(struct read_ctx *c, const struct sf_shard *s, uint64_t idx,
		 struct sf_block *b, bool *hashed, bool *trusted)
{
	struct sf_engine *e = c->e;
	const struct sf_source_ops *ops = e->src->ops;
	uint64_t bs = c->m->block_size, id0 = 0, id1 = 0;
	bool ids;
	int ret;

	ids = vmap_id(c, s, idx, &id0);
	if (s->codec != SF_CODEC_NONE)
		ret = fetch_coded(c, s, idx, b);
	else
		ret = ops->read(e->src->ctx, c->ck, s->rank, s->file,
				s->file_offset + idx * bs, b->data, b->len);
	if (ret < 0)
		return ret;
	if (!e->verify || !s->xxh3)
		return 0;
	ids = ids && vmap_id(c, s, idx, &id1);
	if (ids && sf_vmaps_test(e->vmaps, c->ck, s, idx, id1)) {
		*trusted = true;
		return 0;
	}
	*hashed = true;
	if (sf_xxh3(b->data, b->len) != s->xxh3[idx])
		return -SF_ECHECKSUM;
	/* unchanged while it was read: its bytes are the verified ones */
	if (ids && id0 == id1)
		sf_vmaps_set(e->vmaps, c->ck, s, idx, id1);
	return 0;
}

/*
 * Fetch block idx of plain shard s as a source mapping (no copy): b->data
 * points into it and b->map_token holds it. Its bytes are checked as
 * fetch() checks copied ones: hashed, under the SIGBUS guard, unless the
 * map of verified blocks trusts them (identity before the mapping and
 * after it; the source keeps the mapped bytes as they were when map()
 * returned, so the identity after it names them). -EAGAIN, with nothing
 * held, when the block must be copied instead: the source would not map
 * it, or hashing touched a page that faulted (*faulted set; the copy then
 * reports what is wrong with the file). No lock held.
 */
static int fetch_mapped(struct read_ctx *c, const struct sf_shard *s,
			uint64_t idx, struct sf_block *b, bool *hashed,
			bool *trusted, bool *faulted)
{
	struct sf_engine *e = c->e;
	const struct sf_source_ops *ops = e->src->ops;
	uint64_t id0 = 0, id1 = 0, h = 0;
	const void *addr = NULL;
	void *tok = NULL;
	bool ids;
	int ret = 0;

	ids = vmap_id(c, s, idx, &id0);
	if ((b->live ? ops->map_live : ops->map)(e->src->ctx, c->ck, s->rank,
		s->file, s->file_offset + idx * c->m->block_size, b->len,
		&addr, &tok) < 0)
		return -EAGAIN;
	/* page tables filled in one call, not a fault per 64 KiB; a page
	 * it cannot read is left to the guarded hash (or the copy) */
	(void)sf_map_populate(addr, b->len);
	if (!e->verify || !s->xxh3)
		goto out_mapped;
	ids = ids && vmap_id(c, s, idx, &id1);
	if (ids && sf_vmaps_test(e->vmaps, c->ck, s, idx, id1)) {
		*trusted = true;
		goto out_mapped;
	}
	*hashed = true;
	if (sf_map_hash(addr, b->len, &h) < 0) {
		*faulted = true;
		ret = -EAGAIN;
		goto out_unmap;
	}
	if (h != s->xxh3[idx]) {
		ret = -SF_ECHECKSUM;
		goto out_unmap;
	}
	if (ids && id0 == id1)
		sf_vmaps_set(e->vmaps, c->ck, s, idx, id1);
out_mapped:
	b->data = (unsigned char *)(uintptr_t)addr;
	b->map_token = tok;
	return 0;

out_unmap:
	ops->unmap(e->src->ctx, tok);
	return ret;
}

/*
 * Give b (linked, its cap counted in cached) a buffer of class b->cap or
 * more: a free pool buffer (b->cap grows to its size), or a fresh one
 * (mapped with the lock dropped; the pool bytes are reserved first so
 * concurrent allocations stay bounded). Called and returns locked.
 */
static int blk_alloc(struct sf_engine *e, struct sf_block *b)
{
	size_t taken;

	if (b->cap < POOL_MIN) {
		b->data = malloc(b->cap);
		return b->data ? 0 : -ENOMEM;
	}
	b->data = pool_take(e, b->cap, &taken);
	if (b->data) {
		/* account what the block really holds */
		e->cached += taken - b->cap;
		b->cap = taken;
		return 0;
	}
	/* Free buffers of other classes give their room first. */
	if (e->pool_bytes + b->cap > e->cap)
		pool_trim(e, e->cap > b->cap ? e->cap - b->cap : 0);
	e->pool_bytes += b->cap;
	e->st.pool_maps++;
	pthread_mutex_unlock(&e->lock);
	b->data = pool_map(b->cap);
	pthread_mutex_lock(&e->lock);
	if (!b->data) {
		e->pool_bytes -= b->cap;
		return -ENOMEM;
	}
	return 0;
}

/*
 * Pin block idx of shard s, fetching it if needed. The pin replaces the
 * oldest of the read's npins pins, dropped in the same critical section;
 * a zero-copy read (keep) never drops one and gives up with -E2BIG.
 */
static int pin(struct read_ctx *c, const struct sf_shard *s, uint64_t idx,
	       struct sf_block **out)
{
	struct sf_engine *e = c->e;
	uint64_t bs = c->m->block_size;
	struct sf_block *b, *old;
	bool hashed = false, trusted = false, faulted = false, mapped, fid_ok;
	uint64_t fid = 0;
	size_t h;
	int ret;

	for (unsigned i = 0; i < c->npins; i++) {
		b = c->pins[i];
		if (b && b->shard == s && b->idx == idx) {
			*out = b;
			return 0;
		}
	}
	old = c->pins[c->next_pin];
	if (old && c->keep)
		return -E2BIG;
	c->pins[c->next_pin] = NULL;
	h = hash_key(e, c->ck, s, idx);
	fid_ok = unverified_id(c, s, &fid);
	pthread_mutex_lock(&e->lock);
	if (old)
		unpin_locked(e, old);
	for (b = e->buckets[h]; b; b = b->hnext)
		if (b->ck == c->ck && b->shard == s && b->idx == idx)
			break;
	if (b && b->state == BLK_READY && b->map_token &&
	    e->src->ops->map_stale &&
	    e->src->ops->map_stale(e->src->ctx, b->map_token)) {
		/* its bytes may not be the verified ones any more: drop it
		 * (freed with its last pin) and fetch it anew */
		blk_unlink(e, b);
		if (b->refs == 0)
			blk_free(e, b);
		e->st.map_stale++;
		b = NULL;
	}
	if (b && b->state == BLK_READY && b->fid_ok &&
	    (!fid_ok || b->fid != fid)) {
		/* unverified, and its file changed since it was fetched:
		 * dropped and fetched anew (the top of this file) */
		blk_unlink(e, b);
		if (b->refs == 0)
			blk_free(e, b);
		e->st.file_changed++;
		b = NULL;
	}
	if (b) {
		b->refs++;
		while (b->state == BLK_LOADING)
			pthread_cond_wait(&e->cond, &e->lock);
		if (b->state == BLK_FAILED) {
			ret = b->err;
			unpin_locked(e, b);
			pthread_mutex_unlock(&e->lock);
			return ret;
		}
		e->st.hits++;
		if (b->prev) {
			lru_unlink(b);
			lru_push_front(e, b);
		}
		pthread_mutex_unlock(&e->lock);
		goto out_pinned;
	}
	b = calloc(1, sizeof(*b));
	if (!b) {
		pthread_mutex_unlock(&e->lock);
		return -ENOMEM;
	}
	b->ck = c->ck;
	b->shard = s;
	b->idx = idx;
	b->len = (size_t)((s->nbytes - idx * bs) < bs ? s->nbytes - idx * bs : bs);
	b->cap = buf_class(b->len);
	b->state = BLK_LOADING;
	b->refs = 1;
	b->linked = true;
	b->fid = fid;
	b->fid_ok = fid_ok;
	/* Make room first, so the buffer of an evicted block is reused. */
	evict_to(e, e->cap > b->cap ? e->cap - b->cap : 0);
	b->hnext = e->buckets[h];
	e->buckets[h] = b;
	e->cached += b->cap;
	e->st.misses++;
	/* A mapped block takes no pool buffer; its cap counts all the same. */
	b->live = !native(c->m);
	mapped = e->map && s->codec == SF_CODEC_NONE &&
		 b->len >= e->map_min && (!b->live || (e->src->ops->map_live &&
						     (!e->verify || !s->xxh3)));
	ret = mapped ? 0 : blk_alloc(e, b);
	pthread_mutex_unlock(&e->lock);

	if (mapped) {
		ret = fetch_mapped(c, s, idx, b, &hashed, &trusted, &faulted);
		if (ret == -EAGAIN) {
			mapped = b->live = false;
			hashed = false;
			pthread_mutex_lock(&e->lock);
			ret = blk_alloc(e, b);
			pthread_mutex_unlock(&e->lock);
		}
	}
	if (ret == 0 && !mapped)
		ret = fetch(c, s, idx, b, &hashed, &trusted);

	pthread_mutex_lock(&e->lock);
	e->st.hashed += hashed;
	e->st.hash_skips += trusted;
	e->st.mapped += mapped && !b->live && ret == 0;
	e->st.live_mapped += mapped && b->live && ret == 0;
	e->st.map_faults += faulted;
	if (ret < 0) {
		b->state = BLK_FAILED;
		b->err = ret;
		if (ret == -SF_ECHECKSUM)
			e->st.bad_blocks++;
		blk_unlink(e, b);
	} else {
		b->state = BLK_READY;
		e->st.bytes_fetched += b->len;
		lru_push_front(e, b);
		if (e->cached > e->cap)
			evict_to(e, e->cap);
	}
	pthread_cond_broadcast(&e->cond);
	if (ret < 0)
		unpin_locked(e, b);
	pthread_mutex_unlock(&e->lock);
	if (ret < 0) {
		log_block_error(c, s, idx, ret);
		return ret;
	}
out_pinned:
	c->pins[c->next_pin] = b;
	c->next_pin = (c->next_pin + 1) % c->npins;
	*out = b;
	return 0;
}
/* Copy payload bytes [pos, pos+n) of shard s to c->buf + doff, or (keep)
 * append them to c->iov. */
static int copy_payload(struct read_ctx *c, const struct sf_shard *s,
			uint64_t pos, uint64_t doff, uint64_t n)
{
	uint64_t bs = c->m->block_size;

	while (n) {
		struct sf_block *b = NULL;
		uint64_t idx = pos / bs, boff = pos % bs, k;
		int ret = pin(c, s, idx, &b);

		if (ret)
			return ret;
		if (boff >= b->len)
			return -SF_ESHORT; /* past the shard's payload: never loop */
		k = b->len - boff;
		if (k > n)
			k = n;
		if (c->keep) {
			struct iovec *last = c->niov ? &c->iov[c->niov - 1] : NULL;

			if (last && (unsigned char *)last->iov_base +
				    last->iov_len == b->data + boff) {
				last->iov_len += (size_t)k;
			} else if (c->niov == c->maxiov) {
				return -E2BIG;
			} else {
				c->iov[c->niov].iov_base = b->data + boff;
				c->iov[c->niov++].iov_len = (size_t)k;
			}
		} else if (b->live && b->map_token) {
			/* the file shrank under it: as a short read */
			if (sf_map_copy(c->buf + doff, b->data + boff, (size_t)k))
				return -SF_ESHORT;
		} else {
			memcpy(c->buf + doff, b->data + boff, (size_t)k);
		}
		doff += k;
		pos += k;
		n -= k;
	}
	return 0;
}

static int on_segment(void *arg, uint64_t toff, uint64_t voff, uint64_t len)
{
	struct read_ctx *c = arg;
	const struct sf_tensor *t = c->t;
	uint64_t doff = voff - c->base, p = toff, end = toff + len;

	while (p < end) {
		uint64_t pos = 0, run = 0, n;
		size_t i = 0, k;
		int ret;

		for (k = 0; k < t->nshards; k++) {
			i = (c->last + k) % t->nshards;
			if (sf_shard_locate(t, &t->shards[i], p, &pos, &run))
				break;
		}
		if (k == t->nshards) {
			sf_log_once(&read_fail_lim,
				    sf_log_key(c->ck->name, t->name, NULL, -SF_EGAP),
				    SF_LOG_ERROR,
				    "checkpoint %s: tensor %s: no shard covers byte %llu",
				    SF_QSTR(c->ck->name), SF_QSTR(t->name),
				    (unsigned long long)p);
			return -SF_EGAP;
		}
		c->last = i;
		if (run == 0)
			return -SF_EGAP; /* a locate that covers nothing: never loop */
		n = run < end - p ? run : end - p;
		ret = copy_payload(c, &t->shards[i], pos, doff, n);
		if (ret)
			return ret;
		p += n;
		doff += n;
	}
	return 0;
}

/* Walk [off, off+len) of view with c (set up by the caller); pins stay in
 * c->pins. */
static int read_walk(struct read_ctx *c, const struct sf_box *view,
		     uint64_t off, size_t len)
{
	const struct sf_tensor *t = c->t;
	const struct sf_shard *s = sf_shard_of_view(t, view);
	struct sf_box full;

	if (s && off + len <= s->nbytes)
		return copy_payload(c, s, off, off - c->base, len);
	if (!view) {
		sf_box_full(&full, t->ndim, t->shape);
		view = &full;
	}
	return sf_box_runs(t->ndim, t->shape, sf_dtype_size(t->dtype), view,
			   off, len, on_segment, c);
}

/* Drop the pins in pins[0..n) under one lock. */
static void unpin_all(struct sf_engine *e, struct sf_block **pins, unsigned n)
{
	bool any = false;

	for (unsigned i = 0; i < n && !any; i++)
		any = pins[i] != NULL;
	if (!any)
		return;
	pthread_mutex_lock(&e->lock);
	for (unsigned i = 0; i < n; i++)
		if (pins[i])
			unpin_locked(e, pins[i]);
	pthread_mutex_unlock(&e->lock);
}

int sf_engine_read(struct sf_engine *e, const struct sf_ckpt_ref *ck,
		   const struct sf_model *m, const struct sf_tensor *t,
		   const struct sf_box *view, uint64_t off, void *buf,
		   size_t len)
{
	struct sf_block *pins[PINS] = { NULL };
	struct read_ctx c = { .e = e, .ck = ck, .m = m, .t = t, .buf = buf,
			      .base = off, .pins = pins, .npins = PINS };
	int ret;

	if (len == 0)
		return 0;
	if (e->ra)
		sf_ra_note(e->ra, ck, m, t, view, off, len);
	ret = read_walk(&c, view, off, len);
	unpin_all(e, pins, PINS);
	return ret;
}

int sf_engine_readv(struct sf_engine *e, const struct sf_ckpt_ref *ck,
		    const struct sf_model *m, const struct sf_tensor *t,
		    const struct sf_box *view, uint64_t off, size_t len,
		    struct iovec *iov, unsigned maxiov,
		    struct sf_engine_hold *hold)
{
	struct sf_block *pins[SF_ENGINE_HOLD_MAX] = { NULL };
	struct read_ctx c = { .e = e, .ck = ck, .m = m, .t = t, .base = off,
			      .pins = pins, .npins = SF_ENGINE_HOLD_MAX,
			      .keep = true, .iov = iov, .maxiov = maxiov };
	int ret;

	hold->n = 0;
	if (len == 0)
		return 0;
	if (e->ra)
		sf_ra_note(e->ra, ck, m, t, view, off, len);
	ret = read_walk(&c, view, off, len);
	if (ret < 0) {
		unpin_all(e, pins, SF_ENGINE_HOLD_MAX);
		return ret;
	}
	for (unsigned i = 0; i < SF_ENGINE_HOLD_MAX; i++)
		if (pins[i])
			hold->blk[hold->n++] = pins[i];
	return (int)c.niov;
}

void sf_engine_release(struct sf_engine *e, struct sf_engine_hold *hold)
{
	struct sf_block *pins[SF_ENGINE_HOLD_MAX];
	unsigned n = hold->n < SF_ENGINE_HOLD_MAX ? hold->n : SF_ENGINE_HOLD_MAX;

	for (unsigned i = 0; i < n; i++)
		pins[i] = hold->blk[i];
	unpin_all(e, pins, n);
	hold->n = 0;
}

void sf_engine_forget(struct sf_engine *e, const struct sf_ckpt_ref *ck)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->lock);
	for (size_t h = 0; h < e->nbuckets; h++) {
		struct sf_block *b = e->buckets[h], *next;
		for (; b; b = next) {
			next = b->hnext;
			if (b->ck != ck || b->state == BLK_LOADING)
				continue;
			blk_unlink(e, b);
			if (b->refs == 0)
				blk_free(e, b);
		}
	}
	pthread_mutex_unlock(&e->lock);
	pthread_mutex_lock(&e->dec_lock);
	for (struct dec_ent **pp = &e->dec; *pp;) {
		struct dec_ent *d = *pp;

		if (d->ck != ck) {
			pp = &d->next;
			continue;
		}
		*pp = d->next;
		e->dec_bytes -= d->len;
		free(d->data);
		free(d);
	}
	pthread_mutex_unlock(&e->dec_lock);
	sf_vmaps_forget(e->vmaps, ck);
	if (e->ra)
		sf_ra_forget(e->ra, ck);
	if (e->src->ops->forget)
		e->src->ops->forget(e->src->ctx, ck);
}

void sf_engine_stats(struct sf_engine *e, struct sf_engine_stats *out)
{
	pthread_mutex_lock(&e->lock);
	*out = e->st;
	out->cached_bytes = e->cached;
	out->pool_bytes = e->pool_bytes;
	pthread_mutex_unlock(&e->lock);
}

void sf_engine_destroy(struct sf_engine *e)
{
	if (!e)
		return;
	for (size_t h = 0; h < e->nbuckets; h++) {
		struct sf_block *b = e->buckets[h], *next;
		for (; b; b = next) {
			next = b->hnext;
			blk_free(e, b);
		}
	}
	e->cap = 0; /* nothing kept: unmap every free buffer */
	pool_trim(e, 0);
	for (struct dec_ent *d = e->dec, *next; d; d = next) {
		next = d->next;
		free(d->data);
		free(d);
	}
	pthread_mutex_destroy(&e->dec_lock);
	sf_ra_destroy(e->ra);
	sf_vmaps_destroy(e->vmaps);
	free(e->buckets);
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->cond);
	free(e);
}
