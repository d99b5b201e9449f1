//! The conditions a benchmark's figures hold under, measured and printed by the bench itself
//! before its tables: the kernel, the cores, the file system the store is on, how long one
//! `fdatasync` of a few freshly written pages takes there (p50 and p99), and the durability
//! mode. A durable lifecycle cannot be faster than the disk's sync, so a table without them
//! cannot be compared with another machine's. Not a bench target itself (a folder module).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Pages written before each measured `fdatasync`: about what one group commit of a task's
/// transition writes to a redb file (the changed B-tree leaves and branches, the header).
const PAGES: u64 = 4;
const PAGE: usize = 4096;
/// The probe file's size in pages: the writes overwrite pages the file already has, as most of
/// a redb file's writes do.
const FILE_PAGES: u64 = 64;

/// Prints the conditions of a run whose store lives in `store_dir`, with `durability` saying
/// what a commit waits for (e.g. "redb, every commit fsync'd"). Returns the measured
/// `fdatasync` p50 (the physical bound of a durable commit there), if the probe ran.
pub fn print(store_dir: &Path, durability: &str) -> Option<Duration> {
    println!("## conditions\n");
    println!("- kernel: {}", kernel());
    println!(
        "- cores: {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "- store directory: {} ({})",
        store_dir.display(),
        file_system(store_dir)
    );
    let p50 = match fdatasync_probe(store_dir, 200) {
        Ok((p50, p99)) => {
            println!(
                "- fdatasync after writing {PAGES} × 4 KiB pages there, 200 rounds: p50 {:.3} ms, p99 {:.3} ms",
                ms(p50),
                ms(p99)
            );
            Some(p50)
        }
        Err(e) => {
            println!("- fdatasync probe failed: {e}");
            None
        }
    };
    println!("- durability: {durability}\n");
    p50
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| format!("Linux {}", s.trim()))
        .unwrap_or_else(|_| std::env::consts::OS.to_owned())
}

/// The file system type, device and mount point holding `dir` (from `/proc/self/mountinfo`:
/// the mount with the longest mount point that is a prefix of the directory).
fn file_system(dir: &Path) -> String {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return "file system unknown".to_owned();
    };
    let mut best: Option<(PathBuf, String, String)> = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(mount), Some(fstype), Some(source)) =
            (fields.get(4), fields.get(dash + 1), fields.get(dash + 2))
        else {
            continue;
        };
        let mount = PathBuf::from(mount.replace("\\040", " "));
        let longer = best
            .as_ref()
            .is_none_or(|(b, _, _)| mount.as_os_str().len() >= b.as_os_str().len());
        if dir.starts_with(&mount) && longer {
            best = Some((mount, (*fstype).to_owned(), (*source).to_owned()));
        }
    }
    match best {
        Some((mount, fstype, source)) => {
            format!("{fstype} on {source}, mounted at {}", mount.display())
        }
        None => "file system unknown".to_owned(),
    }
}

/// p50 and p99 of `rounds` `fdatasync` calls, each after writing [`PAGES`] pages of a file in
/// `dir` (removed afterwards).
fn fdatasync_probe(dir: &Path, rounds: usize) -> std::io::Result<(Duration, Duration)> {
    let path = dir.join(".fdatasync-probe");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let page = [0xA5u8; PAGE];
    for i in 0..FILE_PAGES {
        file.write_all_at(&page, i * PAGE as u64)?;
    }
    file.sync_all()?;
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds as u64 {
        for k in 0..PAGES {
            let at = (round * PAGES + k) % FILE_PAGES;
            file.write_all_at(&page, at * PAGE as u64)?;
        }
        let started = Instant::now();
        file.sync_data()?;
        samples.push(started.elapsed());
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Ok((at(0.50), at(0.99)))
}
