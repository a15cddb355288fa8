//! A path with a fixed one-way delay between two namespaces, for labs whose
//! effect is counted in round trips. This kernel has neither netem nor fq
//! (whose earliest-departure times a tc program could set), so the path is
//! a TUN device in each namespace and a relay in user space that holds each
//! IP packet for the delay before writing it to the other side. The kernels
//! in both namespaces run real TCP over it; only the wire is emulated.
use std::{
    collections::VecDeque,
    fs::{File, OpenOptions},
    io::{Read, Write},
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};

use super::netns::Netns;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// A TUN device named `name` in the calling thread's namespace.
fn open_tun(name: &str) -> anyhow::Result<File> {
    let f =
        OpenOptions::new().read(true).write(true).open("/dev/net/tun").context("opening /dev/net/tun (CONFIG_TUN)")?;
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        flags: libc::c_short,
        pad: [u8; 22],
    }
    let mut req = IfReq { name: [0; 16], flags: IFF_TUN | IFF_NO_PI, pad: [0; 22] };
    req.name[..name.len().min(15)].copy_from_slice(&name.as_bytes()[..name.len().min(15)]);
    // SAFETY: TUNSETIFF takes a struct ifreq, which IfReq lays out.
    if unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF, &mut req) } != 0 {
        bail!("TUNSETIFF {name}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: setting O_NONBLOCK on our own descriptor.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    Ok(f)
}

/// The delayed path; the relay stops and the devices go away when dropped.
pub struct DelayLink {
    /// Address of side a (on its TUN device).
    pub a_addr: std::net::Ipv4Addr,
    /// Address of side b.
    pub b_addr: std::net::Ipv4Addr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl DelayLink {
    /// Joins `a` and `b` by a point-to-point path with `one_way` delay each
    /// direction, addresses 10.214.`subnet`.1 (a) and .2 (b).
    pub fn new(a: &Netns, b: &Netns, subnet: u32, one_way: Duration) -> anyhow::Result<Self> {
        let a_addr = std::net::Ipv4Addr::new(10, 214, subnet as u8, 1);
        let b_addr = std::net::Ipv4Addr::new(10, 214, subnet as u8, 2);
        let name = format!("sdly{subnet}");
        let fa = a.run(|| open_tun(&name))??;
        let fb = b.run(|| open_tun(&name))??;
        for (ns, me, peer) in [(a, a_addr, b_addr), (b, b_addr, a_addr)] {
            ns.ip(&["addr", "add", &format!("{me}/32"), "peer", &format!("{peer}/32"), "dev", &name])?;
            ns.ip(&["link", "set", &name, "txqueuelen", "10000", "up"])?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (fa2, fb2) = (fa.try_clone()?, fb.try_clone()?);
        let threads = vec![relay(fa, fb2, one_way, stop.clone()), relay(fb, fa2, one_way, stop.clone())];
        Ok(Self { a_addr, b_addr, stop, threads })
    }
}

impl Drop for DelayLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Moves packets from `from` to `to`, each `delay` after it was read. The
/// relay runs under SCHED_FIFO: at normal priority, a busy host held it off
/// the CPU for milliseconds, and the packets it then sent late took their
/// delay plus that (CUBIC's HyStart read the extra delay as a queue and
/// left slow start early).
fn relay(mut from: File, mut to: File, delay: Duration, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        super::realtime_or_warn();
        let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let wait =
                queue.front().map(|(t, _)| t.saturating_duration_since(now)).unwrap_or(Duration::from_millis(50));
            let mut pfd = libc::pollfd { fd: from.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let ts = libc::timespec { tv_sec: wait.as_secs() as _, tv_nsec: wait.subsec_nanos() as _ };
            // SAFETY: one valid pollfd; ppoll for sub-millisecond timeouts.
            unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
            loop {
                match from.read(&mut buf) {
                    Ok(n) if n > 0 => queue.push_back((Instant::now() + delay, buf[..n].to_vec())),
                    _ => break,
                }
            }
            let now = Instant::now();
            while queue.front().is_some_and(|(t, _)| *t <= now) {
                let (_, p) = queue.pop_front().unwrap();
                // A full device queue drops the packet, as a wire would.
                let _ = to.write(&p);
            }
        }
    })
}
