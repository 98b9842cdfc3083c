/*
 * sf_budget.h - what one checkpoint's open may spend, and the coded
 * streams it decodes, each once.
 *
 * Part of the format seam: sf_format_open (sf_format.h) gives every
 * adapter's open one budget through struct sf_cdir (cd->budget), and
 * sf_cfile_open, the pickle reader (sf_pickle_opts.budget) and
 * sf_budget_decode charge it. An adapter checks it (sf_budget_check) in
 * every loop whose length its input chooses (one turn per metadata entry)
 * and passes -SF_EBUDGET up unchanged: never "leave one entry out and go
 * on", since every later charge fails the same way. Once the budget is
 * spent it stays spent, the open fails with -SF_EBUDGET and
 * sf_format_open replaces its reason with the budget's one line
 * (sf_budget_why: which budget, and how much was spent).
 *
 * Two budgets, each a base plus a share of the bytes the checkpoint's own
 * files hold (what an adapter opened through sf_cfile_open), so that a
 * real checkpoint, however large, never reaches them, while bytes a
 * hostile one names over and over do not count twice:
 *  - bytes decoded: decoded_base plus decoded_ratio times the coded bytes
 *    read (at most the bytes of the files opened). A real zstd checkpoint
 *    decodes to 1-3 times what it stores; a zstd bomb (8 KB decoding to
 *    240 MB) is stopped once decoded_base is spent, in the decode that
 *    crosses it. A stream that fails to decode counts what it decoded,
 *    and at least its stored bytes.
 *  - wall-clock time since sf_budget_new: time_base_ns plus time_per_gib_ns
 *    for every GiB of files opened.
 * Defaults (SF_BUDGET_*): 1 GiB + 16 x coded bytes, 60 s + 1 s/GiB.
 * Measured: the committed fixtures open in 5-70 ms (shardctl info, process
 * start included) and decode at most 82 KB (torch 2.15's zstd save: 11
 * streams from 7 KB); a 10,000-tensor DCP checkpoint opens in 0.38 s
 * (README, benchmarks); a 240 MiB stream decodes in about 0.3 s. A zstd
 * bomb's open stops after about 1 s.
 *
 * Decoded once: sf_budget_decode keeps, for the open's duration, what
 * decoding each stream gave (its outcome, its decoded size, and what a
 * reader made of its bytes), keyed by (file, offset, stored length, codec,
 * reader); every later entry naming the same stream gets that record
 * without a decode. The decoded bytes themselves are freed at once.
 *
 * Not thread-safe: one open, one thread. A NULL budget is accepted by
 * every function but sf_budget_decode and spends nothing (unbounded).
 */
#ifndef SF_BUDGET_H
#define SF_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_codec.h"
#include "sf_io.h"

#define SF_BUDGET_DECODED_BASE (1ull << 30)
#define SF_BUDGET_DECODED_RATIO 16u
#define SF_BUDGET_TIME_BASE_NS (60ull * 1000000000ull)
#define SF_BUDGET_TIME_PER_GIB_NS (1ull * 1000000000ull)

struct sf_budget_limits {
	uint64_t decoded_base;    /* bytes any open may decode */
	uint32_t decoded_ratio;   /* plus this many per coded byte read */
	uint64_t time_base_ns;    /* wall clock any open may take */
	uint64_t time_per_gib_ns; /* plus this per GiB of files opened */
};

/* What an open spent (sf_budget_stats). */
struct sf_budget_stats {
	uint64_t decoded;         /* bytes decoded */
	uint64_t coded;           /* coded (stored) bytes read to decode them */
	uint64_t files;           /* files opened (sf_budget_charge_file) */
	uint64_t file_bytes;      /* their sizes */
	uint64_t decodes;         /* streams decoded (sf_budget_decode) */
	uint64_t shared;          /* sf_budget_decode calls answered from a
				   * stream decoded before */
	uint64_t elapsed_ns;      /* since sf_budget_new */
};

struct sf_budget;

/* The defaults above into *out. */
void sf_budget_limits_default(struct sf_budget_limits *out);

/* A budget whose clock starts now; lim NULL: the defaults (copied). NULL
 * when out of memory. Free with sf_budget_free (accepts NULL), which
 * frees every record and note sf_budget_decode kept. */
struct sf_budget *sf_budget_new(const struct sf_budget_limits *lim);
void sf_budget_free(struct sf_budget *b);

/* 0 while b is within both budgets; else -SF_EBUDGET (from then on). */
int sf_budget_check(struct sf_budget *b);

/* A file of size bytes was opened: counted, its bytes widen both
 * budgets; then as sf_budget_check. */
int sf_budget_charge_file(struct sf_budget *b, uint64_t size);

/* decoded bytes came out of coded bytes read, by a decoder outside
 * sf_budget_decode: charged; then as sf_budget_check. */
int sf_budget_charge_decoded(struct sf_budget *b, uint64_t coded,
			     uint64_t decoded);

/* The bytes b lets a decode of coded more bytes produce: the most the
 * decoder may be given as its cap (UINT64_MAX for NULL). */
uint64_t sf_budget_room(const struct sf_budget *b, uint64_t coded);

bool sf_budget_spent(const struct sf_budget *b);
/* Spent by the time budget (not by bytes decoded)? */
bool sf_budget_timed_out(const struct sf_budget *b);
/* Once spent: one line saying which budget and how much ("decode budget
 * spent: ..." or "time budget spent: ..."); else "". Valid until
 * sf_budget_free. */
const char *sf_budget_why(const struct sf_budget *b);
void sf_budget_stats(const struct sf_budget *b, struct sf_budget_stats *out);

/* What a reader keeps of a stream's decoded bytes before they are freed. */
struct sf_stream_reader {
	/* Read bytes[0..len) into *note (left NULL: nothing kept). 0, or an
	 * error with a one-line reason in why. */
	int (*read)(const void *bytes, size_t len, void **note, char *why,
		    size_t whylen);
	void (*free_note)(void *note); /* NULL: free() */
};

/* What decoding one stream gave. Owned by the budget, valid until
 * sf_budget_free. */
struct sf_stream {
	bool decoded;             /* the stream decoded; rc is the reader's */
	int rc;                   /* 0; without decoded: -EIO (corrupt,
				   * truncated or followed by junk, or its
				   * bytes could not be read), -SF_ETOOBIG
				   * (stored or decoded past the cap);
				   * with decoded: the reader's error */
	uint64_t declen;          /* with decoded: bytes it decodes to */
	void *note;               /* with decoded and rc 0: the reader's */
	const char *why;          /* with rc: the one-line reason; else "" */
};

/*
 * The stream of in->size bytes stored at off of file (read through in)
 * with codec c, decoded at most once per budget: the first call for a
 * (file, off, in->size, c, rd) reads and decodes it (at most cap bytes,
 * and no more than the budget's room), runs rd (may be NULL) on the
 * bytes, frees them and keeps the outcome; a later call answers that
 * outcome. 0 and *out; -SF_EBUDGET when b is spent (before, or by this
 * decode: nothing kept); -ENOMEM. b must not be NULL.
 */
int sf_budget_decode(struct sf_budget *b, enum sf_codec c, const char *file,
		     uint64_t off, const struct sf_input *in, size_t cap,
		     const struct sf_stream_reader *rd,
		     const struct sf_stream **out);

#endif
