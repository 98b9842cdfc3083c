/*
 * sf_log.c - line-at-a-time logging to stderr.
 *
 * Invariant: each sf_log() call emits exactly one line with one write(2),
 * so lines from concurrent threads (and ranks sharing a terminal) never
 * interleave mid-line, and no byte of the message can start another
 * (control characters are replaced). The prefix and level are set once before threads
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
	if ((size_t)(n + m) > sizeof(line) - 2)
		m = (int)(sizeof(line) - 2) - n;
	/* One line per event, whatever names from disk, peers or users hold:
	 * control characters become '?'. */
	for (int i = n; i < n + m; i++)
		if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
			line[i] = '?';
	n += m;
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
