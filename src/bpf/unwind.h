// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * User stacks walked in the kernel from unwind tables, for programs built
 * without frame pointers. The tables are built in user space from each
 * executable's .eh_frame / .debug_frame (src/engine/unwind/), one compact
 * row per address range, and loaded into the maps below before the
 * processes they serve are sampled.
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

#include <bpf/bpf_core_read.h>
#include "arch.h"
#include "runtime.h"

#define UNW_MAX_MAPS     256 /* executable mappings per process */
#define UNW_CHUNK_SHIFT  17  /* rows per chunk: 128 Ki (1 MiB) */
#define UNW_CHUNK_ROWS   (1 << UNW_CHUNK_SHIFT)
#define UNW_MAX_CHUNKS   512  /* at most 512 MiB of rows */
#define UNW_PAGE_SHIFT   16   /* a table page covers 64 KiB of code */
#define UNW_SEARCH_STEPS 17   /* log2(rows in a page) + 1 */
#define UNW_MAP_STEPS    9    /* log2(UNW_MAX_MAPS) + 1 */
#define UNW_BUF          1024 /* bytes of stack read at a time (a power of two) */

/* Row fields (src/engine/unwind/table.rs, Rule::encode). */
#define UNW_GAP         0
#define UNW_RSP         1
#define UNW_RBP         2
#define UNW_PLT         3
#define UNW_DEREF_RSP   4
#define UNW_DEREF_RBP   5
#define UNW_STOP        6
#define UNW_SIGNAL      7
#define UNW_UNSUPPORTED 8
#define UNW_GO_CGO      9
#define UNW_GO_CALLBACK 10
#define UNW_RBP_SAME    0
#define UNW_RBP_AT_CFA  1
#define UNW_RBP_AT_RBP  2
#define UNW_RBP_UNKNOWN 3
/* Where the return address is (bits 22-23). */
#define UNW_RA_SAVED    0 /* at CFA + ARCH_ROW_RA_OFF */
#define UNW_RA_LR       1 /* still in the link register (AArch64's x30) */

/* One executable mapping of a process. */
struct unw_map {
	__u64 start;
	__u64 end;
	__u64 bias;       /* the file's virtual address of pc is pc - bias */
	__u64 lo_page;    /* vaddr >> UNW_PAGE_SHIFT of the table's first page */
	__u32 first_page; /* its index in unw_pages */
	__u32 n_pages;    /* 0: no table (frame pointers) */
};

/* A process's executable mappings, sorted by start. */
struct unw_proc {
	__u32 n;
	__u32 pad;
	struct unw_map maps[UNW_MAX_MAPS];
};

/* Why a walk ended (slots STK_U_END + this in the tool's stats). */
enum unw_end {
	UNW_END_ROOT = 0, /* the outermost frame: its row says there is no caller */
	UNW_END_FP_CHAIN, /* a frame-pointer step found the chain's end (rbp or return address 0) */
	UNW_END_DEPTH,    /* STK_MAX_DEPTH frames */
	UNW_END_READ,     /* reading the stack failed (page not resident, bad address) */
	UNW_END_NO_TABLE, /* a frame without a table and without a usable frame pointer */
	UNW_END_GAP,      /* a gap in a table (code without CFI) and no usable frame pointer */
	UNW_END_UNSUPPORTED, /* a rule the walk does not evaluate */
	UNW_END_NO_PROGRESS, /* the stack pointer did not move up: corrupt stack or table */
	UNW_END_MAX,
};

/* How a walked stack was made (unw_stack.how bits). */
#define UNW_HOW_TABLE 1 /* at least one frame from a table */
#define UNW_HOW_FP    2 /* at least one frame from its frame pointer */
#define UNW_HOW_RT    4 /* language frames in rt_walked under the same key */

/* A walked user stack: unw_walked's value. */
struct unw_stack {
	__u32 len;
	__u8 end;       /* enum unw_end */
	__u8 how;       /* UNW_HOW_* */
	__u16 sigframe; /* 1 + the index of the first signal trampoline frame, or 0 */
	__u64 pcs
	        [STK_MAX_DEPTH]; /* leaf first; a frame interrupted by a signal is stored as pc + 1 */
};

/* Walk state, per CPU (two slots: a sampler may interrupt a walk). */
struct unw_state {
	__u64 pc;
	__u64 sp;
	__u64 bp;
	__u64 hash;
	__u64 tramp;  /* the uretprobe trampoline's address in this process */
	__u64 ri;     /* the next pending uretprobe's return_instance (kernel pointer) */
	__u64 fsbase; /* the thread pointer (read here: unw_step, verified on its own,
	               * cannot call bpf_get_current_task_btf on kernels without it) */
	__u64 lr;     /* the link register, while the frame walked knows it */
	__u32 pid;
	__u32 busy;
	__u8 bp_ok;      /* rbp still known */
	__u8 exact;      /* look the next pc up as is (leaf, or interrupted by a signal) */
	__u8 why_fp;     /* the end to report if the current frame-pointer step fails */
	__u8 in_syscall; /* the user registers were saved by a system call */
	__u8 go_cb;      /* a Go cgocallback was followed to the system stack */
	__u8 lr_ok;      /* lr holds this frame's return address if its row says so */
	__u8 fp_only;    /* AArch64: a frame-pointer step left sp unknown, go on by them */
	__u8 pad;
	/* Code the process's runtime generates and steps itself (runtime_jit.h). */
	__u64 jit_lo[RT_JIT];
	__u64 jit_hi[RT_JIT];
	__u32 jit_kind;
	__u32 pad3;
	/* The last row found, for frames that return into the same code
	 * (recursion, loops of calls): its page, the range of page offsets it
	 * covers, the row. */
	__u32 last_page;
	__u32 last_lo;
	__u32 last_hi;
	__u32 last_map; /* index of the last mapping found, + 1 */
	__u64 last_row;
	__u64 buf_at; /* user address of buf[0] */
	__u32 buf_ok; /* buf holds UNW_BUF bytes from buf_at */
	__u32 pad2;
	__u8 buf[UNW_BUF];
	/* The interpreter loop of the process's runtime (runtime.h), and
	 * which frames of the walk lie in it. */
	__u32 rt_n;
	__u32 rt_pad;
	__u64 rt_lo[RT_MAX_RANGES];
	__u64 rt_hi[RT_MAX_RANGES];
	__u64 rt_marks[2];
	struct unw_stack st;
	/* The task's user registers, read once per walk (here, not on the
	 * stack: kernels before private stacks count the stacks of the
	 * program, unw_capture, unw_step and a runtime's stepper together
	 * against 512 bytes). */
	struct pt_regs regs;
	/* The process's mappings, copied once per walk (no map lookup per frame). */
	struct unw_proc proc;
};

/* The unwinder's counters (unw_stats, summed per CPU by user space). */
enum unw_stat {
	UNW_S_HELPER = 0, /* user stacks by bpf_get_stackid (frame pointers) */
	UNW_S_PENDING,    /* ... because the process's tables were not loaded yet */
	UNW_S_NESTED,     /* ... because a walk was running on this CPU */
	UNW_S_TABLES,     /* walked: every frame from a table */
	UNW_S_MIXED,      /* walked: tables and frame pointers */
	UNW_S_FPWALK,     /* walked: frame pointers only (no frame had a table) */
	UNW_S_STORE_FULL, /* walked, not stored: unw_walked was full */
	UNW_S_END,        /* + enum unw_end: how walks ended */
	UNW_S_MAX = UNW_S_END + UNW_END_MAX,
};

/* 0: frame pointers only (bpf_get_stackid); 1: tables where loaded. */
const volatile __u32 unw_mode = 0;
/* The bits of a user return address that are its address: AArch64's
 * pointer authentication keeps a code in the others (user space computes
 * the mask from the running system). */
const volatile __u64 unw_ra_mask = ~0ULL;

struct unw_chunk {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, UNW_CHUNK_ROWS);
	__type(key, __u32);
	__type(value, __u64);
};

/* Rows, in chunks made by user space as tables are loaded. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, UNW_MAX_CHUNKS);
	__type(key, __u32);
	__array(values, struct unw_chunk);
} unw_chunks SEC(".maps");

/* Pages: first row (chunk << UNW_CHUNK_SHIFT | index) | rows << 32. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* sized by user space */
	__type(key, __u32);
	__type(value, __u64);
} unw_pages SEC(".maps");

/* Sized by user space: with tables, 8192 entries allocated as used
 * (BPF_F_NO_PREALLOC); without, one preallocated entry (kernels before 6.1
 * refuse run-time allocated hashes in perf_event programs). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unw_proc);
} unw_procs SEC(".maps");

/* Processes whose tables user space should load (1) or refresh (2: a pc
 * outside every known mapping, e.g. after dlopen). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} unw_need SEC(".maps");

/* Sized by user space, as unw_procs. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, struct unw_stack);
} unw_walked SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct unw_state);
} unw_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, UNW_S_MAX);
	__type(key, __u32);
	__type(value, __u64);
} unw_stats SEC(".maps");

static __always_inline void unw_stat(__u32 slot)
{
	__u64 *p = bpf_map_lookup_elem(&unw_stats, &slot);
	if (p)
		*p += 1;
}

/* The mapping holding `addr` (the last one found first), or NULL. */
static __always_inline struct unw_map *unw_find_map(struct unw_state *s, __u64 addr)
{
	struct unw_proc *p = &s->proc;
	__u32 n = p->n;
	if (n == 0 || n > UNW_MAX_MAPS)
		return NULL;
	if (s->last_map) {
		struct unw_map *m = &p->maps[(s->last_map - 1) & (UNW_MAX_MAPS - 1)];
		if (addr >= m->start && addr < m->end)
			return m;
	}
	__u32 lo = 0, hi = n;
	for (int k = 0; k < UNW_MAP_STEPS && hi - lo > 1; k++) {
		__u32 mid = (lo + hi) / 2;
		if (p->maps[mid & (UNW_MAX_MAPS - 1)].start <= addr)
			lo = mid;
		else
			hi = mid;
	}
	struct unw_map *m = &p->maps[lo & (UNW_MAX_MAPS - 1)];
	if (addr < m->start || addr >= m->end)
		return NULL;
	s->last_map = lo + 1;
	return m;
}

/* The row for `addr` in mapping `m`; 0 (a gap) when its table has none. */
static __always_inline __u64 unw_find_row(struct unw_state *s, struct unw_map *m, __u64 addr,
                                          bool *in_table)
{
	*in_table = false;
	if (!m->n_pages)
		return 0;
	__u64 vaddr = addr - m->bias;
	__u64 page = (vaddr >> UNW_PAGE_SHIFT) - m->lo_page;
	if (page >= m->n_pages)
		return 0;
	*in_table = true;
	__u32 pi = m->first_page + (__u32)page;
	__u32 target = vaddr & ((1 << UNW_PAGE_SHIFT) - 1);
	if (s->last_hi && pi == s->last_page && target >= s->last_lo && target < s->last_hi)
		return s->last_row;
	__u64 *pg = bpf_map_lookup_elem(&unw_pages, &pi);
	if (!pg)
		return 0;
	__u32 first = (__u32)*pg, n = *pg >> 32;
	if (!n)
		return 0;
	__u32 chunk = first >> UNW_CHUNK_SHIFT, base = first & (UNW_CHUNK_ROWS - 1);
	void *rows = bpf_map_lookup_elem(&unw_chunks, &chunk);
	if (!rows)
		return 0;
	__u32 lo = 0, hi = n;
	for (int k = 0; k < UNW_SEARCH_STEPS && hi - lo > 1; k++) {
		__u32 mid = (lo + hi) / 2;
		__u32 i = base + mid;
		__u64 *r = bpf_map_lookup_elem(rows, &i);
		if (!r)
			return 0;
		if ((__u16)*r <= target)
			lo = mid;
		else
			hi = mid;
	}
	__u32 i = base + lo;
	__u64 *r = bpf_map_lookup_elem(rows, &i);
	/* The table's first page may start after the page does. */
	if (!r || (__u16)*r > target)
		return 0;
	__u64 row = *r;
	/* Remember it with the range it covers (to the next row's offset). */
	__u32 end = 1 << UNW_PAGE_SHIFT;
	if (lo + 1 < n) {
		i = base + lo + 1;
		__u64 *next = bpf_map_lookup_elem(rows, &i);
		end = next ? (__u16)*next : 0;
	}
	s->last_page = pi;
	s->last_lo = (__u16)row;
	s->last_hi = end;
	s->last_row = row;
	return row;
}

/*
 * Reads a word of the user stack. Each read from user memory costs more
 * than the rest of a frame's work, so the stack is read UNW_BUF bytes at a
 * time from the lowest address needed (frames go up the stack) and words
 * are served from that copy; where a block cannot be read (the stack's top
 * end), one word is.
 */
static __always_inline bool unw_read(struct unw_state *s, __u64 *dst, __u64 addr)
{
	__u64 off = addr - s->buf_at;
	if (s->buf_ok && addr >= s->buf_at && off <= UNW_BUF - 8 && !(addr & 7)) {
		*dst = *(__u64 *)&s->buf[off & (UNW_BUF - 8)];
		return true;
	}
	if (!(addr & 7) && bpf_probe_read_user(s->buf, UNW_BUF, (void *)addr) == 0) {
		s->buf_at = addr;
		s->buf_ok = 1;
		*dst = *(__u64 *)&s->buf[0];
		return true;
	}
	return bpf_probe_read_user(dst, sizeof(*dst), (void *)addr) == 0;
}

/* A uretprobe (sonde slow's own, or anyone's) replaces the return address
 * of the probed function's frame with its trampoline; the real one is in
 * the thread's pending return instances, innermost first (as the kernel's
 * own fixup_uretprobe_trampoline_entries does for perf stacks). */
static __always_inline __u64 unw_real_ra(struct unw_state *s, __u64 ra)
{
	if (ra != s->tramp || !s->ri)
		return ra;
	struct return_instance *ri = (struct return_instance *)s->ri;
	__u64 real = BPF_CORE_READ(ri, orig_ret_vaddr);
	s->ri = (__u64)BPF_CORE_READ(ri, next);
	return real;
}

#include "runtime_jit.h"

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
			__u32 two = 2;
			bpf_map_update_elem(&unw_need, &pid, &two, BPF_NOEXIST);
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
		__u32 one = 1;
		bpf_map_update_elem(&unw_need, &pid, &one, BPF_NOEXIST);
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
	__u64 h = s->hash ^ ((__u64)end << 56) ^ ((__u64)how << 48) ^ s->st.len ^ rh;
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

/* An exec replaces the process's mappings: forget its tables, so its next
 * sample asks for new ones. */
SEC("raw_tp/sched_process_exec")
int unw_exec(void *ctx)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	if (bpf_map_lookup_elem(&unw_procs, &pid))
		bpf_map_delete_elem(&unw_procs, &pid);
	if (bpf_map_lookup_elem(&rt_procs, &pid))
		bpf_map_delete_elem(&rt_procs, &pid);
	return 0;
}

#endif
