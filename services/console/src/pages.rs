//! Page rendering (maud: every interpolated value is HTML-escaped): the layout every page
//! shares, small helpers, the chart, and one module per page.

pub(crate) mod breakers;
pub(crate) mod bulk;
pub(crate) mod dlq;
pub(crate) mod editor;
pub(crate) mod events;
pub(crate) mod graph;
pub(crate) mod history;
pub(crate) mod overview;
pub(crate) mod queue_charts;
pub(crate) mod queues;
pub(crate) mod runs;
pub(crate) mod tasks;
pub(crate) mod when;

use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use crate::activity::Minute;
pub(crate) use when::{when, when_opt};

/// What every page needs to know about the request's permissions.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub(crate) csrf: String,
    pub(crate) allow_actions: bool,
}

/// The page around `body`: navigation, styles and the (optional) scripts.
pub(crate) fn layout(title: &str, current: &str, body: Markup) -> Markup {
    page(title, current, Refresh::None, body)
}

/// [`layout`] for a page that updates itself while it is open: the console's script listens to
/// the live events at `stream` (`/events/stream?...`) and redraws the page's content after
/// each (at most every two seconds); without JavaScript the page reloads every
/// `fallback_seconds` when given.
pub(crate) fn live(
    title: &str,
    current: &str,
    stream: &str,
    fallback_seconds: Option<u32>,
    body: Markup,
) -> Markup {
    page(title, current, Refresh::Live { stream, fallback_seconds }, body)
}

/// How a page keeps itself current.
enum Refresh<'a> {
    None,
    Live { stream: &'a str, fallback_seconds: Option<u32> },
}

fn page(title: &str, current: &str, refresh: Refresh<'_>, body: Markup) -> Markup {
    let nav = [
        ("/", "Overview"),
        ("/tasks", "Tasks"),
        ("/runs", "Runs"),
        ("/dlq", "Dead letters"),
        ("/breakers", "Breakers"),
        ("/queues", "Queues"),
        ("/events", "Events"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · jetsched" }
                @match refresh {
                    Refresh::Live { fallback_seconds: Some(seconds), .. } => {
                        noscript { meta http-equiv="refresh" content=(seconds); }
                    }
                    _ => {}
                }
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/htmx-2.0.4.min.js" defer {}
                script src="/assets/console.js" defer {}
            }
            body {
                a.skip href="#content" { "Skip to content" }
                header {
                    span.brand { "jetsched" }
                    nav {
                        @for (href, label) in nav {
                            a href=(href) class=[(current == href).then_some("current")] { (label) }
                        }
                    }
                    // Shown by the script, which redraws every time in the zone chosen here.
                    label.zone hidden { "Times "
                        select #zone-choice {
                            option value="utc" { "UTC" }
                            option value="browser" { "this browser's zone" }
                            option value="task" { "the task's zone" }
                        }
                    }
                }
                @let stream = match refresh { Refresh::Live { stream, .. } => Some(stream), _ => None };
                main #content tabindex="-1" data-live=[stream] { h1 { (title) } (body) }
            }
        }
    }
}

/// A page that says what went wrong (errors from the API are users' text: escaped).
pub(crate) fn problem(title: &str, messages: &[String]) -> Markup {
    layout(
        title,
        "",
        html! {
            div.error role="alert" { @for message in messages { p { (message) } } }
        },
    )
}

/// `/login`: the token form (and why the last attempt failed).
pub(crate) fn login(failed: bool, next: &str) -> Markup {
    layout(
        "Sign in",
        "",
        html! {
            @if failed { p.error role="alert" { "That token is not the console's." } }
            form method="post" action="/login" {
                input type="hidden" name="next" value=(next);
                label { "Token " input type="password" name="token" autofocus required; }
                " " button type="submit" { "Sign in" }
            }
        },
    )
}

/// `2026-03-29 01:30:00Z`.
pub(crate) fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

#[allow(dead_code, reason = "plain-text times (titles, exports); the pages show `when_opt`")]
pub(crate) fn time_opt(t: Option<DateTime<Utc>>) -> String {
    t.map(time).unwrap_or_default()
}

/// `/tasks/<namespace>/<id>` (ids are `[A-Za-z0-9_-]`, nothing to encode; escaped anyway as an
/// attribute).
pub(crate) fn task_href(namespace: &str, id: &str) -> String {
    format!("/tasks/{namespace}/{id}")
}

/// `/breakers/<bucket key>` (keys are `[-/_=.a-zA-Z0-9]`; escaped anyway as an attribute).
pub(crate) fn breaker_href(key: &str) -> String {
    format!("/breakers/{key}")
}

/// Actions that destroy or stop something: their forms carry the `danger` class.
const DESTRUCTIVE: [&str; 4] = ["delete", "purge", "cancel", "reset"];

/// Whether an action labelled `label` destroys or stops something (its first word says so, or
/// it asks for a confirmation).
pub(crate) fn is_destructive(label: &str, confirm: Option<&str>) -> bool {
    let verb = label.split_whitespace().next().unwrap_or_default().to_lowercase();
    confirm.is_some() || DESTRUCTIVE.contains(&verb.as_str())
}

/// A POST form for one action, carrying the CSRF token; `confirm` adds a required checkbox
/// (works without JavaScript). Destructive actions are styled as such (`danger`).
pub(crate) fn action(ctx: &Ctx, href: &str, label: &str, confirm: Option<&str>) -> Markup {
    let class = if is_destructive(label, confirm) { "action danger" } else { "action" };
    html! {
        form class=(class) method="post" action=(href) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            @if let Some(question) = confirm {
                label.confirm { input type="checkbox" name="confirm" value="yes" required; " " (question) }
                " "
            }
            button type="submit" disabled[!ctx.allow_actions]
                title=[(!ctx.allow_actions).then_some("actions are off: start the console with --allow-actions")]
                { (label) }
        }
    }
}

/// Fires and runs per minute as bars (inline SVG), failures in their own colour.
pub(crate) fn chart(minutes: &[Minute]) -> Markup {
    let (width, height, bar) = (600u32, 120u32, 600 / minutes.len().max(1) as u32);
    let peak = minutes.iter().map(|m| m.fires.max(m.runs)).max().unwrap_or(0).max(1);
    let scale = |n: u32| (f64::from(n) * f64::from(height - 20) / f64::from(peak)).round() as u32;
    let total_fires: u32 = minutes.iter().map(|m| m.fires).sum();
    let total_runs: u32 = minutes.iter().map(|m| m.runs).sum();
    let total_failures: u32 = minutes.iter().map(|m| m.failures).sum();
    html! {
        figure.chart {
            svg width=(width) height=(height) viewBox={"0 0 " (width) " " (height)} role="img"
                aria-label={"fires and runs per minute over the last " (minutes.len()) " minutes"} {
                line x1="0" y1=(height - 1) x2=(width) y2=(height - 1) class="axis" {}
                @for (n, minute) in minutes.iter().enumerate() {
                    @let x = n as u32 * bar;
                    rect class="fires" x=(x) y=(height - 1 - scale(minute.fires)) width=(bar / 2) height=(scale(minute.fires)) {
                        title { (minute.fires) " fires" }
                    }
                    rect class="runs" x=(x + bar / 2) y=(height - 1 - scale(minute.runs)) width=(bar / 2) height=(scale(minute.runs)) {
                        title { (minute.runs) " runs, " (minute.failures) " failed" }
                    }
                    @if minute.failures > 0 {
                        rect class="failures" x=(x + bar / 2) y=(height - 1 - scale(minute.failures)) width=(bar / 2) height=(scale(minute.failures)) {}
                    }
                }
                text x="4" y="12" { "peak " (peak) "/min" }
            }
            figcaption {
                span.key-fires { "■" } " fires " (total_fires) " · "
                span.key-runs { "■" } " runs " (total_runs) " · "
                span.key-failures { "■" } " failed " (total_failures)
                " (per minute, last " (minutes.len()) " minutes)"
            }
        }
    }
}

/// Links to pages of a list, keeping the query string's other parameters.
pub(crate) fn pager(base: &str, query: &str, page: usize, pages: usize) -> Markup {
    let link = |n: usize| {
        let sep = if query.is_empty() { "" } else { "&" };
        format!("{base}?{query}{sep}page={n}")
    };
    html! {
        nav.pager aria-label="pages" {
            @if page > 1 { a rel="prev" href=(link(page - 1)) { "← previous" } " " }
            span { "page " (page) " of " (pages) }
            @if page < pages { " " a rel="next" href=(link(page + 1)) { "next →" } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_scales_to_the_peak_and_counts() {
        let minutes = [Minute { fires: 4, runs: 2, failures: 1 }, Minute::default()];
        let svg = chart(&minutes).into_string();
        assert!(svg.contains("peak 4/min"), "{svg}");
        assert!(svg.contains("fires 4") && svg.contains("failed 1"), "{svg}");
        assert!(svg.contains(r#"class="failures""#));
    }

    #[test]
    fn actions_carry_the_csrf_token_and_are_disabled_when_off() {
        let ctx = Ctx { csrf: "tok\"<".into(), allow_actions: false };
        let form = action(&ctx, "/tasks/a/b/pause", "Pause", None).into_string();
        assert!(form.contains(r#"value="tok&quot;&lt;""#), "{form}");
        assert!(form.contains("disabled"), "{form}");
        let ctx = Ctx { allow_actions: true, ..ctx };
        let form = action(&ctx, "/tasks/a/b/delete", "Delete", Some("really?")).into_string();
        assert!(!form.contains("disabled") && form.contains(r#"name="confirm""#), "{form}");
        assert!(form.contains(r#"class="action danger""#), "{form}");
        let reset = action(&ctx, "/breakers/k/reset", "Reset", None).into_string();
        assert!(reset.contains(r#"class="action danger""#), "{reset}");
        let pause = action(&ctx, "/tasks/a/b/pause", "Pause", None).into_string();
        assert!(pause.contains(r#"class="action""#), "{pause}");
    }

    #[test]
    fn every_table_header_has_a_scope() {
        let sources = [
            ("breakers", include_str!("pages/breakers.rs")),
            ("dlq", include_str!("pages/dlq.rs")),
            ("events", include_str!("pages/events.rs")),
            ("history", include_str!("pages/history.rs")),
            ("overview", include_str!("pages/overview.rs")),
            ("queues", include_str!("pages/queues.rs")),
            ("runs", include_str!("pages/runs.rs")),
            ("tasks", include_str!("pages/tasks.rs")),
        ];
        let mut missing = Vec::new();
        for (page, source) in sources {
            for (n, line) in source.lines().enumerate() {
                for (at, _) in line.match_indices("th ") {
                    let before = line[..at].chars().last();
                    let element = before.is_none_or(|c| c == '{' || c.is_whitespace());
                    let head = line[at..].split('{').next().unwrap_or_default();
                    if element && !line.trim_start().starts_with("//") && !head.contains("scope=") {
                        missing.push(format!("pages/{page}.rs:{}: {}", n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(missing.is_empty(), "table headers without a scope:\n{}", missing.join("\n"));
    }

    #[test]
    fn the_page_has_a_skip_link_and_the_zone_choice() {
        let html = layout("T", "/", html! { p { "x" } }).into_string();
        assert!(html.contains(r##"<a class="skip" href="#content">Skip to content</a>"##), "{html}");
        assert!(html.contains(r#"<main id="content""#) && html.contains(r#"id="zone-choice""#), "{html}");
    }

    #[test]
    fn the_pager_keeps_the_query() {
        let html = pager("/tasks", "q=x&amp", 2, 3).into_string();
        assert!(html.contains(r#"href="/tasks?q=x&amp;amp&amp;page=1""#), "{html}");
        assert!(html.contains("page=3"));
    }
}
