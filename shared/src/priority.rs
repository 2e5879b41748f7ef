//! Priorities of runs inside a queue (`critical`, `high`, `normal`, `low`): the spelling on the
//! wire and in specs, and the per-priority settings of a worker (`critical=8,high=4`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// How urgent a run is. Each priority of a queue is its own lane (subject and durable
/// consumer); `normal` keeps the queue's original subject and consumer.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Critical,
    High,
    #[default]
    Normal,
    Low,
}

impl Priority {
    /// Every priority, most urgent first (the index of a priority in per-lane arrays).
    pub const ALL: [Priority; 4] = [Priority::Critical, Priority::High, Priority::Normal, Priority::Low];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// The priority spelled `text` (lower case), if any.
    pub fn parse(text: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str() == text)
    }

    /// Position in [`Priority::ALL`]: 0 for `critical`, 3 for `low`.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The names, for messages: `critical, high, normal, low`.
    pub fn names() -> String {
        Priority::ALL.map(Priority::as_str).join(", ")
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One number per priority, indexed by [`Priority::index`]: a worker's weights or reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerPriority(pub [usize; 4]);

impl PerPriority {
    pub fn get(&self, priority: Priority) -> usize {
        self.0[priority.index()]
    }

    pub fn total(&self) -> usize {
        self.0.iter().sum()
    }

    /// Reads `critical=8,high=4` over `base` (priorities not named keep their value in `base`).
    /// Every problem is reported: unknown names, repeated names, values that are not numbers.
    pub fn parse_over(base: PerPriority, text: &str) -> Result<PerPriority, Vec<String>> {
        let mut values = base;
        let mut seen = [false; 4];
        let mut problems = Vec::new();
        for item in text.split(',').map(str::trim).filter(|item| !item.is_empty()) {
            let Some((name, value)) = item.split_once('=') else {
                problems.push(format!("{item:?} is not <priority>=<number>"));
                continue;
            };
            let Some(priority) = Priority::parse(name.trim()) else {
                problems.push(format!("{name:?} is not one of {}", Priority::names()));
                continue;
            };
            if std::mem::replace(&mut seen[priority.index()], true) {
                problems.push(format!("{priority} is given twice"));
            }
            match value.trim().parse::<usize>() {
                Ok(value) => values.0[priority.index()] = value,
                Err(_) => problems.push(format!("{priority}={value:?}: not a whole number")),
            }
        }
        if problems.is_empty() { Ok(values) } else { Err(problems) }
    }
}

impl fmt::Display for PerPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = Priority::ALL.iter().map(|p| format!("{p}={}", self.get(*p))).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_spell_and_order() {
        for priority in Priority::ALL {
            assert_eq!(Priority::parse(priority.as_str()), Some(priority));
            let json = serde_json::to_string(&priority).unwrap();
            assert_eq!(json, format!("\"{priority}\""));
        }
        assert!(Priority::Critical < Priority::Low);
        assert_eq!(Priority::default(), Priority::Normal);
        assert_eq!(Priority::parse("Critical"), None);
    }

    #[test]
    fn per_priority_settings_parse_with_every_problem() {
        let base = PerPriority([8, 4, 2, 1]);
        assert_eq!(PerPriority::parse_over(base, "critical=10, low=0"), Ok(PerPriority([10, 4, 2, 0])));
        assert_eq!(PerPriority::parse_over(PerPriority::default(), ""), Ok(PerPriority::default()));
        let problems = PerPriority::parse_over(base, "urgent=1,high=x,high=2,low").unwrap_err();
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert_eq!(base.to_string(), "critical=8,high=4,normal=2,low=1");
    }
}
