//! `sonde cwnd`: congestion-window samples and idle restarts.
use super::{
    common::*,
    labs::{check_idle_lab, idle_lab},
};

#[test]
fn cwnd_raw_tp_with_state_in_a_hash_decides_the_same() {
    let _quiet = QUIET.read().unwrap_or_else(|e| e.into_inner());
    let (v, chart) = idle_lab(&["--mechanism", "raw_tp"]);
    assert_eq!(v["mechanism"], "raw_tp", "{v}");
    check_idle_lab(&v);
    let _ = std::fs::remove_dir_all(chart.parent().unwrap());
}

#[test]
fn cwnd_samples_a_bulk_transfer_and_every_and_pid_limit_them() {
    let pair = Pair::new().unwrap();
    let server = Server::start(&pair.b, SocketAddr::new(pair.b4.parse().unwrap(), 7200), Mode::Sink).unwrap();
    let me = std::process::id().to_string();
    let run = |args: &[&str]| {
        let mut a = vec!["--netns", pair.a.name.as_str()];
        a.extend_from_slice(args);
        let t = Tracer::start_tool("cwnd", "tracing TCP congestion windows", &a);
        sonde::lab::traffic::bulk(&pair.a, server.addr(), 200 << 20).unwrap();
        t.stop()
    };
    // Every change: each sample differs from the one before on its connection.
    let (code, out) = run(&[]);
    assert_eq!(code, 130);
    let s = summary(&out);
    let samples = of_type(&out, "sample");
    assert!(samples.len() > 20, "{s}");
    assert_eq!(s["lost"], 0);
    assert_eq!(s["samples"].as_u64().unwrap() as usize, samples.len(), "{s}");
    assert_eq!(
        s["totals"]["observations"].as_u64().unwrap(),
        s["samples"].as_u64().unwrap() + s["totals"]["unchanged"].as_u64().unwrap(),
        "{s}"
    );
    for w in samples.windows(2) {
        let key = |e: &Value| (e["cwnd"].clone(), e["ssthresh"].clone(), e["ca_state"].clone());
        assert!(w[0]["cookie"] != w[1]["cookie"] || key(w[0]) != key(w[1]), "{} then {}", w[0], w[1]);
    }
    assert!(
        samples.iter().all(|e| e["dport"] == 7200
            && e["pid"].as_u64() == Some(std::process::id() as u64)
            && e["srtt_us"].as_u64() > Some(0)),
        "{:?}",
        samples.first()
    );
    // --every 100ms: at most one sample per 100 ms of the connection.
    let (_, out) = run(&["--every", "100ms", "-p", &me]);
    let s = summary(&out);
    let limited = of_type(&out, "sample");
    assert!(s["totals"]["rate_limited"].as_u64().unwrap() > 0, "{s}");
    let times: Vec<f64> = limited.iter().map(|e| e["time"].as_f64().unwrap()).collect();
    assert!(!times.is_empty() && times.windows(2).all(|w| w[1] - w[0] >= 0.099), "{times:?}");
    // -p of another process: the transfer's socket is filtered out.
    let (_, out) = run(&["-p", "1"]);
    assert!(
        of_type(&out, "sample").is_empty() && summary(&out)["totals"]["filtered"].as_u64() > Some(0),
        "{:?}",
        summary(&out)
    );
}
