/*
 * fuzz_save_marker.c - libFuzzer target for the body of a save's marker
 * (sf_save_marker_parse, sf_save_marker_body; core/sf_save.c): under MPI a
 * daemon reads it from a peer's store to learn who may remove a save it
 * holds none of the files of.
 *
 * Input: the marker's bytes, whole. For any input:
 *   - the parse answers 0 or -SF_EFORMAT, and refuses anything longer
 *     than SF_SAVE_MARKER_MAX bytes or holding a NUL;
 *   - on 0, the uid is not (uid_t)-1, and the body written for that uid
 *     (and gid, or 0 when the input did not name one) fits in
 *     SF_SAVE_MARKER_MAX bytes and parses back to the same uid and gid;
 *   - a parse never changes *uid or *gid when it fails.
 * Any violation aborts. The input is not NUL-terminated, so an over-read
 * shows under ASan.
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_save.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_save_marker";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char body[SF_SAVE_MARKER_MAX];
	uid_t u = 7, u2 = 0;
	gid_t g = 7, g2 = 0;
	size_t n;
	int rc = sf_save_marker_parse((const char *)data, size, &u, &g);

	if (rc != 0 && rc != -SF_EFORMAT)
		fuzz_die("parse", "an undocumented error");
	if (rc) {
		if (u != 7 || g != 7)
			fuzz_die("parse", "changed its outputs on failure");
		return 0;
	}
	if (size > SF_SAVE_MARKER_MAX || memchr(data, '\0', size))
		fuzz_die("parse", "took an input it must refuse");
	if (u == (uid_t)-1)
		fuzz_die("parse", "uid -1");
	if (g == (gid_t)-1)
		g = 0;
	n = sf_save_marker_body(u, g, body, sizeof(body));
	if (n == 0 || n >= sizeof(body))
		fuzz_die("body", "does not fit");
	if (sf_save_marker_parse(body, n, &u2, &g2) != 0 || u2 != u || g2 != g)
		fuzz_die("body", "does not parse back to the same saver");
	return 0;
}
