/* Corten generic harness: runs one inference of a generated model library.
 *
 * Build-time configuration (all required):
 *   CORTEN_MODEL_HEADER  quoted header name, e.g. "\"net.h\""
 *   CORTEN_RUN           entry point: int CORTEN_RUN(const int8_t *in, int8_t *out, uint8_t *arena)
 *   CORTEN_INPUT_BYTES   input size in bytes
 *   CORTEN_OUTPUT_BYTES  output size in bytes
 *   CORTEN_ARENA_BYTES   scratch arena size in bytes (static array)
 * Optional:
 *   CORTEN_ARENA_ALIGN   arena alignment in bytes (default 16)
 *   CORTEN_PROFILE       profile build: also define CORTEN_PROFILE_HOOK (the model's
 *                        <name>_profile_step) and CORTEN_PROFILE_STEPS (<NAME>_NUM_STEPS); the
 *                        harness then prints "CORTEN_PROFILE overhead=<o> calls=<c>" (the timer
 *                        delta of <c> back-to-back hook calls, for the caller to subtract) and one
 *                        "CORTEN_STEP <k> <t>" line per step k (the timer when step k was done;
 *                        k = 0: before the first step)
 *
 * Usage: harness [input.bin [output.bin]] (defaults: input.bin, output.bin in the cwd;
 * on the boards the files are opened through semihosting relative to QEMU's cwd).
 *
 * Prints one line "CORTEN_RESULT status=<s> elapsed=<n> unit=<ns|ticks>" where elapsed
 * covers the CORTEN_RUN call alone, and exits with 0 when the model returned 0,
 * 1 when it returned non-zero, 2 on an I/O error.
 */
#include <stdint.h>
#include <stdio.h>

#include CORTEN_MODEL_HEADER
#include "corten_timer.h"

#if !defined(CORTEN_RUN) || !defined(CORTEN_INPUT_BYTES) || !defined(CORTEN_OUTPUT_BYTES) || \
    !defined(CORTEN_ARENA_BYTES)
#error "define CORTEN_RUN, CORTEN_INPUT_BYTES, CORTEN_OUTPUT_BYTES and CORTEN_ARENA_BYTES"
#endif

#ifndef CORTEN_ARENA_ALIGN
#define CORTEN_ARENA_ALIGN 16
#endif

#define CORTEN_NONZERO(n) ((n) > 0 ? (n) : 1)

static int8_t corten_input[CORTEN_NONZERO(CORTEN_INPUT_BYTES)];
static int8_t corten_output[CORTEN_NONZERO(CORTEN_OUTPUT_BYTES)];
static uint8_t corten_arena[CORTEN_NONZERO(CORTEN_ARENA_BYTES)] __attribute__((aligned(CORTEN_ARENA_ALIGN)));

#ifdef CORTEN_PROFILE
#if !defined(CORTEN_PROFILE_HOOK) || !defined(CORTEN_PROFILE_STEPS)
#error "a profile build (CORTEN_PROFILE) needs CORTEN_PROFILE_HOOK and CORTEN_PROFILE_STEPS"
#endif
#define CORTEN_PROFILE_CALIBRATION_CALLS 32
static uint64_t corten_stamps[CORTEN_PROFILE_STEPS + 1];

void CORTEN_PROFILE_HOOK(int step)
{
    const uint64_t now = corten_timer_now();
    if (step >= 0 && step <= CORTEN_PROFILE_STEPS) {
        corten_stamps[step] = now;
    }
}

/* The timer delta of back-to-back hook calls, as between two steps of the model (unrolled:
 * no loop overhead); the caller subtracts overhead / calls from every step. */
static uint64_t corten_profile_overhead(void)
{
    uint64_t first;
#define CORTEN_HOOK4 CORTEN_PROFILE_HOOK(0); CORTEN_PROFILE_HOOK(0); CORTEN_PROFILE_HOOK(0); CORTEN_PROFILE_HOOK(0);
    CORTEN_PROFILE_HOOK(0);
    first = corten_stamps[0];
    CORTEN_HOOK4 CORTEN_HOOK4 CORTEN_HOOK4 CORTEN_HOOK4 CORTEN_HOOK4 CORTEN_HOOK4 CORTEN_HOOK4 CORTEN_HOOK4
#undef CORTEN_HOOK4
    return corten_stamps[0] - first;
}
#endif

/* Decimal formatting of a uint64 without relying on printf's %llu support. */
static const char *format_u64(uint64_t value, char *buf, unsigned size)
{
    char *p = buf + size - 1;
    *p = '\0';
    do {
        *--p = (char)('0' + (int)(value % 10u));
        value /= 10u;
    } while (value != 0u && p > buf);
    return p;
}

/* Reads (writing 0) or writes (writing 1) all `bytes` bytes of `data` from / to the file at `path`;
 * 0 after a CORTEN_ERROR line when the file cannot be opened or holds or takes fewer bytes. */
static int transfer_file(const char *path, int writing, int8_t *data, size_t bytes)
{
    FILE *f = fopen(path, writing ? "wb" : "rb");
    size_t done;
    int closed;
    if (f == NULL) {
        printf("CORTEN_ERROR cannot %s file %s\n", writing ? "create output" : "open input", path);
        return 0;
    }
    done = writing ? fwrite(data, 1, bytes, f) : fread(data, 1, bytes, f);
    closed = fclose(f) == 0;
    if (writing && (!closed || done != bytes)) {
        printf("CORTEN_ERROR short write to output file %s\n", path);
        return 0;
    }
    if (!writing && done != bytes) {
        printf("CORTEN_ERROR input file %s has %lu bytes, expected %lu\n", path, (unsigned long)done,
               (unsigned long)bytes);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    const char *input_path = argc > 1 ? argv[1] : "input.bin";
    const char *output_path = argc > 2 ? argv[2] : "output.bin";
    char digits[24];
    uint64_t start;
    uint64_t stop;
    int status;

    if (!transfer_file(input_path, 0, corten_input, (size_t)CORTEN_INPUT_BYTES)) {
        return 2;
    }
    corten_timer_init();
#ifdef CORTEN_PROFILE
    {
        const uint64_t overhead = corten_profile_overhead();
        printf("CORTEN_PROFILE overhead=%s calls=%d\n", format_u64(overhead, digits, (unsigned)sizeof digits),
               CORTEN_PROFILE_CALIBRATION_CALLS);
    }
#endif
    start = corten_timer_now();
    status = CORTEN_RUN(corten_input, corten_output, corten_arena);
    stop = corten_timer_now();

#ifdef CORTEN_PROFILE
    if (status == 0) {
        int k;
        for (k = 0; k <= CORTEN_PROFILE_STEPS; k++) {
            printf("CORTEN_STEP %d %s\n", k, format_u64(corten_stamps[k], digits, (unsigned)sizeof digits));
        }
    }
#endif
    if (status == 0 && !transfer_file(output_path, 1, corten_output, (size_t)CORTEN_OUTPUT_BYTES)) {
        return 2;
    }
    printf("CORTEN_RESULT status=%d elapsed=%s unit=%s\n", status,
           format_u64(stop - start, digits, (unsigned)sizeof digits), CORTEN_TIMER_UNIT);
    fflush(stdout);
    return status == 0 ? 0 : 1;
}
