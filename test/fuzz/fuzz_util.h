/*
 * fuzz_util.h - what every fuzz target shares: aborting with a reason,
 * the contract of an error message, and numbers taken from the input.
 *
 * Each target defines `const char fuzz_target[]` (its name, for the abort
 * line).
 */
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

extern const char fuzz_target[];

/* Print "TARGET: what: detail" and abort(): a crash for libFuzzer and for
 * the replay driver. */
__attribute__((noreturn))
void fuzz_die(const char *what, const char *detail);

/* Fill an error buffer with non-NUL bytes before a call, so that
 * fuzz_check_message() sees whether the call wrote a message. */
void fuzz_poison(char *err, size_t size);

/* Abort unless err (a buffer of `size` bytes) holds a NUL-terminated,
 * non-empty message of one line (no newline). */
void fuzz_check_message(const char *err, size_t size);

/* The n (<= 8) bytes at p as a little-endian number. */
uint64_t fuzz_le(const uint8_t *p, size_t n);

#endif
