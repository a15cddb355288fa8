// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * sonde msglat: per-message latency through an unmodified process (seed
 * 004's T2): the time from a message's receive (its syscall's return) to its
 * send (the sending syscall's entry), paired in the kernel and counted into a
 * histogram there; per-message records only with --per-message.
 *
 * Hooks, three sets:
 *  - sockets (the default where the kernel has both tracepoints): receives
 *    at tp_btf sock:sock_recv_length (the end of sock_recvmsg, any socket
 *    receive), sends at tp_btf tcp:tcp_sendmsg_locked (the start of a TCP
 *    send, before anything is queued). No syscall tracepoint is enabled, so
 *    the host's other syscalls pay nothing and only socket calls run a
 *    program. Whether a socket counts is read from the socket itself at each
 *    call (ports filter), and so is its id (its cookie), so new connections
 *    need no accept/connect/close hooks and a reused descriptor cannot
 *    mislead.
 *  - syscalls: the message syscalls' own tracepoints (sends at entry of
 *    write, writev, sendto, sendmsg; receives at exit of read, readv,
 *    recvfrom, recvmsg).
 *  - raw: tp_btf raw_syscalls sys_enter/sys_exit, returning at once for
 *    every process but the traced ones (one compare).
 * Receives read the id from the buffer the saved user registers of the
 * syscall still name. With the syscall hooks only sockets in the socket
 * table count: user space fills it with the process's sockets at start;
 * accept/accept4/connect add new ones (ports checked here), close removes
 * them. The table holds each socket's id (its inode number), so a
 * descriptor's id is known at no cost beyond the check.
 *
 * Flows (receiving socket -> sending socket) are keyed by the sockets' ids,
 * not by descriptor numbers: a relay that closes a descriptor and gets the
 * same number for another socket (its listener's, for an onward connection)
 * has two flows, each labelled with its own socket's ends.
 *
 * Pairing: by a message id at a byte offset in the payload (default), or
 * FIFO per process (each send takes the oldest waiting receive).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "sonde.h"
#include "inlist.h"
#include "hist.h"
#include "sockfd.h"
#include "arch.h"
#include "msglat.h"

/* This architecture's syscall numbers (set from libc by mod.rs; -2 matches
 * none: -1 is the number outside a syscall). */
const volatile long nr_read = -2;
const volatile long nr_write = -2;
const volatile long nr_close = -2;
const volatile long nr_readv = -2;
const volatile long nr_writev = -2;
const volatile long nr_connect = -2;
const volatile long nr_accept = -2;
const volatile long nr_sendto = -2;
const volatile long nr_recvfrom = -2;
const volatile long nr_sendmsg = -2;
const volatile long nr_recvmsg = -2;
const volatile long nr_accept4 = -2;
#define SONDE_STATS_MAX ML_STAT_MAX
#include "stats.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define EINPROGRESS 115
#define MSG_PEEK    2

const volatile __u32 n_pids = 0;
const volatile __u32 pids[ML_MAX_PIDS] = {};
const volatile __u32 n_ports = 0;
const volatile __u16 ports[ML_MAX_PORTS] = {};
const volatile __u32 id_off = 0;
const volatile __u32 id_len = 8;
const volatile bool fifo = false;
/* Atomic fetch and compare-and-exchange (BPF_FETCH, BPF_CMPXCHG: 5.12). Set
 * false before them: FIFO positions are read, then advanced by a plain atomic
 * add (two threads of one process receiving on two CPUs at once can then take
 * one position), and every flow is counted in the per-CPU hash instead of
 * a shared slot. The verifier never walks the other path, as the value is
 * known at load; kernels before 5.12 still reject its instructions, so the
 * user side replaces them first (features::poison_atomic_fetch). */
const volatile bool has_fetch = true;

/* A plain atomic add (BPF_XADD: every kernel), written out so that the
 * compiler cannot merge it with the fetch-add of the other path into one
 * fetch-add that both paths reach. */
static __always_inline void add_nofetch(__u64 *p, __u64 v)
{
	asm volatile("lock *(u64 *)(%0 + 0) += %1" : : "r"(p), "r"(v) : "memory");
}
const volatile bool per_message = false;

/* The socket table: per (process slot, descriptor) the socket's id (its
 * inode number; 0: not traced), an array so that the check on every read
 * and write is a bounds check and a load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ML_MAX_PIDS *ML_MAX_FD);
	__type(key, __u32);
	__type(value, __u32);
} fds SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ML_WAITING);
	__type(key, __u32);
	__type(value, struct ml_waiting);
} waiting SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ML_MAX_PIDS *ML_RING);
	__type(key, __u32);
	__type(value, struct ml_pending);
} fifo_ring SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ML_MAX_PIDS);
	__type(key, __u32);
	__type(value, struct ml_fifo_pos);
} fifo_pos SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sonde_hist);
} hist SEC(".maps");

/* Per-flow totals: a slot per (process, in fd, out fd) low bits, claimed
 * by the first flow (socket pair) to come and shared by the CPUs (atomic
 * adds), one cache line touched per message; flows that find their slot
 * taken (by another pair of sockets) go to the per-CPU hash below. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ML_MAX_PIDS *ML_FLOW_WAYS *ML_FLOW_WAYS);
	__type(key, __u32);
	__type(value, struct ml_flow_slot);
} flow_slots SEC(".maps");

/* The descriptors of each claimed slot's flow (in_fd << 32 | out_fd),
 * written once by the claimer, read by user space only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ML_MAX_PIDS *ML_FLOW_WAYS *ML_FLOW_WAYS);
	__type(key, __u32);
	__type(value, __u64);
} flow_fds SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct ml_flow_key);
	__type(value, struct ml_flow);
} flows SEC(".maps");

/* Longest message too short for the id (for the error when the id lies
 * beyond every message). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} max_recv SEC(".maps");

/* Referenced so that the skeleton generates Rust mirrors of these layouts. */
struct ml_event _ml_event = {};
struct ml_flow_key _ml_flow_key = {};
struct ml_flow _ml_flow = {};
struct ml_flow_slot _ml_flow_slot = {};

/* Index of a traced process in pids[], or -1. */
static __always_inline int pid_slot(__u32 tgid)
{
	int slot = -1;
	for (__u32 i = 0; i < ML_MAX_PIDS && i < n_pids; i++)
		if (pids[i] == tgid)
			slot = i;
	return slot;
}

/* The socket table's slot of (process slot, fd), or -1 past ML_MAX_FD. */
static __always_inline int fd_key(int slot, __u32 fd)
{
	if (fd >= ML_MAX_FD)
		return -1;
	return slot * ML_MAX_FD + fd;
}

/* Sets descriptor fd's socket id (0: not traced). */
static __always_inline void set_fd(int slot, __u32 fd, __u32 sock)
{
	int k = fd_key(slot, fd);
	if (k < 0) {
		if (sock)
			stat_add(ML_FDS_FULL);
		return;
	}
	__u32 key = k;
	bpf_map_update_elem(&fds, &key, &sock, BPF_ANY);
	if (sock)
		stat_add(ML_NEW_FDS);
}

/* A new socket of a traced process (accept/connect): its ports and its id
 * (inode number) from the file table, once per connection. */
static __always_inline void add_fd(int slot, long fd)
{
	struct sock *sk = sock_of_fd(fd);
	if (!sk)
		return;
	if (n_ports) {
		__u16 lport = BPF_CORE_READ(sk, __sk_common.skc_num);
		__u16 rport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
		if (!IN_LIST(ports, n_ports, ML_MAX_PORTS, lport) &&
		    !IN_LIST(ports, n_ports, ML_MAX_PORTS, rport))
			return;
	}
	set_fd(slot, fd, BPF_CORE_READ(sk, sk_socket, file, f_inode, i_ino));
}

/* The id of the socket behind a traced descriptor, 0 if not traced. */
static __always_inline __u32 fd_sock(int slot, __u32 fd)
{
	int k = fd_key(slot, fd);
	if (k < 0)
		return 0;
	__u32 key = k;
	__u32 *sock = bpf_map_lookup_elem(&fds, &key);
	return sock ? *sock : 0;
}

/* --hooks sockets: a socket's id, the low half of its cookie: one load from
 * sock_common (beside sk_flags), no helper call once the cookie exists; the
 * helper makes it at the socket's first call if nothing made it before. */
static __always_inline __u32 sk_id(struct sock *sk)
{
	__u64 cookie = sk->__sk_common.skc_cookie.counter;
	return cookie ? cookie : bpf_get_socket_cookie(sk);
}

/* The id table's slot for an id: its bits folded onto the table's index
 * (ML_WAITING_BITS at a time). Consecutive ids take neighbouring slots, so
 * the messages in flight share cache lines and pages; strided or prefixed
 * ids still spread, as their varying bits reach the low ones. */
static __always_inline __u32 waiting_slot(__u64 id)
{
	__u64 x = id;
	for (int i = ML_WAITING_BITS; i < 64; i += ML_WAITING_BITS)
		x ^= id >> i;
	return x & (ML_WAITING - 1);
}

/* The message id at id_off in a buffer of `len` bytes (false: none). */
static __always_inline bool read_id(__u64 buf, __u64 len, __u64 *id, __u32 short_stat,
                                    __u32 fault_stat)
{
	if (len < (__u64)id_off + id_len) {
		stat_add(short_stat);
		__u64 *mx = bpf_map_lookup_elem(&max_recv, &(__u32){0});
		if (mx && len > *mx)
			*mx = len;
		return false;
	}
	__u64 v = 0;
	__u32 n = id_len;
	if (n == 0 || n > 8)
		return false;
	if (bpf_probe_read_user(&v, n, (void *)(buf + id_off))) {
		stat_add(fault_stat);
		return false;
	}
	*id = v;
	return true;
}

/* The first buffer of an iovec array (readv/writev, msghdr). */
static __always_inline bool first_iov(__u64 iov_ptr, __u64 *base, __u64 *len)
{
	struct iovec iov;
	if (bpf_probe_read_user(&iov, sizeof(iov), (void *)iov_ptr))
		return false;
	*base = (__u64)iov.iov_base;
	*len = iov.iov_len;
	return true;
}

static __always_inline bool msg_iov(__u64 msg_ptr, __u64 *base, __u64 *len)
{
	struct user_msghdr m;
	if (bpf_probe_read_user(&m, sizeof(m), (void *)msg_ptr) || !m.msg_iovlen)
		return false;
	return first_iov((__u64)m.msg_iov, base, len);
}

static __always_inline void on_recv(__u32 tgid, int slot, __u32 fd, __u32 sock, __u64 buf, long ret)
{
	struct ml_pending p = {.ts = bpf_ktime_get_ns(), .fd = fd, .sock = sock};
	if (fifo) {
		__u32 s = slot;
		struct ml_fifo_pos *pos = bpf_map_lookup_elem(&fifo_pos, &s);
		if (!pos)
			return;
		__u64 t;
		if (has_fetch) {
			t = __sync_fetch_and_add(&pos->tail, 1);
		} else {
			t = pos->tail;
			add_nofetch(&pos->tail, 1);
		}
		if (t - pos->head >= ML_RING) {
			__sync_fetch_and_add(&pos->head, 1);
			stat_add(ML_FIFO_OVERFLOW);
		}
		__u32 idx = s * ML_RING + (t & (ML_RING - 1));
		struct ml_pending *q = bpf_map_lookup_elem(&fifo_ring, &idx);
		if (q)
			*q = p;
		stat_add(ML_RECVS);
		return;
	}
	__u64 id;
	if (!read_id(buf, ret, &id, ML_SHORT_RECV, ML_ID_FAULT))
		return;
	__u32 idx = waiting_slot(id);
	struct ml_waiting *w = bpf_map_lookup_elem(&waiting, &idx);
	if (!w)
		return;
	if (w->tgid1)
		stat_add(ML_REPLACED); /* never sent, or its slot is needed */
	w->id = id;
	w->ts = p.ts;
	w->fd = fd;
	w->sock = sock;
	w->tgid1 = tgid + 1;
}

/* A message from socket in_sock (descriptor in_fd) to out_sock (out_fd):
 * into its slot of the flow table (indexed by the descriptors' low bits,
 * claimed by the first pair of sockets to come), or the per-CPU hash when
 * another pair holds the slot. */
static __always_inline void count_flow(__u32 tgid, int slot, __u32 in_fd, __u32 in_sock,
                                       __u32 out_fd, __u32 out_sock, __u64 t2)
{
	__u32 idx = (slot * ML_FLOW_WAYS + (in_fd & (ML_FLOW_WAYS - 1))) * ML_FLOW_WAYS +
	            (out_fd & (ML_FLOW_WAYS - 1));
	__u64 key1 = ((__u64)in_sock << 32 | out_sock) + 1;
	struct ml_flow_slot *f = has_fetch ? bpf_map_lookup_elem(&flow_slots, &idx) : NULL;
	if (f) {
		__u64 k = f->key1;
		if (!k) {
			k = __sync_val_compare_and_swap(&f->key1, 0, key1);
			if (!k) {
				k = key1;
				__u64 *fds = bpf_map_lookup_elem(&flow_fds, &idx);
				if (fds)
					*fds = (__u64)in_fd << 32 | out_fd;
			}
		}
		if (k == key1) {
			__sync_fetch_and_add(&f->count, 1);
			__sync_fetch_and_add(&f->sum_ns, t2);
			__u64 m = f->max_ns;
			for (int i = 0; i < 4 && t2 > m; i++) {
				__u64 was = __sync_val_compare_and_swap(&f->max_ns, m, t2);
				if (was == m)
					break;
				m = was;
			}
			return;
		}
	}
	struct ml_flow_key fk = {.tgid = tgid,
	                         .in_sock = in_sock,
	                         .out_sock = out_sock,
	                         .in_fd = in_fd,
	                         .out_fd = out_fd};
	struct ml_flow *fl = bpf_map_lookup_elem(&flows, &fk);
	if (!fl) {
		struct ml_flow zero = {};
		if (bpf_map_update_elem(&flows, &fk, &zero, BPF_NOEXIST) &&
		    !bpf_map_lookup_elem(&flows, &fk))
			stat_add(ML_FLOW_FULL);
		fl = bpf_map_lookup_elem(&flows, &fk);
	}
	if (fl) {
		fl->count += 1;
		fl->sum_ns += t2;
		if (t2 > fl->max_ns)
			fl->max_ns = t2;
	}
}

/* A send on traced socket sock (the caller checked). */
static __always_inline void on_send(__u32 tgid, int slot, __u32 fd, __u32 sock, __u64 buf,
                                    __u64 len)
{
	__u64 now = bpf_ktime_get_ns();
	struct ml_pending p;
	__u64 id = 0;
	if (fifo) {
		__u32 s = slot;
		struct ml_fifo_pos *pos = bpf_map_lookup_elem(&fifo_pos, &s);
		if (!pos)
			return;
		if (pos->head >= pos->tail) {
			stat_add(ML_UNMATCHED_SEND);
			return;
		}
		__u64 h;
		if (has_fetch) {
			h = __sync_fetch_and_add(&pos->head, 1);
		} else {
			h = pos->head;
			add_nofetch(&pos->head, 1);
		}
		__u32 idx = s * ML_RING + (h & (ML_RING - 1));
		struct ml_pending *q = bpf_map_lookup_elem(&fifo_ring, &idx);
		if (!q)
			return;
		p = *q;
		id = h;
	} else {
		if (!read_id(buf, len, &id, ML_SHORT_SEND, ML_SEND_ID_FAULT))
			return;
		__u32 idx = waiting_slot(id);
		struct ml_waiting *w = bpf_map_lookup_elem(&waiting, &idx);
		if (!w || w->tgid1 != tgid + 1 || w->id != id) {
			stat_add(ML_UNMATCHED_SEND);
			return;
		}
		p.ts = w->ts;
		p.fd = w->fd;
		p.sock = w->sock;
		w->tgid1 = 0;
	}
	__u64 t2 = now - p.ts;
	struct sonde_hist *h = bpf_map_lookup_elem(&hist, &(__u32){0});
	if (h)
		hist_add(h, t2);
	count_flow(tgid, slot, p.fd, p.sock, fd, sock, t2);
	if (!per_message)
		return;
	void *rb = rb_this_cpu();
	struct ml_event *e = rb ? bpf_ringbuf_reserve(rb, sizeof(*e), 0) : NULL;
	if (!e) {
		stat_add(ML_LOST);
		return;
	}
	e->recv_ns = p.ts;
	e->send_ns = now;
	e->id = id;
	e->tgid = tgid;
	e->tid = (__u32)bpf_get_current_pid_tgid();
	e->in_fd = p.fd;
	e->out_fd = fd;
	bpf_ringbuf_submit(e, rb_submit_flags(rb));
}

/* Where a receive of `ret` bytes by syscall nr (buffer argument a1) put
 * its message: the buffer and the bytes in it. A vectored receive's id is
 * in its first buffer, if that holds it. 1: found; 0: the vector could not
 * be read; -1: nr is not a receive sonde knows the buffer of. */
static __always_inline int recv_buf(long nr, __u64 a1, long ret, __u64 *base, __u64 *got)
{
	__u64 len = ret;
	*base = a1;
	if (nr == nr_read || nr == nr_recvfrom) {
	} else if (nr == nr_readv) {
		if (!first_iov(a1, base, &len))
			return 0;
	} else if (nr == nr_recvmsg) {
		if (!msg_iov(a1, base, &len))
			return 0;
	} else {
		return -1;
	}
	*got = len < (__u64)ret ? len : (__u64)ret;
	return 1;
}

/* A syscall entry of a traced process: sends (the payload is there now)
 * and close. */
static __always_inline int enter_call(__u32 tgid, int slot, long nr, __u32 fd, __u64 a1, __u64 a2)
{
	__u64 base = 0, len = 0;
	__u32 sock;
	if (nr == nr_write || nr == nr_sendto) {
		sock = fd_sock(slot, fd);
		if (sock)
			on_send(tgid, slot, fd, sock, a1, a2);
		return 0;
	}
	if (nr == nr_writev) {
		sock = fd_sock(slot, fd);
		if (sock && first_iov(a1, &base, &len))
			on_send(tgid, slot, fd, sock, base, len);
		return 0;
	}
	if (nr == nr_sendmsg) {
		sock = fd_sock(slot, fd);
		if (sock && msg_iov(a1, &base, &len))
			on_send(tgid, slot, fd, sock, base, len);
		return 0;
	}
	if (nr == nr_close) {
		if (fd_sock(slot, fd))
			set_fd(slot, fd, 0);
	}
	return 0;
}

/* A syscall return of a traced process: receives, accepts and connects. The
 * user registers saved at entry still hold the arguments (nothing changes
 * them before the return to user space), so no state is kept from the
 * entry, and a call already blocked when sonde attached counts too. */
static __always_inline int exit_call(__u32 tgid, int slot, long nr, __u32 fd, __u64 a1, long ret)
{
	if (nr == nr_accept || nr == nr_accept4) {
		add_fd(slot, ret);
		return 0;
	}
	if (nr == nr_connect) {
		if (ret == 0 || ret == -EINPROGRESS)
			add_fd(slot, fd);
		return 0;
	}
	if (!(nr == nr_read || nr == nr_recvfrom || nr == nr_readv || nr == nr_recvmsg))
		return 0;
	if (ret <= 0)
		return 0;
	__u32 sock = fd_sock(slot, fd);
	__u64 base, got;
	if (sock && recv_buf(nr, a1, ret, &base, &got) > 0)
		on_recv(tgid, slot, fd, sock, base, got);
	return 0;
}

/* The traced process's slot in pids[] (else -1), and its tgid. */
#define TRACED(tgid, slot)                                                                         \
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;                                             \
	int slot = pid_slot(tgid);                                                                 \
	if (slot < 0)                                                                              \
	return 0

/* --hooks raw: every syscall of the host runs these two. */
SEC("tp_btf/sys_enter")
int BPF_PROG(ml_enter, struct pt_regs *regs, long nr)
{
	TRACED(tgid, slot);
	return enter_call(tgid, slot, nr, ARCH_SYSCALL_A0(regs), ARCH_SYSCALL_A1(regs),
	                  ARCH_SYSCALL_A2(regs));
}

SEC("tp_btf/sys_exit")
int BPF_PROG(ml_exit, struct pt_regs *regs, long ret)
{
	TRACED(tgid, slot);
	return exit_call(tgid, slot, ARCH_SYSCALL_NR(regs), ARCH_SYSCALL_A0(regs),
	                 ARCH_SYSCALL_A1(regs), ret);
}

/* --hooks syscalls (default): only the message syscalls run a program, and
 * each once: sends at entry, receives at exit (arguments from the task's
 * saved user registers). */
/* `nargs`: the call's arguments read from its record (close has one: a
 * program that reads past its record's end cannot attach). */
#define ML_ENTER(name, nargs)                                                                      \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                                \
	int ml_in_##name(struct trace_event_raw_sys_enter *ctx)                                    \
	{                                                                                          \
		TRACED(tgid, slot);                                                                \
		return enter_call(tgid, slot, nr_##name, ctx->args[0],                             \
		                  nargs > 1 ? ctx->args[1] : 0, nargs > 2 ? ctx->args[2] : 0);     \
	}

/* A receive's or connect's first two arguments from its entry, per thread:
 * where the kernel has no bpf_task_pt_regs (5.15) or
 * bpf_get_current_task_btf (5.11) to read them at exit from the task's
 * saved registers. Only then do the ml_args_* programs load, one more
 * program run per call. A call whose entry was not seen (begun before they
 * attached, or the table full) is counted, not timed. */
const volatile bool has_task_regs = true;

struct ml_args {
	__u64 a0, a1;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct ml_args);
} call_args SEC(".maps");

#define ML_ARGS(name)                                                                              \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                                \
	int ml_args_##name(struct trace_event_raw_sys_enter *ctx)                                  \
	{                                                                                          \
		TRACED(tgid, slot);                                                                \
		__u32 tid = (__u32)bpf_get_current_pid_tgid();                                     \
		struct ml_args v = {ctx->args[0], ctx->args[1]};                                   \
		bpf_map_update_elem(&call_args, &tid, &v, BPF_ANY);                                \
		return 0;                                                                          \
	}

#define ML_EXIT(name)                                                                              \
	SEC("tracepoint/syscalls/sys_exit_" #name)                                                 \
	int ml_out_##name(struct trace_event_raw_sys_exit *ctx)                                    \
	{                                                                                          \
		TRACED(tgid, slot);                                                                \
		if (has_task_regs) {                                                               \
			struct pt_regs *regs =                                                     \
			        (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());    \
			return exit_call(tgid, slot, nr_##name, ARCH_SYSCALL_A0(regs),             \
			                 ARCH_SYSCALL_A1(regs), ctx->ret);                         \
		}                                                                                  \
		if (nr_##name == nr_accept || nr_##name == nr_accept4)                             \
			return exit_call(tgid, slot, nr_##name, 0, 0, ctx->ret);                   \
		__u32 tid = (__u32)bpf_get_current_pid_tgid();                                     \
		struct ml_args *v = bpf_map_lookup_elem(&call_args, &tid);                         \
		if (!v) {                                                                          \
			stat_add(ML_ENTRY_NOT_SEEN);                                               \
			return 0;                                                                  \
		}                                                                                  \
		__u64 a0 = v->a0, a1 = v->a1;                                                      \
		bpf_map_delete_elem(&call_args, &tid);                                             \
		return exit_call(tgid, slot, nr_##name, a0, a1, ctx->ret);                         \
	}

ML_ENTER(write, 3)
ML_ENTER(writev, 3)
ML_ENTER(sendto, 3)
ML_ENTER(sendmsg, 3)
ML_ENTER(close, 1)
ML_ARGS(read)
ML_ARGS(readv)
ML_ARGS(recvfrom)
ML_ARGS(recvmsg)
ML_ARGS(connect)
ML_EXIT(read)
ML_EXIT(readv)
ML_EXIT(recvfrom)
ML_EXIT(recvmsg)
ML_EXIT(accept)
ML_EXIT(accept4)
ML_EXIT(connect)

/* --hooks sockets. Whether a traced process's socket counts: the ports
 * filter, from the socket itself (its first cache line, which the call has
 * just used). */
static __always_inline bool traced_sock(const struct sock *sk)
{
	if (!n_ports)
		return true;
	__u16 lport = sk->__sk_common.skc_num;
	__u16 rport = bpf_ntohs(sk->__sk_common.skc_dport);
	return IN_LIST(ports, n_ports, ML_MAX_PORTS, lport) ||
	       IN_LIST(ports, n_ports, ML_MAX_PORTS, rport);
}

/* The end of sock_recvmsg: ret bytes received into the buffer that the
 * syscall's saved registers name. */
SEC("tp_btf/sock_recv_length")
int BPF_PROG(ml_sock_recv, struct sock *sk, int ret, int flags)
{
	TRACED(tgid, slot);
	if (ret <= 0 || (flags & MSG_PEEK) || !traced_sock(sk))
		return 0;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	__u64 base, got;
	int found = recv_buf(ARCH_SYSCALL_NR(regs), ARCH_SYSCALL_A1(regs), ret, &base, &got);
	if (found < 0)
		stat_add(ML_OTHER_CALL); /* recvmmsg, io_uring, splice: no buffer known */
	if (found > 0)
		on_recv(tgid, slot, ARCH_SYSCALL_A0(regs), sk_id(sk), base, got);
	return 0;
}

/* This CPU's send call in progress (a call's turns run on one CPU unless it
 * sleeps for memory). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ml_send_call);
} send_call SEC(".maps");

/* The start of a TCP send, at every turn of tcp_sendmsg_locked's copy loop.
 * A call's first turn is told from its later ones (and from a turn again
 * after waiting for memory) by the socket, the msghdr and the bytes it still
 * holds: in one call, the bytes taken from the message equal the growth of
 * write_seq. A new call differs (it holds bytes not yet counted), except one
 * that sends exactly the rest of a short previous call: the same message,
 * rightly not a new one. The payload is read where the iterator stands. */
SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(ml_tcp_send, struct sock *sk, struct msghdr *msg, struct sk_buff *skb, int size_goal)
{
	TRACED(tgid, slot);
	if (!traced_sock(sk))
		return 0;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	struct ml_send_call *c = bpf_map_lookup_elem(&send_call, &(__u32){0});
	if (!tp || !c)
		return 0;
	__u64 left = msg->msg_iter.count;
	__u32 seq = tp->write_seq;
	if (c->sk == (__u64)sk && c->msg == (__u64)msg && seq - c->seq == c->left - left)
		return 0;
	c->sk = (__u64)sk;
	c->msg = (__u64)msg;
	c->left = left;
	c->seq = seq;
	__u64 base, len;
	__u8 type = msg->msg_iter.iter_type;
	__u64 off = msg->msg_iter.iov_offset;
	if (type == ITER_UBUF) {
		base = (__u64)msg->msg_iter.ubuf + off;
		len = left;
	} else if (type == ITER_IOVEC) {
		struct iovec iov;
		if (bpf_probe_read_kernel(&iov, sizeof(iov), msg->msg_iter.__iov))
			return 0;
		base = (__u64)iov.iov_base + off;
		len = iov.iov_len - off;
	} else {
		stat_add(ML_OTHER_CALL); /* sendfile, splice: pages, no user buffer */
		return 0;
	}
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	long nr = ARCH_SYSCALL_NR(regs);
	__u32 fd = (nr == nr_write || nr == nr_writev || nr == nr_sendto || nr == nr_sendmsg)
	                   ? ARCH_SYSCALL_A0(regs)
	                   : ML_NO_FD;
	on_send(tgid, slot, fd, sk_id(sk), base, len);
	return 0;
}

/* The lab's calibration: an empty program on a message tracepoint, whose
 * run time under kernel.bpf_stats_enabled is the statistics' own cost. With
 * ml_null_send, also the lab's floor row: what reaching a program at the
 * socket hooks costs before it does anything. */
SEC("tp_btf/sock_recv_length")
int BPF_PROG(ml_null)
{
	return 0;
}

SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(ml_null_send)
{
	return 0;
}
