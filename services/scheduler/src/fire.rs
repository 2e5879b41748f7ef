//! A fire on its way from the timing wheel to the dispatch stream: what the pipeline queues
//! and the acknowledgements wait for.

use jetsched_shared::wire::Trigger;

/// One fire on its way to the dispatch stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fire {
    pub(crate) idx: u32,
    pub(crate) generation: u32,
    pub(crate) nominal_ms: i64,
    pub(crate) trigger: Trigger,
}
