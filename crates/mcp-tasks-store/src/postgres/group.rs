//! Group commit on PostgreSQL: the one-`Put` commits of a node's task actors that wait at the
//! same time go to the database in one transaction.
//!
//! Why: one transaction per transition costs a WAL flush per transition; one transaction for
//! every transition waiting at once passes them all with one (docs/BENCHMARKS.md, "PostgreSQL
//! beside redb"). The group's writes are announced to the other nodes with one `NOTIFY`
//! after its `COMMIT` (`Inner::announce`): no writing transaction notifies, so none waits
//! for PostgreSQL's notification-queue lock, which serialises notifying commits.
//!
//! How a group keeps each commit's own outcome, as if it had been alone:
//! - A refused write (a conflict or a fence: its conditional `UPDATE` changed no row) is only
//!   a refusal for that commit; the transaction goes on without it (nothing of it was
//!   written).
//! - Any other failure before `COMMIT` (an SQL error aborts the whole transaction; a pool or
//!   connection error) rolls the group back, and each commit is then made alone, exactly as
//!   without grouping, with its own outcome.
//! - A group waits at most [`GROUP_LOCK_WAIT_MS`] for a row lock (another node's transaction,
//!   or a frozen peer's, holding a task's row): past it the group is rolled back and each
//!   commit made alone under the session's own lock bound, so a locked row delays the others
//!   by that wait, not by the lock bound. Commits made alone (a group of one, or after a
//!   roll-back) run beside the committer, which goes on with the next group meanwhile.
//! - `COMMIT` itself waits for a lock under the session's bound, not the group's: PostgreSQL
//!   serialises notifying commits with a lock on its notification queue, held by each one
//!   while it commits, and a group must not give up for that ordinary wait.
//! - A `COMMIT` the server refuses with an error (a lock wait past its bound, a deferred
//!   trigger) was rolled back: each commit is then made alone. A `COMMIT` whose answer is lost
//!   (the connection, or a session the server ended) leaves every commit that was not refused
//!   with an unknown outcome, as a failed `COMMIT` of one would (the reconciliation that
//!   follows is the same).
//! - Only commits of one `Put` are grouped; a commit of several operations (the reaper's
//!   deletions, a store administration job) keeps its own transaction, since a refusal in the
//!   middle of it must undo its earlier operations and nothing else's.

use std::sync::{Arc, Weak};

use tokio::sync::{mpsc, oneshot};

use super::{Inner, PgFailure};
use crate::{Cause, StoreError, WriteOp};

/// The most commits in one group.
const GROUP_MAX: usize = 128;

/// How long a group's statements wait for a row lock before the group is made commit by
/// commit (`lock_timeout` of the group's transaction), in milliseconds.
pub(super) const GROUP_LOCK_WAIT_MS: u64 = 50;

/// What one commit returns: the leases it changed and the rows it deleted.
pub(super) type Applied = (Vec<(String, Option<i64>)>, u64);

/// One commit (of one `Put`) waiting for its group.
pub(super) struct GroupJob {
    op: WriteOp,
    done: oneshot::Sender<Result<Applied, PgFailure>>,
}

/// `Ok(the Put)` when `ops` may join a group (one `Put`), else `Err(ops)`.
pub(super) fn groupable(mut ops: Vec<WriteOp>) -> Result<WriteOp, Vec<WriteOp>> {
    match ops.as_slice() {
        [WriteOp::Put { .. }] => ops.pop().ok_or(ops),
        _ => Err(ops),
    }
}

impl Inner {
    /// Commits `op` (a `Put`, see [`groupable`]) with whatever other commits wait at the same
    /// time.
    pub(super) async fn commit_grouped(
        self: &Arc<Self>,
        op: WriteOp,
    ) -> Result<Applied, PgFailure> {
        let queue = self.group.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(group_committer(
                Arc::downgrade(self),
                rx,
                self.groups_in_flight,
            ));
            tx
        });
        let (done, answer) = oneshot::channel();
        if queue.send(GroupJob { op, done }).is_err() {
            return Err(PgFailure::Store(StoreError::Closed));
        }
        answer
            .await
            .unwrap_or(Err(PgFailure::Store(StoreError::Closed)))
    }

    /// Commits `job` in a transaction of its own, beside the committer (which goes on with
    /// the next group: a job waiting for a locked row holds up nothing else).
    fn commit_alone(self: &Arc<Self>, job: GroupJob) {
        let inner = self.clone();
        tokio::spawn(async move {
            let outcome = inner.commit_job(std::slice::from_ref(&job.op)).await;
            if outcome.is_ok() {
                inner.announce(super::put_ids(std::slice::from_ref(&job.op)));
            }
            let _ = job.done.send(outcome);
        });
    }

    /// Commits `jobs` as one transaction, or each alone when the group cannot be (see the
    /// module's docs); answers every job.
    async fn commit_group(self: &Arc<Self>, jobs: Vec<GroupJob>) {
        if jobs.len() == 1 {
            for job in jobs {
                self.commit_alone(job);
            }
            return;
        }
        match self.try_group(&jobs).await {
            Grouped::Committed(outcomes) => {
                let mut committed = Vec::with_capacity(jobs.len());
                for (job, outcome) in jobs.into_iter().zip(outcomes) {
                    if outcome.is_ok() {
                        committed.extend(super::put_ids(std::slice::from_ref(&job.op)));
                    }
                    let _ = job.done.send(outcome);
                }
                // One notification for the group, after its commit.
                self.announce(committed);
            }
            Grouped::CommitFailed(failure, outcomes) => {
                let detail = match &failure {
                    PgFailure::Pg(e) => super::pg_detail(e),
                    PgFailure::Pool(d) => d.clone(),
                    PgFailure::Store(e) => e.to_string(),
                };
                let mut failure = Some(failure);
                for (job, outcome) in jobs.into_iter().zip(outcomes) {
                    let outcome = match outcome {
                        // Refused: nothing of it was written, committed or not.
                        Err(refusal) => Err(refusal),
                        // The first keeps the database's own error (a lost connection marks
                        // the store unreachable); the others say the same in words.
                        Ok(_) => Err(failure.take().unwrap_or_else(|| {
                            PgFailure::Store(StoreError::Commit(Cause::message(format!(
                                "the group commit failed: {detail}"
                            ))))
                        })),
                    };
                    let _ = job.done.send(outcome);
                }
            }
            Grouped::RolledBack => {
                for job in jobs {
                    self.commit_alone(job);
                }
            }
        }
    }

    /// One transaction for `jobs`: their statements pipelined on one connection.
    async fn try_group(&self, jobs: &[GroupJob]) -> Grouped {
        let Ok(mut client) = self.client().await else {
            return Grouped::RolledBack;
        };
        let Ok(tx) = client.transaction().await else {
            return Grouped::RolledBack;
        };
        if tx
            .batch_execute(&format!("SET LOCAL lock_timeout = {GROUP_LOCK_WAIT_MS}"))
            .await
            .is_err()
        {
            return Grouped::RolledBack;
        }
        let outcomes = futures::future::join_all(jobs.iter().map(|job| async {
            let lease = self.put_op(&tx, &job.op).await?;
            Ok((lease.into_iter().collect::<Vec<_>>(), 0))
        }))
        .await;
        // A refusal leaves the transaction usable; any other failure aborted it.
        if outcomes
            .iter()
            .any(|o| matches!(o, Err(PgFailure::Pg(_) | PgFailure::Pool(_))))
        {
            return Grouped::RolledBack;
        }
        #[cfg(feature = "failpoints")]
        {
            let failed = (|| {
                fail::fail_point!("store::group_commit", |arg| Some(arg.unwrap_or_default()));
                None
            })();
            if let Some(arg) = failed {
                let failure = PgFailure::Store(StoreError::Commit(Cause::message(format!(
                    "failpoint store::group_commit: {arg}"
                ))));
                return Grouped::CommitFailed(failure, outcomes);
            }
        }
        // The group's short bound is for rows another transaction holds; `COMMIT` waits under
        // the session's bound, as any commit.
        if tx
            .batch_execute("SET LOCAL lock_timeout TO DEFAULT")
            .await
            .is_err()
        {
            return Grouped::RolledBack;
        }
        match tx.commit().await {
            Ok(()) => Grouped::Committed(outcomes),
            Err(e) if rolled_back_at_commit(&e) => Grouped::RolledBack,
            Err(e) => Grouped::CommitFailed(PgFailure::Pg(e), outcomes),
        }
    }
}

/// Whether `COMMIT` failed with an error the server reported for it (a deferred trigger, a
/// lock wait past its bound): PostgreSQL reports those before it writes the commit record, so
/// the transaction was rolled back and nothing of it was written. A lost connection, or a
/// server that ends the session (`FATAL`), leaves the outcome unknown.
fn rolled_back_at_commit(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.parsed_severity() == Some(tokio_postgres::error::Severity::Error))
}

/// How a group went.
enum Grouped {
    /// Committed: each job's outcome (a refusal for a refused one).
    Committed(Vec<Result<Applied, PgFailure>>),
    /// `COMMIT` failed (its outcome unknown), with each job's outcome before it.
    CommitFailed(PgFailure, Vec<Result<Applied, PgFailure>>),
    /// Nothing was committed: each job is to be made alone.
    RolledBack,
}

/// Takes the commits waiting at once, up to [`GROUP_MAX`], and commits them together, until
/// the store is dropped; up to `in_flight` groups at a time. A group waits for a free slot
/// before it takes the queue, so that the commits queued while every slot was busy join it.
/// The commits of one task are never in two groups at once: its actor waits for each commit
/// before it makes the next.
async fn group_committer(
    inner: Weak<Inner>,
    mut queue: mpsc::UnboundedReceiver<GroupJob>,
    in_flight: usize,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(in_flight.max(1)));
    while let Some(first) = queue.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut jobs = vec![first];
        while jobs.len() < GROUP_MAX
            && let Ok(job) = queue.try_recv()
        {
            jobs.push(job);
        }
        let Some(inner) = inner.upgrade() else {
            for job in jobs {
                let _ = job.done.send(Err(PgFailure::Store(StoreError::Closed)));
            }
            return;
        };
        // The slot goes with the group: with one slot, the next group forms only once this
        // one is committed.
        tokio::spawn(async move {
            inner.commit_group(jobs).await;
            drop(slot);
        });
    }
}
