/*
 * sf_log.h - one log line per event, to stderr or a sink the program sets.
 *
 * Lines are prefixed with the process prefix (set once at start-up, e.g.
 * "[rank 3] " in MPI mode) and the level. Thread-safe: each call writes one
 * whole line with a single write().
 */
#ifndef SF_LOG_H
#define SF_LOG_H

#include <stdarg.h>

enum sf_log_level { SF_LOG_ERROR = 0, SF_LOG_WARN = 1, SF_LOG_INFO = 2, SF_LOG_DEBUG = 3 };

/* Set the prefix (copied, at most 63 bytes) and the most verbose level kept.
 * Call before starting threads. */
void sf_log_setup(const char *prefix, enum sf_log_level max_level);

/* Log one line (a trailing newline is added). Lines are capped at 2 KiB. */
void sf_log(enum sf_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void sf_vlog(enum sf_log_level level, const char *fmt, va_list ap);

#define sf_err(...) sf_log(SF_LOG_ERROR, __VA_ARGS__)
#define sf_warn(...) sf_log(SF_LOG_WARN, __VA_ARGS__)
#define sf_info(...) sf_log(SF_LOG_INFO, __VA_ARGS__)
#define sf_debug(...) sf_log(SF_LOG_DEBUG, __VA_ARGS__)

#endif
