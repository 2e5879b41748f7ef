//! `/`: who leads (term, since when), live replicas of each service, queue depths, fires/s and
//! runs/s, the chart of the last hour, recent failures, dead letters and alerts.

use chrono::{DateTime, Utc};
use jetsched_shared::alert::AlertMessage;
use jetsched_shared::wire::Event;
use maud::{Markup, html};

use super::{chart, when};
use crate::activity::Minute;

/// The leader as its lease record tells it.
#[derive(Debug, Clone)]
pub(crate) struct Leader {
    pub(crate) instance: String,
    pub(crate) term: u64,
    pub(crate) since: DateTime<Utc>,
}

/// One queue's dispatch consumer.
#[derive(Debug, Clone)]
pub(crate) struct QueueDepth {
    pub(crate) queue: String,
    pub(crate) pending: u64,
    pub(crate) in_flight: u64,
    /// Runs of the queue an open breaker holds (`None`: unknown).
    pub(crate) held: Option<u64>,
}

/// Everything the overview shows.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overview {
    pub(crate) leader: Option<Leader>,
    /// Role and the instance ids that answered.
    pub(crate) replicas: Vec<(String, Vec<String>)>,
    pub(crate) queues: Vec<QueueDepth>,
    pub(crate) fires_per_second: f64,
    pub(crate) runs_per_second: f64,
    pub(crate) minutes: Vec<Minute>,
    pub(crate) failures: Vec<Event>,
    pub(crate) dead_letters: Option<u64>,
    pub(crate) alerts: Vec<AlertMessage>,
    pub(crate) tasks: usize,
    /// What could not be read (shown, not hidden).
    pub(crate) problems: Vec<String>,
    /// Where trace ids link to.
    pub(crate) trace: crate::trace::TraceLinks,
}

pub(crate) fn page(overview: &Overview) -> Markup {
    // Redrawn after new events (at most every two seconds) while open.
    super::live(
        "Overview",
        "/",
        "/events/stream",
        None,
        html! {
            @if !overview.problems.is_empty() {
                div.error role="alert" { @for problem in &overview.problems { p { (problem) } } }
            }
            div.cards {
                div.card #leader {
                    h2 { "Leader" }
                    @match &overview.leader {
                        Some(leader) => { p.big { (leader.instance) } p { "term " (leader.term) " · since " (when(leader.since)) } }
                        None => p.big.bad { "no leader" }
                    }
                }
                div.card { h2 { "Tasks" } p.big { a href="/tasks" { (overview.tasks) } } }
                div.card { h2 { "Fires/s" } p.big { (format!("{:.2}", overview.fires_per_second)) } p { "last minute" } }
                div.card { h2 { "Runs/s" } p.big { (format!("{:.2}", overview.runs_per_second)) } p { "last minute" } }
                div.card #dead-letters {
                    h2 { "Dead letters" }
                    p.big class=[overview.dead_letters.is_some_and(|n| n > 0).then_some("bad")] {
                        a href="/dlq" { (overview.dead_letters.map_or("?".to_string(), |n| n.to_string())) }
                    }
                }
            }
            section { h2 { "Fires and runs, last hour" } (chart(&overview.minutes)) }
            div.columns {
                section {
                    h2 { "Live replicas" }
                    table { tbody { @for (role, instances) in &overview.replicas {
                        tr { th scope="row" { (role) } td { (instances.len()) } td { (instances.join(", ")) } }
                    } } }
                }
                section {
                    h2 { "Queues" }
                    @if overview.queues.is_empty() { p.empty { "No dispatch consumer yet." } } @else {
                        table #queues { thead { tr { th scope="col" { "Queue" } th scope="col" { "Waiting" } th scope="col" { "Held" } th scope="col" { "In flight" } } }
                            tbody { @for queue in &overview.queues {
                                tr { td { (queue.queue) } td { (queue.pending) } td.held { (queue.held.map_or("?".to_string(), |n| n.to_string())) } td { (queue.in_flight) } }
                            } } }
                    }
                }
            }
            section {
                h2 { "Recent failures" }
                @if overview.failures.is_empty() { p.empty { "No failure in the last hour." } } @else { (super::events::table(&overview.failures, &overview.trace)) }
            }
            section {
                h2 { "Alerts of the last hour" }
                @if overview.alerts.is_empty() { p.empty { "No alert." } } @else {
                    table { thead { tr { th scope="col" { "Time" } th scope="col" { "Severity" } th scope="col" { "Rule" } th scope="col" { "Text" } } }
                        tbody { @for alert in &overview.alerts {
                            tr { td { (when(alert.time)) } td { span class={"badge " (alert.severity.as_str())} { (alert.severity.as_str()) } } td { (alert.rule) } td.error-text { (alert.text) } }
                        } } }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_leader_and_unreadable_parts_are_said() {
        let overview = Overview {
            problems: vec!["leader: <timeout>".into()],
            dead_letters: Some(2),
            ..Default::default()
        };
        let html = page(&overview).into_string();
        assert!(html.contains("no leader") && html.contains("&lt;timeout&gt;"), "{html}");
        assert!(html.contains(r#"class="big bad""#), "{html}");
    }
}
