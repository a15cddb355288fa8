//! The processes at the other end of the sockets and pipes threads waited
//! on, looked up in procfs (see [`crate::engine::procfd`]) about once a
//! second during the run, for the sockets and pipes new since the last look,
//! and once more at each report: a connection closed before the report is
//! still named if it lived through one look. The looks during the run are
//! made on a thread of their own (one can take up to 3 s on a host with
//! millions of descriptors): the run's loop, and Ctrl-C, never wait on one.
//!
//! - A TCP or UDP connection: the socket whose endpoints are the waiter's
//!   reversed, in the kernel's socket tables of every network namespace on
//!   the host (a loopback connection's only in the waiter's own namespace;
//!   found in several namespaces, it is not named), then the processes
//!   holding that socket; for a connection still in its listener's queue
//!   (not accepted: no process holds it), the processes holding the
//!   listener, said so.
//! - An anonymous pipe or a named FIFO: the processes holding its other end
//!   open (the write end for a reader, the read end for a writer), the
//!   waiter's own process included: a process waiting on a pipe only it can
//!   write to waits on itself. A FIFO is told from a pipe by its device (a
//!   pipe's is the kernel's one pipe file system) and found among the
//!   descriptors that name a path by their mount's device and their inode
//!   (procfd's fdinfo and mountinfo).
//! - A connected Unix socket: the processes holding its peer socket (the
//!   kernel's own link, read by the kernel half), the waiter's own process
//!   included.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::report::{Far, Peer, Thread};
use crate::engine::procfd::{self, Holder, Kind, Tuple};

/// Processes named per wait at most.
const MAX_PEERS: usize = 8;
/// Sockets and pipes looked up per look at most.
const MAX_OBJECTS: usize = 65536;
/// Sockets and pipes remembered at most.
const MAX_KEPT: usize = 1 << 18;
/// Looks a socket or pipe not found gets.
const TRIES: u8 = 3;
/// Holders kept per socket or pipe (a pipe's are filtered by end later).
const MAX_HOLDERS: usize = 64;

/// Sockets by their endpoints (namespace, inode, not yet accepted), for TCP
/// (false) and UDP (true).
type Tables = HashMap<bool, HashMap<Tuple, Vec<procfd::SocketAt>>>;

fn reversed((l, lp, r, rp): Tuple) -> Tuple {
    (r, rp, l, lp)
}

/// What was found so far.
#[derive(Default)]
struct Found {
    found: HashMap<Far, Vec<Holder>>,
    tries: HashMap<Far, u8>,
    /// Connections found in their listener's queue, not yet accepted: the
    /// holders found are the listener's.
    unaccepted: HashSet<Far>,
}

/// The other ends found so far, and the thread that looks during the run.
#[derive(Default)]
pub struct Peers {
    state: Arc<Mutex<Found>>,
    /// Asks the looking thread (started at the first ask; it ends when
    /// this is dropped).
    ask: Option<SyncSender<Vec<Far>>>,
    /// How long the thread's last look took, in ns.
    took: Arc<AtomicU64>,
}

impl Peers {
    fn state(&self) -> MutexGuard<'_, Found> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Has the other ends of `fars` not found yet looked up on the looking
    /// thread; nothing when it is still busy with the last ask (the next
    /// one asks again).
    pub fn ask(&mut self, fars: Vec<Far>) {
        if self.ask.is_none() {
            let (tx, rx) = sync_channel::<Vec<Far>>(1);
            let (state, took) = (self.state.clone(), self.took.clone());
            let spawned = std::thread::Builder::new().name("sonde-peers".into()).spawn(move || {
                for fars in rx {
                    let t0 = Instant::now();
                    state.lock().unwrap_or_else(|e| e.into_inner()).look(fars.into_iter(), false);
                    took.store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                }
            });
            if spawned.is_err() {
                // No thread: looked up at the report only.
                return;
            }
            self.ask = Some(tx);
        }
        if let Some(tx) = &self.ask {
            match tx.try_send(fars) {
                Ok(()) | Err(TrySendError::Full(_)) => {}
                Err(TrySendError::Disconnected(_)) => self.ask = None,
            }
        }
    }

    /// How long the last look during the run took.
    pub fn last_took(&self) -> Duration {
        Duration::from_nanos(self.took.load(Ordering::Relaxed))
    }
}

/// The kernel's device number (major << 20 | minor) of the pipe file system,
/// which every anonymous pipe's inode is on: that of a pipe made here (0
/// until one could be made).
fn pipefs_dev() -> Option<u64> {
    static DEV: AtomicU64 = AtomicU64::new(0);
    let known = DEV.load(Ordering::Relaxed);
    if known != 0 {
        return Some(known);
    }
    use std::os::unix::fs::MetadataExt;
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let dev = std::fs::metadata(format!("/proc/self/fd/{}", fds[0])).ok().map(|m| m.dev());
    // SAFETY: both descriptors are ours and closed once.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    let dev = procfd::kernel_dev(dev?);
    DEV.store(dev, Ordering::Relaxed);
    Some(dev)
}

/// Whether an inode of device `dev` (the kernel's number) is an anonymous
/// pipe's (else a named FIFO's). Not known (no pipe could be made): not a
/// pipe, so never looked up as one.
pub(super) fn on_pipefs(dev: u64) -> bool {
    pipefs_dev() == Some(dev)
}

/// What a pipe or FIFO of device `dev` (the kernel's number) and inode
/// `ino` is looked up as in the processes' descriptors.
fn pipe_key(dev: u64, ino: u64) -> (Kind, u64) {
    if on_pipefs(dev) {
        (Kind::Pipe, ino)
    } else {
        (Kind::Fifo { dev }, ino)
    }
}

/// The inode of the socket at the other end of `far`'s connection, when
/// exactly one is found (its listener's, and true, for one not yet
/// accepted).
fn peer_socket(far: &Far, tables: &Tables) -> Option<(u64, bool)> {
    let Far::Socket { tuple, udp, netns } = far else { return None };
    let found = tables.get(udp)?.get(&reversed(*tuple))?;
    let loopback = tuple.0.is_loopback() || tuple.2.is_loopback();
    let mut inodes: Vec<(u64, bool)> =
        found.iter().filter(|s| !loopback || s.ns == *netns).map(|s| (s.ino, s.unaccepted)).collect();
    inodes.sort_unstable();
    inodes.dedup();
    match inodes.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

impl Found {
    /// Looks up the other ends of `fars` not found yet (each at most
    /// [`TRIES`] times; `last`: once more whatever the count, and every
    /// pipe again, whose holders may have changed since: what a complete
    /// walk finds replaces what an earlier one found, and a pipe no process
    /// holds any more keeps its last holders). Nothing is kept
    /// from a look that could not ask every namespace or read every
    /// process's descriptors (a process could hold the other end unseen),
    /// and such a look is not counted as a try.
    pub fn look(&mut self, fars: impl Iterator<Item = Far>, last: bool) {
        let todo: HashSet<Far> = fars
            .filter(|f| {
                // A pipe's holders, and a connection not yet accepted when
                // found, may have changed since: looked up again at the end.
                let again = matches!(f, Far::Pipe { .. }) || self.unaccepted.contains(f);
                (last && again)
                    || (!self.found.contains_key(f) && (last || self.tries.get(f).copied().unwrap_or(0) < TRIES))
            })
            .take(MAX_OBJECTS)
            .collect();
        if todo.is_empty() || (!last && self.found.len() >= MAX_KEPT) {
            return;
        }
        let mut want: HashMap<bool, HashSet<Tuple>> = HashMap::new();
        let mut pipes: HashSet<(Kind, u64)> = HashSet::new();
        let mut unix: HashSet<u64> = HashSet::new();
        for f in &todo {
            match *f {
                Far::Socket { tuple, udp, .. } => {
                    want.entry(udp).or_default().insert(reversed(tuple));
                }
                Far::Pipe { dev, ino } => {
                    pipes.insert(pipe_key(dev, ino));
                }
                Far::Unix { peer } => {
                    unix.insert(peer);
                }
            }
        }
        let mut complete = true;
        let mut tables: Tables = HashMap::new();
        for (udp, set) in &want {
            let (t, done) = procfd::sockets_by_tuple(set, *udp);
            complete &= done;
            tables.insert(*udp, t);
        }
        let socks: HashMap<Far, (u64, bool)> =
            todo.iter().filter_map(|f| Some((*f, peer_socket(f, &tables)?))).collect();
        let sock_inodes: HashSet<u64> = socks.values().map(|(i, _)| *i).chain(unix.iter().copied()).collect();
        let held = if sock_inodes.is_empty() && pipes.is_empty() {
            procfd::Held { complete: true, ..Default::default() }
        } else {
            let fifos: HashSet<u64> = pipes
                .iter()
                .filter_map(|(k, _)| match k {
                    Kind::Fifo { dev } => Some(*dev),
                    _ => None,
                })
                .collect();
            procfd::holders(
                |k, ino| match k {
                    Kind::Socket => sock_inodes.contains(&ino),
                    Kind::Pipe | Kind::Fifo { .. } => pipes.contains(&(k, ino)),
                },
                &fifos,
                MAX_OBJECTS,
            )
        };
        if !(complete && held.complete) {
            return;
        }
        for f in todo {
            let key = match f {
                Far::Socket { .. } => socks.get(&f).map(|(ino, _)| (Kind::Socket, *ino)),
                Far::Pipe { dev, ino } => Some(pipe_key(dev, ino)),
                Far::Unix { peer } => Some((Kind::Socket, peer)),
            };
            match key.and_then(|k| held.by_inode.get(&k)) {
                Some(v) if !v.is_empty() && (self.found.len() < MAX_KEPT || self.found.contains_key(&f)) => {
                    let mut v = v.clone();
                    v.truncate(MAX_HOLDERS);
                    self.found.insert(f, v);
                    if socks.get(&f).is_some_and(|(_, u)| *u) {
                        self.unaccepted.insert(f);
                    } else {
                        self.unaccepted.remove(&f);
                    }
                }
                _ => self.tried([f]),
            }
        }
    }

    fn tried(&mut self, fars: impl IntoIterator<Item = Far>) {
        for f in fars {
            if self.tries.len() < MAX_KEPT || self.tries.contains_key(&f) {
                let n = self.tries.entry(f).or_default();
                *n = n.saturating_add(1); // every -i report tries once more
            }
        }
    }
}

impl Peers {
    /// Names the processes at the other end of every wait on a connected
    /// socket or an anonymous pipe in `threads`, looking up those not found
    /// yet once more (after the looking thread's look, if one is under way).
    pub fn name(&mut self, threads: &mut HashMap<u32, Thread>) {
        let fars: Vec<Far> = threads.values().flat_map(|t| &t.waits).filter_map(|w| w.far).collect();
        let mut st = self.state();
        st.look(fars.into_iter(), true);
        for w in threads.values_mut().flat_map(|t| t.waits.iter_mut()) {
            let Some((f, v)) = w.far.and_then(|f| Some((f, st.found.get(&f)?))) else { continue };
            let send = w.op == Some("send");
            let mut peers: Vec<Peer> = v
                .iter()
                .filter(|h| match w.far {
                    Some(Far::Pipe { .. }) if send => h.reads,
                    Some(Far::Pipe { .. }) => h.writes,
                    _ => true,
                })
                .map(|h| Peer { pid: h.pid, comm: h.comm.clone(), unaccepted: st.unaccepted.contains(&f) })
                .collect();
            peers.sort_by_key(|p| p.pid);
            peers.truncate(MAX_PEERS);
            w.peers = peers;
        }
    }
}
