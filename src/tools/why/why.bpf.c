// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * sonde why: every nanosecond of each traced thread's window in one slot:
 * on CPU, runnable (in the run queue, or throttled by its cgroup's CPU
 * quota), or blocked by class (enum why_class). A thread is in exactly one
 * state at a time and every state change of a thread passes one of the
 * hooks below, so the slots of each thread sum to its window:
 *
 *   sched_switch out  ON_CPU   -> RUNNABLE (preempted, yielded) or BLOCKED
 *   sched_wakeup(_new)  BLOCKED -> RUNNABLE (the waker taken at sched_waking)
 *   sched_switch in   RUNNABLE -> ON_CPU
 *   sched_process_exit  the window ends
 *
 * A thread first seen at a hook was, until then (since the run began), in
 * the state that hook leaves: on CPU before its first switch-out, runnable
 * before its first switch-in, blocked before its first wake-up. The task
 * iterator (why_iter), run once everything is attached, gives every thread
 * that exists its state at the start, so a thread that never changes state
 * in the window (blocked throughout, or alone on a CPU) is counted too.
 *
 * Waits are classified at the switch-out in the thread's own context (at
 * the wake-up for one that began before the run): what the kernel says about
 * it then, its system call and the descriptor it waits on (file, pipe,
 * socket with its addresses), its flags (in_iowait, in_memstall), and where
 * it waits in the kernel when that is what names it. Records stay in the
 * kernel (no event per switch); user space reads them at the end.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "arch.h"
#include "taskfilter.h"
#include "hist.h"
#include "tcpretrans.h"
#include "stacks.h"
#include "why.h"
#define SONDE_STATS_MAX WT_MAX
#include "stats.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* What each system call number waits on (enum why_sys). */
const volatile __u8 sys_kind[WHY_NSYS] = {};
/* bpf_task_pt_regs (5.15); without it the registers are found at the top
 * of the task's kernel stack, THREAD_SIZE above its base. */
const volatile bool has_task_regs = true;
const volatile __u64 thread_size = 16384;
/* sched_switch passes the state prev blocked in (Linux 5.18). Read from the
 * task instead, it may be TASK_WAKING already: a wake-up on another CPU
 * that raced the switch-out overwrote it. */
const volatile bool has_prev_state = false;

/* This kernel skips tracing programs while a thread of PID 1 runs (`sonde
 * doctor`: sees_pid1): its threads' switches are not seen, so they are not
 * traced (and said so). */
const volatile bool skip_init = false;

/* Who released a lock: the waker's stack is taken at the wake-up of a lock
 * wait (see why_release_key). A wait shorter than release_sample_ns is
 * taken with probability (its length)/release_sample_ns and then weighs
 * release_sample_ns (as offcpu's --sample-below): each stack's expected
 * total is the true time, and the walks are bounded by the lock time over
 * release_sample_ns (100 a second per thread blocked on locks), however
 * many wake-ups there are: a walk with language frames costs 12-32 us
 * (a Python thread 20 frames deep). 0: no stacks. */
const volatile __u64 release_sample_ns = 10000000;
/* Stack walks of releasers per CPU per RELEASE_WINDOW_NS: beyond, a
 * release is counted without its stack (WT_UNWALKED), so that a host of
 * many threads woken often (thread pools waiting on condition variables)
 * costs a bounded share of each CPU: 100 walks a second (a walk costs 2-32
 * us: hot or cold caches, native or Python frames), about 0.3% at worst. */
const volatile __u32 release_walks = 10;
#define RELEASE_WINDOW_NS 100000000ULL
/* The waker's stacks: user (language frames included) and kernel. */
const volatile bool release_user = true;
const volatile bool release_kernel = true;

/* Set by user space before attaching: when the run's window begins. */
volatile __u64 t_start = 0;
/* Set by user space when the window ends, before it detaches (which may
 * take a while: each link waits for a grace period): from then on no hook
 * changes a record, so each holds its thread's state at the end. */
volatile __u64 t_end = 0;
/* why_iter: 0 at the start (gives each thread its state), 1 at the end
 * (takes each thread's user and system time). */
volatile __u32 iter_phase = 0;

/*
 * The traced threads' records. Where the kernel has BPF compare-and-exchange
 * (5.12+), in `slots`: at the thread id (hashed where pid_max is above the
 * slots' number: slot_home) masked by slot_mask, or, if another thread took
 * that slot first, in the first free one of the next WHY_PROBES - 1. User
 * space makes at least pid_max slots where that is at most 65,536, so that
 * every live thread has its own. Found with no map hashing (a hash lookup
 * costs ~50 ns here, and every switch looks up two threads, every wake-up
 * one); a slot's owner never changes until the run ends (an exited
 * thread's too: its id used again is told apart by the task's start time,
 * and not traced), so a free slot ends the search. On older kernels
 * (slot_mask 0) all in `threads`, by thread id. One map or the other, never
 * both: the verifier follows each map a record may come from as a path of
 * its own.
 */
const volatile __u32 slot_mask = 0;
/* Where pid_max is above the slots' number: a thread's first slot is its
 * id hashed (Fibonacci: the top bits of tid * 2^32/phi), so that runs of
 * consecutive ids (a pool's threads, the next ones made) spread over the
 * slots rather than pile up behind each other; 32 - log2(slots). 0: the
 * id itself (every id below pid_max has a slot of its own). */
const volatile __u32 slot_hash_shift = 0;
#define WHY_PROBES 8

/* A thread's first slot. */
static __always_inline __u32 slot_home(__u32 tid)
{
	return slot_hash_shift ? (tid * 0x9E3779B1u) >> (slot_hash_shift & 31) : tid;
}

/* Lines as why_thread lays them out: mmapable, the slots begin on a page. */
_Static_assert(sizeof(struct why_thread) % 64 == 0, "records in whole lines");
_Static_assert(__builtin_offsetof(struct why_thread, thr_at) == 64 &&
                       __builtin_offsetof(struct why_thread, pk) == 128 &&
                       __builtin_offsetof(struct why_thread, acc) == 192 &&
                       __builtin_offsetof(struct why_thread, start) == 320,
               "the hot lines of a record as laid out");
/* User space reads the id first, with acquire order, as it is published. */
_Static_assert(__builtin_offsetof(struct why_thread, tid) == 0, "the thread id first");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 65536); /* set by user space: slot_mask + 1 */
	__type(key, __u32);
	__type(value, struct why_thread);
} slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); /* set by user space */
	__type(key, __u32);
	__type(value, struct why_thread);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct why_wait_key);
	__type(value, struct why_wait);
} waits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct why_obj);
} objects SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64[WHY_KFRAMES]);
} kstacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct why_instead_key);
	__type(value, struct why_instead);
} instead SEC(".maps");

_Static_assert(WHY_RT_KINDS == KIND_MAX, "one slot per retransmission cause");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct rt_flow);
	__type(value, struct why_retrans);
} retrans SEC(".maps");

/* Room for a new thread's record and a kernel stack, off the BPF stack. */
struct why_scratch {
	struct why_thread t;
	__u64 frames[WHY_KFRAMES];
	struct why_obj o;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct why_scratch);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct why_release_key);
	__type(value, struct why_release);
} releases SEC(".maps");

/* A release's key, off the BPF stack (the walk's frames count against it). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct why_release_key);
} release_scratch SEC(".maps");

/* Per CPU: when its window of walks began, and the walks in it. */
struct why_budget {
	__u64 window;
	__u64 used;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct why_budget);
} release_budget SEC(".maps");

/* Referenced so that the skeleton mirrors the layouts. */
struct why_thread _why_thread = {};
struct why_wait_key _why_wait_key = {};
struct why_wait _why_wait = {};
struct why_obj _why_obj = {};
struct why_instead_key _why_instead_key = {};
struct why_instead _why_instead = {};
struct why_release_key _why_release_key = {};
struct why_release _why_release = {};

/* Task states (include/linux/sched.h). */
#define TASK_RUNNING_         0x0000
#define TASK_INTERRUPTIBLE_   0x0001
#define TASK_UNINTERRUPTIBLE_ 0x0002
#define TASK_DEAD_            0x0080
#define TASK_WAKING_          0x0200
#define TASK_NOLOAD_          0x0400
#define PF_KTHREAD_           0x00200000
#define PF_IO_WORKER_         0x00000010

/* File types (include/uapi/linux/stat.h). */
#define S_IFMT_   00170000
#define S_IFSOCK_ 0140000
#define S_IFREG_  0100000
#define S_IFBLK_  0060000
#define S_IFCHR_  0020000
#define S_IFIFO_  0010000

#define AF_UNIX_  1
#define AF_INET_  2
#define AF_INET6_ 10

struct task_struct___old {
	long state;
} __attribute__((preserve_access_index));

/*
 * Every task pointer here is typed (tp_btf arguments, the iterator's task,
 * and what is loaded from them), so fields are read by plain loads, which
 * the verifier guards, not by bpf_probe_read_kernel calls: a few ns each
 * instead of tens, on every context switch.
 */
static __always_inline unsigned int task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return t->__state;
	return ((struct task_struct___old *)t)->state;
}

/* The state `t` blocked in, read as `st` while a wake-up may have
 * overwritten it with TASK_WAKING (the wake-up waits for the switch-out to
 * finish before it makes the task runnable, so TASK_WAKING still means it
 * blocked). Then how is not known, and counted: a user thread's is taken
 * as uninterruptible (outside a system call it blocks in a fault, killable
 * at most; in one, the call decides, and the kernel stack is taken), a
 * kernel thread's as uninterruptible on I/O alone (else it waits for
 * work). */
static __always_inline unsigned int blocked_state(struct task_struct *t, unsigned int st)
{
	if (st != TASK_WAKING_)
		return st;
	stat_add(WT_STATE_WOKEN);
	if (!(t->flags & PF_KTHREAD_) || BPF_CORE_READ_BITFIELD(t, in_iowait))
		return TASK_UNINTERRUPTIBLE_;
	return TASK_INTERRUPTIBLE_;
}

/* The record of thread `tid`, or NULL. NULL too, counted, while another
 * CPU makes it (its first event and one of another hook at once). */
static __always_inline struct why_thread *thread_rec(__u32 tid)
{
	if (!slot_mask)
		return bpf_map_lookup_elem(&threads, &tid);
	if (!tid)
		return NULL;
	__u32 home = slot_home(tid);
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < WHY_PROBES; i++) {
		__u32 k = (home + i) & slot_mask;
		struct why_thread *r = bpf_map_lookup_elem(&slots, &k);
		if (!r)
			return NULL;
		if (r->tid == tid)
			return r;
		__u64 c = r->claim;
		if (!c)
			return NULL; /* a free slot: no record */
		if (c == tid) {
			stat_add(WT_RECORD_BUSY);
			return NULL;
		}
	}
	return NULL;
}

static __always_inline bool wanted(struct task_struct *t)
{
	__u32 tid = t->pid, tgid = t->tgid;
	if (!tid)
		return false; /* idle */
	if (skip_init && tgid == 1)
		return false; /* its hooks never run here (see skip_init) */
	if (!tf_pid_ok(tgid))
		return false;
	if (tf_n_tids && !IN_LIST(tf_tids, tf_n_tids, TF_MAX_TIDS, tid))
		return false;
	if (!cg_task_in(t))
		return false;
	if (tf_filter_comm) {
		char c[TF_COMM_LEN];
		bpf_probe_read_kernel_str(c, sizeof(c), t->comm);
		if (!tf_comm_matches(c))
			return false;
	}
	return true;
}

/*
 * The cumulative time the cfs_rq `p` (a task's, so its group and every
 * group above it) has been throttled, in its CPU's run-queue clock. From
 * 6.8 the kernel keeps it per cfs_rq (throttled_clock_self_time, plus the
 * throttle in progress); before, the PELT clock's stopped time
 * (throttled_clock_pelt_time), which runs as wall time on a CPU at full
 * capacity. 0 without CPU bandwidth control.
 */
static __always_inline __u64 thr_clock(struct cfs_rq *c)
{
	if (bpf_core_field_exists(c->throttled_clock_self_time)) {
		__u64 tot = c->throttled_clock_self_time, s = c->throttled_clock_self;
		if (s) {
			__u64 clk = c->rq->clock;
			if (clk > s)
				tot += clk - s;
		}
		return tot;
	}
	if (bpf_core_field_exists(c->throttled_clock_pelt_time)) {
		__u64 tot = c->throttled_clock_pelt_time;
		if (c->throttle_count) {
			__u64 s = c->throttled_clock_pelt, clk = c->rq->clock_pelt;
			if (clk > s)
				tot += clk - s;
		}
		return tot;
	}
	return 0;
}

/* The same, for a cfs_rq kept as a number (a task that moved to another
 * CPU while runnable): read by bpf_probe_read_kernel. */
static __always_inline __u64 thr_clock_at(__u64 p)
{
	struct cfs_rq *c = (struct cfs_rq *)p;
	if (!c)
		return 0;
	if (bpf_core_field_exists(c->throttled_clock_self_time)) {
		__u64 tot = BPF_CORE_READ(c, throttled_clock_self_time);
		__u64 s = BPF_CORE_READ(c, throttled_clock_self);
		if (s) {
			__u64 clk = BPF_CORE_READ(c, rq, clock);
			if (clk > s)
				tot += clk - s;
		}
		return tot;
	}
	if (bpf_core_field_exists(c->throttled_clock_pelt_time)) {
		__u64 tot = BPF_CORE_READ(c, throttled_clock_pelt_time);
		if (BPF_CORE_READ(c, throttle_count)) {
			__u64 s = BPF_CORE_READ(c, throttled_clock_pelt);
			__u64 clk = BPF_CORE_READ(c, rq, clock_pelt);
			if (clk > s)
				tot += clk - s;
		}
		return tot;
	}
	return 0;
}

/* A runnable period begins: where its throttled time will be read. */
static __always_inline void runnable_from(struct why_thread *r, struct task_struct *t, __u64 now)
{
	r->state = WS_RUNNABLE;
	r->since = now;
	r->thr_rq = 0;
	r->thr_at = 0;
	if (!bpf_core_field_exists(t->se.cfs_rq))
		return;
	/* The root group is never throttled: nothing to read for its tasks. */
	struct cfs_rq *c = t->se.cfs_rq;
	if (!c || !c->tg || !c->tg->parent)
		return;
	r->thr_rq = (__u64)c;
	r->thr_at = thr_clock(c);
}

/* Adds `ns` over `count` waits on the key `k` to `waits`. */
static __always_inline void wait_put(struct why_wait_key *k, __u64 ns, __u64 count,
                                     const char *wcomm)
{
	struct why_wait *w = bpf_map_lookup_elem(&waits, k);
	if (!w) {
		struct why_wait z = {};
		if (bpf_map_update_elem(&waits, k, &z, BPF_NOEXIST) &&
		    bpf_map_lookup_elem(&waits, k) == NULL) {
			stat_add(WT_WAITS_FULL);
			return;
		}
		w = bpf_map_lookup_elem(&waits, k);
		if (!w)
			return;
	}
	w->ns += ns;
	w->count += count;
	if (k->waker)
		__builtin_memcpy(w->waker_comm, wcomm, sizeof(w->waker_comm));
}

/*
 * A finished wait of `d` ns. A thread's waits on the same thing, woken by
 * the same, add up in its record (pk, p_ns, p_count: no hashing for the
 * loop of a worker on one socket or lock); they go to `waits` when a wait
 * on something else comes, and the user half adds what is still there.
 */
static __always_inline void wait_add(struct why_thread *r, __u32 tid, __u64 d)
{
	struct why_wait_key *p = &r->pk;
	if (r->p_count && p->obj == r->obj && p->kstack == r->kstack && p->waker == r->waker &&
	    p->sys == r->sys && p->cls == r->cls && p->wctx == r->wctx) {
		r->p_ns += d;
		r->p_count++;
		return;
	}
	if (r->p_count)
		wait_put(p, r->p_ns, r->p_count, r->p_wcomm);
	p->obj = r->obj;
	p->kstack = r->kstack;
	p->tid = tid;
	p->waker = r->waker;
	p->sys = r->sys;
	p->cls = r->cls;
	p->wctx = r->wctx;
	r->p_ns = d;
	r->p_count = 1;
	if (r->waker)
		__builtin_memcpy(r->p_wcomm, r->waker_comm, sizeof(r->p_wcomm));
}

/* Ends the thread's current state at `now`, into its slots. A wait that
 * ends here (woken, or the window's end for one still open) is also added
 * to `waits` by its object and waker. */
static __always_inline void close_state(struct why_thread *r, struct task_struct *t, __u32 tid,
                                        __u64 now)
{
	if (now < r->since)
		now = r->since; /* a clock read before the state began */
	__u64 d = now - r->since;
	if (r->state == WS_ON_CPU) {
		r->acc[WA_ON_CPU] += d;
	} else if (r->state == WS_RUNNABLE) {
		__u64 th = 0;
		if (r->thr_rq) {
			struct cfs_rq *cq = t->se.cfs_rq;
			__u64 c = (__u64)cq == r->thr_rq ? thr_clock(cq) : thr_clock_at(r->thr_rq);
			th = c > r->thr_at ? c - r->thr_at : 0;
			if (th > d)
				th = d;
		}
		r->acc[WA_THROTTLED] += th;
		r->acc[WA_RUNQUEUE] += d - th;
	} else if (r->state == WS_BLOCKED) {
		__u32 c = r->cls;
		if (c < WC_MAX)
			r->acc[WA_BLOCKED + c] += d;
		r->waits++;
		wait_add(r, tid, d);
	}
	r->since = now;
}

/* Without bpf_task_pt_regs: the registers at the top of the task's stack. */
static __always_inline struct pt_regs *regs_of(struct task_struct *t)
{
	void *stack = t->stack;
	if (!stack)
		return NULL;
	return (struct pt_regs *)(stack + thread_size - bpf_core_type_size(struct pt_regs));
}

/* The open file `fd` of `t`, or NULL. */
static __always_inline struct file *fd_file(struct task_struct *t, __u64 fd)
{
	struct fdtable *fdt = t->files->fdt;
	if (!fdt || fd >= fdt->max_fds)
		return NULL;
	/* The array as a number (a pointer to pointers loads as one): an
	 * index into a typed pointer is refused, so its slot is read by the
	 * helper. */
	__u64 fds = (__u64)fdt->fd;
	struct file *f = NULL;
	bpf_probe_read_kernel(&f, sizeof(f), (void *)(fds + (fd & 0xffffff) * sizeof(f)));
	return f;
}

/* Describes the object `id` (once per thread and object) in `objects`. */
static __always_inline void describe(struct why_thread *r, __u64 id, struct why_obj *o)
{
	if (!id || r->last_obj == id)
		return;
	r->last_obj = id;
	if (bpf_map_lookup_elem(&objects, &id))
		return;
	if (bpf_map_update_elem(&objects, &id, o, BPF_NOEXIST) &&
	    !bpf_map_lookup_elem(&objects, &id))
		stat_add(WT_OBJECTS_FULL);
}

/* The class of a wait on file `f`, descriptor `fd` (`send`: writing,
 * sending, connecting), its object id and description. */
static __always_inline __u8 file_class(struct why_thread *r, struct file *f, __u64 fd, bool send,
                                       bool connect, struct why_obj *o)
{
	if (!f)
		return WC_OTHER;
	/* The same wait as the thread's last on this descriptor (the same
	 * open file and inode, call kind): its class and object again, unread.
	 * The inode number too: a file closed and its structure reused for the
	 * next one opened at that descriptor (a shell's pipe, then the socket
	 * of the program it ran) would pass for it. */
	__u8 key = 1 + send + 2 * connect;
	struct inode *ino;
	__u64 i_ino;
	if (bpf_ksym_exists(bpf_rdonly_cast)) {
		/* Plain loads through a typed pointer (Linux 6.2+; a load that
		 * faults reads zero): no helper call on every blocking switch. */
		ino = bpf_core_cast(f, struct file)->f_inode;
		i_ino = ino->i_ino;
	} else {
		ino = BPF_CORE_READ(f, f_inode);
		i_ino = BPF_CORE_READ(ino, i_ino);
	}
	if ((__u64)f == r->c_file && fd == r->c_fd && key == r->c_key && i_ino == r->c_ino) {
		r->obj = r->c_obj;
		return r->c_cls;
	}
	__u16 mode = BPF_CORE_READ(ino, i_mode);
	__builtin_memset(o, 0, sizeof(*o));
	o->tgid = r->tgid;
	o->fd = fd;
	o->ino = i_ino;
	o->dev = BPF_CORE_READ(ino, i_sb, s_dev);
	/* The object's id: its inode (device and number), never a kernel
	 * address, which a freed socket or file leaves to the next one (its
	 * description, kept once, would then name the wrong peer). Two low
	 * bits stay free for the call kind. */
	__u64 id = ((o->dev * 0x9E3779B97F4A7C15ULL) ^ i_ino) << 2;
	if (!id)
		id = 4;
	__u8 cls = WC_OTHER;
	switch (mode & S_IFMT_) {
	case S_IFSOCK_: {
		struct socket *sock = BPF_CORE_READ(f, private_data);
		struct sock *sk = BPF_CORE_READ(sock, sk);
		__u16 fam = BPF_CORE_READ(sk, __sk_common.skc_family);
		o->kind = WO_SOCKET;
		o->family = fam;
		o->type = BPF_CORE_READ(sock, type);
		o->proto = BPF_CORE_READ(sk, sk_protocol);
		o->netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
		o->sport = BPF_CORE_READ(sk, __sk_common.skc_num);
		o->dport = __builtin_bswap16(BPF_CORE_READ(sk, __sk_common.skc_dport));
		if (fam == AF_INET_) {
			BPF_CORE_READ_INTO((__u32 *)o->saddr, sk, __sk_common.skc_rcv_saddr);
			BPF_CORE_READ_INTO((__u32 *)o->daddr, sk, __sk_common.skc_daddr);
		} else if (fam == AF_INET6_) {
			BPF_CORE_READ_INTO((struct in6_addr *)o->saddr, sk,
			                   __sk_common.skc_v6_rcv_saddr);
			BPF_CORE_READ_INTO((struct in6_addr *)o->daddr, sk,
			                   __sk_common.skc_v6_daddr);
		}
		if (fam == AF_UNIX_) {
			/* Its peer (a connected or accepted socket, a socketpair's
			 * other half): the holders of that socket are the other end. */
			struct sock *peer = BPF_CORE_READ((struct unix_sock *)sk, peer);
			if (peer)
				o->peer = BPF_CORE_READ(peer, sk_socket, file, f_inode, i_ino);
			cls = WC_PIPE;
		} else if (fam == AF_INET_ || fam == AF_INET6_)
			cls = WC_NETWORK;
		/* A listening socket: waiting for connections, for work (as
		 * accept on it is), whichever call waits on it. */
		if (BPF_CORE_READ(sk, __sk_common.skc_state) == TCP_LISTEN)
			cls = WC_POLL;
		break;
	}
	case S_IFIFO_:
		o->kind = WO_FIFO;
		cls = WC_PIPE;
		break;
	case S_IFBLK_:
		/* A block device read or written as a file: its requests are
		 * on that device, not on the one /dev is on. */
		o->rdev = BPF_CORE_READ(ino, i_rdev);
		o->kind = WO_FILE;
		cls = WC_DISK;
		break;
	case S_IFREG_:
		o->kind = WO_FILE;
		cls = WC_DISK;
		break;
	case S_IFCHR_:
		o->kind = WO_CHAR;
		break;
	default:
		/* eventfd, timerfd, epoll, io_uring...: files of one shared
		 * anonymous inode, told apart by process and descriptor. */
		o->kind = WO_ANON;
		id = ((((__u64)r->tgid << 24) ^ fd ^ id) * 0x9E3779B97F4A7C15ULL) << 2;
		if (!id)
			id = 4;
		break;
	}
	describe(r, id, o);
	/* Sending (or connecting) and receiving on one socket are two objects. */
	r->obj = id | (send ? 1 : 0) | (connect ? 2 : 0);
	r->c_file = (__u64)f;
	r->c_ino = i_ino;
	r->c_fd = fd;
	r->c_key = key;
	r->c_obj = r->obj;
	r->c_cls = cls;
	return cls;
}

/* The class of a wait on descriptor `fd` of `t`: see file_class. */
static __always_inline __u8 fd_class(struct why_thread *r, struct task_struct *t, __u64 fd,
                                     bool send, bool connect, struct why_obj *o)
{
	return file_class(r, fd_file(t, fd), fd, send, connect, o);
}

#define EPOLLIN_  0x001
#define EPOLLOUT_ 0x004

/* A wait in epoll_wait on set `epfd`. On a set of one descriptor it waits
 * on that one peer: the class and object of a read (or a write, for a set
 * that asks only to write) on it, when it is a socket or a pipe. Otherwise
 * (more descriptors, or one that is no peer: a timer, an eventfd) it waits
 * for work, on the set. A set of one is a tree of one node: its root has no
 * children. */
static __always_inline __u8 epoll_class(struct why_thread *r, struct task_struct *t, __u64 epfd,
                                        struct why_obj *o)
{
	struct file *f = fd_file(t, epfd);
	if (!f)
		return WC_POLL;
	struct eventpoll *ep = BPF_CORE_READ(f, private_data);
	struct rb_node *root = BPF_CORE_READ(ep, rbr.rb_root.rb_node);
	if (root && !BPF_CORE_READ(root, rb_left) && !BPF_CORE_READ(root, rb_right)) {
		struct epitem *epi = (void *)root - bpf_core_field_offset(struct epitem, rbn);
		struct file *pf = BPF_CORE_READ(epi, ffd.file);
		__u64 pfd = (__u32)BPF_CORE_READ(epi, ffd.fd);
		__u32 ev = BPF_CORE_READ(epi, event.events);
		__u8 cls = file_class(r, pf, pfd, (ev & EPOLLOUT_) && !(ev & EPOLLIN_), false, o);
		if (cls == WC_NETWORK || cls == WC_PIPE)
			return cls;
	}
	file_class(r, f, epfd, false, false, o);
	return WC_POLL;
}

#define POLLIN_  0x001
#define POLLOUT_ 0x004

/* A wait in poll or ppoll on `n` descriptors at user address `fds`: on one
 * socket or pipe, a wait on that peer (read from the thread's own memory,
 * so only while it is the current task, at its switch-out); else for work. */
static __always_inline __u8 poll_class(struct why_thread *r, struct task_struct *t, __u64 fds,
                                       __u64 n, bool cur, struct why_obj *o)
{
	if (!n)
		return WC_SLEEP; /* nothing to watch: a sleep */
	if (n != 1 || !cur)
		return WC_POLL;
	struct {
		__s32 fd;
		__s16 events;
		__s16 revents;
	} p;
	if (bpf_probe_read_user(&p, sizeof(p), (void *)fds) || p.fd < 0)
		return WC_POLL;
	__u8 cls = fd_class(r, t, (__u32)p.fd, (p.events & POLLOUT_) && !(p.events & POLLIN_),
	                    false, o);
	return cls == WC_NETWORK || cls == WC_PIPE ? cls : WC_POLL;
}

/*
 * select and pselect6 on one descriptor. The caller's descriptor sets are
 * read at the call's entry (its own memory, while it runs; at most
 * FD_SETSIZE, 1024, descriptors), and the one descriptor found is kept in
 * the thread's record until its switch-out asks, matched by the call's
 * first two arguments. Scanning the sets in the switch-out program made it too large
 * for the verifier. A call that began before sonde started was not seen:
 * it counts as waiting for work.
 */
#define SEL_MAX_FDS 1024
#define SEL_MANY    (-2)

/* The index of the one bit set in `w`: a de Bruijn sequence's table, with
 * no branch (six halving tests made the verifier's paths explode). */
static const __u8 debruijn64[64] = {
        0,  1,  2,  53, 3,  7,  54, 27, 4,  38, 41, 8,  34, 55, 48, 28, 62, 5,  39, 46, 44, 42,
        22, 9,  24, 35, 59, 56, 49, 18, 29, 11, 63, 52, 6,  26, 37, 40, 33, 47, 61, 45, 43, 21,
        23, 58, 17, 10, 51, 25, 36, 32, 60, 20, 57, 16, 50, 31, 19, 15, 30, 14, 13, 12,
};

static __always_inline __u32 bit_of(__u64 w)
{
	return debruijn64[(w * 0x022fdd63cc95386dULL) >> 58];
}

/* The one descriptor of the `n`-bit set at user address `set` and those
 * `found` so far: -1 none, SEL_MANY more than one (or unreadable). A global
 * function, verified once on its own: inlined three times, its loops'
 * paths multiplied past the verifier's limit. */
__noinline int why_one_fd(__u64 set, __u64 n, int found)
{
	if (!set || found == SEL_MANY)
		return found;
	__u64 w[SEL_MAX_FDS / 64];
	__builtin_memset(w, 0, sizeof(w));
	__u64 words = (n + 63) / 64;
	/* Bounded after a compiler barrier, which keeps clang from folding
	 * the bound into arithmetic the verifier cannot follow. */
	asm volatile("" : "+r"(words));
	if (words > SEL_MAX_FDS / 64)
		words = SEL_MAX_FDS / 64;
	if (bpf_probe_read_user(w, words * 8, (void *)set))
		return SEL_MANY;
	/* Only the words the call covers were read (the rest are 0), and
	 * bits past `n` in its last word are taken as set: the sets are made
	 * with FD_ZERO, and testing `n` in the loop multiplied its paths past
	 * the verifier's limit. */
	for (int i = 0; i < SEL_MAX_FDS / 64; i++) {
		__u64 x = w[i];
		if (!x)
			continue;
		if (x & (x - 1))
			return SEL_MANY;
		int fd = i * 64 + bit_of(x);
		if (found >= 0 && fd != found)
			return SEL_MANY;
		found = fd;
	}
	return found;
}

static __always_inline int on_select(struct trace_event_raw_sys_enter *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct why_thread *r = thread_rec(tid);
	if (t_end || !r)
		return 0;
	__u64 n = ctx->args[0];
	int fd = SEL_MANY, in = SEL_MANY, out = SEL_MANY;
	if (n && n <= SEL_MAX_FDS) {
		in = why_one_fd(ctx->args[1], n, -1);
		out = why_one_fd(ctx->args[2], n, in);
		fd = why_one_fd(ctx->args[3], n, out);
	}
	r->sel_nfds = n;
	r->sel_inp = ctx->args[1];
	r->sel_fd = fd;
	r->sel_write = in == -1 && out >= 0;
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_select")
int why_select(struct trace_event_raw_sys_enter *ctx)
{
	return on_select(ctx);
}

SEC("tracepoint/syscalls/sys_enter_pselect6")
int why_pselect6(struct trace_event_raw_sys_enter *ctx)
{
	return on_select(ctx);
}

/* A wait in select or pselect6 (`nfds`, the read set at `inp`): on one
 * socket or pipe, a wait on that peer; else for work. */
static __always_inline __u8 select_class(struct why_thread *r, struct task_struct *t, __u64 nfds,
                                         __u64 inp, struct why_obj *o)
{
	if (r->sel_nfds != nfds || r->sel_inp != inp || r->sel_fd < 0)
		return WC_POLL;
	__u8 cls = fd_class(r, t, (__u32)r->sel_fd, r->sel_write, false, o);
	return cls == WC_NETWORK || cls == WC_PIPE ? cls : WC_POLL;
}

/* A cheap hash of a kernel stack, never 0. */
static __always_inline __u64 frames_hash(__u64 *f, long n)
{
	__u64 h = 1469598103934665603ULL;
	for (int i = 0; i < WHY_KFRAMES; i++) {
		if (i >= n)
			break;
		h = (h ^ f[i]) * 1099511628211ULL;
	}
	return h | 1;
}

/* Keeps the kernel stack of `t`'s wait (`cur`: `t` is the current task,
 * switching out) in `kstacks`, as r->kstack. */
static __always_inline void take_kstack(void *ctx, struct why_thread *r, struct task_struct *t,
                                        bool cur, __u64 *f)
{
	long n = cur ? bpf_get_stack(ctx, f, WHY_KFRAMES * sizeof(__u64), 0)
	             : bpf_get_task_stack(t, f, WHY_KFRAMES * sizeof(__u64), 0);
	if (n <= 0) {
		stat_add(WT_KSTACK_ERRORS);
		return;
	}
	n /= sizeof(__u64);
	for (int i = 0; i < WHY_KFRAMES; i++)
		if (i >= n)
			f[i] = 0;
	__u64 h = frames_hash(f, n);
	r->kstack = h;
	if (!bpf_map_lookup_elem(&kstacks, &h) &&
	    bpf_map_update_elem(&kstacks, &h, f, BPF_NOEXIST) && !bpf_map_lookup_elem(&kstacks, &h))
		stat_add(WT_KSTACKS_FULL);
}

/*
 * What the blocked thread `t` waits for, into r->cls, obj, sys, kstack.
 * `cur`: `t` is the current task (at its switch-out), whose kernel stack
 * bpf_get_stack takes; otherwise bpf_get_task_stack.
 */
static __always_inline void classify(void *ctx, struct why_thread *r, struct task_struct *t,
                                     bool cur, unsigned int st)
{
	__u32 zero = 0;
	struct why_scratch *sc = bpf_map_lookup_elem(&scratch, &zero);
	if (!sc)
		return;
	r->obj = 0;
	r->sys = 0;
	r->kstack = 0;
	r->waker = 0;
	r->wctx = WW_NONE;
	bool iowait = BPF_CORE_READ_BITFIELD(t, in_iowait);
	bool memstall = false;
	if (bpf_core_field_exists(t->in_memstall))
		memstall = BPF_CORE_READ_BITFIELD(t, in_memstall);
	bool in_sys = false;
	long nr = -1;
	__u64 a0 = 0, a1 = 0;
#if defined(__TARGET_ARCH_x86)
	__u64 ax = 0;
#endif
	/* The system call and its first two arguments: by plain loads from
	 * bpf_task_pt_regs (typed), else read where the kernel keeps them. */
#if defined(__TARGET_ARCH_x86)
#define WHY_REGS(READ)                                                                             \
	(nr = READ(regs, orig_ax), ax = READ(regs, ax), a0 = READ(regs, di), a1 = READ(regs, si))
#else
#define WHY_REGS(READ)                                                                             \
	(nr = (int)READ(regs, syscallno), a0 = READ(regs, orig_x0), a1 = READ(regs, regs[1]))
#endif
#define WHY_LOAD(p, f) ((p)->f)
	if (has_task_regs) {
		struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
		WHY_REGS(WHY_LOAD);
	} else {
		struct pt_regs *regs = regs_of(t);
		if (regs)
			WHY_REGS(BPF_CORE_READ);
		else
			stat_add(WT_REGS_UNREAD);
	}
#if defined(__TARGET_ARCH_x86)
	/* The system call entry stores -ENOSYS in ax; an exception (a page
	 * fault) keeps the user's ax, and its error code in orig_ax. */
	in_sys = nr >= 0 && (long)ax == -38;
#else
	/* NO_SYSCALL (-1) for an exception. */
	in_sys = nr >= 0;
#endif
	__u8 kind = WK_NONE;
	if (in_sys && nr < WHY_NSYS) {
		/* Masked after a compiler barrier: clang drops a mask it can
		 * prove idle, and the verifier then sees no bound (arm64). */
		__u32 idx = (__u32)nr;
		asm volatile("" : "+r"(idx));
		kind = sys_kind[idx & (WHY_NSYS - 1)];
		r->sys = nr + 1;
	}
	bool dstate = st & TASK_UNINTERRUPTIBLE_;
	r->dstate = dstate;
	__u8 cls = WC_OTHER;
	if (memstall) {
		cls = WC_MEMORY;
	} else if (t->flags & PF_KTHREAD_) {
		/* A kernel thread: waiting for work (named by where) unless on
		 * I/O, or uninterruptible in a way that counts as load. */
		cls = iowait ? WC_DISK : (dstate && !(st & TASK_NOLOAD_)) ? WC_OTHER : WC_POLL;
		if (cls != WC_DISK)
			take_kstack(ctx, r, t, cur, sc->frames);
		r->cls = cls;
		return;
	} else {
		switch (kind) {
		case WK_FD_READ:
		case WK_FD_WRITE:
		case WK_CONNECT:
			cls = fd_class(r, t, a0, kind != WK_FD_READ, kind == WK_CONNECT, &sc->o);
			break;
		case WK_ACCEPT:
			fd_class(r, t, a0, false, false, &sc->o);
			cls = WC_POLL;
			break;
		case WK_FSYNC:
			fd_class(r, t, a0, true, false, &sc->o);
			cls = WC_DISK;
			break;
		case WK_SLEEP:
			cls = WC_SLEEP;
			break;
		case WK_POLL:
			cls = poll_class(r, t, a0, a1, cur, &sc->o);
			break;
		case WK_SELECT:
			cls = a0 ? select_class(r, t, a0, a1, &sc->o) : WC_SLEEP;
			break;
		case WK_EPOLL:
			cls = epoll_class(r, t, a0, &sc->o);
			break;
		case WK_FUTEX:
			cls = WC_LOCK;
			r->obj = a0;
			break;
		case WK_IO_URING:
			fd_class(r, t, a0, false, false, &sc->o);
			cls = WC_IO_URING;
			break;
		case WK_IPC:
			cls = WC_PIPE;
			break;
		default:
			/* Outside any system call, a thread blocks mostly in a
			 * fault (reading its page from a file or swap, or waiting
			 * for memory): memory, whether or not on I/O; its kernel
			 * stack shows which (the user half counts one with no
			 * fault or memory frame but an I/O wait as disk: work at a
			 * system call's exit). An io_uring worker has no user
			 * registers: not a fault. */
			if (!in_sys && dstate && !(t->flags & PF_IO_WORKER_))
				cls = WC_MEMORY;
			else if (iowait)
				cls = WC_DISK;
			break;
		}
	}
	r->cls = cls;
	/* Named by where it waits: an unknown wait, a wait for memory (a
	 * fault's read, swap-in, reclaim or compaction, told apart by the user
	 * half), and an uninterruptible one not on I/O (a kernel mutex or
	 * rwsem the user half finds). */
	if (cls == WC_OTHER || cls == WC_MEMORY || (dstate && !iowait && !memstall))
		take_kstack(ctx, r, t, cur, sc->frames);
}

static __always_inline struct why_thread *new_thread(struct task_struct *t, __u32 tid, __u8 state,
                                                     __u64 since, __u64 start)
{
	__u32 zero = 0;
	struct why_scratch *sc = bpf_map_lookup_elem(&scratch, &zero);
	if (!sc)
		return NULL;
	struct why_thread *n = &sc->t;
	__builtin_memset(n, 0, sizeof(*n));
	n->claim = tid;
	n->state = state;
	n->since = since;
	n->start = start;
	n->tgid = BPF_CORE_READ(t, tgid);
	n->task_start = BPF_CORE_READ(t, start_time);
	n->utime0 = BPF_CORE_READ(t, utime);
	n->stime0 = BPF_CORE_READ(t, stime);
	BPF_CORE_READ_STR_INTO(&n->comm, t, comm);
	if (slot_mask) {
		__u32 home = slot_home(tid);
#pragma clang loop unroll(disable)
		for (__u32 i = 0; i < WHY_PROBES; i++) {
			__u32 k = (home + i) & slot_mask;
			struct why_thread *r = bpf_map_lookup_elem(&slots, &k);
			if (!r || !tid)
				return NULL;
			__u64 c = __sync_val_compare_and_swap(&r->claim, 0, (__u64)tid);
			if (c == tid) { /* made meanwhile, or being made on another CPU */
				if (r->tid == tid)
					return r;
				stat_add(WT_RECORD_BUSY);
				return NULL;
			}
			if (c)
				continue; /* another thread's */
			/* Its slot: filled, then its id set by a fully ordered
			 * atomic, so that a hook on another CPU that finds the id
			 * finds the record whole (on x86; an arm64 reader's loads
			 * have no acquire order, so there a hook racing with the
			 * record's making may see part of it, once). Its old
			 * value (0) is used: the fetching form is the one arm64's
			 * JIT orders fully. */
			__builtin_memcpy(r, n, sizeof(*n));
			if (__sync_fetch_and_add(&r->tid, (__u64)tid))
				stat_add(WT_RECORD_BUSY);
			return r;
		}
		stat_add(WT_THREADS_FULL);
		return NULL;
	}
	n->tid = tid;
	if (bpf_map_update_elem(&threads, &tid, n, BPF_NOEXIST)) {
		struct why_thread *r = bpf_map_lookup_elem(&threads, &tid);
		if (!r)
			stat_add(WT_THREADS_FULL);
		return r;
	}
	return bpf_map_lookup_elem(&threads, &tid);
}

/* The record of `t`, made if `t` is one to trace and has none: `before` is
 * the state it must have been in since the run began for this hook to see
 * it now. NULL for a thread not traced. */
static __always_inline struct why_thread *thread_of(struct task_struct *t, __u32 tid, __u8 before)
{
	/* -p: a task of another process passed over first, by comparisons
	 * with a short list (its record's slot not read), else by one lookup
	 * without slots (with them, its free slot says so first). */
	if ((tf_n_pids || (!slot_mask && tf_filter_pids)) && !tf_pid_ok(t->tgid))
		return NULL;
	struct why_thread *r = thread_rec(tid);
	if (r && r->state == WS_GONE) {
		/* Its last switch after its exit; or its id used again, by a
		 * thread started since, which is not traced (counted). */
		if (r->task_start != t->start_time)
			stat_add(WT_TID_REUSED);
		return NULL;
	}
	if (r)
		return r;
	if (!wanted(t))
		return NULL;
	return new_thread(t, tid, before, t_start, t_start);
}

/*
 * What this CPU runs besides its current task: a hardware interrupt's
 * handler or a timer's callback (hard), or a softirq (soft: its number + 1),
 * from the irq and timer tracepoints. A wake-up there is not the current
 * task's doing (hard), or done by softirq work on its time (soft).
 */
/* A thread's time on a CPU, in that run queue's clock (see note_slice). */
struct why_slice {
	__u64 start;
	__u64 end;
	__u64 cg;
	__u32 tid;
	__u32 tgid;
	char comm[16];
};

/* Enough for a wait behind many short wake-ups: a wait that spans more
 * slices on its CPU is seen in part (ran_instead sums to less). */
#define WHY_SLICES 64

struct why_cpu {
	__u32 hard;
	__u32 soft;
	__u32 timer;
	__u32 slot;   /* the next slice's place in `ring` (mod WHY_SLICES) */
	__s64 off;    /* bpf_ktime_get_ns() - the scheduler's clock (see sched_ns) */
	__u64 off_at; /* when `off` was last lowered */
	__u64 clk_at; /* the scheduler's clock when `off` was last checked (sched_now) */
	__u64 tg;     /* the task group last resolved to its cgroup (note_slice) */
	__u64 tg_cg;  /* its cgroup */
	__u64 tg_at;  /* the scheduler's clock then */
	struct why_slice ring[WHY_SLICES]; /* the CPU's last threads, newest at slot - 1 */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct why_cpu);
} cpu_ctx SEC(".maps");

static __always_inline struct why_cpu *cpu_state(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&cpu_ctx, &zero);
}

/*
 * The scheduler's own moment of a state change, as bpf_ktime_get_ns() time.
 * The kernel counts a switch (schedstat, the run delay, CPU time) at its
 * run-queue clock, read as __schedule or a wake-up begins (`clk`); the
 * tracepoint runs later (the pick of the next task, ~1-2 us on a small VM,
 * every switch). That clock is sched_clock, which BPF cannot read, but it
 * runs at the rate of bpf_ktime_get_ns() with a fixed offset, of either
 * sign (on one 6.18 VM sched_clock ran 0.75 ms ahead): the least
 * (now - clk) seen is that offset plus the shortest delay from a clock
 * update to a hook. The estimate may rise by 20 ppm of the time since it
 * was last lowered, so a slow drift between the two clocks is followed.
 */
static __always_inline __u64 sched_ns(struct why_cpu *c, __u64 clk, __u64 now)
{
	if (!c || !clk)
		return now;
	__s64 raw = (__s64)(now - clk);
	if (!c->off_at || raw <= c->off + (__s64)((now - c->off_at) / 50000)) {
		c->off = raw;
		c->off_at = now;
	}
	__u64 t = clk + (__u64)c->off;
	return t < now ? t : now;
}

/* How long a value kept per CPU serves before it is read again (the clock
 * offset, a task group's cgroup), in the scheduler's clock. */
#define WHY_RECHECK_NS 1000000ULL

/* Whether a value kept per CPU at scheduler clock `at` still serves at
 * `clk` (another CPU's run-queue clock may be a little behind). */
static __always_inline bool still_fresh(__u64 at, __u64 clk)
{
	return (clk >= at ? clk - at : at - clk) < WHY_RECHECK_NS;
}

/*
 * The scheduler's moment of a state change at run-queue clock `clk`, as
 * sched_ns gives it, with bpf_ktime_get_ns() read at most once per
 * WHY_RECHECK_NS of that clock per CPU: on a VM the read costs ~55 ns
 * (the pvclock), twice per switch its largest single cost, and the offset
 * it checks moves by parts per million. Every run-queue clock read at a
 * hook was just updated (at __schedule, or by the wake-up on the task's
 * queue), so a clock that far from the last check is one to check against.
 */
static __always_inline __u64 sched_now(struct why_cpu *c, __u64 clk)
{
	if (c && clk && c->off_at && still_fresh(c->clk_at, clk))
		return clk + (__u64)c->off;
	if (!c || !clk)
		return bpf_ktime_get_ns();
	__s64 before = c->off;
	__u64 had = c->off_at;
	c->clk_at = clk;
	__u64 t = sched_ns(c, clk, bpf_ktime_get_ns());
	/* Raised by more than 1 us (a hook late after a quiet spell, whose
	 * allowance had grown): checked again at the next hook, which lowers
	 * it back if it was the hook that was late, before it serves. */
	if (had && c->off > before + 1000)
		c->clk_at = 0;
	return t;
}

struct rq___taken {
	u64 prev_irq_time;
	u64 prev_steal_time_rq;
} __attribute__((preserve_access_index));

/* The steal and irq time (as the scheduler's clock excludes them from a
 * task's CPU time) of `t`'s run queue as of its last clock update. */
static __always_inline void rq_taken(struct task_struct *t, __u64 *steal, __u64 *irq)
{
	*steal = 0;
	*irq = 0;
	if (!bpf_core_field_exists(t->se.cfs_rq))
		return;
	struct rq___taken *rq = (void *)t->se.cfs_rq->rq;
	if (bpf_core_field_exists(rq->prev_steal_time_rq))
		*steal = rq->prev_steal_time_rq;
	if (bpf_core_field_exists(rq->prev_irq_time))
		*irq = rq->prev_irq_time;
}

/*
 * How long before its run queue's clock the kernel stopped charging `t` CPU
 * time: its se.exec_start is the task clock of its last runtime update (at
 * a block or a preemption, as __schedule began); a clock update since then
 * (an idle CPU balancing before it picks the next task) is not its time.
 * 0 where it is not known or not plausible (over 1 ms).
 */
static __always_inline __u64 exec_gap(struct task_struct *t)
{
	if (!bpf_core_field_exists(t->se.cfs_rq))
		return 0;
	__u64 ct = t->se.cfs_rq->rq->clock_task, xs = t->se.exec_start;
	if (!xs || xs > ct || ct - xs > 1000000)
		return 0;
	return ct - xs;
}

/* The run-queue clock of `t`'s CPU (0 where there is none to read). */
static __always_inline __u64 rq_clock_of(struct task_struct *t)
{
	if (!bpf_core_field_exists(t->se.cfs_rq))
		return 0;
	return t->se.cfs_rq->rq->clock;
}

/*
 * A time of a task's scheduler statistics (sched_info: its last switch-in or
 * enqueue, in its run queue's clock) as bpf_ktime_get_ns() time, given
 * `now` on the CPU whose run queue the task is on; 0 where it cannot be placed.
 * For state changes no hook saw: a kernel may skip tracing programs in some
 * contexts (`sonde doctor`: sees_pid1), and then the switch-in or wake-up
 * is missing, but the task's own statistics still say when it happened.
 */
static __always_inline __u64 sched_time(struct why_cpu *c, __u64 when, __u64 now)
{
	if (!when || !c || !c->off_at)
		return 0;
	__u64 at = when + (__u64)c->off;
	return at <= now ? at : 0;
}

struct task_struct___grp {
	struct task_group *sched_task_group;
} __attribute__((preserve_access_index));

/* The CPU cgroup (its kernfs id) of task group `tg`, 0 where there is none. */
static __always_inline __u64 cpu_cgroup(struct task_group *tg)
{
	if (!tg)
		return 0;
	struct cgroup *cg = tg->css.cgroup;
	if (!cg) /* an autogroup (a session's group, not a cgroup): its parent's */
		cg = tg->parent->css.cgroup;
	return cg ? cg->kn->id : 0;
}

/*
 * Every switch: the thread leaving the CPU ran from its switch-in (its own
 * statistics, sched_info.last_arrival) to `clk`, both in the run queue's
 * clock; kept in the CPU's ring of its last WHY_SLICES threads, to say what
 * ran while a traced thread waited there (ran_instead).
 */
static __always_inline void note_slice(struct why_cpu *c, struct task_struct *prev, __u32 ptid,
                                       __u64 clk)
{
	__u64 in = prev->sched_info.last_arrival;
	if (!c || !ptid || !in || in >= clk)
		return;
	struct why_slice *s = &c->ring[c->slot & (WHY_SLICES - 1)];
	c->slot++;
	s->start = in;
	s->end = clk;
	s->tid = ptid;
	s->tgid = prev->tgid;
	/* The cgroup of the task's group, as resolved last on this CPU when
	 * the group is the same (four dependent loads, cold on a CPU that ran
	 * other work between switches), looked up again each millisecond: a
	 * group freed and another made at its address stays named wrong for
	 * no longer. */
	struct task_struct___grp *g = (void *)prev;
	struct task_group *tg =
	        bpf_core_field_exists(g->sched_task_group) ? g->sched_task_group : NULL;
	if (tg && (__u64)tg == c->tg && clk >= c->tg_at && still_fresh(c->tg_at, clk)) {
		s->cg = c->tg_cg;
	} else {
		s->cg = cpu_cgroup(tg);
		c->tg = (__u64)tg;
		c->tg_cg = s->cg;
		c->tg_at = clk;
	}
	__builtin_memcpy(s->comm, prev->comm, sizeof(s->comm));
}

/* Adds `ns` that thread `k->rtid` (named `comm`) ran to `instead`. */
static __always_inline void instead_put(struct why_instead_key *k, __u64 ns, const char *comm)
{
	struct why_instead *v = bpf_map_lookup_elem(&instead, k);
	if (v) {
		__sync_fetch_and_add(&v->ns, ns);
		return;
	}
	struct why_instead nv = {.ns = ns};
	__builtin_memcpy(nv.comm, comm, sizeof(nv.comm));
	if (bpf_map_update_elem(&instead, k, &nv, BPF_NOEXIST)) {
		/* Lost a race with another CPU: its entry is taken. */
		v = bpf_map_lookup_elem(&instead, k);
		if (v)
			__sync_fetch_and_add(&v->ns, ns);
		else
			stat_add(WT_INSTEAD_FULL);
	}
}

/*
 * Traced thread `r` (`tid`) switched in after waiting runnable since `since`
 * (BPF time): what ran on this CPU meanwhile, from the ring, newest first,
 * while the slices still overlap the wait. A wait spent partly on another
 * CPU (it migrated) or longer than the ring reaches is seen only in part.
 * Time of the same thread as the last one that ran instead adds up in the
 * record (i_key, i_ns: no hashing for two threads that take turns on a
 * CPU); it goes to `instead` when another thread comes, and the user half
 * adds what is still there.
 */
static __always_inline void ran_instead(struct why_cpu *c, struct why_thread *r, __u32 tid,
                                        __u64 since, __u64 clk)
{
	if (!c || !c->off_at || (c->off > 0 && since < (__u64)c->off))
		return;
	__u64 w0 = since - (__u64)c->off;
#pragma clang loop unroll(disable)
	for (int i = 1; i <= WHY_SLICES; i++) {
		struct why_slice *s = &c->ring[(c->slot - i) & (WHY_SLICES - 1)];
		if (s->end <= w0 || !s->tid)
			break;
		__u64 a = s->start > w0 ? s->start : w0, b = s->end < clk ? s->end : clk;
		if (b <= a || s->tid == tid)
			continue;
		struct why_instead_key *k = &r->i_key;
		if (k->tid == tid && k->rtid == s->tid && k->rtgid == s->tgid && k->cg == s->cg) {
			r->i_ns += b - a;
			continue;
		}
		if (k->tid)
			instead_put(k, r->i_ns, r->i_comm);
		k->cg = s->cg;
		k->tid = tid;
		k->rtid = s->tid;
		k->rtgid = s->tgid;
		k->pad = 0;
		r->i_ns = b - a;
		__builtin_memcpy(r->i_comm, s->comm, sizeof(r->i_comm));
	}
}

SEC("tp_btf/sched_switch")
int BPF_PROG(why_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	if (t_end)
		return 0;
	stat_add(WT_SWITCHES);
	__u32 ptid = prev->pid, ntid = next->pid;
	struct why_cpu *cpu = cpu_state();
	__u64 clk = rq_clock_of(prev);
	note_slice(cpu, prev, ptid, clk);
	struct why_thread *r = ptid ? thread_of(prev, ptid, WS_ON_CPU) : NULL;
	struct why_thread *n = ntid ? thread_of(next, ntid, WS_RUNNABLE) : NULL;
	/* The switch as the kernel counts it (see sched_ns), read only for a
	 * traced thread. */
	__u64 now = 0;
	if (r) {
		now = sched_now(cpu, clk);
		/* Whether it blocked, from its state now (a wake-up leaves it
		 * TASK_WAKING, never running, until the switch is done). */
		unsigned int st = task_state(prev);
		if (r->state != WS_ON_CPU) {
			/* Its switch-in was not seen: when it was, from its own
			 * statistics (the wait, if one, ends there too). */
			__u64 in = sched_time(cpu, prev->sched_info.last_arrival, now);
			if (in > r->since && in <= now) {
				close_state(r, prev, ptid, in);
				r->state = WS_ON_CPU;
			}
			stat_add(WT_UNSEEN_SWITCHES);
		}
		/* Blocking, its time on CPU ends where the kernel's count of it
		 * did (at its dequeue, as __schedule began). Preempted, the
		 * kernel's count may end later than its se.exec_start says (seen:
		 * a spinner's 63 ms short of schedstat over 4 s): the switch. */
		__u64 out = now;
		if (!preempt && st != TASK_RUNNING_ && !(st & TASK_DEAD_))
			out = now - exec_gap(prev);
		if (r->state == WS_ON_CPU && r->steal0 | r->irq0 &&
		    r->taken_cpu == bpf_get_smp_processor_id()) {
			/* Counters of this CPU since its switch-in here (one not
			 * seen elsewhere leaves another CPU's in steal0), at most
			 * the time on CPU. */
			__u64 steal, irq, d = out > r->since ? out - r->since : 0;
			rq_taken(prev, &steal, &irq);
			steal = steal > r->steal0 ? steal - r->steal0 : 0;
			irq = irq > r->irq0 ? irq - r->irq0 : 0;
			r->on_steal += steal < d ? steal : d;
			r->on_irq += irq < d ? irq : d;
		}
		close_state(r, prev, ptid, out);
		if (st & TASK_DEAD_) {
			/* Its last switch: the window ended at its exit. */
		} else if (preempt || st == TASK_RUNNING_) {
			runnable_from(r, prev, r->since);
		} else {
			r->state = WS_BLOCKED;
			/* How: the state __schedule read, where the tracepoint
			 * passes it. */
			if (has_prev_state)
				st = (unsigned int)ctx[3];
			classify(ctx, r, prev, true, blocked_state(prev, st));
		}
	}
	r = n;
	if (r) {
		if (!now)
			now = sched_now(cpu, clk);
		if (r->state == WS_BLOCKED) {
			/* Its wake-up was not seen: when it was queued, from its
			 * own statistics; else blocked until now. */
			__u64 q = sched_time(cpu, next->sched_info.last_queued, now);
			if (q > r->since && q <= now) {
				close_state(r, next, ntid, q);
				runnable_from(r, next, r->since);
			}
			stat_add(WT_UNSEEN_WAKEUPS);
		}
		if (r->state == WS_RUNNABLE)
			ran_instead(cpu, r, ntid, r->since, clk);
		close_state(r, next, ntid, now);
		r->state = WS_ON_CPU;
		rq_taken(next, &r->steal0, &r->irq0);
		r->taken_cpu = bpf_get_smp_processor_id();
	}
	return 0;
}

SEC("tp_btf/irq_handler_entry")
int BPF_PROG(why_irq_entry)
{
	struct why_cpu *c = cpu_state();
	if (c)
		c->hard++;
	return 0;
}

SEC("tp_btf/irq_handler_exit")
int BPF_PROG(why_irq_exit)
{
	struct why_cpu *c = cpu_state();
	if (c && c->hard)
		c->hard--;
	return 0;
}

SEC("tp_btf/hrtimer_expire_entry")
int BPF_PROG(why_timer_entry)
{
	struct why_cpu *c = cpu_state();
	if (c)
		c->timer++;
	return 0;
}

SEC("tp_btf/hrtimer_expire_exit")
int BPF_PROG(why_timer_exit)
{
	struct why_cpu *c = cpu_state();
	if (c && c->timer)
		c->timer--;
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(why_softirq_entry, unsigned int vec)
{
	struct why_cpu *c = cpu_state();
	if (c)
		c->soft = vec + 1;
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(why_softirq_exit)
{
	struct why_cpu *c = cpu_state();
	if (c)
		c->soft = 0;
	return 0;
}

/* How the wake-up now is done (enum why_wake). */
static __always_inline __u8 wake_context(void)
{
	struct why_cpu *c = cpu_state();
	if (!c)
		return WW_TASK;
	if (c->timer)
		return WW_TIMER;
	if (c->hard)
		return WW_HARDIRQ;
	if (c->soft)
		return WW_SOFTIRQ + (c->soft - 1 < 16 ? c->soft - 1 : 15);
	return WW_TASK;
}

static __always_inline void stk_stat(__u32 s)
{
	stat_add(WT_STACKS + s);
}

/* The waker of lock wait `r` (thread `tid`), current here: its stacks,
 * with the time the wait lasted (sampled: see release_sample_ns). Only a
 * task's own wake-up comes here (why_waking), never one from an interrupt
 * that found this program running on its CPU, so release_scratch is never
 * in use twice at once. */
static __noinline void released(void *ctx, struct why_thread *r, __u32 tid)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 ns = now > r->since ? now - r->since : 1;
	if (ns < release_sample_ns) {
		if ((bpf_get_prandom_u32() % (__u32)release_sample_ns) >= ns)
			return;
		ns = release_sample_ns;
	}
	__u32 zero = 0;
	struct why_release_key *k = bpf_map_lookup_elem(&release_scratch, &zero);
	if (!k)
		return;
	__u64 id = bpf_get_current_pid_tgid();
	k->s.pid = id >> 32;
	k->s.tid = (__u32)id;
	bpf_get_current_comm(k->s.comm, sizeof(k->s.comm));
	struct why_budget *b = bpf_map_lookup_elem(&release_budget, &zero);
	if (b && now - b->window >= RELEASE_WINDOW_NS) {
		b->window = now;
		b->used = 0;
	}
	if (b && b->used < release_walks) {
		b->used++;
		/* The kernel stack of a futex's waker is the futex call's: only
		 * a kernel lock's release is told by it. */
		STK_CAPTURE(ctx, &k->s, release_kernel && r->cls != WC_LOCK, release_user,
		            stk_stat);
	} else {
		k->s.kstack = STK_NONE;
		k->s.ustack = STK_NONE;
		k->s.uhash = 0;
		stat_add(WT_UNWALKED);
	}
	k->obj = r->obj;
	k->kstack = r->kstack;
	k->tid = tid;
	k->pad = 0;
	struct why_release *v = bpf_map_lookup_elem(&releases, k);
	if (!v) {
		/* Lost a race with another CPU: its entry is taken below. */
		struct why_release nv = {};
		bpf_map_update_elem(&releases, k, &nv, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&releases, k);
		if (!v) {
			stat_add(WT_RELEASERS_FULL);
			return;
		}
	}
	__sync_fetch_and_add(&v->ns, ns);
	__sync_fetch_and_add(&v->count, 1);
}

SEC("tp_btf/sched_waking")
int BPF_PROG(why_waking, struct task_struct *p)
{
	if (t_end)
		return 0;
	__u32 tid = p->pid;
	if (tf_n_pids && !tf_pid_ok(p->tgid))
		return 0; /* -p, another process: its slot not read */
	struct why_thread *r = thread_rec(tid);
	if (!r || r->state != WS_BLOCKED)
		return 0;
	r->wctx = wake_context();
	if (r->wctx != WW_TASK) {
		/* Not the interrupted task's doing (softirq work runs on the
		 * time of whatever task it finds: a peer's own send on
		 * loopback, any task on an interrupt's exit). */
		r->waker = 0;
		return 0;
	}
	__u32 waker = bpf_get_current_pid_tgid();
	/* Its name, unless the same thread woke this one last time. */
	if (waker != r->waker_last) {
		bpf_get_current_comm(r->waker_comm, sizeof(r->waker_comm));
		r->waker_last = waker;
	}
	r->waker = waker;
	/* A lock released: a futex, or an uninterruptible wait named by its
	 * kernel stack (where kernel mutexes and rwsems are found, a fault's
	 * wait for mmap_lock too), not a kernel thread waiting for work. */
	if (release_sample_ns &&
	    (r->cls == WC_LOCK || (r->kstack && r->dstate && r->cls != WC_POLL)))
		released(ctx, r, tid);
	return 0;
}

static __always_inline int on_wakeup(struct task_struct *p, bool fresh)
{
	if (t_end)
		return 0;
	__u32 tid = p->pid;
	if (tf_n_pids && !tf_pid_ok(p->tgid))
		return 0; /* as in why_waking */
	struct why_thread *r = thread_rec(tid);
	if (!r && !wanted(p))
		return 0;
	/* When it was queued, as the kernel counts it (see sched_ns). */
	__u64 now = sched_now(cpu_state(), rq_clock_of(p));
	if (!r) {
		if (fresh) {
			/* A new thread: its window begins now, runnable. */
			r = new_thread(p, tid, WS_RUNNABLE, now, now);
			if (r)
				runnable_from(r, p, now);
			return 0;
		}
		/* Blocked since the run began: what for, read now. */
		r = new_thread(p, tid, WS_BLOCKED, t_start, t_start);
		if (!r)
			return 0;
		classify(NULL, r, p, false, blocked_state(p, task_state(p)));
	}
	if (r->state != WS_BLOCKED)
		return 0; /* woken before it blocked: it never left the CPU */
	stat_add(WT_WAKEUPS);
	close_state(r, p, tid, now);
	r->waker = 0;
	r->wctx = WW_NONE;
	runnable_from(r, p, r->since);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(why_wakeup, struct task_struct *p)
{
	return on_wakeup(p, false);
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(why_wakeup_new, struct task_struct *p)
{
	return on_wakeup(p, true);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(why_exit, struct task_struct *p)
{
	if (t_end)
		return 0;
	__u32 tid = p->pid;
	struct why_thread *r = thread_of(p, tid, WS_ON_CPU);
	if (!r)
		return 0;
	close_state(r, p, tid, bpf_ktime_get_ns());
	r->state = WS_GONE;
	/* Where close_state ended its last state: never before it began. */
	r->end = r->since;
	/* Its name as it ends (a thread names itself after it starts). */
	BPF_CORE_READ_STR_INTO(&r->comm, p, comm);
	r->utime1 = p->utime;
	r->stime1 = p->stime;
	return 0;
}

/* The counts of flow `f` (kind 0) in `retrans`, made if new; NULL when the
 * map is full (counted). */
static __always_inline struct why_retrans *flow_counts(struct rt_flow *f)
{
	struct why_retrans *v = bpf_map_lookup_elem(&retrans, f);
	if (v)
		return v;
	struct why_retrans zero = {};
	bpf_map_update_elem(&retrans, f, &zero, BPF_NOEXIST);
	v = bpf_map_lookup_elem(&retrans, f);
	if (!v)
		stat_add(WT_RETRANS_FULL);
	return v;
}

/*
 * Every TCP retransmission in the window, per flow and cause, whoever sent
 * it (it runs in softirq or timer context, on whatever task is current):
 * user space keeps those of the connections the traced threads waited on.
 * A few per second on a lossy host, none on a healthy one; the flow map is
 * bounded and what it cannot hold is counted.
 */
static __always_inline int count_retransmit(const struct sock *sk, const struct sk_buff *skb,
                                            int err)
{
	if (!t_start || t_end)
		return 0;
	struct rt_read r = {};
	if (!rt_read_event(sk, skb, err, true, &r))
		return 0;
	__u32 kind = r.flow.kind;
	if (kind >= WHY_RT_KINDS)
		return 0;
	r.flow.kind = 0;
	struct why_retrans *v = flow_counts(&r.flow);
	if (!v)
		return 0;
	__sync_fetch_and_add(&v->count[kind], 1);
	__sync_fetch_and_add(&v->segs[kind], r.segs);
	return 0;
}

/* Where the tracepoint has `err` (a retransmission that did not go out),
 * and where it has not: user space loads the one that fits. */
SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(why_retrans_err, const struct sock *sk, const struct sk_buff *skb, int err)
{
	return count_retransmit(sk, skb, err);
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(why_retrans, const struct sock *sk, const struct sk_buff *skb)
{
	return count_retransmit(sk, skb, 0);
}

/*
 * Slow start restarted after idle (RFC 5681 4.1), whoever sends: the kernel
 * checks at each new skb a send queues (tcp_skb_entail, inline: its
 * tcp_slow_start_after_idle_check) and restarts when the sysctl
 * tcp_slow_start_after_idle is on, nothing is in flight, the congestion
 * control has no cong_control hook of its own (BBR has) and the time since
 * the last data sent exceeds the RTO; this evaluates the same condition
 * where tcp_sendmsg_locked is about to queue one (its tracepoint, added to
 * Linux in 2025). A send with data in flight, the common case of a bulk
 * sender, costs a few loads.
 */
static __always_inline bool queues_skb(const struct sk_buff *skb, int size_goal)
{
	/* skb is the write queue's tail (NULL: none): a new one is queued when
	 * it is full. */
	return !skb || size_goal - (int)skb->len <= 0;
}

SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(why_send, struct sock *sk, struct msghdr *msg, struct sk_buff *skb, int size_goal)
{
	if (!t_start || t_end || !queues_skb(skb, size_goal))
		return 0;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (!tp || tp->packets_out)
		return 0;
	__u32 idle = (__u32)bpf_jiffies64() - tp->lsndtime;
	if (idle <= tp->inet_conn.icsk_rto)
		return 0;
	if (!BPF_CORE_READ(sk, __sk_common.skc_net.net, ipv4.sysctl_tcp_slow_start_after_idle))
		return 0;
	if (BPF_CORE_READ(tp, inet_conn.icsk_ca_ops, cong_control))
		return 0;
	struct rt_flow f = {};
	FLOW_FILL(&f, &sk->__sk_common, sk->__sk_common.skc_family, true);
	struct why_retrans *v = flow_counts(&f);
	if (!v)
		return 0;
	__u32 nxt = tp->snd_nxt;
	if (v->restarts && v->restart_nxt == nxt)
		return 0; /* the same idle period's next skb */
	v->restart_nxt = nxt;
	__sync_fetch_and_add(&v->restarts, 1);
	return 0;
}

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct why_drop_key);
	__type(value, __u64);
} drops SEC(".maps");

struct why_drop_key _why_drop_key = {};

/*
 * A packet dropped (skb:kfree_skb): counted by its addresses and ports and
 * the kernel's reason, if TCP or UDP over IP. Consumed packets (freed after
 * use, not dropped) are passed over. The headers are read where the
 * network header is (set for every packet past the driver).
 */
static __always_inline void count_drop(struct sk_buff *skb, __u32 reason)
{
	if (!t_start || t_end)
		return;
	if (reason != WHY_NO_REASON &&
	    bpf_core_enum_value_exists(enum skb_drop_reason, SKB_CONSUMED) &&
	    (reason == bpf_core_enum_value(enum skb_drop_reason, SKB_CONSUMED) ||
	     reason == bpf_core_enum_value(enum skb_drop_reason, SKB_NOT_DROPPED_YET)))
		return;
	unsigned char *head = skb->head;
	__u16 nh = skb->network_header;
	__u16 eth = bpf_ntohs(skb->protocol);
	if (!head || nh == (__u16)~0)
		return;
	struct why_drop_key k = {.reason = reason};
	__u8 h[40];
	__u32 l4;
	if (eth == 0x0800) {
		if (bpf_probe_read_kernel(h, 20, head + nh) || (h[0] >> 4) != 4)
			return;
		/* A fragment after the first carries no ports. */
		if (((h[6] & 0x1f) | h[7]) != 0)
			return;
		k.family = AF_INET;
		k.proto = h[9];
		__builtin_memcpy(k.saddr, &h[12], 4);
		__builtin_memcpy(k.daddr, &h[16], 4);
		l4 = nh + (h[0] & 0xf) * 4;
	} else if (eth == 0x86dd) {
		if (bpf_probe_read_kernel(h, 40, head + nh) || (h[0] >> 4) != 6)
			return;
		k.family = AF_INET6;
		k.proto = h[6];
		__builtin_memcpy(k.saddr, &h[8], 16);
		__builtin_memcpy(k.daddr, &h[24], 16);
		l4 = nh + 40;
	} else {
		return;
	}
	if (k.proto != IPPROTO_TCP && k.proto != IPPROTO_UDP)
		return;
	__u16 ports[2];
	if (bpf_probe_read_kernel(ports, sizeof(ports), head + l4))
		return;
	k.sport = bpf_ntohs(ports[0]);
	k.dport = bpf_ntohs(ports[1]);
	/* Where it was dropped: its socket's namespace, else its device's (a
	 * packet queued on a UDP socket keeps other data where its device
	 * was; typed loads, each checked by the verifier). */
	struct net_device *dev = skb->dev;
	struct sock *sk = skb->sk;
	if (sk)
		k.netns = sk->__sk_common.skc_net.net->ns.inum;
	else if (dev)
		k.netns = dev->nd_net.net->ns.inum;
	__u64 *n = bpf_map_lookup_elem(&drops, &k);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&drops, &k, &one, BPF_NOEXIST)) {
		n = bpf_map_lookup_elem(&drops, &k);
		if (n)
			__sync_fetch_and_add(n, 1);
		else
			stat_add(WT_DROPS_FULL);
	}
}

/* Linux 5.17+ passes the reason (user space loads the one that fits). */
SEC("tp_btf/kfree_skb")
int BPF_PROG(why_drop_reason, struct sk_buff *skb, void *location, enum skb_drop_reason reason)
{
	count_drop(skb, reason);
	return 0;
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(why_drop, struct sk_buff *skb, void *location)
{
	count_drop(skb, WHY_NO_REASON);
	return 0;
}

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct why_disk);
} disks SEC(".maps");

/* A new device's counts (read-only data: not on the stack). */
const struct why_disk disk_zero = {};

/* Linux 5.10's request names its partition by a struct hd_struct. */
struct hd_struct___old {
	struct device __dev;
} __attribute__((preserve_access_index));

struct request___old {
	struct hd_struct___old *part;
} __attribute__((preserve_access_index));

/* The device (partition) a request was for, as a dev_t; 0 if unknown. */
static __always_inline __u32 request_dev(struct request *rq)
{
	if (bpf_core_type_exists(struct hd_struct___old)) {
		struct hd_struct___old *h = ((struct request___old *)rq)->part;
		return h ? h->__dev.devt : 0;
	}
	struct block_device *b = rq->part;
	return b ? b->bd_dev : 0;
}

/* The histogram bucket of a request's time: log2 of its microseconds, the
 * last bucket holding all longer. */
static __always_inline __u32 log2_us(__u64 ns)
{
	__u32 b = log2_u64(ns / 1000);
	return b < WHY_DISK_BUCKETS - 1 ? b : WHY_DISK_BUCKETS - 1;
}

/* A bio a traced thread queued: whose it is, and what a request holding
 * that same bio (not another at the same address) shows: its device (the
 * block device since 5.12, the disk before) and first sector. */
struct why_bio {
	__u64 where;
	__u64 sector;  /* its first sector when queued */
	__u32 sectors; /* and its length then */
	__u32 tid;
};

/* The bios traced threads queued, by address, until a request holding them
 * completes. LRU: one that never reaches a request (a device-mapper
 * device's own, one merged past the fourth of a request) ages out; its
 * address reused by another bio is told apart by device and sectors. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct why_bio);
} bios SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct why_own_key);
	__type(value, struct why_own_disk);
} own_disks SEC(".maps");

struct why_own_key _why_own_key = {};
struct why_own_disk _why_own_disk = {};

/* Before 5.12 a bio and its request name their disk. */
struct bio___disk {
	struct gendisk *bi_disk;
} __attribute__((preserve_access_index));

struct request___disk {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

/* What a bio is for, as its request will name it. */
static __always_inline __u64 bio_where(struct bio *bio)
{
	if (bpf_core_field_exists(struct bio___disk, bi_disk))
		return (__u64)BPF_CORE_READ((struct bio___disk *)bio, bi_disk);
	return (__u64)BPF_CORE_READ(bio, bi_bdev);
}

static __always_inline __u64 request_where(struct request *rq)
{
	if (bpf_core_field_exists(struct bio___disk, bi_disk))
		return (__u64)BPF_CORE_READ((struct request___disk *)rq, rq_disk);
	return (__u64)BPF_CORE_READ(rq, part);
}

/* A bio queued by a traced thread (other threads' cost one lookup). */
static __always_inline void note_bio(struct bio *bio)
{
	if (t_end || !t_start)
		return;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct why_thread *r = thread_rec(tid);
	if (!r || r->state == WS_GONE)
		return; /* not traced, or an exited thread's id used again */
	__u64 k = (__u64)bio;
	struct why_bio b = {.where = bio_where(bio),
	                    .sector = BPF_CORE_READ(bio, bi_iter.bi_sector),
	                    .sectors = BPF_CORE_READ(bio, bi_iter.bi_size) >> 9,
	                    .tid = tid};
	if (bpf_map_update_elem(&bios, &k, &b, BPF_ANY))
		stat_add(WT_OWN_DISKS_FULL);
}

/* Linux 5.11+ passes the bio alone; before, its queue first (user space
 * loads the one that fits). */
SEC("tp_btf/block_bio_queue")
int BPF_PROG(why_bio, struct bio *bio)
{
	note_bio(bio);
	return 0;
}

SEC("tp_btf/block_bio_queue")
int BPF_PROG(why_bio_q, void *q, struct bio *bio)
{
	note_bio(bio);
	return 0;
}

/* The bios of a completed request (its first few) that traced threads
 * queued: the request's time counts as each one's own. */
static __always_inline void own_request(struct request *rq, __u32 dev, __u64 ns)
{
	struct bio *b = rq->bio;
	if (!b)
		return;
	/* Read once, outside the loop: clang hoisted the relocation of the
	 * form this kernel lacks out of its branch when read inside. */
	__u64 where = request_where(rq);
	/* A thread's bios merged into one request make one request of its. */
	__u32 seen[4] = {};
	for (int i = 0; i < 4 && b; i++) {
		__u64 k = (__u64)b;
		struct why_bio *e = bpf_map_lookup_elem(&bios, &k);
		if (e) {
			/* The same bio: its device, and a sector within it (a
			 * bio split by the block layer goes on from a later one;
			 * the pieces split off are not counted). */
			__u64 at = BPF_CORE_READ(b, bi_iter.bi_sector);
			bool same =
			        e->where == where && at >= e->sector && at < e->sector + e->sectors;
			__u32 tid = e->tid;
			bpf_map_delete_elem(&bios, &k);
			bool again = false;
			for (int j = 0; j < 4; j++)
				if (j < i && seen[j] == tid)
					again = true;
			if (same)
				seen[i & 3] = tid;
			struct why_own_key ok = {.tid = tid, .dev = dev};
			struct why_own_disk *o =
			        same && !again ? bpf_map_lookup_elem(&own_disks, &ok) : NULL;
			if (same && !again && !o) {
				struct why_own_disk zero = {};
				bpf_map_update_elem(&own_disks, &ok, &zero, BPF_NOEXIST);
				o = bpf_map_lookup_elem(&own_disks, &ok);
				if (!o)
					stat_add(WT_OWN_DISKS_FULL);
			}
			if (o) {
				__sync_fetch_and_add(&o->reqs, 1);
				__sync_fetch_and_add(&o->ns, ns);
				if (ns > o->max_ns)
					o->max_ns = ns;
			}
		}
		b = b->bi_next;
	}
}

/* A block request completed: counted on its device as the kernel's disk
 * statistics count it (reads and writes, once each, at its last piece),
 * whoever issued it: a disk wait is named with its device's latency. */
SEC("tp_btf/block_rq_complete")
int BPF_PROG(why_blk_done, struct request *rq, int error, unsigned int nr_bytes)
{
	if (t_end || !t_start)
		return 0;
	/* Plain loads: the tracepoint's request is the kernel's own. */
	if (nr_bytes < rq->__data_len)
		return 0; /* a piece of it: it completes later */
	__u32 op = rq->cmd_flags & 0xff;
	__u64 start = rq->start_time_ns, now = bpf_ktime_get_ns();
	if (op > 1 || !start || start > now)
		return 0;
	__u32 dev = request_dev(rq);
	if (!dev)
		return 0;
	struct why_disk *d = bpf_map_lookup_elem(&disks, &dev);
	if (!d) {
		bpf_map_update_elem(&disks, &dev, &disk_zero, BPF_NOEXIST);
		d = bpf_map_lookup_elem(&disks, &dev);
		if (!d) {
			stat_add(WT_DISKS_FULL);
			return 0;
		}
	}
	__u64 ns = now - start, issued = rq->io_start_time_ns;
	__sync_fetch_and_add(&d->reqs[op], 1);
	__sync_fetch_and_add(&d->ns[op], ns);
	if (issued && issued >= start && issued <= now) {
		__sync_fetch_and_add(&d->dev_reqs[op], 1);
		__sync_fetch_and_add(&d->dev_ns[op], now - issued);
	}
	if (ns > d->max_ns)
		d->max_ns = ns;
	__u32 b = log2_us(ns);
	if (b < WHY_DISK_BUCKETS)
		__sync_fetch_and_add(&d->hist[b], 1);
	own_request(rq, dev, ns);
	return 0;
}

/* The hottest functions of the traced threads on CPU: their stacks sampled
 * by a CPU-clock perf event on every CPU (user space sets the rate),
 * counted per (process, name, stacks) in stk_counts. Other threads cost
 * one lookup. */
SEC("perf_event")
int why_sample(struct bpf_perf_event_data *ctx)
{
	if (t_end)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	if (!tid)
		return 0;
	struct why_thread *r = thread_rec(tid);
	if (!r || r->end)
		return 0;
	struct stk_key key = {};
	key.pid = id >> 32;
	bpf_get_current_comm(key.comm, sizeof(key.comm));
	STK_CAPTURE_SAMPLE(ctx, &key, true, true, stk_stat);
	STK_COUNT(&key, 1, stk_stat);
	stat_add(WT_SAMPLES);
	return 0;
}

/* Every task, once at the start and once at the end (iter_phase). */
SEC("iter/task")
int why_iter(struct bpf_iter__task *ctx)
{
	struct task_struct *t = ctx->task;
	if (!t)
		return 0;
	__u32 tid = t->pid;
	if (iter_phase) {
		struct why_thread *r = thread_rec(tid);
		if (r && r->state != WS_GONE) {
			r->utime1 = t->utime;
			r->stime1 = t->stime;
			BPF_CORE_READ_STR_INTO(&r->comm, t, comm);
			/* A wait for a CPU open at the end: its throttled part
			 * is known only here (user space counts the rest). */
			if (r->state == WS_RUNNABLE && r->thr_rq && t_end > r->since)
				close_state(r, t, tid, t_end);
		}
		return 0;
	}
	if (thread_rec(tid) || !wanted(t))
		return 0;
	unsigned int st = task_state(t);
	__u8 state = t->on_cpu                           ? WS_ON_CPU
	             : (t->on_rq || st == TASK_RUNNING_) ? WS_RUNNABLE
	                                                 : WS_BLOCKED;
	struct why_thread *r = new_thread(t, tid, state, t_start, t_start);
	if (!r)
		return 0;
	if (state == WS_BLOCKED)
		classify(NULL, r, t, false, blocked_state(t, st));
	return 0;
}
