/*
 * test_whereis.c - core/sf_whereis.c, the decoder of user.shardfs.where,
 * on values written as fs/sf_fs_where.c writes them (a shard as
 * manifest.json lists it, plus path and identity or "why"):
 *   - flat ranges and boxes that are one run of the tensor are given with
 *     their tensor offsets, sorted; column boxes (rows spread with one
 *     pitch) only where the shards given tile the tensor; boxes of runs in
 *     two dimensions, shards without a path, strides, codecs and
 *     checksums that do not cover the shard are not (nother, the first
 *     reason kept), and a replica is dropped;
 *   - geometry outside the tensor, a value of another tensor, bad JSON,
 *     oversize text fail with -SF_EMANIFEST / -SF_ETOOBIG and a message;
 *   - sf_whereis_shape decodes "[2,3]" and refuses the rest.
 */
#include "sf_test.h"

#include <string.h>

#include "sf_checksum.h"
#include "sf_error.h"
#include "sf_whereis.h"

#define SUM1 "\"00000000000000aa\""
#define ID ",\"path\":\"/s/f\",\"dev\":1,\"ino\":2,\"size\":100000,\"mtime_ns\":3"

static int parse(const char *text, unsigned ndim, const uint64_t *shape,
		 uint64_t nbytes, struct sf_whereis **w, char *err)
{
	return sf_whereis_parse(text, strlen(text), ndim, shape, nbytes, w, err,
				128);
}

static void test_given(void)
{
	/* a [4, 8] F32 tensor (128 bytes): rows 0-1 and 2-3 as boxes of rank
	 * 0 and 1 (the second listed first), a replica of rows 2-3, a column
	 * box (not one run) */
	static const uint64_t shape[2] = { 4, 8 };
	const char *text =
		"{\"block_size\":64,\"nbytes\":128,\"shards\":["
		"{\"shard\":{\"rank\":1,\"offsets\":[2,0],\"lengths\":[2,8],\"file\":\"b\","
		"\"file_offset\":16,\"nbytes\":64,\"xxh3\":[" SUM1 "]}" ID "},"
		"{\"shard\":{\"rank\":0,\"offsets\":[0,0],\"lengths\":[2,8],\"file\":\"a\","
		"\"file_offset\":0,\"nbytes\":64,\"xxh3\":[\"00000000000000bb\"]}" ID "},"
		"{\"shard\":{\"rank\":2,\"offsets\":[2,0],\"lengths\":[2,8],\"file\":\"c\","
		"\"file_offset\":0,\"nbytes\":64,\"xxh3\":[" SUM1 "]}" ID "},"
		"{\"shard\":{\"rank\":3,\"offsets\":[0,0],\"lengths\":[4,4],\"file\":\"d\","
		"\"file_offset\":0,\"nbytes\":64,\"xxh3\":[" SUM1 "]}" ID "}]}";
	struct sf_whereis *w = NULL;
	char err[128];

	CHECK_EQ(parse(text, 2, shape, 128, &w, err), 0);
	if (!CHECK(w))
		return;
	CHECK_EQ(w->block_size, 64);
	CHECK_EQ(w->n, 2);
	CHECK_EQ(w->s[0].toff, 0);
	CHECK_EQ(w->s[0].xxh3[0], 0xbb);
	CHECK_EQ(w->s[1].toff, 64);
	CHECK_EQ(w->s[1].file_offset, 16); /* the first listed of the replicas */
	CHECK(!strcmp(w->s[1].path, "/s/f"));
	CHECK_EQ(w->s[1].ino, 2);
	CHECK_EQ(w->s[1].mtime_ns, 3);
	CHECK_EQ(w->nother, 2);
	CHECK(!w->spread);
	CHECK(!strcmp(w->why, "a replica"));
	sf_whereis_free(w);

	/* the same for a tensor of unknown shape: boxes are not given */
	CHECK_EQ(parse(text, SF_WHEREIS_NOSHAPE, NULL, 128, &w, err), 0);
	CHECK(w && w->n == 0 && w->nother == 4);
	sf_whereis_free(w);
}

static void test_spread(void)
{
	/* [4, 8] F32 as two column blocks [0:4, 0:4] and [0:4, 4:8] (64
	 * bytes each: 4 rows of 16 bytes every 32), a replica of the first;
	 * then a [2, 4, 4] U8 tensor cut in its last two dimensions */
	static const uint64_t shape[2] = { 4, 8 }, shape3[3] = { 2, 4, 4 };
	const char *cols =
		"{\"block_size\":64,\"nbytes\":128,\"shards\":["
		"{\"shard\":{\"rank\":1,\"offsets\":[0,4],\"lengths\":[4,4],\"file\":\"b\","
		"\"file_offset\":0,\"nbytes\":64,\"xxh3\":[" SUM1 "]}" ID "},"
		"{\"shard\":{\"rank\":0,\"offsets\":[0,0],\"lengths\":[4,4],\"file\":\"a\","
		"\"file_offset\":0,\"nbytes\":64,\"xxh3\":[" SUM1 "]}" ID "},"
		"{\"shard\":{\"rank\":2,\"offsets\":[0,0],\"lengths\":[4,4],\"file\":\"c\","
		"\"file_offset\":0,\"nbytes\":64,\"xxh3\":[" SUM1 "]}" ID "}]}";
	const char *half =  /* one column block has no path: the other is not given */
		"{\"block_size\":64,\"nbytes\":128,\"shards\":["
		"{\"shard\":{\"rank\":1,\"offsets\":[0,4],\"lengths\":[4,4],\"file\":\"b\","
		"\"file_offset\":0,\"nbytes\":64,\"xxh3\":[" SUM1 "]},\"why\":\"x\"},"
		"{\"shard\":{\"rank\":0,\"offsets\":[0,0],\"lengths\":[4,4],\"file\":\"a\","
		"\"file_offset\":0,\"nbytes\":64,\"xxh3\":[" SUM1 "]}" ID "}]}";
	const char *two =
		"{\"block_size\":64,\"nbytes\":32,\"shards\":["
		"{\"shard\":{\"rank\":0,\"offsets\":[0,0,0],\"lengths\":[2,2,2],\"file\":\"a\","
		"\"file_offset\":0,\"nbytes\":8,\"xxh3\":[" SUM1 "]}" ID "}]}";
	struct sf_whereis *w = NULL;
	char err[128];

	CHECK_EQ(parse(cols, 2, shape, 128, &w, err), 0);
	if (CHECK(w && w->n == 2)) {
		CHECK(w->spread);
		CHECK(w->s[0].toff == 0 && w->s[0].run == 16 && w->s[0].pitch == 32);
		CHECK(w->s[1].toff == 16 && w->s[1].run == 16 && w->s[1].pitch == 32);
		CHECK_EQ(w->nother, 1);
	}
	sf_whereis_free(w);
	CHECK_EQ(parse(half, 2, shape, 128, &w, err), 0);
	CHECK(w && w->n == 0 && !w->spread && w->nother == 2 && !strcmp(w->why, "x"));
	sf_whereis_free(w);
	CHECK_EQ(parse(two, 3, shape3, 32, &w, err), 0);
	CHECK(w && w->n == 0 && w->nother == 1 &&
	      !strcmp(w->why, "a box of runs in more than one dimension"));
	sf_whereis_free(w);
}

static void test_flat_and_refused(void)
{
	/* 100 bytes of U8 as flat [0,40) and [40,100), 32-byte blocks: 2 and
	 * 2 checksums; then the same with reasons not to read them */
	const char *ok =
		"{\"block_size\":32,\"nbytes\":100,\"shards\":["
		"{\"shard\":{\"rank\":0,\"flat\":[40,60],\"file\":\"a\",\"file_offset\":8,"
		"\"nbytes\":60,\"xxh3\":[" SUM1 "," SUM1 "]}" ID "},"
		"{\"shard\":{\"rank\":1,\"flat\":[0,40],\"file\":\"b\",\"file_offset\":0,"
		"\"nbytes\":40,\"xxh3\":[" SUM1 "," SUM1 "]}" ID "}]}";
	const char *others =
		"{\"block_size\":32,\"nbytes\":100,\"shards\":["
		"{\"shard\":{\"rank\":0,\"flat\":[0,40],\"file\":\"a\",\"file_offset\":0,"
		"\"nbytes\":40,\"xxh3\":[" SUM1 "," SUM1 "]},\"why\":\"not in this node's store\"},"
		"{\"shard\":{\"rank\":1,\"flat\":[40,30],\"file\":\"b\",\"file_offset\":0,"
		"\"nbytes\":30,\"xxh3\":[" SUM1 "]}" ID "},"
		"{\"shard\":{\"rank\":1,\"flat\":[70,30],\"file\":\"b\",\"file_offset\":0,"
		"\"nbytes\":30,\"codec\":\"zstd\",\"xxh3\":[" SUM1 "]}" ID "}]}";
	static const uint64_t shape[1] = { 100 };
	struct sf_whereis *w = NULL;
	char err[128];

	CHECK_EQ(parse(ok, 1, shape, 100, &w, err), 0);
	CHECK(w && w->n == 2 && w->s[0].toff == 0 && w->s[1].toff == 40 &&
	      w->s[1].nblocks == 2 && w->nother == 0 && !w->why[0]);
	sf_whereis_free(w);
	CHECK_EQ(parse(others, 1, shape, 100, &w, err), 0);
	CHECK(w && w->n == 1 && w->s[0].toff == 40 && w->nother == 2);
	CHECK(w && !strcmp(w->why, "not in this node's store"));
	sf_whereis_free(w);
}

static void test_failures(void)
{
	static const uint64_t shape[2] = { 4, 8 };
	static const char *bad[] = {
		"", "[]", "{\"block_size\":64,\"nbytes\":128}",
		"{\"block_size\":0,\"nbytes\":128,\"shards\":[]}",
		"{\"block_size\":64,\"nbytes\":127,\"shards\":[]}",
		"{\"block_size\":64,\"nbytes\":128,\"shards\":[]",
		"{\"block_size\":64,\"block_size\":64,\"nbytes\":128,\"shards\":[]}",
		/* a box past the shape, a rank short, bytes not its elements' */
		"{\"block_size\":64,\"nbytes\":128,\"shards\":[{\"shard\":{\"offsets\":[3,0],"
		"\"lengths\":[2,8],\"file_offset\":0,\"nbytes\":64}}]}",
		"{\"block_size\":64,\"nbytes\":128,\"shards\":[{\"shard\":{\"offsets\":[0],"
		"\"lengths\":[2],\"file_offset\":0,\"nbytes\":64}}]}",
		"{\"block_size\":64,\"nbytes\":128,\"shards\":[{\"shard\":{\"offsets\":[0,0],"
		"\"lengths\":[2,8],\"file_offset\":0,\"nbytes\":63}}]}",
		"{\"block_size\":64,\"nbytes\":128,\"shards\":[{\"shard\":{\"flat\":[100,64],"
		"\"file_offset\":0,\"nbytes\":64}}]}",
		"{\"block_size\":64,\"nbytes\":128,\"shards\":[{\"shard\":{\"flat\":[-1,64],"
		"\"file_offset\":0,\"nbytes\":64}}]}",
	};
	struct sf_whereis *w = (void *)1;
	char err[128], *big;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		CHECK_EQ(parse(bad[i], 2, shape, 128, &w, err), -SF_EMANIFEST);
		CHECK(w == NULL && err[0]);
	}
	big = malloc(SF_WHEREIS_MAX + 2);
	memset(big, ' ', SF_WHEREIS_MAX + 1);
	big[SF_WHEREIS_MAX + 1] = '\0';
	CHECK_EQ(parse(big, 2, shape, 128, &w, err), -SF_ETOOBIG);
	free(big);
	/* a tensor whose bytes are not whole elements of its shape */
	CHECK_EQ(parse("{}", 2, shape, 129, &w, err), -SF_EMANIFEST);
}

static void test_shape(void)
{
	uint64_t sh[SF_MAX_NDIM];
	unsigned nd = 99;

	CHECK_EQ(sf_whereis_shape("[2,3]", 5, &nd, sh), 0);
	CHECK(nd == 2 && sh[0] == 2 && sh[1] == 3);
	CHECK_EQ(sf_whereis_shape("[]", 2, &nd, sh), 0);
	CHECK_EQ(nd, 0);
	CHECK_EQ(sf_whereis_shape("[-1]", 4, &nd, sh), -SF_EMANIFEST);
	CHECK_EQ(sf_whereis_shape("{}", 2, &nd, sh), -SF_EMANIFEST);
	CHECK_EQ(sf_whereis_shape("[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", 35, &nd, sh),
		 -SF_EMANIFEST);
}

int main(void)
{
	test_given();
	test_spread();
	test_flat_and_refused();
	test_failures();
	test_shape();
	return sf_test_done("test_whereis");
}
