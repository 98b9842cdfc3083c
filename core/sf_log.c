/*
 * sf_log.c - line-at-a-time logging to stderr, a log file or syslog.
 *
 * Invariant: each sf_log() call emits exactly one line with one write(2)
 * per sink (one syslog(3) call for syslog), so lines from concurrent
 * threads (and ranks sharing a terminal or a file opened O_APPEND) never
 * interleave mid-line, and no byte of the message can start another or
 * disguise it: every message passes through sf_log_escape (C0 and C1
 * controls, U+2028/U+2029, bidi controls and invalid UTF-8 escaped), the
 * last line of defence whatever the caller quoted. The prefix, level and
 * sinks are set once before threads start and only read afterwards; the
 * log file's descriptor number never changes (sf_log_reopen swaps the
 * file behind it with dup3), and the stderr copy is turned off through an
 * atomic flag.
 * The rate limits of sf_log_limited and the keys of sf_log_once are
 * guarded by limit_lock.
 */
#include "sf_log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#define SF_LOG_LINE 2048  /* bytes of one line, newline included */
#define SF_LOG_STAMP 48   /* room for the timestamp of a log file line */

static char sf_log_prefix[64] = "shardfs: ";
static enum sf_log_level sf_log_max = SF_LOG_INFO;
static int sf_log_fd = -1;                /* the log file, or -1 */
static char sf_log_path[PATH_MAX];        /* its path, for sf_log_reopen */
static bool sf_log_syslog;                /* lines go to syslog(3) */
static atomic_bool sf_log_detached;       /* no copy to stderr any more */
static pthread_mutex_t limit_lock = PTHREAD_MUTEX_INITIALIZER;

/* ------------------------------------------------------------------ */
/* escaping                                                            */

/* The length of the valid UTF-8 sequence at p (n > 0 bytes there), its
 * code point in *cp; 0 when p starts no valid sequence (overlong,
 * surrogate, past U+10FFFF, truncated, or a stray continuation byte). */
static size_t utf8_seq(const unsigned char *p, size_t n, uint32_t *cp)
{
	uint32_t c = p[0], min;
	size_t len;

	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	if (c >= 0xc2 && c <= 0xdf) {
		len = 2;
		c &= 0x1f;
		min = 0x80;
	} else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		c &= 0x0f;
		min = 0x800;
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		c &= 0x07;
		min = 0x10000;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		c = (c << 6) | (p[i] & 0x3f);
	}
	if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		return 0;
	*cp = c;
	return len;
}

/* Whether code point c is escaped: it could end a line or reorder what a
 * reader sees. */
static bool cp_escaped(uint32_t c)
{
	return c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f) ||
	       c == 0x061c || c == 0x200e || c == 0x200f ||
	       (c >= 0x2028 && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

size_t sf_log_escape(char *out, size_t cap, const char *s, size_t len,
		     size_t max_in, unsigned flags, size_t *used)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, n = 0;

	if (max_in > len)
		max_in = len;
	while (i < max_in) {
		char esc[8];
		const char *src;
		size_t k, w;
		uint32_t c;

		k = utf8_seq(p + i, len - i, &c);
		if (k == 0) {
			/* an invalid byte: alone, whatever follows */
			k = 1;
			w = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", p[i]);
			src = esc;
		} else if (cp_escaped(c) ||
			   ((flags & SF_ESC_QUOTE) && (c == '"' || c == '\\'))) {
			w = (size_t)snprintf(esc, sizeof(esc),
					     c < 0x80 ? "\\x%02x" : "\\u%04x",
					     (unsigned)c);
			src = esc;
		} else {
			w = k;
			src = s + i;
		}
		if (i + k > max_in || n + w >= cap)
			break;
		memcpy(out + n, src, w);
		n += w;
		i += k;
	}
	if (cap)
		out[n] = '\0';
	if (used)
		*used = i;
	return n;
}

size_t sf_utf8_cut(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;

	/* the last lead byte among the last 3, and whether its sequence
	 * would need bytes past n */
	for (size_t back = 1; back <= 3 && back <= n; back++) {
		unsigned char c = p[n - back];
		size_t need;

		if ((c & 0xc0) == 0x80)
			continue; /* a continuation byte */
		need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
		return need > back ? n - back : n;
	}
	return n;
}

void sf_log_setup(const char *prefix, enum sf_log_level max_level)
{
	if (prefix)
		snprintf(sf_log_prefix, sizeof(sf_log_prefix), "%s", prefix);
	sf_log_max = max_level;
}

static int open_log(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY,
		      0640);

	return fd < 0 ? -errno : fd;
}

int sf_log_to_file(const char *path)
{
	char abs[PATH_MAX];
	int fd, n;

	/* Absolute, so a reopen after the daemon's chdir("/") finds it. */
	if (path[0] == '/') {
		n = snprintf(abs, sizeof(abs), "%s", path);
	} else {
		char cwd[PATH_MAX];

		if (!getcwd(cwd, sizeof(cwd)))
			return -errno;
		n = snprintf(abs, sizeof(abs), "%s/%s", cwd, path);
	}
	if (n < 0 || (size_t)n >= sizeof(abs))
		return -ENAMETOOLONG;
	fd = open_log(abs);
	if (fd < 0)
		return fd;
	if (sf_log_fd >= 0)
		close(sf_log_fd);
	sf_log_fd = fd;
	memcpy(sf_log_path, abs, (size_t)n + 1);
	return 0;
}

int sf_log_reopen(void)
{
	int fd, rc = 0;

	if (sf_log_fd < 0)
		return 0;
	fd = open_log(sf_log_path);
	if (fd < 0)
		return fd;
	if (dup3(fd, sf_log_fd, O_CLOEXEC) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

void sf_log_to_syslog(const char *ident)
{
	openlog(ident, LOG_PID, LOG_DAEMON);
	sf_log_syslog = true;
}

void sf_log_detach(void)
{
	atomic_store(&sf_log_detached, true);
}

/* Best effort: a failed log write has nowhere to be reported. */
static void write_all(int fd, const char *buf, size_t n)
{
	if (write(fd, buf, n) < 0)
		return;
}

void sf_vlog(enum sf_log_level level, const char *fmt, va_list ap)
{
	static const char *names[] = { "error", "warning", "info", "debug" };
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	/* [stamp room][prefix][level: message]\n */
	char buf[SF_LOG_STAMP + SF_LOG_LINE];
	char *line = buf + SF_LOG_STAMP;
	char raw[SF_LOG_LINE];
	size_t body;
	int n, m;

	if (level > sf_log_max)
		return;
	n = snprintf(line, SF_LOG_LINE, "%s", sf_log_prefix);
	if (n < 0 || (size_t)n >= SF_LOG_LINE / 2)
		n = 0;
	body = (size_t)n;
	m = snprintf(line + n, SF_LOG_LINE - n, "%s: ", names[level]);
	n += m > 0 ? m : 0;
	/* One line per event, whatever names from disk, peers or users hold:
	 * the message is formatted, then escaped into the line. */
	m = vsnprintf(raw, sizeof(raw), fmt, ap);
	if (m < 0)
		m = 0;
	else if ((size_t)m >= sizeof(raw))
		m = (int)sf_utf8_cut(raw, sizeof(raw) - 1);
	/* room for the newline after it */
	m = (int)sf_log_escape(line + n, SF_LOG_LINE - 1 - (size_t)n, raw,
			       (size_t)m, (size_t)m, 0, NULL);
	n += m;
	line[n] = '\0';
	if (sf_log_syslog)
		syslog(prio[level], "%s", line + body); /* ident says who */
	line[n++] = '\n';
	if (sf_log_fd >= 0) {
		/* Log files get a local timestamp in front, ISO 8601. */
		char stamp[SF_LOG_STAMP];
		struct timespec ts;
		struct tm tm;
		size_t k = 0;

		clock_gettime(CLOCK_REALTIME, &ts);
		if (localtime_r(&ts.tv_sec, &tm))
			k = strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
		if (k) {
			int e = snprintf(stamp + k, sizeof(stamp) - k, ".%03ld ",
					 ts.tv_nsec / 1000000);

			k += e > 0 && (size_t)e < sizeof(stamp) - k ? (size_t)e : 0;
		}
		memcpy(line - k, stamp, k);
		write_all(sf_log_fd, line - k, (size_t)n + k);
	}
	if ((sf_log_fd < 0 && !sf_log_syslog) || !atomic_load(&sf_log_detached))
		write_all(STDERR_FILENO, line, (size_t)n);
}

void sf_log(enum sf_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	sf_vlog(level, fmt, ap);
	va_end(ap);
}

/* Whether lim lets one more line through now; *dropped gets the lines
 * dropped before it. Locked (limit_lock). */
static bool limit_pass(struct sf_log_limit *lim, int64_t now, uint64_t *dropped)
{
	unsigned burst = lim->burst ? lim->burst : SF_LOG_BURST;

	if (lim->window_start_ms == 0 ||
	    now - lim->window_start_ms >= (int64_t)SF_LOG_WINDOW_S * 1000) {
		lim->window_start_ms = now;
		lim->n = 0;
	}
	if (lim->n >= burst) {
		lim->dropped++;
		return false;
	}
	lim->n++;
	*dropped = lim->dropped;
	lim->dropped = 0;
	return true;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 1; /* never 0 */
}

/* Log the line fmt/ap makes, saying how many like it were dropped. */
static void log_kept(enum sf_log_level level, uint64_t dropped,
		     const struct sf_log_limit *lim, const char *fmt, va_list ap)
{
	char msg[SF_LOG_LINE];
	int m = vsnprintf(msg, sizeof(msg), fmt, ap);

	if (m >= 0 && (size_t)m >= sizeof(msg))
		msg[sf_utf8_cut(msg, sizeof(msg) - 1)] = '\0';
	if (dropped)
		sf_log(level, "%s (%llu more like this were dropped: at most %d per %d s are logged)",
		       msg, (unsigned long long)dropped,
		       lim->burst ? (int)lim->burst : SF_LOG_BURST,
		       SF_LOG_WINDOW_S);
	else
		sf_log(level, "%s", msg);
}

void sf_log_limited(struct sf_log_limit *lim, enum sf_log_level level,
		    const char *fmt, ...)
{
	uint64_t dropped = 0;
	int64_t now;
	bool keep;
	va_list ap;

	if (level > sf_log_max)
		return;
	now = now_ms();
	pthread_mutex_lock(&limit_lock);
	keep = limit_pass(lim, now, &dropped);
	pthread_mutex_unlock(&limit_lock);
	if (!keep)
		return;
	va_start(ap, fmt);
	log_kept(level, dropped, lim, fmt, ap);
	va_end(ap);
}

/* The keys sf_log_once logged lately, a ring: a key is found by a linear
 * scan (SF_LOG_KEYS is small; failures are rare), the oldest overwritten. */
static struct {
	uint64_t key;
	int64_t at_ms; /* 0: free */
} log_keys[SF_LOG_KEYS];
static unsigned log_keys_next;

uint64_t sf_log_key(const char *a, const char *b, const char *c, int64_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	const char *parts[3] = { a, b, c };

	for (int k = 0; k < 3; k++) {
		for (const char *p = parts[k]; p && *p; p++)
			h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
		h = (h ^ 0xff) * 0x100000001b3ull; /* "a","bc" != "ab","c" */
	}
	for (int i = 0; i < 8; i++)
		h = (h ^ (((uint64_t)n >> (8 * i)) & 0xff)) * 0x100000001b3ull;
	return h;
}

void sf_log_once(struct sf_log_limit *lim, uint64_t key,
		 enum sf_log_level level, const char *fmt, ...)
{
	const int64_t window = (int64_t)SF_LOG_WINDOW_S * 1000;
	uint64_t dropped = 0;
	bool keep = true;
	int64_t now;
	va_list ap;

	if (level > sf_log_max)
		return;
	now = now_ms();
	pthread_mutex_lock(&limit_lock);
	for (unsigned i = 0; i < SF_LOG_KEYS; i++)
		if (log_keys[i].at_ms && log_keys[i].key == key &&
		    now - log_keys[i].at_ms < window) {
			keep = false; /* logged lately: not even counted */
			break;
		}
	if (keep)
		keep = limit_pass(lim, now, &dropped);
	if (keep) {
		log_keys[log_keys_next].key = key;
		log_keys[log_keys_next].at_ms = now;
		log_keys_next = (log_keys_next + 1) % SF_LOG_KEYS;
	}
	pthread_mutex_unlock(&limit_lock);
	if (!keep)
		return;
	va_start(ap, fmt);
	log_kept(level, dropped, lim, fmt, ap);
	va_end(ap);
}
