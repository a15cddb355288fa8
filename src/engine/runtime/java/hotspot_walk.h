// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * HotSpot frames, stepped in the kernel as the native walk meets them (types
 * in hotspot.h; registered in runtimes.h as RT_JAVA's stepper).
 * JIT-compiled code has no unwind tables and, by default, no frame pointer;
 * the JVM itself knows each frame's size, and so does the walk:
 *
 * - The code blob holding the pc is found as HotSpot's CodeCache finds it:
 *   the heap's segment map gives, per segment, how many segments back its
 *   block starts (0: here; 0xff: free), and the blob follows the block's
 *   header.
 * - Interpreted frames (pc in the template interpreter) keep rbp (x29) as a
 *   frame pointer: [rbp-3 words] is the Method*, [rbp-8 words] the bytecode
 *   pointer, [rbp-1 word] the caller's stack pointer before the interpreter
 *   extended it (x86-64 layout of frame_x86.hpp since JDK 9; not exported).
 *   On AArch64 the bytecode pointer is 8 or 9 words below x29 (a later
 *   frame_aarch64.hpp adds a slot above it): the one inside the bytecodes.
 * - Compiled frames (nmethods, and stubs with a frame size) are
 *   CodeBlob::_frame_size words from the stack pointer to the caller's,
 *   the return address in the last word and the caller's rbp below it. A
 *   sample in the prologue (before _frame_complete_offset) or in the
 *   epilogue (at `pop rbp`, the return poll or `ret`) has less on the stack;
 *   the code at the pc tells which.
 * - Blobs without a frame size (the call stub) keep rbp as a frame pointer.
 *
 * Each Java frame is recorded for user space: the Method* and bytecode index
 * of an interpreted frame, or the blob and the pc's offset in its code, with
 * the nmethod's compile id as cookie (a freed and reused blob tells itself
 * apart); user space reads the inlining scopes at that pc.
 */
#ifndef SONDE_HOTSPOT_WALK_H
#define SONDE_HOTSPOT_WALK_H

#include "unwind_state.h"
#include "hotspot.h"
#include "hs_a64.h"

#define HS_SEGMAP_STEPS 16 /* segment-map hops (254 segments each) */
#define HS_FREE         0xff
/* Where hs_step keeps what it reads in r->sb: HS_W's words at 0, the
 * instructions at 256, a blob's head at HS_HEAD_AT (up to HS_HEAD_MAX
 * bytes: through the nmethod's compile id, at 212 on JDK 25, 304 on 17),
 * a 256-byte window of the segment map at HS_SEG_AT. */
#define HS_HEAD_AT      320
#define HS_HEAD_MAX     384
#define HS_SEG_AT       768

static __always_inline int hs_end(struct unw_state *s, __u8 why)
{
	s->st.end = why;
	return 1;
}

/* Records Java frame `len` of the native walk. */
static __always_inline void hs_push(struct unw_state *s, struct rt_state *r, __u32 len, __u64 addr,
                                    __u32 loc, __u16 cookie, __u8 flags)
{
	if (rt_push(r, addr, loc, cookie, RT_F_ENTRY | flags))
		s->rt_marks[(len >> 6) & 1] |= 1ULL << (len & 63);
	else
		r->st.end = RT_END_DEPTH;
}

/* Scratch words in the runtime state (rt_state.sb, unused by Java walks):
 * the kernel counts the stacks of unw_capture, unw_step and this stepper
 * together against 512 bytes on kernels before private stacks (6.1). */
#define HS_W(r, i) (((__u64 *)(r)->sb)[(i)&15])

/* An interpreted frame at rbp. */
static __always_inline int hs_interp(struct unw_state *s, struct rt_state *r, __u32 len)
{
	struct hs_proc *c = RT_PART(r, struct hs_proc);
	__u64 bp = s->bp, sp = s->sp;
	if (!s->bp_ok || bp < sp || bp & 7)
		return hs_end(s, UNW_END_NO_TABLE);
	/* 0 bcp, 1 method, 2 caller's sp, 3 caller's rbp, 4 return address,
	 * 5 ConstMethod, 6 code size. Lowest first: unw_read buffers the
	 * stack upwards from a read. */
	__u32 slot = c->bcp_slot & 15, alt = c->bcp_alt & 15;
	HS_W(r, 7) = 0;
	if (!unw_read(s, &HS_W(r, 0), bp - 8 * slot) ||
	    (alt && !unw_read(s, &HS_W(r, 7), bp - 8 * alt)) ||
	    !unw_read(s, &HS_W(r, 1), bp - 3 * 8) || !unw_read(s, &HS_W(r, 2), bp - 8) ||
	    !unw_read(s, &HS_W(r, 3), bp) || !unw_read(s, &HS_W(r, 4), bp + 8))
		return hs_end(s, UNW_END_READ);
	__u64 method = HS_W(r, 1);
	__u32 bci = 0xffffffff;
	HS_W(r, 5) = 0;
	HS_W(r, 6) = 0;
	if (method && bpf_probe_read_user(&HS_W(r, 5), 8, (void *)(method + c->m_const)) == 0 &&
	    HS_W(r, 5) &&
	    bpf_probe_read_user(&HS_W(r, 6), 2, (void *)(HS_W(r, 5) + c->cm_code_size)) == 0) {
		__u64 code = HS_W(r, 5) + c->cm_size, bcp = HS_W(r, 0),
		      end = code + (HS_W(r, 6) & 0xffff);
		if (bcp >= code && bcp < end)
			bci = bcp - code;
		else if (alt && HS_W(r, 7) >= code && HS_W(r, 7) < end)
			bci = HS_W(r, 7) - code;
	}
	__u64 cm = HS_W(r, 5);
	if (!method || !cm) {
		r->st.end = RT_END_BAD_FRAME;
		rt_stat(RT_S_JIT_BAD, 1);
	} else {
		hs_push(s, r, len, method, bci, (__u16)(cm >> 3), HS_F_INTERP);
	}
	s->st.how |= UNW_HOW_FP;
	__u64 ssp = HS_W(r, 2), ra = HS_W(r, 4) & unw_ra_mask;
	if (ssp <= sp || ssp > bp + 16 + 0x100000)
		ssp = bp + 16;
	s->pc = ra;
	s->sp = ssp;
	s->bp = HS_W(r, 3);
	s->bp_ok = 1;
	s->exact = 0;
	return ra ? 0 : hs_end(s, UNW_END_FP_CHAIN);
}

/* A byte of the 32 read at r->sb[256]. */
#define HS_B(b, i) ((b)[(i)&31])

/*
 * x86-64: a sampled pc in a compiled method's prologue (before its frame is
 * complete). C1 and C2 build a frame from its verified entry point in one
 * of two ways: the stack bang, `push rbp` (`mov rbp, rsp` with
 * PreserveFramePointer), then `sub rsp, n`; or, a frame small enough to
 * need no bang, `sub rsp, n` making the whole frame at once, then
 * `mov [rsp + n - 8], rbp`. Where the instructions before pc got to says
 * what is pushed: *pushed, the bytes pushed or subtracted; *rbp_below,
 * where the caller's rbp was saved, below the CFA (0: still in rbp). A pc
 * before the verified entry (the inline-cache check) has nothing pushed; an
 * on-stack-replacement nmethod builds its frame from its OSR entry (vep
 * and osr: hs_entries). Returns 0 where the code is neither: the walk ends
 * rather than read a wrong caller.
 */
static __always_inline int hs_x86_prologue(struct rt_state *r, __u64 vep, __u64 osr, __u64 pc,
                                           __u64 *pushed, int *rbp_below)
{
	*pushed = 0;
	*rbp_below = 0;
	if (!vep)
		return 0;
	if (pc <= vep)
		return 1;
	if (osr > vep && osr <= pc)
		vep = osr;
	__u64 at = pc - vep; /* bytes of the prologue done */
	__u8 *b = &r->sb[256];
	if (bpf_probe_read_user(b, 32, (void *)vep))
		return 0;
	__u32 i = 0;
	/* the stack bang: mov [rsp - n], eax */
	if (HS_B(b, 0) == 0x89 && HS_B(b, 1) == 0x84 && HS_B(b, 2) == 0x24)
		i = 7;
	/* push rbp (and mov rbp, rsp) */
	__u32 push_end = 0;
	if (HS_B(b, i) == 0x55) {
		push_end = i + 1;
		i = push_end;
		if (HS_B(b, i) == 0x48 && HS_B(b, i + 1) == 0x89 && HS_B(b, i + 2) == 0xe5)
			i += 3;
	}
	/* sub rsp, imm8 or imm32 */
	if (HS_B(b, i) != 0x48 || HS_B(b, i + 2) != 0xec)
		return 0;
	__u32 n = 0, sub_end = 0;
	if (HS_B(b, i + 1) == 0x83) {
		n = HS_B(b, i + 3);
		sub_end = i + 4;
	} else if (HS_B(b, i + 1) == 0x81) {
		n = (__u32)HS_B(b, i + 3) | (__u32)HS_B(b, i + 4) << 8 |
		    (__u32)HS_B(b, i + 5) << 16 | (__u32)HS_B(b, i + 6) << 24;
		sub_end = i + 7;
	} else {
		return 0;
	}
	if (n > 0x100000)
		return 0;
	if (push_end) {
		if (at >= push_end) {
			*pushed = 8;
			*rbp_below = 16;
		}
		if (at >= sub_end)
			*pushed += n;
		return 1;
	}
	/* No push: mov [rsp + d], rbp (disp8 or disp32) saves rbp. */
	i = sub_end;
	if (HS_B(b, i) != 0x48 || HS_B(b, i + 1) != 0x89 || HS_B(b, i + 3) != 0x24)
		return 0;
	__u32 d = 0, mov_end = 0;
	if (HS_B(b, i + 2) == 0x6c) {
		d = HS_B(b, i + 4);
		mov_end = i + 5;
	} else if (HS_B(b, i + 2) == 0xac) {
		d = (__u32)HS_B(b, i + 4) | (__u32)HS_B(b, i + 5) << 8 |
		    (__u32)HS_B(b, i + 6) << 16 | (__u32)HS_B(b, i + 7) << 24;
		mov_end = i + 8;
	} else {
		return 0;
	}
	if (d + 8 > n)
		return 0;
	if (at >= sub_end)
		*pushed = n;
	if (at >= mov_end)
		*rbp_below = 8 + n - d;
	return 1;
}

/* `n` (2 or 8) bytes at `off` in the blob: from its head where the read
 * of it held them (`have` bytes), else read. */
static __always_inline __u64 hs_field(const __u8 *head, __u32 have, __u64 blob, __u16 off, __u32 n)
{
	__u64 v = 0;
	if (off + n <= have && off <= HS_HEAD_MAX - 8) {
		__builtin_memcpy(&v, head + (off & 511), 8);
		return n == 8 ? v : (__u16)v;
	}
	if (n == 8)
		bpf_probe_read_user(&v, 8, (void *)(blob + off));
	else
		bpf_probe_read_user(&v, 2, (void *)(blob + off));
	return v;
}

/* An nmethod's verified entry and on-stack-replacement entry (0 if none),
 * checked to lie in the prologue of its code (a stub's blob has no such
 * field: what is read there is no entry). */
static __always_inline void hs_entries(struct hs_proc *c, const __u8 *head, __u32 have, __u64 blob,
                                       __u64 code, __s32 fc, __u64 *vep, __u64 *osr)
{
	*vep = 0;
	*osr = 0;
	if (!c->nm_vep || fc < 0)
		return;
	__u64 v = c->vep_abs ? hs_field(head, have, blob, c->nm_vep, 8)
	                     : code + hs_field(head, have, blob, c->nm_vep, 2);
	if (v < code || v >= code + (__u64)fc || (ARCH_HAS_LR && (v & 3)))
		return;
	*vep = v;
	if (c->nm_osr)
		*osr = hs_field(head, have, blob, c->nm_osr, 8);
}

/*
 * One HotSpot frame of the walk in slot `slot` (its pc lies in the code
 * cache); the pc is recorded already. Returns nonzero when the walk ends.
 */
__noinline int hs_step(__u32 slot)
{
	struct unw_state *s = bpf_map_lookup_elem(&unw_scratch, &slot);
	struct rt_state *r = bpf_map_lookup_elem(&rt_scratch, &slot);
	if (!s || !r)
		return 1;
	struct hs_proc *c = RT_PART(r, struct hs_proc);
	__u32 len = s->st.len - 1;
	__u64 pc = s->pc, sp = s->sp;
	__u64 at = s->exact ? pc : pc - 1;
	/* AArch64: x30 holds this frame's return address only while it is the
	 * one sampled (or a signal interrupted); never a caller's. */
	bool lr_ok = s->lr_ok;
	__u64 lr = s->lr;
	s->lr_ok = 0;
	if (at >= c->interp_lo && at < c->interp_hi)
		return hs_interp(s, r, len);
	/* The heap holding pc, and its block's first segment. */
	__u64 lo = 0, segmap = 0, idx = 0;
	__u32 log2 = 0;
	bool found = false;
	for (int i = 0; i < HS_HEAPS; i++) {
		if (i >= c->nheaps)
			break;
		if (at >= c->heap_lo[i] && at < c->heap_hi[i]) {
			lo = c->heap_lo[i];
			segmap = c->segmap[i];
			log2 = c->log2seg[i] & 31;
			found = true;
			break;
		}
	}
	if (!found)
		return hs_end(s, UNW_END_NO_TABLE);
	idx = (at - lo) >> log2;
	/* The segment map, read 256 bytes at a time (a hop is at most 254, so
	 * most pcs find their block's start in one read): the window's first
	 * index, and its bytes at r->sb[HS_SEG_AT]. */
	__u8 *sw = &r->sb[HS_SEG_AT];
	__u64 wlo = 0;
	bool win = false;
	bool start = false;
	for (int k = 0; k < HS_SEGMAP_STEPS; k++) {
		if (!win || idx < wlo) {
			wlo = idx < 255 ? 0 : idx - 255;
			if (bpf_probe_read_user(sw, 256, (void *)(segmap + wlo)))
				return hs_end(s, UNW_END_READ);
			win = true;
		}
		__u8 hop = sw[(idx - wlo) & 255];
		if (hop == HS_FREE || hop > idx)
			break;
		if (hop == 0) {
			start = true;
			break;
		}
		idx -= hop;
	}
	if (!start) {
		rt_stat(RT_S_JIT_UNKNOWN, 1);
		return hs_end(s, UNW_END_NO_TABLE);
	}
	__u64 blob = lo + (idx << log2) + c->blob_head;
	/* The blob's head through the nmethod's compile id in one read where
	 * the code heap holds that much past the blob (a small stub at the end
	 * of what is committed may not: then its head and the id apart).
	 * The id is copied here by hand, not by hs_field: clang keeps
	 * hs_field's value on the stack, and on arm64 that takes hs_step from
	 * 160 to 168 bytes (192 once the verifier rounds it up), past the 512
	 * bytes that sched_switch's program, unw_capture, unw_step and
	 * hs_step may use together. */
	__u8 *head = &r->sb[HS_HEAD_AT];
	__u32 want = c->nm_compile_id + 4;
	if (want < RT_BUF)
		want = RT_BUF;
	HS_W(r, 0) = 0;
	__u32 have = want;
	if (want <= HS_HEAD_MAX && bpf_probe_read_user(head, want, (void *)blob) == 0) {
		__u32 o = c->nm_compile_id;
		if (o <= HS_HEAD_MAX - 4)
			__builtin_memcpy(&HS_W(r, 0), head + (o & 511), 4);
	} else {
		if (bpf_probe_read_user(head, RT_BUF, (void *)blob))
			return hs_end(s, UNW_END_READ);
		have = RT_BUF;
		bpf_probe_read_user(&HS_W(r, 0), 4, (void *)(blob + c->nm_compile_id));
	}
	__u32 size = rt_u32(head, c->cb_size);
	__u32 fs = rt_u32(head, c->cb_frame_size);
	__s32 fc = c->fc_bytes == 2 ? (__s32)(__s16)rt_u32(head, c->cb_frame_complete)
	                            : (__s32)rt_u32(head, c->cb_frame_complete);
	__u64 code = c->code_abs ? rt_u64(head, c->cb_code) : blob + rt_u32(head, c->cb_code);
	if (pc >= blob + size || at < code || fs > 0x10000) {
		rt_stat(RT_S_JIT_UNKNOWN, 1);
		return hs_end(s, UNW_END_NO_TABLE);
	}
	hs_push(s, r, len, blob, (__u32)(pc - code), (__u16)HS_W(r, 0), s->exact ? HS_F_LEAF : 0);
	s->st.how |= UNW_HOW_FP;
	if (fs == 0) {
		/* No frame size: rbp is its frame pointer (the call stub). */
		__u64 bp = s->bp;
		if (!s->bp_ok || bp < sp || !unw_read(s, &HS_W(r, 1), bp) ||
		    !unw_read(s, &HS_W(r, 0), bp + 8))
			return hs_end(s, UNW_END_NO_TABLE);
		__u64 ra = HS_W(r, 0) & unw_ra_mask;
		s->pc = ra;
		s->sp = bp + 16;
		s->bp = HS_W(r, 1);
		s->exact = 0;
		return ra ? 0 : hs_end(s, UNW_END_FP_CHAIN);
	}
	if (ARCH_HAS_LR && s->fp_only)
		/* AArch64: reached by a frame record (from code without CFI, as
		 * the vDSO), the stack pointer is not known here: the frame is
		 * named, the walk ends rather than read a wrong caller. */
		return hs_end(s, UNW_END_NO_TABLE);
	__u64 cfa = sp + (__u64)fs * 8;
	int rbp_at = 16;    /* the caller's rbp: 16 bytes under the CFA, or kept in rbp (0) */
	bool in_lr = false; /* AArch64: the return address is still in x30 */
	if (s->exact && ARCH_HAS_LR) {
		/* A sampled instruction may stand where the frame is not whole:
		 * HotSpot's AArch64 frames keep x29 and x30 at their top, saved
		 * by `sub sp, sp, #n; stp x29, x30, [sp, #n-16]` (or, large,
		 * `stp x29, x30, [sp, #-16]!; sub sp, ...`) and restored by
		 * `ldp x29, x30, [sp, #n-16]; add sp, sp, #n` (or `add sp, ...;
		 * ldp x29, x30, [sp], #16`) before the return poll and `ret`.
		 * w[0..3] are the four instructions before pc, w[4..11] from it. */
		__u32 *w = (__u32 *)&r->sb[256];
		for (int i = 0; i < 12; i++)
			w[i] = 0;
		if (bpf_probe_read_user(w, 48, (void *)(pc - 16)))
			bpf_probe_read_user(&w[4], 32, (void *)pc);
		bool gone = A64_IS_RET(w[4]);
		bool pushed16 = false; /* large frame: x29, x30 pushed, sp not lowered yet */
		bool lowered = false;  /* a `sub sp, sp, #n` between that push and pc */
		/* At a large frame's ldp x29, x30, [sp], #16: all but the pair
		 * popped. */
		bool at_pop = A64_IS_LDP_FP_LR_POST(w[4]);
		/* Back from pc, up to a branch or return: the epilogue's restore. */
		bool stop = false;
		for (int i = 3; i >= 0; i--) {
			__u32 x = w[i];
			/* Words before the code are the blob's data, not
			 * instructions (pc at the code's first word: the entry of a
			 * virtual call). */
			if (stop || gone || at_pop || pc - 16 + 4 * i < code)
				break;
			if (A64_IS_SUB_SP_IMM(x)) {
				lowered = true; /* sub sp, sp, #n */
			} else if (A64_IS_RET(x) || A64_IS_B_OR_BL(x)) {
				stop = true; /* ret, b, bl: another block */
			} else if (A64_IS_LDP_FP_LR_POST(x)) {
				gone = true; /* after ldp x29, x30, [sp], #16 */
			} else if (A64_IS_LDP_FP_LR(x)) {
				/* after ldp x29, x30, [sp, #m]: the add sp that follows
				 * it is done unless it is at pc */
				__u32 nx = w[(i + 1) & 15];
				if (A64_IS_ADD_SP_IMM(nx)) {
					if (i == 3)
						cfa = sp + A64_SP_IMM(nx);
					else
						cfa = sp;
					rbp_at = 0;
					in_lr = true;
				}
				stop = true;
			} else if (A64_IS_STP_FP_LR_PRE(x)) {
				pushed16 = true; /* stp x29, x30, [sp, #-16]! before pc */
				stop = true;
			}
		}
		if (at_pop) {
			cfa = sp + 16;
		} else if (gone) {
			cfa = sp;
			rbp_at = 0;
			in_lr = true;
		} else if (!in_lr && fc >= 0 && pc - code < (__u64)fc) {
			/* The prologue: an nmethod's decoded from its verified entry
			 * (hs_a64.h); before it (the inline-cache check of a virtual
			 * call) nothing is done yet. */
			__u64 vep = 0, osr = 0;
			hs_entries(c, head, have, blob, code, fc, &vep, &osr);
			if (vep) {
				int st = HS_A64_NOTHING;
				__u32 low = 0;
				if (pc > vep) {
					if (osr > vep && osr <= pc)
						vep = osr;
					__u32 *e = (__u32 *)&r->sb[128];
					if (bpf_probe_read_user(e, HS_A64_PRO * 4, (void *)vep) ||
					    !hs_a64_pro_words(e, (pc - vep) >> 2, &st, &low)) {
						rt_stat(RT_S_JIT_UNKNOWN, 1);
						return hs_end(s, UNW_END_NO_TABLE);
					}
				}
				if (st == HS_A64_PUSHED) {
					cfa = sp + 16;
				} else if (st == HS_A64_NOTHING) {
					cfa = sp + low;
					rbp_at = 0;
					in_lr = true;
				}
			}
			/* A stub's (no verified entry): x29 and x30 saved ahead, the
			 * stack lowered ahead or not. Skipped for a method by
			 * starting with found set: an `if (!vep)` around the scan
			 * costs hs_step 8 bytes of stack on arm64, which the 512
			 * bytes of the whole call chain do not have. */
			bool sub = false, found = vep != 0;
			for (int i = 4; i < 12; i++) {
				__u32 x = w[i];
				if (found)
					break;
				if (A64_IS_SUB_SP_IMM(x)) {
					sub = true; /* sub sp, sp, #n */
				} else if (A64_IS_STP_FP_LR_PRE(x)) {
					found = true; /* stp x29, x30, [sp, #-16]!: nothing pushed */
					cfa = sp;
					rbp_at = 0;
					in_lr = true;
				} else if (A64_IS_STP_FP_LR(x)) {
					found = true; /* stp x29, x30, [sp, #n-16] */
					if (sub)
						cfa = sp;
					rbp_at = 0;
					in_lr = true;
				}
			}
			if (!found && pushed16 && !lowered)
				cfa = sp + 16; /* a stub's */
		}
	} else if (s->exact) {
		/* A sampled instruction may stand where the frame is not whole. */
		__u8 *ins = &r->sb[256];
		for (int i = 0; i < 16; i++)
			ins[i] = 0;
		bpf_probe_read_user(ins, 16, (void *)pc);
		if (ins[0] == 0xc3) {
			cfa = sp + 8; /* ret */
			rbp_at = 0;
		} else if (ins[0] == 0x5d) {
			cfa = sp + 16; /* pop rbp */
		} else if ((ins[0] == 0x49 && ins[1] == 0x3b && ins[2] == 0xa7 && ins[7] == 0x0f &&
		            ins[8] == 0x87 && ins[13] == 0xc3) ||
		           (ins[0] == 0x49 && ins[1] == 0x3b && ins[2] == 0x67 && ins[4] == 0x0f &&
		            ins[5] == 0x87 && ins[10] == 0xc3) ||
		           (ins[0] == 0x0f && ins[1] == 0x87 && ins[6] == 0xc3) ||
		           (ins[0] == 0x41 && ins[1] == 0x85 && ins[2] == 0x02 && ins[3] == 0xc3)) {
			cfa = sp +
			      8; /* the return poll (cmp rsp, [r15 + d32 or d8]; ja), after pop rbp */
			rbp_at = 0;
		} else if (fc >= 0 && pc - code < (__u64)fc) {
			/* The prologue: what the code before pc did. */
			__u64 pushed = 0;
			int below = 0;
			__u64 vep = 0, osr = 0;
			hs_entries(c, head, have, blob, code, fc, &vep, &osr);
			if (!hs_x86_prologue(r, vep, osr, pc, &pushed, &below)) {
				rt_stat(RT_S_JIT_UNKNOWN, 1);
				return hs_end(s, UNW_END_NO_TABLE);
			}
			cfa = sp + 8 + pushed;
			rbp_at = below;
		}
	}
	if (in_lr) {
		if (!lr_ok)
			return hs_end(s, UNW_END_READ);
		s->pc = unw_real_ra(s, lr & unw_ra_mask);
		s->sp = cfa;
		s->exact = 0;
		return s->pc ? 0 : hs_end(s, UNW_END_FP_CHAIN);
	}
	HS_W(r, 1) = 0;
	if ((rbp_at && !unw_read(s, &HS_W(r, 1), cfa - rbp_at)) ||
	    !unw_read(s, &HS_W(r, 0), cfa - 8))
		return hs_end(s, UNW_END_READ);
	__u64 ra = unw_real_ra(s, HS_W(r, 0) & unw_ra_mask);
	if (rbp_at) {
		s->bp = HS_W(r, 1);
		s->bp_ok = 1;
	}
	s->pc = ra;
	s->sp = cfa;
	s->exact = 0;
	return ra ? 0 : hs_end(s, UNW_END_FP_CHAIN);
}

#endif
