//! A run taking a slot of its worker's block decides on a record of its key read after the run
//! arrived, not on the watch's copy alone: the copy may be a watch delay behind, and a run
//! another worker wrote as waiting in between would be passed by a run that came after it.
//! The read orders the two as the key's compare-and-sets order claims: a waiter stored before
//! the read closes the block (the run then asks with a write and waits behind it); one stored
//! after it came after the run.
//!
//! Runs of one key arriving while a read of it is in flight share the next read, so a busy key
//! costs about one read per round trip to the server, whatever its rate of runs.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

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
    /// A run arrived while a read was in flight: one more read follows it.
    again: bool,
    done: watch::Sender<(u64, bool)>,
}

impl Reads {
    /// Returns once a read of `key` started after this call has finished; false when that read
    /// failed. `read` makes one read (and learns it), returning whether it succeeded; a read
    /// already in flight serves the callers that came before it started, and one more read
    /// follows it for those that came after.
    pub(super) async fn after_now<F, R>(self: &Arc<Self>, key: &str, read: F) -> bool
    where
        F: Fn() -> R + Send + 'static,
        R: Future<Output = bool> + Send,
    {
        let (need, mut done) = {
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            match keys.get_mut(key) {
                Some(gate) => {
                    gate.again = true;
                    (gate.issued + 1, gate.done.subscribe())
                }
                None => {
                    let gate = Gate { issued: 1, again: false, done: watch::channel((0, true)).0 };
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

    /// Reads `key`, again while callers arrived during the read; then forgets the key.
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
            tokio::spawn(async move { gates.after_now("k", read).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut waiting = Vec::new();
        for _ in 0..50 {
            let (gates, read) = (Arc::clone(&gates), counting(&reads, true));
            waiting.push(tokio::spawn(async move { gates.after_now("k", read).await }));
        }
        assert!(first.await.expect("first"));
        for run in waiting {
            assert!(run.await.expect("run"));
        }
        assert_eq!(reads.load(Ordering::SeqCst), 2, "one read in flight, one after it for the fifty");
        assert!(gates.after_now("k", counting(&reads, true)).await);
        assert_eq!(reads.load(Ordering::SeqCst), 3);
        assert!(!gates.after_now("k", counting(&reads, false)).await, "a failed read answers false");
        assert!(gates.keys.lock().unwrap().is_empty(), "no gate left once no read runs");
    }
}
