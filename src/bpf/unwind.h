// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * User stacks walked in the kernel from unwind tables, for programs built
 * without frame pointers. The tables are built in user space from each
 * executable's .eh_frame / .debug_frame (src/engine/unwind/), one compact
 * row per address range, and loaded into the maps of unwind_state.h before
 * the processes they serve are sampled.
 *
 * Per frame: find the mapping of the pc in the process's sorted mapping
 * list (binary search), the 64 KiB page of its executable's table (an array
 * index), the row within the page (binary search), then compute the CFA,
 * read the return address at CFA-8 and the caller's rbp where the row says.
 * Frames in code without a table (JIT, Go, hand-written assembly) take the
 * frame pointer instead. One frame is one call of unw_step, a global BPF
 * function (verified once, not per frame), from a bounded loop of up to
 * STK_MAX_DEPTH iterations: no bpf_loop, no tail calls, so no per-hook
 * program arrays and no tail-call depth limit. Each walked stack is hashed
 * and stored once in unw_walked, so user space reads each unique stack
 * once, as with bpf_get_stackid. Included by stacks.h.
 */
#ifndef SONDE_UNWIND_H
#define SONDE_UNWIND_H

#include "unwind_state.h"
#include "runtimes.h"

/* Asks user space to load process `pid`'s tables (`what` 1) or look at its
 * mappings again (2), and wakes it when the ask is new (user space keeps
 * an ask it is not ready for, so a JIT's code, outside every mapping,
 * wakes it at most as often as it refreshes). */
static __always_inline void unw_ask(const __u32 *pid, __u32 what)
{
	/* By pointer: a copy of the pid would take a stack slot of its own,
	 * and unw_step's frame must stay within 128 bytes (the verifier adds
	 * each frame of a call chain, rounded up to 32 bytes, against 512: the
	 * sched_switch program, unw_capture, unw_step and a runtime's step). */
	if (bpf_map_update_elem(&unw_need, pid, &what, BPF_NOEXIST) == 0)
		bpf_ringbuf_output(&unw_wake, (void *)pid, sizeof(*pid), 0);
}

/*
 * One frame of the walk in scratch slot `slot`: record the pc, then find
 * the caller's pc, sp and bp. Returns nonzero when the walk ends (the
 * reason is in st.end). Global, so the verifier checks it once.
 */
__noinline int unw_step(__u32 slot)
{
	struct unw_state *s = bpf_map_lookup_elem(&unw_scratch, &slot);
	if (!s)
		return 1;
	__u32 pid = s->pid;
	__u32 len = s->st.len;
	if (len >= STK_MAX_DEPTH) {
		s->st.end = UNW_END_DEPTH;
		return 1;
	}
	__u64 pc = s->pc;
	bool exact = s->exact;
	__u64 stored = (exact && len) ? pc + 1 : pc;
	s->st.pcs[len] = stored;
	s->st.len = len + 1;
	s->hash = (s->hash ^ stored) * 0x100000001b3ULL;
	s->hash ^= s->hash >> 29;

	__u64 at = exact ? pc : pc - 1;
	for (int i = 0; i < RT_JIT; i++) {
		if (at >= s->jit_lo[i] && at < s->jit_hi[i]) {
			int r = rt_jit_step(slot, s->jit_kind);
			if (r >= 0)
				return r;
			break;
		}
	}
	for (int i = 0; i < RT_MAX_RANGES; i++) {
		if (i >= s->rt_n)
			break;
		if (at >= s->rt_lo[i] && at < s->rt_hi[i]) {
			s->rt_marks[(len >> 6) & 1] |= 1ULL << (len & 63);
			break;
		}
	}
	if (len == 0 && s->in_syscall) {
		/* A task in a system call (off-CPU, or sampled in the kernel)
		 * stands after its syscall instruction, which may end its
		 * function's CFI (glibc's __restore_rt): look the syscall up. */
		__u32 insn = 0;
		if (bpf_probe_read_user(&insn, ARCH_SYSCALL_INSN_LEN,
		                        (void *)(pc - ARCH_SYSCALL_INSN_LEN)) == 0 &&
		    ARCH_IS_SYSCALL_INSN(insn))
			at = pc - 1;
	}
	struct unw_map *m = unw_find_map(s, at);
	bool in_table = false;
	__u64 row = 0;
	if (m)
		row = unw_find_row(s, m, at, &in_table);
	__u32 kind = (row >> 16) & 0xf;
	__u64 sp = s->sp, bp = s->bp, cfa = 0, ra = 0;
	__s64 off = ARCH_ROW_OFF(row);
	bool switched = false; /* to another stack: cfa need not be above sp */
	bool lr_ok = s->lr_ok;
	s->lr_ok = 0; /* a caller's return address is never in the link register */

	/* AArch64: a frame record says where the caller's x29 and return
	 * address are, not where its frame begins; after one, the walk goes
	 * on by frame records. */
	if (ARCH_HAS_LR && s->fp_only && kind != UNW_SIGNAL && kind != UNW_STOP)
		kind = UNW_GAP;
	if (kind == UNW_GAP) {
		if (!m) {
			/* Code outside every mapping we know: JIT, or mapped
			 * after the tables were loaded (ask for a refresh). */
			unw_ask(&pid, 2);
			s->why_fp = UNW_END_NO_TABLE;
		} else {
			s->why_fp = in_table ? UNW_END_GAP : UNW_END_NO_TABLE;
		}
		/* Frame pointer: [rbp] is the caller's rbp, [rbp+8] the return
		 * address; rbp 0 ends the chain (_start and Go's goexit clear it). */
		if (s->bp_ok && bp == 0) {
			s->st.end = UNW_END_FP_CHAIN;
			return 1;
		}
		if (!s->bp_ok || bp < sp) {
			s->st.end = s->why_fp;
			return 1;
		}
		__u64 nbp = 0;
		if (!unw_read(s, &ra, bp + 8) || !unw_read(s, &nbp, bp)) {
			s->st.end = s->why_fp;
			return 1;
		}
		s->st.how |= UNW_HOW_FP;
		ra = unw_real_ra(s, ra & unw_ra_mask);
		if (ra == 0) {
			s->st.end = UNW_END_FP_CHAIN;
			return 1;
		}
		s->pc = ra;
		s->sp = bp + 16;
		s->bp = nbp;
		s->exact = 0;
		s->fp_only = ARCH_HAS_LR;
		return 0;
	}
	s->st.how |= UNW_HOW_TABLE;
	switch (kind) {
	case UNW_STOP:
		s->st.end = UNW_END_ROOT;
		return 1;
	case UNW_SIGNAL: {
		if (!s->st.sigframe)
			s->st.sigframe = len + 1;
		/* The signal frame at sp holds the interrupted code's registers
		 * (arch.h: ARCH_SIG_*). */
		__u64 nbp = 0, nsp = 0, nip = 0, nlr = 0;
		if (!unw_read(s, &nbp, sp + ARCH_SIG_FP) || !unw_read(s, &nsp, sp + ARCH_SIG_SP) ||
		    !unw_read(s, &nip, sp + ARCH_SIG_PC) ||
		    (ARCH_HAS_LR && !unw_read(s, &nlr, sp + ARCH_SIG_LR))) {
			s->st.end = UNW_END_READ;
			return 1;
		}
		/* The interrupted code's stack is above the signal frame, but
		 * for a handler on an alternate stack (sigaltstack), left once
		 * per walk: a second step down is a stale frame read again (a
		 * loop), not a stack. */
		if (nsp <= sp) {
			if (s->sig_down) {
				s->st.end = UNW_END_NO_PROGRESS;
				return 1;
			}
			s->sig_down = 1;
		}
		s->pc = nip;
		s->sp = nsp;
		s->bp = nbp;
		s->bp_ok = 1;
		s->exact = 1;
		s->lr = nlr & unw_ra_mask;
		s->lr_ok = ARCH_HAS_LR;
		s->fp_only = 0;
		return nip ? 0 : 1;
	}
	case UNW_GO_CGO: {
		/* Go's asmcgocall, returned to from the C it ran on the system
		 * stack: [sp + (off & 0xff)] is the goroutine stack's depth
		 * below g.stack.hi (g at [sp + (off >> 8)], stack.hi its second
		 * word) at the switch, or the stack pointer itself where g is
		 * 0 (it was on the system stack already). There its prologue
		 * saved the return address and the caller's frame pointer (the
		 * row says where). Stopped here by a sample, the stack is not
		 * switched yet or back already: end the walk there. */
		__u64 depth = 0, g = 0, hi = 0;
		if (exact) {
			s->st.end = UNW_END_ROOT;
			return 1;
		}
		if (!unw_read(s, &depth, sp + ((__u32)off & 0xff)) ||
		    !unw_read(s, &g, sp + (((__u32)off >> 8) & 0xff)) ||
		    (g && bpf_probe_read_user(&hi, sizeof(hi), (void *)(g + 8)))) {
			s->st.end = UNW_END_READ;
			return 1;
		}
		cfa = (g ? hi - depth : depth) + 16;
		switched = true;
		break;
	}
	case UNW_GO_CALLBACK: {
		/* Go's cgocallback, returned to on the goroutine's stack from
		 * cgocallbackg: the C that called back into Go runs on the
		 * system stack, where cgocallback's own frame starts at
		 * g0.sched.sp (g from the thread's TLS, then g.m, m.g0). Only
		 * the innermost callback's is there (a nested one's was
		 * restored); a sample in cgocallback itself, or a second
		 * callback, goes up the goroutine's stack (cgocallback pushed
		 * its caller there). off packs the CFA's offset, g.m's,
		 * sched.sp's and the TLS slot's (table.rs, Cfa::GoCallback;
		 * per architecture, arch.h). */
		__u64 d = ARCH_GO_CB_CFA(off);
		if (exact || s->go_cb) {
			cfa = sp + d;
			break;
		}
		__u64 fs = s->fsbase;
		__u64 g = 0, m = 0, g0 = 0, g0sp = 0;
		__s64 tls = ARCH_GO_CB_TLS(off);
		if (bpf_probe_read_user(&g, 8, (void *)(fs + tls)) || !g ||
		    bpf_probe_read_user(&m, 8, (void *)(g + ARCH_GO_CB_GM(off))) || !m ||
		    bpf_probe_read_user(&g0, 8, (void *)m) || !g0 ||
		    bpf_probe_read_user(&g0sp, 8, (void *)(g0 + ARCH_GO_CB_SCHED_SP(off))) ||
		    !g0sp) {
			cfa = sp + d;
			break;
		}
		cfa = g0sp + d;
		s->go_cb = 1;
		switched = true;
		break;
	}
	case UNW_RSP:
		cfa = sp + (__s64)off;
		break;
	case UNW_RBP:
		if (!s->bp_ok) {
			s->st.end = UNW_END_UNSUPPORTED;
			return 1;
		}
		cfa = bp + (__s64)off;
		break;
	case UNW_PLT:
		cfa = sp + 8 + (((pc & 15) >= (__u64)off) ? 8 : 0);
		break;
	case UNW_DEREF_RSP:
	case UNW_DEREF_RBP:
		if (kind == UNW_DEREF_RBP && !s->bp_ok) {
			s->st.end = UNW_END_UNSUPPORTED;
			return 1;
		}
		if (!unw_read(s, &cfa, (kind == UNW_DEREF_RSP ? sp : bp) + (__s64)off)) {
			s->st.end = UNW_END_READ;
			return 1;
		}
		break;
	default:
		s->st.end = UNW_END_UNSUPPORTED;
		return 1;
	}
	__u32 rak = (row >> 22) & 0x3;
	if (rak == UNW_RA_LR) {
		if (!lr_ok) {
			s->st.end = UNW_END_UNSUPPORTED;
			return 1;
		}
		ra = s->lr;
	} else {
		if (!unw_read(s, &ra, cfa + ARCH_ROW_RA_OFF(row))) {
			s->st.end = UNW_END_READ;
			return 1;
		}
	}
	{
		__u32 rk = (row >> 20) & 0x3;
		__s64 roff = ARCH_ROW_FP_OFF(row);
		if (rk == UNW_RBP_AT_RBP && !s->bp_ok) {
			s->bp_ok = 0; /* saved through an rbp we do not know */
		} else if (rk == UNW_RBP_AT_CFA || rk == UNW_RBP_AT_RBP) {
			__u64 nbp = 0;
			if (!unw_read(s, &nbp, (rk == UNW_RBP_AT_CFA ? cfa : bp) + roff)) {
				s->st.end = UNW_END_READ;
				return 1;
			}
			s->bp = nbp;
			s->bp_ok = 1;
		} else if (rk == UNW_RBP_UNKNOWN) {
			s->bp_ok = 0;
		}
	}
	ra = unw_real_ra(s, ra & unw_ra_mask);
	/* The CFA is above sp, or equal to it where the return address is
	 * still in the link register (nothing pushed yet). */
	if ((cfa < sp || (cfa == sp && rak != UNW_RA_LR)) && !switched) {
		s->st.end = UNW_END_NO_PROGRESS;
		return 1;
	}
	if (ra == 0) {
		s->st.end = UNW_END_FP_CHAIN;
		return 1;
	}
	s->pc = ra;
	s->sp = cfa;
	s->exact = 0;
	return 0;
}

/*
 * Walks the current task's user stack from the tables into unw_walked and
 * sets *uhash to the stack's hash there (0: no user stack, a kernel thread,
 * or unw_walked full). Returns false when the caller should take the
 * frame-pointer stack instead: the process's tables are not loaded yet
 * (user space is asked to load them), or a walk is already running on
 * this CPU.
 */
static __noinline bool unw_capture(__u32 pid, __u64 *uhash)
{
	*uhash = 0;
	struct unw_proc *p = bpf_map_lookup_elem(&unw_procs, &pid);
	if (!p) {
		unw_ask(&pid, 1);
		unw_stat(UNW_S_PENDING);
		return false;
	}
	__u32 slot = 0;
	struct unw_state *s = bpf_map_lookup_elem(&unw_scratch, &slot);
	if (!s)
		return false;
	if (s->busy) {
		slot = 1;
		s = bpf_map_lookup_elem(&unw_scratch, &slot);
		if (!s || s->busy) {
			unw_stat(UNW_S_NESTED);
			return false;
		}
	}
	struct task_struct *task = bpf_get_current_task_btf();
	if (!BPF_CORE_READ(task, mm))
		return true; /* a kernel thread: no user stack */
	if (!ARCH_TABLE_WALK)
		return false;
	s->fsbase = ARCH_TLS_BASE(task);
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!regs)
		return true;
	/* One read of the registers, not one per field. */
	if (bpf_probe_read_kernel(&s->regs, sizeof(s->regs), regs))
		return true;
	/* A 32-bit process: the kernel's walk knows its frames; the tables
	 * here are for 64-bit code. */
	if (!ARCH_USER64(&s->regs))
		return false;
	s->busy = 1;
	s->ri = 0;
	s->tramp = 0;
	struct uprobe_task *ut = BPF_CORE_READ(task, utask);
	if (ut) {
		s->ri = (__u64)BPF_CORE_READ(ut, return_instances);
		if (s->ri)
			s->tramp = BPF_CORE_READ(task, mm, uprobes_state.xol_area, vaddr);
	}
	/* The syscall number in a system call, -1 for an interrupt (a
	 * sample of user code). */
	s->in_syscall = ARCH_SYSCALL_NR(&s->regs) >= 0;
	s->go_cb = 0;
	s->sig_down = 0;
	s->lr = ARCH_LR(&s->regs) & unw_ra_mask;
	s->lr_ok = ARCH_HAS_LR;
	s->fp_only = 0;
	s->pc = ARCH_PC(&s->regs);
	s->sp = ARCH_SP(&s->regs);
	s->bp = ARCH_FP(&s->regs);
	s->pid = pid;
	s->hash = 0xcbf29ce484222325ULL;
	s->bp_ok = 1;
	s->exact = 1;
	s->why_fp = UNW_END_NO_TABLE;
	s->st.len = 0;
	s->st.end = UNW_END_DEPTH;
	s->st.how = 0;
	s->st.sigframe = 0;
	s->last_map = 0;
	s->last_hi = 0;
	s->buf_ok = 0;
	s->rt_n = 0;
	s->rt_marks[0] = 0;
	s->rt_marks[1] = 0;
	for (int i = 0; i < RT_JIT; i++) {
		s->jit_lo[i] = 0;
		s->jit_hi[i] = 0;
	}
	struct rt_state *rs = NULL;
	if (rt_mode) {
		struct rt_proc *rp = bpf_map_lookup_elem(&rt_procs, &pid);
		if (rp)
			rs = bpf_map_lookup_elem(&rt_scratch, &slot);
		if (rs && bpf_probe_read_kernel(&rs->cfg, sizeof(rs->cfg), rp) == 0) {
			__u32 nr = rs->cfg.nranges;
			s->rt_n = nr > RT_MAX_RANGES ? RT_MAX_RANGES : nr;
			for (int i = 0; i < RT_MAX_RANGES; i++) {
				s->rt_lo[i] = rs->cfg.lo[i];
				s->rt_hi[i] = rs->cfg.hi[i];
			}
			for (int i = 0; i < RT_JIT; i++) {
				s->jit_lo[i] = rs->cfg.jit_lo[i];
				s->jit_hi[i] = rs->cfg.jit_hi[i];
			}
			s->jit_kind = rs->cfg.kind;
			rs->fsbase = s->fsbase;
			rs->st.n = 0;
			rs->st.end = RT_END_DONE;
			rs->hash = 0xcbf29ce484222325ULL;
		}
	}
	__u32 n = p->n;
	if (n > UNW_MAX_MAPS)
		n = UNW_MAX_MAPS;
	s->st.gen = p->gen;
	s->proc.n = n;
	bpf_probe_read_kernel(&s->proc.maps, n * sizeof(struct unw_map), &p->maps);
	for (int i = 0; i < STK_MAX_DEPTH + 1; i++)
		if (unw_step(slot))
			break;

	__u8 how = s->st.how, end = s->st.end;
	unw_stat(!(how & UNW_HOW_TABLE) ? UNW_S_FPWALK
	         : (how & UNW_HOW_FP)   ? UNW_S_MIXED
	                                : UNW_S_TABLES);
	if (end < UNW_END_MAX)
		unw_stat(UNW_S_END + end);
	/* Language frames, when the walk went through an interpreter loop. */
	__u64 rh = 0;
	if (rs && (s->rt_marks[0] | s->rt_marks[1])) {
		rs->st.marks[0] = s->rt_marks[0];
		rs->st.marks[1] = s->rt_marks[1];
		rt_walk(slot);
		if (rs->st.n) {
			rh = rs->hash | 1;
			s->st.how |= UNW_HOW_RT;
			how = s->st.how;
		}
	}
	__u64 h = s->hash ^ ((__u64)end << 56) ^ ((__u64)how << 48) ^ ((__u64)s->st.gen << 24) ^
	          s->st.len ^ rh;
	h *= 0x9e3779b97f4a7c15ULL;
	h ^= h >> 31;
	if (!h)
		h = 1;
	if (!bpf_map_lookup_elem(&unw_walked, &h)) {
		if (rh) {
			if (bpf_map_update_elem(&rt_walked, &h, &rs->st, BPF_ANY)) {
				rt_stat(RT_S_STORE_FULL, 1);
				s->st.how &= ~UNW_HOW_RT;
			} else {
				rt_note(slot, pid);
			}
		}
		if (bpf_map_update_elem(&unw_walked, &h, &s->st, BPF_NOEXIST) &&
		    !bpf_map_lookup_elem(&unw_walked, &h)) {
			unw_stat(UNW_S_STORE_FULL);
			h = 0;
		}
	}
	s->busy = 0;
	*uhash = h;
	return true;
}

/* An exec replaces the process's mappings: forget its tables and runtime,
 * and ask for the new image's at once. */
SEC("raw_tp/sched_process_exec")
int unw_exec(void *ctx)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	if (bpf_map_lookup_elem(&rt_procs, &pid))
		bpf_map_delete_elem(&rt_procs, &pid);
	if (bpf_map_lookup_elem(&unw_procs, &pid)) {
		bpf_map_delete_elem(&unw_procs, &pid);
		/* Watched before: its new image is loaded now, before it runs
		 * much of it. */
		unw_ask(&pid, 1);
	}
#ifdef SONDE_TASKFILTER_H
	/* A command sonde started, or a process it started: loaded as its
	 * program begins (its maps are whole only now: the exec has mapped
	 * the binary and its interpreter). */
	else if (tf_follow && bpf_map_lookup_elem(&tf_pids, &pid)) {
		unw_ask(&pid, 1);
	}
#endif
	return 0;
}

#endif
