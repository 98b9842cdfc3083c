/*
 * test_log.c - the log's escaping and the quoting of names (sf_log_escape,
 * sf_quote_name, sf_utf8_cut, sf_log, sf_log_once) against a naive model.
 *
 * The model decodes UTF-8 by the table of well-formed byte sequences of
 * the Unicode standard (Table 3-7), not by arithmetic, and lists the
 * escaped code points one by one. Checked:
 *   - every code point U+0000..U+10FFFF (surrogates aside), alone and
 *     between ASCII, escaped or passed exactly as the model says;
 *   - every 1- and 2-byte string, and random 3- to 6-byte strings biased to
 *     lead and continuation bytes, byte-exact against the model;
 *   - the quoting of names: a 2-, 3- and 4-byte character and an invalid
 *     byte at every position around the SF_QNAME_MAX cut: never a sequence
 *     cut in half, "..." exactly when input is left, the output always
 *     valid UTF-8 with nothing the model escapes;
 *   - sf_utf8_cut at every prefix length of multi-byte text;
 *   - sf_log to a log file: one line per call whatever the message holds,
 *     a message past the line cap cut at a character boundary;
 *   - sf_log_once: a key logged once per window, another key logged.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sf_log.h"
#include "sf_model.h"
#include "sf_test.h"

#define PROG "test_log"

/* --- the model --- */

/* Table 3-7: the well-formed sequences, first byte range then the ranges
 * of the bytes after it. */
static const struct {
	uint8_t lo, hi;
	int n;
	uint8_t r[3][2];
} wf[] = {
	{ 0x00, 0x7f, 1, { { 0 } } },
	{ 0xc2, 0xdf, 2, { { 0x80, 0xbf } } },
	{ 0xe0, 0xe0, 3, { { 0xa0, 0xbf }, { 0x80, 0xbf } } },
	{ 0xe1, 0xec, 3, { { 0x80, 0xbf }, { 0x80, 0xbf } } },
	{ 0xed, 0xed, 3, { { 0x80, 0x9f }, { 0x80, 0xbf } } },
	{ 0xee, 0xef, 3, { { 0x80, 0xbf }, { 0x80, 0xbf } } },
	{ 0xf0, 0xf0, 4, { { 0x90, 0xbf }, { 0x80, 0xbf }, { 0x80, 0xbf } } },
	{ 0xf1, 0xf3, 4, { { 0x80, 0xbf }, { 0x80, 0xbf }, { 0x80, 0xbf } } },
	{ 0xf4, 0xf4, 4, { { 0x80, 0x8f }, { 0x80, 0xbf }, { 0x80, 0xbf } } },
};

/* Length of the well-formed sequence at p (n bytes there), or 0. */
static int model_seq(const uint8_t *p, size_t n, uint32_t *cp)
{
	for (size_t k = 0; k < sizeof(wf) / sizeof(wf[0]); k++) {
		if (p[0] < wf[k].lo || p[0] > wf[k].hi)
			continue;
		if ((size_t)wf[k].n > n)
			return 0;
		for (int i = 1; i < wf[k].n; i++)
			if (p[i] < wf[k].r[i - 1][0] || p[i] > wf[k].r[i - 1][1])
				return 0;
		/* the code point: the payload bits, by the textbook */
		static const uint8_t mask[5] = { 0, 0x7f, 0x1f, 0x0f, 0x07 };
		uint32_t c = p[0] & mask[wf[k].n];
		for (int i = 1; i < wf[k].n; i++)
			c = c * 64 + (p[i] - 0x80);
		*cp = c;
		return wf[k].n;
	}
	return 0;
}

static bool model_escaped(uint32_t c)
{
	static const uint32_t one[] = { 0x7f, 0x061c, 0x200e, 0x200f, 0x2028,
					0x2029, 0x202a, 0x202b, 0x202c, 0x202d,
					0x202e, 0x2066, 0x2067, 0x2068, 0x2069 };

	if (c <= 0x1f || (c >= 0x80 && c <= 0x9f))
		return true;
	for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); i++)
		if (c == one[i])
			return true;
	return false;
}

/* The model of sf_log_escape with an unbounded output. */
static size_t model_escape(char *out, const uint8_t *s, size_t len,
			   size_t max_in, bool quote, size_t *used)
{
	size_t i = 0, n = 0;

	while (i < len && i < max_in) {
		uint32_t c;
		int k = model_seq(s + i, len - i, &c);

		if (k == 0) {
			n += (size_t)sprintf(out + n, "\\x%02x", s[i]);
			i++;
			continue;
		}
		if (i + (size_t)k > max_in)
			break;
		if (model_escaped(c) || (quote && (c == '"' || c == '\\')))
			n += (size_t)sprintf(out + n, c < 0x80 ? "\\x%02x" : "\\u%04x", c);
		else
			n += (size_t)sprintf(out + n, "%.*s", k, (const char *)s + i);
		i += (size_t)k;
	}
	out[n] = '\0';
	*used = i;
	return n;
}

/* Whether s is valid UTF-8 holding nothing the log escapes. */
static bool clean(const char *s)
{
	const uint8_t *p = (const uint8_t *)s;
	size_t n = strlen(s);

	for (size_t i = 0; i < n;) {
		uint32_t c;
		int k = model_seq(p + i, n - i, &c);

		if (k == 0 || model_escaped(c))
			return false;
		i += (size_t)k;
	}
	return true;
}

static int utf8_enc(uint32_t c, uint8_t *b)
{
	if (c < 0x80) {
		b[0] = (uint8_t)c;
		return 1;
	}
	if (c < 0x800) {
		b[0] = (uint8_t)(0xc0 | (c >> 6));
		b[1] = (uint8_t)(0x80 | (c & 0x3f));
		return 2;
	}
	if (c < 0x10000) {
		b[0] = (uint8_t)(0xe0 | (c >> 12));
		b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
		b[2] = (uint8_t)(0x80 | (c & 0x3f));
		return 3;
	}
	b[0] = (uint8_t)(0xf0 | (c >> 18));
	b[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3f));
	b[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3f));
	b[3] = (uint8_t)(0x80 | (c & 0x3f));
	return 4;
}

/* One string both ways, in both modes; whether all agreed. */
static bool same(const uint8_t *s, size_t len)
{
	char got[64 * 4 + 8], want[64 * 4 + 8];
	size_t ug, uw, ng, nw;
	bool ok = true;

	for (int q = 0; q < 2; q++) {
		ng = sf_log_escape(got, sizeof(got), (const char *)s, len, len,
				   q ? SF_ESC_QUOTE : 0, &ug);
		nw = model_escape(want, s, len, len, q, &uw);
		ok &= ng == nw && ug == uw && strcmp(got, want) == 0 && clean(got);
	}
	return ok;
}

static void test_code_points(void)
{
	unsigned long bad = 0;

	for (uint32_t c = 0; c <= 0x10ffff; c++) {
		uint8_t b[8] = { 'a' };
		int k;

		if (c >= 0xd800 && c <= 0xdfff)
			continue;
		k = utf8_enc(c, b + 1);
		b[k + 1] = 'z';
		if (!same(b + 1, (size_t)k) || !same(b, (size_t)k + 2))
			bad++;
	}
	CHECK_EQ(bad, 0);
	/* the classes by hand too */
	char out[32];
	sf_log_escape(out, sizeof(out), "\xe2\x80\xa8", 3, 3, 0, NULL);
	CHECK(strcmp(out, "\\u2028") == 0);
	sf_log_escape(out, sizeof(out), "\xc2\x85", 2, 2, 0, NULL);
	CHECK(strcmp(out, "\\u0085") == 0);
	sf_log_escape(out, sizeof(out), "\xe2\x80\xae", 3, 3, 0, NULL);
	CHECK(strcmp(out, "\\u202e") == 0);
	sf_log_escape(out, sizeof(out), "\n\x7f", 2, 2, 0, NULL);
	CHECK(strcmp(out, "\\x0a\\x7f") == 0);
	sf_log_escape(out, sizeof(out), "\xed\xa0\x80", 3, 3, 0, NULL);
	CHECK(strcmp(out, "\\xed\\xa0\\x80") == 0); /* a surrogate */
	sf_log_escape(out, sizeof(out), "\"\\", 2, 2, 0, NULL);
	CHECK(strcmp(out, "\"\\") == 0);
	sf_log_escape(out, sizeof(out), "\"\\", 2, 2, SF_ESC_QUOTE, NULL);
	CHECK(strcmp(out, "\\x22\\x5c") == 0);
	sf_log_escape(out, sizeof(out), "\xc3\xa9\xe4\xb8\xad", 5, 5, 0, NULL);
	CHECK(strcmp(out, "\xc3\xa9\xe4\xb8\xad") == 0);
}

static void test_byte_strings(void)
{
	static const uint8_t pick[] = { 0x00, 0x0a, 0x22, 0x41, 0x5c, 0x7f, 0x80,
					0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1,
					0xc2, 0xdf, 0xe0, 0xe1, 0xec, 0xed, 0xee,
					0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5, 0xff };
	unsigned long bad = 0;
	uint8_t b[8];

	for (unsigned x = 0; x < 256; x++) {
		b[0] = (uint8_t)x;
		bad += !same(b, 1);
		for (unsigned y = 0; y < 256; y++) {
			b[1] = (uint8_t)y;
			bad += !same(b, 2);
		}
	}
	for (int i = 0; i < 300000; i++) {
		size_t n = (size_t)sf_rand_range(3, 6);

		for (size_t j = 0; j < n; j++)
			b[j] = sf_rand_below(2) ? pick[sf_rand_below(sizeof(pick))] :
						  (uint8_t)(0x80 + sf_rand_below(0x40));
		bad += !same(b, n);
	}
	CHECK_EQ(bad, 0);
}

/* What sf_quote_name must give: the model, quoted, "..." when cut. */
static void model_quote(char *out, const uint8_t *s, size_t len)
{
	size_t used, n;

	out[0] = '"';
	n = 1 + model_escape(out + 1, s, len, SF_QNAME_MAX, true, &used);
	out[n++] = '"';
	strcpy(out + n, used < len ? "..." : "");
}

static void test_quote_cut(void)
{
	static const char *const chars[] = {
		"\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xe2\x80\xa8",
		"\xc2\x85", "\xe2\x81\xa6", "\xff", "\"", "\n",
	};
	unsigned long bad = 0;

	for (size_t c = 0; c < sizeof(chars) / sizeof(chars[0]); c++) {
		size_t cl = strlen(chars[c]);

		for (size_t pos = 0; pos <= SF_QNAME_MAX + 2; pos++) {
			for (size_t tail = 0; tail < 3; tail++) {
				uint8_t name[SF_QNAME_MAX + 16];
				char got[SF_QNAME_SIZE + 64], want[SF_QNAME_SIZE * 2];
				size_t len = 0;

				memset(name, 'a', pos);
				len = pos;
				memcpy(name + len, chars[c], cl);
				len += cl;
				memset(name + len, 'b', tail);
				len += tail;
				memset(got, 0x5a, sizeof(got));
				const char *r = sf_quote_name(got, (const char *)name, len);
				model_quote(want, name, len);
				bad += r != got || strcmp(got, want) != 0 || !clean(got) ||
				       strlen(got) >= SF_QNAME_SIZE ||
				       (unsigned char)got[SF_QNAME_SIZE] != 0x5a;
				/* the character is either whole or absent: when
				 * it does not fit, the a's before it and "..." */
				bool whole = pos + cl <= SF_QNAME_MAX;
				if (!whole)
					bad += strlen(got) != (pos < SF_QNAME_MAX ? pos : SF_QNAME_MAX) + 5;
			}
		}
	}
	CHECK_EQ(bad, 0);
	char q[SF_QNAME_SIZE];
	CHECK(strcmp(sf_quote_str(q, "w\xe2\x80\xa8x"), "\"w\\u2028x\"") == 0);
	CHECK(strcmp(sf_quote_str(q, NULL), "\"\"") == 0);
	CHECK(strcmp(SF_QSTR("a\"b"), "\"a\\x22b\"") == 0);
}

static void test_cut(void)
{
	const char *s = "a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80z";
	/* the character boundaries of s */
	static const size_t ok[] = { 0, 1, 3, 6, 10, 11 };
	size_t n = strlen(s);

	for (size_t len = 0; len <= n; len++) {
		size_t want = 0;

		for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
			if (ok[i] <= len)
				want = ok[i];
		CHECK_EQ(sf_utf8_cut(s, len), want);
	}
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf = calloc(1, 1 << 20);
	size_t n = f && buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;

	if (f)
		fclose(f);
	if (buf)
		buf[n] = '\0';
	return buf;
}

static size_t count_char(const char *s, char c)
{
	size_t n = 0;

	for (; *s; s++)
		n += *s == c;
	return n;
}

static void test_lines(void)
{
	char path[] = "/tmp/test_log_XXXXXX";
	int fd = mkstemp(path);
	char *text, big[4000];

	if (!CHECK(fd >= 0))
		return;
	close(fd);
	sf_log_setup("t: ", SF_LOG_INFO);
	if (!CHECK_EQ(sf_log_to_file(path), 0))
		goto out_unlink;
	sf_log_detach();
	sf_warn("bad slice %s", "c@1:2:3\xe2\x80\xa8shardfs: error: FORGED\r\n\xc2\x85\xe2\x80\xae\xff");
	text = slurp(path);
	CHECK(text && count_char(text, '\n') == 1);
	CHECK(text && strstr(text, "c@1:2:3\\u2028shardfs: error: FORGED\\x0d\\x0a\\u0085\\u202e\\xff\n"));
	free(text);

	/* past the line cap: cut at a character boundary, one line */
	for (size_t i = 0; i + 3 < sizeof(big); i += 3)
		memcpy(big + i, "\xe4\xb8\xad", 3);
	big[sizeof(big) - 1 - (sizeof(big) - 1) % 3] = '\0';
	for (int shift = 0; shift < 3; shift++) {
		CHECK_EQ(truncate(path, 0), 0);
		sf_info("%.*s%s", shift, "xx", big);
		text = slurp(path);
		if (!CHECK(text && count_char(text, '\n') == 1))
			continue;
		*strchr(text, '\n') = '\0';
		CHECK(clean(text));
		free(text);
	}

	/* once per key */
	static struct sf_log_limit lim;
	CHECK_EQ(truncate(path, 0), 0);
	for (int i = 0; i < 5; i++)
		sf_log_once(&lim, sf_log_key("ck", "w", "f", -5), SF_LOG_ERROR, "read %d", i);
	sf_log_once(&lim, sf_log_key("ck", "w", "f", -22), SF_LOG_ERROR, "other cause");
	sf_log_once(&lim, sf_log_key("ck", "wf", NULL, -5), SF_LOG_ERROR, "other file");
	text = slurp(path);
	CHECK(text && count_char(text, '\n') == 3);
	CHECK(text && strstr(text, "read 0") && !strstr(text, "read 1"));
	CHECK(text && strstr(text, "other cause") && strstr(text, "other file"));
	free(text);
	/* the burst of the call site bounds distinct keys too */
	CHECK_EQ(truncate(path, 0), 0);
	for (int i = 0; i < 3 * SF_LOG_BURST; i++)
		sf_log_once(&lim, sf_log_key("k", NULL, NULL, i), SF_LOG_ERROR, "key %d", i);
	text = slurp(path);
	CHECK(text && count_char(text, '\n') == SF_LOG_BURST - 3);
	free(text);
out_unlink:
	unlink(path);
}

int main(void)
{
	sf_test_seed(PROG, 20261128);
	test_code_points();
	test_byte_strings();
	test_quote_cut();
	test_cut();
	test_lines();
	return sf_test_done(PROG);
}
