/*
 * fuzz_hub.c - libFuzzer target for the Hugging Face hub cache's untrusted
 * text: a snapshot link's text (sf_open_hub, core/sf_open.c), a store
 * entry's name (sf_hub_repo_name) and a shown name (sf_hub_open,
 * core/sf_hub.c).
 *
 * A scratch cache is made once: models--o--n/{blobs/{good, lnk -> good,
 * dir/}, refs/main, snapshots/R/{sub/}}, beside an outside/secret file.
 * Input: byte 0 picks where the link lies (snapshots/R/f or sub/f), the
 * text up to the first NUL (or the end) is the link's text, and the rest
 * a name. For any input:
 *   - sf_open_hub of the link returns a descriptor only for the regular
 *     blob blobs/good (same device and inode), reached only by the exact
 *     text huggingface_hub writes ("../" x depth + "blobs/good");
 *     otherwise a negative errno, and -EXDEV with the link's text in
 *     target;
 *   - sf_hub_repo_name of the name accepts only "models--A" or
 *     "models--A--B" whose parts hold no '/', '@' or control byte, do not
 *     start with '.', and gives "A" or "A/B";
 *   - sf_hub_open of the name as a shown name succeeds only for
 *     "o/n" or "o/n@R", with rel "models--o--n/snapshots/R";
 *   - sf_dstags_open (core/sf_dstags.c) of the name succeeds only for
 *     "ds@t1", with rel "ds/t1", in a DeepSpeed directory
 *     store/ds/{latest (t2), t1/, t2/, t3/ (no model states), ln -> t1};
 *     and sf_dstags_list of ds lists "ds@t1" alone (checked once).
 * Any violation aborts.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "sf_dstags.h"
#include "sf_hub.h"
#include "sf_open.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_hub";

static char top[64];
static int storefd = -1, snapfd = -1, blobsfd = -1;
static struct stat good;

static void put(const char *rel, const char *text)
{
	char p[256];
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	f = fopen(p, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) != 0)
		fuzz_die("setup", p);
}

static void dir(const char *rel)
{
	char p[256];

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	if (mkdir(p, 0755) != 0)
		fuzz_die("setup", p);
}

static void cleanup(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", top);
	if (system(cmd) != 0)
		fprintf(stderr, "%s: %s left behind\n", fuzz_target, top);
}

/* sf_dstags_list's callback: the one name (a second one dies). */
static int one_tag(void *arg, const char *name, const struct timespec *mt)
{
	char *listed = arg;

	(void)mt;
	if (listed[0] || strlen(name) >= 64)
		fuzz_die("sf_dstags_list listed more than ds@t1", name);
	strcpy(listed, name);
	return 0;
}

static void setup(void)
{
	char p[256];

	snprintf(top, sizeof(top), "/tmp/fuzz-hub-XXXXXX");
	if (!mkdtemp(top))
		fuzz_die("setup", "mkdtemp");
	atexit(cleanup);
	dir("store");
	dir("store/models--o--n");
	dir("store/models--o--n/blobs");
	dir("store/models--o--n/blobs/dir");
	dir("store/models--o--n/refs");
	dir("store/models--o--n/snapshots");
	dir("store/models--o--n/snapshots/R");
	dir("store/models--o--n/snapshots/R/sub");
	put("store/models--o--n/blobs/good", "blob");
	put("store/models--o--n/refs/main", "R");
	put("outside", "secret");
	dir("store/ds");
	dir("store/ds/t1");
	dir("store/ds/t2");
	dir("store/ds/t3");
	put("store/ds/latest", "t2\n");
	put("store/ds/t1/mp_rank_00_model_states.pt", "x");
	put("store/ds/t2/mp_rank_00_model_states.pt", "x");
	snprintf(p, sizeof(p), "%s/store/ds/ln", top);
	if (symlink("t1", p) != 0)
		fuzz_die("setup", p);
	snprintf(p, sizeof(p), "%s/store/models--o--n/blobs/lnk", top);
	if (symlink("good", p) != 0)
		fuzz_die("setup", p);
	snprintf(p, sizeof(p), "%s/store", top);
	storefd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	snprintf(p, sizeof(p), "%s/store/models--o--n/snapshots/R", top);
	snapfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	snprintf(p, sizeof(p), "%s/store/models--o--n/blobs", top);
	blobsfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (storefd < 0 || snapfd < 0 || blobsfd < 0 ||
	    fstatat(blobsfd, "good", &good, 0) != 0)
		fuzz_die("setup", "open");
	{
		char listed[64] = "";

		if (sf_dstags_list(storefd, "ds", one_tag, listed) != 0 ||
		    strcmp(listed, "ds@t1") != 0)
			fuzz_die("sf_dstags_list of ds is not ds@t1 alone", listed);
	}
}

static void check_link(bool sub, const char *text)
{
	const char *rel = sub ? "sub/f" : "f";
	char target[512], p[256], want[64];
	struct stat sb;
	int fd;

	snprintf(p, sizeof(p), "%s/store/models--o--n/snapshots/R/%s", top, rel);
	unlink(p);
	if (!text[0] || symlink(text, p) != 0)
		return; /* no such link can be made */
	snprintf(want, sizeof(want), "%s../../blobs/good", sub ? "../" : "");
	fd = sf_open_hub(snapfd, blobsfd, rel, O_RDONLY, target, sizeof(target));
	if (fd >= 0) {
		if (fstat(fd, &sb) != 0 || sb.st_dev != good.st_dev ||
		    sb.st_ino != good.st_ino)
			fuzz_die("a descriptor of another file than blobs/good", text);
		if (strcmp(text, want) != 0)
			fuzz_die("followed a link text huggingface_hub never writes", text);
		close(fd);
	} else if (strcmp(text, want) == 0) {
		fuzz_die("the link huggingface_hub writes is refused", text);
	} else if (fd == -EXDEV && strlen(text) < sizeof(target) &&
		   strcmp(target, text) != 0) {
		fuzz_die("target is not the link's text", text);
	}
	unlink(p);
}

/* The model of sf_hub_repo_name's parts. */
static bool part_ok(const char *s, size_t n)
{
	if (n == 0 || n > 255 || s[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++)
		if (s[i] == '/' || s[i] == '@' || (unsigned char)s[i] < 0x20 ||
		    s[i] == 0x7f)
			return false;
	return true;
}

static void check_name(const char *name)
{
	char shown[600], want[600];
	const char *rest, *sep;
	bool ok = false;
	struct sf_hub_snap hs;
	int rc;

	if (strncmp(name, "models--", 8) == 0) {
		rest = name + 8;
		sep = strstr(rest, "--");
		if (!sep) {
			ok = part_ok(rest, strlen(rest));
			snprintf(want, sizeof(want), "%s", rest);
		} else {
			ok = part_ok(rest, (size_t)(sep - rest)) &&
			     part_ok(sep + 2, strlen(sep + 2)) && !strstr(sep + 2, "--");
			snprintf(want, sizeof(want), "%.*s/%s", (int)(sep - rest), rest,
				 sep + 2);
		}
	}
	if (sf_hub_repo_name(name, shown, sizeof(shown)) != ok)
		fuzz_die("sf_hub_repo_name disagrees with the model", name);
	if (ok && strcmp(shown, want) != 0)
		fuzz_die("sf_hub_repo_name's shown name", name);
	rc = sf_hub_open(storefd, name, &hs);
	if (rc == 0) {
		close(hs.dirfd);
		close(hs.blobsfd);
		if ((strcmp(name, "o/n") != 0 && strcmp(name, "o/n@R") != 0) ||
		    strcmp(hs.rel, "models--o--n/snapshots/R") != 0)
			fuzz_die("sf_hub_open opened another name", name);
	} else if (strcmp(name, "o/n") == 0 || strcmp(name, "o/n@R") == 0) {
		fuzz_die("sf_hub_open refused the snapshot", name);
	}
	{
		struct sf_dstags_tag dt;

		rc = sf_dstags_open(storefd, name, &dt);
		if (rc == 0) {
			close(dt.dirfd);
			if (strcmp(name, "ds@t1") != 0 || strcmp(dt.rel, "ds/t1") != 0)
				fuzz_die("sf_dstags_open opened another name", name);
		} else if (strcmp(name, "ds@t1") == 0) {
			fuzz_die("sf_dstags_open refused ds@t1", name);
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char text[512], name[512];
	size_t i = 1, n;

	if (storefd < 0)
		setup();
	if (size < 1)
		return 0;
	for (n = 0; i < size && data[i] && n < sizeof(text) - 1; i++)
		text[n++] = (char)data[i];
	text[n] = '\0';
	check_link(data[0] & 1, text);
	for (i++, n = 0; i < size && data[i] && n < sizeof(name) - 1; i++)
		name[n++] = (char)data[i];
	name[n] = '\0';
	check_name(name);
	return 0;
}
