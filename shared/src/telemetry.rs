//! Tracing initialisation, once per process: level from `RUST_LOG` (default `info`), plain or
//! JSON output on stderr, and, when an OTLP endpoint is configured, span export.
//!
//! Export follows the standard OpenTelemetry variables: `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` turns it on (unset: no exporter, no span on the hot
//! paths), `OTEL_EXPORTER_OTLP_PROTOCOL` picks `http/protobuf` (default) or `grpc`; headers,
//! timeout, `OTEL_SERVICE_NAME` (default: the binary's name), `OTEL_RESOURCE_ATTRIBUTES` and
//! `OTEL_TRACES_SAMPLER(_ARG)` (default `parentbased_always_on`) are read by the SDK itself.
//! Spans leave through a batch processor on the service's runtime behind a bounded queue: a
//! collector that is down or slow costs dropped spans (counted in
//! `jetsched_trace_spans_dropped_total`, logged at most once a minute), never a blocked service.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, SdkTracerProvider, SpanData, SpanExporter, SpanProcessor,
};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, filter};

use crate::config::LogFormat;
pub use crate::names::NATS_MSG_TRACE_ENV;
use crate::trace;

/// Spans waiting for export (queued or in a batch being sent) beyond which new ones are dropped,
/// unless `OTEL_BSP_MAX_QUEUE_SIZE` says otherwise: twice the standard 2,048, as a burst of runs
/// on a busy worker (two or three spans each) fills 2,048 between two exports.
pub const SPAN_QUEUE_CAPACITY: usize = 4096;
/// How long shutdown waits for the last spans to leave.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Dropped spans are logged at most this often.
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The tracing part of every service binary's `--help`: the standard OpenTelemetry variables
/// it reads (they have no flags).
pub const ENV_HELP: &str = "\
Tracing (OpenTelemetry's standard variables and one of jetsched's, no flags):
  Export spans over OTLP to this endpoint (unset: no export) [env: OTEL_EXPORTER_OTLP_ENDPOINT]
  Endpoint for spans only, used as given (e.g. http://collector:4318/v1/traces) [env: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT]
  http/protobuf (default) or grpc [env: OTEL_EXPORTER_OTLP_PROTOCOL]
  Headers of export requests, key=value,... [env: OTEL_EXPORTER_OTLP_HEADERS]
  Export timeout in milliseconds (default 10000) [env: OTEL_EXPORTER_OTLP_TIMEOUT]
  Service name (default: the binary's name) [env: OTEL_SERVICE_NAME]
  More resource attributes, key=value,... [env: OTEL_RESOURCE_ATTRIBUTES]
  Sampler (default parentbased_always_on; always_off, traceidratio, ...) [env: OTEL_TRACES_SAMPLER]
  Sampler argument (the ratio of traceidratio) [env: OTEL_TRACES_SAMPLER_ARG]
  Spans waiting for export before new ones are dropped (default 4096) [env: OTEL_BSP_MAX_QUEUE_SIZE]
  Longest wait before queued spans are sent, ms (default 5000) [env: OTEL_BSP_SCHEDULE_DELAY]
  Most spans per export request (default 512) [env: OTEL_BSP_MAX_EXPORT_BATCH_SIZE]
  true: let nats-server trace sampled dispatches for an account with msg_trace (default false: they carry Nats-Trace-Dest: trace disabled) [env: JETSCHED_NATS_MSG_TRACE]";

/// How spans are exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies, POST to `<endpoint>/v1/traces`.
    HttpProtobuf,
    /// OTLP/gRPC.
    Grpc,
}

/// Which trace export a process runs: read from the environment by a binary
/// ([`TraceSettings::from_env`]), built directly by tests and embedding programs.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// `None`: no exporter (no OTLP endpoint configured).
    pub exporter: Option<Protocol>,
    /// Service name unless `OTEL_SERVICE_NAME` or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`
    /// says otherwise: the binary's name (`jetsched-worker`).
    pub default_service_name: String,
    /// `service.instance.id`: the `--instance-id`.
    pub instance_id: String,
    /// The sampler (`OTEL_TRACES_SAMPLER`, `_ARG`): it decides the sampled flag of the traces
    /// this process starts, whether or not it exports spans.
    pub sampling: trace::Sampling,
    /// Spans waiting for export beyond which new ones are dropped (`OTEL_BSP_MAX_QUEUE_SIZE`).
    pub queue_size: usize,
    /// Longest wait before queued spans leave (`OTEL_BSP_SCHEDULE_DELAY`, milliseconds).
    pub schedule_delay: Duration,
    /// Most spans in one export request (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
    pub max_export_batch: usize,
    /// Whether nats-server may trace this process's sampled dispatches with its own message
    /// tracing (`JETSCHED_NATS_MSG_TRACE`, default false; see [`trace::server_msg_trace`]).
    pub nats_msg_trace: bool,
}

/// `OTEL_BSP_SCHEDULE_DELAY`'s standard default.
const SCHEDULE_DELAY: Duration = Duration::from_millis(5000);
/// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`'s standard default.
const MAX_EXPORT_BATCH: usize = 512;

impl TraceSettings {
    /// No export.
    pub fn off(binary: &str, instance_id: &str) -> TraceSettings {
        TraceSettings {
            exporter: None,
            default_service_name: binary.to_string(),
            instance_id: instance_id.to_string(),
            sampling: trace::Sampling::default(),
            queue_size: SPAN_QUEUE_CAPACITY,
            schedule_delay: SCHEDULE_DELAY,
            max_export_batch: MAX_EXPORT_BATCH,
            nats_msg_trace: false,
        }
    }

    /// The settings of binary `binary` from the standard OpenTelemetry variables; the errors
    /// name every variable whose value is not understood.
    pub fn from_env(binary: &str, instance_id: &str) -> Result<TraceSettings, Vec<String>> {
        TraceSettings::from_vars(binary, instance_id, |name| std::env::var(name).ok())
    }

    /// As [`TraceSettings::from_env`], the variables read through `var`.
    pub fn from_vars(
        binary: &str,
        instance_id: &str,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<TraceSettings, Vec<String>> {
        let var = |name: &str| var(name).filter(|value| !value.trim().is_empty());
        let mut settings = TraceSettings::off(binary, instance_id);
        let mut problems = Vec::new();
        let sampler = var("OTEL_TRACES_SAMPLER");
        match trace::Sampling::parse(sampler.as_deref(), var("OTEL_TRACES_SAMPLER_ARG").as_deref()) {
            Ok(sampling) => settings.sampling = sampling,
            Err(found) => problems.extend(found),
        }
        match var(NATS_MSG_TRACE_ENV).map(|value| value.trim().to_ascii_lowercase()).as_deref() {
            None | Some("false") => {}
            Some("true") => settings.nats_msg_trace = true,
            Some(other) => problems.push(format!("{NATS_MSG_TRACE_ENV} = {other:?}: must be true or false")),
        }
        if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        {
            let (name, protocol) = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
                Some(protocol) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", Some(protocol)),
                None => ("OTEL_EXPORTER_OTLP_PROTOCOL", var("OTEL_EXPORTER_OTLP_PROTOCOL")),
            };
            match protocol.as_deref().map(str::trim) {
                None | Some("http/protobuf") => settings.exporter = Some(Protocol::HttpProtobuf),
                Some("grpc") => settings.exporter = Some(Protocol::Grpc),
                Some(other) => problems.push(format!("{name} = {other:?}: must be http/protobuf or grpc")),
            }
            let mut number = |name: &str, min: u64, default: u64| match var(name) {
                None => default,
                Some(text) => match text.trim().parse::<u64>() {
                    Ok(value) if value >= min => value,
                    _ => {
                        problems.push(format!("{name} = {text:?}: must be a whole number from {min}"));
                        default
                    }
                },
            };
            let queue_size = number("OTEL_BSP_MAX_QUEUE_SIZE", 1, SPAN_QUEUE_CAPACITY as u64);
            let delay = number("OTEL_BSP_SCHEDULE_DELAY", 1, SCHEDULE_DELAY.as_millis() as u64);
            let batch = number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 1, MAX_EXPORT_BATCH as u64);
            settings.queue_size = usize::try_from(queue_size).unwrap_or(usize::MAX);
            settings.schedule_delay = Duration::from_millis(delay);
            // The standard: a batch larger than the queue is the queue.
            settings.max_export_batch = usize::try_from(batch).unwrap_or(usize::MAX).min(settings.queue_size);
        }
        if problems.is_empty() { Ok(settings) } else { Err(problems) }
    }
}

/// The process's tracing, to shut down at exit so the last spans leave.
#[must_use = "shut the telemetry down at exit so the last spans are exported"]
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is queued and stops the exporter, waiting at most [`FLUSH_TIMEOUT`].
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else { return };
        trace::set_enabled(false);
        let flush = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_TIMEOUT));
        match tokio::time::timeout(FLUSH_TIMEOUT + Duration::from_secs(1), flush).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => tracing::warn!(%error, "trace export did not finish at shutdown"),
            Ok(Err(error)) => tracing::warn!(%error, "trace export did not finish at shutdown"),
            Err(_) => tracing::warn!("trace export did not finish within {FLUSH_TIMEOUT:?} at shutdown"),
        }
    }
}

/// What a binary calls once its configuration is valid: trace settings from the environment
/// (an error names a variable the binary must refuse, exit status 2), then [`init`].
pub fn start(binary: &str, common: &crate::config::CommonArgs) -> Result<Telemetry, String> {
    let settings = TraceSettings::from_env(binary, &common.instance_id()).map_err(|problems| {
        let count = match problems.len() {
            1 => "1 problem".to_string(),
            n => format!("{n} problems"),
        };
        format!("{binary}: invalid configuration ({count}):\n  {}", problems.join("\n  "))
    })?;
    init(common.log_format, &settings)
        .map_err(|error| format!("{binary}: cannot start trace export: {error:#}"))
}

/// Installs the global subscriber (and, when `settings` has an exporter, the span export; it
/// must then be called inside a tokio runtime). Calling it twice is harmless: the first
/// subscriber stays, and the second call exports nothing.
pub fn init(format: LogFormat, settings: &TraceSettings) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Plain => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).with_current_span(true).with_filter(filter).boxed(),
    };
    trace::set_sampling(settings.sampling);
    trace::set_server_msg_trace(settings.nats_msg_trace);
    let Some(protocol) = settings.exporter else {
        let _already_set = tracing_subscriber::registry().with(fmt).try_init();
        return Ok(Telemetry::default());
    };
    let provider = provider(protocol, settings)?;
    let tracer = provider.tracer("jetsched");
    // Only the product's own spans and their events go out, whatever RUST_LOG says, and never
    // a span its code marked untraced (its trace is not sampled: nothing to build).
    let ours = filter::filter_fn(|meta| {
        meta.target().starts_with("jetsched")
            && !meta.target().ends_with(trace::UNTRACED_SUFFIX)
            && *meta.level() <= tracing::Level::INFO
    });
    let otel = tracing_opentelemetry::layer().with_tracer(tracer).with_location(false).with_filter(ours);
    if tracing_subscriber::registry().with(fmt).with(otel).try_init().is_err() {
        let _ = provider.shutdown();
        return Ok(Telemetry::default());
    }
    trace::set_enabled(true);
    Ok(Telemetry { provider: Some(provider) })
}

fn provider(protocol: Protocol, settings: &TraceSettings) -> anyhow::Result<SdkTracerProvider> {
    // The HTTP client is built with rustls and no bundled crypto provider (as async-nats and the
    // worker's HTTP executor): ring. Installing fails harmlessly when one is installed already.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let exporter = match protocol {
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build()?,
        Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder().with_tonic().build()?,
    };
    let mut resource = Resource::builder();
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    if !named {
        resource = resource.with_service_name(settings.default_service_name.clone());
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new("service.instance.id", settings.instance_id.clone()))
        .build();
    let queued = Arc::new(AtomicUsize::new(0));
    let exporter = Counted { inner: exporter, queued: queued.clone() };
    // The batch queue is twice the gate's capacity so only the gate ever refuses a span (and
    // counts it).
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(settings.queue_size.saturating_mul(2))
        .with_scheduled_delay(settings.schedule_delay)
        .with_max_export_batch_size(settings.max_export_batch)
        .build();
    let batch = BatchSpanProcessor::builder(exporter, Tokio).with_batch_config(config).build();
    let gate = Bounded { inner: batch, queued, capacity: settings.queue_size };
    Ok(SdkTracerProvider::builder()
        .with_span_processor(gate)
        .with_sampler(Box::new(settings.sampling.sdk()) as Box<dyn opentelemetry_sdk::trace::ShouldSample>)
        .with_id_generator(trace::ExecutionIds::default())
        .with_resource(resource)
        .build())
}

static SPANS_DROPPED: LazyLock<prometheus::IntCounter> = LazyLock::new(|| {
    prometheus::IntCounter::new(
        "jetsched_trace_spans_dropped_total",
        "Spans not exported: refused by the full export queue or lost with a failed export",
    )
    .expect("valid metric")
});

/// Registers `jetsched_trace_spans_dropped_total` (one counter per process, shared by the
/// registries of every service in it) on a service's registry.
pub fn register_metrics(registry: &prometheus::Registry) -> anyhow::Result<()> {
    match registry.register(Box::new(SPANS_DROPPED.clone())) {
        Ok(()) | Err(prometheus::Error::AlreadyReg) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Spans dropped so far in this process.
pub fn spans_dropped() -> u64 {
    SPANS_DROPPED.get()
}

fn dropped(count: usize, why: &str) {
    SPANS_DROPPED.inc_by(count as u64);
    static LAST_LOG: Mutex<Option<Instant>> = Mutex::new(None);
    let Ok(mut last) = LAST_LOG.lock() else { return };
    if last.is_none_or(|at| at.elapsed() >= DROP_LOG_INTERVAL) {
        *last = Some(Instant::now());
        drop(last);
        tracing::warn!(dropped_total = SPANS_DROPPED.get(), "spans dropped: {why}");
    }
}

/// Refuses a span when [`SPAN_QUEUE_CAPACITY`] spans already wait for export.
#[derive(Debug)]
struct Bounded<P> {
    inner: P,
    queued: Arc<AtomicUsize>,
    capacity: usize,
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.queued.fetch_add(1, Ordering::Relaxed) >= self.capacity {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            dropped(1, "the export queue is full (collector down or slow)");
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Frees the gate's room as batches leave, and counts the spans of a failed export as dropped.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    queued: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let count = batch.len();
        let export = self.inner.export(batch);
        async move {
            let result = export.await;
            self.queued.fetch_sub(count, Ordering::Relaxed);
            if result.is_err() {
                dropped(count, "the export failed (collector down or refusing)");
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::time::SystemTime;

    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState};

    use super::*;

    /// Counts the spans handed on.
    #[derive(Debug, Default)]
    struct Tally(Arc<AtomicU64>);

    impl SpanProcessor for Tally {
        fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}
        fn on_end(&self, _span: SpanData) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    /// Fails every export.
    #[derive(Debug)]
    struct Refusing;

    impl SpanExporter for Refusing {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure("collector down".into()))
        }
    }

    fn span(sampled: bool) -> SpanData {
        let flags = if sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(7u128),
                SpanId::from(9u64),
                flags,
                false,
                TraceState::NONE,
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "test".into(),
            start_time: SystemTime::now(),
            end_time: SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[test]
    fn a_full_queue_refuses_and_counts_the_span_and_a_failed_export_counts_its_batch() {
        let passed = Arc::new(AtomicU64::new(0));
        let queued = Arc::new(AtomicUsize::new(0));
        let gate = Bounded { inner: Tally(passed.clone()), queued: queued.clone(), capacity: 2 };
        let before = spans_dropped();
        gate.on_end(span(false));
        for _ in 0..3 {
            gate.on_end(span(true));
        }
        assert_eq!(passed.load(Ordering::Relaxed), 2, "unsampled spans and the third are not queued");
        assert!(spans_dropped() > before, "the refused span is counted");

        let exporter = Counted { inner: Refusing, queued: queued.clone() };
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let dropped_before = spans_dropped();
        assert!(runtime.block_on(exporter.export(vec![span(true), span(true)])).is_err());
        assert_eq!(queued.load(Ordering::Relaxed), 0, "the batch left the queue");
        assert!(spans_dropped() >= dropped_before + 2, "the failed batch is counted");
    }

    fn settings(vars: &[(&str, &str)]) -> Result<TraceSettings, Vec<String>> {
        let vars: std::collections::HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        TraceSettings::from_vars("jetsched-worker", "w1", |name| vars.get(name).cloned())
    }

    #[test]
    fn no_endpoint_means_no_exporter_but_the_sampler_is_read() {
        let settings =
            settings(&[("OTEL_TRACES_SAMPLER", "traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "0.01")])
                .expect("valid");
        assert_eq!(settings.exporter, None);
        assert_eq!(settings.default_service_name, "jetsched-worker");
        assert_eq!(settings.sampling, trace::Sampling { parent_based: false, ratio: 0.01 });
        assert!(!settings.nats_msg_trace, "nats-server does not trace dispatches unless asked");
        assert!(self::settings(&[(NATS_MSG_TRACE_ENV, "TRUE")]).expect("valid").nats_msg_trace);
        assert!(!self::settings(&[(NATS_MSG_TRACE_ENV, "false")]).expect("valid").nats_msg_trace);
        // Export variables are not looked at without an endpoint.
        assert!(self::settings(&[("OTEL_BSP_MAX_QUEUE_SIZE", "lots")]).is_ok());
    }

    #[test]
    fn the_batch_variables_are_honoured_and_every_bad_one_is_named() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        let defaults = settings(&[endpoint]).expect("valid");
        assert_eq!(defaults.exporter, Some(Protocol::HttpProtobuf));
        assert_eq!(defaults.queue_size, SPAN_QUEUE_CAPACITY);
        assert_eq!(defaults.schedule_delay, Duration::from_millis(5000));
        assert_eq!(defaults.max_export_batch, 512);

        let set = settings(&[
            endpoint,
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "2048"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096"),
        ])
        .expect("valid");
        assert_eq!(set.exporter, Some(Protocol::Grpc));
        assert_eq!(set.queue_size, 2048);
        assert_eq!(set.schedule_delay, Duration::from_millis(100));
        assert_eq!(set.max_export_batch, 2048, "a batch is at most the queue");

        let problems = settings(&[
            endpoint,
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
            ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
            ("OTEL_TRACES_SAMPLER", "sometimes"),
            (NATS_MSG_TRACE_ENV, "yes please"),
        ])
        .unwrap_err();
        assert_eq!(problems.len(), 5, "{problems:#?}");
        for name in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_BSP_MAX_QUEUE_SIZE",
            "OTEL_BSP_SCHEDULE_DELAY",
            "OTEL_TRACES_SAMPLER",
            NATS_MSG_TRACE_ENV,
        ] {
            assert!(problems.iter().any(|p| p.starts_with(name)), "{name} named in {problems:#?}");
        }
    }
}
