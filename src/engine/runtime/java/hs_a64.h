// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * AArch64: how far a compiled method's prologue has got at a sampled pc,
 * decoded from the method's verified entry (or on-stack-replacement entry)
 * up to the pc. Only arch.h's instruction tests: no BPF helper, so that a
 * host test compiles it as it is (tests/integration/java.rs).
 *
 * From the entry's nop, past a class-initialization barrier and the stack
 * bang (`sub x9, sp, #o; str xzr, [x9]`, one per page, neither moving sp),
 * C1 and C2 build the frame as MacroAssembler::build_frame does: under 528
 * bytes `sub sp, sp, #n; stp x29, x30, [sp, #n-16]`, else `stp x29, x30,
 * [sp, #-16]!; (mov x29, sp;) sub sp, sp, #n-16` (or `mov x8, #n-16; sub
 * sp, sp, x8`); a native method's wrapper `stp x29, x30, [sp, #-16]!; mov
 * x29, sp; sub sp, ...`. The nmethod entry barrier comes after the frame.
 */
#ifndef SONDE_HS_A64_H
#define SONDE_HS_A64_H

#include "arch.h"

/* Words of a prologue decoded from its entry. */
#define HS_A64_PRO 24

/* sub sp, sp, xN (extended register) */
#define HS_A64_SUB_SP_REG(x) (((x)&0xffe0ffff) == 0xcb2063ff)
/* Any other instruction that moves sp: add or sub (immediate or extended
 * register; not the flag-setting forms, whose register 31 is xzr) into sp,
 * and a load or store pair or single with writeback to sp. */
#define HS_A64_MOVES_SP(x)                                                                         \
	((((x)&0x3f80001f) == 0x1100001f) || (((x)&0x3fe0001f) == 0x0b20001f) ||                   \
	 ((((x)&0x3a800000) == 0x28800000) && (((x)&0x3e0) == 0x3e0)) ||                           \
	 ((((x)&0x3b200400) == 0x38000400) && (((x)&0x3e0) == 0x3e0)))

/* What the prologue has done. */
enum hs_a64_pro {
	HS_A64_NOTHING = 0, /* the return address in x30, sp lowered by *lowered (0 or n) */
	HS_A64_PUSHED = 2,  /* x29 and x30 pushed 16 bytes below the caller's sp */
	HS_A64_WHOLE = 3,   /* the frame whole, as CodeBlob's frame size says */
};

/*
 * w: HS_A64_PRO words from the entry; done: the instructions before pc.
 * Sets *state (enum hs_a64_pro) and *lowered; returns 0 where the code
 * before pc is none of the above (another instruction moved sp, or no
 * whole frame within HS_A64_PRO words): the walk ends there rather than
 * read a wrong caller.
 */
static __always_inline int hs_a64_pro_words(const __u32 *w, __u64 done, int *state, __u32 *lowered)
{
	*state = HS_A64_NOTHING;
	*lowered = 0;
	for (int i = 0; i < HS_A64_PRO; i++) {
		if (i >= done)
			return 1;
		__u32 x = w[i & 31];
		if (*state == HS_A64_NOTHING && !*lowered && A64_IS_SUB_SP_IMM(x)) {
			*lowered = A64_SP_IMM(x); /* sub sp, sp, #n */
		} else if (*state == HS_A64_NOTHING && *lowered && A64_IS_STP_FP_LR(x)) {
			*state = HS_A64_WHOLE; /* stp x29, x30, [sp, #n-16] */
			return 1;
		} else if (*state == HS_A64_NOTHING && !*lowered && A64_IS_STP_FP_LR_PRE(x)) {
			*state = HS_A64_PUSHED; /* stp x29, x30, [sp, #-16]! */
		} else if (*state == HS_A64_PUSHED &&
		           (A64_IS_SUB_SP_IMM(x) || HS_A64_SUB_SP_REG(x))) {
			*state = HS_A64_WHOLE; /* sub sp, sp, #n-16 (or x8) */
			return 1;
		} else if (HS_A64_MOVES_SP(x)) {
			return 0;
		}
	}
	return 0;
}

#endif
