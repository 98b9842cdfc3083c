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
 * Bad input from users (a bad slice, a refused write) is logged through the
 * rate-limited macros (sf_warn_limited): each call site keeps at most
 * SF_LOG_BURST lines per SF_LOG_WINDOW_S seconds; the first line after a
 * quiet stretch says how many were dropped. Nobody can flood the log by
 * hammering bad paths.
 */
#ifndef SF_LOG_H
#define SF_LOG_H

#include <stdarg.h>
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
	unsigned n;              /* lines kept in this window, <= SF_LOG_BURST */
	uint64_t dropped;        /* lines dropped since the last kept line */
};

/* Log one line unless lim's call site logged SF_LOG_BURST lines in the
 * last SF_LOG_WINDOW_S s (then count it as dropped). */
void sf_log_limited(struct sf_log_limit *lim, enum sf_log_level level,
		    const char *fmt, ...) __attribute__((format(printf, 3, 4)));

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
