/*
 * sf_mounts.c - reading /proc/self/mountinfo (see sf_mounts.h).
 *
 * Invariants: every field is unescaped (the kernel writes space, tab,
 * newline and backslash as \ooo) and copied; lines that do not parse are
 * skipped; the list is capped at SF_MOUNTS_MAX entries.
 */
#include "sf_mounts.h"
#include "sf_array.h"
#include "sf_error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Undo the octal escapes (\040 etc.) of a mountinfo field in place. */
static void unescape(char *s)
{
	char *out = s;

	while (*s) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' &&
		    s[2] >= '0' && s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
			*out++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 +
					(s[3] - '0'));
			s += 4;
		} else {
			*out++ = *s++;
		}
	}
	*out = '\0';
}

/* The next space-separated field at *cursor, NUL-terminated in place
 * (*cursor moves past it); NULL at the end of the line. */
static char *field(char **cursor)
{
	char *p = *cursor, *start;

	while (*p == ' ')
		p++;
	if (!*p || *p == '\n')
		return NULL;
	start = p;
	while (*p && *p != ' ' && *p != '\n')
		p++;
	if (*p)
		*p++ = '\0';
	*cursor = p;
	return start;
}

void sf_mounts_free(struct sf_mount_ent *v, size_t n)
{
	if (!v)
		return;
	for (size_t i = 0; i < n; i++) {
		free(v[i].mnt);
		free(v[i].fstype);
		free(v[i].source);
	}
	free(v);
}

int sf_mounts_list(const char *fstype_prefix, struct sf_mount_ent **out,
		   size_t *n)
{
	struct sf_mount_ent *v = NULL;
	size_t cnt = 0, cap = 0;
	char *line = NULL;
	size_t linecap = 0;
	FILE *f;
	int rc = 0;

	f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return -errno;
	while (getline(&line, &linecap, f) > 0) {
		/* id parent MAJ:MIN root MOUNTPOINT opts [optional...] - FSTYPE SOURCE superopts */
		char *cur = line, *dev, *mnt, *sep, *fstype, *source;

		if (!field(&cur) || !field(&cur) || !(dev = field(&cur)) ||
		    !field(&cur) || !(mnt = field(&cur)))
			continue;
		sep = strstr(cur, " - ");
		if (!sep)
			continue;
		cur = sep + 3;
		if (!(fstype = field(&cur)) || !(source = field(&cur)))
			continue;
		if (fstype_prefix &&
		    strncmp(fstype, fstype_prefix, strlen(fstype_prefix)) != 0)
			continue;
		rc = sf_array_grow(&v, cnt, &cap, sizeof(*v), 16, SF_MOUNTS_MAX);
		if (rc)
			break;
		unescape(mnt);
		unescape(source);
		memset(&v[cnt], 0, sizeof(v[cnt]));
		snprintf(v[cnt].dev, sizeof(v[cnt].dev), "%s", dev);
		v[cnt].mnt = strdup(mnt);
		v[cnt].fstype = strdup(fstype);
		v[cnt].source = strdup(source);
		cnt++;
		if (!v[cnt - 1].mnt || !v[cnt - 1].fstype || !v[cnt - 1].source) {
			rc = -ENOMEM;
			break;
		}
	}
	free(line);
	fclose(f);
	if (rc) {
		sf_mounts_free(v, cnt);
		return rc;
	}
	*out = v;
	*n = cnt;
	return 0;
}

const char *sf_mount_shardfs_store(const struct sf_mount_ent *e)
{
	static const char pfx[] = "shardfs:";

	if (strcmp(e->fstype, "fuse.shardfs") != 0 ||
	    strncmp(e->source, pfx, sizeof(pfx) - 1) != 0 ||
	    e->source[sizeof(pfx) - 1] != '/')
		return NULL;
	return e->source + sizeof(pfx) - 1;
}
