/* Helpers shared by every sonde BPF program. Include after the libbpf headers. */
#ifndef SONDE_H
#define SONDE_H

/*
 * Ring-buffer wake-ups, batched: user space sets rb_wake_bytes (see
 * src/engine/ringbuf.rs) and drains the buffer on its own every 50 ms, so a
 * program wakes it only when a quarter of the buffer is waiting. 0 keeps
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
