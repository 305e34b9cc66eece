/*
 * Example firmware: one Corten model on the Arm Cortex-M55 (QEMU mps3-an547, 32 MHz).
 *
 * Reads the float32 input from input.bin (semihosting: a file in QEMU's working directory),
 * quantizes it with the header's helper, runs the model, dequantizes the output, prints the
 * class (the output's arg-max) and what the inference cost: SysTick cycles of the 32 MHz core
 * clock and, under QEMU -icount shift=0 (1 ns of virtual time per instruction), instructions.
 *
 * The model library is the one `corten compile MODEL --name model --emit-c` writes to DIR/c;
 * with another --name, replace "model"/"MODEL" below.
 */
#include <stdint.h>
#include <stdio.h>

#include "corten_timer.h" /* SysTick timer of corten/runners/boards/timer_systick.c */
#include "model.h"

#define CORE_CLOCK_HZ 32000000u

static float input_f32[MODEL_INPUT_BYTES];
static int8_t input[MODEL_INPUT_BYTES];
static int8_t output[MODEL_OUTPUT_BYTES];
/* The model's working memory: size and alignment from the generated header. */
static uint8_t arena[MODEL_ARENA_BYTES > 0 ? MODEL_ARENA_BYTES : 1] __attribute__((aligned(MODEL_ARENA_ALIGN)));

static int read_input(const char *path)
{
    FILE *f = fopen(path, "rb");
    size_t got;
    if (f == NULL) {
        printf("cannot open %s\n", path);
        return 0;
    }
    got = fread(input_f32, sizeof input_f32[0], (size_t)MODEL_INPUT_BYTES, f);
    fclose(f);
    if (got != (size_t)MODEL_INPUT_BYTES) {
        printf("%s: %lu floats, expected %lu\n", path, (unsigned long)got, (unsigned long)MODEL_INPUT_BYTES);
        return 0;
    }
    return 1;
}

int main(void)
{
    uint64_t start;
    uint64_t ticks;
    unsigned long i;
    unsigned long best = 0;
    float best_score;
    int status;

    if (!read_input("input.bin")) {
        return 2;
    }
    /* input.bin holds the float values in the order of the _DIM macros (NHWC for images). */
    for (i = 0; i < (unsigned long)MODEL_INPUT_BYTES; i++) {
        input[i] = model_quantize_input(input_f32[i]);
    }

    corten_timer_init();
    start = corten_timer_now();
    status = model_run_checked(input, output, arena, sizeof arena);
    ticks = corten_timer_now() - start;
    if (status != MODEL_OK) {
        printf("model_run_checked failed: status %d (a positive value is the failing step)\n", status);
        return 1;
    }

    best_score = model_dequantize_output(output[0]);
    for (i = 1; i < (unsigned long)MODEL_OUTPUT_BYTES; i++) {
        const float score = model_dequantize_output(output[i]);
        if (score > best_score) {
            best_score = score;
            best = i;
        }
    }
    printf("class %lu (score %d/1000)\n", best, (int)(best_score * 1000.0f));
    printf("cycles %lu (SysTick at %lu Hz)\n", (unsigned long)ticks, (unsigned long)CORE_CLOCK_HZ);
    /* QEMU -icount shift=0: 1e9 / 32e6 = 31.25 instructions per tick */
    printf("instructions %lu (QEMU -icount)\n", (unsigned long)(ticks * 125u / 4u));
    return 0;
}
