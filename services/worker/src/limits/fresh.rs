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

/// The reads of each key this worker's runs wait on.
#[derive(Default)]
pub(super) struct Reads {
    keys: Mutex<HashMap<String, Gate>>,
}

/// One key's reads: `issued` counts the reads started, `done` tells the last one finished and
/// whether it succeeded.
struct Gate {
    issued: u64,
    running: bool,
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
            let gate = keys.entry(key.to_string()).or_insert_with(|| Gate {
                issued: 0,
                running: false,
                again: false,
                done: watch::channel((0, true)).0,
            });
            let need = if gate.running {
                gate.again = true;
                gate.issued + 1
            } else {
                gate.running = true;
                gate.issued += 1;
                let (reads, key) = (Arc::clone(self), key.to_string());
                tokio::spawn(async move { reads.read_until_none_wanted(&key, read).await });
                gate.issued
            };
            (need, gate.done.subscribe())
        };
        match done.wait_for(|(finished, _)| *finished >= need).await {
            Ok(outcome) => outcome.1,
            Err(_) => false,
        }
    }

    /// Reads `key`, again while callers arrived during the read.
    async fn read_until_none_wanted<F, R>(&self, key: &str, read: F)
    where
        F: Fn() -> R,
        R: Future<Output = bool>,
    {
        loop {
            let ok = read().await;
            let again = {
                let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
                let Some(gate) = keys.get_mut(key) else { return };
                let finished = gate.issued;
                gate.done.send_replace((finished, ok));
                let again = std::mem::take(&mut gate.again);
                if again {
                    gate.issued += 1;
                } else {
                    gate.running = false;
                }
                again
            };
            if !again {
                return;
            }
        }
    }
}
