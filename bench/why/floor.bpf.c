// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The floor of `sonde why`'s cost per context switch: an empty program on
 * each scheduler and interrupt hook why attaches (tp_btf), so that the
 * kernel's own price of running a BPF program there (its trampoline, and
 * bpf_stats' clock reads) is measured beside sonde's (bench/why/run).
 * Needs no header: each program only returns.
 */
#define SEC(name) __attribute__((section(name), used))
#define HOOK(name, tp)                                                                             \
	SEC("tp_btf/" #tp) int name(void *ctx)                                                     \
	{                                                                                          \
		return 0;                                                                          \
	}

HOOK(why_switch, sched_switch)
HOOK(why_waking, sched_waking)
HOOK(why_wakeup, sched_wakeup)
HOOK(why_wakeup_new, sched_wakeup_new)
HOOK(why_exit, sched_process_exit)
HOOK(why_irq_entry, irq_handler_entry)
HOOK(why_irq_exit, irq_handler_exit)
HOOK(why_timer_entry, hrtimer_expire_entry)
HOOK(why_timer_exit, hrtimer_expire_exit)
HOOK(why_softirq_entry, softirq_entry)
HOOK(why_softirq_exit, softirq_exit)

char LICENSE[] SEC("license") = "Dual BSD/GPL";
