//! The scheduler's in-memory task table: one compact slot per registered task, addressed by a
//! `u32` index (the timing wheel's key), with a key → index map that stores only the index.
//!
//! A slot keeps only what timing and dispatch need (the schedule, the misfire policy, jitter,
//! the queue), its key, and its stored spec JSON in the compact form of `specs.rs` (rebuilt
//! byte for byte into every dispatch message), so a million tasks fit in a few hundred MiB.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hashbrown::HashTable;
use jetsched_shared::calendar::CalendarRef;
use jetsched_shared::schedule::{EndReason, Schedule};
use jetsched_shared::spec::{MisfirePolicy, OverlapPolicy, Priority, TaskSpec};

use crate::specs::{Scratch, Specs};

/// What the scheduler keeps of one spec revision.
#[derive(Debug)]
pub(crate) struct TaskInfo {
    /// `<namespace>.<task_id>`, then the spec JSON as [`Specs::encode`] keeps it.
    blob: Box<str>,
    /// Length of the key at the start of `blob`.
    key_len: u16,
    /// Length of the namespace part of the key.
    ns_len: u8,
    /// The spec JSON's shape in the table of `specs.rs` (or kept whole).
    shape: u32,
    /// Interned: a million tasks usually name a handful of queues.
    pub(crate) queue: Arc<str>,
    /// The lane of the queue its fires are dispatched to.
    pub(crate) priority: Priority,
    pub(crate) schedule: Schedule,
    pub(crate) misfire: MisfirePolicy,
    /// The catch-up window in ms (a `Duration` takes twice the room).
    pub(crate) catchup_window_ms: u64,
    pub(crate) overlap: OverlapPolicy,
    pub(crate) paused: bool,
    /// A task with `after` and a schedule: its fires go to the registry, held until its
    /// parents' runs of the same nominal time meet its rule.
    pub(crate) held: bool,
    /// Deterministic jitter offset (ms).
    pub(crate) jitter_offset_ms: u32,
    /// Random extra delay per fire, at most this (ms).
    pub(crate) jitter_random_ms: u32,
    /// Revision of the spec in the tasks bucket.
    pub(crate) revision: u64,
    /// When that revision was stored (Unix ms): fires start after it.
    pub(crate) created_ms: i64,
    /// The window `start_at`, `end_at` and `max_runs` leave and the business calendars its
    /// fires follow (boxed together: most tasks have neither).
    extras: Option<Box<Extras>>,
}

/// What few tasks have.
#[derive(Debug)]
struct Extras {
    bounds: Option<Bounds>,
    calendars: Vec<CalendarRef>,
}

/// A task's window of fires in Unix ms: `[start_ms, end_ms)`, and what ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub(crate) start_ms: i64,
    pub(crate) end_ms: i64,
    pub(crate) ends_by: Option<EndReason>,
    /// The spec's own `end_at` (`i64::MAX` without one): a fire shifted past it is skipped.
    pub(crate) end_at_ms: i64,
    /// The spec's `max_runs`: the task's calendars refit `end_ms` so that fires they skip do
    /// not count.
    pub(crate) max_runs: Option<u32>,
}

impl Bounds {
    /// No bounds: every fire.
    pub(crate) const NONE: Bounds =
        Bounds { start_ms: i64::MIN, end_ms: i64::MAX, ends_by: None, end_at_ms: i64::MAX, max_runs: None };

    /// The next fire of `schedule` in the window strictly after `after_ms`.
    pub(crate) fn next_after(&self, schedule: &Schedule, after_ms: i64) -> Option<i64> {
        let after = if after_ms < self.start_ms { self.start_ms - 1 } else { after_ms };
        schedule.next_after(from_ms(after)).map(|t| t.timestamp_millis()).filter(|&next| next < self.end_ms)
    }
}

impl TaskInfo {
    /// A spec stored at `revision` with `spec_json` kept whole (tests: the tasks feed goes
    /// through [`TaskInfo::encoded`]).
    #[cfg(test)]
    pub(crate) fn new(spec: TaskSpec, spec_json: &[u8], revision: u64, created_ms: i64) -> TaskInfo {
        let queue = Arc::from(spec.queue.as_str());
        let spec_json = std::str::from_utf8(spec_json).expect("a spec is UTF-8");
        TaskInfo::build(spec, queue, (crate::specs::WHOLE, spec_json), revision, created_ms)
    }

    /// A spec stored at `revision`, its JSON encoded against `specs` (which interns the queue
    /// name too).
    pub(crate) fn encoded(
        spec: TaskSpec,
        spec_json: &str,
        revision: u64,
        created_ms: i64,
        specs: &Specs,
        scratch: &mut Scratch,
    ) -> TaskInfo {
        let queue = specs.queue(&spec.queue, scratch);
        let text = specs.encode(spec_json, &spec.id, scratch);
        TaskInfo::build(spec, queue, text, revision, created_ms)
    }

    fn build(
        spec: TaskSpec,
        queue: Arc<str>,
        (shape, text): (u32, &str),
        revision: u64,
        created_ms: i64,
    ) -> TaskInfo {
        let (namespace, id) = (spec.namespace.as_str(), spec.id.as_str());
        let mut blob = String::with_capacity(namespace.len() + 1 + id.len() + text.len());
        blob.push_str(namespace);
        blob.push('.');
        blob.push_str(id);
        let key_len = u16::try_from(blob.len()).unwrap_or(u16::MAX);
        blob.push_str(text);
        let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
        let jitter_offset_ms = ms(spec.jitter_offset());
        // Fires start after the revision was stored, except a one-shot stored after its time
        // (admitted within its catch-up window): it starts just before that time, so that it
        // is a misfire (caught up or skipped by policy, never dropped without a trace).
        let window = spec.window();
        let bounds = (window.start.is_some() || window.end.is_some()).then(|| Bounds {
            start_ms: window.start.map_or(i64::MIN, |t| t.timestamp_millis()),
            end_ms: window.end.map_or(i64::MAX, |t| t.timestamp_millis()),
            ends_by: window.ends_by,
            end_at_ms: spec.end_at.map_or(i64::MAX, |t| t.timestamp_millis()),
            max_runs: spec.max_runs,
        });
        // Likewise the fires `max_runs` counts from `start_at` (set at admission, a moment
        // before the revision is stored): none is lost, the late ones are misfires.
        let created_ms = match (&spec.schedule, &bounds) {
            (Schedule::At(at), _) => created_ms.min(at.timestamp_millis() - 1),
            (_, Some(bounds)) if spec.max_runs.is_some() => created_ms.min(bounds.start_ms.saturating_sub(1)),
            _ => created_ms,
        };
        let held = spec.holds_fires_for_parents();
        let extras = (bounds.is_some() || !spec.calendars.is_empty())
            .then(|| Box::new(Extras { bounds, calendars: spec.calendars }));
        TaskInfo {
            blob: blob.into_boxed_str(),
            key_len,
            ns_len: u8::try_from(namespace.len()).unwrap_or(u8::MAX),
            shape,
            queue,
            priority: spec.priority,
            jitter_offset_ms,
            jitter_random_ms: spec.jitter.and_then(|j| j.max_random).map(ms).unwrap_or(0),
            schedule: spec.schedule,
            misfire: spec.misfire,
            catchup_window_ms: u64::try_from(spec.catchup_window.as_millis()).unwrap_or(u64::MAX),
            overlap: spec.overlap,
            paused: spec.paused,
            held,
            revision,
            created_ms,
            extras,
        }
    }

    /// The business calendars its fires follow.
    pub(crate) fn calendars(&self) -> &[CalendarRef] {
        self.extras.as_deref().map_or(&[], |extras| extras.calendars.as_slice())
    }

    /// The window's bounds to refit, when the task has any.
    pub(crate) fn bounds_mut(&mut self) -> Option<&mut Bounds> {
        self.extras.as_deref_mut()?.bounds.as_mut()
    }

    /// `<namespace>.<task_id>`.
    pub(crate) fn key(&self) -> &str {
        self.blob.get(..usize::from(self.key_len)).unwrap_or_default()
    }

    pub(crate) fn namespace(&self) -> &str {
        &self.key()[..usize::from(self.ns_len)]
    }

    pub(crate) fn task_id(&self) -> &str {
        &self.key()[usize::from(self.ns_len) + 1..]
    }

    /// Appends the stored spec JSON, byte for byte, to `out`.
    pub(crate) fn spec_json_into(&self, specs: &Specs, out: &mut Vec<u8>) {
        let text = self.blob.get(usize::from(self.key_len)..).unwrap_or_default();
        specs.decode_into(self.shape, text, self.task_id(), out);
    }

    /// When the wheel fires nominal time `nominal_ms`: after the task's deterministic jitter
    /// offset and `random_ms` (drawn per fire, at most `jitter_random_ms`). The dispatch keeps
    /// the nominal time (and so its message id).
    pub(crate) fn wheel_due(&self, nominal_ms: i64, random_ms: u32) -> u64 {
        nominal_ms.max(0) as u64
            + u64::from(self.jitter_offset_ms)
            + u64::from(random_ms.min(self.jitter_random_ms))
    }

    /// The next nominal fire strictly after `after_ms` and after the revision was stored,
    /// within the task's bounds.
    pub(crate) fn next_nominal(&self, after_ms: i64) -> Option<i64> {
        if self.paused {
            return None;
        }
        self.bounds().next_after(&self.schedule, after_ms.max(self.created_ms))
    }

    /// The task's window of fires ([`Bounds::NONE`] when unbounded).
    pub(crate) fn bounds(&self) -> Bounds {
        self.extras.as_deref().and_then(|extras| extras.bounds).unwrap_or(Bounds::NONE)
    }

    /// Why no fire follows `nominal_ms` when it is the task's last (`None` otherwise, and for
    /// a task nothing ends): its one-shot, `end_at` or `max_runs`.
    pub(crate) fn ended_by(&self, nominal_ms: i64) -> Option<EndReason> {
        let ends_by = match &self.schedule {
            Schedule::At(_) => EndReason::OneShot,
            _ => self.extras.as_ref()?.bounds?.ends_by?,
        };
        self.bounds().next_after(&self.schedule, nominal_ms).is_none().then_some(ends_by)
    }
}

/// One registered task.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) info: TaskInfo,
    /// Bumped when the index is reused, so a late ack for a deleted task is recognised.
    pub(crate) generation: u32,
    /// Every nominal fire up to this one is handled by this replica (dispatched or queued
    /// while leader, passed while follower).
    pub(crate) cursor_ms: i64,
    /// The nominal fire currently in the wheel.
    pub(crate) next_ms: Option<i64>,
    /// Leader bookkeeping: the last nominal fire known to be stored in the dispatch stream
    /// (or skipped), as read from / written to the state bucket.
    pub(crate) done_ms: Option<i64>,
    pub(crate) fires: u64,
    /// Dispatches of this task awaiting their ack, and the latest nominal acked meanwhile.
    pub(crate) inflight: u32,
    pub(crate) pending_ms: Option<i64>,
    /// Queued for the next state write.
    pub(crate) dirty: bool,
}

/// All slots and the key index.
#[derive(Debug, Default)]
pub(crate) struct Tasks {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// Slot indices by the hash of their key (the key itself is the slot's).
    index: HashTable<u32>,
    hasher: RandomState,
    /// The shapes of the spec JSON of every task, shared with the spec decoders.
    specs: Arc<Specs>,
    /// Reused buffer a task's spec JSON is rebuilt in.
    text: Vec<u8>,
    generation: u32,
}

impl Tasks {
    /// Room for `n` tasks without growing (a load of a large bucket), their spec JSON encoded
    /// against `specs`.
    pub(crate) fn with_capacity(n: usize, specs: Arc<Specs>) -> Tasks {
        Tasks { slots: Vec::with_capacity(n), index: HashTable::with_capacity(n), specs, ..Tasks::default() }
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn lookup(&self, key: &str) -> Option<u32> {
        self.find(key).ok()
    }

    /// The slot of `key`, or the hash to insert it with ([`Tasks::insert_hashed`]).
    pub(crate) fn find(&self, key: &str) -> Result<u32, KeyHash> {
        let (slots, hash) = (&self.slots, self.hasher.hash_one(key));
        self.index.find(hash, |&idx| key_of(slots, idx) == key).copied().ok_or(KeyHash(hash))
    }

    /// The indices of the slots in use that `matches`.
    pub(crate) fn indices_where(&self, matches: impl Fn(&Slot) -> bool) -> Vec<u32> {
        let used = self.slots.iter().enumerate().filter_map(|(idx, slot)| Some((idx, slot.as_ref()?)));
        used.filter(|(_, slot)| matches(slot)).map(|(idx, _)| idx as u32).collect()
    }

    pub(crate) fn get(&self, idx: u32) -> Option<&Slot> {
        self.slots.get(idx as usize).and_then(Option::as_ref)
    }

    pub(crate) fn get_mut(&mut self, idx: u32) -> Option<&mut Slot> {
        self.slots.get_mut(idx as usize).and_then(Option::as_mut)
    }

    /// The slot at `idx` if it still belongs to `generation`.
    pub(crate) fn get_live(&mut self, idx: u32, generation: u32) -> Option<&mut Slot> {
        self.get_mut(idx).filter(|s| s.generation == generation)
    }

    /// The slot at `idx` if it still belongs to `generation`, and its stored spec JSON (valid
    /// until the next call).
    pub(crate) fn live_with_spec(&mut self, idx: u32, generation: u32) -> Option<(&mut Slot, &[u8])> {
        let slot = self.slots.get_mut(idx as usize).and_then(Option::as_mut)?;
        if slot.generation != generation {
            return None;
        }
        self.text.clear();
        slot.info.spec_json_into(&self.specs, &mut self.text);
        Some((slot, &self.text))
    }

    /// Adds a task whose fires start after `cursor_ms`; returns its index. Its key must not be
    /// in the table.
    #[cfg(test)]
    pub(crate) fn insert(&mut self, info: TaskInfo, cursor_ms: i64) -> u32 {
        let hash = KeyHash(self.hasher.hash_one(info.key()));
        self.insert_hashed(info, cursor_ms, hash)
    }

    /// [`Tasks::insert`] with the hash [`Tasks::find`] gave for its key.
    pub(crate) fn insert_hashed(&mut self, info: TaskInfo, cursor_ms: i64, KeyHash(hash): KeyHash) -> u32 {
        self.generation = self.generation.wrapping_add(1);
        let slot = Slot {
            info,
            generation: self.generation,
            cursor_ms,
            next_ms: None,
            done_ms: None,
            fires: 0,
            inflight: 0,
            pending_ms: None,
            dirty: false,
        };
        let idx = match self.free.pop() {
            Some(idx) => {
                self.slots[idx as usize] = Some(slot);
                idx
            }
            None => {
                self.slots.push(Some(slot));
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 tasks")
            }
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.insert_unique(hash, idx, |&idx| hasher.hash_one(key_of(slots, idx)));
        idx
    }

    pub(crate) fn remove(&mut self, key: &str) -> Option<(u32, Slot)> {
        let slots = &self.slots;
        let entry =
            self.index.find_entry(self.hasher.hash_one(key), |&idx| key_of(slots, idx) == key).ok()?;
        let (idx, _) = entry.remove();
        let slot = self.slots.get_mut(idx as usize)?.take()?;
        self.free.push(idx);
        Some((idx, slot))
    }

    /// Leadership lost: no dispatch is pending or waiting for its fire state any more.
    pub(crate) fn forget_dispatches(&mut self) {
        for (_, slot) in self.iter_mut() {
            slot.inflight = 0;
            slot.pending_ms = None;
            slot.dirty = false;
        }
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut Slot)> {
        self.slots.iter_mut().enumerate().filter_map(|(i, s)| s.as_mut().map(|s| (i as u32, s)))
    }
}

/// The hash of a key that is not in the table.
#[derive(Debug)]
pub(crate) struct KeyHash(u64);

/// The key of the task in slot `idx` (empty for a free slot).
fn key_of(slots: &[Option<Slot>], idx: u32) -> &str {
    slots.get(idx as usize).and_then(Option::as_ref).map_or("", |slot| slot.info.key())
}

pub(crate) fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, schedule: &str) -> (TaskSpec, Vec<u8>) {
        let json = format!(
            r#"{{"id":"{id}","namespace":"ns","schedule":{schedule},"executor":{{"kind":"nats","subject":"x"}}}}"#
        );
        (TaskSpec::parse(json.as_bytes()).expect("valid spec"), json.into_bytes())
    }

    #[test]
    fn slots_are_reused_with_a_new_generation() {
        let mut tasks = Tasks::default();
        let (s, j) = spec("a", r#"{"every":"1s"}"#);
        let a = tasks.insert(TaskInfo::new(s, &j, 1, 0), 0);
        let gen_a = tasks.get(a).map(|s| s.generation);
        assert_eq!(
            tasks.get(a).map(|s| (s.info.namespace().to_string(), s.info.task_id().to_string())),
            Some(("ns".into(), "a".into()))
        );
        assert!(tasks.remove("ns.a").is_some());
        let (s, j) = spec("b", r#"{"every":"1s"}"#);
        let b = tasks.insert(TaskInfo::new(s, &j, 2, 0), 0);
        assert_eq!(a, b);
        assert_ne!(gen_a, tasks.get(b).map(|s| s.generation));
        assert!(tasks.get_live(b, gen_a.unwrap_or_default()).is_none());
        assert_eq!(tasks.lookup("ns.b"), Some(b));
        assert_eq!(tasks.len(), 1);
    }

    #[test]
    fn tasks_share_one_copy_of_a_queue_name_and_slots_stay_compact() {
        let specs = Arc::new(Specs::default());
        let mut tasks = Tasks::with_capacity(2, specs.clone());
        let mut scratch = Scratch::default();
        let ids: Vec<u32> = ["a", "b"]
            .iter()
            .map(|id| {
                let (s, j) = spec(id, r#"{"every":"1s"}"#);
                tasks.insert(
                    TaskInfo::encoded(s, std::str::from_utf8(&j).expect("UTF-8"), 1, 0, &specs, &mut scratch),
                    0,
                )
            })
            .collect();
        let queue = |idx: u32| tasks.get(idx).map(|s| s.info.queue.clone()).expect("slot");
        assert_eq!(&*queue(ids[0]), "default");
        assert!(Arc::ptr_eq(&queue(ids[0]), &queue(ids[1])));
        // A million slots are resident: keep each one small (the cron schedule is boxed, the
        // key and spec JSON are one allocation).
        assert!(std::mem::size_of::<Option<Slot>>() <= 200, "{}", std::mem::size_of::<Option<Slot>>());
    }

    #[test]
    fn the_spec_json_comes_back_as_stored_and_the_key_is_found_through_the_slot() {
        let specs = Arc::new(Specs::default());
        let mut tasks = Tasks::with_capacity(0, specs.clone());
        let mut scratch = Scratch::default();
        let mut stored = Vec::new();
        for i in 0..100 {
            let (s, j) = spec(&format!("t{i}"), &format!(r#"{{"every":"{}s"}}"#, i + 1));
            let idx = tasks.insert(
                TaskInfo::encoded(s, std::str::from_utf8(&j).expect("UTF-8"), 1, 0, &specs, &mut scratch),
                0,
            );
            stored.push((idx, j));
        }
        let (s, j) = spec("whole", r#"{"every":"1s"}"#);
        let whole = tasks.insert(TaskInfo::new(s, &j, 1, 0), 0);
        stored.push((whole, j));
        for (i, (idx, json)) in stored.iter().enumerate() {
            let generation = tasks.get(*idx).map(|s| s.generation).expect("slot");
            let (slot, text) = tasks.live_with_spec(*idx, generation).expect("live");
            assert_eq!(text, json.as_slice(), "task {i}");
            let key = slot.info.key().to_owned();
            assert_eq!(tasks.lookup(&key), Some(*idx));
        }
        assert!(tasks.live_with_spec(0, u32::MAX).is_none(), "another generation");
        assert_eq!(tasks.lookup("ns.t100"), None);
        assert_eq!(tasks.remove("ns.t5").map(|(idx, _)| idx), Some(5));
        assert_eq!(tasks.lookup("ns.t5"), None);
        assert_eq!(tasks.lookup("ns.t6"), Some(6));
        assert_eq!(tasks.len(), 100);
    }

    #[test]
    fn jitter_delays_the_wheel_never_the_nominal_time() {
        let json = br#"{"id":"j","namespace":"ns","schedule":{"every":"1m"},"jitter":{"spread":"10s","max_random":"2s"},"executor":{"kind":"nats","subject":"x"}}"#;
        let jittered = TaskSpec::parse(json).expect("valid spec");
        let offset = jittered.jitter_offset().as_millis() as u64;
        assert!(offset < 10_000);
        let info = TaskInfo::new(jittered, json, 1, 0);
        assert_eq!((info.jitter_offset_ms as u64, info.jitter_random_ms), (offset, 2000));
        assert_eq!(info.next_nominal(0), Some(60_000), "nominal times stay on the schedule");
        assert_eq!(info.wheel_due(60_000, 0), 60_000 + offset);
        assert_eq!(info.wheel_due(60_000, 5000), 60_000 + offset + 2000, "random part capped");
        let (plain, j) = spec("p", r#"{"every":"1m"}"#);
        assert_eq!(TaskInfo::new(plain, &j, 1, 0).wheel_due(60_000, 700), 60_000);
    }

    #[test]
    fn next_nominal_starts_after_the_revision_and_respects_pause() {
        let (s, j) = spec("a", r#"{"every":"1s"}"#);
        let info = TaskInfo::new(s, &j, 1, 10_500);
        assert_eq!(info.next_nominal(0), Some(11_000));
        assert_eq!(info.next_nominal(12_000), Some(13_000));
        let (mut s, j) = spec("a", r#"{"every":"1s"}"#);
        s.paused = true;
        assert_eq!(TaskInfo::new(s, &j, 1, 0).next_nominal(0), None);
    }
}
