//! A simulated disk for redb: a redb `StorageBackend` that keeps the *durable* image (as of
//! the last completed sync) apart from the *live* one (what the process reads: the page cache),
//! crashes at a seeded write or sync, and builds the image a power loss leaves behind: the
//! durable bytes plus a seeded choice of the unsynced writes, the last of them possibly torn.
//! It also injects storage faults (disk full on writes, I/O errors on syncs) and, as a
//! deliberately broken disk for the checker's self-test, can acknowledge syncs it never did.

use std::io::{Error, ErrorKind};
use std::sync::{Arc, Mutex};

use mcp_tasks::store::BackendFactory;
use redb::StorageBackend;

use super::Rng;

#[derive(Debug, Clone)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

fn apply(image: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write { offset, data } => {
            let offset = *offset as usize;
            if image.len() < offset + data.len() {
                image.resize(offset + data.len(), 0);
            }
            image[offset..offset + data.len()].copy_from_slice(data);
        }
        Op::SetLen(len) => image.resize(*len as usize, 0),
    }
}

/// A storage fault: ops number `from..from + count` (writes, set_len and syncs, counted from 1)
/// fail; writes and set_len with ENOSPC (nothing written), syncs with EIO. A failed sync has
/// Linux semantics: the writes it should have made durable are *dropped* (the kernel marks the
/// pages clean without writing them): they stay visible to reads (the page cache) but no later
/// sync makes them durable, so a power loss never brings them back.
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    /// The first failing op (counted from 1).
    pub from: u64,
    /// How many ops in a row fail.
    pub count: u64,
}

type Hook = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Writes and length changes since the last completed sync, in order.
    unsynced: Vec<Op>,
    /// Writes, set_len and syncs so far.
    ops: u64,
    syncs: u64,
    /// Crash when `ops` reaches this number.
    crash_at: Option<u64>,
    crashed: bool,
    /// Set by the op that crashed (cleared at the start of every op).
    crashed_here: bool,
    /// The op that crashed, if a write: it may reach the disk torn.
    crashing_write: Option<Op>,
    faults: Vec<Fault>,
    faults_hit: u64,
    /// Syncs that failed (their writes were dropped).
    failed_syncs: u64,
    /// The next this-many syncs fail with EIO.
    fail_syncs: u64,
    /// Broken on purpose: syncs report success without making anything durable.
    lying_syncs: bool,
    on_crash: Vec<Hook>,
}

/// A simulated disk. Clones share the bytes.
#[derive(Clone, Default)]
pub struct SimDisk(Arc<Mutex<State>>);

impl SimDisk {
    /// An empty disk.
    pub fn new() -> Self {
        Self::default()
    }

    /// A disk holding `image`, all of it durable.
    pub fn from_image(image: Vec<u8>) -> Self {
        let disk = Self::default();
        {
            let mut s = disk.lock();
            s.durable = image.clone();
            s.live = image;
        }
        disk
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Crash when the `n`-th write/set_len/sync (from now) is issued.
    pub fn crash_after(&self, n: u64) {
        let mut s = self.lock();
        s.crash_at = Some(s.ops + n.max(1));
    }

    /// Adds a storage fault (see [`Fault`]).
    pub fn add_fault(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    /// Broken on purpose (the checker's self-test): while `lying`, syncs report success without
    /// making anything durable.
    pub fn set_lying_syncs(&self, lying: bool) {
        self.lock().lying_syncs = lying;
    }

    /// Runs `hook` at the moment of the crash (under the disk's lock: nothing reaches the disk
    /// after it).
    pub fn on_crash(&self, hook: impl FnOnce() + Send + 'static) {
        self.lock().on_crash.push(Box::new(hook));
    }

    /// Writes, set_len and syncs issued so far.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Makes the next `n` syncs fail with EIO (Linux semantics, see [`Fault`]).
    pub fn fail_next_syncs(&self, n: u64) {
        self.lock().fail_syncs = n;
    }

    /// Syncs that failed so far (their writes were dropped).
    pub fn failed_syncs(&self) -> u64 {
        self.lock().failed_syncs
    }

    /// Writes and set_len calls that an injected [`Fault`] failed so far.
    pub fn faults_hit(&self) -> u64 {
        self.lock().faults_hit
    }

    /// Whether the power went off.
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// The driver's [`Alive`](super::driver::Alive) of a server on this disk: alive until
    /// the power goes.
    pub fn alive(&self) -> super::driver::Alive {
        let disk = self.clone();
        std::sync::Arc::new(move || !disk.crashed())
    }

    /// Power off now (if not crashed already).
    pub fn crash_now(&self) {
        let mut s = self.lock();
        Self::crash(&mut s);
    }

    fn crash(s: &mut State) {
        if !s.crashed {
            s.crashed = true;
            for hook in s.on_crash.drain(..) {
                hook();
            }
        }
    }

    /// The bytes a power loss at the crash leaves: the durable image plus, chosen by `rng`,
    /// either a prefix of the unsynced writes (in order) or any subset of them (a disk that
    /// reorders), the last applied write possibly torn.
    pub fn crash_image(&self, rng: &mut Rng) -> Vec<u8> {
        let s = self.lock();
        let mut pending = s.unsynced.clone();
        if let Some(op) = &s.crashing_write {
            pending.push(op.clone());
        }
        let mut image = s.durable.clone();
        if pending.is_empty() || s.lying_syncs {
            // A lying disk loses everything since the last sync it really did.
            return image;
        }
        let chosen: Vec<usize> = if rng.chance(50) {
            (0..rng.range(0, pending.len() as u64 + 1) as usize).collect()
        } else {
            (0..pending.len()).filter(|_| rng.chance(50)).collect()
        };
        let tear = rng.chance(50);
        for (n, &i) in chosen.iter().enumerate() {
            let op = &pending[i];
            match op {
                Op::Write { offset, data } if tear && n + 1 == chosen.len() && data.len() > 1 => {
                    let keep = rng.range(1, data.len() as u64) as usize;
                    apply(
                        &mut image,
                        &Op::Write {
                            offset: *offset,
                            data: data[..keep].to_vec(),
                        },
                    );
                }
                op => apply(&mut image, op),
            }
        }
        image
    }

    /// The durable bytes (as of the last completed sync).
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// The live bytes (what a process that did not lose power would find).
    pub fn live_image(&self) -> Vec<u8> {
        self.lock().live.clone()
    }

    /// A factory of backends on this disk, for `Store::open_with_backend`.
    pub fn factory(&self) -> BackendFactory {
        let disk = self.clone();
        Arc::new(move || {
            if disk.crashed() {
                return Err(Error::other("simulated power loss: the disk is gone"));
            }
            Ok(Box::new(SimBackend(disk.clone())) as Box<dyn StorageBackend>)
        })
    }
}

fn gone() -> Error {
    Error::other("simulated power loss")
}

/// One open of a [`SimDisk`].
#[derive(Clone)]
pub struct SimBackend(SimDisk);

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimBackend")
    }
}

impl SimBackend {
    /// Counts one mutating op; `Err` when it crashes or hits a fault.
    fn tick(s: &mut State) -> Result<(), Error> {
        s.crashed_here = false;
        if s.crashed {
            return Err(gone());
        }
        s.ops += 1;
        if s.crash_at.is_some_and(|at| s.ops >= at) {
            s.crashed_here = true;
            SimDisk::crash(s);
            return Err(gone());
        }
        if s.faults
            .iter()
            .any(|f| s.ops >= f.from && s.ops < f.from + f.count)
        {
            s.faults_hit += 1;
            return Err(Error::from(ErrorKind::StorageFull));
        }
        Ok(())
    }
}

impl StorageBackend for SimBackend {
    fn len(&self) -> Result<u64, Error> {
        let s = self.0.lock();
        if s.crashed {
            return Err(gone());
        }
        Ok(s.live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), Error> {
        let s = self.0.lock();
        if s.crashed {
            return Err(gone());
        }
        let offset = offset as usize;
        if offset + out.len() > s.live.len() {
            return Err(Error::from(ErrorKind::UnexpectedEof));
        }
        out.copy_from_slice(&s.live[offset..offset + out.len()]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), Error> {
        let mut s = self.0.lock();
        Self::tick(&mut s)?;
        let op = Op::SetLen(len);
        apply(&mut s.live, &op);
        s.unsynced.push(op);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), Error> {
        let mut s = self.0.lock();
        let forced = if s.fail_syncs > 0 && !s.crashed {
            s.fail_syncs -= 1;
            Err(Error::from(ErrorKind::StorageFull))
        } else {
            Ok(())
        };
        match forced.and_then(|()| Self::tick(&mut s)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::StorageFull => {
                // Linux: the pages of the failed writeback are marked clean, never written.
                s.unsynced.clear();
                s.failed_syncs += 1;
                return Err(Error::other("simulated I/O error during fsync (EIO)"));
            }
            Err(e) => return Err(e),
        }
        s.syncs += 1;
        if !s.lying_syncs {
            let ops = std::mem::take(&mut s.unsynced);
            for op in &ops {
                apply(&mut s.durable, op);
            }
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), Error> {
        let mut s = self.0.lock();
        let op = Op::Write {
            offset,
            data: data.to_vec(),
        };
        match Self::tick(&mut s) {
            Ok(()) => {}
            Err(e) => {
                if s.crashed_here {
                    // The write that was under way when the power went: it may be torn.
                    s.crashing_write = Some(op);
                }
                return Err(e);
            }
        }
        apply(&mut s.live, &op);
        s.unsynced.push(op);
        Ok(())
    }
}
