// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * A TCP retransmission as the tcp_retransmit_skb tracepoint shows it: the
 * flow, what the event reads from the socket and the skb, and its cause.
 * Written once for every program that reads one: sonde retrans, its bench
 * baselines (so they read exactly what sonde reads) and sonde why (the
 * retransmissions on the connections a process waited on).
 */
#ifndef SONDE_TCPRETRANS_H
#define SONDE_TCPRETRANS_H

#include "flow.h"

enum retrans_kind {
	KIND_RTO = 0,
	KIND_TLP = 1,
	KIND_FAST = 2,
	KIND_LOSS_RECOVERY = 3,
	KIND_SYN = 4,
	KIND_SYNACK = 5,
	KIND_FAILED = 6,
	KIND_MAX = 7,
};

struct rt_flow {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport;
	__u16 dport;
	__u16 family;
	__u8 kind;
	__u8 pad;
	__u32 netns; /* inode of the socket's network namespace */
};

#define TCP_ESTABLISHED      1
#define TCP_SYN_SENT         2
#define TCP_SYN_RECV         3
#define TCP_CLOSE            7
#define TCP_LISTEN           10
#define ICSK_TIME_LOSS_PROBE 5
#define CA_OPEN              0
#define CA_CWR               2
#define CA_LOSS              4

/* The cause (see the shared notes). */
static __always_inline __u8 rt_classify(int err, __u8 state, __u8 ca_state, __u8 pending)
{
	if (err)
		return KIND_FAILED;
	if (state == TCP_SYN_SENT)
		return KIND_SYN;
	if (state == TCP_SYN_RECV)
		return KIND_SYNACK;
	if (pending == ICSK_TIME_LOSS_PROBE && (ca_state == CA_OPEN || ca_state == CA_CWR))
		return KIND_TLP;
	if (ca_state == CA_LOSS)
		return pending == 0 ? KIND_RTO : KIND_LOSS_RECOVERY;
	return KIND_FAST;
}

/* One retransmit as read at the tracepoint. */
struct rt_read {
	struct rt_flow flow; /* with kind */
	struct tcp_sock *tp; /* NULL unless `direct` */
	__u16 segs;
	__u8 state;
	__u8 ca_state;
	__u8 pending;
};

/* Reads the event of (sk, skb, err); false if sk is no tcp_sock (typed
 * pointers only). `direct`: sk and skb are BTF pointers (tp_btf). */
static __always_inline bool rt_read_event(const struct sock *sk, const struct sk_buff *skb, int err,
                                          bool direct, struct rt_read *r)
{
	FLOW_FILL(&r->flow, &sk->__sk_common, KREAD(direct, sk, __sk_common.skc_family), direct);

	/* A typed struct sock pointer may not be read past struct sock: the
	 * verifier wants the tcp_sock it is, from bpf_skc_to_tcp_sock(). */
	const struct inet_connection_sock *icsk = (const void *)sk;
	r->tp = NULL;
	if (direct) {
		r->tp = bpf_skc_to_tcp_sock((void *)sk);
		if (!r->tp)
			return false;
		icsk = &r->tp->inet_conn;
	}
	r->state = KREAD(direct, sk, __sk_common.skc_state);
	r->ca_state = direct ? BPF_CORE_READ_BITFIELD(icsk, icsk_ca_state)
	                     : BPF_CORE_READ_BITFIELD_PROBED(icsk, icsk_ca_state);
	r->pending = KREAD(direct, icsk, icsk_pending);

	/* Segments this skb carries: TCP_SKB_CB(skb)->tcp_gso_segs. */
	const struct tcp_skb_cb *cb = (const void *)__builtin_preserve_access_index(&skb->cb);
	r->segs = KREAD(direct, cb, tcp_gso_segs);
	if (!r->segs)
		r->segs = 1;
	r->flow.kind = rt_classify(err, r->state, r->ca_state, r->pending);
	return true;
}

#endif
