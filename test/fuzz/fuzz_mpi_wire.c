/*
 * fuzz_mpi_wire.c - libFuzzer target for the MPI wire format
 * (mpi/sf_mpi_wire.c): the bytes a peer daemon sends, without MPI.
 *
 * Every input goes through every decoder, as a request (with two reply-tag
 * bounds), a read reply (for two expected sizes), a commit verdict, an
 * inventory and a heartbeat. For each, either the decoder refuses it with
 * its documented error (-SF_EPEER; a read reply may also give the peer's own error) and
 * a consistent reason, or it returns a view whose every pointer and length
 * lies inside the input, whose fields keep their caps, and whose
 * re-encoding gives back the input byte for byte; the status a COMMIT_DONE
 * or a verdict carries maps into the documented error ranges. Any
 * violation aborts (a crash for libFuzzer and for the replay driver). The
 * input is not NUL-terminated and is used in place, so an over-read shows
 * under ASan.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "sf_error.h"
#include "sf_mpi_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

const char fuzz_target[] = "fuzz_mpi_wire";

/* [p, p + len) lies inside [base, base + size). */
static int inside(const void *p, size_t len, const uint8_t *base, size_t size)
{
	const uint8_t *q = p;

	return q >= base && q <= base + size && len <= (size_t)(base + size - q);
}

static void check_req(const uint8_t *data, size_t size, int32_t tag_ub)
{
	struct sf_mpi_wire_req r;
	struct sf_mpi_wire_reject rej;
	unsigned char *again;
	size_t n;
	int ret;

	memset(&rej, 0x5a, sizeof(rej));
	ret = sf_mpi_wire_req_decode(data, size, tag_ub, &r, &rej);
	if (ret < 0) {
		if (ret != -SF_EPEER)
			fuzz_die("request", "undocumented error");
		if (!memchr(rej.why, '\0', sizeof(rej.why)) || !rej.why[0])
			fuzz_die("request", "no reason");
		if (rej.answer != 0 && rej.answer != -SF_EPEER &&
		    rej.answer != -SF_ETOOBIG && rej.answer != -EINVAL)
			fuzz_die("request", "undocumented answer");
		if (rej.answer && (rej.reply_tag < SF_MPI_WIRE_TAG_BASE ||
				   rej.reply_tag > tag_ub))
			fuzz_die("request", "answer to an untrusted tag");
		if (rej.text && rej.answer != -SF_ETOOBIG)
			fuzz_die("request", "text without a reason for it");
		return;
	}
	if (r.kind < SF_MPI_MSG_READ || r.kind > SF_MPI_MSG_INV_LIST ||
	    r.name_len > SF_MAX_COMPONENT || r.file_len > SF_MAX_NAME)
		fuzz_die("request", "field over its cap");
	if ((const uint8_t *)r.name != data + sizeof(struct sf_mpi_wire_hdr) ||
	    !inside(r.name, r.name_len, data, size) ||
	    r.file != r.name + r.name_len ||
	    !inside(r.file, r.file_len, data, size))
		fuzz_die("request", "name or file outside the input");
	if (memchr(r.name, '\0', r.name_len) || memchr(r.file, '\0', r.file_len) ||
	    !sf_mpi_wire_ckpt_name_ok(r.name, r.name_len))
		fuzz_die("request", "bad name accepted");
	if ((r.kind == SF_MPI_MSG_INV_NAME || r.kind == SF_MPI_MSG_INV_LIST) &&
	    r.file_len)
		fuzz_die("request", "inventory request with a file accepted");
	if (r.kind == SF_MPI_MSG_INV_NAME && r.len > SF_MPI_WIRE_MAX_INV_FILES)
		fuzz_die("request", "notice over the file cap accepted");
	if (r.kind == SF_MPI_MSG_COMMIT_PART) {
		if (r.data != (const unsigned char *)r.file + r.file_len ||
		    r.len > SF_MPI_MAX_PART || !inside(r.data, r.len, data, size) ||
		    r.data + r.len != data + size)
			fuzz_die("request", "part outside the input");
	} else if (r.data || (const uint8_t *)r.file + r.file_len != data + size) {
		fuzz_die("request", "bytes after the names");
	}
	if (r.kind == SF_MPI_MSG_READ &&
	    (r.len == 0 || r.len > SF_MPI_MAX_MSG || r.off > UINT64_MAX - r.len))
		fuzz_die("request", "bad read accepted");
	if (r.kind <= SF_MPI_MSG_COMMIT_DONE &&
	    (r.reply_tag < SF_MPI_WIRE_TAG_BASE || r.reply_tag > tag_ub))
		fuzz_die("request", "bad reply tag accepted");
	if (r.kind == SF_MPI_MSG_NOTICE && !sf_mpi_wire_what_ok(r.file, r.file_len))
		fuzz_die("request", "bad notice accepted");
	if (r.kind == SF_MPI_MSG_COMMIT_DONE) {
		int st = sf_mpi_wire_publish_status(r.status);

		if (st > 0 || (r.status >= 0 && st) ||
		    (r.status < 0 && (st != r.status && st != -EIO)) ||
		    st < -SF_ERR_LAST)
			fuzz_die("request", "publish status out of its ranges");
	}
	if (sf_mpi_wire_req_size(&r, &n) != 0 || n != size)
		fuzz_die("request", "size of the re-encoding differs");
	again = malloc(n);
	if (!again)
		fuzz_die("out of memory", NULL);
	if (sf_mpi_wire_req_encode(&r, again, n) != 0 || memcmp(again, data, n))
		fuzz_die("request", "re-encoding differs");
	free(again);
}

/* A decoded reply or verdict must re-encode to exactly its input. */
static void check_reply_reencodes(const uint8_t *data, size_t size,
				  const struct sf_mpi_wire_reply *rp,
				  const char *what)
{
	unsigned char *again = malloc(size);

	if (!again)
		fuzz_die("out of memory", NULL);
	sf_mpi_wire_reply_encode(again, rp->status, rp->data, rp->len);
	if (memcmp(again, data, size))
		fuzz_die(what, "re-encoding differs");
	free(again);
}

static void check_read_reply(const uint8_t *data, size_t size, size_t want)
{
	struct sf_mpi_wire_reply rp;
	int64_t status;
	int ret;

	ret = sf_mpi_wire_read_reply_decode(data, size, want, &rp);
	if (ret < 0) {
		if (ret == -SF_EPEER)
			return;
		/* the peer's own error: a bare status in its range */
		if (size != 8)
			fuzz_die("read reply", "undocumented error");
		memcpy(&status, data, 8);
		if (status != ret || ret <= -SF_ERR_LAST)
			fuzz_die("read reply", "undocumented error");
		return;
	}
	if (ret != 0 || rp.status != 0 || rp.len != want ||
	    rp.data != data + 8 || size != 8 + want)
		fuzz_die("read reply", "bad view");
	check_reply_reencodes(data, size, &rp, "read reply");
}

static void check_verdict(const uint8_t *data, size_t size)
{
	struct sf_mpi_wire_reply v;
	char text[SF_MPI_WIRE_MAX_WHAT];
	int ret, err;

	ret = sf_mpi_wire_verdict_decode(data, size, &v);
	if (ret < 0) {
		if (ret != -SF_EPEER ||
		    (size >= 8 && size <= SF_MPI_WIRE_MAX_VERDICT))
			fuzz_die("verdict", "refused a framed verdict");
		return;
	}
	if (size < 8 || v.data != data + 8 || v.len != size - 8)
		fuzz_die("verdict", "bad view");
	err = sf_mpi_wire_verdict_error(v.status);
	if (err > 0 || (v.status >= 0 && err) || (v.status < 0 && !err) ||
	    err < -SF_ERR_LAST)
		fuzz_die("verdict", "bad error");
	sf_mpi_wire_text(text, sizeof(text), v.data, v.len);
	if (strlen(text) != (v.len < sizeof(text) ? v.len : sizeof(text) - 1))
		fuzz_die("verdict", "text length");
	for (size_t i = 0; text[i]; i++)
		if ((unsigned char)text[i] < 0x20)
			fuzz_die("verdict", "control character in the text");
	check_reply_reencodes(data, size, &v, "verdict");
}

struct inv_check {
	const uint8_t *data;
	size_t size;
	size_t next;             /* where the next record must start */
	struct sf_mpi_wire_inv_buf again;
};

static int inv_rec(void *arg, const struct sf_mpi_wire_inv_rec *rec)
{
	struct inv_check *c = arg;
	char file[SF_MAX_NAME + 1];

	if ((const uint8_t *)rec->name != c->data + c->next + SF_MPI_WIRE_INV_REC ||
	    !inside(rec->name, rec->name_len, c->data, c->size) ||
	    rec->file != rec->name + rec->name_len ||
	    !inside(rec->file, rec->file_len, c->data, c->size))
		fuzz_die("inventory", "record outside the input");
	if (rec->name_len > SF_MAX_COMPONENT || rec->file_len == 0 ||
	    rec->file_len > SF_MAX_NAME ||
	    !sf_mpi_wire_ckpt_name_ok(rec->name, rec->name_len) ||
	    memchr(rec->name, '\0', rec->name_len))
		fuzz_die("inventory", "bad name accepted");
	memcpy(file, rec->file, rec->file_len);
	file[rec->file_len] = '\0';
	if (strlen(file) != rec->file_len || !sf_relpath_valid(file))
		fuzz_die("inventory", "bad file accepted");
	c->next += SF_MPI_WIRE_INV_REC + rec->name_len + rec->file_len;
	sf_mpi_wire_inv_put(&c->again, rec->name, rec->name_len, rec->file,
			    rec->file_len, rec->size);
	return 0;
}

static void check_inventory(const uint8_t *data, size_t size)
{
	struct inv_check c = { .data = data, .size = size };
	size_t bad_at = SIZE_MAX;
	int ret;

	ret = sf_mpi_wire_inv_parse(data, size, inv_rec, &c, &bad_at);
	if (ret < 0) {
		if (ret != -SF_EPEER || bad_at != c.next || bad_at >= size)
			fuzz_die("inventory", "bad refusal");
	} else if (ret != 0 || c.next != size || c.again.ret ||
		   c.again.len != size ||
		   (size && memcmp(c.again.p, data, size))) {
		fuzz_die("inventory", "re-encoding differs");
	}
	sf_mpi_wire_inv_release(&c.again);
}

struct sum_check {
	const uint8_t *data;
	size_t size;
	size_t next;             /* where the next summary must start */
	struct sf_mpi_wire_inv_buf again;
};

static int sum_rec(void *arg, const char *name, size_t nl, uint64_t files)
{
	struct sum_check *c = arg;

	if ((const uint8_t *)name != c->data + c->next + SF_MPI_WIRE_SUM_REC ||
	    !inside(name, nl, c->data, c->size))
		fuzz_die("summary", "name outside the input");
	if (nl > SF_MAX_COMPONENT || !sf_mpi_wire_ckpt_name_ok(name, nl) ||
	    memchr(name, '\0', nl) || files == 0 ||
	    files > SF_MPI_WIRE_MAX_INV_FILES)
		fuzz_die("summary", "bad summary accepted");
	c->next += SF_MPI_WIRE_SUM_REC + nl;
	sf_mpi_wire_sum_put(&c->again, name, nl, files);
	return 0;
}

/* Start-up summaries: refused at the first bad one, or re-encoded to the
 * input byte for byte. */
static void check_summary(const uint8_t *data, size_t size)
{
	struct sum_check c = { .data = data, .size = size };
	size_t bad_at = SIZE_MAX;
	int ret = sf_mpi_wire_sum_parse(data, size, sum_rec, &c, &bad_at);

	if (ret < 0) {
		if (ret != -SF_EPEER || bad_at != c.next || bad_at >= size)
			fuzz_die("summary", "bad refusal");
	} else if (ret != 0 || c.next != size || c.again.ret ||
		   c.again.len != size ||
		   (size && memcmp(c.again.p, data, size))) {
		fuzz_die("summary", "re-encoding differs");
	}
	sf_mpi_wire_inv_release(&c.again);
}

/* INV_LIST's reply: a framed round and records, a peer's own error
 * without payload, or -SF_EPEER; its records then parse as an
 * inventory. */
static void check_list_reply(const uint8_t *data, size_t size)
{
	struct sf_mpi_wire_reply rp;
	int ret = sf_mpi_wire_list_decode(data, size, &rp);

	if (ret < 0) {
		if (ret != -SF_EPEER && (ret <= -(int)SF_ERR_LAST ||
					 rp.status != ret || rp.len))
			fuzz_die("list reply", "undocumented error");
		return;
	}
	if (ret != 0 || rp.status < 0 || size < SF_MPI_WIRE_REPLY_HDR ||
	    rp.data != data + SF_MPI_WIRE_REPLY_HDR ||
	    rp.len != size - SF_MPI_WIRE_REPLY_HDR)
		fuzz_die("list reply", "payload not the rest of the input");
	check_inventory(rp.data, rp.len);
}

/* A heartbeat: refused with -SF_EPEER, or exactly HB_LEN bytes that
 * re-encode to the input. */
static void check_hb(const uint8_t *data, size_t size)
{
	unsigned char again[SF_MPI_WIRE_HB_LEN];
	uint64_t seq = 0;
	int ret = sf_mpi_wire_hb_decode(data, size, &seq);

	if (ret < 0) {
		if (ret != -SF_EPEER)
			fuzz_die("heartbeat", "undocumented error");
		return;
	}
	if (ret != 0 || size != SF_MPI_WIRE_HB_LEN)
		fuzz_die("heartbeat", "accepted a wrong length");
	sf_mpi_wire_hb_encode(again, seq);
	if (memcmp(again, data, size) != 0)
		fuzz_die("heartbeat", "does not re-encode to the input");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_hb(data, size);
	check_req(data, size, 32767);
	check_req(data, size, INT32_MAX);
	check_read_reply(data, size, 0);
	if (size >= 8)
		check_read_reply(data, size, size - 8);
	check_verdict(data, size);
	check_inventory(data, size);
	check_summary(data, size);
	check_list_reply(data, size);
	return 0;
}
