//! The rule of flow control, without channels or a clock: which queued entry gets the next
//! slot. One process keeps a [`Plan`] in memory and updates it as tasks enter and leave; a
//! replica on a shared store builds one from the store's flow table inside the transaction
//! that decides (`super::cluster`). Both decide by the same code.
//!
//! An entry needs one place in each of its *counters* (its tool's limit, its upstream's, all
//! tools', its owner's), each with a capacity, and, when its tool has a start rate, a token of
//! the tool's bucket. It runs when every counter has room and the bucket has a token; else it
//! waits in its owner's queue (oldest first). The owners with queued work are served in turn:
//! of the owners whose oldest fitting entry fits, the one whose last start is the longest ago
//! (none: first) gets the slot.

use std::collections::{BTreeMap, HashMap};

/// What one entry needs to run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Needs {
    /// The tool (for the per-tool figures).
    pub(crate) tool: String,
    /// Each counter it takes a place in, with the counter's capacity.
    pub(crate) counters: Vec<(String, u32)>,
    /// The token bucket it takes a token from, and that bucket's starts per second.
    pub(crate) rate: Option<(String, f64)>,
}

impl Needs {
    /// Whether nothing limits it.
    pub(crate) fn is_free(&self) -> bool {
        self.counters.is_empty() && self.rate.is_none()
    }
}

/// Where an entry stands in its owner's queue: creation time (ms), then the order it entered
/// in (one process: a sequence number; a shared store: 0), then its key (task id).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct QueueKey {
    pub(crate) created_ms: u64,
    pub(crate) seq: u64,
    pub(crate) key: String,
}

/// A start-rate token bucket: at most one token kept (no burst), refilled at `rate` a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bucket {
    pub(crate) tokens: f64,
    pub(crate) at_ms: u64,
}

impl Bucket {
    /// A full bucket.
    pub(crate) fn full(now_ms: u64) -> Self {
        Self {
            tokens: 1.0,
            at_ms: now_ms,
        }
    }

    /// Its tokens at `now_ms`.
    pub(crate) fn tokens_at(&self, rate: f64, now_ms: u64) -> f64 {
        let elapsed = now_ms.saturating_sub(self.at_ms) as f64 / 1000.0;
        (self.tokens + elapsed * rate).min(1.0)
    }

    /// When it next has a whole token (ms), at `rate`.
    fn token_at(&self, rate: f64, now_ms: u64) -> u64 {
        let missing = 1.0 - self.tokens_at(rate, now_ms);
        if missing <= 0.0 {
            return now_ms;
        }
        now_ms + ((missing / rate) * 1000.0).ceil() as u64
    }
}

/// The running counts and queues of one flow-control domain (a process, or a cluster's round).
pub(crate) struct Plan<W> {
    running: HashMap<String, u32>,
    running_owner: HashMap<String, u32>,
    pub(crate) running_tool: HashMap<String, u32>,
    pub(crate) queued_tool: HashMap<String, u64>,
    queues: HashMap<String, BTreeMap<QueueKey, (Needs, W)>>,
    /// The start number of each owner's last start (owners with running or queued work).
    last_start: HashMap<String, u64>,
    starts: u64,
    buckets: HashMap<String, Bucket>,
    queued: usize,
}

impl<W> Default for Plan<W> {
    fn default() -> Self {
        Self {
            running: HashMap::new(),
            running_owner: HashMap::new(),
            running_tool: HashMap::new(),
            queued_tool: HashMap::new(),
            queues: HashMap::new(),
            last_start: HashMap::new(),
            starts: 0,
            buckets: HashMap::new(),
            queued: 0,
        }
    }
}

impl<W> Plan<W> {
    /// Whether `needs` fits now (every counter has room, its bucket a token).
    pub(crate) fn fits(&self, needs: &Needs, now_ms: u64) -> bool {
        self.counters_fit(needs) && self.has_token(needs, now_ms)
    }

    fn counters_fit(&self, needs: &Needs) -> bool {
        needs
            .counters
            .iter()
            .all(|(c, cap)| self.running.get(c).copied().unwrap_or(0) < *cap)
    }

    fn has_token(&self, needs: &Needs, now_ms: u64) -> bool {
        match &needs.rate {
            None => true,
            Some((bucket, rate)) => self
                .buckets
                .get(bucket)
                .is_none_or(|b| b.tokens_at(*rate, now_ms) >= 1.0),
        }
    }

    /// Counts a start of `needs` for `owner` (a place in each counter, a token); returns its
    /// start number.
    pub(crate) fn take(&mut self, needs: &Needs, owner: &str, now_ms: u64) -> u64 {
        for (c, _) in &needs.counters {
            *self.running.entry(c.clone()).or_insert(0) += 1;
        }
        *self.running_owner.entry(owner.to_owned()).or_insert(0) += 1;
        *self.running_tool.entry(needs.tool.clone()).or_insert(0) += 1;
        if let Some((bucket, rate)) = &needs.rate {
            let b = self
                .buckets
                .entry(bucket.clone())
                .or_insert_with(|| Bucket::full(now_ms));
            b.tokens = b.tokens_at(*rate, now_ms) - 1.0;
            b.at_ms = now_ms;
        }
        self.starts += 1;
        self.last_start.insert(owner.to_owned(), self.starts);
        self.starts
    }

    /// Counts an entry that already runs (a shared store's round), started as `started`.
    pub(crate) fn running_entry(&mut self, needs: &Needs, owner: &str, started: u64) {
        for (c, _) in &needs.counters {
            *self.running.entry(c.clone()).or_insert(0) += 1;
        }
        *self.running_owner.entry(owner.to_owned()).or_insert(0) += 1;
        *self.running_tool.entry(needs.tool.clone()).or_insert(0) += 1;
        let last = self.last_start.entry(owner.to_owned()).or_insert(0);
        *last = (*last).max(started);
        self.starts = self.starts.max(started);
    }

    /// Gives back what [`Plan::take`] counted.
    pub(crate) fn untake(&mut self, needs: &Needs, owner: &str) {
        for (c, _) in &needs.counters {
            if let Some(n) = self.running.get_mut(c) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.running.remove(c);
                }
            }
        }
        if let Some(n) = self.running_tool.get_mut(&needs.tool) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = self.running_owner.get_mut(owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running_owner.remove(owner);
                self.forget_idle(owner);
            }
        }
    }

    /// Drops what is kept of an owner with nothing running and nothing queued.
    fn forget_idle(&mut self, owner: &str) {
        if !self.running_owner.contains_key(owner) && !self.queues.contains_key(owner) {
            self.last_start.remove(owner);
        }
    }

    /// Sets the state of a bucket (a shared store's round reads them from the store).
    pub(crate) fn set_bucket(&mut self, name: String, bucket: Bucket) {
        self.buckets.insert(name, bucket);
    }

    /// The buckets, for a shared store's round to write back.
    pub(crate) fn buckets(&self) -> impl Iterator<Item = (&String, &Bucket)> {
        self.buckets.iter()
    }

    /// Queues an entry; returns how many are ahead of it under the turn rule (its owner's
    /// older entries, and as many of each other owner's, at most all of them).
    pub(crate) fn queue(&mut self, owner: &str, key: QueueKey, needs: Needs, waiter: W) -> usize {
        let ahead = self.ahead(owner, &key);
        *self.queued_tool.entry(needs.tool.clone()).or_insert(0) += 1;
        self.queues
            .entry(owner.to_owned())
            .or_default()
            .insert(key, (needs, waiter));
        self.queued += 1;
        ahead
    }

    /// How many queued entries are ahead of `key` of `owner`.
    pub(crate) fn ahead(&self, owner: &str, key: &QueueKey) -> usize {
        let mine = self
            .queues
            .get(owner)
            .map_or(0, |q| q.range(..key.clone()).count());
        mine + self
            .queues
            .iter()
            .filter(|(o, _)| o.as_str() != owner)
            .map(|(_, q)| q.len().min(mine))
            .sum::<usize>()
    }

    /// Removes a queued entry (a cancelled or expired task, a caller gone).
    pub(crate) fn unqueue(&mut self, owner: &str, key: &QueueKey) -> Option<(Needs, W)> {
        let queue = self.queues.get_mut(owner)?;
        let (needs, waiter) = queue.remove(key)?;
        if queue.is_empty() {
            self.queues.remove(owner);
            self.forget_idle(owner);
        }
        self.queued -= 1;
        if let Some(n) = self.queued_tool.get_mut(&needs.tool) {
            *n = n.saturating_sub(1);
        }
        Some((needs, waiter))
    }

    /// The number of queued entries.
    pub(crate) fn queued(&self) -> usize {
        self.queued
    }

    /// The number of owners with queued entries.
    pub(crate) fn owners_queued(&self) -> usize {
        self.queues.len()
    }

    /// The `n` owners with the most queued entries (then the most running), most first.
    pub(crate) fn owner_figures(&self, n: usize) -> Vec<super::OwnerUsage> {
        let mut owners: Vec<super::OwnerUsage> = self
            .queues
            .iter()
            .map(|(o, q)| (o, q.len() as u64))
            .chain(
                self.running_owner
                    .keys()
                    .filter(|o| !self.queues.contains_key(*o))
                    .map(|o| (o, 0)),
            )
            .map(|(owner, queued)| super::OwnerUsage {
                owner: owner.clone(),
                running: self.running_owner.get(owner).copied().unwrap_or(0),
                queued,
            })
            .collect();
        owners
            .sort_by(|a, b| (b.queued, b.running, &a.owner).cmp(&(a.queued, a.running, &b.owner)));
        owners.truncate(n);
        owners
    }

    /// Every counter with places taken.
    pub(crate) fn counters(&self) -> impl Iterator<Item = (&String, u32)> {
        self.running.iter().map(|(c, n)| (c, *n))
    }

    /// The places taken in `counter`.
    #[cfg(test)]
    pub(crate) fn running_in(&self, counter: &str) -> u32 {
        self.running.get(counter).copied().unwrap_or(0)
    }

    /// The next queued entry to start, by the turn rule, if one fits at `now_ms`; else when a
    /// token will let one start (an entry waiting only for its bucket), if any.
    fn next(&self, now_ms: u64) -> Result<(String, QueueKey), Option<u64>> {
        let mut best: Option<(u64, &String, &QueueKey)> = None;
        let mut wake: Option<u64> = None;
        for (owner, queue) in &self.queues {
            let mut found = None;
            for (key, (needs, _)) in queue {
                if !self.counters_fit(needs) {
                    continue;
                }
                if self.has_token(needs, now_ms) {
                    found = Some(key);
                    break;
                }
                if let Some((bucket, rate)) = &needs.rate
                    && let Some(b) = self.buckets.get(bucket)
                {
                    let at = b.token_at(*rate, now_ms);
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                }
            }
            let Some(key) = found else { continue };
            let last = self.last_start.get(owner).copied().unwrap_or(0);
            if best.is_none_or(|(l, o, _)| (last, owner) < (l, o)) {
                best = Some((last, owner, key));
            }
        }
        match best {
            Some((_, owner, key)) => Ok((owner.clone(), key.clone())),
            None => Err(wake),
        }
    }

    /// Starts queued entries while one fits at `now_ms`, owners in turn; calls `start` for
    /// each (its owner, key, needs, waiter and start number). Returns when a token will let
    /// another start, if one waits only for that.
    pub(crate) fn dispatch(
        &mut self,
        now_ms: u64,
        mut start: impl FnMut(&mut Self, String, QueueKey, Needs, W, u64),
    ) -> Option<u64> {
        loop {
            match self.next(now_ms) {
                Ok((owner, key)) => {
                    let (needs, waiter) = self.unqueue(&owner, &key)?;
                    let started = self.take(&needs, &owner, now_ms);
                    start(self, owner, key, needs, waiter, started);
                }
                Err(wake) => return wake,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(tool: &str, cap: u32) -> Needs {
        Needs {
            tool: tool.into(),
            counters: vec![(format!("tool {tool}"), cap)],
            rate: None,
        }
    }

    fn key(created_ms: u64, id: &str) -> QueueKey {
        QueueKey {
            created_ms,
            seq: 0,
            key: id.into(),
        }
    }

    #[test]
    fn owners_take_turns_and_each_owner_goes_oldest_first() {
        let mut plan: Plan<()> = Plan::default();
        let n = needs("a", 1);
        plan.take(&n, "A", 0);
        for i in 0..50 {
            plan.queue("A", key(i + 1, &format!("a{i:02}")), n.clone(), ());
        }
        assert_eq!(plan.queue("B", key(100, "b"), n.clone(), ()), 0);
        let mut current = "A".to_owned();
        let mut order = Vec::new();
        for _ in 0..3 {
            plan.untake(&n, &current);
            plan.dispatch(0, |_, owner, key, _, _, _| order.push((owner, key.key)));
            current = order.last().expect("a start").0.clone();
        }
        assert_eq!(
            order,
            [
                ("B".to_owned(), "b".to_owned()),
                ("A".to_owned(), "a00".to_owned()),
                ("A".to_owned(), "a01".to_owned())
            ]
        );
        assert_eq!(plan.queued(), 48);
    }

    #[test]
    fn every_counter_must_have_room() {
        let mut plan: Plan<()> = Plan::default();
        let both = Needs {
            tool: "a".into(),
            counters: vec![("tool a".into(), 5), ("*".into(), 1)],
            rate: None,
        };
        assert!(plan.fits(&both, 0));
        plan.take(&both, "A", 0);
        assert!(!plan.fits(&both, 0), "the all-tools counter is full");
        plan.untake(&both, "A");
        assert!(plan.fits(&both, 0));
        assert_eq!(plan.running_in("*"), 0);
    }

    #[test]
    fn a_rate_spaces_starts_and_says_when_the_next_token_comes() {
        let mut plan: Plan<()> = Plan::default();
        let n = Needs {
            tool: "a".into(),
            counters: vec![],
            rate: Some(("rate a".into(), 2.0)),
        };
        assert!(plan.fits(&n, 1_000));
        plan.take(&n, "A", 1_000);
        assert!(!plan.fits(&n, 1_000), "one token, no burst");
        for i in 0..3 {
            plan.queue("A", key(i, &format!("q{i}")), n.clone(), ());
        }
        let mut started = Vec::new();
        let wake = plan.dispatch(1_000, |_, _, k, _, _, _| started.push(k.key));
        assert!(started.is_empty());
        assert_eq!(wake, Some(1_500), "2/s: a token every 500 ms");
        let wake = plan.dispatch(1_500, |_, _, k, _, _, _| started.push(k.key));
        assert_eq!(started, ["q0"]);
        assert_eq!(wake, Some(2_000));
        // Idle for long: still one token only.
        let wake = plan.dispatch(60_000, |_, _, k, _, _, _| started.push(k.key));
        assert_eq!(started, ["q0", "q1"]);
        assert_eq!(wake, Some(60_500));
    }

    #[test]
    fn a_rebuilt_plan_keeps_the_turn() {
        // A shared store's round: A runs one started as 7, B one started as 3; both queue.
        let mut plan: Plan<()> = Plan::default();
        let n = needs("a", 2);
        plan.running_entry(&n, "A", 7);
        plan.running_entry(&n, "B", 3);
        plan.queue("A", key(1, "a"), n.clone(), ());
        plan.queue("B", key(2, "b"), n.clone(), ());
        plan.untake(&n, "A");
        let mut order = Vec::new();
        plan.dispatch(0, |_, o, _, _, _, s| order.push((o, s)));
        assert_eq!(order, [("B".to_owned(), 8)], "B's last start is older");
    }
}
