/*
 * sf_log.c - line-at-a-time logging to stderr, a log file or syslog.
 *
 * Invariant: each sf_log() call emits exactly one line with one write(2)
 * per sink (one syslog(3) call for syslog), so lines from concurrent
 * threads (and ranks sharing a terminal or a file opened O_APPEND) never
 * interleave mid-line, and no byte of the message can start another
 * (control characters are replaced). The prefix, level and sinks are set
 * once before threads start and only read afterwards; the log file's
 * descriptor number never changes (sf_log_reopen swaps the file behind it
 * with dup3), and the stderr copy is turned off through an atomic flag.
 * The rate limits of sf_log_limited are guarded by limit_lock.
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
	m = vsnprintf(line + n, SF_LOG_LINE - n - 1, fmt, ap);
	if (m < 0)
		m = 0;
	if (n + m > SF_LOG_LINE - 2)
		m = SF_LOG_LINE - 2 - n;
	/* One line per event, whatever names from disk, peers or users hold:
	 * control characters become '?'. */
	for (int i = n; i < n + m; i++)
		if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
			line[i] = '?';
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

void sf_log_limited(struct sf_log_limit *lim, enum sf_log_level level,
		    const char *fmt, ...)
{
	char msg[SF_LOG_LINE];
	struct timespec ts;
	uint64_t dropped = 0;
	int64_t now;
	bool keep;
	va_list ap;

	if (level > sf_log_max)
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 1; /* never 0 */
	pthread_mutex_lock(&limit_lock);
	if (lim->window_start_ms == 0 ||
	    now - lim->window_start_ms >= (int64_t)SF_LOG_WINDOW_S * 1000) {
		lim->window_start_ms = now;
		lim->n = 0;
	}
	keep = lim->n < SF_LOG_BURST;
	if (keep) {
		lim->n++;
		dropped = lim->dropped;
		lim->dropped = 0;
	} else {
		lim->dropped++;
	}
	pthread_mutex_unlock(&limit_lock);
	if (!keep)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (dropped)
		sf_log(level, "%s (%llu more like this were dropped: at most %d per %d s are logged)",
		       msg, (unsigned long long)dropped, SF_LOG_BURST,
		       SF_LOG_WINDOW_S);
	else
		sf_log(level, "%s", msg);
}
