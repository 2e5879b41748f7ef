//! `/queues`: every queue, paused or running (why, by whom, since when), with Pause and Resume;
//! each lane by its priority: runs waiting, in flight, the age of the oldest waiting one; and
//! the runs open breakers hold per queue; each lane's last hour as charts.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use jetsched_shared::wire::{LaneInfo, QueueInfo};
use maud::{Markup, html};

use super::{Ctx, layout, when_opt};
use crate::activity::{Lane, LaneMinute};

/// `4s`, `3m 12s`, `2h 5m`: how long ago `at` was.
fn age(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    let Some(at) = at else { return "-".into() };
    let seconds = (now - at).num_seconds().max(0);
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m {}s", s / 60, s % 60),
        s => format!("{}h {}m", s / 3600, s % 3600 / 60),
    }
}

/// The pause form (with its reason) of a running queue, the resume button of a paused one.
fn control(ctx: &Ctx, queue: &QueueInfo) -> Markup {
    let disabled = !ctx.allow_actions;
    let off = disabled.then_some("actions are off: start the console with --allow-actions");
    html! {
        @if queue.paused {
            form.action method="post" action={"/queues/" (queue.queue) "/resume"} {
                input type="hidden" name="csrf" value=(ctx.csrf);
                button type="submit" disabled[disabled] title=[off] { "Resume" }
            }
        } @else {
            form.action method="post" action={"/queues/" (queue.queue) "/pause"} {
                input type="hidden" name="csrf" value=(ctx.csrf);
                input type="text" name="reason" placeholder="reason" maxlength="256" aria-label="reason";
                " " button type="submit" disabled[disabled] title=[off] { "Pause" }
            }
        }
    }
}

pub(crate) fn list(
    ctx: &Ctx,
    queues: &[QueueInfo],
    held: Option<&HashMap<String, u64>>,
    problem: Option<&str>,
    lanes: &[(Lane, Vec<LaneMinute>)],
) -> Markup {
    let now = Utc::now();
    let paused = queues.iter().filter(|q| q.paused).count();
    let placeholder = [LaneInfo { priority: "-".into(), waiting: 0, in_flight: 0, oldest_waiting: None }];
    layout(
        "Queues",
        "/queues",
        html! {
            @if let Some(problem) = problem { p.error role="alert" { (problem) } }
            p.count { (queues.len()) " queues, " (paused) " paused" }
            p.sub { "A paused queue starts no run: workers stop pulling from its lanes; the scheduler keeps dispatching into it and its runs wait; runs already started finish." }
            @if queues.is_empty() { p.empty { "No queue yet: a queue appears once a worker serves it." } } @else {
                table #queues {
                    thead { tr {
                        th scope="col" { "Queue" } th scope="col" { "State" } th scope="col" { "Lane" } th scope="col" { "Waiting" } th scope="col" { "In flight" }
                        th scope="col" { "Oldest waiting" } th scope="col" { "Held" } th scope="col" { "Reason" } th scope="col" { "" }
                    } }
                    tbody {
                        @for queue in queues {
                            @let lanes = if queue.lanes.is_empty() { &placeholder[..] } else { &queue.lanes[..] };
                            @let state = if queue.paused { "paused" } else { "running" };
                            @for (n, lane) in lanes.iter().enumerate() {
                                tr class={"lane " (state)} data-queue=(queue.queue) data-lane=(lane.priority) {
                                    @if n == 0 {
                                        td rowspan=(lanes.len()) { (queue.queue) }
                                        td rowspan=(lanes.len()) {
                                            span class={"badge queue-" (state)} data-state=(state) { (state) }
                                            @if queue.paused { br; small { "by " (queue.by.as_deref().unwrap_or("?")) " since " (when_opt(queue.at)) } }
                                        }
                                    }
                                    td { (lane.priority) }
                                    td.waiting { (lane.waiting) }
                                    td.in-flight { (lane.in_flight) }
                                    td { (age(lane.oldest_waiting, now)) }
                                    @if n == 0 {
                                        td.held rowspan=(lanes.len()) {
                                            (held.map_or_else(|| "?".to_string(), |h| h.get(&queue.queue).copied().unwrap_or(0).to_string()))
                                        }
                                        td.reason rowspan=(lanes.len()) { (queue.reason.as_deref().unwrap_or("")) }
                                        td rowspan=(lanes.len()) { (control(ctx, queue)) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            (super::queue_charts::charts(lanes))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_at_a_glance() {
        let now = Utc::now();
        let ago = |s: i64| Some(now - chrono::Duration::seconds(s));
        assert_eq!(age(ago(4), now), "4s");
        assert_eq!(age(ago(192), now), "3m 12s");
        assert_eq!(age(ago(7500), now), "2h 5m");
        assert_eq!(age(None, now), "-");
    }

    #[test]
    fn a_paused_queue_offers_resume_and_a_running_one_pause_with_a_reason() {
        let ctx = Ctx { csrf: "t".into(), allow_actions: true };
        let queue = |paused| QueueInfo {
            queue: "default".into(),
            paused,
            reason: paused.then(|| "<deploy>".into()),
            by: Some("alice".into()),
            at: Some(Utc::now()),
            revision: 1,
            waiting: 3,
            in_flight: 1,
            lanes: vec![LaneInfo {
                priority: "normal".into(),
                waiting: 3,
                in_flight: 1,
                oldest_waiting: None,
            }],
        };
        let page = list(&ctx, &[queue(true)], None, None, &[]).into_string();
        assert!(
            page.contains(r#"action="/queues/default/resume""#) && page.contains("&lt;deploy&gt;"),
            "{page}"
        );
        let page = list(&ctx, &[queue(false)], Some(&HashMap::new()), None, &[]).into_string();
        assert!(
            page.contains(r#"action="/queues/default/pause""#) && page.contains(r#"name="reason""#),
            "{page}"
        );
    }
}
