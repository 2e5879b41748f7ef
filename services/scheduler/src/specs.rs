//! The stored spec JSON of every task, kept compactly and rebuilt byte for byte for each
//! dispatch (the dispatch body carries the stored bytes as they are).
//!
//! A document is split into its shape (its text with every string and number value taken out:
//! keys, punctuation, `true`/`false`/`null` and whitespace stay) and its values. Shapes are
//! interned: a million tasks usually have a handful. A task keeps, per value, a one-byte code
//! when the value is the same as in the first document of its shape (the shape's template) or
//! is the task's own id, and the value's bytes only otherwise (an interval's anchor, a
//! payload). A document whose shape would not fit the table (more than [`MAX_SHAPES`] shapes,
//! or [`MAX_SHAPE_BYTES`] of them) is kept whole.
//!
//! The table is shared by the spec decoders (which encode) and the loop (which rebuilds):
//! shapes are only ever added.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// Shapes kept at most; documents of another shape are kept whole.
pub(crate) const MAX_SHAPES: usize = 4096;
/// Bytes of shape text and template values kept at most.
pub(crate) const MAX_SHAPE_BYTES: usize = 16 << 20;

/// The shape of a document kept whole.
pub(crate) const WHOLE: u32 = u32::MAX;

/// Value codes: the template's value, the task id, or (`INLINE + n`) `n` bytes that follow.
const SAME: u32 = 0;
const TASK_ID: u32 = 1;
const INLINE: u32 = 2;

/// One document shape and its template's values.
#[derive(Debug)]
struct Shape {
    /// The document's text without its values (a string value keeps its quotes).
    text: Box<[u8]>,
    /// Where each value goes in the shape's text, ascending.
    holes: Box<[u32]>,
    /// The template's values, concatenated.
    values: Box<[u8]>,
    /// End of each template value in `values`.
    ends: Box<[u32]>,
}

impl Shape {
    fn value(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.values[start..self.ends[i] as usize]
    }
}

#[derive(Debug, Default)]
struct Table {
    /// Shape text → index in `shapes`.
    index: HashMap<Box<[u8]>, u32>,
    shapes: Vec<Arc<Shape>>,
    bytes: usize,
    /// Every queue name in use.
    queues: HashSet<Arc<str>>,
}

/// The shared table of shapes.
#[derive(Debug, Default)]
pub(crate) struct Specs {
    table: RwLock<Table>,
}

/// Buffers reused from one [`Specs::encode`] to the next, and the last shape and queue name
/// seen (a large load repeats them: a hit takes neither the table's lock nor a hash).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    split: Split,
    codes: String,
    shape: Option<(u32, Arc<Shape>)>,
    queue: Option<Arc<str>>,
}

/// A document's shape text and where its values are in it.
#[derive(Debug, Default)]
struct Split {
    text: Vec<u8>,
    holes: Vec<u32>,
    /// Each value's range in the document.
    values: Vec<(usize, usize)>,
}

impl Specs {
    /// Encodes `doc` (a task's stored spec JSON, `task_id` its id) against the table, adding its
    /// shape when it is new and fits: returns the shape and the text the task keeps (borrowed
    /// from `scratch` or `doc`): value codes are ASCII, values are pieces of `doc`.
    pub(crate) fn encode<'a>(&self, doc: &'a str, task_id: &str, scratch: &'a mut Scratch) -> (u32, &'a str) {
        let Scratch { split, codes, shape: last, .. } = scratch;
        if !split.read(doc.as_bytes()) {
            return (WHOLE, doc);
        }
        if let Some((id, shape)) = last.as_ref()
            && *shape.text == *split.text
        {
            return encoded(*id, shape, split, doc, task_id, codes);
        }
        let found = {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            table.index.get(split.text.as_slice()).map(|&id| (id, table.shapes[id as usize].clone()))
        };
        let (id, shape) = match found {
            Some(found) => found,
            None => {
                let Some(added) = self.add(split, doc) else { return (WHOLE, doc) };
                added
            }
        };
        let (id, shape) = last.insert((id, shape));
        encoded(*id, shape, split, doc, task_id, codes)
    }

    /// The shape of `split` (from `doc`), added to the table unless another thread did first;
    /// `None` when the table is full.
    fn add(&self, split: &Split, doc: &str) -> Option<(u32, Arc<Shape>)> {
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = table.index.get(split.text.as_slice()) {
            return Some((id, table.shapes[id as usize].clone()));
        }
        let values: usize = split.values.iter().map(|(start, end)| end - start).sum();
        let size = split.text.len() + values + 4 * split.holes.len() * 2;
        if table.shapes.len() >= MAX_SHAPES || table.bytes + size > MAX_SHAPE_BYTES {
            return None;
        }
        let mut template = Vec::with_capacity(values);
        let mut ends = Vec::with_capacity(split.values.len());
        for &(start, end) in &split.values {
            template.extend_from_slice(&doc.as_bytes()[start..end]);
            ends.push(u32::try_from(template.len()).unwrap_or(u32::MAX));
        }
        let text: Box<[u8]> = split.text.clone().into_boxed_slice();
        let shape = Arc::new(Shape {
            text: text.clone(),
            holes: split.holes.clone().into_boxed_slice(),
            values: template.into_boxed_slice(),
            ends: ends.into_boxed_slice(),
        });
        let id = u32::try_from(table.shapes.len()).unwrap_or(WHOLE);
        table.bytes += size;
        table.index.insert(text, id);
        table.shapes.push(shape.clone());
        Some((id, shape))
    }

    /// Appends the document that `bytes` (from [`Specs::encode`] with `shape`) stands for to
    /// `out`, byte for byte as it was given.
    pub(crate) fn decode_into(&self, shape: u32, text: &str, task_id: &str, out: &mut Vec<u8>) {
        let bytes = text.as_bytes();
        if shape == WHOLE {
            out.extend_from_slice(bytes);
            return;
        }
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let Some(template) = table.shapes.get(shape as usize) else { return };
        let text = &template.text;
        let mut from = 0;
        let mut codes = bytes;
        for (i, &hole) in template.holes.iter().enumerate() {
            out.extend_from_slice(&text[from..hole as usize]);
            from = hole as usize;
            let code = read_varint(&mut codes);
            match code {
                SAME => out.extend_from_slice(template.value(i)),
                TASK_ID => out.extend_from_slice(task_id.as_bytes()),
                n => {
                    let len = ((n - INLINE) as usize).min(codes.len());
                    out.extend_from_slice(&codes[..len]);
                    codes = &codes[len..];
                }
            }
        }
        out.extend_from_slice(&text[from..]);
    }

    /// The one copy of queue name `name` (the last one asked through `scratch` without a look
    /// in the table).
    pub(crate) fn queue(&self, name: &str, scratch: &mut Scratch) -> Arc<str> {
        if let Some(queue) = scratch.queue.as_ref().filter(|queue| ***queue == *name) {
            return queue.clone();
        }
        let queue = self.intern_queue(name);
        scratch.queue = Some(queue.clone());
        queue
    }

    fn intern_queue(&self, name: &str) -> Arc<str> {
        if let Some(queue) = self.table.read().unwrap_or_else(|e| e.into_inner()).queues.get(name) {
            return queue.clone();
        }
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        if let Some(queue) = table.queues.get(name) {
            return queue.clone();
        }
        let queue: Arc<str> = Arc::from(name);
        table.queues.insert(queue.clone());
        queue
    }

    /// Shapes in the table.
    #[cfg(test)]
    pub(crate) fn shapes(&self) -> usize {
        self.table.read().unwrap_or_else(|e| e.into_inner()).shapes.len()
    }
}

/// `split` encoded against `shape` (number `id`), or the whole document when their values are
/// not in the same places (which the same text rules out).
fn encoded<'a>(
    id: u32,
    shape: &Shape,
    split: &Split,
    doc: &'a str,
    task_id: &str,
    codes: &'a mut String,
) -> (u32, &'a str) {
    if *shape.holes != *split.holes {
        return (WHOLE, doc);
    }
    encode_values(shape, split, doc, task_id, codes);
    (id, codes)
}

/// Writes the value codes of `split` against `shape`'s template to `codes`.
fn encode_values(shape: &Shape, split: &Split, doc: &str, task_id: &str, codes: &mut String) {
    codes.clear();
    for (i, &(start, end)) in split.values.iter().enumerate() {
        // Values start and end next to ASCII delimiters: `str` boundaries.
        let value = doc.get(start..end).unwrap_or_default();
        if value.as_bytes() == shape.value(i) {
            write_varint(codes, SAME);
        } else if value == task_id {
            write_varint(codes, TASK_ID);
        } else {
            write_varint(codes, INLINE + u32::try_from(value.len()).unwrap_or(u32::MAX - INLINE));
            codes.push_str(value);
        }
    }
}

impl Split {
    /// Splits a JSON document into its shape text and values: each string value's contents
    /// (its quotes stay in the text) and each number. A string is a key when the next byte
    /// other than whitespace is `:`. False for text that is not JSON enough to split (kept
    /// whole).
    fn read(&mut self, doc: &[u8]) -> bool {
        self.text.clear();
        self.holes.clear();
        self.values.clear();
        let (mut i, mut literal) = (0, 0);
        while i < doc.len() {
            let (start, end) = match doc[i] {
                b'"' => {
                    let open = i;
                    let Some(end) = string_end(doc, open) else { return false };
                    let next = doc[end + 1..].iter().find(|b| !b.is_ascii_whitespace());
                    i = end + 1;
                    if next == Some(&b':') {
                        continue;
                    }
                    // The quotes stay in the text.
                    (open + 1, end)
                }
                b'-' | b'0'..=b'9' => {
                    let start = i;
                    i = doc[i..]
                        .iter()
                        .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                        .map_or(doc.len(), |n| i + n);
                    (start, i)
                }
                _ => {
                    i += 1;
                    continue;
                }
            };
            self.text.extend_from_slice(&doc[literal..start]);
            let Ok(hole) = u32::try_from(self.text.len()) else { return false };
            self.holes.push(hole);
            self.values.push((start, end));
            literal = end;
        }
        self.text.extend_from_slice(&doc[literal..]);
        true
    }
}

/// The index of the quote closing the string opened at `open`.
fn string_end(doc: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    while i < doc.len() {
        match doc[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// Writes `n` in ASCII: six bits per byte, low bits first, `0x40` on every byte but the last.
fn write_varint(out: &mut String, mut n: u32) {
    while n >= 0x40 {
        out.push(char::from((n & 0x3f) as u8 | 0x40));
        n >>= 6;
    }
    out.push(char::from(n as u8));
}

fn read_varint(bytes: &mut &[u8]) -> u32 {
    let mut n = 0u32;
    for (i, &b) in bytes.iter().enumerate() {
        n |= u32::from(b & 0x3f).checked_shl(6 * i as u32).unwrap_or(0);
        if b & 0x40 == 0 {
            *bytes = &bytes[i + 1..];
            return n;
        }
    }
    *bytes = &[];
    n
}

#[cfg(test)]
mod tests;
