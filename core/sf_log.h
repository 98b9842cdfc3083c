/*
 * sf_log.h - one log line per event, to stderr, a log file or syslog.
 *
 * Lines are prefixed with the process prefix (set once at start-up, e.g.
 * "[rank 3] shardfs: " in MPI mode) and the level. Thread-safe: each call
 * writes one whole line with a single write() (or one syslog(3) call).
 *
 * Sinks: stderr until the program names another. With a log file
 * (sf_log_to_file) or syslog (sf_log_to_syslog) every line goes there, and
 * also to stderr until sf_log_detach() (the daemon calls it once it serves
 * requests: start-up messages and errors reach the terminal that started
 * it, and `mount` prints them).
 *
 * Every line is one printable line whatever its arguments hold: the
 * message passes through sf_log_escape (below) before it reaches a sink,
 * so valid printable UTF-8 passes and control characters (C0, DEL, C1),
 * U+2028/U+2029, bidi controls and invalid bytes are escaped. Names from
 * input are also quoted by their callers (sf_quote_name, sf_model.h), so
 * where a name ends is never in doubt.
 *
 * Bad input from users (a bad slice, a refused write) is logged through the
 * rate-limited macros (sf_warn_limited): each call site keeps at most
 * SF_LOG_BURST lines per SF_LOG_WINDOW_S seconds; the first line after a
 * quiet stretch says how many were dropped. Nobody can flood the log by
 * hammering bad paths.
 */
#ifndef SF_LOG_H
#define SF_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

enum sf_log_level { SF_LOG_ERROR = 0, SF_LOG_WARN = 1, SF_LOG_INFO = 2, SF_LOG_DEBUG = 3 };

/* Set the prefix (copied, at most 63 bytes) and the most verbose level kept.
 * Call before starting threads. */
void sf_log_setup(const char *prefix, enum sf_log_level max_level);

/*
 * Append every line to the file at path (created 0640 if missing, opened
 * O_APPEND, close-on-exec; path copied, made absolute against the working
 * directory, at most PATH_MAX - 1 bytes).
 * Call before starting threads. Returns 0 or a negative errno (nothing
 * changed then).
 */
int sf_log_to_file(const char *path);

/*
 * Reopen the log file at its path (after logrotate moved it away): the
 * new file takes the old one's descriptor in one dup3(), so concurrent
 * lines go to one or the other, never nowhere. Async-signal-safe: meant
 * for a SIGHUP handler. No-op without a log file. Returns 0 or -errno
 * (the old file is kept then).
 */
int sf_log_reopen(void);

/* Send every line to syslog(3): facility LOG_DAEMON, ident (borrowed: must
 * stay valid; a string literal), with the pid; levels map to LOG_ERR,
 * LOG_WARNING, LOG_INFO and LOG_DEBUG. Call before starting threads. */
void sf_log_to_syslog(const char *ident);

/* Stop copying lines to stderr when a log file or syslog takes them
 * (without either, stderr stays the sink). Any thread, any time. */
void sf_log_detach(void);

/* Log one line (a trailing newline is added). Lines are capped at 2 KiB. */
void sf_log(enum sf_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void sf_vlog(enum sf_log_level level, const char *fmt, va_list ap);

#define SF_LOG_BURST 10      /* lines per call site and window */
#define SF_LOG_WINDOW_S 60   /* seconds */

/* One rate-limited call site's state (static, zero-initialised; guarded
 * by the log's own lock). */
struct sf_log_limit {
	int64_t window_start_ms; /* CLOCK_MONOTONIC, ms; 0: never logged */
	unsigned n;              /* lines kept in this window, <= burst */
	uint64_t dropped;        /* lines dropped since the last kept line */
	unsigned burst;          /* lines per window; 0: SF_LOG_BURST (set
				  * in the static initializer only) */
};

/* Log one line unless lim's call site logged SF_LOG_BURST lines in the
 * last SF_LOG_WINDOW_S s (then count it as dropped). */
void sf_log_limited(struct sf_log_limit *lim, enum sf_log_level level,
		    const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/*
 * Log one line unless a line with the same key (a hash of what failed and
 * why: sf_log_key) was logged in the last SF_LOG_WINDOW_S s, then through
 * lim like sf_log_limited. For failures a client's retries repeat (the
 * kernel reads a failed page twice): one line per thing and cause. The
 * keys remembered are bounded (SF_LOG_KEYS, the oldest forgotten first).
 */
#define SF_LOG_KEYS 256
void sf_log_once(struct sf_log_limit *lim, uint64_t key,
		 enum sf_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* A key for sf_log_once: 64-bit FNV-1a of the NUL-terminated strings
 * a, b and c (any may be NULL) and the number n (e.g. the cause). */
uint64_t sf_log_key(const char *a, const char *b, const char *c, int64_t n);

/*
 * Escaping, the one form every log line and every quoted name has:
 *   - valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF)
 *     passes as it is, except the code points below;
 *   - C0 controls and DEL (U+0000-U+001F, U+007F) become \xNN;
 *   - C1 controls (U+0080-U+009F, NEL among them), U+2028 and U+2029, and
 *     the bidi controls (U+061C, U+200E, U+200F, U+202A-U+202E,
 *     U+2066-U+2069) become \uNNNN (4 lowercase hex digits);
 *   - every byte that is not part of valid UTF-8 becomes \xNN (always
 *     0x80-0xff, so never mistaken for an escaped C0 control);
 *   - with SF_ESC_QUOTE (quoted names), '"' and '\' become \x22 and
 *     \x5c; without it they pass (a log line is not a quoted string).
 * Output is at most 4 bytes per input byte.
 */
#define SF_ESC_QUOTE 1u

/*
 * Escape the first len bytes of s (any bytes, NUL included) into out
 * (cap >= 1 bytes, always NUL-terminated). Whole units only: stops before
 * the first character whose escaped form does not fit in cap - 1 bytes,
 * or whose bytes reach past max_in input bytes (a UTF-8 sequence is never
 * cut). *used (may be NULL) gets the input bytes consumed. Returns the
 * bytes written, without the NUL.
 */
size_t sf_log_escape(char *out, size_t cap, const char *s, size_t len,
		     size_t max_in, unsigned flags, size_t *used);

/* The length of s[0..n) without a UTF-8 sequence cut at its end (for text
 * that snprintf truncated). */
size_t sf_utf8_cut(const char *s, size_t n);

#define sf_err(...) sf_log(SF_LOG_ERROR, __VA_ARGS__)
#define sf_warn(...) sf_log(SF_LOG_WARN, __VA_ARGS__)
#define sf_info(...) sf_log(SF_LOG_INFO, __VA_ARGS__)
#define sf_debug(...) sf_log(SF_LOG_DEBUG, __VA_ARGS__)

/* A warning about bad input from a user, rate-limited per call site. */
#define sf_warn_limited(...)                                              \
	do {                                                              \
		static struct sf_log_limit sf_log_lim_;                   \
		sf_log_limited(&sf_log_lim_, SF_LOG_WARN, __VA_ARGS__);   \
	} while (0)

#endif
