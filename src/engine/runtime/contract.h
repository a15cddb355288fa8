// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The contract between the native walk (src/bpf/unwind.h) and the kernel
 * halves of language runtimes (one folder each beside this file, listed in
 * runtimes.h): what a walker is handed, what it records, and the helpers it
 * may call. User space (src/engine/runtime/) recognises a process's
 * runtime, learns where its interpreter loop lies and how to find the
 * running thread's frames, and hands that over in rt_procs: the part every
 * runtime has (struct rt_proc) and the runtime's own (its NAME_proc, in
 * rt_proc.part). While the native walk goes up the stack it marks the
 * frames whose pc lies in the interpreter loop, and hands frames of code the
 * runtime generates (a JIT's) to the runtime's stepper; after it, when it
 * marked any, the runtime's walker reads the thread's interpreter frame
 * chain. Either records, per language frame, what user space needs to name
 * it: the code object's address, where in it the frame is, and a cookie that
 * tells a freed and reused code object apart. User space replaces each
 * marked native frame by the language frames it was running.
 *
 * Reads only: bpf_probe_read_user of the current task's memory, every
 * pointer and length bounded. The layouts here are Rust types too
 * (generated from this file: src/engine/runtime/runtime.bpf.c).
 */
#ifndef SONDE_CONTRACT_H
#define SONDE_CONTRACT_H
#define RT_MAX_FRAMES 128  /* language frames kept per stack (a power of two) */
#define RT_MAX_RANGES 4    /* interpreter-loop pc ranges per process */
#define RT_BUF        128  /* bytes of a code object's head, or of a frame, read at once */
#define RT_SBUF       1024 /* bytes of a runtime's frame stack read at once (a power of two) */
#define RT_CODES      8    /* code objects remembered per walk (a power of two) */
#define RT_JIT        2    /* ranges of code the runtime generates and steps itself */

/* rt_proc.kind, rt_frame.kind: which runtime (one per process); each
 * has its row in runtimes.h. */
enum rt_kind {
	RT_NONE = 0,
	RT_PYTHON = 1, /* CPython: python/ */
	RT_JAVA = 2,   /* HotSpot: java/ */
	RT_V8 = 3,     /* V8 (Node.js): v8/ */
};

/* Why a runtime walk ended (rt_stack.end; slots RT_S_END + this). */
enum rt_end {
	RT_END_DONE = 0,  /* the outermost frame */
	RT_END_NO_THREAD, /* the thread has no interpreter state (it runs no code of the runtime) */
	RT_END_READ,      /* a read of the process's memory failed */
	RT_END_DEPTH,     /* RT_MAX_FRAMES frames */
	RT_END_BAD_FRAME, /* a frame that is not one (a code object of the wrong type) */
	RT_END_MAX,
};

/* rt_frame.flags */
#define RT_F_ENTRY 1 /* the outermost frame run by one native interpreter-loop frame */

/* One language frame. */
struct rt_frame {
	__u64 addr;   /* the code object */
	__u32 loc;    /* where in it: runtime-specific (instruction offset or index) */
	__u16 cookie; /* from fields of the code object, to tell a reused address apart */
	__u8 flags;   /* RT_F_* */
	__u8 kind;    /* enum rt_kind */
};

/* The language frames of a walked stack: rt_walked's value. */
struct rt_stack {
	__u16 n;
	__u8 end;  /* enum rt_end */
	__u8 kind; /* enum rt_kind */
	__u32 pad;
	__u64 marks[2]; /* bit i: native frame i (leaf first) is in the interpreter loop */
	struct rt_frame f[RT_MAX_FRAMES];
};

#define RT_PART_BYTES 256 /* the largest runtime's own part of struct rt_proc */

/* What the kernel needs to know of a process's runtime: rt_procs' value. */
struct rt_proc {
	__u32 kind; /* enum rt_kind (runtimes.h) */
	__u32 nranges;
	__u64 lo[RT_MAX_RANGES]; /* the interpreter loop: [lo, hi) */
	__u64 hi[RT_MAX_RANGES];
	/* Code the runtime generates, whose frames it steps itself as the
	 * native walk meets them (its stepper): [jit_lo, jit_hi), or empty. */
	__u64 jit_lo[RT_JIT];
	__u64 jit_hi[RT_JIT];
	/* The rt_frame.flags that are part of what names a code object (a
	 * frame's kind, for a runtime whose frames of one object are named
	 * apart), and of those the ones whose loc is too (rt_seen_key). */
	__u8 key_flags;
	__u8 key_loc;
	__u8 pad[6];
	/* The runtime's own part: its struct NAME_proc (RT_PART). */
	__u64 part[RT_PART_BYTES / 8];
};

/* The runtime's own part of a process's rt_proc, as its type. */
#define RT_PART(r, type) ((type *)(r)->cfg.part)

/* The walker's per-CPU state (two slots, as unw_scratch). */
struct rt_state {
	struct rt_proc cfg;
	__u64 fsbase; /* the thread pointer */
	__u64 frame;  /* the next frame to read */
	__u64 hash;
	__u8 code[RT_BUF];
	/* Where the runtime keeps its frames next to each other (CPython's
	 * data stack, 3.11+), one read serves several: RT_SBUF bytes that end
	 * at the last frame read outside them, from sb_at, sb_n valid. */
	__u64 sb_at;
	__u32 sb_n;
	__u32 pad;
	__u8 sb[RT_SBUF];
	/* The code objects this walk has read (a frame keeps its code object
	 * alive, so within one walk its address names one object): address and
	 * cookie, by the address's bits. Recursion reads each once. */
	__u64 cc_addr[RT_CODES];
	__u16 cc_cookie[RT_CODES];
	struct rt_stack st;
};

/* The runtime's counters (rt_stats, summed per CPU by user space). */
enum rt_stat {
	RT_S_WALKS = 0,  /* stacks whose native walk met an interpreter loop */
	RT_S_FRAMES,     /* language frames recorded */
	RT_S_STORE_FULL, /* language frames not kept: rt_walked was full */
	RT_S_SEEN_FULL,  /* code objects not handed to user space: rt_seen was full */
	RT_S_END,        /* + enum rt_end */
	/* A pc in the runtime's generated code that no code blob holds (code
	 * freed or being written), or a frame that names no code. */
	RT_S_JIT_UNKNOWN = RT_S_END + RT_END_MAX,
	RT_S_JIT_BAD,
	RT_S_MAX,
};

/* 1: read language frames where user space described the runtime. */
const volatile __u32 rt_mode = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized by user space */
	__type(key, __u32);
	__type(value, struct rt_proc);
} rt_procs SEC(".maps");

/* Language frames of walked stacks, by the stack's key in unw_walked. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized by user space */
	__type(key, __u64);
	__type(value, struct rt_stack);
} rt_walked SEC(".maps");

/* A code object met in a new stack, for user space to name while the
 * process lives (it drains the map). */
struct rt_seen_key {
	__u32 pid;
	__u16 cookie;
	__u8 kind;
	__u8 flags; /* the frame's flags in rt_proc.key_flags */
	__u64 addr;
	__u32 loc; /* the frame's loc where its flags are in rt_proc.key_loc */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized by user space */
	__type(key, struct rt_seen_key);
	__type(value, __u8);
} rt_seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct rt_state);
} rt_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RT_S_MAX);
	__type(key, __u32);
	__type(value, __u64);
} rt_stats SEC(".maps");

static __always_inline void rt_stat(__u32 slot, __u64 n)
{
	__u64 *p = bpf_map_lookup_elem(&rt_stats, &slot);
	if (p)
		*p += n;
}

/* Reads a u64 at byte `off` of a RT_BUF buffer (offsets from user space,
 * bounded here). */
static __always_inline __u64 rt_u64(const __u8 *buf, __u32 off)
{
	__u64 v = 0;
	if (off <= RT_BUF - 8)
		__builtin_memcpy(&v, buf + (off & (RT_BUF - 1)), 8);
	return v;
}

static __always_inline __u32 rt_u32(const __u8 *buf, __u32 off)
{
	__u32 v = 0;
	if (off <= RT_BUF - 4)
		__builtin_memcpy(&v, buf + (off & (RT_BUF - 1)), 4);
	return v;
}

static __always_inline __u8 rt_u8(const __u8 *buf, __u32 off)
{
	return off < RT_BUF ? buf[off & (RT_BUF - 1)] : 0;
}

/* Appends a frame of the process's runtime; false when the stack is full. */
static __always_inline bool rt_push(struct rt_state *r, __u64 addr, __u32 loc, __u16 cookie,
                                    __u8 flags)
{
	__u16 n = r->st.n;
	if (n >= RT_MAX_FRAMES)
		return false;
	struct rt_frame *f = &r->st.f[n & (RT_MAX_FRAMES - 1)];
	f->addr = addr;
	f->loc = loc;
	f->cookie = cookie;
	f->flags = flags;
	f->kind = r->cfg.kind;
	r->st.n = n + 1;
	r->hash = (r->hash ^ addr ^ ((__u64)loc << 40)) * 0x100000001b3ULL;
	r->hash ^= r->hash >> 29;
	return true;
}

#endif
