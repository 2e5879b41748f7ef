//! A run taking a slot of its worker's block decides on a record of its key read after the run
//! arrived, not on the watch's copy alone: the copy may be a watch delay behind, and a run
//! another worker wrote as waiting in between would be passed by a run that came after it.
//! The read orders the two as the key's compare-and-sets order claims: a waiter stored before
//! the read closes the block (the run then asks with a write and waits behind it); one stored
//! after it came after the run.
//!
//! A run's arrival is when its worker took its message from the server. A read of the key that
//! started after that serves it, whoever started the read: the runs of one pull share the read
//! the first of them starts, and runs arriving while a read is in flight share the next one, so
//! a busy key costs about one read per round trip to the server, whatever its rate of runs.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;

/// The reads of each key this worker's runs wait on: a key has a gate while a read of it runs.
#[derive(Default)]
pub(super) struct Reads {
    keys: Mutex<HashMap<String, Gate>>,
}

/// The reads of one key: `issued` counts the reads started, `done` tells the last one finished
/// and whether it succeeded.
struct Gate {
    issued: u64,
    /// When the read in flight started.
    started: Instant,
    /// A run arrived after the read in flight started: one more read follows it.
    again: bool,
    done: watch::Sender<(u64, bool)>,
}

impl Reads {
    /// Returns once a read of `key` started at or after `arrived` has finished; false when that
    /// read failed. `read` makes one read (and learns it), returning whether it succeeded; a
    /// read in flight serves the callers that arrived before it started, and one more read
    /// follows it for those that arrived after.
    pub(super) async fn after<F, R>(self: &Arc<Self>, key: &str, arrived: Instant, read: F) -> bool
    where
        F: Fn() -> R + Send + 'static,
        R: Future<Output = bool> + Send,
    {
        let (need, mut done) = {
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            match keys.get_mut(key) {
                Some(gate) if gate.started >= arrived => (gate.issued, gate.done.subscribe()),
                Some(gate) => {
                    gate.again = true;
                    (gate.issued + 1, gate.done.subscribe())
                }
                None => {
                    let gate = Gate {
                        issued: 1,
                        started: Instant::now(),
                        again: false,
                        done: watch::channel((0, true)).0,
                    };
                    let done = gate.done.subscribe();
                    keys.insert(key.to_string(), gate);
                    let (reads, key) = (Arc::clone(self), key.to_string());
                    tokio::spawn(async move { reads.read_until_none_wanted(&key, read).await });
                    (1, done)
                }
            }
        };
        // The last value sent is looked at first: a gate removed after its last read still
        // answers the callers that read served.
        match done.wait_for(|(finished, _)| *finished >= need).await {
            Ok(outcome) => outcome.1,
            Err(_) => false,
        }
    }

    /// Reads `key`, again while callers arrived after the read in flight started; then forgets
    /// the key.
    async fn read_until_none_wanted<F, R>(&self, key: &str, read: F)
    where
        F: Fn() -> R,
        R: Future<Output = bool>,
    {
        loop {
            let ok = read().await;
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            let Some(gate) = keys.get_mut(key) else { return };
            gate.done.send_replace((gate.issued, ok));
            if std::mem::take(&mut gate.again) {
                gate.issued += 1;
                // Stamped before the read is made: a run arriving from now on is after it.
                gate.started = Instant::now();
            } else {
                keys.remove(key);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    fn counting(
        reads: &Arc<AtomicUsize>,
        ok: bool,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> + Send + 'static {
        let reads = Arc::clone(reads);
        move || {
            reads.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                ok
            })
        }
    }

    /// Fifty runs arriving together share two reads (the one they found in flight does not
    /// serve those that came after it started); a run after them starts a read of its own; a
    /// failed read answers false.
    #[tokio::test]
    async fn runs_arriving_during_a_read_share_the_next_one() {
        let gates = Arc::new(Reads::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let first = {
            let (gates, read) = (Arc::clone(&gates), counting(&reads, true));
            tokio::spawn(async move { gates.after("k", Instant::now(), read).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut waiting = Vec::new();
        for _ in 0..50 {
            let (gates, read) = (Arc::clone(&gates), counting(&reads, true));
            waiting.push(tokio::spawn(async move { gates.after("k", Instant::now(), read).await }));
        }
        assert!(first.await.expect("first"));
        for run in waiting {
            assert!(run.await.expect("run"));
        }
        assert_eq!(reads.load(Ordering::SeqCst), 2, "one read in flight, one after it for the fifty");
        assert!(gates.after("k", Instant::now(), counting(&reads, true)).await);
        assert_eq!(reads.load(Ordering::SeqCst), 3);
        assert!(
            !gates.after("k", Instant::now(), counting(&reads, false)).await,
            "a failed read answers false"
        );
        assert!(gates.keys.lock().unwrap().is_empty(), "no gate left once no read runs");
    }

    /// Runs that arrived before the read in flight started (the rest of one pull) share it; a
    /// run arriving after it started waits for the next.
    #[tokio::test]
    async fn runs_that_arrived_before_a_read_started_share_it() {
        let gates = Arc::new(Reads::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let pulled = Instant::now();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let first = {
            let (gates, read) = (Arc::clone(&gates), counting(&reads, true));
            tokio::spawn(async move { gates.after("k", pulled, read).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut same_pull = Vec::new();
        for _ in 0..20 {
            let (gates, read) = (Arc::clone(&gates), counting(&reads, true));
            same_pull.push(tokio::spawn(async move { gates.after("k", pulled, read).await }));
        }
        for run in same_pull {
            assert!(run.await.expect("run"));
        }
        assert!(first.await.expect("first"));
        assert_eq!(reads.load(Ordering::SeqCst), 1, "the runs of one pull share the first read");
        let later = {
            let (gates, read) = (Arc::clone(&gates), counting(&reads, true));
            tokio::spawn(async move { gates.after("k", Instant::now(), read).await })
        };
        assert!(later.await.expect("later"));
        assert_eq!(reads.load(Ordering::SeqCst), 2, "a run after the first read has one of its own");
    }
}
