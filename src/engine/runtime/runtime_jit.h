// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The second dispatch point of the runtimes' kernel halves: frames of code
 * a runtime generates at run time (a JVM's JIT), which no unwind table
 * describes. unw_step hands a frame here when its pc lies in the process's
 * rt_proc.jit ranges; the runtime's stepper records the frame's language
 * frames (marking the native frame, as the interpreter-loop ranges do) and
 * finds the caller's pc, sp and rbp. Included by unwind.h after its stack
 * reader.
 */
#ifndef SONDE_RUNTIME_JIT_H
#define SONDE_RUNTIME_JIT_H

#include "java/hotspot_walk.h"
#include "v8/v8_walk.h"

/* Steps a frame in generated code; nonzero when the walk ends there. */
static __always_inline int rt_jit_step(__u32 slot, __u32 kind)
{
	switch (kind) {
	case RT_JAVA:
		return hs_step(slot);
	case RT_V8:
		return v8_step(slot);
	default:
		return -1; /* not a runtime that steps its frames: the native walk goes on */
	}
}

#endif
