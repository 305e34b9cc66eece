/* Corten bare-metal startup for the QEMU Cortex-M boards (mps2-an385/386/500, mps3-an547).
 *
 * Vector table, reset handler (enable FPU/MVE, copy .data, zero .bss, open the semihosting
 * handles, call main, exit through semihosting) and a fault handler that reports the fault
 * registers through semihosting and stops QEMU with a non-zero exit code.
 */
#include <stdint.h>
#include <stdlib.h>

extern uint32_t __data_load__[];
extern uint32_t __data_start__[];
extern uint32_t __data_end__[];
extern uint32_t __bss_start__[];
extern uint32_t __bss_end__[];
extern uint32_t __stack_top__[];

int main(int argc, char **argv);
void initialise_monitor_handles(void);
void Reset_Handler(void);
void corten_fault_handler(void);
void corten_unexpected_handler(void);
void SysTick_Handler(void);

#define SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)
#define SCB_CFSR (*(volatile uint32_t *)0xE000ED28u)
#define SCB_HFSR (*(volatile uint32_t *)0xE000ED2Cu)
#define SCB_ICSR (*(volatile uint32_t *)0xE000ED04u)
#define SCB_MMFAR (*(volatile uint32_t *)0xE000ED34u)
#define SCB_BFAR (*(volatile uint32_t *)0xE000ED38u)

#define SEMIHOST_SYS_WRITE0 0x04
#define SEMIHOST_SYS_EXIT 0x18
#define ADP_STOPPED_RUNTIME_ERROR 0x20023u

typedef void (*corten_vector)(void);

__attribute__((section(".vectors"), used)) const corten_vector corten_vector_table[16] = {
    (corten_vector)(uintptr_t)__stack_top__, /* initial main stack pointer */
    Reset_Handler,
    corten_fault_handler, /* NMI */
    corten_fault_handler, /* HardFault */
    corten_fault_handler, /* MemManage */
    corten_fault_handler, /* BusFault */
    corten_fault_handler, /* UsageFault */
    corten_fault_handler, /* SecureFault (Armv8-M), reserved otherwise */
    0,
    0,
    0,
    corten_unexpected_handler, /* SVCall */
    corten_unexpected_handler, /* DebugMonitor */
    0,
    corten_unexpected_handler, /* PendSV */
    SysTick_Handler,
};

static uint32_t semihost_call(uint32_t op, const void *arg)
{
    register uint32_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

static void put_hex(char *dst, uint32_t value)
{
    static const char hex[] = "0123456789abcdef";
    int i;
    for (i = 7; i >= 0; --i) {
        dst[i] = hex[value & 0xFu];
        value >>= 4;
    }
}

static void stop_with_message(char *msg, uint32_t *fields, int n_fields)
{
    /* each field is "=xxxxxxxx" following a name in msg; fields are filled in order */
    char *p = msg;
    int i = 0;
    while (*p != '\0' && i < n_fields) {
        if (*p == '=') {
            put_hex(p + 1, fields[i++]);
            p += 9;
        } else {
            ++p;
        }
    }
    semihost_call(SEMIHOST_SYS_WRITE0, msg);
    semihost_call(SEMIHOST_SYS_EXIT, (const void *)ADP_STOPPED_RUNTIME_ERROR);
    for (;;) {
    }
}

void corten_fault_handler(void)
{
    char msg[] = "CORTEN_FAULT icsr=00000000 cfsr=00000000 hfsr=00000000 mmfar=00000000 "
                 "bfar=00000000\n";
    uint32_t fields[5];
    fields[0] = SCB_ICSR;
    fields[1] = SCB_CFSR;
    fields[2] = SCB_HFSR;
    fields[3] = SCB_MMFAR;
    fields[4] = SCB_BFAR;
    stop_with_message(msg, fields, 5);
}

void corten_unexpected_handler(void)
{
    char msg[] = "CORTEN_FAULT unexpected exception icsr=00000000\n";
    uint32_t fields[1];
    fields[0] = SCB_ICSR;
    stop_with_message(msg, fields, 1);
}

static void enable_fpu_and_mve(void)
{
#if defined(__ARM_FP) || defined(__ARM_FEATURE_MVE)
    /* CP10/CP11 full access: enables the FPU and, on Armv8.1-M, the MVE (Helium) unit. */
    SCB_CPACR |= 0xFu << 20;
    __asm__ volatile("dsb\n\tisb" ::: "memory");
#endif
}

__attribute__((noinline)) static void init_memory(void)
{
    volatile uint32_t *src = __data_load__;
    volatile uint32_t *dst = __data_start__;
    while (dst < __data_end__) {
        *dst++ = *src++;
    }
    for (dst = __bss_start__; dst < __bss_end__; ++dst) {
        *dst = 0u;
    }
}

/* newlib's exit() runs __libc_fini_array, which calls _fini; crti/crtn are not linked
 * (-nostartfiles) and Corten's C code needs no static constructors or destructors. */
void _init(void);
void _fini(void);

void _init(void)
{
}

void _fini(void)
{
}

void Reset_Handler(void)
{
    enable_fpu_and_mve(); /* first: compiled code below may use FP/MVE registers */
    init_memory();
    initialise_monitor_handles();
    exit(main(0, NULL));
}
