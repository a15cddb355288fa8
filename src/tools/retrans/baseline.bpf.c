// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Bench baselines for sonde retrans (bench/retrans/run, hidden flag
 * `sonde retrans --bench-baseline NAME`): programs on the same tracepoint
 * that do a known part of sonde's work, so the bench can say what on this
 * host the rest of sonde's in-kernel cost is made of.
 *
 *   base_empty   returns at once: what bpf_stats measures for nothing
 *   base_fields  reads the event as sonde does (tcpretrans.h), stamps it with
 *                bpf_ktime_get_ns() and stores it in this CPU's slots: the
 *                least any program delivering these events does (no owner
 *                record, no ring buffer, no totals)
 *   base_ring    the same, sent through sonde's per-CPU ring buffers and
 *                read by user space as sonde's are
 *   base_owner   the same with the owner of the socket, from a record in
 *                socket storage made at connect (base_owner_made), as
 *                sonde keeps it
 *
 * sonde's handler = base_owner + the account of the socket's segments and
 * the filters (and totals, for events that do not reach user space).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "sonde.h"
#include "flow.h"
#include "retrans.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define SLOTS 64

struct base_slots {
	__u64 n;
	struct rt_event ev[SLOTS]; /* only the part before kstack is written */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct base_slots);
} base_store SEC(".maps");

/* What every baseline that reads writes: the fields of sonde's event. */
static __always_inline void fill(struct rt_event *e, const struct rt_read *r)
{
	e->ts_ns = bpf_ktime_get_ns();
	e->flow = r->flow;
	e->has_owner = 0;
	e->err = 0;
	e->segs = r->segs;
	e->state = r->state;
	e->ca_state = r->ca_state;
	e->pending = r->pending;
	e->nr_kstack = 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(base_empty)
{
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(base_fields, const struct sock *sk, const struct sk_buff *skb)
{
	struct rt_read r = {};
	if (!rt_read_event(sk, skb, 0, true, &r))
		return 0;
	__u32 zero = 0;
	struct base_slots *s = bpf_map_lookup_elem(&base_store, &zero);
	if (!s)
		return 0;
	__u32 i = s->n++ & (SLOTS - 1);
	fill(&s->ev[i], &r);
	return 0;
}

/* The owner, recorded in process context when the socket connects. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sonde_owner);
} base_owners SEC(".maps");

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(base_owner_made, const struct sock *sk, const int oldstate, const int newstate)
{
	if (newstate != TCP_SYN_SENT)
		return 0;
	struct sonde_owner *o =
	        bpf_sk_storage_get(&base_owners, (struct sock *)sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (o)
		owner_fill_current(o, bpf_get_current_pid_tgid());
	return 0;
}

/* base_ring and base_owner: the event through the ring buffers, with its
 * socket's owner if `with_owner`. */
static __always_inline int ring_event(const struct sock *sk, const struct sk_buff *skb,
                                      bool with_owner)
{
	struct rt_read r = {};
	if (!rt_read_event(sk, skb, 0, true, &r))
		return 0;
	void *rb = rb_this_cpu();
	if (!rb)
		return 0;
	struct rt_event *e = bpf_ringbuf_reserve(rb, EVENT_BASE_SIZE, 0);
	if (!e)
		return 0;
	fill(e, &r);
	const struct sonde_owner *o = NULL;
	if (with_owner)
		o = bpf_sk_storage_get(&base_owners, (struct sock *)sk, 0, 0);
	if (o) {
		e->owner = *o;
		e->has_owner = 1;
	} else {
		__builtin_memset(&e->owner, 0, sizeof(e->owner));
	}
	bpf_ringbuf_submit(e, rb_submit_flags(rb));
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(base_ring, const struct sock *sk, const struct sk_buff *skb)
{
	return ring_event(sk, skb, false);
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(base_owner, const struct sock *sk, const struct sk_buff *skb)
{
	return ring_event(sk, skb, true);
}
