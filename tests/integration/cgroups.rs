//! `--cgroup`: a group given as a cgroup v2 directory or as a cgroup v1
//! controller's selects the tasks in it and in the groups below it, in the
//! kernel half of every kind of tool: the current task's check (profile),
//! any task's (why's switches) and a socket's owner (retrans, in its module).
use crate::common::*;

/// Spinners in and beside the group: sonde sees the one inside (in a child
/// group of the one given) and nothing of the one beside it, which spins
/// too (its CPU time, from /proc, is the check that there was something
/// to leave out).
#[test]
fn cgroup_filter_selects_the_group_and_the_groups_below_it() {
    let burn = build_workload("burn", &["-O2", "-g", "-fno-inline"]);
    let roots = TestCgroup::roots();
    assert!(!roots.is_empty(), "no cgroup file system mounted");
    for root in &roots {
        let g = TestCgroup::new(root, "sonde-cgf");
        let inside = KillOnDrop(
            Command::new("bash").args(["-c", &g.joined(&format!("{} 60", burn.display()))]).spawn().unwrap(),
        );
        let beside = KillOnDrop(Command::new(&burn).arg("60").spawn().unwrap());
        let (pin, pout) = (inside.0.id(), beside.0.id());
        // The shell has moved itself (and so the spinner it became) in.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !g.processes_in_child().contains(&pin) {
            assert!(Instant::now() < deadline, "{pin} never joined {}", g.inner.display());
            thread::sleep(Duration::from_millis(20));
        }
        let dir = g.dir.to_str().unwrap();

        // Also from a cgroup namespace of its own, whose view of the mount
        // starts above its root (mountinfo's root /../..): the group's depth
        // is then learnt in the kernel.
        let ns = TestCgroup::new(root, "sonde-cgf-ns");
        for in_ns in [false, true] {
            let json = scratch_dir("cgroup-filter").join("p.json");
            let _ = std::fs::remove_file(&json);
            let profile = format!("{SONDE} profile --cgroup {dir} -F 99 -d 2s -o {}", json.display());
            let cmd = if in_ns { ns.joined(&format!("unshare --cgroup {profile}")) } else { profile };
            let before = cpu_ticks(pout);
            let out = Command::new("bash").args(["-c", &cmd]).output().unwrap();
            let beside_ticks = cpu_ticks(pout) - before;
            let how = if in_ns { "from a cgroup namespace" } else { "" };
            assert_eq!(out.status.code(), Some(0), "{root} {how}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(beside_ticks >= 20, "{root}: the spinner beside the group ran {beside_ticks} ticks only");
            let samples: u64 = json_stacks(&json).iter().map(|(_, n)| n).sum();
            let pids = read_stack_pids(&json);
            assert_eq!(pids.into_iter().collect::<Vec<_>>(), vec![pin as u64], "{root} {how}: profile's processes");
            assert!(samples >= 30, "{root} {how}: {samples} samples of the spinner inside in 2 s at 99 Hz");
            eprintln!("{root} {how}: profile {samples} samples of {pin} only, beside it {beside_ticks} ticks");
        }

        let out = Command::new(SONDE).args(["why", "--cgroup", dir, "-d", "2s", "--json"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        let v = json_lines(&out.stdout);
        let threads = of_type(&v, "thread");
        let pids: Vec<u64> = threads.iter().map(|t| t["pid"].as_u64().unwrap()).collect();
        assert_eq!(pids, vec![pin as u64], "{root}: why's threads: {threads:?}");
        let on_cpu = threads[0]["on_cpu_ns"].as_f64().unwrap() / 1e9;
        assert!(on_cpu > 0.3, "{root}: the spinner inside ran {on_cpu:.3} s of 2 s");
        eprintln!("{root}: why: {on_cpu:.3} s on CPU");
    }
}

/// The pids in a profile's JSON stacks.
fn read_stack_pids(json: &std::path::Path) -> std::collections::BTreeSet<u64> {
    json_lines(std::fs::read(json).unwrap())
        .iter()
        .filter(|s| s["type"] == "stack")
        .filter_map(|s| s["pid"].as_u64())
        .collect()
}

/// A path in no cgroup file system, and a v1 hierarchy with no controller,
/// are refused in one line that names the fix.
#[test]
fn cgroup_filter_refuses_what_is_not_a_group_it_can_match() {
    for (path, want) in [("/tmp", "in no cgroup file system"), ("/sys/fs/cgroup/systemd", "no controller")] {
        if path.starts_with("/sys") && !std::path::Path::new(path).join("cgroup.procs").exists() {
            continue;
        }
        let out = Command::new(SONDE).args(["profile", "--cgroup", path, "-d", "1s"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path}: {err}");
        assert_eq!(err.lines().count(), 1, "{path}: {err}");
        assert!(err.contains(want), "{path}: {err}");
    }
}
