// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * sonde cwnd: the congestion window of each sending TCP connection over
 * time, and whether a send after idle restarted slow start.
 *
 * Samples come from tcp:tcp_probe, which fires at the top of
 * tcp_rcv_established() for every segment a connection receives, before
 * the segment is processed: snd_cwnd, ssthresh, srtt, packets in flight and
 * the congestion state. A sample is emitted when cwnd, ssthresh or the
 * state changed since the connection's last one, and at most once per
 * --every per connection.
 *
 * Idle restarts: tcp_skb_entail() calls tcp_slow_start_after_idle_check()
 * (inline) for every new skb a send queues. It restarts slow start
 * (tcp_cwnd_restart) unless the sysctl tcp_slow_start_after_idle is 0,
 * packets are out, or the congestion control has its own cong_control hook
 * (bbr); otherwise it does when the time since the last data sent
 * (tp->lsndtime) exceeds the RTO. We evaluate exactly that condition where
 * a send is about to queue a new skb: tp_btf/tcp_sendmsg_locked (just
 * before tcp_skb_entail), or on kernels without that tracepoint at the
 * entry of tcp_sendmsg_locked by fentry or kprobe. The decision is held
 * until the next observation of the socket (a further skb of the send, or
 * the next received segment) shows the cwnd the kernel left, then emitted.
 *
 * State per socket lives in socket storage with typed pointers (tp_btf,
 * fentry) and in a hash keyed by the socket's address otherwise (raw_tp,
 * kprobe), deleted at tcp:tcp_destroy_sock.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "sonde.h"
#include "flow.h"
#include "cwnd.h"
#define SONDE_STATS_MAX STAT_MAX
#include "stats.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by user space before load. */
const volatile bool use_hash = false;
const volatile __u64 every_ns = 0;
/* Also report sends after at least this many jiffies with nothing in
 * flight (--min-idle); 0: only sends idle longer than the RTO. */
const volatile __u32 min_idle_j = 0;
/* sonde serve: count idle sends per congestion control and reason in
 * `idle_counts`; no events. */
const volatile bool count_only = false;
/* ... and per owner cgroup (serve --labels cgroup). */
const volatile bool by_cgroup = false;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096); /* 256 unless by_cgroup */
	__type(key, struct cw_idle_key);
	__type(value, __u64);
} idle_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct cw_conn);
} conns SEC(".maps"); /* raw_tp and kprobe; 1 entry otherwise */

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct cw_conn);
} conn_store SEC(".maps"); /* tp_btf and fentry */

/* Referenced so that the skeleton generates a Rust mirror of the layout. */
struct cw_event _cw_event = {};
struct cw_idle_key _cw_idle_key = {};

/* What we read from a tcp_sock. */
struct tcpvals {
	__u32 cwnd;
	__u32 ssthresh;
	__u32 srtt_us;
	__u32 mdev_us;
	__u32 packets_out;
	__u32 sacked_out;
	__u32 lost_out;
	__u32 retrans_out;
	__u32 snd_wnd;
	__u32 mss;
	__u32 lsndtime;
	__u32 snd_nxt;
	__u32 rto;
	__u8 ca_state;
};

/* The socket as a tcp_sock: a typed struct sock pointer may not be read
 * past struct sock, so the verifier wants it from bpf_skc_to_tcp_sock(). */
static __always_inline const struct tcp_sock *tcp_of(const struct sock *sk, bool typed)
{
	if (typed)
		return bpf_skc_to_tcp_sock((void *)sk);
	return (const void *)sk;
}

static __always_inline __u8 ca_state_of(const struct tcp_sock *tp, bool typed)
{
	const struct inet_connection_sock *icsk = &tp->inet_conn;
	return typed ? BPF_CORE_READ_BITFIELD(icsk, icsk_ca_state)
	             : BPF_CORE_READ_BITFIELD_PROBED(icsk, icsk_ca_state);
}

static __always_inline void read_tcp(const struct tcp_sock *tp, bool typed, struct tcpvals *v)
{
	const struct inet_connection_sock *icsk = &tp->inet_conn;
	v->cwnd = KREAD(typed, tp, snd_cwnd);
	v->ssthresh = KREAD(typed, tp, snd_ssthresh);
	v->srtt_us = KREAD(typed, tp, srtt_us);
	v->mdev_us = KREAD(typed, tp, mdev_us);
	v->packets_out = KREAD(typed, tp, packets_out);
	v->sacked_out = KREAD(typed, tp, sacked_out);
	v->lost_out = KREAD(typed, tp, lost_out);
	v->retrans_out = KREAD(typed, tp, retrans_out);
	v->snd_wnd = KREAD(typed, tp, snd_wnd);
	v->mss = KREAD(typed, tp, mss_cache);
	v->lsndtime = KREAD(typed, tp, lsndtime);
	v->snd_nxt = KREAD(typed, tp, snd_nxt);
	v->rto = KREAD(typed, icsk, icsk_rto);
	v->ca_state = ca_state_of(tp, typed);
}

static __always_inline void set_wanted(struct cw_conn *c)
{
	c->wanted = c->flow_ok && owner_pass(c->has_owner ? &c->owner : NULL);
}

/* The state of a socket; made when `create` (the socket sends). */
static __always_inline struct cw_conn *conn_get(const struct sock *sk, bool typed, bool create)
{
	struct cw_conn *c;
	__u64 key = (__u64)sk;
	if (typed && !use_hash) {
		c = bpf_sk_storage_get(&conn_store, (struct sock *)sk, 0, 0);
		if (c || !create)
			return c;
		c = bpf_sk_storage_get(&conn_store, (struct sock *)sk, 0,
		                       BPF_SK_STORAGE_GET_F_CREATE);
	} else {
		c = bpf_map_lookup_elem(&conns, &key);
		if (c || !create)
			return c;
		struct cw_conn zero = {};
		bpf_map_update_elem(&conns, &key, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&conns, &key);
	}
	if (!c) {
		stat_add(STAT_CONN_FULL);
		return NULL;
	}
	if (c->init)
		return c;
	/* Two CPUs may both get here for a new socket: they write the same. */
	c->init = 1;
	__u16 family = KREAD(typed, sk, __sk_common.skc_family);
	FLOW_FILL(&c->flow, &sk->__sk_common, family, typed);
	c->flow_ok = FLOW_PASS(&c->flow);
	if (typed)
		c->cookie = bpf_get_socket_cookie((void *)sk);
	else
		c->cookie = BPF_CORE_READ(sk, __sk_common.skc_cookie.counter);
	set_wanted(c);
	return c;
}

static __always_inline void fill_event(struct cw_event *e, const struct cw_conn *c,
                                       const struct tcpvals *v, __u8 type)
{
	e->ts_ns = bpf_ktime_get_ns();
	e->cookie = c->cookie;
	e->flow = c->flow;
	e->owner = c->owner;
	e->has_owner = c->has_owner;
	e->type = type;
	e->ca_state = v->ca_state;
	e->confirmed_by = 0;
	e->cwnd = v->cwnd;
	e->ssthresh = v->ssthresh;
	e->srtt_us = v->srtt_us >> 3;
	e->rttvar_us = v->mdev_us >> 2;
	e->packets_out = v->packets_out;
	e->inflight = v->packets_out - (v->sacked_out + v->lost_out) + v->retrans_out;
	e->snd_wnd = v->snd_wnd;
	e->mss = v->mss;
	e->pad = 0;
	__builtin_memcpy(e->cc, c->cc, CC_NAME_LEN);
}

static __always_inline struct cw_event *reserve(void **rbp)
{
	void *rb = rb_this_cpu();
	if (!rb) {
		stat_add(STAT_LOST);
		return NULL;
	}
	struct cw_event *e = bpf_ringbuf_reserve(rb, sizeof(*e), 0);
	if (!e) {
		stat_add(STAT_LOST);
		return NULL;
	}
	*rbp = rb;
	return e;
}

/* Emits the held idle send with the cwnd observed now. */
static __always_inline void emit_idle(struct cw_conn *c, const struct tcpvals *v, __u8 by)
{
	c->pending = 0;
	stat_add(STAT_IDLE_SENDS);
	if (c->idle.reason == REASON_RESTART)
		stat_add(STAT_RESTARTS);
	if (count_only)
		return;
	void *rb;
	struct cw_event *e = reserve(&rb);
	if (!e)
		return;
	fill_event(e, c, v, CW_IDLE_SEND);
	e->confirmed_by = by;
	e->idle = c->idle;
	bpf_ringbuf_submit(e, rb_submit_flags(rb));
}

/* tcp:tcp_probe: a segment arrived on an established socket. */
static __always_inline int on_probe(const struct sock *sk, bool typed)
{
	const struct tcp_sock *tp = tcp_of(sk, typed);
	if (!tp) {
		stat_add(STAT_UNREADABLE);
		return 0;
	}
	/* A socket we have not seen send gets state once it has data out;
	 * pure receivers cost one lookup. */
	__u32 out = KREAD(typed, tp, packets_out);
	struct cw_conn *c = conn_get(sk, typed, out > 0);
	if (!c)
		return 0;
	if (!c->wanted) {
		stat_add(STAT_FILTERED);
		return 0;
	}
	struct tcpvals v;
	if (c->pending) {
		read_tcp(tp, typed, &v);
		emit_idle(c, &v, BY_ACK);
	}
	stat_add(STAT_PROBES);
	/* Most segments change nothing: three fields decide, the rest are read
	 * only for a sample (a probe read each without BTF). */
	__u32 cwnd = KREAD(typed, tp, snd_cwnd), ssthresh = KREAD(typed, tp, snd_ssthresh);
	__u8 ca = ca_state_of(tp, typed);
	if (c->emitted && cwnd == c->last_cwnd && ssthresh == c->last_ssthresh &&
	    ca == c->last_ca) {
		stat_add(STAT_UNCHANGED);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	if (every_ns && c->emitted && now - c->last_emit_ns < every_ns) {
		stat_add(STAT_RATE_LIMITED);
		return 0;
	}
	read_tcp(tp, typed, &v);
	c->emitted = 1;
	c->last_emit_ns = now;
	c->last_cwnd = v.cwnd;
	c->last_ssthresh = v.ssthresh;
	c->last_ca = v.ca_state;
	stat_add(STAT_SAMPLES);
	void *rb;
	struct cw_event *e = reserve(&rb);
	if (!e)
		return 0;
	fill_event(e, c, &v, CW_SAMPLE);
	__builtin_memset(&e->idle, 0, sizeof(e->idle));
	bpf_ringbuf_submit(e, rb_submit_flags(rb));
	return 0;
}

/* A send is about to queue a new skb (tcp_skb_entail, which runs the idle
 * check). Runs in the sender's process context. */
static __always_inline int on_send(const struct sock *sk, bool typed)
{
	struct cw_conn *c = conn_get(sk, typed, true);
	if (!c)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	if (!c->has_owner || c->owner.tid != (__u32)id) {
		owner_fill_current(&c->owner, id);
		c->has_owner = 1;
		set_wanted(c);
	}
	if (!c->wanted) {
		stat_add(STAT_FILTERED);
		return 0;
	}
	const struct tcp_sock *tp = tcp_of(sk, typed);
	if (!tp) {
		stat_add(STAT_UNREADABLE);
		return 0;
	}
	struct tcpvals v;
	read_tcp(tp, typed, &v);
	if (c->pending)
		emit_idle(c, &v, BY_SEND);
	stat_add(STAT_SENDS);
	/* Once per idle period: snd_nxt moves when new data is sent, and every
	 * skb queued at an evaluation is sent before the next period. (Not
	 * lsndtime: in jiffies, a burst's last send often falls in the jiffy
	 * of its last evaluation, which hid the next period.) */
	if (c->evaluated && c->eval_snd_nxt == v.snd_nxt)
		return 0;
	c->evaluated = 1;
	c->eval_snd_nxt = v.snd_nxt;

	/* The kernel: s32 delta = tcp_jiffies32 - lsndtime; if (delta > icsk_rto),
	 * an unsigned comparison. */
	__u32 idle = (__u32)bpf_jiffies64() - v.lsndtime;
	bool long_idle = idle > v.rto;
	if (!long_idle && !(min_idle_j && v.packets_out == 0 && idle >= min_idle_j))
		return 0;

	const struct inet_connection_sock *icsk = &tp->inet_conn;
	const struct tcp_congestion_ops *ops = KREAD(typed, icsk, icsk_ca_ops);
	bool cong_control = BPF_CORE_READ(ops, cong_control) != NULL;
	bpf_probe_read_kernel_str(c->cc, sizeof(c->cc), &ops->name);
	__u8 sysctl =
	        BPF_CORE_READ(sk, __sk_common.skc_net.net, ipv4.sysctl_tcp_slow_start_after_idle);

	__u8 reason;
	if (!sysctl)
		reason = REASON_SYSCTL;
	else if (v.packets_out)
		reason = REASON_IN_FLIGHT;
	else if (cong_control)
		reason = REASON_CONG_CONTROL;
	else if (!long_idle)
		reason = REASON_IDLE_SHORT;
	else
		reason = REASON_RESTART;

	c->idle.ts_ns = bpf_ktime_get_ns();
	c->idle.idle_j = idle;
	c->idle.rto_j = v.rto;
	c->idle.cwnd = v.cwnd;
	c->idle.ssthresh = v.ssthresh;
	c->idle.packets_out = v.packets_out;
	c->idle.reason = reason;
	c->idle.sysctl = sysctl;
	c->idle.cong_control = cong_control;
	if (count_only) {
		/* Counted at the decision: nothing waits for the cwnd after it. */
		struct cw_idle_key k = {.reason = reason};
		__builtin_memcpy(k.cc, c->cc, sizeof(k.cc));
		if (by_cgroup && c->has_owner)
			k.cgroup = c->owner.cgroup;
		__u64 one = 1, *n = bpf_map_lookup_elem(&idle_counts, &k);
		if (n)
			__sync_fetch_and_add(n, 1);
		else if (bpf_map_update_elem(&idle_counts, &k, &one, BPF_NOEXIST))
			stat_add(STAT_CONN_FULL);
		return 0;
	}
	c->pending = 1;
	return 0;
}

/* Flushes a held idle send when its socket goes away. */
static __always_inline int on_destroy(const struct sock *sk, bool typed)
{
	struct cw_conn *c = conn_get(sk, typed, false);
	if (!c)
		return 0;
	if (c->pending) {
		const struct tcp_sock *tp = tcp_of(sk, typed);
		if (tp) {
			struct tcpvals v;
			read_tcp(tp, typed, &v);
			emit_idle(c, &v, BY_CLOSE);
		}
	}
	if (!typed || use_hash) {
		__u64 key = (__u64)sk;
		bpf_map_delete_elem(&conns, &key);
	}
	return 0;
}

SEC("tp_btf/tcp_probe")
int BPF_PROG(btf_probe, struct sock *sk, struct sk_buff *skb)
{
	return on_probe(sk, true);
}

SEC("raw_tp/tcp_probe")
int BPF_PROG(raw_probe, struct sock *sk, struct sk_buff *skb)
{
	return on_probe(sk, false);
}

/* skb is the write queue's tail (may be NULL): a new skb is queued when
 * there is none or it is full (or cannot take more, which we do not see;
 * the next hit then evaluates). */
static __always_inline bool entails(const struct sk_buff *skb, int size_goal, bool typed)
{
	if (!skb)
		return true;
	int len = KREAD(typed, skb, len);
	return size_goal - len <= 0;
}

SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(btf_send, struct sock *sk, struct msghdr *msg, struct sk_buff *skb, int size_goal)
{
	if (!entails(skb, size_goal, true))
		return 0;
	return on_send(sk, true);
}

SEC("raw_tp/tcp_sendmsg_locked")
int BPF_PROG(raw_send, struct sock *sk, struct msghdr *msg, struct sk_buff *skb, int size_goal)
{
	if (!entails(skb, size_goal, false))
		return 0;
	return on_send(sk, false);
}

/* Kernels without the tracepoint: the send's entry, before anything is queued. */
SEC("fentry/tcp_sendmsg_locked")
int BPF_PROG(fentry_send, struct sock *sk)
{
	return on_send(sk, true);
}

SEC("kprobe/tcp_sendmsg_locked")
int BPF_KPROBE(kprobe_send, struct sock *sk)
{
	return on_send(sk, false);
}

SEC("tp_btf/tcp_destroy_sock")
int BPF_PROG(btf_destroy, struct sock *sk)
{
	return on_destroy(sk, true);
}

SEC("raw_tp/tcp_destroy_sock")
int BPF_PROG(raw_destroy, struct sock *sk)
{
	return on_destroy(sk, false);
}
