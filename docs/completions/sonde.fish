# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_sonde_global_optspecs
    string join \n h/help V/version
end

function __fish_sonde_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_sonde_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_sonde_using_subcommand
    set -l cmd (__fish_sonde_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c sonde -n "__fish_sonde_needs_command" -s h -l help -d 'Print help'
complete -c sonde -n "__fish_sonde_needs_command" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "doctor" -d 'What this kernel allows and which mechanism each tool uses'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "retrans" -d 'Trace TCP retransmissions with their cause, flow, state and owner'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "drops" -d 'Show every packet the kernel drops, with its reason, place, flow and owner'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "cwnd" -d 'Congestion window per TCP connection over time, and slow-start restarts after idle'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "profile" -d 'Sample on-CPU stacks at a fixed rate and show where CPU time goes'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "offcpu" -d 'Where threads wait: time off CPU per stack'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "wakeup" -d 'Who wakes waiting threads: blocked stacks joined to their wakers\' stacks'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "funclatency" -d 'Latency histograms of user and kernel functions, syscalls and softirqs'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "slow" -d 'Calls slower than a threshold, and what they were doing while slow'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "msglat" -d 'Per-message latency through a broker, proxy or relay process'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "serve" -d 'Always-on mode: Prometheus metrics and pprof profiles over HTTP'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "why" -d 'Where all of a thread\'s time goes, exactly, and what each wait was for'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "lab" -d 'One-command reproductions on real traffic in network namespaces'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "generate" -d 'Write the man pages and shell completions (`make install` does)'
complete -c sonde -n "__fish_sonde_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sonde -n "__fish_sonde_using_subcommand doctor" -l unwind -d 'Instead of the kernel checks: the unwind table of this executable or library (repeatable): FDEs, rows, rules the walk cannot evaluate, kernel memory, and how long building it takes, cold and from the disk cache' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand doctor" -s p -l pid -d 'Instead of the kernel checks: what sonde finds of the language runtime in this process (repeatable): which one, whether its frames are read, and what was learnt to read them' -r
complete -c sonde -n "__fish_sonde_using_subcommand doctor" -l json -d 'One JSON object instead of text'
complete -c sonde -n "__fish_sonde_using_subcommand doctor" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand doctor" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -s i -l interval -d 'With --count, print the running table every INTERVAL (e.g. 5s)' -r
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l top -d 'With --count, the table shows the N flows with the most retransmits and one line for the rest (0: every flow). --json lists every flow' -r
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l port -d 'Only flows with this local or remote port (repeatable, up to 8)' -r
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l addr -d 'Only flows with an end in this address or CIDR, v4 or v6 (repeatable, up to 8)' -r
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -s p -l pid -d 'Only sockets owned by this process (repeatable, up to 16)' -r
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l comm -d 'Only sockets owned by a task of this name (repeatable, up to 4): the comm of the thread that connected, listened or accepted, as `ps -L` shows it (at most 15 bytes)' -r
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l cgroup -d 'Only sockets owned by a process in this cgroup or below it: a cgroup v2 directory, or a cgroup v1 controller\'s (/sys/fs/cgroup/cpu/...)' -r
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l netns -d 'Only sockets in this network namespace (repeatable, up to 8): a name from `ip netns list`, /run/netns/NAME, /proc/PID/ns/net or an inode' -r
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l kind -d 'Only these causes (comma-separated or repeated)' -r -f -a "rto\t'First retransmit after the retransmission timer fired'
tlp\t'Tail loss probe that re-sent the last segment'
fast\t'Fast retransmit or RACK (loss detected from ACKs)'
loss_recovery\t'Retransmits while in Loss state after an RTO'
syn\t'SYN retransmit of a connecting socket'
synack\t'SYN-ACK retransmit of a listener'
failed\t'Attempts that did not go out (needs --failed to print)'"
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -s d -l duration -d 'Stop after this long (e.g. 10s, 2m); default: until Ctrl-C' -r
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l mechanism -d 'Force one attach mechanism instead of the best available' -r -f -a "tp_btf\t'BTF-typed tracepoints'
raw_tp\t'raw tracepoints'
tracepoint\t'classic tracepoints (reads the trace record)'"
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l ringbuf-kib -d 'Ring buffer size per CPU in KiB (power of two; default: 8 MiB shared out over the CPUs, 256 KiB to 2 MiB each)' -r
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l bench-baseline -d 'Bench only: run a baseline program instead (bench/retrans/run)' -r -f -a "empty\t'Returns at once'
fields\t'Reads and stamps the event, stores it in per-CPU memory'
ring\t'The same through sonde\'s per-CPU ring buffers, read by user space'
owner\t'The same with the socket\'s owner from socket storage made at connect'"
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -s o -l output -d 'Write to this file instead of stdout: .json (JSON lines; implies --json) or .txt' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -s c -l count -d 'Count in the kernel per flow and kind; print a table of the flows with the most retransmits at the end (see --top)'
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -s 4 -l ipv4 -d 'IPv4 only'
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -s 6 -l ipv6 -d 'IPv6 only'
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l stack -d 'Include the kernel stack of each retransmission'
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l failed -d 'Also print attempts that did not go out (err != 0) as kind "failed"'
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -l json -d 'One JSON object per line (events, then a summary)'
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand retrans" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand drops" -s i -l interval -d 'With --count, print the running table every INTERVAL (e.g. 5s)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l top -d 'With --count, the table shows the N most frequent rows and one line for the rest (0: every row)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l reason -d 'Only drops of this reason (the kernel\'s name without SKB_DROP_REASON_; repeatable or comma-separated)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l not-reason -d 'Every drop but those of this reason (repeatable or comma-separated)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l proto -d 'Only this IP protocol: tcp, udp, icmp, icmpv6 or a number (repeatable or comma-separated, up to 8)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l iface -d 'Only drops on this interface, by name (repeatable, up to 4)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l port -d 'Only flows with this local or remote port (repeatable, up to 8)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l addr -d 'Only flows with an end in this address or CIDR, v4 or v6 (repeatable, up to 8)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -s p -l pid -d 'Only sockets owned by this process (repeatable, up to 16)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l comm -d 'Only sockets owned by a task of this name (repeatable, up to 4): the comm of the thread that connected, listened or accepted, as `ps -L` shows it (at most 15 bytes)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l cgroup -d 'Only sockets owned by a process in this cgroup or below it: a cgroup v2 directory, or a cgroup v1 controller\'s (/sys/fs/cgroup/cpu/...)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l netns -d 'Only sockets in this network namespace (repeatable, up to 8): a name from `ip netns list`, /run/netns/NAME, /proc/PID/ns/net or an inode' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l rate -d 'Drops shown per second per CPU at most (a burst of as many at once); the rest are counted, not shown. 0: every one' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l mechanism -d 'Force one attach mechanism instead of the best available' -r -f -a "tp_btf\t'BTF-typed tracepoint'
raw_tp\t'raw tracepoint'
tracepoint\t'classic tracepoint (reads the trace record)'"
complete -c sonde -n "__fish_sonde_using_subcommand drops" -s d -l duration -d 'Stop after this long (e.g. 10s, 2m); default: until Ctrl-C' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l ringbuf-kib -d 'Ring buffer size per CPU in KiB (power of two)' -r
complete -c sonde -n "__fish_sonde_using_subcommand drops" -s o -l output -d 'Write to this file instead of stdout: .json (JSON lines; implies --json) or .txt' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand drops" -s c -l count -d 'Count in the kernel by reason, place, namespace, interface and protocol; print the table of the most frequent at the end (see --top)'
complete -c sonde -n "__fish_sonde_using_subcommand drops" -s 4 -l ipv4 -d 'IPv4 only'
complete -c sonde -n "__fish_sonde_using_subcommand drops" -s 6 -l ipv6 -d 'IPv6 only'
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l stack -d 'Include the kernel stack of each drop'
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l bench-empty -d 'bench/drops: attach programs that return at once (the floor of a program on this tracepoint)'
complete -c sonde -n "__fish_sonde_using_subcommand drops" -l json -d 'One JSON object per line (drops, then a summary)'
complete -c sonde -n "__fish_sonde_using_subcommand drops" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand drops" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -l port -d 'Only flows with this local or remote port (repeatable, up to 8)' -r
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -l addr -d 'Only flows with an end in this address or CIDR, v4 or v6 (repeatable, up to 8)' -r
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -s p -l pid -d 'Only sockets owned by this process (repeatable, up to 16)' -r
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -l comm -d 'Only sockets owned by a task of this name (repeatable, up to 4): the comm of the thread that connected, listened or accepted, as `ps -L` shows it (at most 15 bytes)' -r
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -l cgroup -d 'Only sockets owned by a process in this cgroup or below it: a cgroup v2 directory, or a cgroup v1 controller\'s (/sys/fs/cgroup/cpu/...)' -r
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -l netns -d 'Only sockets in this network namespace (repeatable, up to 8): a name from `ip netns list`, /run/netns/NAME, /proc/PID/ns/net or an inode' -r
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -l every -d 'At most one sample per connection per INTERVAL (e.g. 10ms); default: every change of cwnd, ssthresh or congestion state' -r
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -l min-idle -d 'Also report sends after at least this long with nothing in flight, even when shorter than the RTO (reason idle_under_rto); default: only sends idle longer than the RTO, the ones the kernel may restart' -r
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -s d -l duration -d 'Stop after this long (e.g. 10s, 2m); default: until Ctrl-C' -r
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -l mechanism -d 'Force one attach mechanism instead of the best available' -r -f -a "tp_btf\t'tp_btf tcp:tcp_probe + tp_btf tcp:tcp_sendmsg_locked, state in socket storage'
fentry\t'tp_btf tcp:tcp_probe + fentry tcp_sendmsg_locked (kernels without the tracepoint)'
raw_tp\t'raw_tp tcp:tcp_probe + raw_tp tcp:tcp_sendmsg_locked, state in a hash map'
kprobe\t'raw_tp tcp:tcp_probe + kprobe tcp_sendmsg_locked, state in a hash map'"
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -s o -l output -d 'Write to this file: .json (JSON lines), .txt, or a chart of cwnd over time per connection with idle sends marked: .svg or .html' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -s 4 -l ipv4 -d 'IPv4 only'
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -s 6 -l ipv6 -d 'IPv6 only'
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -l idle-only -d 'Print only idle sends (samples still go to the chart and summary)'
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -l json -d 'One JSON object per line (samples, idle sends, then a summary)'
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand cwnd" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand profile" -s F -l frequency -d 'Samples per second per CPU' -r
complete -c sonde -n "__fish_sonde_using_subcommand profile" -s p -l pid -d 'Only this process and all its threads (repeatable, up to 64)' -r
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l tid -d 'Only this thread (repeatable, up to 16)' -r
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l cgroup -d 'Only tasks in this cgroup or below it: a cgroup v2 directory, or a cgroup v1 controller\'s (/sys/fs/cgroup/cpu/...)' -r
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l comm -d 'Only threads with this name (as in /proc/PID/comm, up to 15 bytes)' -r
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l event -d 'What to sample on' -r -f -a "cpu-clock\t'CPU time (a software timer; works everywhere, also in VMs)'
cycles\t'CPU cycles (the PMU; often missing in VMs)'"
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l top -d 'Rows of the top table' -r
complete -c sonde -n "__fish_sonde_using_subcommand profile" -s d -l duration -d 'Stop after this long (e.g. 10s, 2m); default: until Ctrl-C' -r
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l unwind -d 'How to walk user stacks: auto (unwind tables from each executable\'s .eh_frame where it has one, frame pointers elsewhere), fp (frame pointers only), dwarf (as auto, but exit 2 when this kernel cannot)' -r -f -a "auto\t'Unwind tables where an executable has them, frame pointers elsewhere; frame pointers only when this kernel cannot walk tables'
fp\t'Frame pointers only (the kernel\'s own walk): cheapest; stacks through code built without frame pointers are cut short'
dwarf\t'As auto, but refuse to run when this kernel cannot walk tables'"
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l frames -d 'What stacks show of language runtimes (Python, Go, Java, Node.js; see the README\'s "Language frames"): mixed (each interpreter-loop or JIT frame replaced by the functions it ran, native callers kept), lang (only those functions), native (the runtime\'s own frames, nothing read of the runtime). Needs the table walk (Linux 5.15+)' -r -f -a "mixed\t'Each interpreter-loop frame replaced by the language frames it ran; native callers and callees (C extensions, the kernel) stay'
lang\t'Only the language frames, where a stack has any'
native\t'Native frames only, as the CPU sees them (no language frames read)'"
complete -c sonde -n "__fish_sonde_using_subcommand profile" -s o -l output -d 'Write here, repeatable; the extension picks the format: .folded, .svg, .html (interactive), .json or .pb.gz (pprof)' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l user-only -d 'User stacks only'
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l kernel-only -d 'Kernel stacks only'
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l include-idle -d 'Include samples of idle CPUs (the swapper tasks)'
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l per-thread -d 'Keep threads apart (the thread id becomes part of each stack)'
complete -c sonde -n "__fish_sonde_using_subcommand profile" -l json -d 'Print every stack as a JSON line on stdout, then a summary line'
complete -c sonde -n "__fish_sonde_using_subcommand profile" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand profile" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -s p -l pid -d 'Only this process and all its threads (repeatable, up to 64)' -r
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l tid -d 'Only this thread (repeatable, up to 16)' -r
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l cgroup -d 'Only tasks in this cgroup or below it: a cgroup v2 directory, or a cgroup v1 controller\'s (/sys/fs/cgroup/cpu/...)' -r
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l comm -d 'Only threads with this name (as in /proc/PID/comm, up to 15 bytes)' -r
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l min-block -d 'Ignore blocks shorter than this (e.g. 1ms, 100us)' -r
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l max-block -d 'Ignore blocks longer than this' -r
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l sample-below -d 'Blocks shorter than this are sampled: kept with probability (block / this) and then counted as this long, so each stack\'s total is an unbiased estimate while stack walks for short blocks stay bounded. 0 keeps every block (exact, at full cost). Needs the sched_exit_tp hook (see `sonde doctor`); without it every block is kept' -r
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l state -d 'Only these states when going off CPU (repeatable; default all)' -r -f -a "running\t'Preempted while runnable (waiting for a CPU)'
interruptible\t'Sleeping, wakeable by signals (poll, read, futex, nanosleep...)'
uninterruptible\t'Sleeping, not wakeable by signals (mostly disk I/O)'"
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l top -d 'Rows of the top table' -r
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -s d -l duration -d 'Stop after this long (e.g. 10s, 2m); default: until Ctrl-C' -r
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l mechanism -d 'Force one attach mechanism instead of the best available' -r -f -a "tp_btf\t'BTF-typed tracepoints; start records in task storage where the kernel allocates it with bpf_mem_alloc, else a hash'
raw_tp\t'raw tracepoints; start records in a hash by thread id'"
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l unwind -d 'How to walk user stacks: auto (unwind tables from each executable\'s .eh_frame where it has one, frame pointers elsewhere), fp (frame pointers only), dwarf (as auto, but exit 2 when this kernel cannot)' -r -f -a "auto\t'Unwind tables where an executable has them, frame pointers elsewhere; frame pointers only when this kernel cannot walk tables'
fp\t'Frame pointers only (the kernel\'s own walk): cheapest; stacks through code built without frame pointers are cut short'
dwarf\t'As auto, but refuse to run when this kernel cannot walk tables'"
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l frames -d 'What stacks show of language runtimes (Python, Go, Java, Node.js; see the README\'s "Language frames"): mixed (each interpreter-loop or JIT frame replaced by the functions it ran, native callers kept), lang (only those functions), native (the runtime\'s own frames, nothing read of the runtime). Needs the table walk (Linux 5.15+)' -r -f -a "mixed\t'Each interpreter-loop frame replaced by the language frames it ran; native callers and callees (C extensions, the kernel) stay'
lang\t'Only the language frames, where a stack has any'
native\t'Native frames only, as the CPU sees them (no language frames read)'"
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -s o -l output -d 'Write here, repeatable; the extension picks the format: .folded, .svg, .html (interactive), .json or .pb.gz (pprof)' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l user-only -d 'User stacks only'
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l kernel-only -d 'Kernel stacks only'
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l per-process -d 'Merge the threads of a process (default: one stack set per thread)'
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l switch-only -d 'Take the stacks at sched_switch, as on kernels without the sched_exit_tp hook (every block\'s stacks, no sampling), to compare'
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -l json -d 'Print every stack as a JSON line on stdout, then a summary line'
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand offcpu" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -s p -l pid -d 'Only this process and all its threads (repeatable, up to 64)' -r
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l tid -d 'Only this thread (repeatable, up to 16)' -r
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l cgroup -d 'Only tasks in this cgroup or below it: a cgroup v2 directory, or a cgroup v1 controller\'s (/sys/fs/cgroup/cpu/...)' -r
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l comm -d 'Only threads with this name (as in /proc/PID/comm, up to 15 bytes)' -r
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l min-block -d 'Ignore blocks shorter than this (e.g. 1ms, 100us)' -r
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l max-block -d 'Ignore blocks longer than this' -r
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l sample-below -d 'Blocks shorter than this are sampled: kept with probability (block / this) and then counted as this long, so each stack\'s total is an unbiased estimate while stack walks for short blocks stay bounded. 0 keeps every block (exact, at full cost). Needs the sched_exit_tp hook (see `sonde doctor`); without it every block is kept' -r
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l state -d 'Only these states when going off CPU (repeatable; default all)' -r -f -a "running\t'Preempted while runnable (waiting for a CPU)'
interruptible\t'Sleeping, wakeable by signals (poll, read, futex, nanosleep...)'
uninterruptible\t'Sleeping, not wakeable by signals (mostly disk I/O)'"
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l top -d 'Rows of the top table' -r
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -s d -l duration -d 'Stop after this long (e.g. 10s, 2m); default: until Ctrl-C' -r
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l mechanism -d 'Force one attach mechanism instead of the best available' -r -f -a "tp_btf\t'BTF-typed tracepoints; start records in task storage where the kernel allocates it with bpf_mem_alloc, else a hash'
raw_tp\t'raw tracepoints; start records in a hash by thread id'"
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l unwind -d 'How to walk user stacks: auto (unwind tables from each executable\'s .eh_frame where it has one, frame pointers elsewhere), fp (frame pointers only), dwarf (as auto, but exit 2 when this kernel cannot)' -r -f -a "auto\t'Unwind tables where an executable has them, frame pointers elsewhere; frame pointers only when this kernel cannot walk tables'
fp\t'Frame pointers only (the kernel\'s own walk): cheapest; stacks through code built without frame pointers are cut short'
dwarf\t'As auto, but refuse to run when this kernel cannot walk tables'"
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l frames -d 'What stacks show of language runtimes (Python, Go, Java, Node.js; see the README\'s "Language frames"): mixed (each interpreter-loop or JIT frame replaced by the functions it ran, native callers kept), lang (only those functions), native (the runtime\'s own frames, nothing read of the runtime). Needs the table walk (Linux 5.15+)' -r -f -a "mixed\t'Each interpreter-loop frame replaced by the language frames it ran; native callers and callees (C extensions, the kernel) stay'
lang\t'Only the language frames, where a stack has any'
native\t'Native frames only, as the CPU sees them (no language frames read)'"
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -s o -l output -d 'Write here, repeatable; the extension picks the format: .folded, .svg, .html (interactive), .json or .pb.gz (pprof)' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l user-only -d 'User stacks only'
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l kernel-only -d 'Kernel stacks only'
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l per-process -d 'Merge the threads of a process (default: one stack set per thread)'
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l switch-only -d 'Take the stacks at sched_switch, as on kernels without the sched_exit_tp hook (every block\'s stacks, no sampling), to compare'
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -l json -d 'Print every stack as a JSON line on stdout, then a summary line'
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand wakeup" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -s p -l pid -d 'Only this process (repeatable). User-function probes are placed in these processes only' -r
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -l cgroup -d 'Only tasks in this cgroup or below it: a cgroup v2 directory, or a cgroup v1 controller\'s (/sys/fs/cgroup/cpu/...)' -r
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -s d -l duration -d 'Stop after this long (e.g. 10s, 2m); default: until Ctrl-C' -r
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -l max-probes -d 'Most functions a glob may expand to' -r
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -l kernel-mechanism -d 'How kernel functions are probed (default: the first that works of fentry, kprobe-multi, kprobe)' -r -f -a "fentry\t'fentry/fexit trampolines: one program per function and direction'
kprobe-multi\t'One kprobe.multi and one kretprobe.multi link for all functions'
kprobe\t'A kprobe and a kretprobe per function'"
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -s i -l interval -d 'Also print each interval\'s histograms this often (e.g. 5s)' -r
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -s o -l output -d 'Write to this file instead of stdout: .json (JSON lines; implies --json) or .txt' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -l single-uprobes -d 'A uprobe link per function even where one uprobe.multi link per binary is possible'
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -l json -d 'One JSON object per target and interval, then a summary line'
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand funclatency" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand slow" -s p -l pid -d 'Only this process (repeatable). User-function probes are placed in these processes only' -r
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l cgroup -d 'Only tasks in this cgroup or below it: a cgroup v2 directory, or a cgroup v1 controller\'s (/sys/fs/cgroup/cpu/...)' -r
complete -c sonde -n "__fish_sonde_using_subcommand slow" -s d -l duration -d 'Stop after this long (e.g. 10s, 2m); default: until Ctrl-C' -r
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l max-probes -d 'Most functions a glob may expand to' -r
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l kernel-mechanism -d 'How kernel functions are probed (default: the first that works of fentry, kprobe-multi, kprobe)' -r -f -a "fentry\t'fentry/fexit trampolines: one program per function and direction'
kprobe-multi\t'One kprobe.multi and one kretprobe.multi link for all functions'
kprobe\t'A kprobe and a kretprobe per function'"
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l over -d 'Report calls longer than this (e.g. 100us, 5ms)' -r
complete -c sonde -n "__fish_sonde_using_subcommand slow" -s F -l frequency -d 'Samples per second per CPU while a call is slow' -r
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l top -d 'Slowest calls listed (and rows of the top table)' -r
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l unwind -d 'How to walk user stacks: auto (unwind tables from each executable\'s .eh_frame where it has one, frame pointers elsewhere), fp (frame pointers only), dwarf (as auto, but exit 2 when this kernel cannot)' -r -f -a "auto\t'Unwind tables where an executable has them, frame pointers elsewhere; frame pointers only when this kernel cannot walk tables'
fp\t'Frame pointers only (the kernel\'s own walk): cheapest; stacks through code built without frame pointers are cut short'
dwarf\t'As auto, but refuse to run when this kernel cannot walk tables'"
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l frames -d 'What stacks show of language runtimes (Python, Go, Java, Node.js; see the README\'s "Language frames"): mixed (each interpreter-loop or JIT frame replaced by the functions it ran, native callers kept), lang (only those functions), native (the runtime\'s own frames, nothing read of the runtime). Needs the table walk (Linux 5.15+)' -r -f -a "mixed\t'Each interpreter-loop frame replaced by the language frames it ran; native callers and callees (C extensions, the kernel) stay'
lang\t'Only the language frames, where a stack has any'
native\t'Native frames only, as the CPU sees them (no language frames read)'"
complete -c sonde -n "__fish_sonde_using_subcommand slow" -s o -l output -d 'Write the flame graph of slow calls here, repeatable; the extension picks the format: .folded, .svg, .html (interactive), .json or .pb.gz (pprof)' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l single-uprobes -d 'A uprobe link per function even where one uprobe.multi link per binary is possible'
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l user-only -d 'Sample user stacks only'
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l kernel-only -d 'Sample kernel stacks only'
complete -c sonde -n "__fish_sonde_using_subcommand slow" -l json -d 'JSON lines: each slow call, each flame-graph stack, then a summary'
complete -c sonde -n "__fish_sonde_using_subcommand slow" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand slow" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -s p -l pid -d 'The process to trace (repeatable, up to 8)' -r
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -l id -d 'Pair receive and send by the message id at byte OFFSET, LEN bytes (1-8, read as a little-endian integer); the default is 0:8' -r
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -l port -d 'Only sockets with this local or remote port (repeatable, up to 8)' -r
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -l hooks -d 'Where to hook: `sockets` (the default where the kernel has the tracepoints sock:sock_recv_length and tcp:tcp_sendmsg_locked: only socket calls run a program; TCP sends), `syscalls` (the message syscalls\' own tracepoints, each message syscall runs one program) or `raw` (raw_syscalls sys_enter/sys_exit as BTF tracepoints: every syscall on the host runs two, each returning after one compare unless it is the traced process\'s)' -r -f -a "sockets\t'sock:sock_recv_length and tcp:tcp_sendmsg_locked (tp_btf)'
syscalls\t'syscalls:sys_enter_write, ..., syscalls:sys_exit_read, ...'
raw\t'raw_syscalls:sys_enter and sys_exit (tp_btf)'"
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -s d -l duration -d 'Stop after this long (e.g. 10s); default: until Ctrl-C or the process exits' -r
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -s o -l output -d 'Write to this file: .json (JSON lines; implies --json) or .txt' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -l fifo -d 'Pair in FIFO order: each send takes the process\'s oldest receive not yet sent (for protocols without ids; one stream in, one out)'
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -l per-message -d 'Also one JSON record (or line) per message'
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -l calibrate -d 'The lab\'s bpf_stats run: also an empty program on a message tracepoint, to take the statistics\' own cost out'
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -l floor -d 'The lab\'s floor row: empty programs on the socket hooks\' tracepoints in place of msglat\'s (what reaching a program costs)'
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -l json -d 'One JSON object per line (messages with --per-message, then a summary)'
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand msglat" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l config -d 'Config file (TOML)' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l check-config -d 'Check this config file (and the web config it names) and exit' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l listen -d 'Address to listen on (default 127.0.0.1:9632: loopback only), or unix:/PATH for a Unix socket (mode 0600; clients known by their uid)' -r
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l web-config -d 'TLS and basic auth, in the exporter-toolkit web config format (node_exporter\'s --web.config.file)' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l funclatency -d 'Latency histograms of these targets (as `sonde funclatency` names them; repeatable)' -r
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l disable -d 'Turn off a collector or the profile endpoints (repeatable): retrans, cwnd, drops, profiles' -r -f -a "retrans\t''
cwnd\t''
drops\t''
profiles\t''"
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l labels -d 'Per-cgroup series (cgroup path, Kubernetes pod UID, container ID)' -r -f -a "cgroup\t''"
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l netns -d 'Only connections and packets in these network namespaces (retrans, cwnd, drops)' -r
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l comm -d 'Only connections owned by a task of this name (retrans and cwnd; repeatable, up to 4)' -r
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l profiles-allow-uid -d 'Without basic auth, also let local clients of this uid pull profiles (repeatable; root always may unless the config\'s allow_uids says otherwise)' -r
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l push-url -d 'Push CPU profiles to this Pyroscope-compatible /ingest URL (http://)' -r
complete -c sonde -n "__fish_sonde_using_subcommand serve" -l push-interval -d 'Time between pushes' -r
complete -c sonde -n "__fish_sonde_using_subcommand serve" -s d -l duration -d 'Stop after this long (tests and benches; default: until a signal)' -r
complete -c sonde -n "__fish_sonde_using_subcommand serve" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand serve" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand why" -s p -l pid -d 'Only this process and all its threads (repeatable, up to 64)' -r
complete -c sonde -n "__fish_sonde_using_subcommand why" -l tid -d 'Only this thread (repeatable, up to 16)' -r
complete -c sonde -n "__fish_sonde_using_subcommand why" -l cgroup -d 'Only tasks in this cgroup or below it: a cgroup v2 directory, or a cgroup v1 controller\'s (/sys/fs/cgroup/cpu/...)' -r
complete -c sonde -n "__fish_sonde_using_subcommand why" -l comm -d 'Only threads with this name (as in /proc/PID/comm, up to 15 bytes)' -r
complete -c sonde -n "__fish_sonde_using_subcommand why" -s i -l interval -d 'Also report every interval (e.g. 5s), each on its own' -r
complete -c sonde -n "__fish_sonde_using_subcommand why" -l top -d 'Processes shown when every process is traced (those that lost the most time); --json carries every process' -r
complete -c sonde -n "__fish_sonde_using_subcommand why" -l unwind -d 'How to walk user stacks: auto (unwind tables from each executable\'s .eh_frame where it has one, frame pointers elsewhere), fp (frame pointers only), dwarf (as auto, but exit 2 when this kernel cannot)' -r -f -a "auto\t'Unwind tables where an executable has them, frame pointers elsewhere; frame pointers only when this kernel cannot walk tables'
fp\t'Frame pointers only (the kernel\'s own walk): cheapest; stacks through code built without frame pointers are cut short'
dwarf\t'As auto, but refuse to run when this kernel cannot walk tables'"
complete -c sonde -n "__fish_sonde_using_subcommand why" -l frames -d 'What stacks show of language runtimes (Python, Go, Java, Node.js; see the README\'s "Language frames"): mixed (each interpreter-loop or JIT frame replaced by the functions it ran, native callers kept), lang (only those functions), native (the runtime\'s own frames, nothing read of the runtime). Needs the table walk (Linux 5.15+)' -r -f -a "mixed\t'Each interpreter-loop frame replaced by the language frames it ran; native callers and callees (C extensions, the kernel) stay'
lang\t'Only the language frames, where a stack has any'
native\t'Native frames only, as the CPU sees them (no language frames read)'"
complete -c sonde -n "__fish_sonde_using_subcommand why" -s d -l duration -d 'Stop after this long (e.g. 10s, 2m); default: until Ctrl-C' -r
complete -c sonde -n "__fish_sonde_using_subcommand why" -s o -l output -d 'Write to this file; its extension picks the format' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand why" -l thread-slots -d 'Tests only: slots for the threads\' records (a power of two, 2 to 65536; default: pid_max, at most 65536), so that threads share them' -r
complete -c sonde -n "__fish_sonde_using_subcommand why" -l per-thread -d 'One row per thread instead of per group of same-named threads'
complete -c sonde -n "__fish_sonde_using_subcommand why" -l json -d 'One JSON object per line: the tool\'s records, then a summary'
complete -c sonde -n "__fish_sonde_using_subcommand why" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand why" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -s h -l help -d 'Print help'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -f -a "retrans" -d 'Retransmissions of every kind under nftables loss; sonde\'s per-kind totals side by side with the namespaces\' own MIB counter deltas'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -f -a "drops" -d 'Packets dropped for ten kinds of cause at once, IPv4 and IPv6; `sonde drops` counts each beside the namespaces\' own counters'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -f -a "profile" -d 'A bundled workload with a built-in 2:1 CPU split, profiled; the measured split beside the built-in one, and its flame graphs'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -f -a "dns" -d 'An HTTP server slowed by reverse DNS lookups in its logging; profile, offcpu and wakeup find the cause, then the rate without the resolver\'s delay'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -f -a "slow" -d 'connect() slow in port selection with TIME_WAIT filling the ephemeral range; `slow` shows where, then tcp_tw_reuse=1 shrinks it'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -f -a "idle-restart" -d 'A response every few seconds on one connection; CUBIC restarts slow start after each idle gap, BBR and the sysctl at 0 do not; `sonde cwnd` shows each, `ss -ti` checks it, and the round trips each restart costs are measured'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -f -a "msglat" -d 'Sender -> message broker -> receiver; end-to-end time with the broker untraced, logging to memory, logging to a file, and traced by `sonde msglat`, side by side, with the T2 distribution sonde saw'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -f -a "why" -d 'A service whose time has a known mix (on CPU, throttled by a CPU quota, blocked on a lossy peer, on disk, on a lock another thread holds); `sonde why` recovers each share beside the service\'s own split and the kernel\'s counters, and names each cause'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and not __fish_seen_subcommand_from retrans drops profile dns slow idle-restart msglat why help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from retrans" -l loss -d 'Percent of bulk-transfer packets dropped (0-50)' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from retrans" -l bulk-mb -d 'Megabytes sent in each bulk transfer (IPv4 and IPv6)' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from retrans" -l events -d 'Print every retransmission, not just the per-flow table'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from retrans" -s h -l help -d 'Print help'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from retrans" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from drops" -l packets -d 'Packets sent for each kind of drop' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from drops" -l events -d 'Print every drop, not just the count table'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from drops" -s h -l help -d 'Print help'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from drops" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from profile" -s d -l seconds -d 'Seconds to profile the workload for' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from profile" -s F -l frequency -d 'Samples per second' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from profile" -s o -l output -d 'Where to write the flame graphs (.html, .svg, .folded, .pb.gz, .json)' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from profile" -s h -l help -d 'Print help'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from profile" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from dns" -s d -l duration -d 'How long each tool traces the server, and how long the rate is measured without the delay' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from dns" -l delay -d 'The resolver\'s delay per reverse lookup: MIN-MAX (uniform), e.g. 30ms-130ms' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from dns" -l workers -d 'Server worker threads (each handles one request at a time)' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from dns" -l clients -d 'Concurrent clients of the load generator' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from dns" -s F -l frequency -d 'Profile sampling rate' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from dns" -l prefix -d 'Flame graphs are written to PREFIX-{profile,offcpu,wakeup}.{html,svg}' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from dns" -l json -d 'Print the findings as one JSON object on stdout'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from dns" -s h -l help -d 'Print help'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from dns" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from slow" -s d -l duration -d 'How long `slow` watches connect() in each setting' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from slow" -l over -d 'The threshold given to `slow`' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from slow" -l prefix -d 'Flame graphs go to PREFIX-{tw-reuse-0,tw-reuse-1}.{html,svg}' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from slow" -l json -d 'Print the findings as one JSON object on stdout'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from slow" -s h -l help -d 'Print help'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from slow" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from idle-restart" -l responses -d 'Responses per setting: the first on a fresh connection, each further one after an idle gap' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from idle-restart" -l gap -d 'Idle time before each further response (longer than the RTO, which is at least 200 ms; long enough for CUBIC\'s cwnd to decay to the initial window: one halving per RTO idle)' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from idle-restart" -l size -d 'Response size in bytes' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from idle-restart" -l delay -d 'One-way delay of the path between the namespaces' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from idle-restart" -s o -l output -d 'Chart of cwnd over time for the three connections (.html or .svg)' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from idle-restart" -l mechanism -d 'The attach mechanism `sonde cwnd` uses (default: the best available)' -r -f -a "tp_btf\t'tp_btf tcp:tcp_probe + tp_btf tcp:tcp_sendmsg_locked, state in socket storage'
fentry\t'tp_btf tcp:tcp_probe + fentry tcp_sendmsg_locked (kernels without the tracepoint)'
raw_tp\t'raw_tp tcp:tcp_probe + raw_tp tcp:tcp_sendmsg_locked, state in a hash map'
kprobe\t'raw_tp tcp:tcp_probe + kprobe tcp_sendmsg_locked, state in a hash map'"
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from idle-restart" -l json -d 'Print the findings as one JSON object on stdout'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from idle-restart" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from idle-restart" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l messages -d 'Messages per run' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l spacing -d 'Time between two messages from the sender' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l size -d 'Message size in bytes (at least 16: the id and the send time)' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l rounds -d 'Rounds of the configurations, interleaved' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l delay-every -d 'Hold every Nth message DELAY in the broker (0: none; for tests)' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l delay -d 'How long to hold those messages' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l drop-at -d 'The broker drops this message (its index; for tests)' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l hooks -d 'Where msglat hooks (see `sonde msglat --help`)' -r -f -a "sockets\t'sock:sock_recv_length and tcp:tcp_sendmsg_locked (tp_btf)'
syscalls\t'syscalls:sys_enter_write, ..., syscalls:sys_exit_read, ...'
raw\t'raw_syscalls:sys_enter and sys_exit (tp_btf)'"
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l cpu -d 'The CPU the sender, broker and receiver share (default: the last one this process may use; sonde\'s own threads keep off it when there is another)' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l fifo -d 'Pair in FIFO order instead of by id'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l sonde-only -d 'Only the sonde configuration (no baseline rows)'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l spread -d 'Let the scheduler place the three processes, as the paper\'s harness did (much noisier on a VM: each hop is then a cross-CPU wake-up)'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l realtime -d 'Run the sender, broker and receiver under SCHED_FIFO, so that no normal task (CPU hogs on a busy host) preempts a message on its way: T2 is then the broker\'s work and built-in hold only (the tests)'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -l json -d 'Print the findings as one JSON object on stdout'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from msglat" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from why" -s d -l seconds -d 'Seconds `sonde why` accounts for the service' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from why" -l loss -d 'Packets lost on the way to the peer, percent' -r
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from why" -s o -l output -d 'The page with each thread\'s timeline' -r -F
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from why" -s h -l help -d 'Print help'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from why" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from help" -f -a "retrans" -d 'Retransmissions of every kind under nftables loss; sonde\'s per-kind totals side by side with the namespaces\' own MIB counter deltas'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from help" -f -a "drops" -d 'Packets dropped for ten kinds of cause at once, IPv4 and IPv6; `sonde drops` counts each beside the namespaces\' own counters'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from help" -f -a "profile" -d 'A bundled workload with a built-in 2:1 CPU split, profiled; the measured split beside the built-in one, and its flame graphs'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from help" -f -a "dns" -d 'An HTTP server slowed by reverse DNS lookups in its logging; profile, offcpu and wakeup find the cause, then the rate without the resolver\'s delay'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from help" -f -a "slow" -d 'connect() slow in port selection with TIME_WAIT filling the ephemeral range; `slow` shows where, then tcp_tw_reuse=1 shrinks it'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from help" -f -a "idle-restart" -d 'A response every few seconds on one connection; CUBIC restarts slow start after each idle gap, BBR and the sysctl at 0 do not; `sonde cwnd` shows each, `ss -ti` checks it, and the round trips each restart costs are measured'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from help" -f -a "msglat" -d 'Sender -> message broker -> receiver; end-to-end time with the broker untraced, logging to memory, logging to a file, and traced by `sonde msglat`, side by side, with the T2 distribution sonde saw'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from help" -f -a "why" -d 'A service whose time has a known mix (on CPU, throttled by a CPU quota, blocked on a lossy peer, on disk, on a lock another thread holds); `sonde why` recovers each share beside the service\'s own split and the kernel\'s counters, and names each cause'
complete -c sonde -n "__fish_sonde_using_subcommand lab; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sonde -n "__fish_sonde_using_subcommand generate" -s h -l help -d 'Print help'
complete -c sonde -n "__fish_sonde_using_subcommand generate" -s V -l version -d 'Print version'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "doctor" -d 'What this kernel allows and which mechanism each tool uses'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "retrans" -d 'Trace TCP retransmissions with their cause, flow, state and owner'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "drops" -d 'Show every packet the kernel drops, with its reason, place, flow and owner'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "cwnd" -d 'Congestion window per TCP connection over time, and slow-start restarts after idle'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "profile" -d 'Sample on-CPU stacks at a fixed rate and show where CPU time goes'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "offcpu" -d 'Where threads wait: time off CPU per stack'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "wakeup" -d 'Who wakes waiting threads: blocked stacks joined to their wakers\' stacks'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "funclatency" -d 'Latency histograms of user and kernel functions, syscalls and softirqs'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "slow" -d 'Calls slower than a threshold, and what they were doing while slow'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "msglat" -d 'Per-message latency through a broker, proxy or relay process'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "serve" -d 'Always-on mode: Prometheus metrics and pprof profiles over HTTP'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "why" -d 'Where all of a thread\'s time goes, exactly, and what each wait was for'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "lab" -d 'One-command reproductions on real traffic in network namespaces'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "generate" -d 'Write the man pages and shell completions (`make install` does)'
complete -c sonde -n "__fish_sonde_using_subcommand help; and not __fish_seen_subcommand_from doctor retrans drops cwnd profile offcpu wakeup funclatency slow msglat serve why lab generate help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c sonde -n "__fish_sonde_using_subcommand help; and __fish_seen_subcommand_from lab" -f -a "retrans" -d 'Retransmissions of every kind under nftables loss; sonde\'s per-kind totals side by side with the namespaces\' own MIB counter deltas'
complete -c sonde -n "__fish_sonde_using_subcommand help; and __fish_seen_subcommand_from lab" -f -a "drops" -d 'Packets dropped for ten kinds of cause at once, IPv4 and IPv6; `sonde drops` counts each beside the namespaces\' own counters'
complete -c sonde -n "__fish_sonde_using_subcommand help; and __fish_seen_subcommand_from lab" -f -a "profile" -d 'A bundled workload with a built-in 2:1 CPU split, profiled; the measured split beside the built-in one, and its flame graphs'
complete -c sonde -n "__fish_sonde_using_subcommand help; and __fish_seen_subcommand_from lab" -f -a "dns" -d 'An HTTP server slowed by reverse DNS lookups in its logging; profile, offcpu and wakeup find the cause, then the rate without the resolver\'s delay'
complete -c sonde -n "__fish_sonde_using_subcommand help; and __fish_seen_subcommand_from lab" -f -a "slow" -d 'connect() slow in port selection with TIME_WAIT filling the ephemeral range; `slow` shows where, then tcp_tw_reuse=1 shrinks it'
complete -c sonde -n "__fish_sonde_using_subcommand help; and __fish_seen_subcommand_from lab" -f -a "idle-restart" -d 'A response every few seconds on one connection; CUBIC restarts slow start after each idle gap, BBR and the sysctl at 0 do not; `sonde cwnd` shows each, `ss -ti` checks it, and the round trips each restart costs are measured'
complete -c sonde -n "__fish_sonde_using_subcommand help; and __fish_seen_subcommand_from lab" -f -a "msglat" -d 'Sender -> message broker -> receiver; end-to-end time with the broker untraced, logging to memory, logging to a file, and traced by `sonde msglat`, side by side, with the T2 distribution sonde saw'
complete -c sonde -n "__fish_sonde_using_subcommand help; and __fish_seen_subcommand_from lab" -f -a "why" -d 'A service whose time has a known mix (on CPU, throttled by a CPU quota, blocked on a lossy peer, on disk, on a lock another thread holds); `sonde why` recovers each share beside the service\'s own split and the kernel\'s counters, and names each cause'
