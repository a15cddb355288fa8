// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * sonde drops: every packet this host's kernel drops, with its reason.
 *
 * Hook: the skb:kfree_skb tracepoint, through which every drop passes with
 * the place it was dropped (a return address) and, since 5.17, the kernel's
 * reason, and since 6.11 the receiving socket. Its arguments grew with the
 * kernel, and a program may not read past them, so there are three flavours
 * per mechanism (2, 3 and 4 arguments) and user space loads the one the
 * running kernel's BTF says (the classic tracepoint reads its record, whose
 * fields CO-RE finds). Frees with reason SKB_CONSUMED are not drops (the
 * kernel sends those to skb:consume_skb since 6.0; older ones pass them here).
 *
 * The owner is the socket the drop names (rx_sk, else skb->sk), never the
 * task that happens to be on the CPU (drops run in softirq). A socket's
 * process is recorded in process context when it makes or accepts the
 * socket, binds or connects it, keyed by the socket's inode; user space adds
 * the sockets that existed before it started, from /proc.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "sonde.h"
#include "flow.h"
#include "sockfd.h"
#include "drops.h"
#define SONDE_STATS_MAX DR_S_MAX
#include "stats.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define ETH_P_IP   0x0800
#define ETH_P_IPV6 0x86DD

/* Set by user space before load. */
const volatile bool count_mode = false;
const volatile bool want_stack = false;
const volatile bool by_cgroup = false; /* serve --labels cgroup: counts per owner cgroup */
const volatile __u32 reason_mode = 0;  /* 0 every reason, 1 only reason_set's, 2 all but */
const volatile __u64 rate_ns = 0;      /* streaming: one drop per rate_ns per CPU (0: no limit) */
const volatile __u64 burst = 0;        /* ... and as many at once */
const volatile __u32 n_ifaces = 0;
const volatile char ifaces[DR_MAX_IFACES][DR_IFNAMSIZ] = {};
const volatile __u32 n_protos = 0;
const volatile __u8 protos[DR_MAX_PROTOS] = {};
const volatile bool use_slots = false;   /* the kernel has compare-and-exchange (5.12) */
const volatile bool bench_empty = false; /* bench/drops: the program's floor, doing nothing */
/* kfree_skb's own text (0, 0: not a function of its own). A compiler that
 * splits it (GCC's kfree_skb.part.0 in Debian's arm64 5.10) leaves the
 * tracepoint's `location` in kfree_skb itself; the place is then its
 * caller, from the stack. */
const volatile __u64 kfree_lo = 0, kfree_hi = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} reason_set SEC(".maps");

/* --count. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct dr_key);
	__type(value, __u64);
} counts SEC(".maps");

/* Per CPU, DR_SLOTS each (max_entries set by user space), read by user
 * space through a shared mapping. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, DR_SLOTS);
	__type(key, __u32);
	__type(value, struct dr_slot);
} slots SEC(".maps");

/* Socket inode -> who owns the socket. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct sonde_owner);
} owners SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 1); /* sized by user space with --stack */
	__type(key, __u32);
	__uint(value_size, 127 * sizeof(__u64));
} kstacks SEC(".maps");

/* The rate limit's bucket, per CPU: when it was last topped up, tokens. */
struct dr_bucket {
	__u64 at;
	__u64 tokens;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dr_bucket);
} bucket SEC(".maps");

/* The drop being looked at (off the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dr_event);
} scratch SEC(".maps");

/* Referenced so that the skeleton generates Rust mirrors of these layouts. */
struct dr_event _dr_event = {};
struct dr_key _dr_key = {};

static __always_inline bool iface_listed(const char *name)
{
	for (__u32 i = 0; i < DR_MAX_IFACES && i < n_ifaces; i++) {
		bool same = true;
		for (int b = 0; b < DR_IFNAMSIZ; b++) {
			if (name[b] != ifaces[i][b]) {
				same = false;
				break;
			}
			if (!name[b])
				break;
		}
		if (same)
			return true;
	}
	return false;
}

static __always_inline bool proto_listed(__u8 p)
{
	for (__u32 i = 0; i < DR_MAX_PROTOS && i < n_protos; i++)
		if (protos[i] == p)
			return true;
	return false;
}

/* Whether the rate limit lets one more drop through on this CPU. */
static __always_inline bool rate_ok(void)
{
	if (!rate_ns)
		return true;
	__u32 zero = 0;
	struct dr_bucket *b = bpf_map_lookup_elem(&bucket, &zero);
	if (!b)
		return false;
	__u64 now = bpf_ktime_get_ns();
	__u64 add = (now - b->at) / rate_ns;
	if (add) {
		b->tokens = b->tokens + add > burst ? burst : b->tokens + add;
		b->at += add * rate_ns;
	}
	if (!b->tokens)
		return false;
	b->tokens--;
	return true;
}

static __always_inline bool same_key(const struct dr_key *a, const struct dr_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

/* Counts one drop under k: in this CPU's slot for k if k holds it or it is
 * free, else in the hash. */
static __always_inline void count_drop(const struct dr_key *k)
{
	if (use_slots) {
		__u64 h = (k->location ^ ((__u64)k->reason << 32) ^ k->netns ^
		           ((__u64)k->ifindex << 20) ^ ((__u64)k->l4 << 40) ^
		           ((__u64)k->ethertype << 48) ^ k->cgroup) *
		          0x9E3779B97F4A7C15ULL;
		__u32 idx = bpf_get_smp_processor_id() * DR_SLOTS + (__u32)(h >> 56) % DR_SLOTS;
		struct dr_slot *s = bpf_map_lookup_elem(&slots, &idx);
		if (s) {
			__u64 st = s->state;
			if (st == 2 && same_key(&s->key, k)) {
				__sync_fetch_and_add(&s->n, 1);
				return;
			}
			if (st == 0 && __sync_val_compare_and_swap(&s->state, 0, 1) == 0) {
				__builtin_memcpy(&s->key, k, sizeof(*k));
				s->n = 1;
				/* Published after its key (a full barrier). */
				__sync_fetch_and_add(&s->state, 1);
				return;
			}
		}
	}
	__u64 *n = bpf_map_lookup_elem(&counts, k);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&counts, k, &one, BPF_NOEXIST)) {
		n = bpf_map_lookup_elem(&counts, k);
		if (n)
			__sync_fetch_and_add(n, 1);
		else
			stat_add(DR_S_COUNT_FULL);
	}
}

/*
 * read_headers by plain loads through typed pointers (bpf_rdonly_cast: Linux
 * 6.2+, BTF-typed tracepoints): no helper call per read, and a load that
 * faults reads zero. 40 ns less per drop than the helper's reads here.
 */
static __always_inline void read_headers_cast(struct dr_event *e, unsigned char *head, __u16 nh,
                                              bool full)
{
	__u32 l4off;
	if (e->ethertype == ETH_P_IP) {
		struct iphdr *ip = bpf_core_cast(head + nh, struct iphdr);
		if (BPF_CORE_READ_BITFIELD(ip, version) != 4)
			goto unreadable;
		e->family = AF_INET;
		e->l4 = ip->protocol;
		if (!full)
			return;
		__u32 a = ip->saddr, b = ip->daddr;
		__builtin_memcpy(e->saddr, &a, 4);
		__builtin_memcpy(e->daddr, &b, 4);
		/* A fragment after the first carries no ports. */
		if (ip->frag_off & bpf_htons(0x1fff))
			return;
		l4off = nh + BPF_CORE_READ_BITFIELD(ip, ihl) * 4;
	} else if (e->ethertype == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = bpf_core_cast(head + nh, struct ipv6hdr);
		if (BPF_CORE_READ_BITFIELD(ip6, version) != 6)
			goto unreadable;
		e->family = AF_INET6;
		e->l4 = ip6->nexthdr;
		if (!full)
			return;
		for (int i = 0; i < 4; i++) {
			__u32 a = ip6->saddr.in6_u.u6_addr32[i], b = ip6->daddr.in6_u.u6_addr32[i];
			__builtin_memcpy(&e->saddr[i * 4], &a, 4);
			__builtin_memcpy(&e->daddr[i * 4], &b, 4);
		}
		l4off = nh + 40;
	} else {
		e->flags |= DR_F_NO_IP;
		return;
	}
	if (e->l4 != IPPROTO_TCP && e->l4 != IPPROTO_UDP)
		return;
	/* UDP's and TCP's ports are at the same place. */
	struct udphdr *uh = bpf_core_cast(head + l4off, struct udphdr);
	e->sport = bpf_ntohs(uh->source);
	e->dport = bpf_ntohs(uh->dest);
	if (e->l4 == IPPROTO_TCP) {
		struct tcphdr *th = bpf_core_cast(head + l4off, struct tcphdr);
		e->tcp_flags =
		        BPF_CORE_READ_BITFIELD(th, fin) | BPF_CORE_READ_BITFIELD(th, syn) << 1 |
		        BPF_CORE_READ_BITFIELD(th, rst) << 2 |
		        BPF_CORE_READ_BITFIELD(th, psh) << 3 |
		        BPF_CORE_READ_BITFIELD(th, ack) << 4 |
		        BPF_CORE_READ_BITFIELD(th, urg) << 5 |
		        BPF_CORE_READ_BITFIELD(th, ece) << 6 | BPF_CORE_READ_BITFIELD(th, cwr) << 7;
	}
	e->flags |= DR_F_L4;
	return;
unreadable:
	e->flags |= DR_F_NO_IP;
	stat_add(DR_S_NO_HEADER);
}

/*
 * Reads the packet's IP header into e: the protocol always; addresses and
 * ports (and TCP flags) when they are shown or filtered on. `direct`: a
 * BTF-typed tracepoint, which may read through typed pointers.
 */
static __always_inline void read_headers(struct dr_event *e, unsigned char *head, __u16 nh,
                                         bool direct)
{
	__u8 h[40];
	bool full = !count_mode || n_cidrs || n_ports;
	if (direct && bpf_ksym_exists(bpf_rdonly_cast) && nh != (__u16)~0 && head) {
		read_headers_cast(e, head, nh, full);
		return;
	}
	long err = nh == (__u16)~0 || !head ? -1
	           : full                   ? bpf_probe_read_kernel(h, sizeof(h), head + nh)
	                                    : bpf_probe_read_kernel(h, 10, head + nh);
	if (err) {
		e->flags |= DR_F_NO_IP;
		stat_add(DR_S_NO_HEADER);
		return;
	}
	if (!full) {
		if (e->ethertype == ETH_P_IP && (h[0] >> 4) == 4) {
			e->family = AF_INET;
			e->l4 = h[9];
		} else if (e->ethertype == ETH_P_IPV6 && (h[0] >> 4) == 6) {
			e->family = AF_INET6;
			e->l4 = h[6];
		} else {
			e->flags |= DR_F_NO_IP;
		}
		return;
	}
	__u32 l4off = 0;
	if (e->ethertype == ETH_P_IP && (h[0] >> 4) == 4) {
		e->family = AF_INET;
		e->l4 = h[9];
		__builtin_memcpy(e->saddr, &h[12], 4);
		__builtin_memcpy(e->daddr, &h[16], 4);
		l4off = nh + (h[0] & 15) * 4;
		/* A fragment after the first carries no ports. */
		if (h[6] & 0x1f || h[7])
			return;
	} else if (e->ethertype == ETH_P_IPV6 && (h[0] >> 4) == 6) {
		e->family = AF_INET6;
		e->l4 = h[6];
		__builtin_memcpy(e->saddr, &h[8], 16);
		bpf_probe_read_kernel(e->daddr, 16, head + nh + 24);
		l4off = nh + 40;
	} else {
		e->flags |= DR_F_NO_IP;
		return;
	}
	if (e->l4 != IPPROTO_TCP && e->l4 != IPPROTO_UDP)
		return;
	__u8 p[14];
	if (bpf_probe_read_kernel(p, sizeof(p), head + l4off))
		return;
	e->sport = (p[0] << 8) | p[1];
	e->dport = (p[2] << 8) | p[3];
	if (e->l4 == IPPROTO_TCP)
		e->tcp_flags = p[13];
	e->flags |= DR_F_L4;
}

#define DR_PLACE_DEPTH 8
struct dr_place_stack {
	__u64 ip[DR_PLACE_DEPTH];
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dr_place_stack);
} place_stack SEC(".maps");

/* Where the packet was dropped: `location`, unless that is in kfree_skb
 * itself (see kfree_lo), where it is the caller of kfree_skb, the frame
 * after kfree_skb's on the kernel stack. */
static __always_inline __u64 drop_place(void *ctx, __u64 location)
{
	if (location < kfree_lo || location >= kfree_hi)
		return location;
	__u32 zero = 0;
	struct dr_place_stack *st = bpf_map_lookup_elem(&place_stack, &zero);
	if (!st)
		return location;
	long n = bpf_get_stack(ctx, st->ip, sizeof(st->ip), 0);
	if (n <= 0)
		return location;
	n /= 8;
	for (int i = 0; i + 1 < DR_PLACE_DEPTH; i++) {
		if (i + 1 >= n)
			break;
		__u64 ip = st->ip[i], up = st->ip[i + 1];
		if (ip >= kfree_lo && ip < kfree_hi && (up < kfree_lo || up >= kfree_hi))
			return up;
	}
	return location;
}

/*
 * One kfree_skb. `direct`: skb and sk are BTF pointers (tp_btf), read with
 * plain loads; otherwise by probe reads.
 */
static __always_inline int handle(void *ctx, struct sk_buff *skb, __u64 location, __u32 reason,
                                  struct sock *rx_sk, bool direct)
{
	if (bench_empty)
		return 0;
	if (reason != DR_NO_REASON &&
	    bpf_core_enum_value_exists(enum skb_drop_reason, SKB_CONSUMED) &&
	    (reason == bpf_core_enum_value(enum skb_drop_reason, SKB_CONSUMED) ||
	     reason == bpf_core_enum_value(enum skb_drop_reason, SKB_NOT_DROPPED_YET)))
		return 0;
	if (reason_mode && reason != DR_NO_REASON) {
		bool in = bpf_map_lookup_elem(&reason_set, &reason) != NULL;
		if (in != (reason_mode == 1)) {
			stat_add(DR_S_FILTERED);
			return 0;
		}
	}
	location = drop_place(ctx, location);
	__u32 zero = 0;
	struct dr_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	e->location = location;
	e->reason = reason;
	e->flags = 0;
	e->family = 0;
	e->l4 = 0;
	e->sport = e->dport = 0;
	e->tcp_flags = 0;
	e->netns = 0;
	e->ifindex = 0;
	e->pid = 0;
	e->cgroup = 0;
	e->sock_ino = 0;
	e->comm[0] = 0;
	e->ifname[0] = 0;
	struct net_device *dev = KREAD(direct, skb, dev);
	if (dev) {
		e->ifindex = KREAD(direct, dev, ifindex);
		e->netns =
		        direct ? dev->nd_net.net->ns.inum : BPF_CORE_READ(dev, nd_net.net, ns.inum);
	}
	/* A qdisc drop by the noop qdisc stands in for the transmit queue of
	 * an inactive interface: tc counts none of them (the queue's qdisc is
	 * still the noop one while the kernel frees the packet). */
	if (dev && reason != DR_NO_REASON &&
	    bpf_core_enum_value_exists(enum skb_drop_reason, SKB_DROP_REASON_QDISC_DROP) &&
	    reason == bpf_core_enum_value(enum skb_drop_reason, SKB_DROP_REASON_QDISC_DROP)) {
		__u16 qm = KREAD(direct, skb, queue_mapping);
		struct netdev_queue *txq = BPF_CORE_READ(dev, _tx);
		if (txq && qm < BPF_CORE_READ(dev, num_tx_queues)) {
			txq = (void *)txq + (__u64)qm * bpf_core_type_size(struct netdev_queue);
			struct Qdisc *q = BPF_CORE_READ(txq, qdisc);
			if (q && (BPF_CORE_READ(q, flags) & DR_TCQ_F_BUILTIN)) {
				reason |= DR_R_NOOP;
				e->reason = reason;
			}
		}
	}
	struct sock *sk = rx_sk ? rx_sk : KREAD(direct, skb, sk);
	if (sk) {
		e->flags |= DR_F_SOCK;
		if (!e->netns)
			e->netns = direct ? sk->__sk_common.skc_net.net->ns.inum
			                  : BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	}
	e->ethertype = bpf_ntohs(KREAD(direct, skb, protocol));
	/* The filters on the packet. */
	if (n_ifaces) {
		if (dev)
			kcopy(direct, e->ifname, DR_IFNAMSIZ, dev->name);
		if (!dev || !iface_listed(e->ifname)) {
			stat_add(DR_S_FILTERED);
			return 0;
		}
	}
	read_headers(e, KREAD(direct, skb, head), KREAD(direct, skb, network_header), direct);
	if ((n_protos && !proto_listed(e->l4)) || !FLOW_PASS(e)) {
		stat_add(DR_S_FILTERED);
		return 0;
	}
	/* The owner. */
	struct sonde_owner *o = NULL;
	if (sk && (!count_mode || by_cgroup || owner_filtered())) {
		struct socket *so = KREAD(direct, sk, sk_socket);
		struct file *f = so ? (direct ? so->file : BPF_CORE_READ(so, file)) : NULL;
		__u64 ino = f ? (direct ? f->f_inode->i_ino : BPF_CORE_READ(f, f_inode, i_ino)) : 0;
		e->sock_ino = ino;
		if (ino)
			o = bpf_map_lookup_elem(&owners, &ino);
	}
	if (owner_filtered() && !owner_pass(o)) {
		stat_add(DR_S_FILTERED);
		return 0;
	}
	/* Counted always (the summary compares the counts with the kernel's
	 * counters); streamed too unless --count. */
	struct dr_key k = {
	        .location = location,
	        .cgroup = by_cgroup && o ? o->cgroup : 0,
	        .reason = reason,
	        .netns = e->netns,
	        .ifindex = e->ifindex,
	        .ethertype = e->ethertype,
	        .l4 = e->l4,
	};
	count_drop(&k);
	if (count_mode)
		return 0;
	if (!rate_ok()) {
		stat_add(DR_S_RATE_LIMITED);
		return 0;
	}
	if (o) {
		e->pid = o->pid;
		e->cgroup = o->cgroup;
		__builtin_memcpy(e->comm, o->comm, sizeof(e->comm));
		e->flags |= DR_F_OWNER;
	}
	if (dev && !n_ifaces)
		kcopy(direct, e->ifname, DR_IFNAMSIZ, dev->name);
	e->kstack = want_stack ? bpf_get_stackid(ctx, &kstacks, 0) : -1;
	e->ts = bpf_ktime_get_ns();
	void *rb = rb_this_cpu();
	if (!rb || bpf_ringbuf_output(rb, e, sizeof(*e), rb_submit_flags(rb))) {
		stat_add(DR_S_LOST);
		return 0;
	}
	return 0;
}

/* ---- the tracepoint, by mechanism and number of arguments ---- */

SEC("tp_btf/kfree_skb")
int BPF_PROG(drop_btf4, struct sk_buff *skb, void *location, enum skb_drop_reason reason,
             struct sock *rx_sk)
{
	return handle(ctx, skb, (__u64)location, reason, rx_sk, true);
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(drop_btf3, struct sk_buff *skb, void *location, enum skb_drop_reason reason)
{
	return handle(ctx, skb, (__u64)location, reason, NULL, true);
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(drop_btf2, struct sk_buff *skb, void *location)
{
	return handle(ctx, skb, (__u64)location, DR_NO_REASON, NULL, true);
}

SEC("raw_tp/kfree_skb")
int drop_raw4(struct bpf_raw_tracepoint_args *ctx)
{
	return handle(ctx, (struct sk_buff *)ctx->args[0], ctx->args[1], (__u32)ctx->args[2],
	              (struct sock *)ctx->args[3], false);
}

SEC("raw_tp/kfree_skb")
int drop_raw3(struct bpf_raw_tracepoint_args *ctx)
{
	return handle(ctx, (struct sk_buff *)ctx->args[0], ctx->args[1], (__u32)ctx->args[2], NULL,
	              false);
}

SEC("raw_tp/kfree_skb")
int drop_raw2(struct bpf_raw_tracepoint_args *ctx)
{
	return handle(ctx, (struct sk_buff *)ctx->args[0], ctx->args[1], DR_NO_REASON, NULL, false);
}

SEC("tracepoint/skb/kfree_skb")
int drop_tp(struct trace_event_raw_kfree_skb *ctx)
{
	/* The record is the context: its fields are plain loads (CO-RE finds
	 * their offsets on this kernel). */
	__u32 reason = DR_NO_REASON;
	struct sock *rx_sk = NULL;
	if (bpf_core_field_exists(ctx->reason))
		reason = ctx->reason;
	if (bpf_core_field_exists(ctx->rx_sk))
		rx_sk = ctx->rx_sk;
	return handle(ctx, ctx->skbaddr, (__u64)ctx->location, reason, rx_sk, false);
}

/* ---- owners, recorded in process context ---- */

static __always_inline void note_owner(long fd)
{
	struct sock *sk = sock_of_fd(fd);
	if (!sk)
		return;
	__u64 ino = BPF_CORE_READ(sk, sk_socket, file, f_inode, i_ino);
	if (!ino)
		return;
	struct sonde_owner o = {};
	owner_fill_current(&o, bpf_get_current_pid_tgid());
	if (bpf_map_update_elem(&owners, &ino, &o, BPF_ANY))
		stat_add(DR_S_OWNER_FULL);
}

SEC("tracepoint/syscalls/sys_exit_socket")
int owner_socket(struct trace_event_raw_sys_exit *ctx)
{
	note_owner(ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_accept4")
int owner_accept4(struct trace_event_raw_sys_exit *ctx)
{
	note_owner(ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_accept")
int owner_accept(struct trace_event_raw_sys_exit *ctx)
{
	note_owner(ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_bind")
int owner_bind(struct trace_event_raw_sys_enter *ctx)
{
	note_owner(ctx->args[0]);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_connect")
int owner_connect(struct trace_event_raw_sys_enter *ctx)
{
	note_owner(ctx->args[0]);
	return 0;
}
