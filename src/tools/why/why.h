// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Shared between why.bpf.c and src/tools/why/mod.rs. Include after
 * stacks.h (struct stk_key). */
#ifndef SONDE_WHY_H
#define SONDE_WHY_H

/* What a blocked thread waits for, decided at the switch from what the
 * kernel says (the task state, the system call and its descriptor, the
 * kernel's own flags); never from the program's name. The user half
 * (classes.rs) names them and can move a wait to WC_LOCK from its kernel
 * stack (a kernel mutex or rwsem). */
enum why_class {
	WC_DISK = 0, /* block I/O, files */
	WC_NETWORK,  /* a TCP/UDP socket: receive, send, connect */
	WC_LOCK,     /* futexes; kernel mutexes and rwsems */
	WC_SLEEP,    /* nanosleep, timers */
	WC_POLL,     /* epoll, poll, select, accept: waiting for work */
	WC_PIPE,     /* pipes, Unix sockets, System V and POSIX queues */
	WC_MEMORY,   /* page faults, reclaim, compaction, swap-in */
	WC_IO_URING, /* io_uring_enter waiting for completions */
	WC_OTHER,    /* named by the kernel function it waits in */
	WC_MAX,
};

/* A thread's time, every nanosecond of its window in one slot. */
enum why_acc {
	WA_ON_CPU = 0,
	WA_RUNQUEUE,  /* runnable, waiting for a CPU */
	WA_THROTTLED, /* runnable, its cgroup's CPU quota spent */
	WA_BLOCKED,   /* + enum why_class */
	WA_MAX = WA_BLOCKED + WC_MAX,
};

enum why_state {
	WS_NONE = 0,
	WS_ON_CPU,
	WS_RUNNABLE,
	WS_BLOCKED,
	WS_GONE, /* exited: its window has ended */
};

/* What a system call waits on, by the architecture's number (sys_kind,
 * filled by the user half). */
enum why_sys {
	WK_NONE = 0,
	WK_FD_READ,  /* read, recvfrom, recvmsg...: the descriptor in argument 0 */
	WK_FD_WRITE, /* write, sendto, sendmsg... */
	WK_CONNECT,  /* connect: network */
	WK_ACCEPT,   /* accept, accept4: waiting for a connection (poll) */
	WK_SLEEP,    /* nanosleep, clock_nanosleep, pause */
	WK_POLL,     /* poll, ppoll: nothing to watch (argument 1 is 0) is a sleep */
	WK_SELECT,   /* select, pselect6: nothing to watch (argument 0 is 0) is a sleep */
	WK_EPOLL,    /* epoll_wait, epoll_pwait(2): the epoll descriptor in argument 0 */
	WK_FUTEX,    /* futex, futex_waitv: the address in argument 0 */
	WK_IO_URING, /* io_uring_enter: the ring's descriptor in argument 0 */
	WK_FSYNC,    /* fsync, fdatasync, sync_file_range: disk */
	WK_IPC,      /* msgrcv, msgsnd, mq_timedreceive, mq_timedsend, semop: pipe */
	WK_WAIT,     /* wait4, waitid: a child */
	WK_MAX,
};

#define WHY_NSYS    512
#define WHY_KFRAMES 16

/* A wait's aggregate, per (thread, class, object, waker). */
struct why_wait_key {
	__u64 obj;
	__u64 kstack;
	__u32 tid;
	__u32 waker;
	__u16 sys;
	__u8 cls;
	__u8 wctx;
	__u8 pad[4];
};

/* What ran on a CPU while a traced thread waited in its run queue: per
 * (waiting thread, thread that ran), the time their intervals overlapped. */
struct why_instead_key {
	__u64 cg;   /* the runner's CPU cgroup (its kernfs id: the directory's inode) */
	__u32 tid;  /* the waiting thread */
	__u32 rtid; /* the thread that ran */
	__u32 rtgid;
	__u32 pad;
};

struct why_instead {
	__u64 ns;
	char comm[16];
};

/*
 * One traced thread. Laid out by what each hook touches, 64-byte lines
 * (records in slots start on one): a wake-up's first read of the record
 * (sched_waking) only the first, a switch or wake-up four at most; the rest
 * is read or written when something changes (a new wait's object, waker or
 * runner) or once per run. Most of each hook's cost here is lines not in
 * the cache.
 */
struct why_thread {
	/* Line 0: every hook. */
	/* Its thread id, set once the record is whole (0: none; 64 bits for
	 * the BPF atomics without alu32). */
	__u64 tid;
	__u64 since; /* when its current state began */
	__u8 state;  /* enum why_state */
	__u8 cls;    /* the current wait's enum why_class */
	__u8 wctx;   /* how it was woken (enum why_wake) */
	__u8 dstate; /* the current wait is uninterruptible */
	__u16 sys;   /* the current wait's system call + 1 (0: none) */
	__u16 pad0;
	__u32 waker;      /* the thread that woke the current wait (sched_waking) */
	__u32 waker_last; /* whose name is in waker_comm */
	__u32 waits;      /* waits ended in the window */
	__u32 taken_cpu;  /* the CPU whose counters are in steal0, irq0 */
	__u64 obj;        /* what the current wait is for (0: nothing more known) */
	__u64 kstack;     /* the current wait's kernel stack (hash in kstacks), 0 none */
	__u64 thr_rq;     /* runnable: its cfs_rq, and that cfs_rq's throttled clock then */
	/* Line 1: switches, and a wait's end. */
	__u64 thr_at;
	__u64 steal0; /* on CPU: its run queue's steal and irq time at the switch-in */
	__u64 irq0;
	__u64 on_steal; /* of the time on CPU: taken by the hypervisor (steal) */
	__u64 on_irq;   /* of the time on CPU: serving interrupts (irq time) */
	/* Finished waits not yet in `waits`, all on one key (see wait_add). */
	__u64 p_ns;
	__u64 p_count;
	/* Time one other thread ran on its CPU while it waited runnable, not
	 * yet in `instead` (see ran_instead): i_key.tid is 0 when none. */
	__u64 i_ns;
	/* Line 2: a wait's start and end. */
	struct why_wait_key pk;
	__u64 c_file; /* the last wait on a descriptor: its file, inode number, */
	__u64 c_ino;  /* descriptor, object, class and call kind (see fd_class) */
	__u64 c_obj;
	__u32 c_fd;
	__u8 c_cls;
	__u8 c_key;
	__u16 c_pad;
	/* Lines 3 and 4: the time in each slot, and who ran instead. */
	__u64 acc[WA_MAX];
	struct why_instead_key i_key;
	__u64 claim; /* the thread whose record a slot holds or is being made */
	/* Then what changes rarely. */
	__u64 start;    /* when its window began (the run's start, or its birth) */
	__u64 end;      /* when it exited (0: alive at the end) */
	__u64 last_obj; /* the last object described in `objects` */
	__u64 utime0;   /* the kernel's user and system time at the start and end */
	__u64 stime0;
	__u64 utime1;
	__u64 stime1;
	__u32 tgid;
	__u32 pad1;
	char comm[16];
	char waker_comm[16];
	char p_wcomm[16];
	char i_comm[16];
	/* Its last select or pselect6: the call's first two arguments, its one
	 * descriptor (-1: none; -2: more than one) and whether that is in the
	 * write set only (see on_select). */
	__u64 sel_nfds;
	__u64 sel_inp;
	__s32 sel_fd;
	__u8 sel_write;
	__u8 sel_pad[3];
	/* The task's start (task_struct.start_time): a thread id used again,
	 * by a thread started after this one exited, is not this record's. */
	__u64 task_start;
	__u8 pad2[32];
};

/* How a wait ended (sched_waking's context). */
enum why_wake {
	WW_NONE = 0, /* no wake-up seen (still open, or unseen) */
	WW_TASK,     /* by the current task: the waker */
	WW_TIMER,    /* by a timer's expiry (hrtimer callback) */
	WW_HARDIRQ,  /* in a device's interrupt handler */
	WW_SOFTIRQ,  /* + the softirq's number: in softirq work, on the
	              * current task's time (NET_RX 3, BLOCK 4, TIMER 1...) */
};

struct why_wait {
	__u64 ns;
	__u64 count;
	char waker_comm[16];
};

/* What an object is (`objects`, by the object's id: a kernel pointer). */
enum why_obj_kind {
	WO_FILE = 1, /* a regular file or block device: dev, ino */
	WO_FIFO,     /* a pipe or FIFO: ino */
	WO_SOCKET,   /* family, protocol, the two addresses and ports */
	WO_CHAR,     /* a character device: dev, ino */
	WO_ANON,     /* eventfd, timerfd, epoll...: no inode type */
};

struct why_obj {
	__u64 dev;
	__u64 ino;
	__u8 saddr[16];
	__u8 daddr[16];
	__u32 tgid;
	__u32 fd;
	__u16 kind;
	__u16 family;
	__u16 proto;
	__u16 sport; /* host order */
	__u16 dport; /* host order */
	__u16 type;  /* socket type */
	__u32 netns; /* a socket's network namespace (its inode) */
	__u32 rdev;  /* a block device file's own device (0: another file) */
	__u64 peer;  /* a Unix socket's peer's socket inode (0: none) */
};

/* TCP retransmissions of one flow in the window (`retrans`, by the flow as
 * the retransmitting socket sees it: struct rt_flow with kind 0), per cause
 * (enum retrans_kind, src/bpf/tcpretrans.h): user space matches them to the
 * sockets waited on, this end's and (reversed) a peer's on this host. */
#define WHY_RT_KINDS 7
struct why_retrans {
	__u64 count[WHY_RT_KINDS];
	__u64 segs[WHY_RT_KINDS];
	/* Sends after idle on which this end restarted slow start (RFC 5681
	 * 4.1), and its snd_nxt at the last (one restart per idle period:
	 * every skb a send queues before any goes out passes the check). */
	__u64 restarts;
	__u32 restart_nxt;
	__u32 pad;
};

/* Block requests completed in the window on one device (its dev_t, as
 * the kernel encodes it: major << 20 | minor), reads [0] and writes [1]:
 * as the kernel's disk statistics count them (/sys/block/NAME/stat), from
 * the request's start in the block layer to its completion; and, where the
 * kernel stamps it, from its issue to the device. */
#define WHY_DISK_BUCKETS 32
struct why_disk {
	__u64 reqs[2];
	__u64 ns[2];       /* start to completion */
	__u64 dev_reqs[2]; /* with an issue time */
	__u64 dev_ns[2];   /* issue to completion */
	__u64 max_ns;
	__u64 hist[WHY_DISK_BUCKETS]; /* start to completion, log2 of us */
};

/* A traced thread's own block requests on a device: the requests
 * completed holding a bio it queued (block_bio_queue in its context),
 * counted as the device's are (start in the block layer to completion). */
struct why_own_key {
	__u32 tid;
	__u32 dev;
};

struct why_own_disk {
	__u64 reqs;
	__u64 ns;
	__u64 max_ns;
};

/* Who released a lock a traced thread waited for: the thread that woke it
 * (sched_waking, in the waker's context), with its stack then, language
 * frames included (src/bpf/stacks.h). `s` names the waker (pid, tid, comm,
 * stacks); per (waiter, lock, waker, stacks): the waits it ended and the
 * time they had lasted. Lock waits are futexes, and the uninterruptible
 * waits whose kernel stack was taken (where kernel mutexes and rwsems are
 * found). */
struct why_release_key {
	struct stk_key s;
	__u64 obj;    /* the wait's object (a futex's address) */
	__u64 kstack; /* the wait's kernel stack (which kernel lock), or 0 */
	__u32 tid;    /* the waiting thread */
	__u32 pad;
};

struct why_release {
	__u64 ns;
	__u64 count;
};

/* Packets the kernel dropped in the window (skb:kfree_skb, with its reason),
 * by the packet's own addresses and ports (TCP and UDP) and the network
 * namespace: user space matches them to the sockets waited on, both
 * directions. */
struct why_drop_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport; /* host order */
	__u16 dport;
	__u16 family;
	__u8 proto;
	__u8 pad;
	__u32 reason; /* enum skb_drop_reason, or WHY_NO_REASON */
	__u32 netns;  /* where it was dropped: its socket's namespace, else its device's (inode) */
};
#define WHY_NO_REASON 0xffffffff

/* In this order in src/tools/why/mod.rs (WT_*). */
enum why_stat {
	WT_SWITCHES = 0,    /* context switches seen */
	WT_WAKEUPS,         /* wake-ups of traced threads */
	WT_THREADS_FULL,    /* a thread not traced: the thread map was full */
	WT_WAITS_FULL,      /* a wait not kept per object: the wait map was full */
	WT_OBJECTS_FULL,    /* an object not described: the object map was full */
	WT_KSTACKS_FULL,    /* a kernel stack not kept: the stack map was full */
	WT_KSTACK_ERRORS,   /* a kernel stack not captured */
	WT_REGS_UNREAD,     /* a blocked thread's registers could not be read */
	WT_UNSEEN_WAKEUPS,  /* switched in while blocked: its wake-up not seen */
	WT_UNSEEN_SWITCHES, /* switched out while not on CPU: its switch-in not seen */
	WT_INSTEAD_FULL,    /* a thread that ran instead not kept: the map was full */
	WT_RETRANS_FULL,    /* a TCP retransmission not counted: the flow map was full */
	WT_DISKS_FULL,      /* a block request not counted: the device map was full */
	WT_RELEASERS_FULL,  /* a lock's releaser not kept: the releaser map was full */
	WT_UNWALKED,        /* a release counted without its stack: the CPU's walks spent */
	WT_SAMPLES,         /* on-CPU samples of traced threads */
	WT_DROPS_FULL,      /* a packet drop not counted: the drop map was full */
	WT_OWN_DISKS_FULL,  /* a thread's own block request not counted: its map was full */
	WT_STATE_WOKEN,     /* a blocked thread's state overwritten by its wake-up */
	WT_RECORD_BUSY,     /* a thread's event passed over: another CPU was making its record */
	WT_TID_REUSED,      /* an event of a thread whose id an exited one's record holds */
	WT_STACKS,          /* + enum stk_stat: a releaser's stack not captured */
	WT_MAX = WT_STACKS + STK_STAT_MAX,
};

#endif
