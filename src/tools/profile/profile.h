// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Shared between profile.bpf.c and src/tools/profile/mod.rs. */
#ifndef SONDE_PROFILE_H
#define SONDE_PROFILE_H

#include "stacks.h"

/* Totals in a per-CPU array, indexed by these slots. */
enum prof_stat {
	PS_SAMPLES = 0, /* samples counted */
	PS_IDLE,        /* samples of the idle task, skipped */
	PS_FILTERED,    /* samples of other tasks, skipped */
	PS_MAX = PS_FILTERED + 1 + STK_STAT_MAX,
};
#define PS_STACKS (PS_FILTERED + 1) /* + enum stk_stat */

#endif
