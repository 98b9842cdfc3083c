/*
 * fuzz_log.c - libFuzzer target for the log's escaping and the quoting of
 * names (sf_log_escape, sf_utf8_cut, sf_quote_name; core/sf_log.c,
 * core/sf_where.c).
 *
 * Input: byte 0 picks the output cap (1..255, or 0: unbounded) and the
 * mode (bit 7: SF_ESC_QUOTE), byte 1 the input cap max_in (0: the whole
 * input); the rest is the text. For any input:
 *   - sf_log_escape writes at most cap bytes, NUL-terminated, returns the
 *     length written and consumes a prefix of the input that ends on a
 *     character boundary (never inside a valid UTF-8 sequence), at most
 *     max_in bytes; its output is valid UTF-8 holding no control character
 *     (C0, DEL, C1), no U+2028/U+2029 and no bidi control, and, in quote
 *     mode, no '"'; unescaping it (\xNN and \uNNNN; a backslash otherwise
 *     stands for itself in log mode) gives back exactly the bytes consumed;
 *   - unbounded, it consumes everything (up to max_in, less only the bytes
 *     of a sequence that would cross max_in);
 *   - sf_utf8_cut never cuts more than 3 bytes and leaves no incomplete
 *     sequence at the end;
 *   - sf_quote_name stays inside SF_QNAME_SIZE, starts with '"', and is the
 *     quote-mode escape of a prefix of the input, then '"', then "..."
 *     exactly when the prefix is not the whole input.
 * Any violation aborts. The input is not NUL-terminated, so an over-read
 * shows under ASan.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_log.h"
#include "sf_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_log";

/* Length of a valid UTF-8 sequence at p (n bytes), or 0; code point in
 * *cp. Strict: no overlongs, surrogates, nothing past U+10FFFF. */
static size_t seq(const uint8_t *p, size_t n, uint32_t *cp)
{
	size_t k;
	uint32_t c, min;

	if (p[0] < 0x80) {
		*cp = p[0];
		return 1;
	}
	if (p[0] >= 0xc2 && p[0] < 0xe0) {
		k = 2, c = p[0] & 0x1f, min = 0x80;
	} else if (p[0] >= 0xe0 && p[0] < 0xf0) {
		k = 3, c = p[0] & 0x0f, min = 0x800;
	} else if (p[0] >= 0xf0 && p[0] < 0xf5) {
		k = 4, c = p[0] & 0x07, min = 0x10000;
	} else {
		return 0;
	}
	if (n < k)
		return 0;
	for (size_t i = 1; i < k; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		c = c << 6 | (p[i] & 0x3f);
	}
	if (c < min || c > 0x10ffff || (c >= 0xd800 && c < 0xe000))
		return 0;
	*cp = c;
	return k;
}

static bool bad_cp(uint32_t c)
{
	return c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) || c == 0x61c ||
	       c == 0x200e || c == 0x200f || (c >= 0x2028 && c <= 0x202e) ||
	       (c >= 0x2066 && c <= 0x2069);
}

static int hex(uint8_t c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* If out[i..n) starts an escape, the bytes it stands for into enc (*el of
 * them) and its length; 0 if it is no escape. */
static size_t unescape_at(const uint8_t *out, size_t i, size_t n, uint8_t *enc,
			  size_t *el)
{
	if (out[i] != '\\')
		return 0;
	if (i + 3 < n && out[i + 1] == 'x' && hex(out[i + 2]) >= 0 &&
	    hex(out[i + 3]) >= 0) {
		enc[0] = (uint8_t)(hex(out[i + 2]) * 16 + hex(out[i + 3]));
		*el = 1;
		return 4;
	}
	if (i + 5 < n && out[i + 1] == 'u') {
		uint32_t v = 0;

		for (int d = 2; d < 6; d++) {
			if (hex(out[i + d]) < 0)
				return 0;
			v = v * 16 + (uint32_t)hex(out[i + d]);
		}
		if (v < 0x80 || v >= 0x10000 || (v >= 0xd800 && v < 0xe000))
			return 0;
		if (v < 0x800) {
			enc[0] = (uint8_t)(0xc0 | v >> 6);
			enc[1] = (uint8_t)(0x80 | (v & 0x3f));
			*el = 2;
		} else {
			enc[0] = (uint8_t)(0xe0 | v >> 12);
			enc[1] = (uint8_t)(0x80 | ((v >> 6) & 0x3f));
			enc[2] = (uint8_t)(0x80 | (v & 0x3f));
			*el = 3;
		}
		return 6;
	}
	return 0;
}

/* Check out (n bytes) is clean and unescapes to in[0..used). In log mode
 * a backslash of the input passes as it is, so an escape there may also
 * be the input's own text: either reading must match. */
static void check_escaped(const uint8_t *out, size_t n, const uint8_t *in,
			  size_t used, bool quote)
{
	size_t i = 0, j = 0;

	while (i < n) {
		uint32_t c;
		uint8_t enc[4];
		size_t el = 0, w, k = seq(out + i, n - i, &c);

		if (k == 0 || bad_cp(c))
			fuzz_die("output", "invalid UTF-8 or an unescaped control");
		if (quote && c == '"')
			fuzz_die("output", "a bare quote in quote mode");
		w = unescape_at(out, i, n, enc, &el);
		if (w && j + el <= used && memcmp(in + j, enc, el) == 0) {
			uint32_t ec;
			size_t ek = seq(enc, el, &ec);

			/* only what the escaping escapes (or the input's text) */
			if ((ek == 0 || bad_cp(ec) || (quote && (ec == '"' || ec == '\\'))) ||
			    (!quote && j + w <= used && memcmp(in + j, out + i, w) == 0)) {
				i += w, j += el;
				continue;
			}
			if (quote)
				fuzz_die("unescape", "an escape of a character that passes");
		} else if (quote && c == '\\') {
			fuzz_die("unescape", "a bare backslash, or an escape not of the input");
		}
		if (j + k > used || memcmp(in + j, out + i, k) != 0)
			fuzz_die("unescape", "a passed character is not the input's");
		i += k, j += k;
	}
	if (j != used)
		fuzz_die("unescape", "the output does not cover the bytes consumed");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char out[4 * 65536 + 16];
	const uint8_t *in;
	size_t len, cap, max_in, used = 0, n;
	bool quote;

	if (size < 2 || size > 65536)
		return 0;
	cap = data[0] & 0x7f ? (size_t)(data[0] & 0x7f) * 2 : sizeof(out);
	quote = data[0] & 0x80;
	in = data + 2;
	len = size - 2;
	max_in = data[1] ? (size_t)data[1] * 3 : len;

	memset(out, 0x5a, sizeof(out));
	n = sf_log_escape(out, cap, (const char *)in, len, max_in,
			  quote ? SF_ESC_QUOTE : 0, &used);
	if (n >= cap || out[n] != '\0' || (cap < sizeof(out) && out[cap] != 0x5a))
		fuzz_die("escape", "wrote past its cap or no NUL");
	if (used > len || used > max_in)
		fuzz_die("escape", "consumed past len or max_in");
	if (used < len && used < max_in) {
		uint32_t c;
		size_t k = seq(in + used, len - used, &c);

		if (cap == sizeof(out) && used + (k ? k : 1) <= max_in)
			fuzz_die("escape", "stopped early with an unbounded output");
	}
	check_escaped((const uint8_t *)out, n, in, used, quote);
	/* the prefix ends on a boundary: what follows decodes the same way */
	for (size_t i = 0; i < used;) {
		uint32_t c;
		size_t k = seq(in + i, len - i, &c);

		i += k ? k : 1;
		if (i > used)
			fuzz_die("escape", "cut inside a UTF-8 sequence");
	}

	/* sf_utf8_cut on a copy (it reads only s[0..n)) */
	{
		char *copy = malloc(len ? len : 1);
		size_t m;

		if (!copy)
			return 0;
		memcpy(copy, in, len);
		m = sf_utf8_cut(copy, len);
		if (m > len || len - m > 3)
			fuzz_die("utf8_cut", "cut more than 3 bytes");
		for (size_t i = 0; i < m;) {
			uint32_t c;
			size_t k = seq(in + i, m - i, &c);

			if (k == 0 && seq(in + i, len - i, &c) > 1)
				fuzz_die("utf8_cut", "a sequence left cut at the end");
			i += k ? k : 1;
		}
		free(copy);
	}

	/* sf_quote_name */
	{
		char q[SF_QNAME_SIZE + 16];
		size_t ql, inner_used = 0;

		memset(q, 0x5a, sizeof(q));
		if (sf_quote_name(q, (const char *)in, len) != q)
			fuzz_die("quote", "does not return its buffer");
		ql = strlen(q);
		if (ql >= SF_QNAME_SIZE || (uint8_t)q[SF_QNAME_SIZE] != 0x5a)
			fuzz_die("quote", "past SF_QNAME_SIZE");
		if (q[0] != '"')
			fuzz_die("quote", "no opening quote");
		const char *close = strchr(q + 1, '"');
		if (!close)
			fuzz_die("quote", "no closing quote");
		/* the escape of the prefix it stands for */
		char inner[SF_QNAME_SIZE];
		size_t ni = sf_log_escape(inner, sizeof(inner), (const char *)in, len,
					  SF_QNAME_MAX, SF_ESC_QUOTE, &inner_used);
		if ((size_t)(close - q - 1) != ni || memcmp(q + 1, inner, ni) != 0)
			fuzz_die("quote", "not the quote-mode escape of a prefix");
		check_escaped((const uint8_t *)q + 1, ni, in, inner_used, true);
		if (strcmp(close + 1, inner_used < len ? "..." : "") != 0)
			fuzz_die("quote", "\"...\" not exactly when the name is cut");
	}
	return 0;
}
