//! Configuration validation: every invalid setting collected as a [`Problem`], reported all
//! at once with its flag and variable ([`InvalidConfig`]).

use std::fmt;
use std::time::Duration;

use clap::CommandFactory;

/// One invalid setting: its flag (long name), the value given and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Long flag name without dashes (`publish-window`); the report adds its variable.
    pub flag: String,
    /// The value as given (secrets are never shown).
    pub value: String,
    /// The rule the value breaks (`must be at least 1`).
    pub rule: String,
}

/// Every problem found in a configuration, in the order checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problems(Vec<Problem>);

impl Problems {
    pub fn new() -> Problems {
        Problems::default()
    }

    /// Records that `flag`'s `value` breaks `rule`.
    pub fn push(&mut self, flag: &str, value: impl fmt::Display, rule: impl Into<String>) {
        self.0.push(Problem { flag: flag.to_string(), value: value.to_string(), rule: rule.into() });
    }

    /// Records a problem unless `ok`.
    pub fn check(&mut self, ok: bool, flag: &str, value: impl fmt::Display, rule: impl Into<String>) {
        if !ok {
            self.push(flag, value, rule);
        }
    }

    /// `flag` must be at least `min`.
    pub fn at_least<T: PartialOrd + fmt::Display>(&mut self, flag: &str, value: T, min: T) {
        let rule = format!("must be at least {min}");
        self.check(value >= min, flag, value, rule);
    }

    /// `flag` must be a duration longer than zero.
    pub fn positive(&mut self, flag: &str, value: Duration) {
        self.check(!value.is_zero(), flag, humantime::format_duration(value), "must be longer than 0s");
    }

    /// `flag` (a duration) must be at least `min`.
    pub fn at_least_duration(&mut self, flag: &str, value: Duration, min: Duration) {
        let rule = format!("must be at least {}", humantime::format_duration(min));
        self.check(value >= min, flag, humantime::format_duration(value), rule);
    }

    /// `flag` (a duration) must be at most `max`.
    pub fn at_most_duration(&mut self, flag: &str, value: Duration, max: Duration) {
        let rule = format!("must be at most {}", humantime::format_duration(max));
        self.check(value <= max, flag, humantime::format_duration(value), rule);
    }

    /// `flag` (a duration) must be shorter than `other_flag`'s value.
    pub fn shorter(&mut self, flag: &str, value: Duration, other_flag: &str, other: Duration) {
        let rule = format!("must be shorter than --{other_flag} ({})", humantime::format_duration(other));
        self.check(value < other, flag, humantime::format_duration(value), rule);
    }

    /// Adds the problems of another check (the shared settings, a group of flags).
    pub fn extend(&mut self, other: Problems) {
        self.0.extend(other.0);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Problem> {
        self.0.iter()
    }

    /// `Ok` when there is no problem; otherwise every problem, each named by its flag and
    /// environment variable as `C`'s `--help` shows them.
    pub fn finish<C: CommandFactory>(self) -> Result<(), InvalidConfig> {
        if self.0.is_empty() {
            return Ok(());
        }
        let command = C::command();
        let problems = self
            .0
            .into_iter()
            .map(|problem| {
                let env = command
                    .get_arguments()
                    .find(|arg| arg.get_long() == Some(problem.flag.as_str()))
                    .and_then(|arg| arg.get_env())
                    .map(|env| env.to_string_lossy().into_owned());
                Named { problem, env }
            })
            .collect();
        Err(InvalidConfig { program: command.get_name().to_string(), problems })
    }
}

/// `--flag = value: rule`, semicolon-separated (without variable names: see
/// [`Problems::finish`] for the full report).
impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, problem) in self.0.iter().enumerate() {
            let separator = if index == 0 { "" } else { "; " };
            write!(f, "{separator}--{} = {}: {}", problem.flag, problem.value, problem.rule)?;
        }
        Ok(())
    }
}

/// A problem with the environment variable of its flag, for the report.
#[derive(Debug, Clone)]
struct Named {
    problem: Problem,
    env: Option<String>,
}

/// An invalid configuration: every problem, reported at once (one line each: flag, variable,
/// value, rule). A binary prints it and exits with [`EXIT_INVALID_CONFIG`].
#[derive(Debug, Clone, thiserror::Error)]
pub struct InvalidConfig {
    program: String,
    problems: Vec<Named>,
}

impl InvalidConfig {
    /// The problems, in the order found.
    pub fn problems(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().map(|named| &named.problem)
    }
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.problems.len();
        let plural = if count == 1 { "" } else { "s" };
        write!(f, "{}: invalid configuration ({count} problem{plural}):", self.program)?;
        for Named { problem, env } in &self.problems {
            write!(f, "\n  --{}", problem.flag)?;
            if let Some(env) = env {
                write!(f, " ({env})")?;
            }
            write!(f, " = {}: {}", problem.value, problem.rule)?;
        }
        Ok(())
    }
}
