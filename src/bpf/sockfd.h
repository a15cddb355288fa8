// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* The socket behind a descriptor of the current process (NULL if none):
 * task -> files -> fdt -> fd[fd] -> file -> socket -> sock, by probe reads.
 * For hooks that see a new descriptor once (accept, connect), not per
 * packet. Include after the libbpf headers. */
#ifndef SONDE_SOCKFD_H
#define SONDE_SOCKFD_H

static __always_inline struct sock *sock_of_fd(long fd)
{
	if (fd < 0)
		return NULL;
	struct task_struct *task = (void *)bpf_get_current_task();
	struct file **fdarr = BPF_CORE_READ(task, files, fdt, fd);
	unsigned int max = BPF_CORE_READ(task, files, fdt, max_fds);
	if (!fdarr || fd >= max)
		return NULL;
	struct file *f = NULL;
	bpf_core_read(&f, sizeof(f), &fdarr[fd]);
	if (!f)
		return NULL;
	struct socket *sock = BPF_CORE_READ(f, private_data);
	return sock ? BPF_CORE_READ(sock, sk) : NULL;
}

#endif
