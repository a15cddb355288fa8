// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * JavaScript frames on V8, stepped in the kernel as the native walk meets
 * them (types in v8.h; registered in runtimes.h as RT_V8's stepper, run by
 * unw_step for pcs in V8's code range or its builtins).
 *
 * Every frame V8 generates keeps a frame pointer (rbp; x29 on AArch64):
 * [fp] is the caller's fp, [fp+8] the return address. Below it, [fp-8] holds either a
 * context (a tagged heap pointer: a JavaScript frame) or a marker (a Smi:
 * a typed frame, V8's own entry, exit, stub or builtin frame), and a
 * JavaScript frame has its JSFunction at [fp-16]. What names the frame:
 *
 * - Interpreted (the pc in the interpreter's entry trampolines or bytecode
 *   handlers): the BytecodeArray at [fp-32] and the current bytecode's
 *   offset at [fp-40]; recorded as the function's SharedFunctionInfo and
 *   that offset, with the BytecodeArray's address as cookie.
 * - Generated code (baseline, Maglev, TurboFan) that is the function's
 *   current code (JSFunction::code, whose instructions hold the pc):
 *   optimized code is recorded as the Code object and the pc's offset in
 *   it (user space reads the functions inlined there from the Code's
 *   source positions and deoptimization data); baseline code as the
 *   SharedFunctionInfo and the offset.
 * - Generated code that is not (on-stack replacement, code replaced while
 *   a frame still ran it): the SharedFunctionInfo and the pc, for user
 *   space to find the code that holds it.
 * - A builtin: stays a native frame (its symbol names it).
 *
 * A sampled instruction in a prologue or at a return has no frame of its
 * own yet (or any more); the instructions at the pc tell.
 */
#ifndef SONDE_V8_WALK_H
#define SONDE_V8_WALK_H

#include "unwind_state.h"
#include "v8.h"

/* Scratch words in the runtime state (rt_state.sb, unused by V8 walks),
 * off the BPF stack (see HS_W). */
#define V8_W(r, i) (((__u64 *)(r)->sb)[(i)&15])

static __always_inline bool v8_in(const __u64 *lo, const __u64 *hi, __u32 n, __u32 max, __u64 at)
{
	for (int i = 0; i < max; i++) {
		if (i >= n)
			break;
		if (at >= lo[i] && at < hi[i])
			return true;
	}
	return false;
}

/* Records JavaScript frame `len` of the native walk. */
static __always_inline void v8_push(struct unw_state *s, struct rt_state *r, __u32 len, __u64 addr,
                                    __u32 loc, __u16 cookie, __u8 flags)
{
	if (s->exact)
		flags |= V8_F_LEAF;
	if (rt_push(r, addr, loc, cookie, RT_F_ENTRY | flags))
		s->rt_marks[(len >> 6) & 1] |= 1ULL << (len & 63);
	else
		r->st.end = RT_END_DEPTH;
}

/* Reads the JSFunction `fn`'s Code and whether it holds `at`: its
 * instruction start in V8_W(3), size in V8_W(4), kind in V8_W(5), the
 * Code in V8_W(6), the SharedFunctionInfo in V8_W(7). */
static __always_inline bool v8_code_of(struct rt_state *r, __u64 fn, __u64 at)
{
	struct v8_proc *c = RT_PART(r, struct v8_proc);
	if (bpf_probe_read_user(r->code, 64, (void *)(fn - 1)))
		return false;
	__u64 code = 0;
	if (c->fn_code) {
		code = rt_u64(r->code, c->fn_code);
	} else if (c->dispatch_base) {
		/* Leaptiering: the function's entry in the dispatch table. */
		__u64 idx = rt_u32(r->code, c->fn_dispatch) >> (c->handle_shift & 31);
		if (idx < c->dispatch_entries &&
		    bpf_probe_read_user(&code, 8,
		                        (void *)(c->dispatch_base + idx * c->dispatch_entry +
		                                 c->dispatch_code)) == 0)
			code = (code >> (c->code_shift & 63)) | 1;
	}
	V8_W(r, 7) = rt_u64(r->code, c->fn_shared);
	V8_W(r, 6) = code;
	if ((code & 3) != 1 || bpf_probe_read_user(r->code, 64, (void *)(code - 1)))
		return false;
	__u64 start = c->code_inline ? code - 1 + c->code_start : rt_u64(r->code, c->code_start);
	__u32 size = rt_u32(r->code, c->code_size);
	V8_W(r, 3) = start;
	V8_W(r, 4) = size;
	V8_W(r, 5) = (rt_u32(r->code, c->code_flags) >> (c->kind_shift & 31)) & c->kind_mask;
	return at >= start && at < start + size;
}

/*
 * One V8 frame of the walk in slot `slot` (its pc lies in V8's code range
 * or builtins); the pc is recorded already. Returns nonzero when the walk
 * ends.
 */
__noinline int v8_step(__u32 slot)
{
	struct unw_state *s = bpf_map_lookup_elem(&unw_scratch, &slot);
	struct rt_state *r = bpf_map_lookup_elem(&rt_scratch, &slot);
	if (!s || !r)
		return 1;
	struct v8_proc *c = RT_PART(r, struct v8_proc);
	__u32 len = s->st.len - 1;
	__u64 pc = s->pc, sp = s->sp, fp = s->bp;
	__u64 at = s->exact ? pc : pc - 1;
	bool interp = v8_in(c->interp_lo, c->interp_hi, c->ninterp, V8_INTERP, at);
	bool blob = interp || v8_in(c->blob_lo, c->blob_hi, c->nblobs, V8_BLOBS, at);
	/* AArch64: x30 holds this frame's return address only while it is the
	 * one sampled (or a signal interrupted); never a caller's. */
	bool lr_ok = s->lr_ok;
	__u64 lr = s->lr;
	s->lr_ok = 0;

	if (ARCH_HAS_LR && s->exact && !blob && lr_ok) {
		/* A sampled instruction where the frame is not built (yet, or
		 * any more): before the prologue's `stp x29, x30, [sp, ...]`
		 * (among the next instructions: V8's deoptimization check may
		 * come first), after the epilogue's `ldp x29, x30, [sp], #16`
		 * (the previous one), or at a return. The return address is
		 * still in x30, sp is the caller's (but for arguments a
		 * prologue pushed before x29), x29 the caller's. */
		__u32 *w = (__u32 *)&r->sb[256];
		for (int i = 0; i < 8; i++)
			w[i] = 0;
		if (bpf_probe_read_user(w, 32, (void *)(pc - 4)))
			bpf_probe_read_user(&w[1], 28, (void *)pc);
		bool unbuilt = A64_IS_LDP_FP_LR_POST(w[0]) || A64_IS_RET(w[1]);
		for (int i = 1; i < 8; i++) {
			if (A64_IS_STP_FP_LR(w[i]) || A64_IS_STP_FP_LR_PRE(w[i]))
				unbuilt = true;
		}
		if (unbuilt) {
			s->st.how |= UNW_HOW_FP;
			s->pc = unw_real_ra(s, lr & unw_ra_mask);
			s->exact = 0;
			if (!s->pc) {
				s->st.end = UNW_END_FP_CHAIN;
				return 1;
			}
			return 0;
		}
	}
	if (!ARCH_HAS_LR && s->exact && !blob) {
		/* A sampled instruction where the frame is not built (yet, or
		 * any more): `push rbp`, `mov rbp,rsp` or a return. */
		__u8 *ins = &r->sb[256];
		for (int i = 0; i < 4; i++)
			ins[i] = 0;
		bpf_probe_read_user(ins, 4, (void *)pc);
		__u64 ra_at = 0, nsp = 0;
		if (ins[0] == 0xc3) {
			ra_at = sp;
			nsp = sp + 8;
		} else if (ins[0] == 0xc2) {
			ra_at = sp;
			nsp = sp + 8 + (ins[1] | ((__u32)ins[2] << 8));
		} else if (ins[0] == 0x55) {
			ra_at = sp;
			nsp = sp + 8;
		} else if (ins[0] == 0x48 && ins[1] == 0x89 && ins[2] == 0xe5) {
			ra_at = sp + 8;
			nsp = sp + 16;
		}
		if (ra_at) {
			V8_W(r, 0) = 0;
			if (!unw_read(s, &V8_W(r, 0), ra_at))
				return 1;
			s->st.how |= UNW_HOW_FP;
			s->pc = unw_real_ra(s, V8_W(r, 0));
			s->sp = nsp;
			s->exact = 0;
			if (!s->pc) {
				s->st.end = UNW_END_FP_CHAIN;
				return 1;
			}
			return 0;
		}
	}
	if (!s->bp_ok || fp < sp || fp & 7 || fp - sp > 0x100000) {
		s->st.end = UNW_END_NO_TABLE;
		return 1;
	}
	/* 0 bytecode offset, 1 bytecode array, 2 context or marker,
	 * 3 function, 4 caller's fp, 5 return address: lowest first, as
	 * unw_read buffers the stack upwards. */
	if (!unw_read(s, &V8_W(r, 8), fp - V8_FP_BYTECODE_OFFSET) ||
	    !unw_read(s, &V8_W(r, 9), fp - V8_FP_BYTECODE_ARRAY) ||
	    !unw_read(s, &V8_W(r, 10), fp - V8_FP_CONTEXT) ||
	    !unw_read(s, &V8_W(r, 11), fp - V8_FP_FUNCTION) || !unw_read(s, &V8_W(r, 12), fp) ||
	    !unw_read(s, &V8_W(r, 13), fp + 8)) {
		s->st.end = UNW_END_READ;
		return 1;
	}
	__u64 fn = V8_W(r, 11);
	if ((V8_W(r, 10) & 1) && (fn & 3) == 1) {
		/* A JavaScript frame (a context at fp-8). */
		__u64 bo = V8_W(r, 8), ba = V8_W(r, 9);
		if (interp) {
			if ((__u32)bo == 0 && (ba & 3) == 1 &&
			    bpf_probe_read_user(&V8_W(r, 7), 8, (void *)(fn - 1 + c->fn_shared)) ==
			            0 &&
			    (V8_W(r, 7) & 3) == 1)
				v8_push(s, r, len, V8_W(r, 7), (__u32)(bo >> 32), (__u16)(ba >> 3),
				        V8_F_INTERP);
		} else if (!blob) {
			if (v8_code_of(r, fn, at)) {
				__u32 kind = V8_W(r, 5);
				__u16 ck = v8_code_cookie(V8_W(r, 3), V8_W(r, 4));
				__u32 off = (__u32)(pc - V8_W(r, 3));
				/* Baseline (Sparkplug), then Maglev and TurboFan. */
				if (kind == c->kind_baseline)
					v8_push(s, r, len, V8_W(r, 7), off, ck, V8_F_BASELINE);
				else if (kind > c->kind_baseline && kind <= c->kind_baseline + 2)
					v8_push(s, r, len, V8_W(r, 6), off, ck, V8_F_CODE);
			} else if ((V8_W(r, 7) & 3) == 1 && pc >= c->pc_base &&
			           pc - c->pc_base < 0xffffffffULL) {
				V8_W(r, 0) = 0;
				bpf_probe_read_user(&V8_W(r, 0), 8,
				                    (void *)(V8_W(r, 7) - 1 + c->sfi_name));
				v8_push(s, r, len, V8_W(r, 7), (__u32)(pc - c->pc_base),
				        (__u16)(V8_W(r, 0) >> 3), V8_F_PC);
			}
		} else if (s->exact && v8_code_of(r, fn, at) == false && V8_W(r, 4)) {
			/* A builtin sampled in the frame of the JavaScript
			 * function that called it, without a frame of its
			 * own: the return address into the function is at
			 * the top of the stack. */
			__u64 lo = V8_W(r, 3), hi = V8_W(r, 3) + V8_W(r, 4);
			/* AArch64: in x30. */
			if (ARCH_HAS_LR && lr_ok && (lr & unw_ra_mask) > lo &&
			    (lr & unw_ra_mask) <= hi) {
				s->st.how |= UNW_HOW_FP;
				s->pc = lr & unw_ra_mask;
				s->exact = 0;
				return 0;
			}
			for (int i = 0; !ARCH_HAS_LR && i < 3; i++) {
				V8_W(r, 0) = 0;
				if (!unw_read(s, &V8_W(r, 0), sp + 8 * i))
					break;
				if (V8_W(r, 0) > lo && V8_W(r, 0) <= hi) {
					s->st.how |= UNW_HOW_FP;
					s->pc = V8_W(r, 0);
					s->sp = sp + 8 * i + 8;
					s->exact = 0;
					return 0;
				}
			}
		}
	}
	s->st.how |= UNW_HOW_FP;
	__u64 ra = unw_real_ra(s, V8_W(r, 13) & unw_ra_mask);
	s->pc = ra;
	s->sp = fp + 16;
	s->bp = V8_W(r, 12);
	s->bp_ok = 1;
	s->exact = 0;
	/* AArch64: a builtin's frame record need not be at its frame's top
	 * (JSEntry saves x19-x28 and d8-d15 above it): from native code
	 * called into V8, the caller's sp is not known here, and the walk
	 * goes on by frame records. A JavaScript frame's is at its top. */
	s->fp_only = ARCH_HAS_LR && blob;
	if (!ra) {
		s->st.end = UNW_END_FP_CHAIN;
		return 1;
	}
	return 0;
}

#endif
