//! Times as the pages show them: a `<time datetime>` element with the UTC time, and the
//! relative time beside it ("3 min ago", "in 2 s"), both rendered on the server so pages read
//! without JavaScript; the console's script redraws them in the zone the reader chose (UTC,
//! the browser's, or the task's) and keeps the relative times current.

use chrono::{DateTime, Utc};
use maud::{Markup, html};

/// `3 min ago`, `in 2 s`, `now`: how far `at` is from `now`, to a glance's precision.
pub(crate) fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let millis = (at - now).num_milliseconds();
    let seconds = millis.unsigned_abs() / 1000;
    let amount = match seconds {
        0 => return "now".to_string(),
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min", s / 60),
        s if s < 86_400 => format!("{} h", s / 3600),
        s => format!("{} d", s / 86_400),
    };
    if millis < 0 { format!("{amount} ago") } else { format!("in {amount}") }
}

/// `at` as a `<time>` element (UTC, `2026-03-29 01:30:00Z`) with its relative time beside it.
pub(crate) fn when(at: DateTime<Utc>) -> Markup {
    let now = Utc::now();
    html! {
        time datetime=(at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)) { (at.format("%Y-%m-%d %H:%M:%SZ")) }
        " " span.rel { "(" (relative(at, now)) ")" }
    }
}

/// [`when`] of a time that may be missing (nothing shown then).
pub(crate) fn when_opt(at: Option<DateTime<Utc>>) -> Markup {
    html! { @if let Some(at) = at { (when(at)) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_at_a_glance() {
        let now = DateTime::parse_from_rfc3339("2026-03-01T10:00:00Z").unwrap().to_utc();
        let at = |s: i64| now + chrono::Duration::seconds(s);
        assert_eq!(relative(at(0), now), "now");
        assert_eq!(relative(at(2), now), "in 2 s");
        assert_eq!(relative(at(-180), now), "3 min ago");
        assert_eq!(relative(at(-7300), now), "2 h ago");
        assert_eq!(relative(at(3 * 86_400), now), "in 3 d");
    }

    #[test]
    fn a_time_element_carries_the_instant() {
        let at = DateTime::parse_from_rfc3339("2026-03-29T01:30:00.250Z").unwrap().to_utc();
        let html = when(at).into_string();
        assert!(
            html.starts_with(r#"<time datetime="2026-03-29T01:30:00.250Z">2026-03-29 01:30:00Z</time> "#),
            "{html}"
        );
        assert!(html.contains(r#"<span class="rel">("#) && html.contains(" ago)"), "{html}");
        assert_eq!(when_opt(None).into_string(), "");
    }
}
