//! `mcp-tasks store …`: the operator's commands over [`mcp_tasks::admin`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use mcp_tasks::admin::{
    self, AdminError, BackupReport, CompactReport, Filter, ListPage, Location, MigrateReport,
    OwnerUsageReport, PurgeReport, StatsReport, TaskDetail, VerifyReport,
};
use serde::Serialize;

/// Exit statuses of `mcp-tasks store …`, for `--help`.
pub const EXIT_CODES: &str = "Exit status: 0 success; 1 an error (one line on stderr, nothing changed); 2 a usage error; 3 `verify` found problems.";

#[derive(Subcommand)]
pub enum StoreCommand {
    /// Tasks by status and tool, live and due tasks, the oldest live task, space used, schema
    /// version and boot epoch.
    Stats {
        #[command(flatten)]
        common: Target,
        /// Instead: what each principal keeps in the store (tasks and bytes, finished tasks
        /// included), largest first: the figures the disk quota (`serve --max-stored-bytes`)
        /// compares with its limit. Reads the store's usage counters, no record.
        #[arg(long)]
        by_owner: bool,
    },
    /// Tasks matching filters, a page at a time (`--after` the last id for the next page).
    List {
        #[command(flatten)]
        common: Target,
        #[command(flatten)]
        filter: FilterArgs,
        /// Print the ids only, one a line, without the header (for scripts).
        #[arg(short, long, conflicts_with = "json")]
        quiet: bool,
    },
    /// One task in full: snapshot, journal of steps, input keys issued and answered, owner,
    /// lease and epoch on a shared store.
    Show {
        #[command(flatten)]
        common: Common,
        /// The task id.
        id: String,
    },
    /// A consistent copy of a redb store (one read transaction, also while a server runs),
    /// verified by opening it.
    Backup {
        #[command(flatten)]
        common: Target,
        /// The new file (never overwritten).
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
    },
    /// Gives a redb file's free pages back to the file system (offline: stop the server).
    Compact {
        #[command(flatten)]
        common: Target,
    },
    /// Checks a store: redb's page checksums (offline), every record decoded, the indexes.
    Verify {
        #[command(flatten)]
        common: Target,
    },
    /// Copies every task, journal and answer to another store (redb ⇄ PostgreSQL);
    /// idempotent; refuses a store a running server holds.
    Migrate {
        /// The source store (a redb path or a postgres:// URL).
        #[arg(long, value_name = "PATH|URL")]
        from: String,
        /// The target store (a redb path, created if missing, or a postgres:// URL).
        #[arg(long, value_name = "PATH|URL")]
        to: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Removes the tasks matching filters (offline for redb; refuses while replicas run).
    Purge {
        #[command(flatten)]
        common: Target,
        #[command(flatten)]
        filter: FilterArgs,
        /// Only list what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
}

/// The store a command reads when none is named.
const DEFAULT_STORE: &str = "mcp-tasks.redb";

#[derive(Args)]
pub struct Common {
    /// The store: a redb file or a postgres:// URL [default: mcp-tasks.redb].
    #[arg(long = "store", value_name = "PATH|URL")]
    store_option: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl Common {
    fn location(&self) -> Location {
        Location::parse(self.store_option.as_deref().unwrap_or(DEFAULT_STORE))
    }
}

/// The store of a command that takes no other argument: named as the argument
/// (`store list FILE`) or with `--store`.
#[derive(Args)]
pub struct Target {
    /// The store: a redb file or a postgres:// URL (the same as `--store`).
    #[arg(value_name = "STORE", conflicts_with = "store_option")]
    store: Option<String>,
    #[command(flatten)]
    common: Common,
}

impl Target {
    fn location(&self) -> Location {
        match &self.store {
            Some(store) => Location::parse(store),
            None => self.common.location(),
        }
    }

    fn json(&self) -> bool {
        self.common.json
    }
}

#[derive(Args)]
pub struct FilterArgs {
    /// Only tasks with this status (repeatable): working, input_required, completed, failed,
    /// cancelled.
    #[arg(long, value_name = "STATUS", value_parser = parse_status)]
    status: Vec<String>,
    /// Only tasks of this tool.
    #[arg(long)]
    tool: Option<String>,
    /// Only tasks of this tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// Only tasks created longer ago than this (e.g. 90s, 15m, 2h, 7d).
    #[arg(long, value_name = "AGE", value_parser = admin::parse_age)]
    older_than: Option<std::time::Duration>,
    /// At most this many tasks (list: default 100).
    #[arg(long)]
    limit: Option<usize>,
    /// Start after this task id (the cursor a list page prints).
    #[arg(long, value_name = "ID")]
    after: Option<String>,
}

fn parse_status(s: &str) -> Result<String, String> {
    match mcp_tasks::TaskStatus::from_wire(s) {
        Some(status) => Ok(status.as_str().to_owned()),
        None => Err(format!(
            "`{s}` is not a status (working, input_required, completed, failed, cancelled)"
        )),
    }
}

impl FilterArgs {
    fn filter(self) -> Filter {
        Filter {
            status: self.status,
            tool: self.tool,
            tenant: self.tenant,
            older_than_ms: self.older_than.map(|d| d.as_millis() as u64),
            limit: self.limit,
            after: self.after,
        }
    }
}

pub async fn run(command: StoreCommand) -> ExitCode {
    match execute(command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_json<T: Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("error: cannot print JSON: {e}"),
    }
}

fn time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since the epoch (proleptic Gregorian), UTC.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// The first line of `stats`: which store was read, and how.
fn print_store_line(location: &str, backend: &str, via_server: bool) {
    let how = if via_server {
        ", read through the running server"
    } else {
        ""
    };
    println!("store      {location} ({backend}{how})");
}

/// Prints `report` as JSON with `json`, else for people with `human`.
fn report<T: Serialize>(json: bool, report: &T, human: impl FnOnce(&T)) {
    if json {
        print_json(report);
    } else {
        human(report);
    }
}

async fn execute(command: StoreCommand) -> Result<ExitCode, AdminError> {
    match command {
        StoreCommand::Stats {
            common,
            by_owner: true,
        } => {
            let r = admin::usage_by_owner(&common.location()).await?;
            report(common.json(), &r, print_usage);
        }
        StoreCommand::Stats { common, .. } => {
            let r = admin::stats(&common.location()).await?;
            report(common.json(), &r, print_stats);
        }
        StoreCommand::List {
            common,
            filter,
            quiet,
        } => {
            let page = admin::list(&common.location(), &filter.filter()).await?;
            report(common.json(), &page, |page| print_list(page, quiet));
        }
        StoreCommand::Show { common, id } => {
            let t = admin::show(&common.location(), &id).await?;
            report(common.json, &t, print_task);
        }
        StoreCommand::Backup { common, to } => {
            let r = admin::backup(&common.location(), &to).await?;
            report(common.json(), &r, print_backup);
        }
        StoreCommand::Compact { common } => {
            let r = admin::compact(&common.location()).await?;
            report(common.json(), &r, print_compact);
        }
        StoreCommand::Verify { common } => {
            let r = admin::verify(&common.location()).await?;
            report(common.json(), &r, print_verify);
            return Ok(if r.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            });
        }
        StoreCommand::Migrate { from, to, json } => {
            let r = admin::migrate(&Location::parse(&from), &Location::parse(&to)).await?;
            report(json, &r, print_migrate);
        }
        StoreCommand::Purge {
            common,
            filter,
            dry_run,
        } => {
            let r = admin::purge(&common.location(), &filter.filter(), dry_run).await?;
            report(common.json(), &r, print_purge);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `store stats --by-owner`, for people.
fn print_usage(r: &OwnerUsageReport) {
    print_store_line(&r.location, &r.backend, r.via_server);
    println!(
        "{:<20} {:<24} {:>8} {:>12}",
        "TENANT", "PRINCIPAL", "TASKS", "BYTES"
    );
    for o in &r.owners {
        println!(
            "{:<20} {:<24} {:>8} {:>12}",
            o.tenant, o.principal, o.tasks, o.bytes
        );
    }
}

/// `store stats`, for people.
fn print_stats(r: &StatsReport) {
    print_store_line(&r.location, &r.backend, r.via_server);
    println!(
        "schema     {}   boot epoch {}",
        r.schema_version,
        r.boot_epoch.map_or("-".into(), |e| e.to_string())
    );
    println!(
        "tasks      {} ({} live, {} undecodable, {} of snapshots)",
        r.tasks,
        r.live,
        r.undecodable,
        bytes(r.snapshot_bytes)
    );
    for (status, n) in &r.by_status {
        println!("  {status:<16} {n}");
    }
    if !r.by_tool.is_empty() {
        println!("by tool");
        for (tool, n) in &r.by_tool {
            println!("  {tool:<16} {n}");
        }
    }
    println!(
        "due        {} live past their expiry, {} finished due for deletion",
        r.due_for_expiry, r.due_for_deletion
    );
    match &r.oldest_live {
        Some(o) => println!(
            "oldest live {} ({}, created {})",
            o.id,
            o.status,
            time(o.created_at_ms)
        ),
        None => println!("oldest live -"),
    }
    if let Some(file) = r.space.file_bytes {
        println!(
            "file       {} ({} in table pages, about {} free)",
            bytes(file),
            bytes(r.space.used_bytes.unwrap_or(0)),
            bytes(r.space.free_bytes.unwrap_or(0))
        );
    }
    for (table, size) in &r.space.tables {
        println!("table      {table:<12} {}", bytes(*size));
    }
    for n in &r.nodes {
        println!(
            "node       {:<20} heartbeat {:.1} s ago, {} live tasks",
            n.node, n.heartbeat_age_s, n.live_tasks
        );
    }
}

/// `store list`, for people (ids only with `quiet`).
fn print_list(page: &ListPage, quiet: bool) {
    if quiet {
        for t in &page.tasks {
            println!("{}", t.id);
        }
    } else if !page.tasks.is_empty() {
        // As wide as the rows: an id is `tsk_` and 32 hex digits, a time 20 characters.
        println!(
            "{:<36}  {:<14} {:<20} {:<12} {:<20}  MESSAGE",
            "ID", "STATUS", "TOOL", "TENANT", "CREATED"
        );
    }
    for t in page.tasks.iter().filter(|_| !quiet) {
        println!(
            "{}  {:<14} {:<20} {:<12} {}{}",
            t.id,
            t.status,
            t.tool,
            t.tenant,
            time(t.created_at_ms),
            t.status_message
                .as_deref()
                .map(|m| format!("  {m}"))
                .unwrap_or_default()
        );
    }
    if !page.undecodable.is_empty() {
        eprintln!(
            "{} records do not decode (see `store verify`)",
            page.undecodable.len()
        );
    }
    if let Some(next) = &page.next {
        eprintln!("more: --after {next}");
    }
}

/// `store show`, for people.
fn print_task(t: &TaskDetail) {
    let s = &t.summary;
    println!("task       {}", s.id);
    println!(
        "status     {} (seq {}){}",
        s.status,
        s.seq,
        s.status_message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    );
    println!("tool       {}", s.tool);
    println!("owner      {}", t.owner);
    println!(
        "created    {}   updated {}",
        time(s.created_at_ms),
        time(s.last_updated_at_ms)
    );
    println!(
        "expires    {}",
        t.expires_at_ms.map_or("never".into(), time)
    );
    println!(
        "attempts   {}   cancel requested {}",
        t.attempts, t.cancel_requested
    );
    if let Some(lease) = &t.lease {
        println!(
            "lease      node {} epoch {}",
            lease.node.as_deref().unwrap_or("(unclaimed)"),
            lease.epoch
        );
    }
    println!(
        "snapshot   v{}, {}",
        t.snapshot_version,
        bytes(t.snapshot_bytes as u64)
    );
    println!("arguments  {}", t.arguments);
    println!("journal    {} steps", t.journal.len());
    for (step, result) in &t.journal {
        match t.step_attempts.get(step) {
            Some(attempt) => println!("  {step} = {result}  (attempt {attempt})"),
            None => println!("  {step} = {result}  (attempt not recorded)"),
        }
    }
    println!(
        "inputs     {} issued, {} pending, {} answered",
        t.input_keys_issued.len(),
        t.input_requests_pending.len(),
        t.input_answers.len()
    );
    for key in &t.input_keys_issued {
        let state = if t.input_requests_pending.contains_key(key) {
            "pending".to_owned()
        } else if let Some(answer) = t.input_answers.get(key) {
            format!("answered {answer}")
        } else {
            "withdrawn".to_owned()
        };
        println!("  {key}: {state}");
    }
    if let Some(outcome) = &t.outcome {
        println!("outcome    {outcome}");
    }
}

/// `store backup`, for people.
fn print_backup(r: &BackupReport) {
    println!(
        "backed up {} tasks and {} meta entries to {} ({}){}; verified by opening it",
        r.tasks,
        r.meta,
        r.to,
        bytes(r.bytes),
        if r.via_server {
            ", made by the running server"
        } else {
            ""
        }
    );
}

/// `store compact`, for people.
fn print_compact(r: &CompactReport) {
    println!(
        "compacted: {} -> {}",
        bytes(r.before_bytes),
        bytes(r.after_bytes)
    );
}

/// `store verify`, for people.
fn print_verify(r: &VerifyReport) {
    println!(
        "{} records read; {} undecodable; {} index problems; pages {}",
        r.records,
        r.undecodable.len(),
        r.index_problems.len(),
        match (&r.pages_problem, r.pages_checked) {
            (Some(p), _) => p.clone(),
            (None, true) => "checked, no damage".into(),
            (None, false) => "not checked (a running server holds the file)".into(),
        }
    );
    for (id, why) in &r.undecodable {
        println!("  undecodable {id}: {why}");
    }
    for p in &r.index_problems {
        println!("  {p}");
    }
}

/// `store migrate`, for people.
fn print_migrate(r: &MigrateReport) {
    println!(
        "migrated {} -> {}: {} tasks written ({} live, resumable there), {} already identical, {} meta entries",
        r.from, r.to, r.tasks, r.live, r.unchanged, r.meta
    );
}

/// `store purge`, for people.
fn print_purge(r: &PurgeReport) {
    for t in &r.tasks {
        println!(
            "{}  {:<14} {:<20} {}",
            t.id,
            t.status,
            t.tool,
            time(t.created_at_ms)
        );
    }
    println!(
        "{} {} tasks",
        if r.dry_run { "would remove" } else { "removed" },
        r.tasks.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_utc() {
        assert_eq!(time(0), "1970-01-01T00:00:00Z");
        assert_eq!(time(1_764_547_200_000), "2025-12-01T00:00:00Z");
        assert_eq!(time(951_782_400_000 + 3_723_000), "2000-02-29T01:02:03Z");
    }

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
    }
}
