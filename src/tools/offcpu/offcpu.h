// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Shared between offcpu.bpf.c and src/tools/offcpu/mod.rs. */
#ifndef SONDE_OFFCPU_H
#define SONDE_OFFCPU_H

#include "stacks.h"

/* Where a thread went off CPU, kept until it runs again. */
struct oc_start {
	__u64 ts;
	__u64 end;    /* tp_btf with the exit hook: when it was switched back in */
	__s32 kstack; /* taken at switch-out when there is no exit hook */
	__s32 ustack;
	__u64 uhash;
	__u64 wdelta; /* wakeup with sampling: period so far when woken */
	__u32 skip;   /* wakeup with sampling: left out at the wake-up */
	__u32 pad;
};

/* Who woke a thread (wakeup mode): taken at sched_waking, in the waker's
 * context (in interrupt context: the interrupted task's comm and pid). */
struct oc_waker {
	__s32 kstack;
	__s32 ustack;
	__u64 uhash;
	__u32 pid;
	char comm[STK_COMM_LEN];
	__u32 pad;
};

/* oc_waker.kstack of a period counted at its end, after it was left out at
 * its wake-up (see on_exit): its waker's stack was not walked. */
#define OC_WAKER_NOT_WALKED (-2)

/* wakeup mode: a blocked stack and its waker. */
struct oc_wake_key {
	struct stk_key blocked;
	struct oc_waker waker;
};

enum oc_stat {
	OS_SWITCHES = 0, /* switches seen */
	OS_RECORDED,     /* blocked periods counted */
	OS_SHORT,        /* shorter than --min-block */
	OS_LONG,         /* longer than --max-block */
	OS_STARTS_FULL,  /* the start map was full: period lost */
	OS_SAMPLED,      /* kept by sampling, weighted up */
	OS_SAMPLED_OUT,  /* left out by sampling */
	OS_NOT_WALKED,   /* wakeup: counted at the end without its waker's stack */
	OS_IRQ_WAKERS,   /* wakeup: woken in interrupt context, no user stack walked */
	OS_MAX = OS_IRQ_WAKERS + 1 + STK_STAT_MAX,
};
#define OS_STACKS (OS_IRQ_WAKERS + 1) /* + enum stk_stat */

#endif
