/*
 * shardctl_util.c - what every file of shardctl uses: usage errors, byte
 * counts and shapes as people read them, and the one progress line of the
 * long commands (gen, export, verify, index, diff), and two questions gen
 * and copy ask of a target directory (is it shardfs's own checkpoint; does
 * a mount serve it).
 *
 * The bottom of shardctl's files: it calls none of them. Progress goes to
 * stderr only, and only where a person watches: on a terminal one line is
 * rewritten in place (\r, erase to end of line) at most four times a
 * second; elsewhere nothing, unless a command's --progress asks for one
 * plain line a second (CI logs, pipes). stdout stays for results.
 */
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sf_io.h"
#include "sf_mounts.h"
#include "sf_manifest.h"
#include "sf_wckpt.h"
#include "shardctl.h"

int usage_error(const char *usage, const char *fmt, const char *arg)
{
	fputs("shardctl: ", stderr);
	fprintf(stderr, fmt, arg);
	fputs("\n", stderr);
	fputs(usage, stderr);
	return EXIT_USAGE;
}

bool is_help(const char *s)
{
	return strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0;
}

const char *fmt_bytes(uint64_t n, char buf[32])
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)n;
	unsigned u = 0;

	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, 32, "%llu B", (unsigned long long)n);
	else
		snprintf(buf, 32, "%.1f %s", v, unit[u]);
	return buf;
}

const char *fmt_shape(const struct sf_tensor *t, char *buf, size_t size)
{
	size_t n = 0;

	n += (size_t)snprintf(buf + n, size - n, "[");
	for (unsigned d = 0; d < t->ndim && n < size; d++)
		n += (size_t)snprintf(buf + n, size - n, "%s%llu", d ? "," : "",
				      (unsigned long long)t->shape[d]);
	if (n < size)
		n += (size_t)snprintf(buf + n, size - n, "]");
	if (n >= size)
		snprintf(buf, size, "[...]");
	return buf;
}

/* ------------------------------------------------------------------ */
/* progress                                                            */

void progress_init(struct progress *p, const char *what, bool force)
{
	memset(p, 0, sizeof(*p));
	p->what = what;
	p->tty = isatty(STDERR_FILENO) == 1;
	p->on = p->tty || force;
}

void progress_show(void *arg, uint64_t done, uint64_t total)
{
	struct progress *p = arg;
	struct timespec now;
	char a[32], b[32];
	long gap;

	if (!p->on)
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	gap = (now.tv_sec - p->last.tv_sec) * 1000 +
	      (now.tv_nsec - p->last.tv_nsec) / 1000000;
	if (done < total && gap < (p->tty ? 250 : 1000))
		return;
	p->last = now;
	fprintf(stderr, "%s%s: %d%% %s/%s%s", p->tty ? "\r" : "", p->what,
		total ? (int)(done * 100 / total) : 100, fmt_bytes(done, a),
		fmt_bytes(total, b), p->tty ? "\033[K" : "\n");
	p->shown = p->tty;
}

void progress_clear(struct progress *p)
{
	if (p->shown)
		fputs("\r\033[K", stderr);
	p->shown = false;
	/* the next update redraws at once (after a line printed between) */
	p->last.tv_sec = 0;
	p->last.tv_nsec = 0;
}

/* Is dir a checkpoint shardfs wrote: its marker, a rank's journal, or a
 * manifest.json of format shardfs/1? */
bool is_shardfs_ckpt(const char *dir)
{
	char path[PATH_MAX], *text = NULL;
	size_t len = 0;
	json_t *root, *fmt;
	bool ours;

	if (sf_wckpt_dir_is_ours(dir))
		return true;
	if ((size_t)snprintf(path, sizeof(path), "%s/" SF_SHARDFS_MANIFEST, dir) >=
	    sizeof(path) ||
	    sf_read_file(path, SF_MAX_MANIFEST_BYTES, &text, &len) != 0)
		return false;
	root = json_loadb(text, len, 0, NULL);
	fmt = root ? json_object_get(root, "format") : NULL;
	ours = fmt && json_is_string(fmt) &&
	       strcmp(json_string_value(fmt), SF_SHARDFS_FORMAT) == 0;
	json_decref(root);
	free(text);
	return ours;
}

/* The mountpoint of a shardfs mount serving dir (its store is dir, or
 * holds it), copied into mnt; false when none does. */
bool served_by_mount(const char *dir, char *mnt, size_t mntlen)
{
	struct sf_mount_ent *v = NULL;
	char *real = realpath(dir, NULL);
	size_t n = 0;
	bool found = false;

	if (!real || sf_mounts_list("fuse.shardfs", &v, &n) != 0) {
		free(real);
		return false;
	}
	for (size_t i = 0; i < n && !found; i++) {
		const char *store = sf_mount_shardfs_store(&v[i]);
		size_t sl = store ? strlen(store) : 0;

		if (store && strncmp(real, store, sl) == 0 &&
		    (real[sl] == '\0' || real[sl] == '/' || sl == 1)) {
			snprintf(mnt, mntlen, "%s", v[i].mnt);
			found = true;
		}
	}
	sf_mounts_free(v, n);
	free(real);
	return found;
}
