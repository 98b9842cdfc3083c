/*
 * sf_budget.c - a checkpoint open's budget and its decoded-once streams
 * (sf_budget.h).
 *
 * Invariants: decoded never passes the decode allowance (a decode is
 * given the room left as its cap, and one that would pass it spends the
 * budget instead); once spent, every charge and check answers -SF_EBUDGET
 * and why holds the first reason; a stream's record is kept only when
 * the budget survived its decode; records sit in an array of pointers
 * (the struct sf_stream handed out never moves) found through an
 * open-addressing table of at most MAX_RECS entries, at most half full.
 */
#include "sf_budget.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sf_array.h"
#include "sf_error.h"

#define MAX_RECS (4u << 20)   /* streams one open may decode: as many as
				* a DCP open's storage entries */
#define WHY_MAX 256
#define GIB (1ull << 30)

struct rec {
	char *file;                       /* owned copy */
	uint64_t off, len;
	enum sf_codec codec;
	const struct sf_stream_reader *rd;
	uint64_t hash;
	struct sf_stream st;
};

struct sf_budget {
	struct sf_budget_limits lim;
	uint64_t start_ns;                /* CLOCK_MONOTONIC */
	struct sf_budget_stats s;
	bool spent;
	bool timed_out;                   /* spent by the time budget */
	char why[256];
	struct rec **recs;                /* nrec, each owned */
	size_t nrec, caprec;
	uint32_t *slot;                   /* nslot (a power of two): rec+1, 0 free */
	size_t nslot;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
	return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

void sf_budget_limits_default(struct sf_budget_limits *out)
{
	out->decoded_base = SF_BUDGET_DECODED_BASE;
	out->decoded_ratio = SF_BUDGET_DECODED_RATIO;
	out->time_base_ns = SF_BUDGET_TIME_BASE_NS;
	out->time_per_gib_ns = SF_BUDGET_TIME_PER_GIB_NS;
}

struct sf_budget *sf_budget_new(const struct sf_budget_limits *lim)
{
	struct sf_budget *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	if (lim)
		b->lim = *lim;
	else
		sf_budget_limits_default(&b->lim);
	b->start_ns = now_ns();
	return b;
}

static const char no_why[] = "";
static const char why_nomem[] = "out of memory";

static void rec_free(struct rec *r)
{
	if (!r)
		return;
	if (r->st.why != no_why && r->st.why != why_nomem)
		free((char *)r->st.why);
	if (r->st.note) {
		if (r->rd && r->rd->free_note)
			r->rd->free_note(r->st.note);
		else
			free(r->st.note);
	}
	free(r->file);
	free(r);
}

void sf_budget_free(struct sf_budget *b)
{
	if (!b)
		return;
	for (size_t i = 0; i < b->nrec; i++)
		rec_free(b->recs[i]);
	free(b->recs);
	free(b->slot);
	free(b);
}

/* "1.5 GiB", "8.0 KiB", "17 B" */
static void human(char *buf, size_t n, uint64_t v)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double x = (double)v;
	unsigned u = 0;

	while (x >= 1024.0 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		x /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%llu B", (unsigned long long)v);
	else
		snprintf(buf, n, "%.1f %s", x, unit[u]);
}

static uint64_t decode_allowance(const struct sf_budget *b, uint64_t coded)
{
	uint64_t granted = coded < b->s.file_bytes ? coded : b->s.file_bytes;

	return sat_add(b->lim.decoded_base, sat_mul(granted, b->lim.decoded_ratio));
}

static uint64_t time_allowance(const struct sf_budget *b)
{
	double more = (double)b->s.file_bytes / (double)GIB *
		      (double)b->lim.time_per_gib_ns;

	return more >= 1.8e19 ? UINT64_MAX :
	       sat_add(b->lim.time_base_ns, (uint64_t)more);
}

static int spend_decoded(struct sf_budget *b, uint64_t tried)
{
	char d[32], base[32], coded[32];

	b->spent = true;
	human(d, sizeof(d), tried);
	human(base, sizeof(base), b->lim.decoded_base);
	human(coded, sizeof(coded), b->s.coded);
	snprintf(b->why, sizeof(b->why),
		 "decode budget spent: more than %s decoded (the budget: %s plus %u times the %s of coded bytes read)",
		 d, base, b->lim.decoded_ratio, coded);
	return -SF_EBUDGET;
}

int sf_budget_check(struct sf_budget *b)
{
	uint64_t el, allow;
	char fb[32];

	if (!b)
		return 0;
	if (b->spent)
		return -SF_EBUDGET;
	el = now_ns() - b->start_ns;
	allow = time_allowance(b);
	if (el <= allow)
		return 0;
	b->spent = true;
	b->timed_out = true;
	human(fb, sizeof(fb), b->s.file_bytes);
	snprintf(b->why, sizeof(b->why),
		 "time budget spent: %.1f s (the budget: %.0f s plus %.1f s per GiB of the %s of files opened)",
		 (double)el / 1e9, (double)b->lim.time_base_ns / 1e9,
		 (double)b->lim.time_per_gib_ns / 1e9, fb);
	return -SF_EBUDGET;
}

bool sf_budget_timed_out(const struct sf_budget *b)
{
	return b && b->timed_out;
}

int sf_budget_charge_file(struct sf_budget *b, uint64_t size)
{
	if (!b)
		return 0;
	if (b->spent)
		return -SF_EBUDGET;
	b->s.files++;
	b->s.file_bytes = sat_add(b->s.file_bytes, size);
	return sf_budget_check(b);
}

int sf_budget_charge_decoded(struct sf_budget *b, uint64_t coded,
			     uint64_t decoded)
{
	uint64_t tried;

	if (!b)
		return 0;
	if (b->spent)
		return -SF_EBUDGET;
	b->s.coded = sat_add(b->s.coded, coded);
	tried = sat_add(b->s.decoded, decoded);
	if (tried > decode_allowance(b, b->s.coded)) {
		b->s.decoded = decode_allowance(b, b->s.coded);
		return spend_decoded(b, tried);
	}
	b->s.decoded = tried;
	return sf_budget_check(b);
}

uint64_t sf_budget_room(const struct sf_budget *b, uint64_t coded)
{
	uint64_t allow;

	if (!b)
		return UINT64_MAX;
	if (b->spent)
		return 0;
	allow = decode_allowance(b, sat_add(b->s.coded, coded));
	return allow > b->s.decoded ? allow - b->s.decoded : 0;
}

bool sf_budget_spent(const struct sf_budget *b)
{
	return b && b->spent;
}

const char *sf_budget_why(const struct sf_budget *b)
{
	return b && b->spent ? b->why : "";
}

void sf_budget_stats(const struct sf_budget *b, struct sf_budget_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!b)
		return;
	*out = b->s;
	out->elapsed_ns = now_ns() - b->start_ns;
}

/* --- decoded once --- */

static uint64_t key_hash(const char *file, uint64_t off, uint64_t len,
			 enum sf_codec c, const struct sf_stream_reader *rd)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	uint64_t w[4] = { off, len, (uint64_t)c, (uint64_t)(uintptr_t)rd };

	for (const unsigned char *p = (const unsigned char *)file; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	for (size_t i = 0; i < sizeof(w); i++)
		h = (h ^ ((const unsigned char *)w)[i]) * 1099511628211ull;
	return h;
}

static struct rec *find(const struct sf_budget *b, uint64_t h, const char *file,
			uint64_t off, uint64_t len, enum sf_codec c,
			const struct sf_stream_reader *rd)
{
	if (!b->nslot)
		return NULL;
	for (size_t i = h & (b->nslot - 1);; i = (i + 1) & (b->nslot - 1)) {
		struct rec *r;

		if (!b->slot[i])
			return NULL;
		r = b->recs[b->slot[i] - 1];
		if (r->hash == h && r->off == off && r->len == len &&
		    r->codec == c && r->rd == rd && strcmp(r->file, file) == 0)
			return r;
	}
}

static void place(struct sf_budget *b, size_t idx)
{
	size_t i = b->recs[idx]->hash & (b->nslot - 1);

	while (b->slot[i])
		i = (i + 1) & (b->nslot - 1);
	b->slot[i] = (uint32_t)idx + 1;
}

/* Keep r (owned from now on, freed on failure). 0, -SF_ETOOBIG, -ENOMEM. */
static int insert(struct sf_budget *b, struct rec *r)
{
	int rc = sf_array_grow(&b->recs, b->nrec, &b->caprec, sizeof(*b->recs),
			       16, MAX_RECS);

	if (rc) {
		rec_free(r);
		return rc;
	}
	if (2 * (b->nrec + 1) > b->nslot) {
		size_t n = b->nslot ? 2 * b->nslot : 64;
		uint32_t *s = calloc(n, sizeof(*s));

		if (!s) {
			rec_free(r);
			return -ENOMEM;
		}
		free(b->slot);
		b->slot = s;
		b->nslot = n;
		for (size_t i = 0; i < b->nrec; i++)
			place(b, i);
	}
	b->recs[b->nrec++] = r;
	place(b, b->nrec - 1);
	return 0;
}

/* Read, decode and read r's stream into r->st, the reason into why. 0,
 * -SF_EBUDGET, -ENOMEM. */
static int run(struct sf_budget *b, struct rec *r, const struct sf_input *in,
	       size_t cap, char *why)
{
	struct sf_stream *st = &r->st;
	uint64_t room = sf_budget_room(b, in->size);
	size_t ccap = room < cap ? (size_t)room : cap;
	void *stored, *dec = NULL;
	size_t declen = 0;
	int rc;

	if (in->size > SF_MAX_STORED) {
		snprintf(why, WHY_MAX, "%llu stored bytes exceed the limit of %llu",
			 (unsigned long long)in->size, SF_MAX_STORED);
		st->rc = -SF_ETOOBIG;
		return 0;
	}
	stored = malloc(in->size ? (size_t)in->size : 1);
	if (!stored)
		return -ENOMEM;
	rc = sf_input_read(in, stored, (size_t)in->size, 0);
	if (rc) {
		snprintf(why, WHY_MAX, "%s", sf_strerror(rc));
		st->rc = rc == -SF_ESHORT ? -EIO : rc;
		free(stored);
		return rc == -ENOMEM ? rc : 0;
	}
	b->s.decodes++;
	rc = sf_codec_decode_alloc(r->codec, stored, (size_t)in->size, ccap,
				   &dec, &declen, why, WHY_MAX);
	free(stored);
	if (rc == -SF_ETOOBIG && ccap < cap) {
		/* the budget's room, not the stream's cap, stopped it */
		b->s.coded = sat_add(b->s.coded, in->size);
		b->s.decoded += declen;
		return spend_decoded(b, sat_add(b->s.decoded, 1));
	}
	if (rc == -ENOMEM)
		return rc;
	/* failed decodes spend too: their work was done, and at least the
	 * stored bytes read (so naming many ranges of one big file that all
	 * fail at once still spends the budget) */
	if (rc && declen < in->size)
		declen = (size_t)in->size;
	if (sf_budget_charge_decoded(b, in->size, declen)) {
		free(dec);
		return -SF_EBUDGET;
	}
	if (rc) {
		st->rc = rc;
		return 0;
	}
	st->decoded = true;
	st->declen = declen;
	if (r->rd)
		st->rc = r->rd->read(dec, declen, &st->note, why, WHY_MAX);
	free(dec);
	if (st->rc == -ENOMEM)
		return -ENOMEM;
	return sf_budget_check(b);
}

int sf_budget_decode(struct sf_budget *b, enum sf_codec c, const char *file,
		     uint64_t off, const struct sf_input *in, size_t cap,
		     const struct sf_stream_reader *rd,
		     const struct sf_stream **out)
{
	uint64_t h = key_hash(file, off, in->size, c, rd);
	char why[WHY_MAX] = "";
	struct rec *r;
	int rc;

	*out = NULL;
	rc = sf_budget_check(b);
	if (rc)
		return rc;
	r = find(b, h, file, off, in->size, c, rd);
	if (r) {
		b->s.shared++;
		*out = &r->st;
		return 0;
	}
	r = calloc(1, sizeof(*r));
	if (!r || !(r->file = strdup(file))) {
		free(r);
		return -ENOMEM;
	}
	r->off = off;
	r->len = in->size;
	r->codec = c;
	r->rd = rd;
	r->hash = h;
	r->st.why = no_why;
	rc = run(b, r, in, cap, why);
	if (!rc && r->st.rc) {
		r->st.why = strdup(why[0] ? why : sf_strerror(r->st.rc));
		if (!r->st.why)
			r->st.why = why_nomem;
	}
	if (rc) {
		rec_free(r);
		return rc;
	}
	rc = insert(b, r);
	if (rc == -SF_ETOOBIG) {
		/* more streams than any open decodes */
		b->spent = true;
		snprintf(b->why, sizeof(b->why),
			 "decode budget spent: more than %u coded streams", MAX_RECS);
		return -SF_EBUDGET;
	}
	if (rc)
		return rc;
	*out = &r->st;
	return 0;
}
