// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Types only, never loaded: struct v8_proc (v8.h) as the Rust side fills it. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "v8.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct v8_proc layout_proc;
