/*
 * sf_log.c - line-at-a-time logging to stderr.
 *
 * Invariant: each sf_log() call emits exactly one line with one write(2),
 * so lines from concurrent threads (and ranks sharing a terminal) never
 * interleave mid-line. The prefix and level are set once before threads
 * start and only read afterwards.
 */
#include "sf_log.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char sf_log_prefix[64] = "shardfs: ";
static enum sf_log_level sf_log_max = SF_LOG_INFO;

void sf_log_setup(const char *prefix, enum sf_log_level max_level)
{
	if (prefix)
		snprintf(sf_log_prefix, sizeof(sf_log_prefix), "%s", prefix);
	sf_log_max = max_level;
}

void sf_vlog(enum sf_log_level level, const char *fmt, va_list ap)
{
	static const char *names[] = { "error", "warning", "info", "debug" };
	char line[2048];
	int n, m;

	if (level > sf_log_max)
		return;
	n = snprintf(line, sizeof(line), "%s%s: ", sf_log_prefix,
		     names[level]);
	if (n < 0 || (size_t)n >= sizeof(line) - 1)
		n = 0;
	m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	if (m < 0)
		m = 0;
	n += m;
	if ((size_t)n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	/* Best effort: a failed log write has nowhere to be reported. */
	if (write(STDERR_FILENO, line, n) < 0)
		return;
}

void sf_log(enum sf_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	sf_vlog(level, fmt, ap);
	va_end(ap);
}
