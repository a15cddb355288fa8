// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Types only, never loaded: the layouts the runtimes' kernel and user halves
 * share (contract.h), for the Rust side to take from this object's skeleton
 * (src/engine/runtime/layout.rs) instead of packing bytes by hand.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "contract.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct rt_proc layout_proc;
struct rt_stack layout_stack;
struct rt_seen_key layout_seen_key;
enum rt_kind layout_kind;
enum rt_end layout_end;
enum rt_stat layout_stat;
