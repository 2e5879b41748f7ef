//! The charts of `/queues`: per queue and lane, the last hour by minute, as inline SVG drawn on
//! the server: runs finished per second, and the p50 and p99 of the wait (dispatch to start)
//! and of the duration, each with a legend in the console's checked colours.

use maud::{Markup, html};

use crate::activity::{Lane, LaneMinute, over_hour};

const WIDTH: u32 = 300;
const HEIGHT: u32 = 90;
/// Room above the plot for the peak label.
const TOP: u32 = 14;

/// `850 ms`, `2.0 s`, `3.5 min`.
pub(crate) fn millis(ms: u64) -> String {
    match ms {
        ms if ms < 1000 => format!("{ms} ms"),
        ms if ms < 60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        ms => format!("{:.1} min", ms as f64 / 60_000.0),
    }
}

fn y_of(value: f64, peak: f64) -> f64 {
    let plot = f64::from(HEIGHT - TOP - 1);
    f64::from(HEIGHT - 1) - (value / peak.max(f64::MIN_POSITIVE) * plot)
}

/// Runs finished per second in each minute, as bars.
fn rate_chart(minutes: &[LaneMinute]) -> Markup {
    let bar = WIDTH / minutes.len().max(1) as u32;
    let rates: Vec<f64> = minutes.iter().map(|m| f64::from(m.runs) / 60.0).collect();
    let peak = rates.iter().copied().fold(0.0, f64::max);
    let total: u32 = minutes.iter().map(|m| m.runs).sum();
    html! {
        figure.chart.rate-chart {
            svg width=(WIDTH) height=(HEIGHT) viewBox={"0 0 " (WIDTH) " " (HEIGHT)} role="img"
                aria-label={"runs per second by minute, last " (minutes.len()) " minutes"} {
                line.axis x1="0" y1=(HEIGHT - 1) x2=(WIDTH) y2=(HEIGHT - 1) {}
                @for (n, rate) in rates.iter().enumerate() {
                    @let y = y_of(*rate, peak);
                    @if *rate > 0.0 {
                        rect.rate x=(n as u32 * bar) y=(format!("{y:.1}")) width=(bar.saturating_sub(1).max(1))
                            height=(format!("{:.1}", f64::from(HEIGHT - 1) - y)) {
                            title { (format!("{rate:.2}")) " runs/s" }
                        }
                    }
                }
                text x="4" y="11" { "peak " (format!("{peak:.2}")) "/s" }
            }
            figcaption {
                span.key-rate { "■" } " runs/s · " (format!("{:.2}", f64::from(total) / (60.0 * minutes.len().max(1) as f64)))
                " on average, " (total) (if total == 1 { " run" } else { " runs" })
            }
        }
    }
}

/// The p50 and p99 of `pick` in each minute, as two lines (minutes without a run leave gaps).
fn quantile_chart(
    what: &str,
    minutes: &[LaneMinute],
    pick: impl Fn(&LaneMinute) -> &crate::activity::Histogram,
) -> Markup {
    let step = f64::from(WIDTH) / minutes.len().max(1) as f64;
    let points = |q: f64| -> Vec<(usize, u64)> {
        minutes.iter().enumerate().filter_map(|(n, m)| pick(m).quantile(q).map(|v| (n, v))).collect()
    };
    let (p50, p99) = (points(0.5), points(0.99));
    let peak = p99.iter().map(|(_, v)| *v).max().unwrap_or(0) as f64;
    let line = |points: &[(usize, u64)]| -> String {
        points
            .iter()
            .map(|(n, v)| format!("{:.1},{:.1}", (*n as f64 + 0.5) * step, y_of(*v as f64, peak)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let hour = over_hour(minutes, &pick);
    html! {
        figure class={"chart " (what) "-chart"} {
            svg width=(WIDTH) height=(HEIGHT) viewBox={"0 0 " (WIDTH) " " (HEIGHT)} role="img"
                aria-label={(what) " p50 and p99 by minute, last " (minutes.len()) " minutes"} {
                line.axis x1="0" y1=(HEIGHT - 1) x2=(WIDTH) y2=(HEIGHT - 1) {}
                @if !p99.is_empty() {
                    polyline.p99 points=(line(&p99)) {}
                    polyline.p50 points=(line(&p50)) {}
                    @for (n, v) in &p99 { circle.p99 cx=(format!("{:.1}", (*n as f64 + 0.5) * step)) cy=(format!("{:.1}", y_of(*v as f64, peak))) r="1.5" {} }
                }
                text x="4" y="11" { (what) " · peak " (millis(peak as u64)) }
            }
            figcaption {
                span.key-p50 { "■" } " p50 " (hour.quantile(0.5).map_or("-".into(), millis)) " · "
                span.key-p99 { "■" } " p99 " (hour.quantile(0.99).map_or("-".into(), millis))
                " (" (what) ", " (hour.count()) (if hour.count() == 1 { " run)" } else { " runs)" })
            }
        }
    }
}

/// Every lane's charts, or why there are none.
pub(crate) fn charts(lanes: &[(Lane, Vec<LaneMinute>)]) -> Markup {
    html! {
        section #queue-charts {
            h2 { "Last hour, per queue and lane" }
            p.sub { "Runs finished per second; the wait from dispatch to start and the run's duration (p50 and p99 per minute), from the run events the console reads." }
            @if lanes.is_empty() { p.empty { "No run in the last hour." } }
            @for ((queue, priority), minutes) in lanes {
                div.lane-charts data-queue=(queue) data-lane=(priority) {
                    h3 { (queue) " · " (priority) }
                    div.queue-charts {
                        (rate_chart(minutes))
                        (quantile_chart("wait", minutes, |m| &m.wait))
                        (quantile_chart("duration", minutes, |m| &m.duration))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn each_lane_gets_rate_wait_and_duration_charts_with_legends() {
        let mut minutes = vec![LaneMinute::default(); 60];
        for (n, minute) in minutes.iter_mut().enumerate().skip(50) {
            minute.runs = 120;
            for ms in 1..=100 {
                minute.wait.add(ms);
                minute.duration.add(ms * 10 + n as u64);
            }
        }
        let html = charts(&[((Arc::from("default"), "high"), minutes)]).into_string();
        assert!(html.contains(r#"data-queue="default" data-lane="high""#), "{html}");
        assert!(html.contains("peak 2.00/s") && html.contains("0.33 on average, 1200 runs"), "{html}");
        assert_eq!(html.matches(r#"<polyline class="p50""#).count(), 2, "{html}");
        assert!(html.contains("p99 108 ms") && html.contains("(wait, 1000 runs)"), "{html}");
        for key in ["key-rate", "key-p50", "key-p99"] {
            assert!(html.contains(key), "{key}: {html}");
        }
        assert!(charts(&[]).into_string().contains("No run in the last hour."));
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(
            (millis(850), millis(2_000), millis(210_000)),
            ("850 ms".into(), "2.0 s".into(), "3.5 min".into())
        );
    }
}
