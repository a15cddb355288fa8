//! The drops lab's tc ingress filter (`tcdrop.bpf.c`): drops UDP to one
//! port on an interface, as `tc filter ... action drop` would where tc's
//! gact module is missing. Attached in the calling thread's network
//! namespace; it stays (the filter holds the program) until the
//! interface's clsact qdisc is deleted.
use std::{mem::MaybeUninit, os::fd::AsFd};

use anyhow::Context;
use libbpf_rs::{
    skel::{OpenSkel, SkelBuilder},
    OpenObject, TcHookBuilder, TC_INGRESS,
};

crate::skeleton!("tcdrop");
use skel::{TcdropSkel, TcdropSkelBuilder};

/// Drops IPv4 UDP to `port` at the ingress of interface `ifindex`
/// (making its clsact qdisc).
pub fn attach(ifindex: i32, port: u16) -> anyhow::Result<()> {
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let mut open = TcdropSkelBuilder::default().open(storage).context("opening the tc filter")?;
    open.maps.rodata_data.as_deref_mut().expect("rodata present").drop_port = port;
    let skel: TcdropSkel<'static> = open.load().context("loading the tc filter")?;
    let mut hook = TcHookBuilder::new(skel.progs.tc_drop.as_fd())
        .ifindex(ifindex)
        .replace(true)
        .handle(1)
        .priority(1)
        .hook(TC_INGRESS);
    hook.create().context("making the clsact qdisc")?;
    hook.attach().context("attaching the tc filter")?;
    Ok(())
}
