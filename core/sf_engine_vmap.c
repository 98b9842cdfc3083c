/*
 * sf_engine_vmap.c - the engine's maps of verified blocks
 * (sf_engine_vmap.h), moved out of sf_engine.c unchanged.
 *
 * One map per (checkpoint, shard) key, in VMAP_BUCKETS hash chains, at
 * most SF_VMAPS_MAX of them; each holds the shard's nblocks bits and the
 * file identity they were set under. Everything under v->lock, which is
 * a leaf: nothing is called with it held.
 */
#include "sf_engine_vmap.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define VMAP_BUCKETS 4096u      /* hash chains */

/* The blocks of one shard that matched their XXH3, and the identity of
 * the shard's file when they did (struct sf_source_ops.file_id). */
struct vmap {
	const void *ck;                 /* key: checkpoint */
	const struct sf_shard *shard;   /* key: shard (address) */
	uint64_t id;                    /* the file's identity for these bits */
	struct vmap *next;              /* hash chain */
	uint64_t bits[];                /* bit i: block i verified; the
					 * shard's nblocks bits */
};

struct sf_vmaps {
	pthread_mutex_t lock;           /* protects everything below */
	struct vmap *chains[VMAP_BUCKETS];
	size_t n;                       /* maps in the chains */
};

int sf_vmaps_create(struct sf_vmaps **out)
{
	struct sf_vmaps *v = calloc(1, sizeof(*v));

	if (!v)
		return -ENOMEM;
	pthread_mutex_init(&v->lock, NULL);
	*out = v;
	return 0;
}

void sf_vmaps_destroy(struct sf_vmaps *v)
{
	if (!v)
		return;
	sf_vmaps_forget(v, NULL);
	pthread_mutex_destroy(&v->lock);
	free(v);
}

static size_t vmap_hash(const void *ck, const void *shard)
{
	uint64_t h = (uint64_t)(uintptr_t)ck * 0x9E3779B97F4A7C15ull ^
		     (uint64_t)(uintptr_t)shard * 0xC2B2AE3D27D4EB4Full;

	return (size_t)(h ^ h >> 31) % VMAP_BUCKETS;
}

/* The map of shard s, or NULL. Locked. */
static struct vmap *vmap_find(struct sf_vmaps *v, const void *ck,
			      const struct sf_shard *s)
{
	struct vmap *m = v->chains[vmap_hash(ck, s)];

	while (m && (m->ck != ck || m->shard != s))
		m = m->next;
	return m;
}

bool sf_vmaps_test(struct sf_vmaps *v, const void *ck,
		   const struct sf_shard *s, uint64_t idx, uint64_t id)
{
	struct vmap *m;
	bool yes;

	pthread_mutex_lock(&v->lock);
	m = vmap_find(v, ck, s);
	yes = m && m->id == id && (m->bits[idx / 64] >> (idx % 64) & 1);
	pthread_mutex_unlock(&v->lock);
	return yes;
}

void sf_vmaps_set(struct sf_vmaps *v, const void *ck,
		  const struct sf_shard *s, uint64_t idx, uint64_t id)
{
	size_t words = (size_t)((s->nblocks + 63) / 64);
	struct vmap *m;

	pthread_mutex_lock(&v->lock);
	m = vmap_find(v, ck, s);
	if (!m && v->n < SF_VMAPS_MAX &&
	    (m = calloc(1, sizeof(*m) + words * sizeof(m->bits[0])))) {
		size_t h = vmap_hash(ck, s);

		m->ck = ck;
		m->shard = s;
		m->id = id;
		m->next = v->chains[h];
		v->chains[h] = m;
		v->n++;
	}
	if (m) {
		if (m->id != id) {
			memset(m->bits, 0, words * sizeof(m->bits[0]));
			m->id = id;
		}
		m->bits[idx / 64] |= 1ull << (idx % 64);
	}
	pthread_mutex_unlock(&v->lock);
}

void sf_vmaps_forget(struct sf_vmaps *v, const void *ck)
{
	if (!v)
		return;
	pthread_mutex_lock(&v->lock);
	for (size_t h = 0; h < VMAP_BUCKETS; h++) {
		for (struct vmap **pp = &v->chains[h]; *pp;) {
			struct vmap *m = *pp;

			if (ck && m->ck != ck) {
				pp = &m->next;
				continue;
			}
			*pp = m->next;
			free(m);
			v->n--;
		}
	}
	pthread_mutex_unlock(&v->lock);
}
