/*
 * test_dstags.c - a DeepSpeed checkpoint's other tags as store entries
 * (core/sf_dstags.c, through sf_store's names and identities), on a copy
 * of a checkpoint deepspeed 0.19.8 wrote (zero2-2r: latest names
 * global_step2, global_step1 beside it) and variants made here: a tag
 * directory that is a symlink, a hidden one, one named with '@', one
 * without model states, a store entry named like a tag, a latest that
 * names a path out.
 *
 *   test_dstags FIXTURE_DIR    (test/fixtures/deepspeed/deepspeed-0.19.8/zero2-2r)
 */
#include "sf_test.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_dstags.h"
#include "sf_store.h"

static char tmp[64];

static void sh(const char *fmt, const char *a, const char *b)
{
	char cmd[3 * PATH_MAX];

	snprintf(cmd, sizeof(cmd), fmt, a, b);
	if (system(cmd) != 0) {
		fprintf(stderr, "failed: %s\n", cmd);
		exit(1);
	}
}

static int collect(void *arg, const char *name, const struct timespec *mt)
{
	char *out = arg;

	(void)mt;
	if (strlen(out) + strlen(name) + 2 < 4096) {
		strcat(out, name);
		strcat(out, ";");
	}
	return 0;
}

static int open_rc(int storefd, const char *name)
{
	struct sf_dstags_tag dt;
	int rc = sf_dstags_open(storefd, name, &dt);

	if (rc == 0)
		close(dt.dirfd);
	return rc;
}

int main(int argc, char **argv)
{
	char got[4096] = "", p[PATH_MAX];
	struct sf_dstags_tag dt;
	struct stat sb;
	uint64_t dev, ino;
	int storefd, fd;

	if (argc != 2 || access(argv[1], R_OK) != 0) {
		fprintf(stderr, "test_dstags: no fixture %s: skipped\n",
			argc == 2 ? argv[1] : "(none)");
		return 77;
	}
	snprintf(tmp, sizeof(tmp), "/tmp/sf_dstags_XXXXXX");
	if (!mkdtemp(tmp))
		return 1;
	sh("mkdir -p %s/store/outside %s/store/ck", tmp, tmp);
	snprintf(p, sizeof(p), "%s/store/ck", tmp);
	sh("cp -r %s/. %s", argv[1], p);
	snprintf(p, sizeof(p), "%s/store", tmp);
	storefd = open(p, O_RDONLY | O_DIRECTORY);
	CHECK(storefd >= 0);

	/* the listing: ck, then ck@global_step1 (not latest's global_step2) */
	CHECK_EQ(sf_dstags_list(storefd, "ck", collect, got), 0);
	CHECK(strcmp(got, "ck@global_step1;") == 0);
	got[0] = '\0';
	CHECK_EQ(sf_store_names(storefd, collect, got), 0);
	CHECK(strstr(got, "ck;") && strstr(got, "ck@global_step1;"));
	CHECK(!strstr(got, "global_step2"));

	/* opening: only the other tag, as the bare directory ck/global_step1 */
	CHECK_EQ(sf_dstags_open(storefd, "ck@global_step1", &dt), 0);
	CHECK(strcmp(dt.rel, "ck/global_step1") == 0);
	CHECK(fstatat(storefd, "ck/global_step1", &sb, 0) == 0 &&
	      sb.st_ino == dt.ino);
	close(dt.dirfd);
	CHECK_EQ(open_rc(storefd, "ck@global_step2"), -ENOENT); /* it is "ck" */
	CHECK_EQ(open_rc(storefd, "ck@nothere"), -ENOENT);
	CHECK_EQ(open_rc(storefd, "ck@.."), -ENOENT);
	CHECK_EQ(open_rc(storefd, "ck@"), -ENOENT);
	CHECK_EQ(open_rc(storefd, "@global_step1"), -ENOENT);
	CHECK_EQ(open_rc(storefd, "ck/x@global_step1"), -ENOENT);
	CHECK_EQ(open_rc(storefd, "ck"), -ENOENT);

	/* identities: ck is the tag latest names; ck@global_step1 its own */
	CHECK_EQ(sf_store_ident(storefd, "ck", &dev, &ino), 0);
	CHECK(fstatat(storefd, "ck/global_step2", &sb, 0) == 0 && sb.st_ino == ino);
	CHECK_EQ(sf_store_ident(storefd, "ck@global_step1", &dev, &ino), 0);
	CHECK(fstatat(storefd, "ck/global_step1", &sb, 0) == 0 && sb.st_ino == ino);
	fd = openat(storefd, "ck", O_RDONLY | O_DIRECTORY);
	CHECK_EQ(sf_dstags_latest_ident(fd, &dev, &ino), 0);
	CHECK(fstatat(storefd, "ck/global_step2", &sb, 0) == 0 && sb.st_ino == ino);
	close(fd);

	/* variants: none of these is listed or opened */
	sh("cd %s/store/ck && mv global_step1 ../outside/g1 && ln -s ../outside/g1 global_step1 && "
	   "cp -r global_step2 .hidden && cp -r global_step2 'a@b' && mkdir empty && "
	   "cp -r global_step2 %s", tmp, "copy");
	got[0] = '\0';
	CHECK_EQ(sf_dstags_list(storefd, "ck", collect, got), 0);
	CHECK(strcmp(got, "ck@copy;") == 0);
	CHECK_EQ(open_rc(storefd, "ck@global_step1"), -ELOOP);
	CHECK_EQ(open_rc(storefd, "ck@.hidden"), -ENOENT);
	CHECK_EQ(open_rc(storefd, "ck@a@b"), -ENOENT);
	CHECK_EQ(open_rc(storefd, "ck@empty"), -ENOENT);
	CHECK_EQ(sf_store_ident(storefd, "ck@global_step1", &dev, &ino), -ELOOP);
	/* a store entry of that name is shown as it is, not as a tag */
	sh("mkdir %s/store/ck@copy%s", tmp, "");
	got[0] = '\0';
	CHECK_EQ(sf_dstags_list(storefd, "ck", collect, got), 0);
	CHECK(strcmp(got, "") == 0);
	sh("rmdir %s/store/ck@copy%s", tmp, "");
	/* latest naming a path out, or a symlink: no tags at all */
	sh("cd %s/store/ck && printf '../outside/g1' > latest%s", tmp, "");
	got[0] = '\0';
	CHECK_EQ(sf_dstags_list(storefd, "ck", collect, got), 0);
	CHECK(strcmp(got, "") == 0);
	CHECK_EQ(open_rc(storefd, "ck@copy"), -ENOENT);
	fd = openat(storefd, "ck", O_RDONLY | O_DIRECTORY);
	CHECK_EQ(sf_dstags_latest_ident(fd, &dev, &ino), -ENOENT);
	close(fd);
	sh("cd %s/store/ck && rm latest && ln -s ../outside/latest latest && "
	   "printf global_step2 > ../outside/latest%s", tmp, "");
	got[0] = '\0';
	CHECK_EQ(sf_dstags_list(storefd, "ck", collect, got), 0);
	CHECK(strcmp(got, "") == 0);

	close(storefd);
	sh("rm -rf %s%s", tmp, "");
	return sf_test_done("test_dstags");
}
