// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * sonde retrans: every TCP retransmission with its cause.
 *
 * Hook: the tcp:tcp_retransmit_skb tracepoint (it sees TLPs, which a probe on
 * tcp_retransmit_skb never does) in three flavours picked by user space:
 * tp_btf, raw_tp and the classic tracepoint, each with and without the `err`
 * argument. SYN-ACKs of request sockets come from tcp:tcp_retransmit_synack.
 *
 * Cause, read from the socket at the tracepoint (see shared notes):
 *   err != 0                          -> failed (did not go out)
 *   SYN_SENT                          -> syn
 *   SYN_RECV (fast open child)        -> synack
 *   pending LOSS_PROBE, Open/CWR      -> tlp
 *   ca_state Loss, pending 0          -> rto (first retransmit from the timer)
 *   ca_state Loss, otherwise          -> loss_recovery
 *   anything else                     -> fast (fast retransmit / RACK)
 * (src/bpf/tcpretrans.h, shared with the bench baselines and sonde why).
 *
 * Retransmits run in softirq/timer context, so the owner is recorded in
 * process context (connect, listen, sendmsg, accept) and looked up there.
 * With tp_btf the record lives in the socket itself (socket-local storage:
 * one pointer away, freed with the socket, inherited by accepted children
 * from their listener); raw_tp and classic tracepoints have untyped socket
 * pointers, so there it is a hash map keyed by the socket's address.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "sonde.h"
#include "flow.h"
#include "sockfd.h"
#include "retrans.h"
#define SONDE_STATS_MAX STAT_MAX
#include "stats.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Errors __tcp_retransmit_skb returns before it adds to the counters: the
 * original still in a host queue, window closed, trimming or splitting out of
 * memory, no route. The transmit after the counters fails otherwise (ENOBUFS,
 * EPERM from a filter, NET_XMIT_DROP). */
#define EBUSY        16
#define EINVAL       22
#define EAGAIN       11
#define ENOMEM       12
#define EHOSTUNREACH 113

/* Filters and modes, set by user space before load. */
const volatile bool want_stack = false;
const volatile bool count_mode = false;
const volatile bool want_failed = false;
const volatile __u32 kind_mask = 0;
/* sonde serve: totals only (no per-flow table); `by_cgroup` adds per owner
 * cgroup and kind counts in `groups`. */
const volatile bool flows_off = false;
const volatile bool by_cgroup = false;

/* Failed attempts by -err (errnos), or MAX_ERRNO + err (transmit verdicts), per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ERR_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} errs SEC(".maps");

/* Events --netns filtered out, per namespace they were in (the summary
 * names them, so a namespace missing from the list shows). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u64);
} filtered_netns SEC(".maps");

const volatile bool use_slots = false; /* the kernel has compare-and-exchange (5.12) */
const volatile __u32 slot_mask = 0;    /* flow_slots' max_entries - 1 (a power of two) */

/* --count: the flows' slots (retrans.h; max_entries set by user space in
 * count mode). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rt_flow_slot);
} flow_slots SEC(".maps");

/* Referenced so that the skeleton generates a Rust mirror of the layout. */
struct rt_flow_slot _rt_flow_slot = {};

/* --count: allocated as flows appear (the seed load has 80k SYN_SENT flows);
 * the flows the slots have no room for. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 262144);
	__type(key, struct rt_flow);
	__type(value, struct rt_flow_stats);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 131072);
	__type(key, __u64);
	__type(value, struct rt_sock);
} owners SEC(".maps"); /* raw_tp and tracepoint; shrunk to 1 entry for tp_btf */

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC | BPF_F_CLONE);
	__type(key, int);
	__type(value, struct rt_sock);
} owner_store SEC(".maps"); /* tp_btf */

/* sonde serve --labels cgroup: events and segments per owner cgroup (0: no
 * owner known) and kind. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct rt_group);
	__type(value, struct rt_group_stats);
} groups SEC(".maps");

/* Referenced so that the skeleton generates Rust mirrors of these layouts. */
struct rt_event _rt_event = {};
struct rt_flow_stats _rt_flow_stats = {};
struct rt_group _rt_group = {};
struct rt_group_stats _rt_group_stats = {};

/* ---- per-socket records: owner and retransmit accounting ---- */

/* The record of a socket, made if `create` and there is none. `typed`: sk
 * is a BTF pointer (tp_btf). */
static __always_inline struct rt_sock *sock_rec(const struct sock *sk, bool typed, bool create)
{
	if (typed)
		return bpf_sk_storage_get(&owner_store, (struct sock *)sk, 0,
		                          create ? BPF_SK_STORAGE_GET_F_CREATE : 0);
	__u64 key = (__u64)sk;
	struct rt_sock *r = bpf_map_lookup_elem(&owners, &key);
	if (r || !create)
		return r;
	struct rt_sock zero = {};
	bpf_map_update_elem(&owners, &key, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&owners, &key);
}

static __always_inline struct rt_sock *sock_rec_made(const struct sock *sk, bool typed)
{
	struct rt_sock *r = sock_rec(sk, typed, true);
	if (!r)
		stat_add(STAT_OWNER_FULL);
	return r;
}

static __always_inline const struct sonde_owner *owner_in(const struct rt_sock *r)
{
	return r && r->has_owner ? &r->owner : NULL;
}

/* tcp_sock.total_retrans: every segment __tcp_retransmit_skb handed to the
 * device (or tried to, after its early checks), SYN-ACKs of fast open. */
static __always_inline __u32 total_retrans_of(const struct sock *sk, bool typed)
{
	if (typed) {
		struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);
		return tp ? tp->total_retrans : 0;
	}
	return BPF_CORE_READ((const struct tcp_sock *)sk, total_retrans);
}

/* At a state change: the socket's counter is `total` now. What it gained
 * since the last state change beyond what events saw went out unseen; only
 * counted for flows the filters pass (`count`), the base moves either way. */
static __always_inline void account(struct rt_sock *r, __u32 total, bool count)
{
	if (r->has_base && count) {
		__u32 d = total - r->base;
		if (d > r->seen)
			stat_add_n(STAT_UNSEEN_SEGS, d - r->seen);
	}
	r->base = total;
	r->seen = 0;
	r->has_base = 1;
}

static __always_inline struct rt_sock *record_owner(const struct sock *sk, bool typed)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct rt_sock *r = sock_rec_made(sk, typed);
	if (r && !(r->has_owner && r->owner.tid == (__u32)id)) {
		owner_fill_current(&r->owner, id);
		r->has_owner = 1;
	}
	return r;
}

/* Sends cover sockets created before sonde started (whose account starts
 * at their first send), handed to another process, or accepted (which start
 * with their listener's owner). */
SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(btf_sendmsg, const struct sock *sk)
{
	struct rt_sock *r = record_owner(sk, true);
	if (r && !r->has_base)
		account(r, total_retrans_of(sk, true), false);
	return 0;
}

/* Every TCP state change: the owner at connect() and listen() (process
 * context), the accounting base of new sockets (a client's counter starts
 * at 0; a child's at its SYN-ACK retransmits, which the SYN-ACK tracepoint
 * saw, so it is taken when the handshake completes), and on any other
 * change the unseen retransmits since the socket's last hook. */
static __always_inline void on_set_state(const struct sock *sk, int oldstate, int newstate,
                                         bool typed)
{
	struct rt_sock *r = NULL;
	if (newstate == TCP_SYN_SENT || newstate == TCP_LISTEN) {
		r = record_owner(sk, typed);
		if (r && newstate == TCP_SYN_SENT)
			account(r, total_retrans_of(sk, typed), false);
	} else if (oldstate == TCP_SYN_RECV && newstate == TCP_ESTABLISHED) {
		r = sock_rec_made(sk, typed);
		if (r)
			account(r, total_retrans_of(sk, typed), false);
	} else {
		r = sock_rec(sk, typed, false);
		if (r) {
			__u32 total = total_retrans_of(sk, typed);
			/* The filters only when there is something to count (rare). */
			bool count = false;
			if (r->has_base && total - r->base > r->seen) {
				struct rt_flow f = {};
				FLOW_FILL(&f, &sk->__sk_common,
				          KREAD(typed, sk, __sk_common.skc_family), typed);
				count = FLOW_PASS(&f) && owner_pass(owner_in(r));
			}
			account(r, total, count);
		}
	}
	if (!typed && newstate == TCP_CLOSE) {
		__u64 key = (__u64)sk;
		bpf_map_delete_elem(&owners, &key);
	}
}

SEC("tracepoint/sock/inet_sock_set_state")
int tp_set_state(struct trace_event_raw_inet_sock_set_state *ctx)
{
	if (ctx->protocol != IPPROTO_TCP)
		return 0;
	on_set_state(ctx->skaddr, ctx->oldstate, ctx->newstate, false);
	return 0;
}

/* The same with socket storage, which the socket frees itself. */
SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(btf_set_state, const struct sock *sk, const int oldstate, const int newstate)
{
	if (sk->sk_protocol != IPPROTO_TCP)
		return 0;
	on_set_state(sk, oldstate, newstate, true);
	return 0;
}

/* accept() returns a socket created in softirq: resolve the fd to its sock. */
static __always_inline void owner_from_fd(long fd)
{
	struct sock *sk = sock_of_fd(fd);
	if (sk)
		record_owner(sk, false);
}

SEC("tracepoint/syscalls/sys_exit_accept4")
int tp_accept4(struct trace_event_raw_sys_exit *ctx)
{
	owner_from_fd(ctx->ret);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_accept")
int tp_accept(struct trace_event_raw_sys_exit *ctx)
{
	owner_from_fd(ctx->ret);
	return 0;
}

/* ---- filters ---- */

static __always_inline bool pass_filters(const struct rt_flow *f, const struct sonde_owner *o)
{
	if (kind_mask && !(kind_mask & (1u << f->kind)))
		return false;
	return FLOW_PASS(f) && owner_pass(o);
}

/* ---- the retransmit itself ---- */

/* Adds an event's segments to its socket's account (see struct rt_sock).
 * `here`: what the attempt added to the socket's counter. */
static __always_inline void note_seen(struct rt_sock *r, const struct sock *sk,
                                      const struct tcp_sock *tp, bool typed, __u32 here)
{
	if (!r || !here)
		return;
	if (r->has_base) {
		r->seen += here;
		return;
	}
	/* A socket older than sonde: its account starts here. */
	r->base = typed ? tp->total_retrans
	                : BPF_CORE_READ((const struct tcp_sock *)sk, total_retrans);
	r->seen = here;
	r->has_base = 1;
}

/* Did this attempt reach the counters? Errors from the checks before them:
 * no; from the transmit after them: yes. */
static __always_inline __u32 counted_segs(int err, __u32 segs)
{
	if (err == -EBUSY || err == -EAGAIN || err == -EINVAL || err == -ENOMEM ||
	    err == -EHOSTUNREACH)
		return 0;
	return segs;
}

/* Events dropped by the filters: counted, and per namespace for --netns. */
static __always_inline void filtered(const struct rt_flow *f, __u32 segs)
{
	stat_add(STAT_FILTERED);
	stat_add_n(STAT_FILTERED_SEGS, segs);
	if (n_netns && !IN_LIST(netns_ids, n_netns, FLOW_MAX_NETNS, f->netns)) {
		__u64 one = 1, *c = bpf_map_lookup_elem(&filtered_netns, &f->netns);
		if (c)
			__sync_fetch_and_add(c, 1);
		else
			bpf_map_update_elem(&filtered_netns, &f->netns, &one, BPF_NOEXIST);
	}
}

/* An event that does not reach user space: its kind's totals (see emit). */
static __always_inline void unread_total(__u8 kind, __u32 segs)
{
	stat_add(STAT_COUNT + kind);
	stat_add_n(STAT_SEGS + kind, segs);
}

/* Adds an event to its owner cgroup's counts (serve's cgroup labels). */
static __always_inline void count_group(const struct sonde_owner *o, __u8 kind, __u32 segs)
{
	struct rt_group g = {.cgroup = o ? o->cgroup : 0, .kind = kind};
	struct rt_group_stats *gs = bpf_map_lookup_elem(&groups, &g);
	if (!gs) {
		struct rt_group_stats init = {};
		bpf_map_update_elem(&groups, &g, &init, BPF_NOEXIST);
		gs = bpf_map_lookup_elem(&groups, &g);
		if (!gs) {
			stat_add(STAT_GROUP_FULL);
			return;
		}
	}
	__sync_fetch_and_add(&gs->count, 1);
	__sync_fetch_and_add(&gs->segs, segs);
}

/* Counts an event in its flow's slot (retrans.h): false when the flow's
 * neighbourhood of slots is full (the caller counts it in the hash). */
static __always_inline bool count_in_slots(const struct rt_flow *f, const struct sonde_owner *o,
                                           __u8 state, __u32 segs)
{
	const __u32 *w = (const __u32 *)f;
	__u64 h = 0;
#pragma unroll
	for (int i = 0; i < (int)(sizeof(*f) / 4); i++)
		h = (h ^ w[i]) * 0x9E3779B97F4A7C15ULL;
	__u32 at = (__u32)(h >> 32);
#pragma unroll
	for (int p = 0; p < RT_SLOT_PROBES; p++) {
		__u32 idx = (at + p) & slot_mask;
		struct rt_flow_slot *s = bpf_map_lookup_elem(&flow_slots, &idx);
		if (!s)
			return false;
		__u64 st = s->state;
		if (st == 2) {
			const __u32 *k = (const __u32 *)&s->key;
			bool same = true;
#pragma unroll
			for (int i = 0; i < (int)(sizeof(*f) / 4); i++)
				same = same && k[i] == w[i];
			if (!same)
				continue;
			__sync_fetch_and_add(&s->stats.count, 1);
			__sync_fetch_and_add(&s->stats.segs, segs);
			s->stats.state = state;
			return true;
		}
		if (st == 0 && __sync_val_compare_and_swap(&s->state, 0, 1) == 0) {
			__builtin_memcpy(&s->key, f, sizeof(*f));
			if (o)
				s->stats.owner = *o;
			s->stats.has_owner = o != NULL;
			s->stats.state = state;
			s->stats.segs = segs;
			s->stats.count = 1;
			/* Published after its key (a full barrier). */
			__sync_fetch_and_add(&s->state, 1);
			return true;
		}
	}
	return false;
}

/* Filters the event, counts it, and sends it or adds it to its --count
 * flow. `sk` owns the flow (the listener for a SYN-ACK); `acct`: the event
 * is the socket's own retransmit (not a SYN-ACK of one of its requests), so
 * its account takes it. */
static __always_inline void emit(void *ctx, struct rt_flow *f, __u32 segs, int err, __u8 state,
                                 __u8 ca_state, __u8 pending, const struct sock *sk,
                                 const struct tcp_sock *tp, bool typed, bool acct)
{
	struct sonde_owner none = {};
	__u32 here = acct ? counted_segs(err, segs) : 0;
	/* The socket's record (owner, account): one lookup site, never making a
	 * record (making one in softirq for a socket older than sonde is an
	 * allocation: with 80k such sockets each event cost ~180 ns more; those
	 * get theirs at their first send or state change). First only when an
	 * owner filter needs it; after the filters, not for early failures
	 * (`here` 0) nobody prints. Filtered flows keep no account (their
	 * unseen segments are not counted either). */
	struct rt_sock *r = NULL;
	bool looked = owner_filtered();
	if (looked)
		r = sock_rec(sk, typed, false);
	if (!pass_filters(f, owner_in(r))) {
		filtered(f, segs);
		return;
	}
	if (!looked && (here || !err || want_failed))
		r = sock_rec(sk, typed, false);
	note_seen(r, sk, tp, typed, here);
	const struct sonde_owner *o = owner_in(r);

	/* Per-kind totals: user space counts the events it reads from the
	 * rings (after detaching, it drains them); every other path counts
	 * here (unread_total), so the summary is exact whatever the rings lost. */
	if (err) {
		/* Negative: an errno; positive: a qdisc or device verdict
		 * (NET_XMIT_DROP), in the slots after the errnos. */
		__u32 e = err < 0 ? (__u32)(-err) : MAX_ERRNO + (__u32)err;
		if (e < ERR_SLOTS) {
			__u64 *p = bpf_map_lookup_elem(&errs, &e);
			if (p)
				*p += 1;
		}
		if (!want_failed) {
			unread_total(f->kind, segs);
			return;
		}
	}

	if (count_mode) {
		unread_total(f->kind, segs);
		if (by_cgroup)
			count_group(o, f->kind, segs);
		if (flows_off)
			return;
		if (use_slots && count_in_slots(f, o, state, segs))
			return;
		struct rt_flow_stats *fs = bpf_map_lookup_elem(&flows, f);
		if (!fs) {
			struct rt_flow_stats init = {};
			if (o)
				init.owner = *o;
			init.has_owner = o != NULL;
			init.state = state;
			/* Another CPU may insert the same flow first: then look it up again. */
			bpf_map_update_elem(&flows, f, &init, BPF_NOEXIST);
			fs = bpf_map_lookup_elem(&flows, f);
			if (!fs) {
				stat_add(STAT_FLOW_FULL);
				return;
			}
		}
		__sync_fetch_and_add(&fs->count, 1);
		__sync_fetch_and_add(&fs->segs, segs);
		fs->state = state;
		return;
	}

	/* No ring for this CPU or a full one: the event is lost. */
	void *rb = rb_this_cpu();
	struct rt_event *e = NULL;
	if (rb)
		e = bpf_ringbuf_reserve(rb, want_stack ? sizeof(struct rt_event) : EVENT_BASE_SIZE,
		                        0);
	if (!e) {
		unread_total(f->kind, segs);
		stat_add(STAT_LOST);
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->flow = *f;
	if (o)
		e->owner = *o;
	else
		e->owner = none;
	e->has_owner = o != NULL;
	e->err = err;
	e->segs = segs;
	e->state = state;
	e->ca_state = ca_state;
	e->pending = pending;
	e->nr_kstack = 0;
	if (want_stack) {
		long n = bpf_get_stack(ctx, e->kstack, sizeof(e->kstack), 0);
		e->nr_kstack = n > 0 ? n : 0;
	}
	bpf_ringbuf_submit(e, rb_submit_flags(rb));
}

static __always_inline int on_retransmit(void *ctx, const struct sock *sk,
                                         const struct sk_buff *skb, int err, bool direct)
{
	struct rt_read r = {};
	if (!rt_read_event(sk, skb, err, direct, &r)) {
		stat_add(STAT_UNREADABLE);
		return 0;
	}
	emit(ctx, &r.flow, r.segs, err, r.state, r.ca_state, r.pending, sk, r.tp, direct, true);
	return 0;
}

static __always_inline int on_synack(void *ctx, const struct sock *sk,
                                     const struct request_sock *req, bool direct)
{
	/* The listener is sk; the flow is the request socket's. */
	struct rt_flow f = {};
	/* Not skc_family: a request socket takes its listener's family, so an
	 * IPv4 client of a dual-stack (::) listener has AF_INET6 there but only
	 * IPv4 addresses. Its ops (tcp_request_sock_ops) know the real family. */
	const struct request_sock_ops *ops = KREAD(direct, req, rsk_ops);
	__u16 family = KREAD(direct, ops, family);
	FLOW_FILL(&f, (const struct sock_common *)req, family, direct);
	f.kind = KIND_SYNACK;
	/* Only successful SYN-ACK retransmits reach this tracepoint; one segment
	 * each. The listener's account stays untouched (`acct` false): the
	 * SYN-ACK goes in the request's counter, not the listener's. */
	emit(ctx, &f, 1, 0, TCP_SYN_RECV, 0, 0, sk, NULL, direct, false);
	return 0;
}

/* tp_btf: typed arguments, direct reads. */
SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(btf_retrans_err, const struct sock *sk, const struct sk_buff *skb, int err)
{
	return on_retransmit(ctx, sk, skb, err, true);
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(btf_retrans, const struct sock *sk, const struct sk_buff *skb)
{
	return on_retransmit(ctx, sk, skb, 0, true);
}

SEC("tp_btf/tcp_retransmit_synack")
int BPF_PROG(btf_synack, const struct sock *sk, const struct request_sock *req)
{
	return on_synack(ctx, sk, req, true);
}

/* raw_tp: same arguments, read with probes. */
SEC("raw_tp/tcp_retransmit_skb")
int BPF_PROG(raw_retrans_err, const struct sock *sk, const struct sk_buff *skb, int err)
{
	return on_retransmit(ctx, sk, skb, err, false);
}

SEC("raw_tp/tcp_retransmit_skb")
int BPF_PROG(raw_retrans, const struct sock *sk, const struct sk_buff *skb)
{
	return on_retransmit(ctx, sk, skb, 0, false);
}

SEC("raw_tp/tcp_retransmit_synack")
int BPF_PROG(raw_synack, const struct sock *sk, const struct request_sock *req)
{
	return on_synack(ctx, sk, req, false);
}

/* Before the record gained `err` (6.12 and older), tcp_retransmit_skb was an
 * event of the tcp_event_sk_skb class, so its record type has that name (a
 * CO-RE flavor: libbpf matches it by the name before the ___). */
struct trace_event_raw_tcp_event_sk_skb___old {
	struct trace_entry ent;
	const void *skbaddr;
	const void *skaddr;
} __attribute__((preserve_access_index));

/* The record of kernels where tcp_retransmit_skb is its own event, with
 * err, declared here: a vmlinux.h of an older kernel (arm64's, from 6.12,
 * where it is still the class event) has no such type. */
struct trace_event_raw_tcp_retransmit_skb___own {
	struct trace_entry ent;
	const void *skbaddr;
	const void *skaddr;
	int err;
} __attribute__((preserve_access_index));

/* Classic tracepoints: pointers from the record; err if the record has it. */
SEC("tracepoint/tcp/tcp_retransmit_skb")
int tp_retrans(struct trace_event_raw_tcp_retransmit_skb___own *ctx)
{
	if (!bpf_core_type_exists(struct trace_event_raw_tcp_retransmit_skb___own)) {
		struct trace_event_raw_tcp_event_sk_skb___old *old = (void *)ctx;
		return on_retransmit(ctx, old->skaddr, old->skbaddr, 0, false);
	}
	int err = 0;
	if (bpf_core_field_exists(ctx->err))
		err = ctx->err;
	return on_retransmit(ctx, ctx->skaddr, ctx->skbaddr, err, false);
}

SEC("tracepoint/tcp/tcp_retransmit_synack")
int tp_synack(struct trace_event_raw_tcp_retransmit_synack *ctx)
{
	return on_synack(ctx, ctx->skaddr, ctx->req, false);
}
