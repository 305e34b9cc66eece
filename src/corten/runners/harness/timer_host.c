/* Host implementation of corten_timer.h: CLOCK_MONOTONIC in nanoseconds. */
#define _POSIX_C_SOURCE 199309L
#include <time.h>

#include "corten_timer.h"

const char CORTEN_TIMER_UNIT[] = "ns";

void corten_timer_init(void)
{
}

uint64_t corten_timer_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
