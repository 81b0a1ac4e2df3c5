//! `Netsplit`: cuts the paths between a cluster's members in the kernel's
//! packet filter (nftables), whatever addresses the members give each
//! other. A proxy on a member's address cuts only the connections others
//! dial to it, and a client dialling the same address would be cut too
//! (Sentinel hands out the address replicas use); this cuts both directions
//! and never a client.
//!
//! Each member runs as a uid of its own. When a TCP connection opens, its
//! conntrack entry is marked with the uid that dialled it, so every packet
//! of it, either way, is known by who dialled and which port was dialled.
//! Isolating member `i` drops the connections `i` dialled to another
//! member's ports and those another member dialled to `i`'s: open ones go
//! silent (a black hole: no reset), new ones never complete. Clients run
//! as this process's uid and are never matched.
//!
//! Needs root and the `nft` program (Debian's `nftables`, which
//! `scripts/stores install` installs); [`Netsplit::new`] says why not.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Uids given to members: this plus the member's first port, so members of
/// clusters running side by side never share one.
const UID_BASE: u32 = 3_000_000;

/// The packet filter's cuts for one cluster: a table of its own, named
/// after this process, removed when dropped (and, when a test process died
/// without dropping it, by the next `Netsplit` made on the machine).
#[derive(Debug)]
pub struct Netsplit {
    table: String,
    /// Per member: its uid and the ports it listens on.
    members: Vec<(u32, Vec<u16>)>,
    isolated: Mutex<BTreeSet<usize>>,
}

impl Netsplit {
    /// A table for members listening on `ports` (per member, its first port
    /// first), each to run as [`run_as`](Self::run_as).
    ///
    /// # Errors
    /// Why the packet filter cannot be used: not root, no `nft`, or the
    /// kernel refused the table.
    pub(crate) fn new(ports: Vec<Vec<u16>>) -> Result<Self, String> {
        let uid = Command::new("id").arg("-u").output().ok();
        if uid.is_none_or(|o| o.stdout.trim_ascii() != b"0") {
            return Err("cutting links between members needs root (nftables)".into());
        }
        remove_stale_tables();
        let members: Vec<(u32, Vec<u16>)> = ports
            .into_iter()
            .map(|p| (UID_BASE + u32::from(p.first().copied().unwrap_or(0)), p))
            .collect();
        let table = format!(
            "lease_split_{}_{}",
            std::process::id(),
            members.first().map_or(0, |m| m.0 - UID_BASE)
        );
        let mut script = format!(
            "table inet {table} {{\n  chain cut {{\n  }}\n  chain out {{\n    type filter hook output priority 0; policy accept;\n"
        );
        for (uid, _) in &members {
            let _ = writeln!(
                script,
                "    ct state new meta skuid {uid} ct mark set {uid}"
            );
        }
        script.push_str("    jump cut\n  }\n}\n");
        nft(&script)?;
        Ok(Netsplit {
            table,
            members,
            isolated: Mutex::new(BTreeSet::new()),
        })
    }

    /// The uid and gid member `i` must run as.
    pub(crate) fn run_as(&self, i: usize) -> (u32, u32) {
        let uid = self.members[i].0;
        (uid, uid)
    }

    /// Hands `dir` (the member's data) to member `i`'s uid.
    ///
    /// # Panics
    /// When `chown` fails.
    pub(crate) fn own(&self, i: usize, dir: &Path) {
        let (uid, gid) = self.run_as(i);
        let ok = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chown {} to {uid}", dir.display());
    }

    /// Cuts member `i` off from every other member, both ways.
    ///
    /// # Panics
    /// When `nft` refuses the rules.
    pub fn isolate(&self, i: usize) {
        let mut isolated = self
            .isolated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        isolated.insert(i);
        self.apply(&isolated);
    }

    /// Heals what [`isolate`](Self::isolate) cut for member `i`.
    ///
    /// # Panics
    /// When `nft` refuses the rules.
    pub fn rejoin(&self, i: usize) {
        let mut isolated = self
            .isolated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        isolated.remove(&i);
        self.apply(&isolated);
    }

    /// Replaces the cuts with those of the `isolated` members, at once.
    fn apply(&self, isolated: &BTreeSet<usize>) {
        let mut script = format!("flush chain inet {} cut\n", self.table);
        if !isolated.is_empty() {
            // A cut connection whose conntrack entry went away (closed with a
            // reset meanwhile) would come back mid-stream as a "new" one,
            // marked by the sender and seen in reverse, which no rule below
            // matches: drop members' packets that open nothing.
            let _ = writeln!(
                script,
                "add rule inet {t} cut ct state new meta skuid {{ {uids} }} tcp flags & (syn | ack) != syn drop",
                t = self.table,
                uids = join(self.members.iter().map(|m| m.0))
            );
        }
        for &i in isolated {
            let (uid, ports) = &self.members[i];
            let others: Vec<&(u32, Vec<u16>)> = self
                .members
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, m)| m)
                .collect();
            let other_uids = join(others.iter().map(|m| m.0));
            let other_ports = join(others.iter().flat_map(|m| m.1.iter().copied()));
            let own_ports = join(ports.iter().copied());
            if others.is_empty() {
                continue; // alone already
            }
            let _ = writeln!(
                script,
                "add rule inet {t} cut ct mark {uid} meta l4proto tcp ct original proto-dst {{ {other_ports} }} drop",
                t = self.table
            );
            let _ = writeln!(
                script,
                "add rule inet {t} cut ct mark {{ {other_uids} }} meta l4proto tcp ct original proto-dst {{ {own_ports} }} drop",
                t = self.table
            );
        }
        if let Err(e) = nft(&script) {
            panic!("nft refused the cuts: {e}");
        }
    }
}

impl Drop for Netsplit {
    fn drop(&mut self) {
        let _ = nft(&format!("delete table inet {}\n", self.table));
    }
}

fn join(items: impl Iterator<Item = impl std::fmt::Display>) -> String {
    items.map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

/// `nft`: Debian keeps it in /usr/sbin, which a non-login root shell's
/// PATH may lack.
fn nft_program() -> &'static str {
    if Path::new("/usr/sbin/nft").exists() {
        "/usr/sbin/nft"
    } else {
        "nft"
    }
}

/// Runs `nft -f -` on `script`.
fn nft(script: &str) -> Result<(), String> {
    let mut child = Command::new(nft_program())
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft (Debian package nftables): {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("cannot feed nft: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("nft did not finish: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    let hint = if why.contains("No such file or directory") {
        " (is the kernel's connection tracking there? modprobe nf_conntrack nft_ct)"
    } else if why.contains("Operation not permitted") {
        " (nftables needs CAP_NET_ADMIN)"
    } else {
        ""
    };
    Err(format!("nft failed{hint}: {why}\n{script}"))
}

/// Deletes the tables of test processes that are gone.
fn remove_stale_tables() {
    let Ok(out) = Command::new(nft_program())
        .args(["list", "tables"])
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.trim().strip_prefix("table inet lease_split_") else {
            continue;
        };
        let pid = name.split('_').next().unwrap_or("");
        if !pid.is_empty() && !Path::new("/proc").join(pid).exists() {
            let _ = nft(&format!("delete table inet lease_split_{name}\n"));
        }
    }
}
