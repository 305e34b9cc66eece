/* Board implementation of corten_timer.h: SysTick on the core clock, extended to 64 bits.
 *
 * SysTick counts down from SYSTICK_RELOAD at the core clock (CLKSOURCE=1); each wrap raises
 * the SysTick exception, which counts wraps. corten_timer_now() reads (wraps, CVR) with
 * interrupts masked and folds in a wrap that is pending but not yet taken.
 * Under QEMU -icount shift=0 one instruction is 1 ns of virtual time, so one tick is
 * 1e9 / core_clock_hz instructions (40 at 25 MHz, 31.25 at 32 MHz).
 */
#include "corten_timer.h"

#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)
#define SCB_ICSR (*(volatile uint32_t *)0xE000ED04u)
#define ICSR_PENDSTSET (1u << 26)
#define SYST_CSR_ENABLE_TICKINT_CORECLK 0x7u
/* Full 24-bit range by default; a smaller value (-DCORTEN_SYSTICK_RELOAD=...) lets tests
 * exercise the wrap counting with short runs. */
#ifdef CORTEN_SYSTICK_RELOAD
#define SYSTICK_RELOAD ((uint32_t)(CORTEN_SYSTICK_RELOAD))
#else
#define SYSTICK_RELOAD 0x00FFFFFFu
#endif

const char CORTEN_TIMER_UNIT[] = "ticks";

static volatile uint32_t systick_wraps;

void SysTick_Handler(void);

void SysTick_Handler(void)
{
    systick_wraps++;
}

void corten_timer_init(void)
{
    SYST_CSR = 0u;
    SYST_RVR = SYSTICK_RELOAD;
    SYST_CVR = 0u;
    systick_wraps = 0u;
    SYST_CSR = SYST_CSR_ENABLE_TICKINT_CORECLK;
    while (SYST_CVR == 0u) {
        /* wait for the first reload so that readings are monotonic */
    }
}

uint64_t corten_timer_now(void)
{
    uint32_t primask;
    uint32_t wraps;
    uint32_t value;
    __asm__ volatile("mrs %0, primask\n\tcpsid i" : "=r"(primask)::"memory");
    wraps = systick_wraps;
    value = SYST_CVR;
    if ((SCB_ICSR & ICSR_PENDSTSET) != 0u) {
        value = SYST_CVR; /* a wrap happened and its exception is not taken yet */
        wraps++;
    }
    __asm__ volatile("msr primask, %0" ::"r"(primask) : "memory");
    return (uint64_t)wraps * ((uint64_t)SYSTICK_RELOAD + 1u) + (uint64_t)(SYSTICK_RELOAD - value);
}
