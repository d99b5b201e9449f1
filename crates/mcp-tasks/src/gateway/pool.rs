//! The rule by which a stdio upstream's processes are shared among calls, apart from the
//! processes themselves (`stdio.rs`): one call in flight on each member, at most `max`
//! members, and a pool that grows only when calls queue.
//!
//! A call takes an idle member at once. One that finds every member busy waits for one to be
//! free for about as long as a call of this upstream takes ([`Pool::patience`]: the recent
//! calls' average, at least [`MIN_PATIENCE`], at most [`BURST_WAIT`]). If none frees in that
//! time and fewer than `max` members run, it starts another **in the background** and goes on
//! waiting: it takes whichever comes first, a member another call gives back or the new one
//! (which, if it comes second, stays idle for the next call). So a burst of short calls is
//! served by the members already running while the pool grows to what such bursts need; the
//! next burst finds them ready, and a member beyond the first that stays idle for
//! `IDLE_PROCESS` (`stdio.rs`) is stopped. A call whose own start failed while nothing freed
//! gets that start's error.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};

/// The longest a call that finds every member busy waits before the pool grows (a call of
/// this upstream taking longer than this on average, or none measured yet).
pub(crate) const BURST_WAIT: Duration = Duration::from_millis(250);

/// The shortest such wait, however short this upstream's calls are.
pub(crate) const MIN_PATIENCE: Duration = Duration::from_millis(2);

/// The members of a pool with no call in flight, with when each became idle, and a signal
/// to a call waiting for one.
pub(crate) struct Idle<T> {
    list: Mutex<Vec<(T, tokio::time::Instant)>>,
    freed: Notify,
}

impl<T> Idle<T> {
    pub(crate) fn new() -> Self {
        Self {
            list: Mutex::new(Vec::new()),
            freed: Notify::new(),
        }
    }

    /// The member that became idle last and is still `usable`, with how many unusable ones
    /// were dropped on the way.
    fn pop(&self, usable: impl Fn(&T) -> bool) -> (Option<T>, usize) {
        let mut list = lock(&self.list);
        let mut dropped = 0;
        while let Some((member, _)) = list.pop() {
            if usable(&member) {
                return (Some(member), dropped);
            }
            dropped += 1;
        }
        (None, dropped)
    }

    /// Puts `member` back and wakes one call waiting for it.
    fn push(&self, member: T) {
        lock(&self.list).push((member, tokio::time::Instant::now()));
        self.freed.notify_one();
    }

    /// Keeps only the members `keep(member, idle since)` says to; how many went.
    fn retain(&self, keep: impl Fn(&T, tokio::time::Instant) -> bool) -> usize {
        let mut list = lock(&self.list);
        let before = list.len();
        list.retain(|(member, since)| keep(member, *since));
        before - list.len()
    }
}

/// Up to `max` members, one call in flight on each.
pub(crate) struct Pool<T> {
    idle: Idle<T>,
    /// Members running or starting (shared with each [`Taken`], which counts its member out
    /// when it is dropped without being given back).
    members: Arc<AtomicUsize>,
    max: usize,
    /// One per call holding a member.
    permits: Arc<Semaphore>,
    /// The recent calls' length in µs (an exponential average; 0: none measured yet).
    call_micros: AtomicU64,
}

/// A member taken for one call, and the permit that counts it. Dropped without
/// [`Pool::give_back`] (a call whose future was dropped mid-call: its member's state is
/// unknown), the member leaves the pool, which may then start another in its place.
pub(crate) struct Taken<T> {
    member: Option<T>,
    members: Arc<AtomicUsize>,
    _permit: OwnedSemaphorePermit,
}

impl<T> Taken<T> {
    pub(crate) fn member(&self) -> &T {
        self.member.as_ref().expect("taken until given back")
    }
}

impl<T> Drop for Taken<T> {
    fn drop(&mut self) {
        if self.member.take().is_some() {
            self.members.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl<T: Send + 'static> Pool<T> {
    /// A pool of `first` alone, growing to at most `max` members.
    pub(crate) fn new(first: T, max: usize) -> Self {
        let max = max.max(1);
        let idle = Idle::new();
        idle.push(first);
        Self {
            idle,
            members: Arc::new(AtomicUsize::new(1)),
            max,
            permits: Arc::new(Semaphore::new(max)),
            call_micros: AtomicU64::new(0),
        }
    }

    /// Members running or starting.
    pub(crate) fn members(&self) -> usize {
        self.members.load(Ordering::Acquire)
    }

    /// Whether every member may be in use by a call, so a new call waits for a permit.
    pub(crate) fn saturated(&self) -> bool {
        self.permits.available_permits() == 0
    }

    /// How long a call that finds every member busy waits before the pool grows.
    pub(crate) fn patience(&self) -> Duration {
        match self.call_micros.load(Ordering::Relaxed) {
            0 => BURST_WAIT,
            micros => Duration::from_micros(micros).clamp(MIN_PATIENCE, BURST_WAIT),
        }
    }

    /// Counts a call's length into [`Pool::patience`].
    pub(crate) fn record(&self, took: Duration) {
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        // Longer calls than the longest patience move the average no further than it.
        let took = took.min(BURST_WAIT.as_micros() as u64);
        let _ = self
            .call_micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 {
                    took
                } else {
                    (old * 7 + took).div_ceil(8)
                })
            });
    }

    /// A member for one call: an idle one, one that frees, or a new one from `start` (run in
    /// the background once the call has waited [`Pool::patience`] and fewer than `max`
    /// members run). Waits while `max` calls hold members. `Err` only when this call's own
    /// start failed and no member freed meanwhile. `started` is told when a start begins.
    pub(crate) async fn take<E, Fut>(
        self: &Arc<Self>,
        usable: impl Fn(&T) -> bool,
        start: impl FnOnce() -> Fut,
        started: impl FnOnce(),
    ) -> Result<Taken<T>, E>
    where
        Fut: std::future::Future<Output = Result<T, E>> + Send + 'static,
        E: Send + 'static,
    {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the pool never closes its semaphore");
        let mut start = Some((start, started));
        let mut starting: Option<oneshot::Receiver<Result<(), E>>> = None;
        loop {
            let freed = self.idle.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(member) = self.pop(&usable) {
                return Ok(self.taken(member, permit));
            }
            // While this call may still ask for a new member, it waits a call's time; after it
            // asked, or while the pool is at its bound, it waits for whichever comes
            // (re-checking now and then whether it may ask).
            let wait = if start.is_some() && self.members() < self.max {
                self.patience()
            } else {
                BURST_WAIT
            };
            tokio::select! {
                () = &mut freed => continue,
                outcome = async { starting.as_mut().expect("guarded").await }, if starting.is_some() => {
                    starting = None;
                    if let Ok(Err(e)) = outcome {
                        return match self.pop(&usable) {
                            Some(member) => Ok(self.taken(member, permit)),
                            None => Err(e),
                        };
                    }
                    continue;
                }
                () = tokio::time::sleep(wait) => {}
            }
            if let Some((begin, told)) = start.take_if(|_| self.reserve()) {
                told();
                let (tx, rx) = oneshot::channel();
                let future = begin();
                let pool = self.clone();
                tokio::spawn(async move {
                    let outcome = match future.await {
                        Ok(member) => {
                            pool.idle.push(member);
                            Ok(())
                        }
                        Err(e) => {
                            pool.members.fetch_sub(1, Ordering::AcqRel);
                            Err(e)
                        }
                    };
                    let _ = tx.send(outcome);
                });
                starting = Some(rx);
            }
        }
    }

    fn taken(&self, member: T, permit: OwnedSemaphorePermit) -> Taken<T> {
        Taken {
            member: Some(member),
            members: self.members.clone(),
            _permit: permit,
        }
    }

    /// One more member, if fewer than `max` run or start.
    fn reserve(&self) -> bool {
        self.members
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    fn pop(&self, usable: impl Fn(&T) -> bool) -> Option<T> {
        let (member, dropped) = self.idle.pop(usable);
        self.members.fetch_sub(dropped, Ordering::AcqRel);
        member
    }

    /// The member of a finished call back, or gone when it is no longer `usable`.
    pub(crate) fn give_back(&self, mut taken: Taken<T>, usable: impl Fn(&T) -> bool) {
        let member = taken.member.take().expect("taken until given back");
        if usable(&member) {
            // Back before the permit (dropped with `taken` below): a call that gets the
            // permit finds the member idle.
            self.idle.push(member);
        } else {
            self.members.fetch_sub(1, Ordering::AcqRel);
        }
        drop(taken);
    }

    /// Stops the idle members `keep(member, idle since)` does not keep.
    pub(crate) fn retain(&self, keep: impl Fn(&T, tokio::time::Instant) -> bool) {
        let gone = self.idle.retain(keep);
        self.members.fetch_sub(gone, Ordering::AcqRel);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of member 0 alone; started members are numbered from 1.
    fn pool(max: usize) -> Arc<Pool<u32>> {
        Arc::new(Pool::new(0, max))
    }

    /// A pool whose calls took 1 ms (so its patience is [`MIN_PATIENCE`]), and a count of its
    /// starts.
    fn measured_pool(max: usize) -> (Arc<Pool<u32>>, Arc<AtomicUsize>) {
        let pool = pool(max);
        pool.record(Duration::from_millis(1));
        (pool, Arc::new(AtomicUsize::new(0)))
    }

    fn starter(
        starts: &Arc<AtomicUsize>,
        takes: Duration,
        fails: bool,
    ) -> impl FnOnce() -> futures::future::BoxFuture<'static, Result<u32, String>> + use<> {
        let starts = starts.clone();
        move || {
            let n = starts.fetch_add(1, Ordering::SeqCst) as u32 + 1;
            Box::pin(async move {
                tokio::time::sleep(takes).await;
                if fails {
                    Err(format!("start {n} failed"))
                } else {
                    Ok(n)
                }
            })
        }
    }

    /// `pool.take` of any usable member, told of nothing.
    async fn take(
        pool: &Arc<Pool<u32>>,
        start: impl FnOnce() -> futures::future::BoxFuture<'static, Result<u32, String>>,
    ) -> Result<Taken<u32>, String> {
        pool.take(|_| true, start, || {}).await
    }

    /// Gives `taken` back after `ms` milliseconds.
    fn free_after(
        pool: &Arc<Pool<u32>>,
        taken: Taken<u32>,
        ms: u64,
    ) -> tokio::task::JoinHandle<()> {
        let pool = pool.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            pool.give_back(taken, |_| true);
        })
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_member_is_taken_at_once_and_given_back() {
        let pool = pool(4);
        let starts = Arc::new(AtomicUsize::new(0));
        let started = tokio::time::Instant::now();
        let t = take(&pool, starter(&starts, Duration::from_secs(1), false))
            .await
            .unwrap();
        assert_eq!((*t.member(), started.elapsed()), (0, Duration::ZERO));
        pool.give_back(t, |_| true);
        assert_eq!((pool.members(), starts.load(Ordering::SeqCst)), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_pool_waits_a_calls_time_and_reuses_the_member_that_frees() {
        let pool = pool(4);
        let starts = Arc::new(AtomicUsize::new(0));
        // No call measured yet: a waiting call is patient for BURST_WAIT.
        assert_eq!(pool.patience(), BURST_WAIT);
        let busy = take(&pool, starter(&starts, Duration::ZERO, false))
            .await
            .unwrap();
        let freeing = free_after(&pool, busy, 100);
        let started = tokio::time::Instant::now();
        let t = take(&pool, starter(&starts, Duration::from_secs(1), false))
            .await
            .unwrap();
        freeing.await.unwrap();
        assert_eq!(*t.member(), 0);
        assert_eq!(started.elapsed(), Duration::from_millis(100));
        assert_eq!(
            starts.load(Ordering::SeqCst),
            0,
            "freed within its patience"
        );
        assert_eq!(pool.members(), 1);
    }

    #[test]
    fn patience_follows_the_calls_within_its_bounds() {
        let pool = pool(4);
        pool.record(Duration::from_micros(800));
        assert_eq!(pool.patience(), MIN_PATIENCE, "short calls: the least wait");
        for _ in 0..40 {
            pool.record(Duration::from_millis(40));
        }
        let p = pool.patience();
        assert!(
            p > Duration::from_millis(35) && p <= Duration::from_millis(40),
            "{p:?}"
        );
        for _ in 0..100 {
            pool.record(Duration::from_secs(3600));
        }
        assert_eq!(
            pool.patience(),
            BURST_WAIT,
            "long calls move it to the bound only"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_grows_the_pool_in_the_background_up_to_its_bound() {
        let (pool, starts) = measured_pool(4);
        // 20 calls at once, each holding its member for 1 ms; a start takes 200 ms.
        let calls: Vec<_> = (0..20)
            .map(|_| {
                let pool = pool.clone();
                let start = starter(&starts, Duration::from_millis(200), false);
                tokio::spawn(async move {
                    let t = pool.take(|_| true, start, || {}).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let member = *t.member();
                    pool.give_back(t, |_| true);
                    member
                })
            })
            .collect();
        let started = tokio::time::Instant::now();
        let mut served = Vec::new();
        for c in calls {
            served.push(c.await.unwrap());
        }
        // Served by the running member: no call waited for a start.
        assert!(served.iter().all(|m| *m == 0), "{served:?}");
        assert_eq!(started.elapsed(), Duration::from_millis(20));
        // Meanwhile three more started (four in all, the bound), and no more.
        assert_eq!(starts.load(Ordering::SeqCst), 3);
        assert_eq!(pool.members(), 4);
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The next burst finds four members idle and takes them at once.
        let taken: Vec<_> = futures::future::join_all(
            (0..4).map(|_| take(&pool, starter(&starts, Duration::ZERO, false))),
        )
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
        let mut members: Vec<u32> = taken.iter().map(|t| *t.member()).collect();
        members.sort_unstable();
        assert_eq!(members, [0, 1, 2, 3]);
        assert_eq!(started.elapsed(), Duration::from_millis(320));
        assert_eq!(
            starts.load(Ordering::SeqCst),
            3,
            "no start beyond the bound"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_waits_takes_the_new_member_when_it_comes_first() {
        let (pool, starts) = measured_pool(2);
        let busy = take(&pool, starter(&starts, Duration::ZERO, false))
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let told = Arc::new(AtomicUsize::new(0));
        let t = pool
            .take(
                |_| true,
                starter(&starts, Duration::from_millis(50), false),
                {
                    let told = told.clone();
                    move || {
                        told.fetch_add(1, Ordering::SeqCst);
                    }
                },
            )
            .await
            .unwrap();
        assert_eq!(*t.member(), 1);
        assert_eq!(started.elapsed(), MIN_PATIENCE + Duration::from_millis(50));
        assert_eq!(told.load(Ordering::SeqCst), 1);
        drop(busy);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_start_is_the_callers_error_unless_a_member_freed() {
        let (pool, starts) = measured_pool(2);
        let busy = take(&pool, starter(&starts, Duration::ZERO, false))
            .await
            .unwrap();
        let e = take(&pool, starter(&starts, Duration::from_millis(5), true))
            .await
            .err()
            .expect("nothing freed");
        assert_eq!(e, "start 1 failed");
        assert_eq!(pool.members(), 1, "the failed start is not counted");
        // A member freed while the start failed: the call takes it instead.
        let freeing = free_after(&pool, busy, 3);
        let t = take(&pool, starter(&starts, Duration::from_millis(5), true))
            .await
            .unwrap();
        freeing.await.unwrap();
        assert_eq!(*t.member(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_dropped_mid_call_leaves_room_for_another() {
        let (pool, starts) = measured_pool(1);
        let t = take(&pool, starter(&starts, Duration::ZERO, false))
            .await
            .unwrap();
        // The call's future is dropped with its member: not given back, no longer counted.
        drop(t);
        assert_eq!(pool.members(), 0);
        // So the next call may start one, though the bound is one.
        let t = take(&pool, starter(&starts, Duration::from_millis(1), false))
            .await
            .unwrap();
        assert_eq!((*t.member(), pool.members()), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn members_that_died_or_idled_are_no_longer_counted() {
        let pool = pool(3);
        let starts = Arc::new(AtomicUsize::new(0));
        let t = take(&pool, starter(&starts, Duration::ZERO, false))
            .await
            .unwrap();
        // A member that died during its call is not put back.
        pool.give_back(t, |_| false);
        assert_eq!(pool.members(), 0);
        // An idle member found dead is dropped on the way (and a new one started).
        pool.idle.push(7);
        pool.members.fetch_add(1, Ordering::SeqCst);
        pool.record(Duration::from_millis(1));
        let t = pool
            .take(
                |m| *m != 7,
                starter(&starts, Duration::from_millis(1), false),
                || {},
            )
            .await
            .unwrap();
        assert_eq!(*t.member(), 1);
        assert_eq!(pool.members(), 1);
        pool.give_back(t, |_| true);
        pool.retain(|_, _| false);
        assert_eq!(pool.members(), 0);
    }
}
