/* Corten harness timer interface.
 *
 * corten_timer_now() returns a monotonic count in CORTEN_TIMER_UNIT units:
 *   host builds  : nanoseconds of CLOCK_MONOTONIC (timer_host.c)
 *   board builds : SysTick ticks of the core clock, extended to 64 bits by
 *                  counting wraps in the SysTick exception (boards/timer_systick.c)
 */
#ifndef CORTEN_TIMER_H
#define CORTEN_TIMER_H

#include <stdint.h>

void corten_timer_init(void);
uint64_t corten_timer_now(void);
extern const char CORTEN_TIMER_UNIT[];

#endif /* CORTEN_TIMER_H */
