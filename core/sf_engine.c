/*
 * sf_engine.c - assembling tensor bytes from shards through a cache of
 * verified checksum blocks.
 *
 * A read of bytes [off, off+len) of a view (a box of a tensor) is walked as
 * tensor-contiguous segments (sf_box_runs). Each byte position p of a
 * segment is served by the first shard that covers it (the last shard used
 * is tried first, so runs of one shard stay cheap); the covering shard's
 * maximal run from p is copied out of whole payload blocks. Blocks are the
 * manifest's checksum blocks: a block enters the cache only after its XXH3
 * matched (when verify is on), so every byte served was verified once.
 *
 * Cache invariants (all under e->lock):
 *  - a block is in the hash table while it is LOADING or READY; a failed or
 *    evicted block is unlinked at once and freed when its last pin goes;
 *  - refs counts pins (readers copying from it, or waiting for it); only
 *    blocks with refs == 0 are evicted, least recently used first;
 *  - cached counts the bytes of blocks linked in the table; it may exceed
 *    cap while many blocks are pinned, and is brought back under cap
 *    whenever a pin is dropped.
 * Fetching and hashing happen outside the lock; concurrent readers of a
 * LOADING block wait on e->cond instead of fetching it twice.
 */
#include "sf_engine.h"
#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum blk_state { BLK_LOADING, BLK_READY, BLK_FAILED };

struct sf_block {
	const struct sf_ckpt_ref *ck;   /* key: checkpoint */
	const struct sf_shard *shard;   /* key: shard (address) */
	uint64_t idx;                   /* key: block index in the shard */
	unsigned char *data;            /* len bytes, owned */
	size_t len;
	enum blk_state state;
	int err;                        /* when FAILED */
	unsigned refs;                  /* pins, under e->lock */
	bool linked;                    /* in the hash table (and LRU if READY) */
	struct sf_block *hnext;         /* hash chain */
	struct sf_block *prev, *next;   /* LRU list, most recent first */
};

struct sf_engine {
	pthread_mutex_t lock;           /* protects everything below */
	pthread_cond_t cond;            /* signalled when a LOADING block settles */
	struct sf_source *src;          /* borrowed */
	bool verify;
	uint64_t cap;                   /* bytes */
	uint64_t cached;                /* bytes of linked blocks */
	struct sf_block **buckets;
	size_t nbuckets;                /* power of two */
	struct sf_block lru;            /* sentinel */
	struct sf_engine_stats st;
};

#define PINS 8 /* blocks one read keeps pinned at a time */

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
	uint64_t cap = opts && opts->cache_bytes ? opts->cache_bytes : 256ull << 20;
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
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->cond, NULL);
	*out = e;
	return 0;
}

static void blk_free(struct sf_block *b)
{
	free(b->data);
	free(b);
}

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
	e->cached -= b->len;
}

/* Evict unpinned blocks, oldest first, until under the cap. Locked. */
static void evict(struct sf_engine *e)
{
	struct sf_block *b = e->lru.prev;

	while (e->cached > e->cap && b != &e->lru) {
		struct sf_block *prev = b->prev;
		if (b->refs == 0) {
			blk_unlink(e, b);
			blk_free(b);
		}
		b = prev;
	}
}

static void unpin(struct sf_engine *e, struct sf_block *b)
{
	pthread_mutex_lock(&e->lock);
	if (--b->refs == 0 && !b->linked)
		blk_free(b);
	else if (e->cached > e->cap)
		evict(e);
	pthread_mutex_unlock(&e->lock);
}

struct read_ctx {
	struct sf_engine *e;
	const struct sf_ckpt_ref *ck;
	const struct sf_manifest *m;
	const struct sf_tensor *t;
	unsigned char *buf;
	uint64_t base;                  /* view offset of buf[0] */
	size_t last;                    /* index of the last shard used */
	struct sf_block *pins[PINS];    /* pinned blocks, round robin */
	unsigned next_pin;
};

static void log_block_error(const struct read_ctx *c, const struct sf_shard *s,
			    uint64_t idx, int err)
{
	sf_err("checkpoint %s: tensor %s: shard %zu (rank %u, file %s) block %llu: %s",
	       c->ck->name, c->t->name, (size_t)(s - c->t->shards), s->rank,
	       s->file, (unsigned long long)idx, sf_strerror(err));
}

/* Fetch a block's bytes and check them. No lock held. */
static int fetch(struct read_ctx *c, const struct sf_shard *s, uint64_t idx,
		 struct sf_block *b)
{
	struct sf_engine *e = c->e;
	uint64_t bs = c->m->block_size;
	int ret;

	b->data = malloc(b->len ? b->len : 1);
	if (!b->data)
		return -ENOMEM;
	ret = e->src->ops->read(e->src->ctx, c->ck, s->rank, s->file,
				s->file_offset + idx * bs, b->data, b->len);
	if (ret < 0)
		return ret;
	if (e->verify && sf_xxh3(b->data, b->len) != s->xxh3[idx])
		return -SF_ECHECKSUM;
	return 0;
}

/* Pin block idx of shard s, fetching it if needed. */
static int pin(struct read_ctx *c, const struct sf_shard *s, uint64_t idx,
	       struct sf_block **out)
{
	struct sf_engine *e = c->e;
	uint64_t bs = c->m->block_size;
	struct sf_block *b;
	size_t h;
	int ret;

	for (unsigned i = 0; i < PINS; i++) {
		b = c->pins[i];
		if (b && b->shard == s && b->idx == idx) {
			*out = b;
			return 0;
		}
	}
	h = hash_key(e, c->ck, s, idx);
	pthread_mutex_lock(&e->lock);
	for (b = e->buckets[h]; b; b = b->hnext)
		if (b->ck == c->ck && b->shard == s && b->idx == idx)
			break;
	if (b) {
		b->refs++;
		while (b->state == BLK_LOADING)
			pthread_cond_wait(&e->cond, &e->lock);
		if (b->state == BLK_FAILED) {
			ret = b->err;
			if (--b->refs == 0 && !b->linked)
				blk_free(b);
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
	b->state = BLK_LOADING;
	b->refs = 1;
	b->linked = true;
	b->hnext = e->buckets[h];
	e->buckets[h] = b;
	e->cached += b->len;
	e->st.misses++;
	pthread_mutex_unlock(&e->lock);

	ret = fetch(c, s, idx, b);

	pthread_mutex_lock(&e->lock);
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
			evict(e);
	}
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	if (ret < 0) {
		log_block_error(c, s, idx, ret);
		unpin(e, b);
		return ret;
	}
out_pinned:
	if (c->pins[c->next_pin])
		unpin(e, c->pins[c->next_pin]);
	c->pins[c->next_pin] = b;
	c->next_pin = (c->next_pin + 1) % PINS;
	*out = b;
	return 0;
}

/* Copy payload bytes [pos, pos+n) of shard s to dst. */
static int copy_payload(struct read_ctx *c, const struct sf_shard *s,
			uint64_t pos, unsigned char *dst, uint64_t n)
{
	uint64_t bs = c->m->block_size;

	while (n) {
		struct sf_block *b = NULL;
		uint64_t idx = pos / bs, boff = pos % bs, k;
		int ret = pin(c, s, idx, &b);

		if (ret)
			return ret;
		k = b->len - boff;
		if (k > n)
			k = n;
		memcpy(dst, b->data + boff, (size_t)k);
		dst += k;
		pos += k;
		n -= k;
	}
	return 0;
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
	return sf_box_locate(t->ndim, t->shape, sf_dtype_size(t->dtype),
			     &s->box, p, pos, run);
}

static int on_segment(void *arg, uint64_t toff, uint64_t voff, uint64_t len)
{
	struct read_ctx *c = arg;
	const struct sf_tensor *t = c->t;
	unsigned char *dst = c->buf + (voff - c->base);
	uint64_t p = toff, end = toff + len;

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
			sf_err("checkpoint %s: tensor %s: no shard covers byte %llu",
			       c->ck->name, t->name, (unsigned long long)p);
			return -SF_EGAP;
		}
		c->last = i;
		n = run < end - p ? run : end - p;
		ret = copy_payload(c, &t->shards[i], pos, dst, n);
		if (ret)
			return ret;
		p += n;
		dst += n;
	}
	return 0;
}

int sf_engine_read(struct sf_engine *e, const struct sf_ckpt_ref *ck,
		   const struct sf_manifest *m, const struct sf_tensor *t,
		   const struct sf_box *view, uint64_t off, void *buf,
		   size_t len)
{
	struct read_ctx c = { .e = e, .ck = ck, .m = m, .t = t, .buf = buf,
			      .base = off };
	struct sf_box full;
	int ret;

	if (len == 0)
		return 0;
	if (!view) {
		sf_box_full(&full, t->ndim, t->shape);
		view = &full;
	}
	ret = sf_box_runs(t->ndim, t->shape, sf_dtype_size(t->dtype), view,
			  off, len, on_segment, &c);
	for (unsigned i = 0; i < PINS; i++)
		if (c.pins[i])
			unpin(e, c.pins[i]);
	return ret;
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
				blk_free(b);
		}
	}
	pthread_mutex_unlock(&e->lock);
	if (e->src->ops->forget)
		e->src->ops->forget(e->src->ctx, ck);
}

void sf_engine_stats(struct sf_engine *e, struct sf_engine_stats *out)
{
	pthread_mutex_lock(&e->lock);
	*out = e->st;
	out->cached_bytes = e->cached;
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
			blk_free(b);
		}
	}
	free(e->buckets);
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->cond);
	free(e);
}
