// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Types only, never loaded: struct hs_proc (hotspot.h) as the Rust side fills it. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "hotspot.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct hs_proc layout_proc;
