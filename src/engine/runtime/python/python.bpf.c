// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Types only, never loaded: struct py_proc (python.h) as the Rust side fills it. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "python.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct py_proc layout_proc;
