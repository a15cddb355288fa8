// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Helpers shared by every sonde BPF program. Include after the libbpf headers. */
#ifndef SONDE_H
#define SONDE_H

/*
 * Event rings: one BPF ring buffer per CPU, behind an array of maps that
 * user space sizes to the number of possible CPUs and fills after load
 * (src/engine/ringbuf.rs, PerCpuRings). One shared ring made every event
 * pay for its lock and producer position bouncing between CPUs: measured
 * ~100 ns per event at 23k events/s on two CPUs.
 */
struct sonde_ring {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 << 10); /* template only; the real rings are made by user space */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1); /* set to the number of possible CPUs before load */
	__type(key, __u32);
	__array(values, struct sonde_ring);
} sonde_rings SEC(".maps");

/* This CPU's ring, or NULL (count the event as lost). */
static __always_inline void *rb_this_cpu(void)
{
	__u32 cpu = bpf_get_smp_processor_id();
	return bpf_map_lookup_elem(&sonde_rings, &cpu);
}

/*
 * Ring-buffer wake-ups, batched: user space sets rb_wake_bytes (see
 * src/engine/ringbuf.rs) and drains the rings on its own every 50 ms, so a
 * program wakes it only when a quarter of a ring is waiting. 0 keeps
 * libbpf's default (wake when the reader has caught up: once per event).
 */
const volatile __u64 rb_wake_bytes = 0;

static __always_inline __u64 rb_submit_flags(void *rb)
{
	if (!rb_wake_bytes)
		return 0;
	return bpf_ringbuf_query(rb, BPF_RB_AVAIL_DATA) >= rb_wake_bytes ? BPF_RB_FORCE_WAKEUP
	                                                                 : BPF_RB_NO_WAKEUP;
}

#endif
