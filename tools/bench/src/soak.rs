//! Soak: every service as a real process (registry, scheduler, W workers, alerter) at a
//! sustained run rate for a long time. R interval tasks fire every second (anchors spread over
//! the second); each run is a real request/reply to a responder in this process through the
//! worker's `nats` executor. Every S seconds: resident memory of every process, the
//! scheduler's fire lag within the window (from its `jetsched_fire_lag_seconds` histogram),
//! fires and runs per second, and the dispatch backlog. Verdicts after a warm-up of 20%: memory
//! flat, fire lag not growing (each judged by the median of the last third of the samples
//! against the median of the first third, so a trend counts and a single swing does not), rate
//! sustained.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_tests::NatsServer;
use serde_json::{Value, json};

mod freeze;
mod prom;
mod services;

use self::prom::{histogram, metric_sum, window_quantile};
use self::services::Services;
use crate::Size;
use crate::stats::median;
use crate::system::{NS, http_get, rss_and_anon_mib, spread_schedules, wait_leader, write_tasks};

/// Subject the runs request; answered by this process.
const SUBJECT: &str = "soak.noop";
/// RSS growth after warm-up (percent, [`thirds`]) still counted as flat.
const RSS_GROWTH_MAX_PCT: f64 = 10.0;
/// The p99 fire lag of the last third of the windows after warm-up (median, [`thirds`]) may be
/// this many times that of the first third...
const LAG_GROWTH_MAX: f64 = 2.0;
/// ...or under this, whatever the ratio.
const LAG_FLOOR_MS: f64 = 50.0;
/// Achieved runs/s after warm-up, as a share of the target, that counts as sustained.
const RATE_MIN_SHARE: f64 = 0.95;

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// Preset of duration, rate and sample period (tiny: 20 s at 200/s; small: 60 s at 1,000/s;
    /// full: 600 s at 5,000/s); explicit flags win.
    #[arg(long, value_enum)]
    pub(crate) size: Option<Size>,
    /// Duration of the soak in seconds [default: 600].
    #[arg(long)]
    pub(crate) seconds: Option<u64>,
    /// Target runs per second (= interval tasks firing every second) [default: 5000].
    #[arg(long)]
    pub(crate) rate: Option<usize>,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub(crate) workers: usize,
    /// Sample period in seconds [default: 10].
    #[arg(long)]
    pub(crate) sample: Option<u64>,
    /// Freeze the soak's nats-server (SIGSTOP, then SIGCONT) this many seconds after the
    /// start; repeat the flag for several freezes. What a server pause leaves behind in the
    /// services shows in the memory verdict.
    #[arg(long = "freeze-at", value_name = "SECONDS")]
    pub(crate) freeze_at: Vec<u64>,
    /// How long each freeze lasts, in milliseconds.
    #[arg(long, default_value_t = 2_000, value_name = "MS")]
    pub(crate) freeze_ms: u64,
}

/// (seconds, rate, sample seconds) of a size.
pub(crate) fn preset(size: Size) -> (u64, usize, u64) {
    match size {
        Size::Tiny => (20, 200, 2),
        Size::Small => (60, 1_000, 5),
        Size::Full => (600, 5_000, 10),
    }
}

/// Counters read at one instant.
struct Snapshot {
    at: Instant,
    fires: f64,
    runs_ok: f64,
    runs_other: f64,
    lag: BTreeMap<u64, f64>,
    responses: u64,
}

async fn snapshot(services: &Services, responses: &AtomicU64) -> anyhow::Result<Snapshot> {
    let at = Instant::now();
    let mut snap = Snapshot {
        at,
        fires: 0.0,
        runs_ok: 0.0,
        runs_other: 0.0,
        lag: BTreeMap::new(),
        responses: responses.load(Ordering::Relaxed),
    };
    for p in &services.procs {
        let text = tokio::time::timeout(Duration::from_secs(5), http_get(p.admin, "/metrics"))
            .await
            .map_err(|_| anyhow::anyhow!("no /metrics answer from {} within 5 s", p.name))?
            .with_context(|| format!("metrics of {}", p.name))?;
        if p.name.starts_with("scheduler") {
            snap.fires = metric_sum(&text, "jetsched_fires_dispatched_total", &[]);
            snap.lag = histogram(&text, "jetsched_fire_lag_seconds");
        } else if p.name.starts_with("worker") {
            let ok = metric_sum(&text, "jetsched_worker_runs_total", &[("outcome", "succeeded")]);
            snap.runs_ok += ok;
            snap.runs_other += metric_sum(&text, "jetsched_worker_runs_total", &[]) - ok;
        }
    }
    Ok(snap)
}

/// Resolves on SIGINT or SIGTERM, so that an interrupted soak stops its service processes and
/// its server (by dropping them) instead of leaving them running.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return "SIGINT";
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// The server's own view for a sample: its CPU (percent of one core, from `/varz`) and the
/// size of the runs bucket and the events stream (`/jsz`): messages, MiB and interior deletes,
/// which is where a large or expiring store shows.
async fn server_sample(server: &NatsServer, names: &Names) -> Value {
    let varz = server.monitor_json("/varz").await.unwrap_or(Value::Null);
    let jsz = server.monitor_json("/jsz?streams=true").await.unwrap_or(Value::Null);
    let mut out = serde_json::Map::new();
    out.insert("cpu_pct".into(), varz["cpu"].clone());
    let streams = jsz["account_details"].as_array().into_iter().flatten();
    for detail in streams.flat_map(|a| a["stream_detail"].as_array().into_iter().flatten()) {
        let name = detail["name"].as_str().unwrap_or_default();
        let key = if name == format!("KV_{}", names.runs_bucket()) {
            "runs"
        } else if name == names.events_stream() {
            "events"
        } else {
            continue;
        };
        let state = &detail["state"];
        out.insert(
            key.into(),
            json!({
                "messages": state["messages"],
                "mib": round2(state["bytes"].as_f64().unwrap_or(f64::NAN) / (1024.0 * 1024.0)),
                "deleted": state["num_deleted"],
            }),
        );
    }
    Value::Object(out)
}

/// One line for the progress output from [`server_sample`].
fn server_text(sample: &Value) -> String {
    let part = |key: &str| {
        let s = &sample[key];
        format!("{key} {} msgs {} MiB {} deleted", s["messages"], s["mib"], s["deleted"])
    };
    format!("server CPU {}%; {}; {}", sample["cpu_pct"], part("runs"), part("events"))
}

fn round2(x: f64) -> Value {
    if x.is_finite() { json!((x * 100.0).round() / 100.0) } else { Value::Null }
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let (p_seconds, p_rate, p_sample) = preset(args.size.unwrap_or(Size::Full));
    let seconds = args.seconds.unwrap_or(p_seconds).max(1);
    let rate = args.rate.unwrap_or(p_rate).max(1);
    let sample = args.sample.unwrap_or(p_sample).clamp(1, seconds);
    let workers = args.workers.max(1);

    let server = NatsServer::start().await;
    let url = server.url();
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let topology = topology::ensure(&js, &names, &TopologyArgs::default()).await?;

    // The handler: every run is a request answered here (an empty reply is success).
    let responder_client = server.client().await;
    let mut requests = responder_client.subscribe(SUBJECT).await?;
    let responses = Arc::new(AtomicU64::new(0));
    let responder = {
        let responses = responses.clone();
        tokio::spawn(async move {
            while let Some(message) = requests.next().await {
                if let Some(reply) = message.reply
                    && responder_client.publish(reply, bytes::Bytes::new()).await.is_ok()
                {
                    responses.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    let dir = std::env::temp_dir().join(format!("jetsched-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut services = Services::new(dir);
    services.spawn(&url, "jetsched-registry", "registry", &[])?;
    services.spawn(&url, "jetsched-scheduler", "scheduler", &[])?;
    for i in 1..=workers {
        services.spawn(&url, "jetsched-worker", &format!("worker-{i}"), &[])?;
    }
    services.spawn(&url, "jetsched-alerter", "alerter", &[])?;
    services.wait_ready().await?;
    wait_leader(&topology, &names).await?;

    // R tasks every second, anchors spread evenly over the second.
    let (_, schedules) = spread_schedules(rate, rate);
    let specs = schedules
        .into_iter()
        .enumerate()
        .map(|(i, schedule)| {
            let id = format!("soak{i}");
            let body = json!({
                "id": id, "namespace": NS,
                "schedule": schedule,
                "executor": {"kind": "nats", "subject": SUBJECT},
                "timeout": "5s",
            });
            (id, bytes::Bytes::from(serde_json::to_vec(&body).expect("spec serializes")))
        })
        .collect();
    let wrote = write_tasks(&topology, specs).await?;
    eprintln!(
        "soak: {rate} tasks every 1 s written in {:.1} s; {workers} worker(s), {seconds} s, a sample every {sample} s",
        wrote.as_secs_f64()
    );

    let stream = js.get_stream(names.dispatch_stream()).await?;
    let consumer_name = names.worker_consumer("default");
    let started = Instant::now();
    let mut freeze_at = args.freeze_at.clone();
    freeze_at.sort_unstable();
    let freeze_length = Duration::from_millis(args.freeze_ms);
    // Aborted at the end (a freeze under way is resumed when its task is dropped).
    let freezer = server.pid().map(|pid| {
        let at = freeze_at.clone();
        tokio::spawn(async move { freeze::freezes(pid, started, &at, freeze_length).await })
    });
    let mut previous = snapshot(&services, &responses).await?;
    let mut samples: Vec<Value> = Vec::new();
    let mut rss_series: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut anon_series: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut index = 1u64;
    let mut interrupt = std::pin::pin!(interrupted());
    loop {
        let next = started + Duration::from_secs(sample * index);
        if next > started + Duration::from_secs(seconds) + Duration::from_millis(500) {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep_until(next.into()) => {}
            signal = &mut interrupt => {
                // Returning drops the services and the server: nothing is left running.
                bail!("soak interrupted by {signal} after {:.0} s", started.elapsed().as_secs_f64())
            }
        }
        index += 1;
        services.check_alive()?;
        let now = snapshot(&services, &responses).await?;
        let window = (now.at - previous.at).as_secs_f64();
        let fires_per_s = (now.fires - previous.fires) / window;
        let runs_per_s = (now.runs_ok - previous.runs_ok) / window;
        let other = now.runs_other - previous.runs_other;
        let responses_per_s = (now.responses - previous.responses) as f64 / window;
        let p50 = window_quantile(&previous.lag, &now.lag, 0.5);
        let p99 = window_quantile(&previous.lag, &now.lag, 0.99);
        let (pending, ack_pending) = match stream.consumer_info(&consumer_name).await {
            Ok(info) => (info.num_pending, info.num_ack_pending as u64),
            Err(_) => (0, 0),
        };
        let mut rss = serde_json::Map::new();
        let mut anon = serde_json::Map::new();
        let pids = services.procs.iter().map(|p| (p.name.clone(), Some(p.child.id())));
        for (name, pid) in pids.chain([("nats-server".to_string(), server.pid())]) {
            let (mib, anon_mib) = pid.map_or((f64::NAN, f64::NAN), rss_and_anon_mib);
            rss.insert(name.clone(), round2(mib));
            anon.insert(name.clone(), round2(anon_mib));
            rss_series.entry(name.clone()).or_default().push(mib);
            anon_series.entry(name).or_default().push(anon_mib);
        }
        let nats = server_sample(&server, &names).await;
        let t = (now.at - started).as_secs_f64();
        let rss_text = rss.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
        eprintln!(
            "soak: t={t:>5.0}s fires/s {fires_per_s:>7.0} runs/s {runs_per_s:>7.0} (other verdicts {other:.0}) \
             lag p50 {p50:>7.2} / p99 {p99:>7.2} ms; backlog {pending} (+{ack_pending} unacked); RSS MiB: {rss_text}; {}",
            server_text(&nats)
        );
        samples.push(json!({
            "t_s": round2(t),
            "fires_per_second": round2(fires_per_s),
            "runs_per_second": round2(runs_per_s),
            "responses_per_second": round2(responses_per_s),
            "runs_not_succeeded": other,
            "lag_p50_ms": round2(p50),
            "lag_p99_ms": round2(p99),
            "backlog": pending,
            "ack_pending": ack_pending,
            "rss_mib": rss,
            "rss_anon_mib": anon,
            "server": nats,
        }));
        previous = now;
    }
    let total_runs = previous.runs_ok;
    let total_responses = previous.responses;
    responder.abort();
    let freezes: Vec<Value> = match freezer {
        Some(task) if task.is_finished() => task.await.unwrap_or_default(),
        Some(task) => {
            task.abort();
            let _ = task.await;
            Vec::new()
        }
        None => Vec::new(),
    }
    .into_iter()
    .map(|(from, to)| json!({"from_s": round2(from), "to_s": round2(to)}))
    .collect();
    // A soak without runs keeps its logs; so does every soak with JETSCHED_KEEP_LOGS set.
    services.keep = total_runs <= 0.0 || std::env::var_os("JETSCHED_KEEP_LOGS").is_some();
    drop(services);
    if total_runs <= 0.0 || samples.is_empty() {
        bail!("soak: no run completed ({total_responses} handler requests answered)");
    }

    // Verdicts over the samples after the warm-up (the first 20%, at least one sample).
    let n = samples.len();
    let warm = ((n as f64 * 0.2).ceil() as usize).clamp(1, n.saturating_sub(1).max(1));
    let post = &samples[warm.min(n - 1)..];
    let num = |v: &Value, key: &str| v[key].as_f64().unwrap_or(f64::NAN);
    let mut memory = serde_json::Map::new();
    let mut rss_flat = true;
    for (name, series) in &rss_series {
        let at_warm = series[warm - 1];
        let after = &series[warm.min(n - 1)..];
        let max_after = after.iter().copied().fold(f64::NAN, f64::max);
        let (first_third, last_third) = thirds(after);
        let growth = 100.0 * (last_third - first_third) / first_third;
        let anon_after = anon_series.get(name).map_or(&[][..], |s| &s[warm.min(n - 1)..]);
        let (anon_first, anon_last) = thirds(anon_after);
        let anon_growth = 100.0 * (anon_last - anon_first) / anon_first;
        let flat = growth < RSS_GROWTH_MAX_PCT;
        // nats-server keeps the stored streams' indexes in memory: reported, not judged.
        if name != "nats-server" {
            rss_flat &= flat;
        }
        memory.insert(
            name.clone(),
            json!({
                "rss_end_of_warmup_mib": round2(at_warm),
                "rss_max_after_warmup_mib": round2(max_after),
                "rss_first_third_median_mib": round2(first_third),
                "rss_last_third_median_mib": round2(last_third),
                "growth_pct": round2(growth),
                "anon_first_third_median_mib": round2(anon_first),
                "anon_last_third_median_mib": round2(anon_last),
                "anon_growth_pct": round2(anon_growth),
                "flat": flat,
                "judged": name != "nats-server",
            }),
        );
    }
    let first_p50 = num(&post[0], "lag_p50_ms");
    let first_p99 = num(&post[0], "lag_p99_ms");
    let last_p50 = num(&post[post.len() - 1], "lag_p50_ms");
    let last_p99 = num(&post[post.len() - 1], "lag_p99_ms");
    let p99s: Vec<f64> = post.iter().map(|s| num(s, "lag_p99_ms")).filter(|v| v.is_finite()).collect();
    let (p99_first_third, p99_last_third) = thirds(&p99s);
    let lag_flat = p99_last_third < LAG_FLOOR_MS || p99_last_third <= LAG_GROWTH_MAX * p99_first_third;
    let worst_p99 = p99s.iter().copied().fold(f64::NAN, f64::max);
    let achieved = post.iter().map(|s| num(s, "runs_per_second")).sum::<f64>() / post.len() as f64;
    let fires = post.iter().map(|s| num(s, "fires_per_second")).sum::<f64>() / post.len() as f64;
    let rate_ok = achieved >= RATE_MIN_SHARE * rate as f64;
    let max_backlog = samples.iter().filter_map(|s| s["backlog"].as_u64()).max().unwrap_or(0);
    let not_succeeded: f64 = samples.iter().map(|s| num(s, "runs_not_succeeded")).sum();

    eprintln!();
    eprintln!(
        "soak summary: {seconds} s at {rate} runs/s target, {workers} worker(s); warm-up {warm} of {n} samples ({sample} s each)"
    );
    eprintln!(
        "  achieved {achieved:.0} runs/s after warm-up ({:.1}% of target; fires {fires:.0}/s); {total_runs:.0} runs succeeded, \
         {not_succeeded:.0} other verdicts; max backlog {max_backlog}",
        100.0 * achieved / rate as f64
    );
    if !freezes.is_empty() {
        eprintln!("  nats-server frozen {} time(s) for {} ms: {freezes:?}", freezes.len(), args.freeze_ms);
    }
    eprintln!(
        "  fire lag first post-warm-up window p50 {first_p50:.2} / p99 {first_p99:.2} ms; last window p50 {last_p50:.2} / p99 {last_p99:.2} ms"
    );
    eprintln!(
        "  fire lag p99, median of the first third of the windows after warm-up {p99_first_third:.2} ms, of the last third {p99_last_third:.2} ms; worst window {worst_p99:.2} ms"
    );
    for (name, m) in &memory {
        eprintln!(
            "  RSS {name:<12} {:>8} MiB at end of warm-up, max after {:>8} MiB; median first third {:>8}, last third {:>8} MiB: growth {:>6}% (anonymous {} -> {} MiB, {}%){}",
            m["rss_end_of_warmup_mib"],
            m["rss_max_after_warmup_mib"],
            m["rss_first_third_median_mib"],
            m["rss_last_third_median_mib"],
            m["growth_pct"],
            m["anon_first_third_median_mib"],
            m["anon_last_third_median_mib"],
            m["anon_growth_pct"],
            if m["judged"] == true { "" } else { " (not judged)" }
        );
    }
    let server_end = samples.last().map_or(Value::Null, |s| s["server"].clone());
    eprintln!("  at the end: {}", server_text(&server_end));
    eprintln!(
        "  verdicts: memory flat (last third < {RSS_GROWTH_MAX_PCT}% over first): {rss_flat}; fire lag not growing (p99 last third <= {LAG_GROWTH_MAX}x first or < {LAG_FLOOR_MS} ms): {lag_flat}; \
         rate sustained (>= {:.0}% of target): {rate_ok}",
        RATE_MIN_SHARE * 100.0
    );
    Ok(json!({
        "scenario": "soak",
        "seconds": seconds,
        "target_runs_per_second": rate,
        "workers": workers,
        "sample_seconds": sample,
        "warmup_samples": warm,
        "runs_succeeded": total_runs,
        "runs_not_succeeded": not_succeeded,
        "handler_requests": total_responses,
        "achieved_runs_per_second": round2(achieved),
        "achieved_fires_per_second": round2(fires),
        "achieved_share": round2(achieved / rate as f64),
        "max_backlog": max_backlog,
        "server_freezes": freezes,
        "server_freeze_ms": args.freeze_ms,
        "server_at_end": server_end,
        "lag": {
            "first_after_warmup": {"p50_ms": round2(first_p50), "p99_ms": round2(first_p99)},
            "last": {"p50_ms": round2(last_p50), "p99_ms": round2(last_p99)},
            "p99_first_third_median_ms": round2(p99_first_third),
            "p99_last_third_median_ms": round2(p99_last_third),
            "p99_worst_ms": round2(worst_p99),
        },
        "memory": memory,
        "thresholds": {
            "rss_growth_max_pct": RSS_GROWTH_MAX_PCT,
            "lag_growth_max": LAG_GROWTH_MAX,
            "lag_floor_ms": LAG_FLOOR_MS,
            "rate_min_share": RATE_MIN_SHARE,
        },
        "verdicts": {
            "memory_flat": rss_flat,
            "lag_not_growing": lag_flat,
            "flat": rss_flat && lag_flat,
            "rate_sustained": rate_ok,
            "pass": rss_flat && lag_flat && rate_ok,
        },
        "samples": samples,
    }))
}

/// Medians of the first and the last third (at least one sample each) of `series`: a trend
/// moves them apart, a swing that comes back does not.
fn thirds(series: &[f64]) -> (f64, f64) {
    let k = (series.len() / 3).max(1).min(series.len());
    (median(series[..k].to_vec()), median(series[series.len() - k..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thirds_see_a_trend_and_not_a_swing() {
        // A leak: +1 MiB a sample from 36 MiB over 48 samples.
        let leak: Vec<f64> = (0..48).map(|i| 36.0 + f64::from(i)).collect();
        let (first, last) = thirds(&leak);
        assert!((last - first) / first > 0.5, "{first} {last}");
        // A bounded buffer swinging between 36 and 44 MiB, ending on a peak.
        let swing: Vec<f64> = (0..48).map(|i| if i % 5 == 4 || i == 47 { 44.0 } else { 36.0 }).collect();
        assert_eq!(thirds(&swing), (36.0, 36.0));
        assert_eq!(thirds(&[5.0]), (5.0, 5.0));
        assert_eq!(thirds(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), (1.5, 5.5));
        assert!(thirds(&[]).0.is_nan());
    }
}
