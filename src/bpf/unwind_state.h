// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The unwinder's contract with the steppers of language runtimes: the walk
 * state (struct unw_state) a stepper reads and moves on (pc, sp, frame
 * pointer, how the walk ended), the unwinder's maps, and the helpers a
 * stepper may call (unw_read, unw_real_ra). The walk itself is unwind.h;
 * the runtimes' side of the contract is src/engine/runtime/contract.h.
 * Include after the libbpf headers, with STK_MAX_DEPTH defined (stacks.h).
 */
#ifndef SONDE_UNWIND_STATE_H
#define SONDE_UNWIND_STATE_H

#include <bpf/bpf_core_read.h>
#include "arch.h"
#include "contract.h"
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
	__u32 gen; /* which image of the process (user space counts its execs) */
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
	__u32 gen;      /* unw_proc.gen of the mappings it was walked in */
	__u32 pad;
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
	__u8 sig_down;   /* a signal frame's interrupted sp was not above it (sigaltstack) */
	/* Code the process's runtime generates and steps itself (its stepper, runtimes.h). */
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
	/* The interpreter loop of the process's runtime (contract.h), and
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

/* Wakes user space when a process needs its tables loaded (a pid per
 * record): a new process's first sample, or an exec, is walked from tables
 * within milliseconds rather than at the next poll. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} unw_wake SEC(".maps");

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

#endif
