//! Page rendering (maud: every interpolated value is HTML-escaped): the layout every page
//! shares, small helpers, the chart, and one module per page.

pub(crate) mod breakers;
pub(crate) mod bulk;
pub(crate) mod dlq;
pub(crate) mod editor;
pub(crate) mod events;
pub(crate) mod history;
pub(crate) mod overview;
pub(crate) mod queues;
pub(crate) mod runs;
pub(crate) mod tasks;

use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use crate::activity::Minute;

/// What every page needs to know about the request's permissions.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub(crate) csrf: String,
    pub(crate) allow_actions: bool,
}

/// The page around `body`: navigation, styles and the (optional) scripts.
pub(crate) fn layout(title: &str, current: &str, body: Markup) -> Markup {
    page(title, current, None, body)
}

/// [`layout`] for a page that reloads itself every `seconds` while what it shows is still
/// changing (a run that has not finished).
pub(crate) fn refreshing(title: &str, current: &str, seconds: u32, body: Markup) -> Markup {
    page(title, current, Some(seconds), body)
}

fn page(title: &str, current: &str, refresh: Option<u32>, body: Markup) -> Markup {
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
                @if let Some(seconds) = refresh { meta http-equiv="refresh" content=(seconds); }
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/htmx-2.0.4.min.js" defer {}
                script src="/assets/console.js" defer {}
            }
            body {
                header {
                    span.brand { "jetsched" }
                    nav {
                        @for (href, label) in nav {
                            a href=(href) class=[(current == href).then_some("current")] { (label) }
                        }
                    }
                }
                main { h1 { (title) } (body) }
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

/// A POST form for one action, carrying the CSRF token; `confirm` adds a required checkbox
/// (works without JavaScript).
pub(crate) fn action(ctx: &Ctx, href: &str, label: &str, confirm: Option<&str>) -> Markup {
    html! {
        form.action method="post" action=(href) {
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
    }

    #[test]
    fn the_pager_keeps_the_query() {
        let html = pager("/tasks", "q=x&amp", 2, 3).into_string();
        assert!(html.contains(r#"href="/tasks?q=x&amp;amp&amp;page=1""#), "{html}");
        assert!(html.contains("page=3"));
    }
}
