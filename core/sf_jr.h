/*
 * sf_jr.h - a streaming JSON reader: the read-side counterpart of sf_jw.
 * No tree: the caller walks the document value by value, and the text is
 * read through a bounded window, so a 170 MB manifest of a million shards
 * costs a 1 MiB window instead of the text plus a jansson tree of it
 * (about ten times the text).
 *
 * It accepts exactly what jansson's json_loadb(JSON_REJECT_DUPLICATES |
 * JSON_ALLOW_NUL) accepts (the manifests' earlier parser): strict JSON,
 * UTF-8 checked everywhere (no overlongs, surrogates or code points past
 * U+10FFFF), escapes with UTF-16 surrogate pairs, \u0000 inside strings
 * but never in object keys, integers within int64 ("too big integer"
 * otherwise), reals that do not overflow a double, at most 2048 nested
 * values, an object or array at the top and nothing but white space
 * after it. Duplicate keys are refused where the caller asks (sf_jr_keys)
 * and always inside values it skips. Messages read "invalid JSON at line
 * L column C: what" (column in bytes).
 *
 * Errors are sticky: after the first, every call returns it. A string
 * value or key returned points into the window or the reader's scratch
 * buffer and stays valid only until the next call on the reader.
 *
 * Use: sf_jr_init, sf_jr_top (must be '{' or '['), then per container
 * sf_jr_obj_begin + sf_jr_obj_next (key, then exactly one value read
 * with one of sf_jr_peek's kinds) until it returns 0, likewise for arrays;
 * sf_jr_end once the top value is read; sf_jr_free.
 */
#ifndef SF_JR_H
#define SF_JR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sf_io.h"

#define SF_JR_MAX_DEPTH 2048         /* nested values, as jansson */
#define SF_JR_WINDOW (1u << 20)      /* bytes read at a time from a file */

/* The kind of the next value (sf_jr_peek). */
enum sf_jr_kind {
	SF_JR_OBJECT = '{',
	SF_JR_ARRAY = '[',
	SF_JR_STRING = '"',
	SF_JR_NUMBER = '0',
	SF_JR_TRUE = 't',
	SF_JR_FALSE = 'f',
	SF_JR_NULL = 'n',
};

/* A number. integer: a JSON integer (no fraction or exponent) within
 * int64; neg: it had a '-' sign ("-0" is the integer 0). u: its magnitude
 * (integers only). */
struct sf_jr_num {
	bool integer;
	bool neg;
	uint64_t u;
};

struct sf_jr {
	struct sf_input in;      /* the text (borrowed) */
	const unsigned char *buf; /* window: in.mem, or win */
	unsigned char *win;      /* owned window (file input), SF_JR_WINDOW+ */
	size_t wcap;             /* bytes of win */
	uint64_t base;           /* input offset of buf[0] */
	size_t pos, lim;         /* buf[pos..lim) is read, not consumed */
	size_t pin;              /* with pinned: keep buf[pin..) on refill */
	bool pinned;
	uint64_t line;           /* 1-based line of pos, for messages */
	uint64_t line_start;     /* input offset where that line starts */
	unsigned depth;          /* open containers */
	char *sbuf;              /* owned: decoded string values, real numbers */
	size_t slen, scap;
	char *kbuf;              /* owned: decoded keys */
	size_t klen, kcap;
	int pend;                /* a number or literal lexed by sf_jr_peek
				  * and not consumed yet (its kind), or 0 */
	uint64_t pend_off;       /* its input offset */
	struct sf_jr_num num;    /* pend == SF_JR_NUMBER: its value */
	int err;                 /* first error (negative), sticky */
	char *msg;               /* the caller's message buffer (may be NULL) */
	size_t msglen;
};

/* A string or key: len bytes at s (may hold NUL bytes for values). */
struct sf_jr_str {
	const char *s;
	size_t len;
};

/* Iteration state of one object or array (zeroed by *_begin). */
struct sf_jr_it {
	bool started;
};

/* Read the text in (borrowed: it must outlive the reader); messages go to
 * msg (msglen bytes, may be NULL). 0 or -ENOMEM. */
int sf_jr_init(struct sf_jr *r, const struct sf_input *in, char *msg,
	       size_t msglen);
/* The same with a window of `window` bytes (>= 1; tests use tiny ones). */
int sf_jr_init_window(struct sf_jr *r, const struct sf_input *in,
		      size_t window, char *msg, size_t msglen);
void sf_jr_free(struct sf_jr *r); /* accepts a zeroed reader */

/* The top value must be an object or an array: its kind, or the error. */
int sf_jr_top(struct sf_jr *r);
/* After the top value: only white space may follow. 0 or the error. */
int sf_jr_end(struct sf_jr *r);

/* The kind of the next value (white space skipped, nothing consumed), or
 * a negative error (bad token, end of input, too deep). */
int sf_jr_peek(struct sf_jr *r);

/* Consume '{' (resp. '['). 0 or the error. */
int sf_jr_obj_begin(struct sf_jr *r, struct sf_jr_it *it);
int sf_jr_arr_begin(struct sf_jr *r, struct sf_jr_it *it);
/* The next key and its ':' (1), or the closing '}' consumed (0), or the
 * error. A key never holds a NUL byte. */
int sf_jr_obj_next(struct sf_jr *r, struct sf_jr_it *it, struct sf_jr_str *key);
/* 1: an element follows (read it next); 0: ']' consumed; or the error. */
int sf_jr_arr_next(struct sf_jr *r, struct sf_jr_it *it);

/* For lists of checksums, inside an array being iterated: consume the
 * next elements (at most max) as long as each is a string of exactly 16
 * lowercase hex digits (sf_xxh3_parse's form) after a ',' and spaces,
 * their values into out. Returns how many; 0 when the next element is
 * anything else, or the array ends (sf_jr_arr_next then goes on). */
size_t sf_jr_arr_hex64s(struct sf_jr *r, struct sf_jr_it *it, uint64_t *out,
			size_t max);

/* Read a string value (decoded), a number, or skip any value (checked as
 * the reader checks everything, duplicate keys included). 0 or the
 * error; -SF_EMANIFEST with a message when the value is of another kind
 * is never returned by these: check sf_jr_peek first. */
int sf_jr_string(struct sf_jr *r, struct sf_jr_str *out);
int sf_jr_number(struct sf_jr *r, struct sf_jr_num *out);
int sf_jr_skip(struct sf_jr *r);

/* Input offset of the next unconsumed byte (after sf_jr_peek: where the
 * next value starts). */
uint64_t sf_jr_offset(const struct sf_jr *r);

/* Fail with "invalid JSON at line L column C: <fmt>" (sticky). Returns
 * -SF_EMANIFEST, or the earlier error. */
int sf_jr_fail(struct sf_jr *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * The keys of one object, for refusing duplicates: each key is copied, so
 * keys need not outlive the call. Small objects compare linearly, larger
 * ones through a hash table. Grows with the object (bounded by the input).
 */
struct sf_jr_key {
	uint64_t hash;          /* sf_xxh3 of the key */
	size_t off, len;        /* its bytes in text */
};
struct sf_jr_keys {
	char *text;             /* owned: the keys' bytes, one after another */
	size_t tlen, tcap;
	struct sf_jr_key *ent;  /* owned: the keys in order */
	size_t n, cap;
	uint32_t *slots;        /* owned: open addressing, key index + 1 (0:
				 * free); NULL while n <= SF_JR_KEYS_LINEAR */
	size_t nslots;          /* power of two, >= 2 * n */
};
#define SF_JR_KEYS_LINEAR 8
/* Add key s[0..len): 0; 1 when it is already there; -ENOMEM. */
int sf_jr_keys_add(struct sf_jr_keys *k, const char *s, size_t len);
void sf_jr_keys_free(struct sf_jr_keys *k); /* accepts zeroed; leaves it zeroed */

#endif
