/*
 * test_hub.c - the Hugging Face hub cache in core: sf_open_hub (links
 * followed by shardfs itself, to regular files of the repository's blobs/
 * only) and sf_hub.c (repository names, shown names, opening a snapshot),
 * on a copy of the cache huggingface_hub wrote (test/fixtures/hf-hub) and
 * on link texts made here.
 *
 *   test_hub FIXTURES_DIR    (test/fixtures/hf-hub/huggingface_hub-2.4/hub)
 */
#include "sf_test.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sf_hub.h"
#include "sf_open.h"

#define REPO "models--shardfs-test--tiny-llama"

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
	strcat(out, name);
	strcat(out, ";");
	return 0;
}

/* snapshot REV's file name opened with sf_open_hub: fd or -errno */
static int open_in(int storefd, const char *name, const char *file,
		   char *target, size_t tlen)
{
	struct sf_hub_snap hs;
	int rc = sf_hub_open(storefd, name, &hs), fd;

	if (rc)
		return rc;
	fd = sf_open_hub(hs.dirfd, hs.blobsfd, file, O_RDONLY, target, tlen);
	close(hs.dirfd);
	close(hs.blobsfd);
	return fd;
}

int main(int argc, char **argv)
{
	char shown[256], names[4096] = "", target[512], p[PATH_MAX], q[PATH_MAX];
	char main_rev[64] = "", snapdir[512];
	struct sf_hub_snap hs;
	int storefd, fd, n;
	FILE *f;

	if (argc != 2)
		sf_test_skip("test_hub", "usage: test_hub FIXTURES_DIR");
	sf_test_seed("test_hub", 1);
	/* names */
	CHECK(sf_hub_repo_name("models--org--name", shown, sizeof(shown)));
	CHECK(strcmp(shown, "org/name") == 0);
	CHECK(sf_hub_repo_name("models--gpt2", shown, sizeof(shown)));
	CHECK(strcmp(shown, "gpt2") == 0);
	CHECK(!sf_hub_repo_name("models--a--b--c", shown, sizeof(shown)));
	CHECK(!sf_hub_repo_name("models--.x--y", shown, sizeof(shown)));
	CHECK(!sf_hub_repo_name("models--x--y@z", shown, sizeof(shown)));
	CHECK(!sf_hub_repo_name("models--", shown, sizeof(shown)));
	CHECK(!sf_hub_repo_name("datasets--a--b", shown, sizeof(shown)));
	CHECK(sf_hub_other_repo("datasets--a--b"));

	snprintf(tmp, sizeof(tmp), "/tmp/sf-test-hub-XXXXXX");
	if (!mkdtemp(tmp))
		return 1;
	sh("cp -a %s %s/hub", argv[1], tmp);
	snprintf(p, sizeof(p), "%s/hub", tmp);
	storefd = open(p, O_RDONLY | O_DIRECTORY);
	CHECK(storefd >= 0);
	snprintf(p, sizeof(p), "%s/hub/" REPO "/refs/main", tmp);
	f = fopen(p, "r");
	CHECK(f && fscanf(f, "%63s", main_rev) == 1);
	if (f)
		fclose(f);

	/* listing: ORG/NAME for refs/main's snapshot, ORG/NAME@REV else */
	CHECK_EQ(sf_hub_list(storefd, REPO, collect, names), 0);
	CHECK(strstr(names, "shardfs-test/tiny-llama;") != NULL);
	CHECK(strstr(names, "shardfs-test/tiny-llama@") != NULL);
	snprintf(p, sizeof(p), "shardfs-test/tiny-llama@%s;", main_rev);
	CHECK(strstr(names, p) == NULL);

	/* opening: the snapshot refs/main names, and by REV */
	CHECK_EQ(sf_hub_open(storefd, "shardfs-test/tiny-llama", &hs), 0);
	CHECK(hs.is_main);
	snprintf(p, sizeof(p), REPO "/snapshots/%s", main_rev);
	CHECK(strcmp(hs.rel, p) == 0);
	close(hs.dirfd);
	close(hs.blobsfd);
	snprintf(p, sizeof(p), "shardfs-test/tiny-llama@%s", main_rev);
	CHECK_EQ(sf_hub_open(storefd, p, &hs), 0);
	CHECK(hs.is_main);
	close(hs.dirfd);
	close(hs.blobsfd);
	CHECK_EQ(sf_hub_open(storefd, "shardfs-test/nothere", &hs), -ENOENT);
	CHECK_EQ(sf_hub_open(storefd, "shardfs-test/tiny-llama@..", &hs), -ENOENT);
	CHECK_EQ(sf_hub_open(storefd, "../x", &hs), -ENOENT);
	CHECK_EQ(sf_hub_open(storefd, "a/b/c", &hs), -ENOENT);
	/* only the name it is shown by (fuzz_hub found this alias) */
	CHECK_EQ(sf_hub_open(storefd, "shardfs-test--tiny-llama", &hs), -ENOENT);
	CHECK_EQ(sf_hub_open(storefd, "tiny-bin", &hs), 0);
	close(hs.dirfd);
	close(hs.blobsfd);

	/* the real links: followed into blobs/ */
	fd = open_in(storefd, "shardfs-test/tiny-llama", "config.json", NULL, 0);
	CHECK(fd >= 0);
	if (fd >= 0)
		close(fd);
	fd = open_in(storefd, "shardfs-test/tiny-llama", "nothere", NULL, 0);
	CHECK_EQ(fd, -ENOENT);

	/* hostile link texts in the main snapshot: none followed */
	snprintf(snapdir, sizeof(snapdir), "%s/hub/" REPO "/snapshots/%s", tmp,
		 main_rev);
	{
		static const char *const bad[] = {
			"/etc/passwd", "../../refs/main", "../blobs/x",
			"../../../" REPO "/blobs/x", "../../blobs/../refs/main",
			"../../blobs/", "../../blobs/.", "../../blobs/..",
			"./../../blobs/x", "../../blobs//x", "x",
		};

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			snprintf(p, sizeof(p), "%s/evil", snapdir);
			unlink(p);
			CHECK(symlink(bad[i], p) == 0);
			fd = open_in(storefd, "shardfs-test/tiny-llama", "evil",
				     target, sizeof(target));
			if (!CHECK_EQ(fd, -EXDEV))
				fprintf(stderr, "  link text %s\n", bad[i]);
			if (fd >= 0)
				close(fd);
			CHECK(strcmp(target, bad[i]) == 0);
		}
	}
	/* a link into blobs/ whose blob is a symlink, a directory, dangling */
	snprintf(p, sizeof(p), "%s/hub/" REPO "/blobs/lnk", tmp);
	CHECK(symlink("/etc/passwd", p) == 0);
	snprintf(p, sizeof(p), "%s/hub/" REPO "/blobs/dir", tmp);
	CHECK(mkdir(p, 0755) == 0);
	snprintf(p, sizeof(p), "%s/evil", snapdir);
	unlink(p);
	CHECK(symlink("../../blobs/lnk", p) == 0);
	CHECK_EQ(open_in(storefd, "shardfs-test/tiny-llama", "evil", NULL, 0), -ELOOP);
	unlink(p);
	CHECK(symlink("../../blobs/dir", p) == 0);
	CHECK_EQ(open_in(storefd, "shardfs-test/tiny-llama", "evil", NULL, 0), -EINVAL);
	unlink(p);
	CHECK(symlink("../../blobs/missing", p) == 0);
	CHECK_EQ(open_in(storefd, "shardfs-test/tiny-llama", "evil", NULL, 0), -ENOENT);
	CHECK_EQ(sf_hub_open(storefd, "shardfs-test/tiny-llama", &hs), 0);
	CHECK(sf_hub_incomplete(hs.dirfd, hs.blobsfd));
	unlink(p);
	CHECK(!sf_hub_incomplete(hs.dirfd, hs.blobsfd));
	close(hs.dirfd);
	close(hs.blobsfd);
	/* one level down: one more "../" */
	snprintf(p, sizeof(p), "%s/sub", snapdir);
	CHECK(mkdir(p, 0755) == 0);
	snprintf(p, sizeof(p), "%s/sub/cfg", snapdir);
	snprintf(q, sizeof(q), "%s/config.json", snapdir);
	n = (int)readlink(q, target, sizeof(target) - 1);
	CHECK(n > 0);
	target[n > 0 ? n : 0] = '\0';
	snprintf(q, sizeof(q), "../%s", target);
	CHECK(symlink(q, p) == 0);
	fd = open_in(storefd, "shardfs-test/tiny-llama", "sub/cfg", NULL, 0);
	CHECK(fd >= 0);
	if (fd >= 0)
		close(fd);
	/* the same text one level down leads to snapshots/blobs: refused */
	unlink(p);
	CHECK(symlink(target, p) == 0);
	CHECK_EQ(open_in(storefd, "shardfs-test/tiny-llama", "sub/cfg", NULL, 0), -EXDEV);
	/* a directory on the way that is a symlink */
	snprintf(p, sizeof(p), "%s/subl", snapdir);
	CHECK(symlink("sub", p) == 0);
	CHECK_EQ(open_in(storefd, "shardfs-test/tiny-llama", "subl/cfg", NULL, 0), -EXDEV);
	/* a snapshot directory that is a symlink, a repository that is one */
	snprintf(p, sizeof(p), "%s/hub/" REPO "/snapshots/abc", tmp);
	CHECK(symlink(main_rev, p) == 0);
	CHECK_EQ(sf_hub_open(storefd, "shardfs-test/tiny-llama@abc", &hs), -ELOOP);
	snprintf(p, sizeof(p), "%s/hub/models--x--y", tmp);
	CHECK(symlink(REPO, p) == 0);
	CHECK_EQ(sf_hub_open(storefd, "x/y", &hs), -ELOOP);

	/* a snapshot as the store: its ../../blobs */
	fd = open(snapdir, O_RDONLY | O_DIRECTORY);
	n = sf_hub_store_blobs(fd, snapdir);
	CHECK(n >= 0);
	if (n >= 0)
		close(n);
	close(fd);
	snprintf(p, sizeof(p), "%s/hub/" REPO, tmp);
	fd = open(p, O_RDONLY | O_DIRECTORY);
	CHECK_EQ(sf_hub_store_blobs(fd, p), -ENOENT);
	close(fd);

	close(storefd);
	sh("rm -rf %s%s", tmp, "");
	return sf_test_done("test_hub");
}
