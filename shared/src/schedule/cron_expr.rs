//! Cron expressions on a zone's wall clock: the `cron` crate for the standard fields, `L`, `W` and
//! `#` on top of it, and the mapping of local wall times to instants across DST changes.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, Datelike, LocalResult, NaiveDate, NaiveDateTime, TimeZone, Utc, Weekday};
use chrono_tz::Tz;

use crate::error::{ApiError, ErrorCode};

const CRON_FIELD: &str = "schedule.cron";
const TZ_FIELD: &str = "schedule.timezone";

/// Bound on day skips in [`CronSchedule::next_local`]: more than the days in the `cron` crate's
/// year range (1970..=2100), so the loop ends by exhaustion, never by this bound, in practice.
const MAX_DAY_SKIPS: usize = 50_000;
/// Bound on candidates in [`CronSchedule::next_after`] that map to instants not after `after`:
/// those are only the repeated half of a fold or the wall times collapsed into a gap transition,
/// a few hours of per-second candidates at most.
const MAX_STALE_CANDIDATES: usize = 100_000;

/// A cron expression with its time zone.
///
/// Syntax: 6 fields `sec min hour day-of-month month day-of-week`, or 7 with a trailing `year`
/// (1970..=2100), each `*`, `?` (day fields), `n`, `a-b`, `*/k`, `a-b/k`, `n/k` and
/// comma lists; months and days of the week also by name (`JAN`, `MON`). Descriptors `@yearly`
/// (= `@annually`), `@monthly`, `@weekly`, `@daily` (= `@midnight`), `@hourly`. Five-field
/// expressions (no seconds) are rejected.
///
/// Semantics (those of the `cron` crate, plus the extensions):
/// - **Day of week is numbered 1-7 with 1 = Sunday** (Quartz style: `2-6` is Monday to Friday,
///   `7` is Saturday, `0` is rejected). Names (`MON-FRI`) avoid the ambiguity.
/// - **Day of month and day of week combine with AND**: a day must match both (`*` or `?` in one
///   of them means "any"). This differs from Vixie cron, which ORs two restricted fields.
/// - Day of month `L` (last day), `L-n` (n days before the last), `LW` (last weekday, Mon-Fri),
///   `nW` (the weekday nearest to day n, never crossing into another month; no fire in months
///   shorter than n days). Day of week `nL` / `FRIL` (last such weekday of the month) and
///   `n#k` / `FRI#k` (k-th such weekday, k in 1..=5), numbered like the rest of the field
///   (`6L` is the last Friday). A field may list several such forms (`L,15W`), but not mix them
///   with plain values.
/// - Fields are matched against the **local wall clock** of the zone. A wall time skipped by a
///   spring-forward gap fires once, at the transition instant (all matching times in one gap
///   collapse into that single fire, together with a match at the first wall time after the
///   gap). A wall time repeated by an autumn fold fires once, at its first occurrence.
#[derive(Clone)]
pub struct CronSchedule {
    source: String,
    tz: Tz,
    /// Shared: specs are cloned freely and the parsed fields are large.
    inner: Arc<cron::Schedule>,
    dom: Vec<DomRule>,
    dow: Vec<DowRule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DomRule {
    /// `L` (0) or `L-n`: the last day minus n.
    Last(u32),
    /// `LW`: the last Monday-Friday of the month.
    LastWeekday,
    /// `nW`: the Monday-Friday nearest to day n, within the month.
    NearestWeekday(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DowRule {
    /// `nL`: the last such weekday of the month.
    Last(Weekday),
    /// `n#k`: the k-th such weekday of the month.
    Nth(Weekday, u32),
}

impl fmt::Debug for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CronSchedule").field("source", &self.source).field("timezone", &self.tz).finish()
    }
}

impl PartialEq for CronSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source && self.tz == other.tz
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::at(ErrorCode::InvalidCron, CRON_FIELD, message)
}

impl CronSchedule {
    /// Parses `expr` for the IANA zone `tz` (`UTC` allowed). Errors: `invalid_cron` at
    /// `schedule.cron` (syntax, five fields, or no fire at all in 1970..=2100) and
    /// `unknown_timezone` at `schedule.timezone`.
    pub fn parse(expr: &str, tz: &str) -> Result<CronSchedule, ApiError> {
        let zone = Tz::from_str(tz).map_err(|_| {
            ApiError::at(
                ErrorCode::UnknownTimezone,
                TZ_FIELD,
                format!("{tz:?} is not an IANA time zone name such as \"Europe/Berlin\" or \"UTC\""),
            )
        })?;
        let source = expr.trim();
        let expanded = match source.to_ascii_lowercase().as_str() {
            "@yearly" | "@annually" => "0 0 0 1 1 *",
            "@monthly" => "0 0 0 1 * *",
            "@weekly" => "0 0 0 * * SUN",
            "@daily" | "@midnight" => "0 0 0 * * *",
            "@hourly" => "0 0 * * * *",
            d if d.starts_with('@') => {
                return Err(invalid(format!(
                    "unknown descriptor {source:?}; expected @yearly, @annually, @monthly, @weekly, \
                     @daily, @midnight or @hourly"
                )));
            }
            _ => source,
        };
        let mut fields: Vec<String> = expanded.split_whitespace().map(str::to_owned).collect();
        match fields.len() {
            6 | 7 => {}
            5 => {
                return Err(invalid(
                    "seconds are required: use 6 fields (sec min hour day-of-month month day-of-week), \
                     or 7 with a year; e.g. prefix the 5-field expression with \"0 \"",
                ));
            }
            n => {
                return Err(invalid(format!(
                    "expected 6 fields (sec min hour day-of-month month day-of-week) or 7 (+ year), got {n}"
                )));
            }
        }
        let dom = parse_extension_list(&fields[3], parse_dom_rule, "day-of-month")?;
        if !dom.is_empty() {
            fields[3] = "*".to_owned();
        }
        let dow = parse_extension_list(&fields[5], parse_dow_rule, "day-of-week")?;
        if !dow.is_empty() {
            fields[5] = "*".to_owned();
        }
        let inner = cron::Schedule::from_str(&fields.join(" ")).map_err(|e| {
            let hint = if fields[5].chars().any(|c| c.is_ascii_digit()) {
                " (day-of-week is 1-7 with 1 = SUN, or names SUN-SAT)"
            } else {
                ""
            };
            invalid(format!("{source:?} is not a valid cron expression: {e}{hint}"))
        })?;
        let schedule = CronSchedule { source: source.to_owned(), tz: zone, inner: Arc::new(inner), dom, dow };
        let before_range = NaiveDate::from_ymd_opt(1969, 12, 31).and_then(|d| d.and_hms_opt(23, 59, 59));
        if before_range.and_then(|start| schedule.next_local(start)).is_none() {
            return Err(invalid(format!("{source:?} never fires")));
        }
        Ok(schedule)
    }

    /// The zone the fields are evaluated in.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// The expression as written (trimmed).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The first fire strictly after `after`; see the type's docs for the DST rules.
    ///
    /// Wall times are taken in order from the `cron` crate (evaluated in UTC, i.e. on naive
    /// times) and mapped to instants: a single instant as is, a fold to its earlier instant, a gap
    /// to its transition instant. That mapping is non-decreasing in the wall time, and every wall
    /// time up to the local reading of `after` maps to an instant not after `after`, so the first
    /// mapped instant after `after` among wall times after that reading is the answer.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut from = after.with_timezone(&self.tz).naive_local();
        for _ in 0..MAX_STALE_CANDIDATES {
            let local = self.next_local(from)?;
            let instant = resolve(&self.tz, local);
            if instant > after {
                return Some(instant);
            }
            from = local;
        }
        None
    }

    /// The first wall time strictly after `after` (whole seconds) matching every field.
    fn next_local(&self, after: NaiveDateTime) -> Option<NaiveDateTime> {
        let mut from = after;
        for _ in 0..MAX_DAY_SKIPS {
            let candidate = self.inner.after(&from.and_utc()).next()?.naive_utc();
            let date = candidate.date();
            if self.day_matches(date) {
                return Some(candidate);
            }
            // Skip the rest of the day: the extensions only look at the date.
            from = date.and_hms_opt(23, 59, 59)?;
        }
        None
    }

    fn day_matches(&self, date: NaiveDate) -> bool {
        (self.dom.is_empty() || self.dom.iter().any(|rule| rule.matches(date)))
            && (self.dow.is_empty() || self.dow.iter().any(|rule| rule.matches(date)))
    }
}

/// The instant of the wall time `local` in `tz`: the earlier one in a fold, the transition
/// instant in a gap.
pub(crate) fn resolve(tz: &Tz, local: NaiveDateTime) -> DateTime<Utc> {
    match tz.from_local_datetime(&local) {
        LocalResult::Single(t) => t.to_utc(),
        LocalResult::Ambiguous(a, b) => a.to_utc().min(b.to_utc()),
        LocalResult::None => gap_transition(tz, local),
    }
}

/// The first whole second whose wall time is at or after `local`, which lies in a gap: that is
/// the transition instant. UTC offsets are within -12h..=+14h, so the answer lies within 15 hours
/// of `local` read as UTC, and the predicate flips once there (`local` is in no fold).
fn gap_transition(tz: &Tz, local: NaiveDateTime) -> DateTime<Utc> {
    let wall = |secs: i64| DateTime::from_timestamp(secs, 0).map(|t| t.with_timezone(tz).naive_local());
    let base = local.and_utc().timestamp();
    let (mut lo, mut hi) = (base - 15 * 3600, base + 15 * 3600);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if wall(mid).is_none_or(|w| w >= local) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    DateTime::from_timestamp(hi, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn days_in_month(date: NaiveDate) -> u32 {
    let (y, m) = (date.year(), date.month());
    let first_next =
        if m == 12 { NaiveDate::from_ymd_opt(y + 1, 1, 1) } else { NaiveDate::from_ymd_opt(y, m + 1, 1) };
    first_next.and_then(|d| d.pred_opt()).map_or(31, |d| d.day())
}

fn is_weekday(date: NaiveDate) -> bool {
    !matches!(date.weekday(), Weekday::Sat | Weekday::Sun)
}

impl DomRule {
    fn matches(self, date: NaiveDate) -> bool {
        let last = days_in_month(date);
        let day = date.day();
        match self {
            DomRule::Last(minus) => last > minus && day == last - minus,
            DomRule::LastWeekday => {
                let target = match date.with_day(last).map(|d| d.weekday()) {
                    Some(Weekday::Sat) => last - 1,
                    Some(Weekday::Sun) => last - 2,
                    _ => last,
                };
                day == target
            }
            DomRule::NearestWeekday(n) => {
                if n > last {
                    return false;
                }
                let target = match date.with_day(n).map(|d| d.weekday()) {
                    Some(Weekday::Sat) if n == 1 => 3,
                    Some(Weekday::Sat) => n - 1,
                    Some(Weekday::Sun) if n == last => n - 2,
                    Some(Weekday::Sun) => n + 1,
                    _ => n,
                };
                day == target && is_weekday(date)
            }
        }
    }
}

impl DowRule {
    fn matches(self, date: NaiveDate) -> bool {
        match self {
            DowRule::Last(wd) => date.weekday() == wd && date.day() + 7 > days_in_month(date),
            DowRule::Nth(wd, k) => date.weekday() == wd && (date.day() - 1) / 7 + 1 == k,
        }
    }
}

/// Parses a comma list of extension forms; empty when the field has none (plain `cron` syntax).
fn parse_extension_list<R>(
    field: &str,
    parse_item: fn(&str) -> Option<Result<R, String>>,
    name: &str,
) -> Result<Vec<R>, ApiError> {
    let items: Vec<Option<Result<R, String>>> = field.split(',').map(parse_item).collect();
    if items.iter().all(Option::is_none) {
        return Ok(Vec::new());
    }
    if items.iter().any(Option::is_none) {
        return Err(invalid(format!(
            "{name} field {field:?}: L, W and # forms cannot be mixed with plain values in one list"
        )));
    }
    items
        .into_iter()
        .flatten()
        .collect::<Result<Vec<R>, String>>()
        .map_err(|e| invalid(format!("{name} field: {e}")))
}

/// `L`, `L-n`, `LW`, `nW`; `None` for plain syntax (no `L`/`W`).
fn parse_dom_rule(item: &str) -> Option<Result<DomRule, String>> {
    let upper = item.to_ascii_uppercase();
    if !upper.contains(['L', 'W']) {
        return None;
    }
    let bad = || format!("{item:?} is not L, L-n (n in 0..=30), LW or nW (n in 1..=31)");
    Some(match upper.as_str() {
        "L" => Ok(DomRule::Last(0)),
        "LW" => Ok(DomRule::LastWeekday),
        u => {
            if let Some(n) = u.strip_prefix("L-") {
                n.parse::<u32>().ok().filter(|n| *n <= 30).map(DomRule::Last).ok_or_else(bad)
            } else if let Some(n) = u.strip_suffix('W') {
                n.parse::<u32>()
                    .ok()
                    .filter(|n| (1..=31).contains(n))
                    .map(DomRule::NearestWeekday)
                    .ok_or_else(bad)
            } else {
                Err(bad())
            }
        }
    })
}

/// `nL`, `n#k` (n a day number 1-7 with 1 = SUN, or a name); `None` for plain syntax.
fn parse_dow_rule(item: &str) -> Option<Result<DowRule, String>> {
    let upper = item.to_ascii_uppercase();
    if let Some((day, k)) = upper.split_once('#') {
        let bad = || format!("{item:?} is not n#k (n a day 1-7 with 1 = SUN, or a name; k in 1..=5)");
        return Some(match (weekday(day), k.parse::<u32>()) {
            (Some(wd), Ok(k)) if (1..=5).contains(&k) => Ok(DowRule::Nth(wd, k)),
            _ => Err(bad()),
        });
    }
    if upper == "L" {
        return Some(Err(
            "a bare L in day-of-week is ambiguous; write e.g. 6L or FRIL (last Friday)".to_owned()
        ));
    }
    let day = upper.strip_suffix('L')?;
    Some(
        weekday(day)
            .map(DowRule::Last)
            .ok_or_else(|| format!("{item:?} is not nL (n a day 1-7 with 1 = SUN, or a name such as FRIL)")),
    )
}

/// A day of the week as the `cron` crate numbers and names them: 1 = SUN ... 7 = SAT.
fn weekday(text: &str) -> Option<Weekday> {
    let number = match text {
        "SUN" | "SUNDAY" => 1,
        "MON" | "MONDAY" => 2,
        "TUE" | "TUES" | "TUESDAY" => 3,
        "WED" | "WEDNESDAY" => 4,
        "THU" | "THURS" | "THURSDAY" => 5,
        "FRI" | "FRIDAY" => 6,
        "SAT" | "SATURDAY" => 7,
        n => n.parse::<u32>().ok().filter(|n| (1..=7).contains(n))?,
    };
    const DAYS: [Weekday; 7] =
        [Weekday::Sun, Weekday::Mon, Weekday::Tue, Weekday::Wed, Weekday::Thu, Weekday::Fri, Weekday::Sat];
    DAYS.get(usize::try_from(number).ok()?.checked_sub(1)?).copied()
}
